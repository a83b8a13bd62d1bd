"""The reference decoder's description: :class:`ModelConfig` (its shape and how its step is
computed), the names of its parameters and their shapes, and the vocabularies of a step
(:class:`Mode`, :class:`Remat`). Plain data, no JAX; the model itself is
:mod:`shardscope._src.model.transformer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shardscope._src.base.errors import ModelConfigError, ShardscopeError, is_int
from shardscope._src.base.records import Record
from shardscope._src.base.vocab import Vocab
from shardscope._src.model.remat import model_problem, remat_policy


class Mode(Vocab):
    """Which step of the model a program runs.

    The reference programs, their bounds and verdicts (``build_reference_program``,
    ``transformer_bound``, ``transformer_verdict``, ``shardscope audit transformer``) default
    to :attr:`FORWARD`, the first look at a strategy's collectives; the planner (``plan``,
    ``screen``, ``estimate_memory``, ``step_bound``, ``model_flops``, ``shardscope plan``)
    defaults to :attr:`TRAIN`, the step a cluster is budgeted for.
    """

    #: the training step: forward, backward (the loss's gradients), no optimizer update
    TRAIN = "train"
    #: the forward pass alone
    FORWARD = "forward"


#: The modes, in the order choices are listed.
MODES: tuple[Mode, ...] = tuple(Mode)


class Remat(Vocab):
    """Activation recomputation in the backward pass: the five words, each a preset of
    :class:`~shardscope._src.model.remat.RematPolicy` (where each named tensor is kept); a
    ``remat`` field also takes MaxText's and JAX's policy names and custom policies
    (:func:`~shardscope._src.model.remat.remat_policy`)."""

    #: every activation kept
    NONE = "none"
    #: the attention scores and probabilities recomputed (Korthikanti et al.'s selective)
    SELECTIVE = "selective"
    #: the outputs of the projections and the MLP's matmuls kept, the attention core and the
    #: element-wise work recomputed (per-op selective: JAX's ``dots_with_no_batch_dims``
    #: policy, torchtitan's ``op`` and MaxText's ``minimal`` are of this family)
    MATMULS = "matmuls"
    #: each layer's forward recomputed; only its input kept
    FULL = "full"
    #: each layer's input and its query, key and value projections offloaded to host memory
    #: and fetched back for the backward, the rest recomputed (MaxText's offloading remat
    #: policies; JAX's ``save_and_offload_only_these_names``)
    OFFLOAD = "offload"


DTYPES = ("float32", "bfloat16", "float16")
MLPS = ("gelu", "swiglu")
ATTENTIONS = ("dense", "blocked")
REMATS: tuple[Remat, ...] = tuple(Remat)


#: The largest dimension a config takes: far beyond any model, and short of where XLA's shape
#: arithmetic overflows or a divisor search in an error message takes minutes.
MAX_DIM = 2**20


@dataclass(frozen=True)
class ModelConfig(Record):
    """Shape of the reference decoder and of one batch.

    Without ``vocab`` the model maps activations ``[batch, seq, d_model]`` to activations and
    the training loss is the mean squared error against a target of the same shape; with
    ``vocab`` it embeds int32 tokens, ends with a final norm and an unembedding, and the loss
    is next-token cross entropy against target tokens.

    Attention has ``heads`` query heads of ``head_dim`` (default ``d_model / heads``) and
    ``kv_heads`` key/value heads (default ``heads``; fewer is grouped-query attention, each
    key/value head serving ``heads / kv_heads`` query heads). ``mlp`` is ``"gelu"`` (two
    matrices, ``d_model x ff`` and back) or ``"swiglu"`` (three: gate and up, then down).
    ``tie_embeddings`` unembeds with the embedding's transpose.

    How the step is computed, not what it computes: ``attention`` is ``"dense"`` (the score
    matrix materialised) or ``"blocked"`` (memory-efficient: keys and values in blocks of
    ``attention_block`` with a running softmax, scores recomputed in the backward pass), and
    ``remat`` is ``"none"``, ``"selective"`` (the attention scores recomputed in the backward
    pass), ``"full"`` (each layer's forward recomputed; only its input kept), another
    :class:`Remat` word, or a policy by named tensor (``"maxtext:save_qkv_proj"``,
    ``"custom:query_proj=offload,..."``: :func:`~shardscope._src.model.remat.remat_policy`),
    kept as its canonical name.

    A mixture of experts (``experts`` > 0): after ``dense_layers`` dense layers (MLP of
    ``ff``), each layer's MLP is ``experts`` routed experts of ``expert_ff`` (default ``ff``),
    each token sent to ``top_k`` of them by a linear router, plus ``shared_experts`` experts
    of ``expert_ff`` every token goes through. ``capacity_factor`` None dispatches dropless
    (each expert takes every token sent to it: grouped matmuls, ``jax.lax.ragged_dot``); a
    number pads each expert to ``ceil(capacity_factor x tokens x top_k / experts)`` tokens
    and drops those beyond it (GShard's and Switch's capacity). ``imbalance`` is what the
    planner assumes of a dropless mixture's routing: the busiest expert's tokens over its even
    share (1, uniform, by default; the step waits for the busiest). ``dispatch_once`` sends
    each token once to each device of the expert axis that holds any of its experts, and
    sums its outputs of those experts there before they come back (DeepEP's dispatch and
    combine), rather than once per expert (GShard's): fewer bytes where a device holds
    several experts; the router weight then scales each slot's activation before the
    down-projection, so the combine sums the outputs unweighted and the backward keeps none
    of them. ``weight_activations`` says the same of a mixture sent once per expert:
    Megatron-Core's grouped experts take the router's probabilities into their activation
    for every token dispatcher (``TEGroupedMLP``'s ``weighted_bias_swiglu_impl``; the
    all-to-all dispatcher permutes the probabilities with the tokens and un-permutes
    without them, megatron/core/transformer/moe/token_dispatcher.py@0014f13), so the
    estimates keep no expert output and read none again for the weights' gradient
    (:attr:`weights_activations`), and the bounds count the router weights sent with the
    slots; the reference program and the expert-parallel strategies' ``shard_map`` twins
    compile it so (each slot's router weight sent to its expert with the slot, dropless
    with its row, the outputs summed unweighted: the same sums, and the backward keeps no
    output). ``expert_groups`` and ``groups_per_token``: the router picks each token's
    experts among those of ``groups_per_token`` of ``expert_groups`` equal groups of them,
    the groups ranked by their best experts' logits (DeepSeek-V3's node-limited routing, its
    config's ``n_group`` 8 and ``topk_group`` 4: under expert parallelism of 64 over 8 nodes
    each group is a node's experts, and a token reaches at most 4 nodes); 1 and 1: any of
    them. Its parameters are counted
    (:meth:`param_count`, :meth:`active_param_count`); the reference decoder runs it (the
    dense layers, then those with experts) and the strategies place it: expert parallelism
    (``ep``, ``zero1_ep``, ``fsdp_ep_tp``, ... with each data flavour but HSDP and with
    ``tp``) and the dense strategies with the experts as
    their MLPs; the planner sweeps the expert axis with the others, and the serving steps
    route each token to its experts in prefill and decode.

    Multi-head latent attention (DeepSeek-V2 and V3, ``kv_lora_rank`` > 0): each head's
    keys and values (``head_dim`` and ``v_head_dim``) are projected from one normed latent of
    ``kv_lora_rank``, its queries from a ``q_lora_rank`` latent (or directly with 0), and
    queries and keys have ``rope_head_dim`` more dimensions, the keys' shared by the heads.

    >>> ModelConfig(d_model=64, heads=8, ff=256).head_dim
    8
    >>> ModelConfig(d_model=64, heads=8, kv_heads=2, ff=256).q_per_kv
    4
    """

    d_model: int = 64
    heads: int = 8
    ff: int = 256
    layers: int = 2
    batch: int = 8
    seq: int = 16
    dtype: str = "float32"
    vocab: int | None = None
    scan: bool = True
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "gelu"
    tie_embeddings: bool = False
    attention: str = "dense"
    attention_block: int = 512
    remat: str = Remat.NONE
    experts: int = 0
    top_k: int = 0
    expert_ff: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    imbalance: float = 1.0
    dispatch_once: bool = False
    weight_activations: bool = False
    expert_groups: int = 1
    groups_per_token: int = 1
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "ff", "layers", "batch", "seq", "attention_block"):
            value = getattr(self, name)
            if not is_int(value, 1):
                raise ModelConfigError(f"model config {name}={value!r}: must be a positive integer")
        for name in ("kv_heads", "head_dim", "vocab"):
            value = getattr(self, name)
            if value is not None and (not is_int(value, 1)):
                raise ModelConfigError(
                    f"model config {name}={value!r}: must be a positive integer or None"
                    + (
                        " (None: the model maps activations to activations, no embedding)"
                        if name == "vocab"
                        else f" (None: the default, {_DEFAULTS[name]})"
                    )
                )
        for name in (
            "d_model",
            "heads",
            "ff",
            "layers",
            "batch",
            "seq",
            "vocab",
            "kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if isinstance(value, int) and value > MAX_DIM:
                raise ModelConfigError(
                    f"model config {name}={value}: dimensions go up to {MAX_DIM} (2**20), far "
                    f"beyond any model; choose a smaller {name}"
                )
        if self.head_dim is None:
            if self.d_model % self.heads:
                raise ModelConfigError(
                    f"model config d_model={self.d_model} is not divisible by "
                    f"heads={self.heads}; each head needs d_model / heads dimensions: choose "
                    f"heads dividing {self.d_model}, e.g. "
                    f"heads={_divisor_near(self.d_model, self.heads)}, or give head_dim",
                    param=("d_model", "heads", "head_dim"),
                )
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        assert self.kv_heads is not None  # set just above
        if self.heads % self.kv_heads:
            raise ModelConfigError(
                f"model config heads={self.heads} is not divisible by kv_heads={self.kv_heads}; "
                f"each key/value head serves the same number of query heads: choose kv_heads "
                f"dividing {self.heads}, e.g. kv_heads={_divisor_near(self.heads, self.kv_heads)}",
                param=("heads", "kv_heads"),
            )
        try:
            policy = remat_policy(self.remat)
        except ShardscopeError as e:
            raise ModelConfigError(f"model config {e}", param="remat") from None
        object.__setattr__(self, "remat", policy.name)
        choices = {"dtype": DTYPES, "mlp": MLPS, "attention": ATTENTIONS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ModelConfigError(
                    f"model config {name}={getattr(self, name)!r}: must be one of "
                    f"{', '.join(allowed)}"
                )
        if not isinstance(self.tie_embeddings, bool):
            raise ModelConfigError(
                f"model config tie_embeddings={self.tie_embeddings!r}: must be True or False"
            )
        self._check_experts()
        self._check_latent()
        problem = model_problem(
            policy,
            experts=self.experts > 0,
            latent=self.kv_lora_rank > 0,
            gated=self.mlp == "swiglu",
        )
        if problem is not None:
            raise ModelConfigError(f"model config remat={self.remat!r}: {problem}", param="remat")

    def _check_latent(self) -> None:
        for name in ("kv_lora_rank", "q_lora_rank", "rope_head_dim"):
            value = getattr(self, name)
            if not is_int(value, 0) or value > MAX_DIM:
                raise ModelConfigError(
                    f"model config {name}={value!r}: must be a whole number from 0 to {MAX_DIM}"
                )
        if self.v_head_dim is not None and not is_int(self.v_head_dim, 1):
            raise ModelConfigError(
                f"model config v_head_dim={self.v_head_dim!r}: must be a positive integer or "
                f"None (None: head_dim)"
            )
        if not self.kv_lora_rank:
            extra = [n for n in ("q_lora_rank", "rope_head_dim", "v_head_dim") if getattr(self, n)]
            if extra:
                raise ModelConfigError(
                    f"model config {', '.join(f'{n}={getattr(self, n)}' for n in extra)} "
                    f"describe multi-head latent attention, but kv_lora_rank=0; give "
                    f"kv_lora_rank=N (DeepSeek-V3: 512)"
                )
            return
        if self.kv_heads != self.heads:
            raise ModelConfigError(
                f"model config kv_heads={self.kv_heads} with kv_lora_rank={self.kv_lora_rank}: "
                f"multi-head latent attention gives every query head its own key and value "
                f"(from the shared latent); leave kv_heads out"
            )
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)

    def _check_experts(self) -> None:
        for name in ("experts", "top_k", "shared_experts", "dense_layers"):
            value = getattr(self, name)
            if not is_int(value, 0):
                raise ModelConfigError(
                    f"model config {name}={value!r}: must be a whole number, 0 or more"
                )
        cf = self.capacity_factor
        if cf is not None and (
            isinstance(cf, bool) or not isinstance(cf, int | float) or not cf > 0
        ):
            raise ModelConfigError(
                f"model config capacity_factor={cf!r}: must be a number above 0 (1.25 pads "
                f"each expert to 1.25 x its even share of the tokens), or None for dropless "
                f"dispatch"
            )
        im = self.imbalance
        if isinstance(im, bool) or not isinstance(im, int | float) or not im >= 1:
            raise ModelConfigError(
                f"model config imbalance={im!r}: the busiest expert's tokens over its even "
                f"share, 1 or more (1: uniform routing)",
                param="imbalance",
            )
        if im != 1 and (not self.experts or self.capacity_factor is not None):
            why = (
                "a dense model"
                if not self.experts
                else "capacity-padded dispatch (the capacity factor bounds each expert's tokens)"
            )
            raise ModelConfigError(
                f"model config imbalance={im}: a dropless mixture of experts' routing, and this "
                f"is {why}; leave it 1",
                param="imbalance",
            )
        if not isinstance(self.dispatch_once, bool) or (self.dispatch_once and not self.experts):
            why = (
                "this model has no experts to dispatch to"
                if isinstance(self.dispatch_once, bool)
                else "give True or False"
            )
            raise ModelConfigError(
                f"model config dispatch_once={self.dispatch_once!r}: {why}; True sends each "
                f"token once to each device of its experts (a mixture of experts: experts=N), "
                f"False once per expert",
                param="dispatch_once",
            )
        if not isinstance(self.weight_activations, bool) or (
            self.weight_activations and not self.experts
        ):
            why = (
                "this model has no experts to weight"
                if isinstance(self.weight_activations, bool)
                else "give True or False"
            )
            raise ModelConfigError(
                f"model config weight_activations={self.weight_activations!r}: {why}; True "
                f"scales each slot's activation by its router weight before the "
                f"down-projection (Megatron-Core's grouped experts), False its output in the "
                f"combine (GShard's)",
                param="weight_activations",
            )
        if self.expert_ff is not None and not is_int(self.expert_ff, 1):
            raise ModelConfigError(
                f"model config expert_ff={self.expert_ff!r}: must be a positive integer or None "
                f"(None: ff)"
            )
        for name in ("expert_groups", "groups_per_token"):
            value = getattr(self, name)
            if not is_int(value, 1) or value > MAX_DIM:
                raise ModelConfigError(
                    f"model config {name}={value!r}: must be a positive integer (1: the router "
                    f"picks among every expert)"
                )
        if not self.experts:
            extra = [
                n
                for n in ("top_k", "shared_experts", "dense_layers", "expert_ff", "capacity_factor")
                if getattr(self, n)
            ]
            extra += [n for n in ("expert_groups", "groups_per_token") if getattr(self, n) != 1]
            if extra:
                raise ModelConfigError(
                    f"model config {', '.join(f'{n}={getattr(self, n)}' for n in extra)} "
                    f"describe a mixture of experts, but experts=0 (dense); give experts=N"
                )
            return
        if not 1 <= self.top_k <= self.experts:
            raise ModelConfigError(
                f"model config top_k={self.top_k}: each token goes to 1 to experts="
                f"{self.experts} experts; choose top_k in that range"
            )
        if self.dense_layers >= self.layers:
            raise ModelConfigError(
                f"model config dense_layers={self.dense_layers}: a mixture of experts needs a "
                f"layer with experts after them, and it has layers={self.layers}"
            )
        groups, chosen = self.group_limit
        if self.experts % groups or chosen > groups:
            raise ModelConfigError(
                f"model config expert_groups={groups}, groups_per_token={chosen}: the "
                f"experts={self.experts} split into equal groups, a token's chosen among "
                f"them; choose expert_groups dividing {self.experts} and groups_per_token "
                f"at most it"
            )
        if self.top_k > chosen * (self.experts // groups):
            raise ModelConfigError(
                f"model config top_k={self.top_k}: a token's experts come from "
                f"groups_per_token={chosen} groups of {self.experts // groups}, "
                f"{chosen * (self.experts // groups)} experts; choose top_k at most that, or "
                f"more groups_per_token"
            )

    @property
    def q_per_kv(self) -> int:
        """Query heads per key/value head (1 for multi-head attention)."""
        return self.heads // self.kv_heads  # type: ignore[operator]

    @property
    def itemsize(self) -> int:
        return {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype]

    @property
    def is_moe(self) -> bool:
        """Whether its MLPs are mixtures of experts."""
        return self.experts > 0

    @property
    def experts_words(self) -> str:
        """A mixture's routed experts in words for a headline ("" for a dense model).

        >>> ModelConfig(experts=256, top_k=8, expert_groups=8, groups_per_token=4).experts_words
        '256 experts, 8 a token from 4 of 8 groups'
        >>> ModelConfig(experts=8, top_k=2).experts_words
        '8 experts, 2 a token'
        """
        if not self.is_moe:
            return ""
        groups, chosen = self.group_limit
        within = f" from {chosen} of {groups} groups" if chosen < groups else ""
        return f"{self.experts} experts, {self.top_k} a token{within}"

    @property
    def group_limit(self) -> tuple[int, int]:
        """``(expert_groups, groups_per_token)``: the groups of experts, and how many of
        them a token's experts come from.

        >>> ModelConfig(experts=256, top_k=8, expert_groups=8, groups_per_token=4).group_limit
        (8, 4)
        """
        return self.expert_groups, self.groups_per_token

    @property
    def is_mla(self) -> bool:
        """Whether its attention is multi-head latent attention (DeepSeek-V2 and V3): keys and
        values decompressed per head from a shared ``kv_lora_rank`` latent, queries through
        a ``q_lora_rank`` one (or directly when 0), and ``rope_head_dim`` more query and key
        dimensions (one key part shared by the heads)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Dimensions a query and a key of one head have: ``head_dim``, and under latent
        attention its rotary part too."""
        assert self.head_dim is not None
        return self.head_dim + self.rope_head_dim

    @property
    def value_head_dim(self) -> int:
        """Dimensions a value of one head has: ``v_head_dim`` under latent attention, else
        ``head_dim``."""
        v = self.v_head_dim if self.is_mla else self.head_dim
        assert v is not None
        return v

    @property
    def moe_layers(self) -> int:
        """Layers with experts (0 for a dense model)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def dense_layer_count(self) -> int:
        """Layers with a dense MLP: all of a dense model's, a mixture's ``dense_layers``."""
        return self.layers - self.moe_layers

    @property
    def weights_activations(self) -> bool:
        """Whether the router weight scales each slot's activation before the
        down-projection rather than its output in the combine: ``weight_activations``, or a
        mixture sent once to each device of its experts (``dispatch_once``), which weights
        there. The backward then keeps no expert output for the weights' gradient.

        >>> ModelConfig(experts=8, top_k=2).weights_activations
        False
        >>> ModelConfig(experts=8, top_k=2, weight_activations=True).weights_activations
        True
        """
        return self.dispatch_once or self.weight_activations

    @property
    def routed_capacity(self) -> float:
        """Slots each token's assignments take in the busiest expert, over ``top_k``: the
        capacity factor (padded slots are computed and moved too), or for dropless dispatch
        the ``imbalance`` (1: uniform routing, which the published benchmarks force)."""
        return self.imbalance if self.capacity_factor is None else float(self.capacity_factor)

    def param_count(self) -> int:
        """Number of parameters (every entry of :func:`param_shapes`)."""
        return sum(math.prod(shape) for shape in param_shapes(self).values())

    def active_param_count(self, *, embedding: bool = True) -> int:
        """Parameters one token's forward uses: all but the routed experts it is not sent
        to (``top_k`` of ``experts`` in each layer with experts); ``embedding=False`` leaves
        out the input embedding (a lookup, not a matmul), as some model cards count. A dense
        model uses all of them.

        >>> c = ModelConfig(d_model=64, heads=8, ff=256, experts=8, top_k=2)
        >>> (c.param_count() - c.active_param_count()) // (c.layers * 2 * 64 * 256)
        6
        """
        shapes = param_shapes(self)
        total = self.param_count()
        if self.is_moe:
            per_expert = sum(math.prod(shapes[n][2:]) for n in EXPERT_PARAMS if n in shapes)
            moe_layers = self.layers - self.dense_layers
            total -= moe_layers * (self.experts - self.top_k) * per_expert
        if not embedding and "embed" in shapes:
            total -= math.prod(shapes["embed"]) if not self.tie_embeddings else 0
        return total


_DEFAULTS = {"kv_heads": "heads", "head_dim": "d_model / heads"}


def _divisor_near(n: int, want: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), -d))


