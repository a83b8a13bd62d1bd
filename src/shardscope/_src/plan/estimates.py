"""Analytic estimates for a strategy's placement: memory per device, model FLOPs, which links a
collective's groups use. Pure arithmetic on the config and the strategy's rules; no compiling.

Memory (per device, bytes):

* model state (ZeRO, arXiv 1910.02054): parameters and gradients at the model's dtype, and
  ``bytes_per_param - 2 x itemsize`` bytes of optimizer state per parameter (16 by default:
  bf16 params and grads, fp32 master copy, Adam m and v). Each parameter is divided by the
  number of devices its storage spec shards it over, so DP holds everything, FSDP ``1/d``,
  tensor parallelism ``1/t`` of the sharded matrices (norm gains stay whole).
* activations kept for the backward pass (Korthikanti et al., arXiv 2205.05198, Table 2,
  16-bit activations), per layer with ``s`` sequence, ``b`` sequences per data shard, ``h``
  d_model, ``a`` heads, ``f`` ff and ``t`` the tensor-parallel degree:
  ``sbh (10 + (8 + 4f/h)/t + 5as/(ht))`` and, with sequence parallelism,
  ``sbh ((18 + 4f/h)/t + 5as/(ht))``, the paper's two dropout masks (``sbh`` each) among
  the ``10`` (not counted for Transformer Engine's layers, ``fp8_saved_inputs="fp8"``, which
  keep none). With ``f = 4h`` these are the paper's
  ``sbh (10 + 24/t + 5as/(ht))`` and ``sbh (34/t + 5as/(ht))``. Flash attention drops the
  ``5as/(ht)`` term (the default). The MLP's ``4f/h`` is the input and the output of its
  element-wise block (GELU's, ``2f`` bytes a token each); a SwiGLU MLP keeps ``6f/h``: the
  gate and up projections and their product. The element-wise blocks (norms, activations) keep
  nothing between their input and output: they run as fused kernels do
  (:func:`~shardscope._src.model.transformer.fused`). Plus the logits, ``bsv`` at the model
  dtype, and their gradient beside them when training (``/t`` under sequence parallelism,
  which projects each device's own tokens).
  Scaled by ``itemsize / 2`` for 32-bit models. A forward pass keeps one layer's.
  ``b`` is the batch over every axis that splits it: HSDP's ``replica x data``, though its
  model state is divided by ``data`` alone.
  Context parallelism (the sequence over ``context``, ``c`` ways) divides every activation
  and the logits by ``c``: each device holds ``s / c`` tokens of its sequences.
* FSDP's gathered weights: one layer's full weights (divided by ``t``), alive while it runs.
* Context parallelism's gathered keys and values: one layer's, the whole sequence,
  ``2 s kv_dim b`` elements (``/t`` under tensor parallelism, which splits their heads),
  alive while it runs (the all-gather form; ring attention holds two blocks of them at a
  time instead).

Model FLOPs per step (the same paper's Eq. 7, generalised to an MLP of width ``f``): forward
``2 T (L (4h^2 + 2hf) + 2 L s h + h v)`` for ``T = batch x seq`` tokens (non-causal attention,
as the paper counts it), train 3x forward (no recomputation). With ``f = 4h`` this is
``72 B L s h^2 (1 + s/(6h) + v/(12hL))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shardscope._src.base.errors import PlanError, is_int
from shardscope._src.base.records import Record, record_dict
from shardscope._src.base.vocab import Vocab
from shardscope._src.cost.flops import Gemm, attention_core_flops, weight_flops
from shardscope._src.cost.routing import Routing
from shardscope._src.model.config import (
    EXPERT_PARAMS,
    LAYER_PARAMS,
    MOE_PARAMS,
    Mode,
    ModelConfig,
    Remat,
    attention_shapes,
    param_shapes,
)
from shardscope._src.model.moe import device_share
from shardscope._src.model.remat import MLP_IN, remat_policy
from shardscope._src.sharding.strategies import Placement, Role
from shardscope._src.targets.hardware import Hardware

#: Mixed-precision Adam: bf16 params (2) + bf16 grads (2) + fp32 master, m, v (12).
DEFAULT_BYTES_PER_PARAM = 16

FLOPS_CONVENTION = (
    "model FLOPs: forward 2 x tokens x (the weight matrices a token meets: each layer's "
    "query, key and value projections at their heads, its output projection and its MLP's "
    "matrices, three where the MLP is gated, a mixture's router, shared experts and top_k "
    "routed ones; the unembedding, h x v) + each layer's attention core, QK^T and PV of "
    "every token against its whole sequence (4 x tokens x s x heads x head_dim), "
    "non-causal; train = 3 x forward, no recompute. For an MLP of two matrices and as many "
    "key as query heads this is Korthikanti et al. 2022's Eq. 7 with MLP width ff: forward "
    "2 x tokens x (L(4h^2 + 2h ff) + 2Lsh + hv)"
)
ACTIVATION_CONVENTION = (
    "activations: Korthikanti et al. 2022, Table 2, MLP terms scaled from 4h to ff, "
    "16-bit, stored for the backward pass"
)


class MatmulDtype(Vocab):
    """The element type the time model runs the transformer layers' matmuls in."""

    #: the model's 16-bit matmuls at ``peak_flops``
    BFLOAT16 = "bfloat16"
    #: the projections' and the MLP's matmuls in fp8 (E4M3, arXiv 2209.05433) at
    #: ``fp8_peak_flops``; the attention core and the unembedding stay 16-bit
    FP8 = "fp8"


def check_matmul_dtype(matmul_dtype: object, hw: Hardware) -> MatmulDtype:
    """``matmul_dtype`` as a member, refused (a :class:`PlanError` naming the value and the
    fix) when it is not one or is fp8 on a device without fp8 matmuls."""
    dtype = MatmulDtype.parse(
        matmul_dtype, what="matmul_dtype", error=PlanError, param="matmul_dtype"
    )
    if dtype == MatmulDtype.FP8 and not hw.has_fp8:
        raise PlanError(
            f"matmul_dtype={dtype.value!r}: hardware {hw.name!r} has no fp8 matmuls "
            f"(fp8_peak_flops={hw.fp8_peak_flops:g}, fp8_matmul_fraction="
            f"{hw.fp8_matmul_fraction:g}); use matmul_dtype='bfloat16', hardware with fp8 "
            f"(h100, h200, b200), or give it fp8_peak_flops= and fp8_matmul_fraction=",
            param="matmul_dtype",
        )
    return dtype


class Fp8SavedInputs(Vocab):
    """How an fp8 training step keeps its linear layers' inputs for the backward."""

    #: the 16-bit inputs, cast again in the backward: torchao's float8 training
    #: (torchtitan; ``matmul_with_hp_or_float8_args`` saves ``input_hp``), and the
    #: planner's 16-bit JAX reference program
    HIGH_PRECISION = "high-precision"
    #: their fp8 copies (1 byte an element), a sequence-parallel linear's local shard,
    #: gathered again in the backward: Transformer Engine's ``Linear`` and
    #: ``LayerNormLinear`` (NeMo, Megatron-Core, Megatron-Bridge), which also cast their
    #: weights once a step, not once a pass (:func:`fp8_weight_cast_bytes`). Their layers
    #: are Megatron-Core's, whose bias-dropout-add keeps no dropout mask at the models'
    #: ``hidden_dropout`` 0 (``torch.nn.functional.dropout`` returns its input at ``p=0``):
    #: Korthikanti et al.'s two masks, ``sbh`` bytes each, are not counted
    FP8 = "fp8"


def check_fp8_saved_inputs(value: object, matmul_dtype: object) -> Fp8SavedInputs | None:
    """``fp8_saved_inputs`` as a member (None, with fp8 matmuls: ``high-precision``; with
    16-bit matmuls it stays None), refused (a :class:`PlanError` naming the value and the
    fix) when it is not one, or is given with 16-bit matmuls, where it means nothing."""
    dtype = MatmulDtype.parse(
        matmul_dtype, what="matmul_dtype", error=PlanError, param="matmul_dtype"
    )
    if value is None:
        return Fp8SavedInputs.HIGH_PRECISION if dtype == MatmulDtype.FP8 else None
    saved = Fp8SavedInputs.parse(
        value, what="fp8_saved_inputs", error=PlanError, param="fp8_saved_inputs"
    )
    if dtype != MatmulDtype.FP8:
        raise PlanError(
            f"fp8_saved_inputs={saved.value!r}: says how an fp8 step keeps its linear "
            f"layers' inputs, and matmul_dtype={dtype.value!r} runs none in fp8; give "
            f"matmul_dtype='fp8' with it, or drop fp8_saved_inputs",
            param="fp8_saved_inputs",
        )
    return saved


def check_fp8_params(value: object, matmul_dtype: object, fp8_saved_inputs: object) -> int | None:
    """``fp8_params`` as given (None: the layers' weights at the model's dtype; a count:
    the linear layers' weights kept in fp8 but that many layers at each end of the model,
    Megatron-Bridge's FP8-CS recipe's ``num_layers_at_start_in_bf16`` and
    ``num_layers_at_end_in_bf16``), refused (a :class:`PlanError` naming the value and the
    fix) when it is not a count of layers, or is given without Transformer Engine's fp8
    linears (``matmul_dtype="fp8"`` and ``fp8_saved_inputs="fp8"``), whose weights these
    are."""
    if value is None:
        return None
    count = value if is_int(value, 0) else None
    if count is None:
        raise PlanError(
            f"fp8_params={value!r}: the layers at each end of the model whose weights stay "
            f"16-bit, 0 or more (Megatron-Bridge's FP8-CS recipe: 1); give a count, or "
            f"drop fp8_params to keep every weight 16-bit",
            param="fp8_params",
        )
    dtype = MatmulDtype.parse(
        matmul_dtype, what="matmul_dtype", error=PlanError, param="matmul_dtype"
    )
    if dtype != MatmulDtype.FP8 or fp8_saved_inputs != Fp8SavedInputs.FP8:
        raise PlanError(
            f"fp8_params={value!r}: keeps Transformer Engine's fp8 linear layers' weights in "
            f"fp8, and matmul_dtype={dtype.value!r} with fp8_saved_inputs="
            f"{fp8_saved_inputs!r} runs no such layer; give matmul_dtype='fp8' and "
            f"fp8_saved_inputs='fp8' with it, or drop fp8_params",
            param="fp8_params",
        )
    return count


#: Bytes an fp8 cast moves per element besides the two reads of the 16-bit tensor: the write of
#: its 1-byte copy (dynamic tensorwise scaling: the amax pass reads the tensor, the cast reads it
#: again and writes the copy).
FP8_ITEMSIZE = 1


