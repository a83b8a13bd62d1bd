"""Model shapes for the planner: published models, and Llama-family ``config.json`` files.

Each preset is the published shape (width, heads, key/value heads, head size, MLP kind and
width, layers, vocabulary, tied or untied embeddings) and the parameter count its source
states; the reference decoder (:mod:`shardscope._src.model.transformer`) then holds the same
weights: RMSNorm gains, the attention projections, the MLP matrices and the embeddings. GPT-3
keeps its shape and GELU MLP; its LayerNorm biases, linear biases and learned positions (0.1%
of its weights) are not modelled.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardscope._src.base.errors import ModelConfigError, PlanError, is_int
from shardscope._src.base.records import record_dict
from shardscope._src.model.config import ModelConfig


@dataclass(frozen=True)
class ModelPreset:
    """A named model shape and the sequence length it is usually trained with.

    ``seq`` is the default sequence length; the default global batch is chosen by the planner
    (one sequence per device) because it depends on the device count. ``published_params``
    is the parameter count the source states (None for a test model).
    """

    name: str
    d_model: int
    heads: int
    ff: int
    layers: int
    vocab: int
    seq: int
    source: str
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "swiglu"
    tie_embeddings: bool = False
    published_params: float | None = None
    experts: int = 0
    top_k: int = 0
    expert_ff: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    #: the active parameter count the source states (None: dense, or not stated)
    published_active: float | None = None
    #: whether the source's active count includes the input embedding (OpenAI's does not)
    active_counts_embedding: bool = True
    #: what the published total counts beyond the modelled decoder (None: nothing)
    published_extra: str | None = None
    #: multi-head latent attention (DeepSeek-V2 and V3; 0: none)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int | None = None
    #: group-limited routing (:attr:`ModelConfig.group_limit`; 1 and 1: none)
    expert_groups: int = 1
    groups_per_token: int = 1

    def config(
        self, *, batch: int, seq: int | None = None, dtype: str = "bfloat16", **overrides: Any
    ) -> ModelConfig:
        """The :class:`ModelConfig` of this preset, scanned over layers, with overrides."""
        values: dict[str, Any] = dict(
            d_model=self.d_model,
            heads=self.heads,
            ff=self.ff,
            layers=self.layers,
            vocab=self.vocab,
            batch=batch,
            seq=self.seq if seq is None else seq,
            dtype=dtype,
            scan=True,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            mlp=self.mlp,
            tie_embeddings=self.tie_embeddings,
            experts=self.experts,
            top_k=self.top_k,
            expert_ff=self.expert_ff,
            shared_experts=self.shared_experts,
            dense_layers=self.dense_layers,
            kv_lora_rank=self.kv_lora_rank,
            q_lora_rank=self.q_lora_rank,
            rope_head_dim=self.rope_head_dim,
            v_head_dim=self.v_head_dim,
            expert_groups=self.expert_groups,
            groups_per_token=self.groups_per_token,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("heads") is not None and overrides.get("kv_heads") is None:
            if self.kv_heads in (None, self.heads):
                values["kv_heads"] = None  # a multi-head preset stays multi-head
        return ModelConfig(**values)

    def param_count(self) -> int:
        return self.config(batch=1).param_count()

    def active_param_count(self) -> int:
        """The parameters a token uses, counted as the source counts them (with or without
        the input embedding): all of them for a dense model."""
        return self.config(batch=1).active_param_count(embedding=self.active_counts_embedding)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(
            self,
            keys={"param_count": "params", "active_param_count": "active_params"},
            extra=("param_count", "active_param_count"),
        )


def _llama(
    name: str,
    d: int,
    heads: int,
    kv: int,
    ff: int,
    layers: int,
    vocab: int,
    seq: int,
    published: float,
    source: str,
) -> ModelPreset:
    return ModelPreset(
        name, d, heads, ff, layers, vocab, seq, source, kv_heads=kv, published_params=published
    )


def _moe(
    name: str,
    d: int,
    heads: int,
    kv: int,
    head_dim: int,
    layers: int,
    vocab: int,
    experts: int,
    top_k: int,
    expert_ff: int,
    seq: int,
    published: float,
    active: float,
    source: str,
    **more: Any,
) -> ModelPreset:
    return ModelPreset(
        name,
        d,
        heads,
        more.pop("ff", expert_ff),
        layers,
        vocab,
        seq,
        source,
        kv_heads=kv,
        head_dim=head_dim,
        experts=experts,
        top_k=top_k,
        expert_ff=expert_ff,
        published_params=published,
        published_active=active,
        **more,
    )


#: Mixtures of experts: the shapes of their config.json files and the counts their model
#: cards state. Not modelled, each under 0.1% of its weights unless said: Qwen3's per-head
#: query and key norms, GPT-OSS's attention biases, sinks and expert biases.
_MOE_PRESETS = (
    _moe(
        "mixtral-8x7b",
        4096,
        32,
        8,
        128,
        32,
        32000,
        8,
        2,
        14336,
        4096,
        46.7e9,
        12.9e9,
        "Jiang et al. 2024, Mixtral of Experts (arXiv 2401.04088): 46.7B parameters, 12.9B "
        "active; shapes from mistralai/Mixtral-8x7B-v0.1's config.json",
    ),
    _moe(
        "mixtral-8x22b",
        6144,
        48,
        8,
        128,
        56,
        32768,
        8,
        2,
        16384,
        4096,
        141e9,
        39e9,
        "Mistral AI 2024, Cheaper, Better, Faster, Stronger (Mixtral 8x22B): 141B parameters, "
        "39B active; shapes from mistralai/Mixtral-8x22B-v0.1's config.json",
    ),
    _moe(
        "qwen3-30b-a3b",
        2048,
        32,
        4,
        128,
        48,
        151936,
        128,
        8,
        768,
        4096,
        30.5e9,
        3.3e9,
        "Qwen3 Technical Report (arXiv 2505.09388) and the Qwen/Qwen3-30B-A3B model card: "
        "30.5B parameters, 3.3B activated, 128 experts, 8 activated",
    ),
    _moe(
        "qwen3-235b-a22b",
        4096,
        64,
        4,
        128,
        94,
        151936,
        128,
        8,
        1536,
        4096,
        235e9,
        22e9,
        "Qwen3 Technical Report (arXiv 2505.09388) and the Qwen/Qwen3-235B-A22B model card: "
        "235B parameters, 22B activated, 128 experts, 8 activated",
    ),
    _moe(
        "gpt-oss-20b",
        2880,
        64,
        8,
        64,
        24,
        201088,
        32,
        4,
        2880,
        4096,
        20.91e9,
        3.61e9,
        "OpenAI 2025, gpt-oss-120b & gpt-oss-20b model card, Table 1: 20.91B total, 3.61B "
        "active (the unembedding counted, the embedding not)",
        active_counts_embedding=False,
    ),
    _moe(
        "gpt-oss-120b",
        2880,
        64,
        8,
        64,
        36,
        201088,
        128,
        4,
        2880,
        4096,
        116.83e9,
        5.13e9,
        "OpenAI 2025, gpt-oss-120b & gpt-oss-20b model card, Table 1: 116.83B total, 5.13B "
        "active (the unembedding counted, the embedding not)",
        active_counts_embedding=False,
    ),
    _moe(
        "llama4-scout",
        5120,
        40,
        8,
        128,
        48,
        202048,
        16,
        1,
        8192,
        8192,
        109e9,
        17e9,
        "Meta 2025, Llama 4 Scout model card: 17B active, 109B total with its vision encoder "
        "(not modelled: the text decoder here is 107.8B); 16 experts, 1 routed and 1 shared "
        "per token",
        shared_experts=1,
        published_extra="the vision encoder",
    ),
    ModelPreset(
        "deepseek-v3",
        7168,
        128,
        18432,
        61,
        129280,
        4096,
        "DeepSeek-V3 Technical Report (arXiv 2412.19437): 671B parameters, 37B activated per "
        "token, 61 layers (the first 3 dense), 256 routed experts of 2048 and one shared, 8 "
        "routed per token, multi-head latent attention (128 heads, q_lora_rank 1536, "
        "kv_lora_rank 512, 128 + 64 rotary query and key dimensions, values of 128); shapes "
        "from deepseek-ai/DeepSeek-V3's config.json. The multi-token prediction module (14B, "
        "in the 685B of the checkpoint) is not in the 671B and not modelled; each token's "
        "experts from 4 of 8 groups (the report's node-limited routing, 'each token will be "
        "sent to at most M nodes', M = 4; config.json n_group 8, topk_group 4)",
        head_dim=128,
        published_params=671e9,
        experts=256,
        top_k=8,
        expert_ff=2048,
        shared_experts=1,
        dense_layers=3,
        published_active=37e9,
        kv_lora_rank=512,
        q_lora_rank=1536,
        rope_head_dim=64,
        v_head_dim=128,
        expert_groups=8,
        groups_per_token=4,
    ),
)

_LLAMA2 = "Touvron et al. 2023, Llama 2 (arXiv 2307.09288) Table 1; shapes from its config.json"
_LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models (arXiv 2407.21783) Table 3"

MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "tiny",
            256,
            8,
            1024,
            4,
            1024,
            128,
            "test-sized (3.7M parameters), not a published model",
            mlp="gelu",
        ),
        _llama(
            "1b",
            2048,
            32,
            4,
            5632,
            22,
            32000,
            2048,
            1.1e9,
            "TinyLlama-1.1B (Zhang et al. 2024, arXiv 2401.02385): Llama 2 architecture, "
            "4 key/value heads",
        ),
        _llama("llama2-7b", 4096, 32, 32, 11008, 32, 32000, 4096, 6.74e9, _LLAMA2),
        _llama("llama2-13b", 5120, 40, 40, 13824, 40, 32000, 4096, 13.0e9, _LLAMA2),
        _llama("llama2-70b", 8192, 64, 8, 28672, 80, 32000, 4096, 69.0e9, _LLAMA2),
        _llama("llama3-8b", 4096, 32, 8, 14336, 32, 128256, 8192, 8.03e9, _LLAMA3),
        _llama("llama3-70b", 8192, 64, 8, 28672, 80, 128256, 8192, 70.6e9, _LLAMA3),
        _llama("llama3-405b", 16384, 128, 8, 53248, 126, 128256, 8192, 405e9, _LLAMA3),
        ModelPreset(
            "nemotron4-15b",
            6144,
            48,
            24576,
            32,
            256000,
            4096,
            "Parmar et al. 2024, Nemotron-4 15B (arXiv 2402.16819) Table 1 and section 2: 32 "
            "layers, d_model 6144, 48 heads, 8 key/value heads, MLP 4 x d_model with squared "
            "ReLU, untied embeddings, vocabulary 256000, context 4096; 3.2B embedding and 12.5B "
            "non-embedding parameters. The squared ReLU is planned as the decoder's GELU MLP: "
            "both are one up- and one down-projection, the same weights and matmul FLOPs",
            kv_heads=8,
            mlp="gelu",
            published_params=15.7e9,
        ),
        *_MOE_PRESETS,
        ModelPreset(
            "gpt3-175b",
            12288,
            96,
            4 * 12288,
            96,
            50257,
            2048,
            "Brown et al. 2020, GPT-3 (arXiv 2005.14165) Table 2.1: 96 layers, d_model 12288, "
            "96 heads of 128, 4 x d_model GELU MLP, tied embeddings, context 2048",
            mlp="gelu",
            tie_embeddings=True,
            published_params=175.0e9,
        ),
    )
}

#: The dense presets and the mixtures of experts.
DENSE_PRESETS = tuple(n for n, p in MODEL_PRESETS.items() if not p.experts)
MOE_PRESETS = tuple(n for n, p in MODEL_PRESETS.items() if p.experts)

#: Published models not modelled yet, and what is missing.
UNMODELLED: dict[str, str] = {}

#: Short names kept for the Llama 2 models.
ALIASES = {"7b": "llama2-7b", "13b": "llama2-13b", "70b": "llama2-70b", "gpt3": "gpt3-175b"}


def is_preset(name: object) -> bool:
    """Whether ``name`` names a preset (any case, or an alias), not a model's config.json.

    >>> is_preset("Mixtral-8x7B"), is_preset("7b"), is_preset("mymodel/config.json")
    (True, True, False)
    """
    key = str(name).lower()
    return ALIASES.get(key, key) in MODEL_PRESETS


def model_preset(name: str) -> ModelPreset:
    """The preset called ``name`` (see :data:`MODEL_PRESETS`, :data:`ALIASES`), or the model
    of a Hugging Face ``config.json`` when ``name`` is the path of one.

    >>> model_preset("7b").param_count()
    6738415616
    """
    key = str(name).lower()
    key = ALIASES.get(key, key)
    preset = MODEL_PRESETS.get(key)
    if preset is not None:
        return preset
    if key in UNMODELLED:
        raise ModelConfigError(f"model={name!r}: {UNMODELLED[key]}", param="model")
    text = str(name)
    if text.endswith(".json") or Path(text).is_file():
        return load_hf_config(text)
    if Path(text).is_dir():
        # a Hugging Face model's folder (a snapshot, a checkout): its config.json
        inside = Path(text) / "config.json"
        if inside.is_file():
            return load_hf_config(str(inside))
        raise PlanError(
            f"model={name!r} is a folder without a config.json; give the path of a Hugging "
            f"Face config.json, or of a model's folder that holds one",
            param="model",
        )
    close = difflib.get_close_matches(key, [*MODEL_PRESETS, *ALIASES], n=1)
    meant = f" (did you mean {close[0]!r}?)" if close else ""
    raise PlanError(
        f"unknown model preset {name!r}{meant}; choose one of {', '.join(DENSE_PRESETS)} (or "
        f"{', '.join(ALIASES)}; mixtures of experts: {', '.join(MOE_PRESETS)}), give the path "
        f"of a Hugging Face config.json (Llama-family, Mixtral, Qwen3-MoE, DeepSeek-V3), or "
        f"give the shape with d_model, heads, ff, layers (and vocab)",
        param=("model", "d_model", "heads", "ff", "layers", "vocab"),
    )


#: config.json keys of a Llama-family model that a preset needs.
HF_REQUIRED = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "num_hidden_layers",
    "vocab_size",
)
#: The default sequence when config.json allows more: longer contexts are a --seq choice.
HF_MAX_DEFAULT_SEQ = 8192


def load_hf_config(path: str | Path) -> ModelPreset:
    """A preset from a Hugging Face ``config.json`` of a Llama-family model (Llama, Mistral,
    Qwen2 and the like: SwiGLU MLP, RMSNorm, rotary positions), or of a mixture of experts of
    that family (``model_type`` ``mixtral`` or ``qwen3_moe``: the experts, the experts per
    token and the experts' MLP width). Nothing is downloaded.

    Reads ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (default: the
    heads), ``head_dim`` (default: hidden / heads), ``intermediate_size``,
    ``num_hidden_layers``, ``vocab_size``, ``tie_word_embeddings`` (default false) and
    ``max_position_embeddings`` (the default sequence, at most 8192).

    Raises:
        ModelConfigError: the file is missing or not JSON, a required field is missing or
            not a positive integer, or the MLP is not SwiGLU; the message names the field.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError(
            f"model={str(path)!r}: no such file; give the path of a model's config.json, or a "
            f"preset name ({', '.join(MODEL_PRESETS)})",
            param="model",
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelConfigError(
            f"model={str(path)!r}: cannot read it as JSON ({e}); give a Hugging Face config.json",
            param="model",
        ) from None
    if not isinstance(data, dict):
        raise ModelConfigError(
            f"model={str(path)!r}: a config.json holds one JSON object, this holds a "
            f"{type(data).__name__}",
            param="model",
        )
    missing = [k for k in HF_REQUIRED if k not in data]
    if missing:
        kind = data.get("model_type")
        raise ModelConfigError(
            f"model={str(path)!r}: config.json"
            f"{f' (model_type {kind!r})' if isinstance(kind, str) else ''} lacks "
            f"{', '.join(missing)}; the planner reads Llama-family decoders and the mixtures "
            f"{', '.join(HF_MOE)}, whose configs have {', '.join(HF_REQUIRED)} (and optionally "
            f"num_key_value_heads, head_dim, tie_word_embeddings, max_position_embeddings)",
            param="model",
        )

    def integer(key: str, default: int | None = None) -> int | None:
        value = data.get(key, default)
        if value is None and default is None and key not in HF_REQUIRED:
            return None
        if not is_int(value, 1):
            raise ModelConfigError(
                f"model={str(path)!r}: config.json {key}={value!r} must be a positive integer",
                param="model",
            )
        return value

    experts = _hf_experts(data, path)
    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelConfigError(
            f"model={str(path)!r}: config.json hidden_act={act!r}; the planner reads Llama-family "
            f"models, whose gated MLP uses silu (SwiGLU)",
            param="model",
        )
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelConfigError(
            f"model={str(path)!r}: config.json tie_word_embeddings={tied!r} must be true or false",
            param="model",
        )
    heads = integer("num_attention_heads")
    seq = integer("max_position_embeddings", HF_MAX_DEFAULT_SEQ)
    assert heads is not None and seq is not None
    preset = ModelPreset(
        name=str(data.get("_name_or_path") or p.parent.name or p.stem),
        d_model=integer("hidden_size"),  # type: ignore[arg-type]
        heads=heads,
        ff=integer("intermediate_size"),  # type: ignore[arg-type]
        layers=integer("num_hidden_layers"),  # type: ignore[arg-type]
        vocab=integer("vocab_size"),  # type: ignore[arg-type]
        seq=min(seq, HF_MAX_DEFAULT_SEQ),
        source=f"config.json at {p}",
        kv_heads=None if experts.get("kv_lora_rank") else integer("num_key_value_heads", heads),
        head_dim=experts.pop("head_dim", None)
        or (integer("head_dim") if data.get("head_dim") is not None else None),
        mlp="swiglu",
        tie_embeddings=tied,
        **experts,
    )
    preset.config(batch=1)  # the shape's own checks (heads / kv_heads, head_dim, sizes)
    return preset


#: config.json architectures with experts that are read, by ``model_type``: the keys of the
#: expert count, the experts per token and the expert MLP's width.
HF_MOE = {
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
}
#: Keys whose presence says a config.json has experts.
HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def _hf_experts(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """The expert fields of a preset from a config.json (none for a dense model); an
    architecture with experts that is not read is refused rather than read as dense."""
    kind = data.get("model_type")
    if kind not in HF_MOE:
        found = [k for k in HF_EXPERT_KEYS if data.get(k)]
        if found:
            raise ModelConfigError(
                f"model={str(path)!r}: config.json describes a mixture of experts "
                f"(model_type={kind!r}, {', '.join(found)}), which is read for model_type "
                f"{' or '.join(map(repr, HF_MOE))}; give one of those or a preset",
                param="model",
            )
        return {}
    n_key, k_key, f_key = HF_MOE[kind]
    values = {}
    for field, key in (("experts", n_key), ("top_k", k_key), ("expert_ff", f_key)):
        value = data.get(key)
        if not is_int(value, 1):
            raise ModelConfigError(
                f"model={str(path)!r}: config.json {key}={value!r} must be a positive integer "
                f"(model_type {kind!r} has experts)",
                param="model",
            )
        values[field] = value
    if values["top_k"] > values["experts"]:
        raise ModelConfigError(
            f"model={str(path)!r}: config.json {k_key}={values['top_k']} routes each token to "
            f"more experts than its {n_key}={values['experts']}; give at most {values['experts']}",
            param="model",
        )
    if kind == "deepseek_v3":
        # shared experts, dense layers first, and multi-head latent attention
        for field, key, least in (
            ("shared_experts", "n_shared_experts", 0),
            ("dense_layers", "first_k_dense_replace", 0),
            ("kv_lora_rank", "kv_lora_rank", 1),
            ("q_lora_rank", "q_lora_rank", 0),
            ("rope_head_dim", "qk_rope_head_dim", 0),
            ("head_dim", "qk_nope_head_dim", 1),
            ("v_head_dim", "v_head_dim", 1),
            ("expert_groups", "n_group", 1),
            ("groups_per_token", "topk_group", 1),
        ):
            value = data.get(key) or (1 if field in ("expert_groups", "groups_per_token") else 0)
            if not is_int(value, least):
                raise ModelConfigError(
                    f"model={str(path)!r}: config.json {key}={data.get(key)!r} must be a whole "
                    f"number, {least} or more (model_type 'deepseek_v3')",
                    param="model",
                )
            values[field] = value
        step = data.get("moe_layer_freq", 1)
        if step != 1:
            raise ModelConfigError(
                f"model={str(path)!r}: config.json moe_layer_freq={step!r}, which is not read: "
                f"every layer after the first first_k_dense_replace has experts",
                param="model",
            )
    if kind == "qwen3_moe":
        # every layer has experts unless listed in mlp_only_layers or off decoder_sparse_step
        step = data.get("decoder_sparse_step", 1)
        if data.get("mlp_only_layers") or step != 1:
            raise ModelConfigError(
                f"model={str(path)!r}: config.json mixes dense and expert layers "
                f"(mlp_only_layers={data.get('mlp_only_layers')!r}, decoder_sparse_step="
                f"{step!r}), which is not read: every layer has experts, or the first "
                f"dense_layers are dense",
                param="model",
            )
    return values


__all__ = [
    "ALIASES",
    "DENSE_PRESETS",
    "MODEL_PRESETS",
    "MOE_PRESETS",
    "ModelPreset",
    "load_hf_config",
    "model_preset",
]
