"""Model shapes for the planner: published models, and Llama-family ``config.json`` files.

Each preset is the published shape (width, heads, key/value heads, head size, MLP kind and
width, layers, vocabulary, tied or untied embeddings) and the parameter count its source
states; the reference decoder (:mod:`shardscope._src.model.transformer`) then holds the same
weights: RMSNorm gains, the attention projections, the MLP matrices and the embeddings. GPT-3
keeps its shape and GELU MLP; its LayerNorm biases, linear biases and learned positions (0.1%
of its weights) are not modelled.
"""

from __future__ import annotations

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
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("heads") is not None and overrides.get("kv_heads") is None:
            if self.kv_heads in (None, self.heads):
                values["kv_heads"] = None  # a multi-head preset stays multi-head
        return ModelConfig(**values)

    def param_count(self) -> int:
        return self.config(batch=1).param_count()

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, keys={"param_count": "params"}, extra=("param_count",))


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

#: Short names kept for the Llama 2 models.
ALIASES = {"7b": "llama2-7b", "13b": "llama2-13b", "70b": "llama2-70b", "gpt3": "gpt3-175b"}


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
    text = str(name)
    if text.endswith(".json") or Path(text).is_file():
        return load_hf_config(text)
    raise PlanError(
        f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)} (or "
        f"{', '.join(ALIASES)}), give a Llama-family config.json path, or give the shape "
        f"with d_model, heads, ff, layers (and vocab)",
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
    Qwen2 and the like: SwiGLU MLP, RMSNorm, rotary positions). Nothing is downloaded.

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
        raise ModelConfigError(
            f"model={str(path)!r}: config.json lacks {', '.join(missing)}; a Llama-family config "
            f"has {', '.join(HF_REQUIRED)} (and optionally num_key_value_heads, head_dim, "
            f"tie_word_embeddings, max_position_embeddings)",
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
        kv_heads=integer("num_key_value_heads", heads),
        head_dim=integer("head_dim") if data.get("head_dim") is not None else None,
        mlp="swiglu",
        tie_embeddings=tied,
    )
    preset.config(batch=1)  # the shape's own checks (heads / kv_heads, head_dim, sizes)
    return preset


__all__ = ["ALIASES", "MODEL_PRESETS", "ModelPreset", "load_hf_config", "model_preset"]