@dataclass(frozen=True)
class MemoryEstimate:
    """Analytic bytes per device, by what they hold."""

    params: int
    grads: int
    optimizer: int
    activations: int
    gathered_weights: int
    #: what lives in host memory: activations a recomputation policy offloads, and the
    #: optimizer state when it is offloaded (not in ``total``)
    host: int = 0
    #: the optimizer state is in host memory (``optimizer`` still says how large it is)
    optimizer_on_host: bool = False
    #: one layer's keys and values of the whole sequence, gathered over ``context`` while
    #: it runs (context parallelism)
    gathered_kv: int = 0

    @property
    def device_optimizer(self) -> int:
        """The optimizer state in device memory: none of it when it is on the host."""
        return 0 if self.optimizer_on_host else self.optimizer

    @property
    def model_state(self) -> int:
        """Parameters, gradients and the optimizer state in device memory: what no
        recomputation can shrink."""
        return self.params + self.grads + self.device_optimizer

    @property
    def total(self) -> int:
        return self.model_state + self.activations + self.gathered_weights + self.gathered_kv

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, extra=("model_state", "total"))


def data_ways(placement: Placement) -> int:
    """How many ways the batch is split (1 when the strategy replicates it)."""
    return placement.role_size(placement.strategy.batch_entry)


def model_ways(placement: Placement) -> int:
    return placement.role_size(Role.MODEL) if Role.MODEL in placement.strategy.roles else 1


def context_ways(placement: Placement) -> int:
    """How many ways the sequence of every activation is split (context parallelism), or 1."""
    return placement.role_size(Role.CONTEXT) if placement.strategy.context_parallel else 1


def elements_per_device(placement: Placement, rules: Mapping[str, Any], prefix: str = "") -> int:
    """Elements one device stores of every parameter-shaped array stored by ``rules`` (of
    those whose names start with ``prefix``: ``"expert_"`` for the routed experts')."""
    return sum(
        elements // placement.ways(rules[name])
        for name, elements in placement.param_elements
        if name.startswith(prefix)
    )


def stage_elements_per_device(
    placement: Placement,
    rules: Mapping[str, Any],
    stages: int = 1,
    stage: PipelineStage | None = None,
) -> int:
    """Elements one device of the stage planned stores of every parameter-shaped array stored
    by ``rules``: :func:`elements_per_device`, but with pipeline stages (``stages`` > 1) the
    planned stage is the last, which holds the output layer, and an embedding that is not the
    output layer (untied) lives on the first stage alone (Megatron-LM's
    ``pre_process``/``post_process`` stages), so it is not counted. The first stage holds
    that embedding and more micro-batches in flight, which the memory estimate counts (a
    table of the same size as the output layer's: the estimate bounds both stages). With a
    ``stage`` of a split that counts the embedding or the loss as a layer, that stage's own:
    the embedding where it holds it, the output layer where it holds it."""
    n = elements_per_device(placement, rules)
    shapes = param_shapes(placement.config)
    if stage is not None:
        # the embedding table where it is the input embedding or (tied) the output layer,
        # the untied output layer on the last stage
        if "embed" in shapes and not (
            stage.embedding or (stage.output and "unembed" not in shapes)
        ):
            n -= math.prod(shapes["embed"]) // placement.ways(rules["embed"])
        if "unembed" in shapes and not stage.output:
            n -= math.prod(shapes["unembed"]) // placement.ways(rules["unembed"])
        return n
    if stages > 1 and "embed" in shapes and "unembed" in shapes:
        n -= math.prod(shapes["embed"]) // placement.ways(rules["embed"])
    return n


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending: ``divisors(12)`` is ``[1, 2, 3, 4, 6, 12]``."""
    return [d for d in range(1, n + 1) if n % d == 0]


def or_list(values: Sequence[object]) -> str:
    """``"1, 2 or 4"``."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def interleave_problem(
    virtual_stages: object,
    stages: int | None,
    microbatches: int | None = None,
    stage_layers: int | None = None,
    *,
    train: bool = True,
) -> str | None:
    """Why ``virtual_stages`` model chunks per device cannot run with ``stages`` pipeline
    stages of ``stage_layers`` layers and ``microbatches`` micro-batches per data shard (each
    None: not checked), in words that name the fix; None when they can. A forward pass
    (``train=False``) runs one micro-batch and is not interleaved.

    Interleaved 1F1B (Narayanan et al., arXiv 2104.04473, section 2.2.2) splits each stage's
    layers into ``virtual_stages`` chunks, so they must divide them (Megatron-LM's
    ``--num-layers-per-virtual-pipeline-stage`` must divide the layers of a stage), and needs
    pipeline stages to interleave. Megatron-LM's interleaved schedule needs the micro-batches
    a multiple of the stages: ``forward_backward_pipelining_with_interleaving``
    (``megatron/core/pipeline_parallel/schedules.py``) raises "number of microbatches is not
    divisible by pipeline-model-parallel-size when using interleaved schedule", and its
    README states the condition.

    >>> interleave_problem(2, 4, 8, stage_layers=10) is None
    True
    >>> interleave_problem(3, 4, 8, stage_layers=10)
    'virtual_stages=3: must divide the 10 layers of each of the 4 stages; choose 1, 2, 5 or 10'
    """
    v = virtual_stages
    if not is_int(v, 1):
        return f"virtual_stages={v!r}: must be a positive whole number"
    if v == 1:
        return None
    if not train:
        return (
            f"virtual_stages={v}: a forward pass runs one micro-batch and is planned without "
            f"interleaving; give virtual_stages=1 (or None), or mode='train'"
        )
    if stages is None:
        return None
    if stages <= 1:
        return (
            f"virtual_stages={v}: interleaving splits the layers of each pipeline stage, and "
            f"there is none (stages=1); give stages= more than 1, or virtual_stages=1"
        )
    if stage_layers is not None and stage_layers % v:
        return (
            f"virtual_stages={v}: must divide the {stage_layers} layers of each of the "
            f"{stages} stages; choose {or_list(divisors(stage_layers))}"
        )
    if microbatches is not None and microbatches % stages:
        return (
            f"virtual_stages={v}: the interleaved schedule (Megatron-LM's) needs the "
            f"micro-batches a multiple of the {stages} stages, and there are {microbatches}; "
            f"give microbatches={stages}, {2 * stages}, ... or virtual_stages=1"
        )
    return None


class PipelineSplit(Vocab):
    """What a pipeline's stages split: the layers alone, or with the input embedding and the
    output layer and loss counted as one layer each (Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``,
    Megatron-Core's ``TransformerConfig`` fields of those names, which Megatron-Bridge's
    recipes set)."""

    #: the layers alone, as evenly as they go (the larger stages last); the stage with the
    #: output layer is planned, with the most layers (:func:`stage_layers`)
    LAYERS = "layers"
    #: the embedding counted as a layer: it takes one layer's place in the first stage's
    #: first model chunk
    EMBEDDING = "embedding"
    #: the output layer and the loss counted as a layer: they take one layer's place in the
    #: last stage's last model chunk
    LOSS = "loss"
    #: both (Megatron-Bridge's Llama 3.1 405B recipe, the Megatron MoE model zoo's configs)
    EMBEDDING_LOSS = "embedding+loss"

    @property
    def embedding(self) -> bool:
        """Whether the embedding is counted as a layer."""
        return self in (PipelineSplit.EMBEDDING, PipelineSplit.EMBEDDING_LOSS)

    @property
    def loss(self) -> bool:
        """Whether the output layer and the loss are counted as a layer."""
        return self in (PipelineSplit.LOSS, PipelineSplit.EMBEDDING_LOSS)

    @property
    def accounted(self) -> bool:
        """Whether anything but the layers is counted (Megatron's split, not the planner's)."""
        return self.embedding or self.loss


def split_problem(split: object, layers: int, stages: int, virtual_stages: int = 1) -> str | None:
    """Why ``stages`` pipeline stages of ``virtual_stages`` model chunks each cannot split the
    model's ``layers`` with the embedding and the loss counted as ``split`` says, in words
    that name the fix; None when they can (and always under ``"layers"``, or with one stage).

    Megatron-Core's ``get_num_layers_to_build``
    (``megatron/core/transformer/transformer_block.py``) adds one layer for each counted
    piece, asserts that the sum divides by the pipeline stages ("num_layers should be
    divisible by pipeline_model_parallel_size") and each stage's share by the virtual
    stages, then builds one layer fewer in the first stage's first chunk (the embedding)
    and the last stage's last chunk (the loss). A stage left with no layer is refused: the
    planner places a stage's layers.

    >>> split_problem("embedding+loss", 126, 8, 8) is None
    True
    >>> print(split_problem("embedding+loss", 126, 6))  # doctest: +NORMALIZE_WHITESPACE
    pipeline_split=embedding+loss: the 126 layers and the embedding and the loss counted as
    a layer each are 128, which 6 pipeline stages do not divide (they divide by 1, 2, 4, 8,
    16, 32, 64 or 128); give stages= dividing them, or pipeline_split=layers
    """
    s = PipelineSplit.parse(split, what="pipeline_split", error=PlanError, param="pipeline_split")
    if not s.accounted or stages <= 1:
        return None
    pieces = layers + s.embedding + s.loss
    what = " and ".join(w for w, on in (("the embedding", s.embedding), ("the loss", s.loss)) if on)
    each = " each" if s.embedding and s.loss else ""
    counted = f"the {layers} layers and {what} counted as a layer{each} are {pieces}"
    if pieces % stages:
        return (
            f"pipeline_split={s}: {counted}, which {stages} pipeline stages do not divide "
            f"(they divide by {or_list(divisors(pieces))}); give stages= dividing them, or "
            f"pipeline_split=layers"
        )
    per_stage = pieces // stages
    if per_stage % virtual_stages:
        return (
            f"pipeline_split={s}: {counted}, {per_stage} a stage over {stages} stages, which "
            f"virtual_stages={virtual_stages} does not divide; choose virtual_stages= among "
            f"{or_list(divisors(per_stage))}, or pipeline_split=layers"
        )
    if per_stage - s.embedding < 1 or per_stage - s.loss < 1:
        return (
            f"pipeline_split={s}: {counted}, {per_stage} a stage over {stages} stages, which "
            f"leaves the first or the last stage no layer; choose fewer stages"
        )
    return None


