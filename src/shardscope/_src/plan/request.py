"""What a plan of the built-in model is asked for: :class:`PlanRequest`, every knob of a sweep
with its one default, checked when it is made.

The Python front door (:func:`shardscope.plan`, :func:`shardscope.plan_request`) and the
command line (``shardscope plan``, whose options map onto these fields) build the same
record, so the two cannot disagree on a knob or its default. It imports no planner module:
the command line's parser reads the defaults from here to print them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from shardscope._src.base.errors import PlanError, is_int
from shardscope._src.base.knobs import REQUIRED, Kind, knob
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import MAX_DIM, MODES, Mode, ModelConfig
from shardscope._src.model.presets import DENSE_PRESETS, MOE_PRESETS
from shardscope._src.model.serving import WeightFormat
from shardscope._src.plan.estimates import (
    DEFAULT_BYTES_PER_PARAM,
    Fp8SavedInputs,
    MatmulDtype,
    PipelineSplit,
    check_fp8_params,
    check_fp8_saved_inputs,
    check_matmul_dtype,
    interleave_problem,
)
from shardscope._src.sharding.strategies import ALL_STRATEGIES, composes_error
from shardscope._src.targets.engines import DEFAULT_ENGINE, ENGINES
from shardscope._src.targets.engines import engine as get_engine
from shardscope._src.targets.hardware import PRESETS, Hardware
from shardscope._src.targets.hardware import hardware as get_hardware
from shardscope._src.targets.specs import CPU_TARGET, TARGETS, Target

#: The compositions of the dimensions (:mod:`~shardscope._src.sharding.parallelism`) beyond
#: the strategies named before them that a sweep screens unless told otherwise: Megatron-LM's
#: distributed optimizer with sequence parallelism and with context parallelism, and context
#: parallelism under tensor-and-sequence parallelism. A sweep compiles one of them only where
#: it is among the best strategy-and-mesh pairs
#: (:func:`~shardscope._src.train.candidates.to_compile`), so that it compiles as few plans as
#: before them.
COMPOSED_DEFAULTS = ("zero1_sp", "zero1_cp", "dp_sp_cp", "zero1_sp_cp", "fsdp_sp_cp")
#: The strategies a sweep tries unless told otherwise ("replicated" is never a useful plan).
DEFAULT_STRATEGIES = (
    "dp",
    "fsdp",
    "zero1",
    "zero2",
    "tp",
    "sp",
    "dp_tp",
    "zero1_tp",
    "fsdp_tp",
    "dp_sp",
    "fsdp_sp",
    "fsdp_cp",
    "hsdp",
    *COMPOSED_DEFAULTS,
)
#: The strategies a sweep of a mixture of experts (or of latent attention) tries unasked:
#: expert parallelism alone, with data parallelism, with FSDP and with tensor parallelism, and
#: TP x EP x DP with the distributed optimizer (``zero1_ep_tp``). The other compositions of
#: expert, data and tensor parallelism are priced when asked for (those with tensor
#: parallelism screen as many meshes each as the rest together): Megatron-LM's default with
#: sequence parallelism and the experts' hidden over the tensor-parallel ranks
#: (``zero1_ep_sp``: its meshes are zero1_ep_tp's, and would make the screen of
#: Qwen3-235B-A22B on 256 H100s 3.7 s to 5.5 s, its best plan the same, and
#: benchmarks/moe_heldout.py 77 s to 113 s, the best plan of its two TPU Mixtral rows further
#: from their measured steps), and the folded ones (``zero1_ep_fold_sp``, MoE parallel
#: folding: 5.1 s to 7.0 s on the same screen).
MOE_STRATEGIES = (
    "dp",
    "fsdp",
    "dp_tp",
    "fsdp_tp",
    "ep",
    "dp_ep",
    "fsdp_ep",
    "ep_tp",
    "zero1_ep_tp",
)
#: The most devices a plan may have (a bound on the enumeration, far above any cluster).
MAX_PLANNED_DEVICES = 2**20
#: The model dimensions a request names (None: the preset's).
MODEL_DIMS = ("d_model", "heads", "ff", "layers", "vocab", "kv_heads", "head_dim")
_SHAPE = "model shape (overrides the preset's)"


def _model_help() -> str:
    return (
        f"a model preset ({', '.join(DENSE_PRESETS)}; 7b, 13b, 70b are the Llama 2 ones; the "
        f"mixtures of experts {', '.join(MOE_PRESETS)}) or the path of a Hugging Face "
        f"config.json or of a model's folder holding one (Llama-family, Mixtral, Qwen3-MoE, "
        f"DeepSeek-V3)"
    )


# The knobs both a training plan and a serving plan take (a field is made once a request type).


def _hardware_knob() -> Any:
    return knob("h100", "hardware preset", kind=Kind.CHOICE, choices=tuple(PRESETS))


def _imbalance_knob() -> Any:
    return knob(
        None,
        "a dropless mixture of experts' routing: the busiest expert's tokens over its even share",
        kind=Kind.NUMBER,
        metavar="X",
        default_text="the model's; 1 for a preset",
    )


def _dispatch_once_knob() -> Any:
    return knob(
        None,
        "a mixture of experts: send each token once to each device holding any of its "
        "experts and sum its outputs there (DeepEP's), not once per expert",
        kind=Kind.SWITCH,
        default_text="the model's; once per expert for a preset",
    )


def _weight_activations_knob() -> Any:
    return knob(
        None,
        "a mixture of experts sent once per expert: each slot's router weight scales its "
        "expert's activation before the down-projection and the outputs are summed "
        "unweighted (Megatron-Core's grouped experts), not the outputs weighted in the combine",
        kind=Kind.SWITCH,
        default_text="the model's; the outputs weighted for a preset",
    )


#: A mixture's routing a request may set over its model's: the fields of the same names of
#: :class:`PlanRequest`, :class:`ServeRequest` and :class:`ModelConfig`.
ROUTING = ("imbalance", "dispatch_once", "weight_activations")


def with_routing(config: ModelConfig, request: PlanRequest | ServeRequest) -> ModelConfig:
    """``config`` with the routing ``request`` sets (:data:`ROUTING`: each it gives, not
    None) in place of its own."""
    given = {k: getattr(request, k) for k in ROUTING if getattr(request, k) is not None}
    return replace(config, **given) if given else config


@dataclass(frozen=True)
class PlanRequest:
    """A plan of ``model`` on ``devices`` accelerators: every strategy, mesh shape,
    micro-batch count, recomputation and pipeline stage count estimated, the best compiled
    and ranked (:func:`shardscope.plan_request` runs it).

    Attributes:
        model: a preset (``tiny``, ``1b``, ``7b``, ``13b``, ``70b``, ...), the path of a
            Llama-family ``config.json``, a :class:`ModelConfig`, or None with ``d_model``,
            ``heads``, ``ff``, ``layers`` (and ``vocab``) given.
        devices: accelerators to plan for (simulated as CPU devices while compiling).
        d_model, heads, ff, layers, vocab: the model's shape; each overrides a preset's
            (None: the preset's).
        batch: global batch in sequences (default: one per device); seq: sequence length
            (default: the preset's).
        mode: ``"train"`` (forward, backward, gradients) or ``"forward"``.
        hardware: ``h100``, ``h200``, ``b200``, ``tpu-v5e``, ``tpu-v5p``, ``tpu-v6e`` or
            a :class:`Hardware`; ``hardware_overrides`` changes fields (e.g.
            ``{"link_bandwidth": 370e9}``).
        strategies: names to try (default :data:`DEFAULT_STRATEGIES`).
        bytes_per_param: model-state bytes per parameter in training (16: mixed-precision Adam).
        flash_attention: memory-efficient attention: the compiled program runs a blocked
            attention and the estimate leaves the score matrix out; False: the program
            materialises the scores and the estimate counts them.
        dtype: the model's element type (a preset's or a given shape's).
        matmul_dtype: ``"bfloat16"`` (the model's 16-bit matmuls) or ``"fp8"``: the time
            model runs the layers' projections and MLP in fp8 (torchtitan's float8 training,
            MaxText's fp8 quantization) at the hardware's ``fp8_peak_flops``, with the casts'
            bytes, and FSDP's weight all-gathers at one byte per element; the attention core
            and the unembedding stay 16-bit, and the memory keeps 16-bit weights, 32-bit
            master weights and optimizer state (the activations as ``fp8_saved_inputs``
            says). Refused on hardware without fp8 (A100, TPUs). The compiled program stays
            the 16-bit reference program.
        fp8_saved_inputs: how an fp8 step keeps its linear layers' inputs for the backward:
            ``"high-precision"`` (the default with ``matmul_dtype="fp8"``: at the model's
            dtype, as torchao's float8 training, torchtitan's, keeps them and as the 16-bit
            reference program does) or ``"fp8"`` (Transformer Engine's, NeMo's and
            Megatron's: their fp8 copies, the query, key and value projection's and the
            MLP's normed inputs and the down-projection's at 1 byte an element, the
            out-projection's copy beside the attention's 16-bit output; and the weights
            cast to fp8 once a step, cached across micro-batches, not in every pass).
            Refused with ``matmul_dtype="bfloat16"``.
        fp8_params: the layers' linear weights kept in fp8, 1 byte an element (Transformer
            Engine's fp8 parameters: Megatron-Core's ``fp8_param_gather``, which
            Megatron-Bridge's fp8 recipes set), but this many layers at each end of the model
            (the FP8-CS recipe's ``first_last_layers_bf16``: 1); None (the default): 16-bit
            weights. The norms, the embedding and the output layer stay 16-bit, the
            gradients, master weights and optimizer state are unchanged; the weights are
            cast by the optimizer from its fp32 master shard once a step, and the
            distributed optimizer's and FSDP's parameter gathers move them at one byte.
            With ``matmul_dtype="fp8"`` and ``fp8_saved_inputs="fp8"`` only.
        remat: recomputation to try: ``"none"``, ``"selective"`` (the attention scores
            recomputed), ``"matmuls"`` (the matmul outputs kept), ``"full"``, ``"offload"``
            (each layer's input and its query, key and value projections in host memory,
            the rest recomputed), a policy by named tensor (MaxText's
            ``"maxtext:save_dot_except_mlpwi"``, JAX's ``"jax:offload_dot_with_no_batch_dims"``,
            ``"custom:query_proj=offload,out_proj=device"``, Megatron's selective
            ``"megatron:moe_act,layernorm"``:
            :func:`~shardscope._src.model.remat.remat_policy`), planned as written, or
            several (default: the five words; offload where the hardware has host memory).
        offload_optimizer: keep the optimizer state in host memory and stream it in for the
            update (MaxText's ``optimizer_memory_host_offload``): True always, False never,
            None (the default) where a candidate does not fit the device otherwise.
        vocab_split: split the embedding, the unembedding and the logits over ``model``
            along the vocabulary (Megatron-LM's vocabulary-parallel embedding and cross
            entropy; under sequence parallelism, with the sequence gathered before the output
            layer) in the strategies with a ``model`` axis: True always, False never, None
            (the default) both, each estimated.
        imbalance: a dropless mixture of experts' routing, the busiest expert's tokens over
            its even share (None: the model's, 1 for a preset: uniform, as the published
            benchmarks force it); its experts' compute and all-to-alls are priced, and its
            program compiled, at that capacity.
        dispatch_once: a mixture of experts sends each token once to each device of the
            expert axis holding any of its experts, and sums its outputs there (DeepEP's
            dispatch and combine), rather than once per expert: True or False, None (the
            default) the model's (False for a preset).
        weight_activations: a mixture of experts sent once per expert scales each slot's
            activation by its router weight before the down-projection and sums the
            outputs unweighted (Megatron-Core's grouped experts under its all-to-all
            dispatcher), so the backward keeps no expert output, rather than weighting the
            outputs in the combine (GShard's, MaxText's): True or False, None (the default)
            the model's (False for a preset; ``dispatch_once`` implies it).
        microbatches: fix the micro-batches per data shard (default: every divisor of the
            sequences per data shard, up to 8 choices).
        stages: fix the pipeline stages, dividing the devices and no more than the layers
            (unequal stages are planned by the largest) (default: 1 and every such count up
            to 16).
        virtual_stages: fix the model chunks each pipeline stage's device runs (interleaved
            1F1B, Narayanan et al. 2021, section 2.2.2; Megatron-LM's virtual pipeline
            stages): 1 is plain 1F1B; more needs pipeline stages, dividing each stage's
            layers, and micro-batches a multiple of the stages. None (the default): 1 and
            every count up to 4 that runs.
        pipeline_split: what the pipeline stages split
            (:class:`~shardscope._src.plan.estimates.PipelineSplit`): ``"layers"`` (the
            default: the layers alone, as evenly as they go, planned by the largest stage),
            or Megatron-LM's split with the embedding (``"embedding"``), the output layer and
            loss (``"loss"``) or both (``"embedding+loss"``) counted as a layer each
            (``--account-for-embedding-in-pipeline-split``,
            ``--account-for-loss-in-pipeline-split``): the counted pieces must divide by the
            stages and each stage's by its virtual stages; each stage is priced with its own
            layers, embedding or output layer, the slowest setting the step and the fullest
            the memory.
        offload_layers: how many of the first layers copy the activations they keep to host
            memory after their forward and back before their backward (Megatron-Core's
            ``cpu_offloading_num_layers`` with ``cpu_offloading_activations``): their bytes
            leave the device and count against the host memory, and the copies run over the
            host link beside the passes. At most the layers but the last, and without
            pipeline stages (Megatron-Core's bounds); 0 (the default): none.
        compile_top: how many of the best estimated strategy-and-mesh pairs to compile (the
            best plan of each validated strategy is compiled as well).
        compiler: None (the default): the hardware's own target when its compiler is
            installed, else ``"cpu"`` and a note names the extra (as ``shardscope plan``
            does); ``"cpu"`` (every plan compiled by the CPU backend over simulated devices),
            or the hardware's own target (``"h100"``, ``"tpu-v5p"``, see
            ``shardscope.TARGETS``): the leading candidates of the analytic screening
            (``compile_top``) are compiled on the CPU compiler, then leading ones again by
            the target's compiler, deviceless, until
            ``target_plans`` of them fit (at most ``3 * target_plans`` compiles). Those plans
            take their collectives, memory per device and fit from that compile
            (``compiled_by``); a TPU out-of-memory at compile does not fit; ``best`` is then
            chosen among them.
        mesh: plan exactly this mesh (``"data=32,model=8"``, a ``{name: size}`` mapping or a
            :class:`~shardscope._src.mesh.MeshShape`; axes in any order, read in the
            planner's: ``stage``, ``replica``, ``data``, ``expert``, ``context``, ``model``;
            or MaxText's ``ici_fsdp=8,dcn_data=4``): only the strategies that run on it (of
            all of them where no default does), every schedule of it estimated, the best
            compiled. The request holds it as its ``MeshShape``, as written.
        beside_best: with a layout pinned (``mesh``, ``strategies``, ``remat``,
            ``microbatches``, ``stages`` or ``virtual_stages``), also screen every layout
            and note (``PlanNote.BESIDE_BEST``) by which parts of the step the fastest that
            fits differs from the pinned one's fastest, both by the estimate.
        workers: compile in this process (0; it must have ``devices`` CPU devices) or in that
            many worker processes that each simulate ``devices``; None: this process when it
            can, else one worker (``default_workers``), so that the caller's JAX is never
            reconfigured.

    What can be checked without compiling is checked here: the counts, the mode, the
    strategy names, the dimensions' range, the hardware and its fp8 matmuls; the rest (the
    preset, the mesh, the compiler) when the sweep starts, before any compile.

    Raises:
        PlanError: a bad device count, mode, worker or compile count, an unknown strategy, a
            dimension past the planner's range, or fp8 matmuls on hardware without them
            (``params`` names the field).
        ShardscopeError: an unknown hardware preset or a bad hardware setting.

    >>> PlanRequest("tiny", 8, strategies=["dp", "tp", "dp"]).strategy_names
    ('dp', 'tp')
    >>> PlanRequest("tiny", 0)
    Traceback (most recent call last):
    ...
    shardscope._src.base.errors.PlanError: devices=0: must be a positive whole number
    """

    model: str | ModelConfig | None = knob("7b", _model_help(), metavar="NAME|FILE")
    devices: int = knob(8, "accelerators to plan for", kind=Kind.COUNT, metavar="N")
    _: KW_ONLY
    d_model: int | None = knob(None, _SHAPE, kind=Kind.COUNT, metavar="N")
    heads: int | None = knob(None, _SHAPE, kind=Kind.COUNT, metavar="N")
    ff: int | None = knob(None, _SHAPE, kind=Kind.COUNT, metavar="N")
    layers: int | None = knob(None, _SHAPE, kind=Kind.COUNT, metavar="N")
    vocab: int | None = knob(None, _SHAPE, kind=Kind.COUNT, metavar="N")
    kv_heads: int | None = knob(
        None,
        "model shape: the key/value heads, dividing the heads (grouped-query attention; "
        "default: the preset's, the heads for a shape given without one)",
        kind=Kind.COUNT,
        metavar="N",
    )
    head_dim: int | None = knob(
        None,
        "model shape: each head's width (default: the preset's, else d_model / heads)",
        kind=Kind.COUNT,
        metavar="N",
    )
    batch: int | None = knob(
        None,
        "global batch in sequences",
        kind=Kind.COUNT,
        metavar="N",
        default_text="one per device",
    )
    seq: int | None = knob(
        None, "sequence length", kind=Kind.COUNT, metavar="N", default_text="the preset's"
    )
    mode: str = knob(Mode.TRAIN, "the step planned", kind=Kind.CHOICE, choices=tuple(MODES))
    hardware: str | Hardware = _hardware_knob()
    hardware_overrides: Mapping[str, float] = field(default_factory=dict)
    strategies: Sequence[str] | None = knob(
        None,
        "comma-separated strategies to try",
        metavar="LIST",
        default_text=f"{','.join(DEFAULT_STRATEGIES)}; for a mixture of experts or latent "
        f"attention, {','.join(MOE_STRATEGIES)}",
    )
    bytes_per_param: int = knob(
        DEFAULT_BYTES_PER_PARAM,
        "training model state per parameter",
        kind=Kind.COUNT,
        metavar="N",
        default_text=f"{DEFAULT_BYTES_PER_PARAM}: mixed-precision Adam",
    )
    flash_attention: bool = knob(
        True,
        "memory-efficient attention: a blocked attention in the compiled program and no score "
        "matrix in the estimate (--no-flash-attention: the scores materialised and counted)",
        kind=Kind.SWITCH,
    )
    dtype: str = "bfloat16"
    matmul_dtype: str = knob(
        MatmulDtype.BFLOAT16,
        "element type of the layers' matmuls in the time model: fp8 runs the projections and "
        "MLP at the hardware's fp8 rate and gathers FSDP's weights in fp8 (hardware with fp8: "
        "h100, h200, b200)",
        kind=Kind.CHOICE,
        choices=tuple(MatmulDtype),
    )
    fp8_saved_inputs: str | None = knob(
        None,
        "how an fp8 step keeps its linear layers' inputs for the backward: high-precision "
        "(torchao's, torchtitan's) or fp8 (Transformer Engine's: NeMo, Megatron; its "
        "weights cast to fp8 once a step); with "
        "--matmul-dtype fp8 only",
        kind=Kind.CHOICE,
        choices=tuple(Fp8SavedInputs),
        default_text="high-precision with --matmul-dtype fp8",
    )
    fp8_params: int | None = knob(
        None,
        "keep the layers' linear weights in fp8 (Transformer Engine's fp8 parameters, "
        "Megatron's fp8_param_gather) but N layers at each end of the model (Megatron-Bridge's "
        "FP8-CS recipe: 1); with --matmul-dtype fp8 --fp8-saved-inputs fp8 only",
        kind=Kind.WHOLE,
        metavar="N",
        default_text="16-bit weights",
    )
    remat: str | Sequence[str] | None = knob(
        None,
        "activation recomputation to try, comma-separated: none, selective (the attention "
        "scores recomputed), matmuls (the matmul outputs kept), full, offload (each layer's "
        "input and QKV projections in host memory), or a policy by named tensor: MaxText's "
        "(maxtext:save_qkv_proj, ...), JAX's (jax:offload_dot_with_no_batch_dims) or "
        "custom:TENSOR=PLACE,... (places device, offload, recompute)",
        metavar="LIST",
        default_text="none, selective (without flash attention), matmuls, full and, with "
        "host memory, offload; a mixture of experts or latent attention none and full",
    )
    offload_optimizer: bool | None = knob(
        None,
        "keep the optimizer state in host memory, streamed in for the update",
        kind=Kind.SWITCH,
        default_text="where a plan does not fit the device otherwise",
    )
    vocab_split: bool | None = knob(
        None,
        "split the embeddings and the logits over 'model' along the vocabulary, in the "
        "strategies with a model axis",
        kind=Kind.SWITCH,
        default_text="try both",
    )
    imbalance: float | None = _imbalance_knob()
    dispatch_once: bool | None = _dispatch_once_knob()
    weight_activations: bool | None = _weight_activations_knob()
    microbatches: int | None = knob(
        None,
        "micro-batches per data shard",
        kind=Kind.COUNT,
        metavar="N",
        default_text="try the divisors",
    )
    stages: int | None = knob(
        None,
        "pipeline stages, dividing the devices; they need not divide the layers (61 in 16: "
        "stages of 4 and 3, planned by one of 4)",
        kind=Kind.COUNT,
        metavar="N",
        default_text="try 1 and each count up to 16 and the layers that divides the devices",
    )
    virtual_stages: int | None = knob(
        None,
        "model chunks per pipeline stage's device (interleaved 1F1B; 1: plain 1F1B; needs "
        "micro-batches a multiple of the stages)",
        kind=Kind.COUNT,
        metavar="N",
        default_text="try 1 and each count up to 4 that divides a stage's layers",
    )
    pipeline_split: str = knob(
        PipelineSplit.LAYERS,
        "what the pipeline stages split: the layers alone (split as evenly as they go, "
        "planned by the largest stage), or with the embedding, the loss (the output layer "
        "and the logits) or both counted as a layer each, as Megatron's "
        "--account-for-embedding-in-pipeline-split and "
        "--account-for-loss-in-pipeline-split do (embedding+loss: both; the counted pieces "
        "must divide by the stages, and a stage's by its virtual stages)",
        kind=Kind.CHOICE,
        choices=tuple(PipelineSplit),
    )
    offload_layers: int = knob(
        0,
        "how many of the first layers copy the activations they keep to host memory after "
        "their forward and back before their backward (Megatron-Core's "
        "cpu_offloading_num_layers): at most the layers but the last, without pipeline "
        "stages; the copies run over the host link beside the compute",
        kind=Kind.WHOLE,
        metavar="N",
    )
    compile_top: int = knob(
        3,
        "compile the best estimated plans of the N best strategy-and-mesh pairs (and the best "
        "of dp, fsdp and tp, whose communication is validated)",
        kind=Kind.COUNT,
        metavar="N",
    )
    compiler: str | None = knob(
        None,
        "cpu: every plan compiled by the CPU backend (fastest); default: the hardware's own "
        "compiler (deviceless) compiles the leading plans after a CPU screening. With "
        "--program: every candidate is compiled by this compiler (default cpu). With --serve: "
        "the hardware's own compiler (default) or cpu (the roofline alone, nothing compiled)",
        kind=Kind.CHOICE,
        choices=("cpu", *PRESETS),
    )
    target_plans: int = knob(
        3,
        "how many leading plans the hardware's compiler compiles",
        kind=Kind.COUNT,
        metavar="N",
    )
    mesh: str | Mapping[str, int] | None = knob(
        None,
        "plan exactly this mesh, e.g. data=32,model=8 (axes in any order, read in the planner's: "
        "stage, replica, data, expert, context, model), or MaxText's ici_X=N,dcn_X=N: only the "
        "strategies that run on it",
        metavar="SPEC",
    )
    beside_best: bool = knob(
        False,
        "with a pinned layout (--mesh, --strategies, --remat, --microbatches, --stages or "
        "--virtual-stages): also screen every layout and note by which parts of the step "
        "the fastest that fits differs from the pinned one's",
        kind=Kind.SWITCH,
    )
    workers: int | None = knob(
        None,
        "compile in N worker processes (0: in this process)",
        kind=Kind.WHOLE,
        metavar="N",
        default_text="auto",
    )

    def __post_init__(self) -> None:
        # A request holds no list or dict of its caller's: what it was given cannot change
        # under it.
        overrides = MappingProxyType(dict(self.hardware_overrides or {}))
        object.__setattr__(self, "hardware_overrides", overrides)
        if self.strategies is not None:
            object.__setattr__(self, "strategies", tuple(self.strategies))
        if self.remat is not None and not isinstance(self.remat, str):
            object.__setattr__(self, "remat", tuple(self.remat))
        _check_counts(self)
        split = PipelineSplit.parse(
            self.pipeline_split, what="pipeline_split", error=PlanError, param="pipeline_split"
        )
        object.__setattr__(self, "pipeline_split", split)
        for name in ("offload_optimizer", "vocab_split"):
            value = getattr(self, name)
            if value not in (None, True, False):
                raise PlanError(
                    f"{name}={value!r}: give True, False or None (the sweep decides)",
                    param=name,
                )
        for name in self.strategy_names:
            if name not in ALL_STRATEGIES:
                why = composes_error(name)
                if why is not None:
                    raise PlanError(why, param="strategies")
                raise PlanError(
                    f"unknown strategy {name!r}; choose from {', '.join(ALL_STRATEGIES)}",
                    param="strategies",
                )
        check_dims({"batch": self.batch, "seq": self.seq, **self.dims})
        hw = get_hardware(self.hardware, **self.hardware_overrides)
        object.__setattr__(self, "matmul_dtype", check_matmul_dtype(self.matmul_dtype, hw))
        saved = check_fp8_saved_inputs(self.fp8_saved_inputs, self.matmul_dtype)
        object.__setattr__(self, "fp8_saved_inputs", saved)
        fp8_params = check_fp8_params(self.fp8_params, self.matmul_dtype, saved)
        object.__setattr__(self, "fp8_params", fp8_params)
        if self.mesh is not None:  # one canonical, immutable shape, whatever form it came in
            object.__setattr__(self, "mesh", MeshShape.of(self.mesh))
        if self.beside_best not in (True, False):
            raise PlanError(
                f"beside_best={self.beside_best!r}: give True or False", param="beside_best"
            )
        if self.beside_best and not self.pins_layout:
            raise PlanError(
                "beside_best=True compares a pinned layout with the fastest of every layout, "
                "and nothing is pinned: give mesh=, strategies=, remat=, microbatches=, "
                "stages= or virtual_stages= (the plan's best is already the fastest)",
                param="beside_best",
            )

    @property
    def pins_layout(self) -> bool:
        """Whether the request fixes any of the layout the sweep would otherwise search."""
        pins = (
            self.mesh,
            self.strategies,
            self.remat,
            self.microbatches,
            self.stages,
            self.virtual_stages,
        )
        return any(p is not None for p in pins)

    @property
    def dims(self) -> dict[str, int | None]:
        """The model dimensions (:data:`MODEL_DIMS`), None where not given."""
        return {k: getattr(self, k) for k in MODEL_DIMS}

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies the sweep tries, each once, in the order given."""
        if self.strategies is None:
            return DEFAULT_STRATEGIES
        return tuple(dict.fromkeys(self.strategies))


def _check_counts(r: PlanRequest) -> None:
    if not is_int(r.devices, 1):
        raise PlanError(f"devices={r.devices!r}: must be a positive whole number", param="devices")
    if r.devices > MAX_PLANNED_DEVICES:
        raise PlanError(
            f"devices={r.devices}: the planner plans at most {MAX_PLANNED_DEVICES:,} devices",
            param="devices",
        )
    Mode.parse(r.mode, what="mode", error=PlanError, param="mode")
    if r.workers is not None and (not is_int(r.workers, 0)):
        raise PlanError(
            f"workers={r.workers!r}: must be 0 (this process) or a positive number",
            param="workers",
        )
    if not is_int(r.compile_top, 0):
        raise PlanError(
            f"compile_top={r.compile_top!r}: must be 0 or a positive number", param="compile_top"
        )
    if not is_int(r.offload_layers, 0):
        raise PlanError(
            f"offload_layers={r.offload_layers!r}: a count of layers, 0 or more; give 0 (every "
            f"layer's activations on the device) or the layers to offload",
            param="offload_layers",
        )
    if r.virtual_stages is not None:
        # What the model's layers do not decide (they are checked when the sweep starts).
        problem = interleave_problem(
            r.virtual_stages,
            r.stages if is_int(r.stages, 1) else None,
            r.microbatches if is_int(r.microbatches, 1) else None,
            train=r.mode == Mode.TRAIN,
        )
        if problem is not None:
            raise PlanError(problem, param="virtual_stages")


def check_dims(values: Mapping[str, Any]) -> None:
    """Refuses a dimension or size past :data:`MAX_DIM` (None: not given)."""
    for name, value in values.items():
        if is_int(value) and value > MAX_DIM:
            raise PlanError(
                f"{name}={value}: the planner takes dimensions up to {MAX_DIM} (2**20); "
                f"choose a smaller {name}",
                param=name,
            )


#: A request with every default (the model and the devices too): where the front doors read
#: a knob's default.
DEFAULT_REQUEST = PlanRequest()


@dataclass(frozen=True)
class ServeRequest:
    """Serving ``model`` on ``devices`` accelerators: prompts of ``prompt`` tokens, ``output``
    tokens generated each (:func:`shardscope.serve_request` runs it; :func:`shardscope.serve`
    builds one from its keywords, and ``shardscope serve`` from its options).

    Attributes:
        model: a preset name or a :class:`ModelConfig` (with a vocabulary).
        devices: accelerators to serve on.
        prompt, output: tokens of each prompt, and generated for each.
        hardware: a preset name or a :class:`Hardware`; ``hardware_overrides`` changes
            fields (``{"memory_bytes": 40e9}``).
        batch: the sequences served at once (None: every power of two that fits, and the
            largest that does).
        context: the KV cache's tokens per sequence (None: ``prompt + output``).
        weights, cache: their formats: ``bfloat16``, ``float16``, ``int8`` or ``fp8``.
        latency: seconds per output token to meet (None: no limit).
        compiler: None (the hardware's own compiler, deviceless, where it has one) or
            ``"cpu"`` (the estimate alone, nothing compiled).
        imbalance, dispatch_once, weight_activations: a mixture's routing (a dropless
            one's imbalance), over the model's.
        rate: requests a second, arriving at random (online serving); give ``batch`` or
            ``rate``, not both.
        clients: clients in a closed loop, each sending its next request when its last one
            ends (how ``vllm bench serve --max-concurrency`` and most published serving
            benchmarks load a server); give one of ``batch``, ``rate`` and ``clients``.
        engine: the serving engine whose host costs each step and request pays
            (:data:`~shardscope._src.targets.engines.ENGINES`: its scheduling, input
            preparation and sampling an iteration, after the device's step or beside it, and
            its API server before a request's first token), and whose fused causal
            attention kernel its prefills run (FlashAttention-3 on Hopper for vLLM; the
            plans' ``prefill_attention`` names it). Default ``vllm``, the most
            deployed open engine as it starts: a plan that leaves out the host's time
            promises a server faster than the one its users will run, and a capacity planned
            on it buys too little; name the engine that will serve (``tensorrt-llm``,
            ``sglang``, ...), or ``none`` for the device's time alone.
        chunked_prefill: under a load (``rate`` or ``clients``), the tokens an iteration
            carries where the server chunks its prefills, the running sequences' decodes
            among them (vLLM's ``--max-num-batched-tokens``, SGLang's
            ``--chunked-prefill-size``): a prompt is prefilled beside the decodes over as
            many iterations as it needs (:mod:`~shardscope._src.serve.online`). None: the
            engine's own (vLLM's V1 and SGLang chunk by default, the others prefill each
            prompt whole); 0: each prompt whole.
        memory_share: the share of a device's memory the engine holds, as it was started
            (vLLM's ``--gpu-memory-utilization``, SGLang's ``--mem-fraction-static``: of
            the device's memory as its runtime reports it; TensorRT-LLM's
            ``free_gpu_memory_fraction``, LMDeploy's ``cache_max_entry_count``: of what the
            weights leave of it). None: the engine's default
            (:class:`~shardscope._src.targets.engines.MemoryRule`); a plan holds its weights,
            cache and temporaries within it. ``none`` and ``gpt-fast`` keep none back.

    What can be checked without the model is checked here, in this order: the counts, the
    context, the batch, the formats, the latency, the rate, the clients, the engine, the
    memory share, the chunked prefill, the compiler.

    Raises:
        PlanError: naming the field (``params``) and the fix.

    >>> ServeRequest("llama3-8b", 1, prompt=512, output=128).context_tokens
    640
    >>> ServeRequest("llama3-8b", 1, prompt=512, output=128, weights="int4")
    Traceback (most recent call last):
    ...
    shardscope._src.base.errors.PlanError: weights='int4': give one of float32, ...
    """

    model: str | ModelConfig = knob(REQUIRED, _model_help(), metavar="NAME|FILE")
    devices: int = knob(REQUIRED, "accelerators to serve on", kind=Kind.COUNT, metavar="N")
    _: KW_ONLY
    prompt: int = knob(REQUIRED, "prompt tokens", kind=Kind.COUNT, metavar="N")
    output: int = knob(REQUIRED, "output tokens", kind=Kind.COUNT, metavar="N")
    hardware: str | Hardware = _hardware_knob()
    hardware_overrides: Mapping[str, float] = field(default_factory=dict)
    batch: int | None = knob(
        None,
        "sequences served at once",
        kind=Kind.COUNT,
        metavar="N",
        default_text="every power of two that fits, and the largest that does",
    )
    context: int | None = knob(
        None,
        "KV cache tokens per sequence",
        kind=Kind.COUNT,
        metavar="N",
        default_text="prompt + output",
    )
    weights: WeightFormat = knob(
        WeightFormat.BFLOAT16, "bfloat16, float16, int8 or fp8", metavar="FORMAT"
    )
    cache: WeightFormat = knob(
        WeightFormat.BFLOAT16, "the KV cache's format, as --weights", metavar="FORMAT"
    )
    latency: float | None = knob(
        None,
        "seconds per output token to meet: the best layout that meets it",
        kind=Kind.SECONDS,
        metavar="S",
        flag="--token-latency",
    )
    compiler: str | None = knob(
        None,
        "the hardware's own compiler, deviceless, or cpu (the estimate alone, nothing compiled)",
        kind=Kind.CHOICE,
        choices=("cpu", *PRESETS),
        default_text="the hardware's own where it has one",
    )
    imbalance: float | None = _imbalance_knob()
    dispatch_once: bool | None = _dispatch_once_knob()
    weight_activations: bool | None = _weight_activations_knob()
    rate: float | None = knob(
        None,
        "requests a second, arriving at random: each layout's latencies as its requests see "
        "them, its batch the sequences in flight (instead of --batch)",
        kind=Kind.NUMBER,
        metavar="R",
    )
    clients: int | None = knob(
        None,
        "clients in a closed loop, each sending its next request when its last one ends: "
        "each layout's latencies as its requests see them (instead of --batch or --rate)",
        kind=Kind.COUNT,
        metavar="N",
    )
    engine: str = knob(
        DEFAULT_ENGINE,
        "the serving engine whose host costs each step and request pays, and whose fused "
        "attention kernel its prefills run (none: the device's time alone)",
        kind=Kind.CHOICE,
        choices=tuple(ENGINES),
    )
    chunked_prefill: int | None = knob(
        None,
        "under a load, the tokens an iteration carries where the server chunks its prefills, "
        "decodes included (vLLM's --max-num-batched-tokens); 0: each prompt prefilled whole",
        kind=Kind.WHOLE,
        metavar="TOKENS",
        default_text="the engine's own",
    )
    memory_share: float | None = knob(
        None,
        "the share of a device's memory the engine holds, as started with it: vLLM's "
        "--gpu-memory-utilization, SGLang's --mem-fraction-static (of the device), "
        "TensorRT-LLM's free_gpu_memory_fraction and LMDeploy's cache_max_entry_count (of what "
        "the weights leave)",
        kind=Kind.FRACTION,
        metavar="X",
        default_text="the engine's own",
    )

    def __post_init__(self) -> None:
        overrides = MappingProxyType(dict(self.hardware_overrides or {}))
        object.__setattr__(self, "hardware_overrides", overrides)
        for what in ("devices", "prompt", "output"):
            value = getattr(self, what)
            if not is_int(value, 1):
                raise PlanError(f"{what}={value!r}: must be a positive whole number", param=what)
        prompt, output, context = self.prompt, self.output, self.context
        if context is not None and (not is_int(context, 1) or context < prompt + output):
            raise PlanError(
                f"context={context!r}: the cache must hold the prompt and the output "
                f"({prompt} + {output} = {prompt + output} tokens); give at least that",
                param="context",
            )
        batch, rate, latency = self.batch, self.rate, self.latency
        if batch is not None and not is_int(batch, 1):
            raise PlanError(f"batch={batch!r}: must be a positive whole number", param="batch")
        for what in ("weights", "cache"):
            fmt = WeightFormat.get(getattr(self, what))
            if fmt is None:
                raise PlanError(
                    f"{what}={getattr(self, what)!r}: give one of {', '.join(WeightFormat)}",
                    param=what,
                )
            object.__setattr__(self, what, fmt)
        if latency is not None and not (isinstance(latency, int | float) and latency > 0):
            raise PlanError(
                f"latency={latency!r}: seconds per output token, above 0", param="latency"
            )
        if rate is not None:
            number = isinstance(rate, int | float) and not isinstance(rate, bool)
            if not (number and 0 < rate < math.inf):
                raise PlanError(
                    f"rate={rate!r}: requests a second, a finite number above 0", param="rate"
                )
            if batch is not None:
                raise PlanError(
                    f"batch={batch} and rate={rate:g}: at a request rate the batch is the "
                    f"sequences in flight; give one of them",
                    param="batch",
                )
        clients = self.clients
        if clients is not None:
            if not is_int(clients, 1):
                raise PlanError(
                    f"clients={clients!r}: clients in a closed loop, a positive whole number",
                    param="clients",
                )
            other = next(
                (f"{k}={v:g}" for k, v in (("batch", batch), ("rate", rate)) if v is not None),
                None,
            )
            if other is not None:
                raise PlanError(
                    f"clients={clients} and {other}: a closed loop's batch is its clients and "
                    f"its rate what they send; give one of them",
                    param="clients",
                )
        object.__setattr__(self, "engine", get_engine(self.engine).name)
        share = self.memory_share
        if share is not None:
            rule = get_engine(self.engine).memory
            if rule is None:
                keeping = ", ".join(e.name for e in ENGINES.values() if e.memory is not None)
                raise PlanError(
                    f"memory_share={share!r}: engine={self.engine!r} keeps no share of the "
                    f"device's memory back (a plan holds all of it); give an engine that does "
                    f"({keeping}) or leave memory_share out",
                    param="memory_share",
                )
            number = isinstance(share, int | float) and not isinstance(share, bool)
            if not (number and 0 < share <= 1):
                raise PlanError(
                    f"memory_share={share!r}: {self.engine}'s {rule.setting}, a fraction above "
                    f"0 and at most 1 (e.g. 0.95)",
                    param="memory_share",
                )
        chunk = self.chunked_prefill
        if chunk is not None and not is_int(chunk, 0):
            raise PlanError(
                f"chunked_prefill={chunk!r}: the tokens an iteration of a chunked prefill "
                f"carries, a whole number (0: each prompt prefilled whole)",
                param="chunked_prefill",
            )
        hw = self.device
        if self.compiler not in (None, CPU_TARGET.name, hw.name):
            raise PlanError(
                f"compiler={self.compiler!r}: it compiles for another target than the plans' "
                f"hardware {hw.name}; give compiler={hw.name!r} (its own compiler, the "
                f"default) or 'cpu' (the roofline alone)",
                param="compiler",
            )

    @property
    def device(self) -> Hardware:
        """The hardware with its overrides."""
        if isinstance(self.hardware, Hardware) and not self.hardware_overrides:
            return self.hardware
        return get_hardware(self.hardware, **self.hardware_overrides)

    @property
    def compile_target(self) -> Target | None:
        """The target whose compiler compiles the plans' steps: the hardware's own where it
        has one, unless the request asked for the CPU (the estimate alone)."""
        if self.compiler == CPU_TARGET.name:
            return None
        return TARGETS.get(self.device.name)

    @property
    def context_tokens(self) -> int:
        """The KV cache's tokens per sequence (``prompt + output`` unless given)."""
        return self.prompt + self.output if self.context is None else self.context

    @property
    def chunk_tokens(self) -> int | None:
        """The tokens an iteration of a chunked prefill carries (``chunked_prefill``, or the
        engine's own on the hardware); None: each prompt prefilled whole.

        >>> ServeRequest("llama3-8b", 1, prompt=512, output=128, rate=1).chunk_tokens
        8192
        >>> ServeRequest("llama3-8b", 1, prompt=512, output=128, engine="tensorrt-llm",
        ...              chunked_prefill=0).chunk_tokens is None
        True
        """
        if self.chunked_prefill is not None:
            return self.chunked_prefill or None
        return get_engine(self.engine).chunk_tokens(self.device)


@dataclass(frozen=True)
class ProgramRequest:
    """A plan of the user's own program on ``devices`` accelerators: every mesh shape x rule
    set compiled and ranked (:func:`shardscope.plan_program_request` runs it;
    :func:`shardscope.plan_program` builds one from its keywords). The fields are
    :func:`shardscope.plan_program`'s arguments, ``target`` for both its ``target=`` and
    ``compiler=``.
    """

    make_step: Callable[..., Any]
    devices: int = 8
    _: KW_ONLY
    rules: Any = knob(
        None,
        'candidate logical-axis rule sets, JSON: {"axes": [...], "rules": {name: [[logical, '
        "mesh axes], ...]}}",
        metavar="FILE",
        default_text="the program's RULES, if it has one",
    )
    rule_set: str | None = knob(
        None, "plan only this rule set of the rules", metavar="NAME", default_text="all"
    )
    axes: Sequence[str] | None = knob(None, "mesh axis names, e.g. data,model", metavar="LIST")
    meshes: Sequence[str | Mapping[str, int]] | None = knob(
        None,
        "mesh shapes to try, ';'-separated, e.g. 'data=4,model=2;data=8,model=1'",
        metavar="LIST",
        default_text="every way to spread the devices over the axes",
    )
    hardware: str | Hardware | None = None
    hardware_overrides: Mapping[str, float] | None = None
    target: str | None = None
    axis_types: Any = None
    name: str | None = None


#: How many candidates ``suggest`` compiles unless told otherwise.
DEFAULT_COMPILES = 12
#: The mesh axes ``suggest`` searches when neither the rules nor the caller name any.
DEFAULT_AXES = ("data", "model")


@dataclass(frozen=True)
class SuggestRequest:
    """A search for the logical-axis rules and mesh of the user's program
    (:func:`shardscope.suggest_request` runs it; :func:`shardscope.suggest` builds one from
    its keywords). The fields are :func:`shardscope.suggest`'s arguments, ``target`` for both
    its ``target=`` and ``compiler=``.
    """

    make_step: Callable[..., Any]
    devices: int = knob(8, "accelerators to plan for", kind=Kind.COUNT, metavar="N")
    _: KW_ONLY
    target: str | None = None
    hardware: str | Hardware | None = None
    hardware_overrides: Mapping[str, float] | None = None
    rules: Any = knob(
        None,
        "your own rule sets, JSON as plan --program reads them: their names are searched and "
        "their best plan is the yardstick",
        metavar="FILE",
        default_text="the program's RULES",
    )
    logical_axes: Sequence[str] | None = knob(
        None,
        "the program's logical axis names, when no rules name them, e.g. batch,embed,mlp",
        metavar="LIST",
    )
    axes: Sequence[str] | None = knob(
        None, "mesh axis names", metavar="LIST", default_text=",".join(DEFAULT_AXES)
    )
    compiles: int = knob(
        DEFAULT_COMPILES,
        "how many candidates the compiler verifies",
        kind=Kind.COUNT,
        metavar="N",
    )
    axis_types: Any = None
    name: str | None = None
    compare: bool = knob(
        True,
        "compile your own rule sets (on every mesh shape) as the yardstick of each proposal",
        kind=Kind.SWITCH,
    )
    args: Sequence[Any] | None = None
    workers: int | None = knob(
        None,
        "compile in N worker processes on this machine (0: in this process)",
        kind=Kind.WHOLE,
        metavar="N",
        default_text="2 on two or more cores",
    )
    ray: str | bool | None = knob(
        None,
        "compile on the Ray cluster whose head is at HOST:PORT ('auto': the one this machine "
        "belongs to); its nodes read the program file at the same path (pip install "
        "'shardscope[ray]')",
        metavar="ADDRESS",
    )