# -- parameters ----------------------------------------------------------------------------

# Per-layer weights; stacked, each gets a leading ``layers`` axis. A model has ``w_up`` (GELU)
# or ``w_gate_up`` (SwiGLU), never both.
LAYER_PARAMS = (
    "attn_norm",
    "wqkv",
    *("wq", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b"),
    "wo",
    "mlp_norm",
    "w_up",
    "w_gate_up",
    "w_down",
)
#: Multi-head latent attention's weights, in place of ``wqkv`` (``wq`` without a query
#: latent; ``wq_a``, ``q_norm`` and ``wq_b`` with one).
MLA_PARAMS = ("wq", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b")
# Weights outside the layer stack, present only with a vocabulary (``unembed`` only untied).
VOCAB_PARAMS = ("embed", "final_norm", "unembed")
# A mixture of experts' layers with experts (their own stack, after the dense layers): the
# router, the routed experts (a leading experts axis after the layers axis) and the shared
# experts, beside the attention of LAYER_PARAMS.
MOE_PARAMS = (
    "moe_attn_norm",
    "moe_wqkv",
    *(f"moe_{n}" for n in MLA_PARAMS),
    "moe_wo",
    "moe_mlp_norm",
    "router",
    "shared_gate_up",
    "shared_up",
    "shared_down",
    "expert_gate_up",
    "expert_up",
    "expert_down",
)
EXPERT_PARAMS = ("expert_gate_up", "expert_up", "expert_down")


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every parameter; layer weights carry the leading layers axis.

    ``wqkv`` is ``[d_model, kv_heads, q_per_kv + 2, head_dim]``: for each key/value head, its
    ``q_per_kv`` query heads, then its key and its value (Megatron-LM's query groups), so
    sharding the key/value heads shards every projection along one named dimension and keeps
    each group's queries with their keys and values. ``wo`` is ``[heads, head_dim, d_model]``.
    The projections are one weight so that their input gradient is one sum: as separate
    matmuls, the partitioner all-reduces each partial gradient under tensor parallelism. For
    the same reason SwiGLU's gate and up projections are one ``w_gate_up`` of
    ``[d_model, 2, ff]``.

    A mixture of experts (``config.is_moe``) has the dense stack for its ``dense_layers``
    (none when 0) and a stack of the layers with experts (:data:`MOE_PARAMS`): the attention's
    weights again, the router ``[d_model, experts]``, each routed expert's MLP with a leading
    experts axis, and the shared experts' MLP (``shared_experts x expert_ff`` wide).
    """
    c = config
    L, d = c.layers, c.d_model
    shapes: dict[str, tuple[int, ...]] = {"attn_norm": (L, d), **attention_shapes(c, L)}
    shapes["mlp_norm"] = (L, d)
    if c.mlp == "swiglu":
        shapes["w_gate_up"] = (L, d, 2, c.ff)
    else:
        shapes["w_up"] = (L, d, c.ff)
    shapes["w_down"] = (L, c.ff, d)
    if c.is_moe:
        # the first dense_layers layers are the stack above; the others have experts
        M, E, f = c.layers - c.dense_layers, c.experts, c.expert_ff or c.ff
        dense = {n: (c.dense_layers, *shape[1:]) for n, shape in shapes.items()}
        shapes = {n: s for n, s in dense.items() if c.dense_layers}
        shapes["moe_attn_norm"] = (M, d)
        shapes.update({f"moe_{n}": shape for n, shape in attention_shapes(c, M).items()})
        shapes.update(moe_mlp_norm=(M, d), router=(M, d, E))
        if c.mlp == "swiglu":
            shapes["expert_gate_up"] = (M, E, d, 2, f)
        else:
            shapes["expert_up"] = (M, E, d, f)
        shapes["expert_down"] = (M, E, f, d)
        if c.shared_experts:
            g = c.shared_experts * f
            if c.mlp == "swiglu":
                shapes["shared_gate_up"] = (M, d, 2, g)
            else:
                shapes["shared_up"] = (M, d, g)
            shapes["shared_down"] = (M, g, d)
    if c.vocab is not None:
        shapes.update(embed=(c.vocab, d), final_norm=(d,))
        if not c.tie_embeddings:
            shapes["unembed"] = (d, c.vocab)
    return shapes


def attention_shapes(c: ModelConfig, layers: int) -> dict[str, tuple[int, ...]]:
    """The attention's projections, ``layers`` of each: ``wqkv`` and ``wo``, or latent
    attention's (``wq`` or ``wq_a``, ``q_norm``, ``wq_b``; ``wkv_a`` to the key and value
    latent and the shared rotary key, ``kv_norm``, ``wkv_b`` to each head's key and value)
    and ``wo`` from the values."""
    L, d, h, k, kv = layers, c.d_model, c.heads, c.head_dim, c.kv_heads
    assert k is not None and kv is not None
    if not c.is_mla:
        return {"wqkv": (L, d, kv, c.q_per_kv + 2, k), "wo": (L, h, k, d)}
    qk, v = c.qk_head_dim, c.value_head_dim
    out: dict[str, tuple[int, ...]] = {}
    if c.q_lora_rank:
        q = c.q_lora_rank
        out.update(wq_a=(L, d, q), q_norm=(L, q), wq_b=(L, q, h, qk))
    else:
        out["wq"] = (L, d, h, qk)
    out.update(
        wkv_a=(L, d, c.kv_lora_rank + c.rope_head_dim),
        kv_norm=(L, c.kv_lora_rank),
        wkv_b=(L, c.kv_lora_rank, h, k + v),
        wo=(L, h, v, d),
    )
    return out


def split_params(flat: dict[str, Any]) -> dict[str, Any]:
    """``{name: leaf}`` -> the model's pytree ``{"layers": {...}, "embed": ..., ...}``; a
    mixture of experts' layers with experts under ``"moe_layers"``, their attention's
    weights by the dense names (``moe_wqkv`` as ``wqkv``)."""
    tree: dict[str, Any] = {"layers": {k: flat[k] for k in LAYER_PARAMS if k in flat}}
    moe = {k.removeprefix("moe_"): flat[k] for k in MOE_PARAMS if k in flat}
    if moe:
        tree["moe_layers"] = moe
    tree.update({k: flat[k] for k in VOCAB_PARAMS if k in flat})
    return tree


def flat_params(tree: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_params`."""
    out = dict(tree["layers"])
    for k, v in tree.get("moe_layers", {}).items():
        out[f"moe_{k}" if f"moe_{k}" in MOE_PARAMS else k] = v
    out.update({k: v for k, v in tree.items() if k not in ("layers", "moe_layers")})
    return out