def offload_layers_problem(offload_layers: object, layers: int, stages: int = 1) -> str | None:
    """Why the activations of ``offload_layers`` of a model's ``layers`` cannot be offloaded
    to host memory layer by layer, in words that name the fix; None when they can.

    Megatron-Core's activation offloading (``cpu_offloading_num_layers``, Transformer
    Engine's ``get_cpu_offload_context``) copies the saved activations of the first ``N``
    layers to the host after each one's forward and back before its backward; its
    ``TransformerConfig`` refuses ``N`` outside ``[0, num_layers)`` (the last layer, whose
    backward comes first, is never offloaded) and any pipeline (``pipeline_model_parallel_
    size > 1``): the planner takes the same bounds.

    >>> offload_layers_problem(40, 80) is None
    True
    >>> print(offload_layers_problem(80, 80))  # doctest: +NORMALIZE_WHITESPACE
    offload_layers=80: at most the 79 layers before the last can have their activations
    offloaded (the last layer's backward comes first; Megatron-Core's
    cpu_offloading_num_layers < num_layers); give offload_layers= from 0 to 79
    """
    if isinstance(offload_layers, bool) or not isinstance(offload_layers, int):
        return (
            f"offload_layers={offload_layers!r}: give a whole number of layers, 0 to {layers - 1}"
        )
    if offload_layers < 0:
        return (
            f"offload_layers={offload_layers}: a count of layers cannot be negative; give "
            f"offload_layers= from 0 (none offloaded) to {layers - 1}"
        )
    if offload_layers >= layers:
        return (
            f"offload_layers={offload_layers}: at most the {layers - 1} layers before the "
            f"last can have their activations offloaded (the last layer's backward comes "
            f"first; Megatron-Core's cpu_offloading_num_layers < num_layers); give "
            f"offload_layers= from 0 to {layers - 1}"
        )
    if offload_layers and stages > 1:
        return (
            f"offload_layers={offload_layers} with {stages} pipeline stages: layer-by-layer "
            f"activation offloading runs without a pipeline (Megatron-Core refuses "
            f"cpu_offloading with pipeline_model_parallel_size > 1); give stages=1 or "
            f"offload_layers=0"
        )
    return None


@dataclass(frozen=True)
class PipelineStage(Record):
    """One pipeline stage of a split that counts the embedding or the loss as a layer
    (:class:`PipelineSplit`): its ``rank`` (0 the first), the layers of each of its model
    chunks in the order it runs them (one chunk without interleaving), and whether it holds
    the input ``embedding`` and the ``output`` layer (with the logits and the loss).

    >>> PipelineStage(0, (1, 2, 2), embedding=True, output=False).layers
    5
    """

    rank: int
    chunk_layers: tuple[int, ...]
    embedding: bool = False
    output: bool = False

    @property
    def layers(self) -> int:
        return sum(self.chunk_layers)


def split_stages(
    split: object, layers: int, stages: int, virtual_stages: int = 1
) -> tuple[PipelineStage, ...]:
    """The stages a split that counts the embedding or the loss as a layer prices: the first
    (rank 0, the embedding), one of the middle ones (rank 1: the most micro-batches in
    flight of those with the most layers) where there are any, and the last (the output
    layer); each with its chunks' layers as Megatron-Core builds them
    (:func:`split_problem` says when it cannot).

    Llama 3.1 405B's 126 layers over 8 stages of 8 chunks, the embedding and the loss counted
    (128 pieces, 2 a chunk): the first stage's first chunk holds the embedding and one layer,
    the last stage's last chunk one layer and the loss:

    >>> [s.chunk_layers for s in split_stages("embedding+loss", 126, 8, 8)]
    [(1, 2, 2, 2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 2, 2, 1)]
    """
    problem = split_problem(split, layers, stages, virtual_stages)
    if problem is not None:
        raise PlanError(problem, param="pipeline_split")
    s = PipelineSplit.parse(split)
    v = virtual_stages
    q = (layers + s.embedding + s.loss) // (stages * v)  # pieces a chunk
    first = (q - s.embedding, *[q] * (v - 1))
    last = (*[q] * (v - 1), q - s.loss)
    if stages == 2:
        return (PipelineStage(0, first, embedding=True), PipelineStage(1, last, output=True))
    return (
        PipelineStage(0, first, embedding=True),
        PipelineStage(1, (q,) * v),
        PipelineStage(stages - 1, last, output=True),
    )


def held_layers(stage: PipelineStage, stages: int, microbatches: int) -> int:
    """The most layers' activations of one micro-batch each that ``stage``'s device holds at
    once under (interleaved) 1F1B: Megatron-LM's schedule
    (``forward_backward_pipelining_with_interleaving``) runs ``(p - rank - 1) * 2 + (v - 1)
    p`` warm-up forwards on rank ``rank`` (``p - rank - 1`` without interleaving), then one
    forward before each backward; forward ``k`` runs chunk ``(k mod p v) // p``, backward
    ``k`` the chunks in the reverse order. With chunks of equal layers this is
    :attr:`Schedule.in_flight`'s chunks (rank 0's) times a chunk's layers.

    >>> held_layers(PipelineStage(0, (2, 2)), 4, 8), held_layers(PipelineStage(0, (1, 2)), 4, 8)
    (22, 15)
    """
    return _held_layers(stage.chunk_layers, stages, stage.rank, microbatches)


@lru_cache(maxsize=256)
def _held_layers(chunks: tuple[int, ...], p: int, rank: int, m: int) -> int:
    v = len(chunks)
    total = m * v
    if v == 1:
        ahead = min(p - rank, m)
    else:
        ahead = min(2 * (p - rank - 1) + (v - 1) * p + 1, total)

    def forward_chunk(k: int) -> int:
        return (k % (p * v)) // p

    held = sum(chunks[forward_chunk(k)] for k in range(ahead))
    peak, sent = held, ahead
    for k in range(total):
        held -= chunks[v - 1 - forward_chunk(k)]
        if sent < total:
            held += chunks[forward_chunk(sent)]
            sent += 1
            peak = max(peak, held)
    return peak


@dataclass(frozen=True)
class Schedule(Record):
    """How a train step is run: ``microbatches`` per data shard (gradient accumulation),
    ``remat`` (a recomputation policy's name: ``none``, ``selective``, ``full``, ...,
    :func:`~shardscope._src.model.remat.remat_policy`), pipeline ``stages`` (1F1B) and
    ``virtual_stages`` model chunks per device (interleaved 1F1B; 1: plain 1F1B);
    ``stage``: the pipeline stage priced where a split counts the embedding or the loss as
    a layer (:func:`split_stages`: its chunks' layers, rank and ends), None for the
    planner's own (the last stage's weights and output layer, the first stage's
    micro-batches in flight). ``offload_layers``: how many of the layers have the
    activations they keep copied to host memory after their forward and back for their
    backward (Megatron-Core's ``cpu_offloading_num_layers``; :func:`estimate_memory` refuses
    a count :func:`offload_layers_problem` names).

    Raises:
        PlanError: ``virtual_stages`` that cannot run with these stages and micro-batches
            (:func:`interleave_problem`).
    """

    microbatches: int = 1
    remat: str = Remat.NONE
    stages: int = 1
    offload_optimizer: bool = False
    virtual_stages: int = 1
    stage: PipelineStage | None = None
    offload_layers: int = 0

    def __post_init__(self) -> None:
        problem = interleave_problem(self.virtual_stages, self.stages, self.microbatches)
        if problem is not None:
            raise PlanError(problem, param="virtual_stages")

    @property
    def in_flight(self) -> int:
        """Model chunks of one micro-batch whose activations the first stage holds at once; a
        chunk is ``1 / virtual_stages`` of a stage's layers (the whole stage without
        interleaving).

        1F1B's first stage holds ``min(stages, microbatches)`` micro-batches (Narayanan et
        al., arXiv 2104.04473, section 2.2.1). Interleaved, Megatron-LM's schedule
        (``forward_backward_pipelining_with_interleaving`` in
        ``megatron/core/pipeline_parallel/schedules.py``) runs ``(p - rank - 1) * 2 + (v - 1)
        * p`` warm-up forwards of one chunk each (at most the ``m v`` there are), then one
        forward before each backward: the first stage (rank 0) holds ``min(2 (p - 1) + (v - 1)
        p + 1, m v)`` chunks, ``p + (p - 1) / v`` stages' worth of layers when ``m > p``
        (all ``m v`` when ``m = p``, where Megatron-LM runs every forward first). Without
        stages, one at a time.
        """
        p, m, v = self.stages, self.microbatches, self.virtual_stages
        if p == 1:
            return 1
        if v == 1:
            return min(p, m)
        return min(2 * (p - 1) + (v - 1) * p + 1, m * v)


def sequences_per_device(placement: Placement, microbatches: int = 1) -> int:
    """Sequences of one micro-batch on one device: the batch over the data axes and the
    micro-batches."""
    return placement.config.batch // data_ways(placement) // microbatches


def tokens_per_device(placement: Placement, microbatches: int = 1) -> int:
    """Tokens of one micro-batch on one device: its sequences, each ``seq / c`` long under
    context parallelism."""
    return (
        sequences_per_device(placement, microbatches)
        * placement.config.seq
        // context_ways(placement)
    )


def _activation_terms(
    placement: Placement, b: int, *, dense_mlp: bool = True, dropout_masks: bool = True
) -> tuple[float, float, float]:
    """Bytes of one layer's activations for ``b`` sequences on one device: (replicated
    over the model axis, split by it, attention scores split by it), at the model's dtype;
    ``dense_mlp=False`` leaves the MLP's hidden out (a layer with experts counts its own).
    ``dropout_masks=False`` leaves out Korthikanti et al.'s two dropout masks (after the
    attention and after the MLP, ``sbh`` bytes each): a layer that keeps none
    (:data:`Fp8SavedInputs.FP8`'s)."""
    c = placement.config
    s, h, f = c.seq, c.d_model, c.ff
    assert c.head_dim is not None and c.kv_heads is not None
    q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
    t = model_ways(placement)
    # The MLP's input and output of its element-wise block: GELU's ``2f`` each; SwiGLU's gate
    # and up projections ``4f``, their product ``2f``.
    mlp = (6 * f if c.mlp == "swiglu" else 4 * f) if dense_mlp else 0
    split: float = 2 * q_dim + 4 * kv_dim + 2 * q_dim + mlp  # Q, K and V, out-proj input, MLP
    latents = 0.0
    if c.is_mla:
        # each head's query and key (qk dims), value and attention output (v dims); the
        # latents the projections start from, and their norms' inputs, on every device
        qk, v = c.heads * c.qk_head_dim, c.heads * c.value_head_dim
        split = 2 * qk + 2 * qk + 2 * v + 2 * v + mlp
        latents = 2 * (c.kv_lora_rank + c.rope_head_dim) + 2 * c.kv_lora_rank
        latents += 4 * c.q_lora_rank
    scores = 5 * c.heads * s
    # the two norms' inputs and outputs (the QKV's and the MLP's inputs), and the two
    # residual dropouts' masks, 1 byte an element
    residual = 8.0 * h + (2 * h if dropout_masks else 0)
    whole: float
    if placement.strategy.sequence_parallel:
        whole, split = 0.0, (residual + latents + split) / t
    else:
        whole, split = residual + latents, split / t
    scale = s * b * c.itemsize / 2 / context_ways(placement)  # a device's own tokens
    return whole * scale, split * scale, scores / t * scale


def fp8_saved_inputs_change(
    placement: Placement, b: int, *, flash_attention: bool = True, dense_mlp: bool = True
) -> float:
    """Bytes by which one layer's activations kept for the backward change, for ``b``
    sequences on one device, when an fp8 step keeps its linear layers' inputs in fp8
    (:attr:`Fp8SavedInputs.FP8`, Transformer Engine's) instead of at the model's dtype
    (negative: fewer).

    Transformer Engine's ``Linear`` and ``LayerNormLinear`` save the fp8 input they cast
    (a sequence-parallel one its local shard, gathered again in the backward) and no 16-bit
    copy, the fused norm writing its output in fp8: the query, key and value projection's
    normed input and the MLP's (``h`` a token, ``h / t`` under sequence parallelism), and
    the down-projection's input (``ff / t``: SwiGLU's product, GELU's output; the activation
    keeps its own input) take 1 byte an element instead of the model's itemsize. The
    out-projection's input is the attention's output: with memory-efficient attention the
    fused attention keeps it at the model's dtype for its own backward, and the
    out-projection's fp8 copy is kept beside it (``q / t`` bytes more); without, the copy
    replaces it. ``dense_mlp=False`` leaves the MLP out (a layer with experts: its
    attention's alone; its experts' inputs are :func:`fp8_saved_expert_inputs_change`'s)."""
    c = placement.config
    assert c.head_dim is not None
    t = model_ways(placement)
    tokens = b * c.seq / context_ways(placement)
    h = c.d_model / t if placement.strategy.sequence_parallel else c.d_model
    context = c.heads * (c.value_head_dim if c.is_mla else c.head_dim) / t
    replaced = 2 * h + (c.ff / t if dense_mlp else 0)
    added = context if flash_attention else 0.0
    if not flash_attention:
        replaced += context
    return tokens * (replaced * (FP8_ITEMSIZE - c.itemsize) + added * FP8_ITEMSIZE)


def fp8_saved_expert_inputs_change(placement: Placement, b: int) -> float:
    """Bytes by which a layer with experts' activations kept for the backward change, for
    ``b`` sequences on one device, when its experts' grouped linears keep their inputs in
    fp8 (:attr:`Fp8SavedInputs.FP8`; negative: fewer).

    Transformer Engine's ``GroupedLinear`` quantizes each expert's input and saves the
    quantized copy for its backward, as ``Linear`` does (``grouped_linear.py@0069563``:
    ``inputmats = tex.fused_multi_quantize(...)``, then ``prepare_for_saving(*inputmats,
    ...)``). So the slots the up-projections take (``cf k h`` a token) and the
    down-projections' input (``cf k f``: SwiGLU's product, GELU's output; the activation
    keeps its own input at the model's dtype), with the shared experts' down-projection
    input (``f`` each), take 1 byte an element, not the model's itemsize. They are the
    slots and hidden :func:`moe_activation_bytes_per_layer` counts, split as it splits them:
    folded, those of a device's own slice of the tokens; with the slots gathered over
    ``model``, every slot and the hidden split; otherwise every slot of its tokens.

    >>> from shardscope._src.model.config import ModelConfig
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> c = ModelConfig(d_model=64, heads=4, ff=128, layers=2, mlp="swiglu", experts=8,
    ...                 top_k=2, expert_ff=32, seq=16, dtype="bfloat16")
    >>> p = get_strategy("ep").place(c, abstract_mesh("expert=8"))
    >>> fp8_saved_expert_inputs_change(p, 1)  # 16 tokens x 2 slots x (64 + 32), 1 byte less
    -3072.0
    """
    c = placement.config
    f = c.expert_ff or c.ff
    cf_k = c.routed_capacity * c.top_k
    t = model_ways(placement)
    tokens = b * c.seq // context_ways(placement)
    if placement.strategy.expert_fold:
        elements = tokens / t * cf_k * (c.d_model + f) + tokens * f * c.shared_experts / t
    else:
        # every slot of the device's tokens (gathered over ``model`` where it gathers them),
        # the hidden split over ``model``
        elements = tokens * (cf_k * c.d_model + (cf_k + c.shared_experts) * f / t)
    return elements * (FP8_ITEMSIZE - c.itemsize)


def activation_bytes_per_layer(
    placement: Placement,
    *,
    flash_attention: bool = True,
    microbatches: int = 1,
    fp8_saved: bool = False,
) -> int:
    """Bytes of one layer's activations kept for the backward pass, on one device, for one
    micro-batch (Korthikanti et al. Table 2; see the module docstring). A mixture of experts'
    layers are of two kinds: this is their mean, so that ``layers`` times it is what all of
    them keep (:func:`moe_activation_bytes_per_layer` for the layers with experts).
    ``fp8_saved``: the linear layers' inputs kept in fp8 (:func:`fp8_saved_inputs_change`)."""
    b = sequences_per_device(placement, microbatches)
    # Transformer Engine's layers are Megatron-Core's, whose bias-dropout-add keeps no
    # mask at the models' hidden dropout of 0 (Fp8SavedInputs.FP8)
    whole, split, scores = _activation_terms(placement, b, dropout_masks=not fp8_saved)
    dense = whole + split + (0 if flash_attention else scores)
    if fp8_saved:
        dense += fp8_saved_inputs_change(placement, b, flash_attention=flash_attention)
    c = placement.config
    if not c.is_moe:
        return math.ceil(dense)
    moe = moe_activation_bytes_per_layer(
        placement, flash_attention=flash_attention, b=b, dropout_masks=not fp8_saved
    )
    if fp8_saved:
        moe += fp8_saved_inputs_change(
            placement, b, flash_attention=flash_attention, dense_mlp=False
        )
        moe += fp8_saved_expert_inputs_change(placement, b)
    return math.ceil((c.dense_layer_count * dense + c.moe_layers * moe) / c.layers)


def moe_activation_bytes_per_layer(
    placement: Placement, *, flash_attention: bool = True, b: int, dropout_masks: bool = True
) -> float:
    """Bytes a layer with experts keeps for the backward for ``b`` sequences on one device:
    its attention's and norms' as a dense layer's (Korthikanti et al.), then, per token, the
    router's float32 logits (``4 E``), the slots sent to the experts (``cf k h``: ``cf`` the
    capacity factor, 1 dropless; the up-projections' input), their outputs where the combine
    weights them by the router (``cf k h`` more: GShard's and MaxText's combine keeps them
    to differentiate the weights; not where the router weight scales each slot's activation
    before the down-projection (:attr:`~shardscope._src.model.config.ModelConfig.
    weights_activations`: ``dispatch_once``, or ``weight_activations``), as Megatron-Core's
    grouped MLP, ``weighted_bias_swiglu_impl``, and NeMo AutoModel's DeepEP experts,
    ``WeightedSwiGLUFunction``, do: the outputs are summed unweighted and kept by nothing),
    the experts' hidden activations as a dense MLP's (``cf k`` times SwiGLU's ``3 f`` or
    GELU's ``2 f``, split over ``model``), and the shared experts' hidden as a dense MLP of
    their width. Under expert parallelism a device holds its experts' slots of every token
    sent to them: under uniform routing, as many as its own tokens send. Folded (MoE
    parallel folding) its own tokens are its slice of the sequence (``1 / t`` of them, under
    sequence parallelism), whose logits and slots it keeps, each expert's hidden whole.
    Unfolded under sequence parallelism (ETP = TP) it keeps the logits and the weighted
    outputs of its own slice, and the slots as its experts take them, gathered over
    ``model`` (those of all its sequences' tokens, as unfolded without sequence
    parallelism), their hidden split. ``dropout_masks=False``: the attention's and norms'
    without the dropout masks (:func:`_activation_terms`)."""
    c = placement.config
    whole, split, scores = _activation_terms(
        placement, b, dense_mlp=False, dropout_masks=dropout_masks
    )
    attention = whole + split + (0 if flash_attention else scores)
    f = c.expert_ff or c.ff
    per_slot = 3 * f if c.mlp == "swiglu" else 2 * f  # elements: gate and up, their product
    cf_k = c.routed_capacity * c.top_k
    t = model_ways(placement)
    tokens = b * c.seq // context_ways(placement)
    slots = (1 if c.weights_activations else 2) * cf_k * c.d_model  # inputs (weighted outputs)
    if placement.strategy.expert_fold:
        # the routed slots of its own tokens, each expert's hidden whole; the shared
        # experts' hidden split as a dense MLP's
        own = tokens / t
        routed = own * ((slots + per_slot * cf_k) * c.itemsize + 4 * c.experts)
        return attention + routed + tokens * per_slot * c.shared_experts / t * c.itemsize
    hidden = per_slot * (cf_k + c.shared_experts) / t
    if placement.strategy.gathers_expert_slots:
        own = tokens / t
        gathered = tokens * (cf_k * c.d_model + hidden)
        weighted = 0 if c.weights_activations else own * cf_k * c.d_model
        return attention + (gathered + weighted) * c.itemsize + own * 4 * c.experts
    return attention + tokens * ((slots + hidden) * c.itemsize + 4 * c.experts)


def named_tensor_elements(
    config: ModelConfig, *, experts: bool = False
) -> dict[str, tuple[float, float]]:
    """Each of the decoder's named tensors (:data:`~shardscope._src.model.remat.TENSORS`),
    per token: ``(whole, split)`` elements, the first on every device of the model axis
    (split by it only under sequence parallelism: the residual stream, its norms, the sums
    of the out-projection and the MLP's down-projection over the model axis), the second
    split by it (the heads, the MLP's hidden).

    The one place a recomputation policy's memory comes from: what it keeps on the device
    and what it offloads are sums of these (:func:`named_tensor_bytes`). The query, key and
    value are ``heads x head_dim`` and ``kv_heads x head_dim`` wide (latent attention's
    query ``heads x qk_head_dim`` and its context ``heads x value_head_dim``); the MLP's
    gate and up projections, ``mlpwi_0`` and ``mlpwi_1``, ``ff`` each (a GELU MLP's one
    up-projection is ``mlpwi_0``; its ``mlpwi_1`` is 0).

    A layer with ``experts`` names its experts' tensors as MaxText's MoE block does, over
    the slots a token fills (``cf k``: ``top_k`` times the routed capacity, as
    :func:`moe_activation_bytes_per_layer` counts them): ``mlpwi_0`` and ``mlpwi_1`` the
    routed experts' and the shared experts' gate and up projections, ``(cf k + shared) x
    expert_ff`` each (GELU's one, ``mlpwi_0``), split over ``model`` with the experts'
    hidden; ``mlpwo`` their
    down-projections' outputs, ``cf k x h`` and the shared experts' ``h``, whole;
    ``expert_input`` the slots' tokens the experts take, ``cf k x h``, whole (where their
    outputs are); ``expert_act`` their activations, ``cf k x expert_ff``, and ``mlp_act``
    the shared experts', split as ``mlpwi_0``. A dense layer's ``mlp_act`` is ``ff`` wide.

    >>> from shardscope._src.model.config import ModelConfig
    >>> moe = ModelConfig(d_model=64, heads=4, ff=128, layers=2, mlp="swiglu", experts=8,
    ...                   top_k=2, expert_ff=32, capacity_factor=1.25)
    >>> named_tensor_elements(moe, experts=True)["mlpwi_1"]  # 1.25 x 2 slots x 32, the up's
    (0, 80.0)
    """
    c = config
    assert c.head_dim is not None and c.kv_heads is not None
    h, q, kv = c.d_model, c.heads * c.head_dim, c.kv_heads * c.head_dim
    context = q
    if c.is_mla:
        q, context = c.heads * c.qk_head_dim, c.heads * c.value_head_dim
    gated = c.mlp == "swiglu"
    gate: tuple[float, float] = (0, c.ff)
    up: tuple[float, float] = (0, c.ff if gated else 0)
    mlpwo: tuple[float, float] = (h, 0)
    mlp_act: tuple[float, float] = (0, c.ff)
    expert_input: tuple[float, float] = (0, 0)
    expert_act: tuple[float, float] = (0, 0)
    if experts:
        f = c.expert_ff or c.ff
        slots = c.routed_capacity * c.top_k
        gate = (0, (slots + c.shared_experts) * f)
        up = (0, (slots + c.shared_experts) * f if gated else 0)
        mlpwo = (slots * h + (h if c.shared_experts else 0), 0)
        mlp_act = (0, c.shared_experts * f)
        expert_input, expert_act = (slots * h, 0), (0, slots * f)
    return {
        "decoder_layer_input": (h, 0),
        "pre_self_attention_norm": (h, 0),
        "query_proj": (0, q),
        "key_proj": (0, kv),
        "value_proj": (0, kv),
        "context": (0, context),
        "out_proj": (h, 0),
        "post_self_attention_norm": (h, 0),
        "expert_input": expert_input,
        "mlpwi_0": gate,
        "mlpwi_1": up,
        "mlp_act": mlp_act,
        "expert_act": expert_act,
        "mlpwo": mlpwo,
    }


def named_tensor_bytes(placement: Placement, tensors: Sequence[str], microbatches: int = 1) -> int:
    """One layer's ``tensors`` (named, :func:`named_tensor_elements`) on one device for one
    micro-batch, at the model's dtype: the device's tokens times their elements, the split
    ones over the model axis, all of them under sequence parallelism (but the routed slots
    the experts take, gathered over it under expert parallelism unfolded). A mixture of experts'
    layers are of two kinds: this is their mean (as :func:`activation_bytes_per_layer`), so
    that ``layers`` times it is what all of them hold."""
    c = placement.config
    t = model_ways(placement)
    tokens = tokens_per_device(placement, microbatches)

    s = placement.strategy

    def per_token(experts: bool) -> float:
        sizes = named_tensor_elements(c, experts=experts)
        whole = sum(sizes[n][0] for n in tensors)
        split = sum(sizes[n][1] for n in tensors)
        if not s.sequence_parallel:
            return whole + split / t
        if experts and s.gathers_expert_slots:
            # the routed slots as the experts hold them (their input, and their outputs'
            # partial sums), gathered over 'model': a device's tokens' whole
            routed = c.routed_capacity * c.top_k * c.d_model
            gathered = routed * sum(1 for n in tensors if n in ("expert_input", "mlpwo"))
            return (whole - gathered + split) / t + gathered
        return (whole + split) / t

    if not c.is_moe:
        return math.ceil(tokens * per_token(False) * c.itemsize)
    dense, moe = per_token(False), per_token(True)
    mean = (c.dense_layer_count * dense + c.moe_layers * moe) / c.layers
    return math.ceil(tokens * mean * c.itemsize)


def producer_params(config: ModelConfig) -> dict[str, float]:
    """The weights each projection of :data:`~shardscope._src.model.remat.PRODUCERS` takes
    one token through (its FLOPs ``2 x`` per token; split over the model axis): the fused
    query, key and value projection, the out-projection, the MLP's gate and up projections
    (``d_model x ff`` each; a GELU MLP's one up-projection is ``mlp_in_0``, its ``mlp_in_1``
    0) and its down-projection (a mixture of experts': a layer's mean, its experts' slots
    counted)."""
    c = config
    assert c.head_dim is not None and c.kv_heads is not None
    q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
    gated = c.mlp == "swiglu"
    mlp_in: float = c.d_model * c.ff
    mlp_out: float = c.ff * c.d_model
    if c.is_moe:
        # a layer's mean (a mixture's layers are of two kinds): a layer with experts takes
        # a token through the up- and down-projections of each of its slots (cf k, the
        # routed capacity's) and of the shared experts
        f = c.expert_ff or c.ff
        ways = c.routed_capacity * c.top_k + c.shared_experts
        moe_in = ways * c.d_model * f
        moe_out = ways * f * c.d_model
        mlp_in = (c.dense_layer_count * mlp_in + c.moe_layers * moe_in) / c.layers
        mlp_out = (c.dense_layer_count * mlp_out + c.moe_layers * moe_out) / c.layers
    return {
        "qkv": c.d_model * (q_dim + 2 * kv_dim),
        "out": q_dim * c.d_model,
        "mlp_in_0": mlp_in,
        "mlp_in_1": mlp_in if gated else 0.0,
        "mlp_out": mlp_out,
    }


def matmul_outputs_bytes_per_layer(placement: Placement, microbatches: int = 1) -> int:
    """One layer's input and the outputs of its matmuls, at the model's dtype, per device: what
    recomputation that keeps matmul outputs stores (``Remat.MATMULS``; the named tensors it
    keeps on the device, :func:`named_tensor_bytes`).

    Per token: the input and the outputs of the attention's out-projection and of the MLP's
    down-projection, ``h`` each (split by ``t`` only with sequence parallelism: they are
    summed over the model axis); the query, key and value projections, ``q + 2 kv``, and
    the MLP's up-projections, ``2 ff`` (SwiGLU's gate and up) or ``ff``, split by ``t``. The
    norms, the activation function and the attention core are recomputed from them.
    """
    return named_tensor_bytes(placement, remat_policy(Remat.MATMULS).on_device, microbatches)


def offloaded_bytes_per_layer(
    placement: Placement, microbatches: int = 1, remat: str = Remat.OFFLOAD
) -> int:
    """One layer's tensors that ``remat`` (default ``Remat.OFFLOAD``) moves to host memory,
    per device, at the model's dtype (:func:`named_tensor_bytes`). ``offload``'s: its input
    (``h`` per token, split by ``t`` only with sequence parallelism) and its query, key and
    value projections (``q + 2 kv`` per token, split by ``t``)."""
    return named_tensor_bytes(placement, remat_policy(remat).offloaded, microbatches)


#: Layers of offloaded tensors in device memory at once under a policy that offloads: the one
#: being copied out or in while the next (or previous) layer computes (double buffering).
OFFLOAD_BUFFERS = 2


def stored_activation_bytes_per_layer(
    placement: Placement,
    schedule: Schedule,
    *,
    flash_attention: bool = True,
    fp8_saved: bool = False,
) -> int:
    """What one layer keeps in device memory per micro-batch under ``schedule.remat``:
    everything (none), everything but the attention scores (selective; both Korthikanti et
    al.'s Table 2, which counts every activation the backward reads, named or not), else
    the named tensors the policy keeps on the device (:func:`named_tensor_bytes`): its input
    only (full: ``2sbh``, or ``2sbh/t`` with sequence parallelism; Table 2), its input and
    the outputs of its matmuls (matmuls: see :func:`matmul_outputs_bytes_per_layer`), or
    nothing (offload: in host memory, :func:`offloaded_bytes_per_layer`). ``fp8_saved``
    (the linear layers' inputs kept in fp8) changes what a layer keeps when it keeps
    everything; a policy's named tensors are kept as named, at the model's dtype."""
    policy = remat_policy(schedule.remat)
    if policy.keeps_everything:
        return activation_bytes_per_layer(
            placement,
            flash_attention=flash_attention if policy.recomputes_nothing else True,
            microbatches=schedule.microbatches,
            fp8_saved=fp8_saved,
        )
    return named_tensor_bytes(placement, policy.on_device, schedule.microbatches)


def logits_model_split(placement: Placement) -> int:
    """How many ways ``model`` splits each device's logits: ``t`` under sequence parallelism
    (each device projects its own tokens) or a vocabulary split (each projects onto its
    slice of the vocabulary), else 1."""
    s = placement.strategy
    return model_ways(placement) if s.sequence_parallel or s.vocab_split else 1


def logits_bytes(placement: Placement, sequences: int, *, train: bool = True) -> int:
    """The logits of ``sequences`` on one device at the model's dtype, and, when training,
    their gradient beside them (the loss reduces them in float32 without storing a float32
    copy). Split over ``model`` when the strategy shards the sequence there (sequence
    parallelism: each device projects its own tokens) or the vocabulary (each device projects
    onto its slice of it), and over ``context`` under context parallelism (its own tokens)."""
    c = placement.config
    if not c.vocab:
        return 0
    per_element = 2 * c.itemsize if train else c.itemsize
    split = logits_model_split(placement) * context_ways(placement)
    return sequences * c.seq * c.vocab * per_element // split


def estimate_memory(
    placement: Placement,
    mode: str = Mode.TRAIN,
    *,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    schedule: Schedule | None = None,
    fp8_saved_inputs: str | None = None,
    fp8_params: int | None = None,
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> MemoryEstimate:
    """Analytic memory per device of ``placement`` (see the module docstring for the formulas).

    ``placement`` is the program one device runs: with pipeline stages, one stage's (its
    layers; the batch of the whole step). ``schedule`` (train only) divides the activations
    by the micro-batches, keeps what the recomputation keeps (plus one layer's full
    activations while it is recomputed), and multiplies them by the model chunks of a
    micro-batch the first 1F1B stage holds at once (:attr:`Schedule.in_flight`; a chunk is
    the stage's layers, or ``1 / virtual_stages`` of them interleaved).
    ``fp8_saved_inputs`` (an fp8 step's, :class:`Fp8SavedInputs`; None: 16-bit matmuls)
    ``"fp8"`` keeps the linear layers' inputs in fp8 (:func:`fp8_saved_inputs_change`).
    ``fp8_params`` (None: 16-bit weights) keeps the layers' linear weights in fp8, 1 byte an
    element, but that many layers at each end of the model (:func:`fp8_param_elements`),
    stored and, under FSDP, gathered (the gradients, master weights and optimizer state
    unchanged).
    ``parts``: what earlier calls on the same placement worked out, by the arguments each
    piece depends on (the model state by the stages, one layer's activations by the
    micro-batches and the recomputation; a sweep asks them of every schedule it screens).

    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> dp, fsdp = (get_strategy(s).place(ModelConfig(), abstract_mesh("data=8"))
    ...             for s in ("dp", "fsdp"))
    >>> estimate_memory(dp).params // estimate_memory(fsdp).params  # FSDP: 1/8 per device
    8
    """
    c = placement.config
    item = c.itemsize
    sched = schedule or Schedule()
    # a split stage's chunks are given, and need not be equal (split_problem checked them)
    layers = c.layers if sched.stage is None else None
    problem = interleave_problem(sched.virtual_stages, sched.stages, sched.microbatches, layers)
    if problem is not None:
        raise PlanError(problem, param="virtual_stages")
    if mode == Mode.TRAIN and bytes_per_param < 2 * item:
        raise PlanError(
            f"bytes_per_param={bytes_per_param} is less than the parameter and its gradient "
            f"at {c.dtype} ({2 * item} bytes); use at least {2 * item} (16 for mixed-precision "
            f"Adam, 10 for the scaling book's convention)"
        )
    known = {} if parts is None else parts
    train = mode == Mode.TRAIN
    p = sched.stages
    key: tuple[Any, ...] = ("state", train, bytes_per_param, p, sched.stage, fp8_params)
    if key not in known:
        known[key] = _model_state(placement, train, bytes_per_param, p, sched.stage)
        if fp8_params is not None:
            known[key] = _fp8_model_state(placement, known[key], fp8_params, sched)
    params, grads, optimizer, gathered = known[key]
    m = sched.microbatches if train else 1
    host = 0
    if sched.offload_layers and not train:
        raise PlanError(
            f"offload_layers={sched.offload_layers}: a forward pass keeps no activations for "
            f"a backward; give offload_layers=0",
            param="offload_layers",
        )
    if train:
        fp8_saved = fp8_saved_inputs == Fp8SavedInputs.FP8
        key = ("layer", m, sched.remat, flash_attention, fp8_saved)
        if key not in known:
            known[key] = _layer_memory(placement, m, sched.remat, flash_attention, fp8_saved)
        kept, working, logits, offloaded = known[key]
        # The layers of one model chunk: the stage's, or a 1/v of them interleaved; times
        # the chunks in flight. A split stage's chunks may differ: their layers in flight.
        if sched.stage is None:
            held = c.layers // sched.virtual_stages * sched.in_flight
        else:
            held = held_layers(sched.stage, p, m)
            logits = logits if sched.stage.output else 0
        activations = held * kept + working + logits
        if sched.offload_layers:
            problem = offload_layers_problem(sched.offload_layers, c.layers, p)
            if problem is not None:
                raise PlanError(problem, param="offload_layers")
            # What those layers keep lives on the host from their forward to their backward;
            # the last layer stays, so each copy is out before the peak at the first backward
            # and back after the layers past it have freed theirs.
            moved = sched.offload_layers * kept
            activations -= moved
            host += moved
        if offloaded is not None:
            host += held * offloaded
            activations += OFFLOAD_BUFFERS * offloaded
    else:
        b = sequences_per_device(placement, m)
        logits = logits_bytes(placement, b, train=train)
        activations = (
            activation_bytes_per_layer(placement, flash_attention=flash_attention) + logits
        )
    on_host = train and sched.offload_optimizer
    if on_host:
        host += optimizer
    key = ("gathered_kv", m)
    if key not in known:
        known[key] = gathered_kv_bytes(placement, m)
    return MemoryEstimate(
        params,
        grads,
        optimizer,
        activations,
        gathered,
        host,
        on_host,
        known[key],
    )


def _model_state(
    placement: Placement,
    train: bool,
    bytes_per_param: int,
    stages: int,
    stage: PipelineStage | None = None,
) -> tuple[int, int, int, int]:
    """:func:`estimate_memory`'s parameters, gradients, optimizer state and gathered weights
    per device (bytes): what the schedule but its stages leaves alone."""
    item = placement.config.itemsize
    s = placement.strategy
    p = stages

    def elements(rules: Mapping[str, Any]) -> int:
        return stage_elements_per_device(placement, rules, p, stage)

    params = elements(s.param_rules()) * item
    grads = elements(s.grad_rules()) * item if train else 0
    optimizer = elements(s.optimizer_rules()) * (bytes_per_param - 2 * item) if train else 0
    gathered = 0
    if Role.DATA in s.roles and s.shards_weights:
        gathered = gathered_layer_elements(placement) * item // model_ways(placement)
    return params, grads, optimizer, gathered


def _fp8_model_state(
    placement: Placement,
    state: tuple[int, int, int, int],
    fp8_params: int,
    schedule: Schedule,
) -> tuple[int, int, int, int]:
    """:func:`_model_state` with the layers' linear weights at 1 byte an element
    (``fp8_params``, :func:`estimate_memory`): those the device stores, and those FSDP
    gathers for the layer that runs."""
    params, grads, optimizer, gathered = state
    s = placement.strategy
    item = placement.config.itemsize
    bf16 = bf16_end_layers(
        placement.config.layers,
        fp8_params,
        schedule.stages,
        schedule.stage,
        schedule.virtual_stages,
    )
    params -= fp8_param_elements(placement, s.param_rules(), bf16) * (item - FP8_ITEMSIZE)
    if gathered:
        linear = gathered_layer_elements(placement, FP8_PARAM_NAMES) // model_ways(placement)
        gathered -= linear * (item - FP8_ITEMSIZE)
    return params, grads, optimizer, gathered


def _layer_memory(
    placement: Placement, microbatches: int, remat: str, flash_attention: bool, fp8_saved: bool
) -> tuple[int, int, int, int | None]:
    """:func:`estimate_memory`'s pieces of a train step by micro-batch: what one layer keeps
    under ``remat``, one layer's activations while it is recomputed (0 when nothing is), the
    logits, and what one layer offloads (None when nothing is)."""
    m = microbatches
    kept = stored_activation_bytes_per_layer(
        placement,
        Schedule(microbatches=m, remat=remat),
        flash_attention=flash_attention,
        fp8_saved=fp8_saved,
    )
    policy = remat_policy(remat)
    working = (
        activation_bytes_per_layer(
            placement, flash_attention=flash_attention, microbatches=m, fp8_saved=fp8_saved
        )
        if not policy.recomputes_nothing
        else 0
    )
    logits = logits_bytes(placement, sequences_per_device(placement, m), train=True)
    offloaded = offloaded_bytes_per_layer(placement, m, remat) if policy.offloaded else None
    return kept, working, logits, offloaded


def gathered_layer_elements(placement: Placement, only: Sequence[str] = ()) -> int:
    """Elements of the largest layer's weights a device gathers at use (FSDP): a dense
    layer's, or a layer with experts' (its attention, router and shared experts, and the
    routed experts this device holds: ``experts / e`` under expert parallelism; folded,
    ``experts / (e t)`` whole, the elements of ``experts / e`` over the ``t`` its caller
    divides every layer's by). ``only``: of those weights alone (the linear weights,
    :data:`FP8_PARAM_NAMES`, that ``fp8_params`` gathers in fp8)."""
    c = placement.config
    shapes = param_shapes(c)
    if only:
        shapes = {name: shape for name, shape in shapes.items() if name in only}
    dense = sum(math.prod(shape[1:]) for name, shape in shapes.items() if name in LAYER_PARAMS)
    if not c.is_moe:
        return dense
    e = placement.role_size(Role.EXPERT) if placement.strategy.expert_parallel else 1
    moe = sum(
        math.prod(shape[1:]) // (e if name in EXPERT_PARAMS else 1)
        for name, shape in shapes.items()
        if name in MOE_PARAMS
    )
    return max(dense, moe)


def gathered_kv_bytes(placement: Placement, microbatches: int = 1) -> int:
    """Context parallelism: one layer's keys and values of the whole sequence on one device,
    ``2 x seq x kv_dim x b x itemsize`` (their heads split ``t`` ways under tensor
    parallelism), alive while the layer runs (0 for other strategies); in the ring form the
    chunk in hand and the one arriving, ``2 / c`` of that."""
    c = placement.config
    if not placement.strategy.context_parallel:
        return 0
    assert c.head_dim is not None and c.kv_heads is not None  # set by ModelConfig
    b = sequences_per_device(placement, microbatches)
    whole = 2 * c.seq * (c.kv_heads // model_ways(placement)) * c.head_dim * b * c.itemsize
    if placement.strategy.context_ring:
        return 2 * whole // context_ways(placement)
    return whole


def _attention_matmul_params(c: ModelConfig) -> int:
    """Weights of one layer's attention projections (no norm gains)."""
    return sum(
        math.prod(shape[1:])
        for name, shape in attention_shapes(c, 1).items()
        if not name.endswith("norm")
    )


def layer_matmul_params(config: ModelConfig) -> int:
    """Weights of one dense layer's matmuls: the attention's projections and the MLP (SwiGLU's
    gate, up and down, or GELU's up and down; no norm gains)."""
    c = config
    mats = 3 if c.mlp == "swiglu" else 2
    return _attention_matmul_params(c) + mats * c.d_model * c.ff


def expert_mlp_params(config: ModelConfig) -> int:
    """Weights of one expert's MLP (SwiGLU's gate, up and down, or GELU's up and down)."""
    mats = 3 if config.mlp == "swiglu" else 2
    return mats * config.d_model * (config.expert_ff or config.ff)


def moe_layer_matmul_params(config: ModelConfig, *, routed: float) -> float:
    """Weights one token's matmuls go through in a layer with experts: the attention's
    projections, the router, ``routed`` routed experts' MLPs (``top_k`` for the model's
    FLOPs; ``top_k x`` the capacity factor for what a capacity-padded program computes) and
    the shared experts'."""
    c = config
    experts = (routed + c.shared_experts) * expert_mlp_params(c)
    return _attention_matmul_params(c) + c.d_model * c.experts + experts


def matmul_params_per_token(placement: Placement) -> tuple[float, float]:
    """``(split, whole)``: the weights one token's forward matmuls go through in all the
    layers of ``placement``'s config (FLOPs ``2 x`` per token), the part split over the
    model axis and the part every device of it computes: a dense model's layers all split;
    a mixture of experts' layers with experts add the router's (whole), and the routed
    experts' at ``top_k x`` the capacity factor (padded slots are computed) and the shared
    experts' (split). The dispatch and the combine gather and scatter: no matmul."""
    c = placement.config
    split = float(c.dense_layer_count * layer_matmul_params(c))
    whole = 0.0
    if c.is_moe:
        router = c.d_model * c.experts
        routed = c.top_k * c.routed_capacity
        split += c.moe_layers * (moe_layer_matmul_params(c, routed=routed) - router)
        whole += c.moe_layers * router
    return split, whole


def routed_expert_work(placement: Placement, microbatches: int = 1) -> tuple[float, int]:
    """``(flops, elements)`` of one forward of one micro-batch through the routed experts on
    one device: their matmul FLOPs (the device's tokens, ``top_k x`` the routed capacity
    each, as :func:`matmul_params_per_token` counts them) and the elements of the experts'
    weights those matmuls read, as they are used (each expert-parallel device's own experts,
    FSDP's gathered copies, tensor parallelism's slice). Folded (MoE parallel folding) a
    device runs its own ``1 / t`` of the tokens through whole experts: the same FLOPs as
    the whole tokens through a ``1 / t`` slice of each. ``(0.0, 0)`` for a dense model."""
    c = placement.config
    if not c.is_moe:
        return 0.0, 0
    tokens = tokens_per_device(placement, microbatches)
    per_token = c.moe_layers * c.top_k * c.routed_capacity * expert_mlp_params(c)
    flops = 2 * tokens * per_token / model_ways(placement)
    return flops, sum(expert_weight_elements(placement).values())


def expert_batch(placement: Placement, microbatches: int = 1) -> tuple[int, float]:
    """``(experts, rows)``: the routed experts of a layer one device runs in a micro-batch
    and the rows (token slots) each takes: the experts its matmuls use (all of them under
    FSDP, which gathers them; ``experts / e`` over an expert axis of ``e``, folded over
    ``expert`` and ``model``), and the slots a device's tokens route (``top_k x`` the
    routed capacity each, the capacity factor or a dropless routing's imbalance, as
    :func:`routed_expert_work` counts them) spread over every expert, times the devices that
    send to each expert (the expert group: an expert takes its slots of every device over
    its axes). Folded, each device of ``model`` routes its own slice of the tokens. ``(0,
    0.0)`` for a dense model.

    >>> from dataclasses import replace
    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> c = replace(model_preset("qwen3-30b-a3b").config(batch=8), seq=4096)
    >>> expert_batch(get_strategy("fsdp").place(c, abstract_mesh("data=8")))
    (128, 256.0)
    >>> expert_batch(get_strategy("ep").place(c, abstract_mesh("expert=8")))
    (16, 2048.0)
    """
    c = placement.config
    if not c.is_moe:
        return 0, 0.0
    rules = placement.strategy.use_rules() or placement.strategy.param_rules()
    split = placement.role_size(rules["expert_down"][0])
    slots = tokens_per_device(placement, microbatches) * c.top_k * c.routed_capacity
    # a device's tokens are its context shard's already: only the model axis's slices divide
    return c.experts // split, slots * split / (c.experts * placement.model_slices)


def expert_gemms(placement: Placement, microbatches: int = 1) -> tuple[list[Gemm], list[Gemm]]:
    """``(forward, backward)``: the matmuls of one layer's routed experts on one device in a
    micro-batch, each a :class:`~shardscope._src.cost.flops.Gemm` whose ``times`` are the
    device's experts run as one batched kernel (:func:`expert_batch`), at the experts'
    weights' sizes as the device uses them (tensor parallelism's slice of ``expert_ff``).
    Forward, each weight ``k x n`` (SwiGLU's gate and up one ``d_model x 2 expert_ff``, the
    down ``expert_ff x d_model``) multiplies an expert's ``rows`` tokens: ``(rows, n, k)``;
    backward, the input's gradient ``(rows, k, n)`` and the weight's ``(k, n, rows)`` (the
    tokens summed over). Empty for a dense model.

    >>> from dataclasses import replace
    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> c = replace(model_preset("qwen3-30b-a3b").config(batch=8), seq=4096)
    >>> fwd, bwd = expert_gemms(get_strategy("ep").place(c, abstract_mesh("expert=8")))
    >>> fwd
    [Gemm(m=2048.0, n=1536, k=2048, times=16), Gemm(m=2048.0, n=2048, k=768, times=16)]
    >>> bwd[1], bwd[3]
    (Gemm(m=2048, n=1536, k=2048.0, times=16), Gemm(m=768, n=2048, k=2048.0, times=16))
    """
    c = placement.config
    if not c.is_moe:
        return [], []
    experts, rows = expert_batch(placement, microbatches)
    rules = placement.strategy.use_rules() or placement.strategy.param_rules()
    shapes = param_shapes(c)
    fwd: list[Gemm] = []
    bwd: list[Gemm] = []
    for name in EXPERT_PARAMS:
        if name not in shapes:
            continue
        # (layers, experts, k..., n): the weight as the device's matmuls use it
        used = zip(shapes[name][2:], rules[name][1:], strict=True)
        dims = [d // placement.role_size(r) for d, r in used]
        k, n = dims[0], math.prod(dims[1:])
        fwd.append(Gemm(rows, n, k, experts))
        bwd += [Gemm(rows, k, n, experts), Gemm(k, n, rows, experts)]
    return fwd, bwd


def expert_routing(
    placement: Placement, microbatches: int = 1, *, dropless: bool | None = None
) -> Routing | None:
    """How one layer with experts routes one micro-batch's tokens on one device, in rows
    (:class:`~shardscope._src.cost.routing.Routing`, whose bytes the time model prices);
    None for a dense model and for a capacity-padded mixture (whose buffers are sized
    without looking at the routing). ``dropless``: whether the mixture routes dropless (None:
    as ``placement``'s config says; the planner places a dropless mixture padded to its
    routing's imbalance, :func:`~shardscope._src.train.candidates.stage_config`, so it
    says so from the model's own config).

    The device scores its own tokens (a slice of each sequence, one per device of ``model``,
    under expert and sequence parallelism: :attr:`~shardscope._src.sharding.strategies.
    Placement.model_slices`) and permutes them into their slots (``top_k`` each, times the
    routing's imbalance). Over an expert axis of ``e`` devices each holding several experts
    the slots arrive in one chunk from each device and are sorted by local expert (all the
    slots the device's experts take: gathered over ``model`` unfolded under sequence
    parallelism, :attr:`~shardscope._src.sharding.strategies.Strategy.
    gathers_expert_slots`). With ``dispatch_once`` (DeepEP's) the device permutes the rows
    it received, each token once from each device of its experts (``e x share`` a token,
    :func:`~shardscope._src.model.moe.device_share`), nothing is sorted, and the router
    weights scale the experts' activations rather than their outputs (as they do with
    ``weight_activations``: the weighted outputs are neither kept nor read again).

    >>> from dataclasses import replace
    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> c = replace(model_preset("qwen3-30b-a3b").config(batch=8), seq=4096)
    >>> r = expert_routing(get_strategy("ep").place(c, abstract_mesh("expert=8")))
    >>> r.tokens, r.slots, r.sorted  # 4096 tokens, 8 slots each, 16 experts a device
    (4096.0, 32768.0, 32768.0)
    """
    c = placement.config
    if dropless is None:
        dropless = c.capacity_factor is None
    if not c.is_moe or not dropless:
        return None
    s = placement.strategy
    rules = s.use_rules() or s.param_rules()
    split = placement.role_size(rules["expert_down"][0])
    own = tokens_per_device(placement, microbatches) / placement.model_slices
    slots = own * c.top_k * c.routed_capacity
    tokens, sorted_rows = own, 0.0
    if c.dispatch_once:
        share = device_share(c.experts, split, c.top_k, c.group_limit)
        tokens = own * split * share * c.routed_capacity
    elif split > 1 and c.experts // split > 1:
        sorted_rows = slots * (model_ways(placement) if s.gathers_expert_slots else 1)
    return Routing(
        scored=own,
        tokens=tokens,
        slots=slots,
        experts=c.experts,
        d_model=c.d_model,
        itemsize=c.itemsize,
        sorted=sorted_rows,
        weighted=not c.weights_activations,
    )


def expert_weight_elements(placement: Placement) -> dict[str, int]:
    """The elements of each routed experts' weight (every layer's) one device's matmuls read,
    as they are used (:func:`routed_expert_work`); empty for a dense model."""
    c = placement.config
    if not c.is_moe:
        return {}
    rules = placement.strategy.use_rules() or placement.strategy.param_rules()
    shapes = param_shapes(c)
    out = {}
    for name in EXPERT_PARAMS:
        if name in shapes:
            ways = math.prod(placement.role_size(r) for r in rules[name] if r is not None)
            out[name] = math.prod(shapes[name]) // ways
    return out


def fp8_cast_elements_per_layer(
    placement: Placement,
    microbatches: int = 1,
    *,
    kept: Sequence[str] = (),
    weights_cached: bool = False,
) -> tuple[float, float]:
    """Elements one device casts to fp8 in one layer's pass, ``(forward, backward)``, when its
    matmuls run in fp8 (torchao's ``Float8Linear``, which torchtitan's float8 training swaps
    for each ``nn.Linear``: all three matmuls of a linear in fp8, each operand cast with a
    dynamic tensorwise scale).

    Forward: each linear's input, per token ``h`` (query, key and value projections), ``q``
    (out-projection), ``h`` (MLP up), ``ff`` (MLP down), the split ones over ``t``, and the
    layer's matmul weights (over ``t``). Backward: the gradient entering each linear, per
    token ``q + 2 kv``, ``h``, ``2 ff`` (SwiGLU) or ``ff``, ``h``, cast once for both its
    matmuls, and the weights again (torchtitan's ``force_recompute_fp8_weight_in_bwd``); the
    inputs' fp8 copies are kept from the forward. ``kept`` leaves the projections of
    :data:`~shardscope._src.model.remat.PROJECTIONS` named in it out of the forward (their
    outputs kept, a recomputed forward does not run them): ``("qkv",)`` is the forward
    ``remat="offload"`` recomputes. ``weights_cached`` leaves the weights out of every pass
    (Transformer Engine's, cast once a step: :func:`fp8_weight_elements_per_layer`).

    A mixture of experts' layers are of two kinds: this is their mean. A layer with experts
    (Transformer Engine's fp8 grouped linears, Megatron-Core's ``moe_router_dtype`` keeping
    the router out of fp8) casts its attention's as a dense layer does and, for the experts,
    each slot's input to the up-projections (``cf k x h`` a token, ``cf k`` the slots it
    fills, :func:`named_tensor_elements`) and the shared experts' (``h``), the down-
    projections' inputs (``(cf k + shared) x expert_ff``, split over ``model``) and the
    experts' weights as the device's matmuls read them (:func:`expert_weight_elements`;
    the shared experts' over ``model``); backward, the gradients entering them
    (``(cf k + shared) x 2 expert_ff`` or ``x expert_ff``, and ``cf k x h`` and ``h``) and
    the weights again. The router is not cast.
    """
    c = placement.config
    assert c.head_dim is not None and c.kv_heads is not None
    t = model_ways(placement)
    tokens = c.seq * sequences_per_device(placement, microbatches)
    q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
    up = 2 * c.ff if c.mlp == "swiglu" else c.ff
    w = 0.0 if weights_cached else 1.0  # the weights, cast in each pass or not
    weights = w * layer_matmul_params(c) / t
    forward = tokens * (c.d_model + q_dim / t + c.d_model + c.ff / t) + weights
    # each projection's input (cast once, whole or split) and its weights; the MLP's input
    # once for its gate and up, out of the forward where both are kept (where one is, its
    # weights alone)
    skipped = {
        "qkv": tokens * c.d_model + w * c.d_model * (q_dim + 2 * kv_dim) / t,
        "out": tokens * q_dim / t + w * q_dim * c.d_model / t,
        "mlp_in": tokens * c.d_model + w * c.d_model * up / t,
        "mlp_out": tokens * c.ff / t + w * c.ff * c.d_model / t,
    }
    share = _mlp_in_kept(kept, c)
    forward -= sum(skipped[k] for k in ("qkv", "out", "mlp_out") if k in kept)
    forward -= skipped["mlp_in"] if share == 1 else share * w * c.d_model * up / t
    backward = tokens * ((q_dim + 2 * kv_dim) / t + c.d_model + up / t + c.d_model) + weights
    if not c.is_moe:
        return forward, backward
    # a layer with experts: the attention's as above, then the experts' slots
    f = c.expert_ff or c.ff
    up_e = 2 * f if c.mlp == "swiglu" else f
    slots, shared = c.routed_capacity * c.top_k, c.shared_experts
    # the routed slots' inputs whole on each device of the model axis, or folded (MoE
    # parallel folding) those of its own slice of the tokens
    routed = slots / t if placement.strategy.expert_fold else slots
    # each projection's input and its weights (the experts' as the device reads them)
    moe_inputs = {
        "qkv": tokens * c.d_model,
        "out": tokens * q_dim / t,
        "mlp_in": tokens * (routed + (1 if shared else 0)) * c.d_model,
        "mlp_out": tokens * (slots + shared) * f / t,
    }
    moe_weights = {k: w * v for k, v in _moe_layer_weight_elements(placement).items()}
    moe_forward = sum(
        moe_inputs[k] + moe_weights[k] for k in ("qkv", "out", "mlp_out") if k not in kept
    )
    # the experts' gate and up: their input unless both are kept, the weights not kept
    moe_forward += (0 if share == 1 else moe_inputs["mlp_in"]) + (1 - share) * moe_weights["mlp_in"]
    moe_backward = sum(moe_weights.values()) + tokens * (
        (q_dim + 2 * kv_dim) / t + c.d_model + (slots + shared) * up_e / t
        + (routed + (1 if shared else 0)) * c.d_model
    )  # fmt: skip
    n, k = c.dense_layer_count, c.moe_layers
    return (n * forward + k * moe_forward) / c.layers, (n * backward + k * moe_backward) / c.layers


def _mlp_in_kept(kept: Sequence[str], config: ModelConfig) -> float:
    """The share of the MLP's gate and up projections' weights (:data:`MLP_IN`) in ``kept``:
    each half of a SwiGLU MLP's, a GELU MLP's one up-projection all of its."""
    if config.mlp != "swiglu":
        return 1.0 if MLP_IN[0] in kept else 0.0
    return sum(0.5 for k in MLP_IN if k in kept)


def _moe_layer_weight_elements(placement: Placement) -> dict[str, float]:
    """The matmul weights of one layer with experts on one device, by projection, as its
    matmuls read them: the attention's over ``model``, the routed experts' as the device
    holds them (:func:`expert_weight_elements`) and the shared experts' over ``model``."""
    c = placement.config
    assert c.head_dim is not None and c.kv_heads is not None
    t = model_ways(placement)
    q_dim, kv_dim = c.heads * c.head_dim, c.kv_heads * c.head_dim
    f = c.expert_ff or c.ff
    up_e = 2 * f if c.mlp == "swiglu" else f
    shared = c.shared_experts
    experts = expert_weight_elements(placement)
    routed_in = experts.get("expert_gate_up", experts.get("expert_up", 0)) / c.moe_layers
    routed_out = experts["expert_down"] / c.moe_layers
    return {
        "qkv": c.d_model * (q_dim + 2 * kv_dim) / t,
        "out": q_dim * c.d_model / t,
        # the MLP's gate and up (or GELU's one up-projection) together
        "mlp_in": routed_in + shared * c.d_model * up_e / t,
        "mlp_out": routed_out + shared * f * c.d_model / t,
    }


def fp8_weight_elements_per_layer(placement: Placement) -> float:
    """The matmul weights one device casts to fp8 in one layer (a mixture of experts' two
    kinds of layers: their mean): the projections' and the MLP's over ``model``, a layer
    with experts' as :func:`fp8_cast_elements_per_layer` reads them. The router is not
    cast."""
    c = placement.config
    dense = layer_matmul_params(c) / model_ways(placement)
    if not c.is_moe:
        return dense
    moe = sum(_moe_layer_weight_elements(placement).values())
    return (c.dense_layer_count * dense + c.moe_layers * moe) / c.layers


def fp8_cast_bytes(elements: float, itemsize: int) -> float:
    """HBM bytes of casting ``elements`` of ``itemsize`` bytes to fp8: two reads (the amax,
    the cast) and the write of the copy."""
    return elements * (2 * itemsize + FP8_ITEMSIZE)


def fp8_weight_cast_bytes(elements: float, itemsize: int) -> float:
    """HBM bytes of Transformer Engine's cast of ``elements`` weights of ``itemsize`` bytes
    to fp8 under current (tensorwise) scaling on a GPU whose fp8 matmuls take only the
    ``TN`` layout (Hopper): two reads (the amax, the cast) and the writes of the fp8 copy
    and of its transpose, which the backward's data-gradient matmul reads.

    Once a step: its ``Linear``, ``LayerNormLinear`` and ``GroupedLinear`` cast the
    weights on the first micro-batch into a cached copy that the other micro-batches and
    every backward read (NVIDIA/TransformerEngine transformer_engine/pytorch/module/
    linear.py@3ec8787, ``Linear.forward``: ``is_first_microbatch`` "allows caching of the
    FP8 versions of the weights"; in 2.x ``get_weight_workspace(cache_name="weight",
    update_workspace=is_first_microbatch)``), and Megatron-Core turns it on (megatron/core/
    extensions/transformer_engine.py, ``TELinear.forward`` passes ``is_first_microbatch``
    unless ``disable_parameter_transpose_cache``; pipeline_parallel/schedules.py,
    ``forward_step`` calls ``model.set_is_first_microbatch()`` on each model chunk's first
    micro-batch). The cast: transformer_engine/pytorch/csrc/quantizer.cpp@0064fbd,
    ``Float8CurrentScalingQuantizer::quantize_impl``: the amax kernel, then one cast that
    writes the row-wise data and, where column-wise use is asked for and the GPU has no
    non-``TN`` fp8 matmul, the transpose (``convert_and_update_tensor``'s
    ``need_transpose``).

    >>> fp8_weight_cast_bytes(1000, 2)  # 2 reads of 2 bytes, 2 writes of 1
    6000
    """
    return elements * (2 * itemsize + 2 * FP8_ITEMSIZE)


#: The layers' weights Transformer Engine's linears hold in fp8 under ``fp8_params``: every
#: projection and MLP weight (its ``Linear``, ``LayerNormLinear``, ``LayerNormMLP`` and
#: ``GroupedLinear`` built under ``fp8_model_init``); the norms' gains and the router stay
#: 16-bit, as do the embedding and the output layer (not a layer's)
FP8_PARAM_NAMES = tuple(
    name for name in (*LAYER_PARAMS, *MOE_PARAMS) if not name.endswith("norm") and name != "router"
)
#: Bytes of the fp32 master weights the distributed optimizer keeps (``bytes_per_param``'s)
MASTER_ITEMSIZE = 4


def bf16_end_layers(
    layers: int, count: int, stages: int = 1, stage: PipelineStage | None = None,
    virtual_stages: int = 1,
) -> int:  # fmt: skip
    """How many of the planned stage's ``layers`` are among the ``count`` at each end of the
    model that ``fp8_params`` keeps 16-bit: both ends without pipeline stages; with stages
    the end each holds (the planned stage is the last, or ``stage`` of a split: its
    embedding's end on the first, its output layer's on the last). Interleaved, only the
    end chunk's layers are counted (``count`` past a chunk's layers reaches other stages).

    >>> bf16_end_layers(8, 1), bf16_end_layers(8, 1, 4), bf16_end_layers(8, 3, 4, None, 4)
    (2, 1, 2)
    """
    if stages == 1:
        return min(2 * count, layers)
    if stage is None:
        return min(count, layers // virtual_stages)
    held = (min(count, stage.chunk_layers[0]) if stage.embedding else 0) + (
        min(count, stage.chunk_layers[-1]) if stage.output else 0
    )
    return min(held, layers)


def fp8_param_elements(
    placement: Placement,
    rules: Mapping[str, Any],
    bf16_layers: int = 0,
) -> int:
    """Elements of the layers' linear weights (:data:`FP8_PARAM_NAMES`) one device stores
    by ``rules`` in fp8 under ``fp8_params``: every layer's of ``placement`` (a stage's)
    but ``bf16_layers`` of them (:func:`bf16_end_layers`; a mixture of experts' two kinds
    of layers: their mean).

    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> tp = get_strategy("tp").place(ModelConfig(layers=4), abstract_mesh("model=8"))
    >>> fp8_param_elements(tp, tp.strategy.param_rules(), 1) * 4 == (
    ...     fp8_param_elements(tp, tp.strategy.param_rules()) * 3)
    True
    """
    names = set(FP8_PARAM_NAMES)
    every = sum(
        elements // placement.ways(rules[name])
        for name, elements in placement.param_elements
        if name in names
    )
    layers = placement.config.layers
    return every * (layers - bf16_layers) // layers


def fp8_param_cast_bytes(shard_elements: float, elements: float, itemsize: int) -> float:
    """HBM bytes a step moves to keep ``elements`` weights (a device's, as its matmuls read
    them) in fp8 under ``fp8_params``, of which the distributed optimizer updates
    ``shard_elements``: in place of :func:`fp8_weight_cast_bytes`'s cast of the 16-bit
    weights, the optimizer casts its fp32 master shard after the update (Megatron-Core's
    ``DistributedOptimizer._copy_main_params_to_model_params`` calls ``quantize_param_shard``,
    Transformer Engine's ``cast_master_weights_to_fp8``: the master shard cast to the
    model's dtype, read for the amax and read again for the cast that writes the fp8
    shard), and once the shards are gathered the transpose of the whole weight is written
    (``post_all_gather_processing``) for the backward's data-gradient matmul, as
    :func:`fp8_weight_cast_bytes` writes it.

    >>> fp8_param_cast_bytes(250, 1000, 2)  # 250 x (4 + 2 + 2 + 2 + 1) + 1000 x (1 + 1)
    4750
    """
    shard = MASTER_ITEMSIZE + 3 * itemsize + FP8_ITEMSIZE
    return shard_elements * shard + elements * 2 * FP8_ITEMSIZE


# the screen asks it of every schedule it prices, of one model
@lru_cache(maxsize=256)
def model_flops(config: ModelConfig, mode: str = Mode.TRAIN) -> int:
    """FLOPs of one step on all devices together (see :data:`FLOPS_CONVENTION`).

    >>> model_flops(ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=8, seq=16),
    ...             "forward")
    26214400
    """
    c = config
    assert c.head_dim is not None
    weights = (
        c.dense_layer_count * layer_matmul_params(c)
        + c.moe_layers * round(moe_layer_matmul_params(c, routed=c.top_k))
        + c.d_model * (c.vocab or 0)
    )
    # QK^T and PV of every sequence, each token against the whole sequence
    core = c.batch * c.layers * attention_core_flops(c, c.seq, c.seq)
    forward = weight_flops(weights, c.batch * c.seq) + core
    return 3 * forward if mode == Mode.TRAIN else forward


def settings_dict(bytes_per_param: int, flash_attention: bool) -> dict[str, Any]:
    return {
        "bytes_per_param": bytes_per_param,
        "flash_attention": flash_attention,
        "flops_convention": FLOPS_CONVENTION,
        "activation_convention": ACTIVATION_CONVENTION,
    }
