"""The step-time model: compute, communication, overlap, pipeline bubble and optimizer, per
plan. Pure arithmetic on counts the estimates give (FLOPs, bytes, collectives) and the
hardware preset's constants, each of which names its source in
:mod:`shardscope._src.targets.hardware`.

Per micro-batch on the slowest pipeline stage, one device:

* **compute** = matmul FLOPs / (peak x ``matmul_fraction``) + activation bytes through HBM /
  ``hbm_bandwidth``. The matmul FLOPs are the forward's (Korthikanti et al., arXiv 2205.05198,
  Eq. 7 per layer, divided by the tensor-parallel degree), the backward's (twice the forward)
  and the recomputed forward's (full recomputation: the layers again; selective: the attention
  scores again). The HBM bytes are the tensors Table 2 of the same paper counts, each written
  and read once per forward, per recomputed forward and per backward
  (:data:`HBM_PASSES` = 2): the element-wise work (norms, activations, softmax) that runs at
  memory speed.
* **routed experts' matmuls** (a mixture of experts): no faster than reading the experts'
  weights a device uses (its own experts, FSDP's gathered copies) through HBM, once per
  forward and recomputed forward and twice per backward (the input gradient reads them, the
  weight gradient writes theirs), at the bandwidth a grouped kernel of each layer's expert
  weight reaches reading its operands
  (:func:`~shardscope._src.cost.compute.matmul_read_seconds`). With few tokens per expert
  (below the matmul rate over that bandwidth, about 200 a bf16 expert on an H100) the
  grouped matmuls are memory-bound, and that time is what they take. Where the hardware
  measures matmuls by shape (``matmul_by_shape``: the H100 and H200), their FLOPs run at
  the share of the flat rate a batched kernel of the device's experts reaches at their
  shapes, forward and backward apart (:func:`~shardscope._src.plan.estimates.expert_gemms`,
  :func:`~shardscope._src.cost.compute.measured_efficiency`): an expert of a few hundred
  tokens at about half of it, so a layout that sends each expert more tokens (expert
  parallelism) runs them faster a FLOP than one that runs every expert on a device's own.
* **a dropless mixture's routing** (:mod:`~shardscope._src.cost.routing`): each layer
  with experts scores its tokens (the router's fused softmax and top-k over float32
  logits), permutes each token's ``top_k`` copies into expert order, sorts the chunks an
  expert axis delivers by local expert where a device holds several, and un-permutes and
  sums them back: their bytes through HBM (:func:`~shardscope._src.plan.estimates.
  expert_routing`: rows of ``d_model`` counted as the kernels move them, less the write
  and read the kept activations already give the experts' input and weighted outputs),
  the forward's and, when training, the backward's (the same moves for the gradients, and
  the weighted outputs read again) and a recomputed forward's where the experts are
  recomputed; and on
  a GPU the host's wait for the tokens' counts once a forward (Megatron-Core's dispatcher
  sizes its all-to-all and grouped matmul on the host). A capacity-padded mixture (its
  buffers sized without the routing) pays none of it; the step's ``routing_s``.
* **fp8 matmuls** (``matmul_dtype="fp8"``): the layers' projections and MLP (torchtitan's
  float8 training swaps each ``nn.Linear`` for torchao's ``Float8Linear``, forward and both
  backward matmuls in fp8; MaxText's fp8 quantization replaces its dense layers'
  ``dot_general``) run at ``fp8_peak_flops x fp8_matmul_fraction``; the attention core
  (its flash kernels take 16-bit query, key and value in both) and the unembedding
  (torchtitan's configs leave ``output`` out of the conversion) stay at the 16-bit rate.
  Each fp8 operand's dynamic tensorwise scale and cast are element-wise HBM bytes
  (:func:`~shardscope._src.plan.estimates.fp8_cast_elements_per_layer`: two reads of the
  16-bit tensor and the write of its copy), once per pass that runs the matmuls; with
  ``fp8_saved_inputs="fp8"`` (Transformer Engine's linears: NeMo, Megatron) the weights are
  cast once a step instead, on the first micro-batch, into a copy and its transpose that the
  other micro-batches and the backward read
  (:func:`~shardscope._src.plan.estimates.fp8_weight_cast_bytes`). FSDP's
  weight all-gathers move the fp8 copies, one byte per element (torchtitan's
  ``enable_fsdp_float8_all_gather``, part of its float8 recipe): a consequence of fp8 and
  FSDP, priced so for the formula's terms and the compiled program's gathers alike
  (:func:`gathered_bytes`), though the compiled program (the CPU reference) is 16-bit.
* **the attention core** (``QK^T`` and ``PV``): by default at the matmul rate, counted
  non-causal (Korthikanti et al.'s Eq. 7, as ``matmul_fraction`` was calibrated), which on an
  H100 prices causal attention at about half the matmul rate, a FlashAttention-2-class
  kernel's. Where the hardware names a fused kernel's measured rates
  (``attention_fwd_flops``, ``attention_bwd_flops``), its causal FLOPs (half the
  non-causal) run at them, as FlashAttention counts them: the backward 2.5 times the
  forward's FLOPs (its recomputed scores included); a recomputed forward runs the forward
  kernel again. Only memory-efficient (blocked) attention is such a kernel: a program that
  materializes the scores keeps the matmul rate.
* **tensor-parallel collectives** (over ``model``): each at the alpha-beta time of a ring at
  the achieved bandwidth, on the critical path on GPUs; TPU compilers overlap them with the
  matmuls they feed (``tp_overlap``: collective matmuls), so only what exceeds the compute
  is exposed.
* **context-parallel collectives** (over ``context``): the all-gathers of each layer's keys
  and values and the reduce-scatters of their gradients, on the critical path on GPUs like
  the tensor-parallel ones. XLA's async collectives can start a layer's gather during the
  previous layer (and ring attention overlaps its ``c - 1`` steps with the blocks'
  compute), but the attention that needs them waits: counted as exposed unless the
  hardware overlaps collectives with the matmuls they feed (``tp_overlap``).
* **context parallelism's ring** (``..._cp_ring``): each layer's keys and values go round
  the context ring in ``c - 1`` steps (collective-permutes of one device's chunk; the
  backward passes them again with their gradients), each step's transfer beside the
  attention of the chunk in hand, ``1 / c`` of the layer's attention core (forward,
  backward or recomputed). The steps of a micro-batch are taken alike: its transfers hide
  behind ``(c - 1) / c`` of its attention core's time, and what they take beyond it (or the
  compute their multiprocessors take from it, :func:`~shardscope._src.cost.compute.
  overlap_seconds`) is on the critical path, as Megatron-LM and Transformer Engine's ``p2p``
  context parallelism overlaps them.
* **pipeline** (1F1B, Narayanan et al., arXiv 2104.04473, section 2.2): ``m + p - 1``
  micro-batch slots of the stage time, so the bubble is ``(p - 1) / (m + p - 1)`` of the
  pipeline; each slot also sends the micro-batch's activations to the next stage and their
  gradient back (point-to-point, ``b s h / t`` bytes each way). Interleaved with ``v``
  virtual stages (section 2.2.2: each device runs ``v`` chunks of ``1 / v`` of its layers),
  a chunk's forward and backward take ``t_f / v`` and ``t_b / v``, the bubble is the
  paper's ``t_pb^int = (p - 1) (t_f + t_b) / v``, ``1 / v`` of 1F1B's: the pipeline is
  ``v m + p - 1`` chunk slots and the bubble ``(p - 1) / (v m + p - 1)`` of it (the paper's
  ``(1 / v) (p - 1) / m`` of the ideal time). Each chunk sends its activations on and
  their gradient back, so the point-to-point transfers grow ``v``-fold ("the amount of
  communication also increases by v"). Where the program overlaps them (``pp_overlap``:
  Megatron's ``overlap_p2p_comm``, which NeMo's interleaved recipes set) the steady phase's
  ``v m`` chunks send and receive beside the next chunk's compute, and only the fill's and
  the flush's ``p - 1`` slots keep their transfers on the critical path.
* **a mixture's all-to-alls beside another micro-batch** (``ep_overlap``: Megatron-Core's
  combined 1F1B, which runs one micro-batch's forward of a chunk with another's backward
  of one, layer by layer): each layer with experts is four pairs, one stream's
  all-to-all beside the other's one sub-module, each as long as the longer of the two
  (:func:`_exchange_seconds`: the backward's combine beside the forward's attention, the
  forward's dispatch beside the experts' backward, the backward's dispatch beside the
  forward's experts, the forward's combine beside the attention's backward); the output
  layer and the layers without experts have nothing beside them. Dispatch and combine move
  the same rows, forward and backward, so each pair has a quarter of the layer's
  all-to-alls. The chunks the schedule runs alone (a pipeline's warm-up and cool-down;
  without one the first forward and the last backward) and the fill's and flush's slots
  wait for theirs.
* **data-parallel and FSDP collectives** (over the data axes): overlapped with compute as far
  as the schedule allows. FSDP's gathers and reduce-scatters repeat per micro-batch, each
  behind the pass that runs it: the forward's gathers behind the forward (a layer waits for
  its weights, so what the forward does not cover cannot wait for the backward), the
  backward's gathers and the gradients' reduce-scatters behind the backward; ZeRO-2's
  gradient reduce-scatters repeat per micro-batch and hide behind its backward; a replicated
  gradient (DP, ZeRO-1) is accumulated over the micro-batches and all-reduced once, behind
  the last micro-batch's backward (Megatron-LM, DeepSpeed and PyTorch DDP's ``no_sync`` all
  schedule it so); ZeRO's all-gather of the updated parameters, once per step, behind one
  micro-batch's forward.
  A program that runs FSDP's gathers and reduce-scatters alone (``fsdp_overlap`` unset: a
  JAX program's scanned layers under XLA's default GPU flags) pays them in full.
  What does not fit its window is exposed. On a GPU what does fit is not free: each
  collective holds its share of the multiprocessors while it runs
  (:func:`~shardscope._src.cost.links.held_share`: NCCL's channels), and the window's
  compute goes at the rest of its rate, so the two take ``max(c, w + c x share)``
  (:func:`~shardscope._src.cost.compute.overlap_seconds`; ``contention_s``, beyond what is
  exposed). The same rule holds the tensor-parallel collectives a TPU overlaps, at no share.
* **host offload** (``remat="offload"``): each layer's offloaded tensors are copied to host
  memory during the forward and back during the backward, over the host link
  (``host_bandwidth``), beside the compute: a pass lasts as long as the longer of the two.
  What is recomputed is the forward without the kept query, key and value projections.
  The same holds for what the first ``offload_layers`` layers keep (Megatron-Core's
  ``cpu_offloading_num_layers``), added to the pass's copies.
* **optimizer state on the host** (``offload_optimizer``): streamed in over the host link for
  the update and back, after the last backward, exposed.
* **optimizer**: Adam reads and writes its state once per step: :data:`OPTIMIZER_BYTES` per
  parameter a device updates, at HBM speed.

MFU is the model FLOPs (no recomputation; Korthikanti Eq. 7) over the step time and the peak
of every device.

A **compiled plan** (:func:`compiled_step`) is priced with what its program does: its
collectives in place of the formula's terms, and its matmul FLOPs, counted from its HLO
(:mod:`~shardscope._src.hlo.cost`, one count for every compiler), in place of the formula's
forward, backward and recomputation. The count says how much, not where: the formula's split
between forward and backward, and between fp8 and 16-bit matmuls, is scaled to it
(:meth:`StepWork.with_step_matmul_flops`), so a program that computes what the formula counts
has the formula's step, and one that computes more (a recomputation the formula does not
assume, say) is slower by that work at the matmul rate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
)
from shardscope._src.base.records import Record
from shardscope._src.base.vocab import Vocab
from shardscope._src.bounds.terms import Bound, Term, TermRole
from shardscope._src.bounds.transformer import regathered_terms, transformer_bound
from shardscope._src.cost.compute import (
    fused_attention_seconds,
    gemms_efficiency,
    matmul_read_seconds,
    matmul_seconds,
    overlap_seconds,
    stream_seconds,
)
from shardscope._src.cost.flops import attention_core_flops, weight_flops
from shardscope._src.cost.links import (
    alpha_beta_seconds,
    collective_seconds,
    held_share,
    stage_bandwidth,
    stage_held_share,
)
from shardscope._src.cost.routing import host_sync_seconds
from shardscope._src.mesh import mesh_axes
from shardscope._src.model.config import Mode, ModelConfig, Remat
from shardscope._src.model.remat import MLP_IN, PROJECTIONS, remat_policy
from shardscope._src.plan.estimates import (
    DEFAULT_BYTES_PER_PARAM,
    FP8_ITEMSIZE,
    Fp8SavedInputs,
    MatmulDtype,
    Schedule,
    activation_bytes_per_layer,
    bf16_end_layers,
    check_matmul_dtype,
    expert_gemms,
    expert_mlp_params,
    expert_routing,
    expert_weight_elements,
    fp8_cast_bytes,
    fp8_cast_elements_per_layer,
    fp8_param_cast_bytes,
    fp8_param_elements,
    fp8_weight_cast_bytes,
    fp8_weight_elements_per_layer,
    logits_model_split,
    matmul_params_per_token,
    model_flops,
    model_ways,
    named_tensor_bytes,
    offloaded_bytes_per_layer,
    producer_params,
    routed_expert_work,
    stage_elements_per_device,
    stored_activation_bytes_per_layer,
    tokens_per_device,
)
from shardscope._src.sharding.programs import accumulated_roles, dense_local_roles
from shardscope._src.sharding.strategies import Placement, Role
from shardscope._src.targets.capabilities import Capabilities, Support
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import TARGETS

if TYPE_CHECKING:
    from shardscope._src.plan.collectives import PlanCollective

_T = TypeVar("_T")

#: HBM passes per activation byte per pass over the layers (write once, read once).
HBM_PASSES = 2
#: Bytes Adam moves per parameter a device updates: reads the fp32 master, m and v (12) and
#: the 16-bit gradient (2), writes master, m, v (12) and the 16-bit parameter (2)
#: (ZeRO, arXiv 1910.02054, section 3's mixed-precision Adam state).
OPTIMIZER_BYTES = 28


class OverlapClass(Vocab):
    """Classes of collectives for the overlap rules: what compute each one can hide behind."""

    #: tensor / sequence parallel, on the critical path
    CRITICAL = "critical"
    #: FSDP gathers and reduce-scatters
    PER_MICROBATCH_FWD_BWD = "per-microbatch"
    #: gradient reduce-scatters, as the backward produces them
    PER_MICROBATCH_BWD = "gradients"
    #: a once-per-step gradient reduction (DP, ZeRO-1)
    PER_STEP_BWD = "gradient-reduction"
    #: ZeRO's all-gather of updated parameters
    PER_STEP_FWD = "parameter-gather"
    #: context parallelism's ring: keys and values (and their gradients) passed on beside
    #: the attention of the chunk in hand
    CONTEXT_RING = "context-ring"


CRITICAL = OverlapClass.CRITICAL
PER_MICROBATCH_FWD_BWD = OverlapClass.PER_MICROBATCH_FWD_BWD
PER_MICROBATCH_BWD = OverlapClass.PER_MICROBATCH_BWD
PER_STEP_BWD = OverlapClass.PER_STEP_BWD
PER_STEP_FWD = OverlapClass.PER_STEP_FWD
CONTEXT_RING = OverlapClass.CONTEXT_RING


@dataclass(frozen=True)
class CommItem:
    """Collectives of one class: ``seconds`` over the whole step, alpha and beta together;
    ``held``: the share of a GPU's multiprocessors they hold while they run
    (:func:`~shardscope._src.cost.links.held_share`)."""

    what: str
    cls: OverlapClass
    seconds: float
    held: float = 0.0
    #: the collectives' kind (``all-to-all``, ...), where one kind is priced apart
    kind: str = ""
    #: of ``seconds``, those the forward runs (FSDP's gathers of the weights at their use,
    #: the first time a micro-batch uses them); the rest run in the backward
    forward_s: float = 0.0


@dataclass(frozen=True)
class CommLoad:
    """A step's collectives summed as :func:`step_time` reads them: the critical path's
    (and its all-to-alls apart), context parallelism's ring, and each other overlap class,
    in the order the collectives first name it. Their sums depend on the collectives alone,
    so a sweep's schedules that share the collectives share them (:meth:`of`)."""

    critical_s: float
    critical_held_s: float
    #: the critical path's all-to-alls (a mixture's dispatch and combine)
    exchange_s: float
    exchange_held_s: float
    ring_s: float
    ring_held_s: float
    #: ``(class, seconds, seconds times held share, of the seconds the forward's)`` of each
    #: other class
    by_class: tuple[tuple[OverlapClass, float, float, float], ...]

    @classmethod
    def of(cls, comm: Sequence[CommItem]) -> CommLoad:
        critical = [c for c in comm if c.cls == CRITICAL]
        exchange = [c for c in critical if c.kind == ALL_TO_ALL]
        ring = [c for c in comm if c.cls == CONTEXT_RING]
        by_class: dict[OverlapClass, tuple[float, float, float]] = {}
        for c in comm:
            if c.cls not in (CRITICAL, CONTEXT_RING):
                seconds, held, forward = by_class.get(c.cls, (0.0, 0.0, 0.0))
                by_class[c.cls] = (
                    seconds + c.seconds,
                    held + c.seconds * c.held,
                    forward + c.forward_s,
                )
        return cls(
            critical_s=sum(c.seconds for c in critical),
            critical_held_s=sum(c.seconds * c.held for c in critical),
            exchange_s=sum(c.seconds for c in exchange),
            exchange_held_s=sum(c.seconds * c.held for c in exchange),
            ring_s=sum(c.seconds for c in ring),
            ring_held_s=sum(c.seconds * c.held for c in ring),
            by_class=tuple((k, *sums) for k, sums in by_class.items()),
        )


@dataclass(frozen=True)
class Pricing:
    """What a candidate's step is priced with besides its collectives: its placement (which
    axes are tensor parallel, which data) and the work of one device (FLOPs, bytes, the
    schedule). Kept with a plan, so that its compiled collectives are priced as its
    formula's were."""

    placement: Placement
    work: StepWork

    def step(self, hw: Hardware, comm: Sequence[CommItem], flops: float | None = None) -> StepTime:
        """The step with collectives ``comm`` and, given ``flops`` (a compiled program's
        matmul FLOPs per device in the whole step; None or 0: none counted), that much matmul
        work in place of the formula's (:meth:`StepWork.with_step_matmul_flops`)."""
        keep = hw.attention_fwd_flops > 0
        work = self.work.with_step_matmul_flops(flops, keep_attention=keep) if flops else self.work
        return step_time(hw, work, comm)

    @property
    def fp8_gathers(self) -> bool:
        """FSDP's weight all-gathers move fp8 copies (the layers' matmuls run in fp8)."""
        return self.work.matmul_dtype == MatmulDtype.FP8

    @property
    def fp8_param_share(self) -> float:
        """The share of ZeRO's gathered parameters that are fp8 weights (``fp8_params``)."""
        return self.work.fp8_param_share


@dataclass(frozen=True)
class StepWork:
    """What one device does in a step on the slowest pipeline stage, before timing.

    FLOPs and bytes are per micro-batch: ``fwd_flops`` one forward, ``recompute_flops`` the
    recomputed part, ``act_bytes`` the activation tensors of one forward (Table 2),
    ``recompute_act_bytes`` those recomputed.
    """

    microbatches: int
    stages: int
    fwd_flops: float
    recompute_flops: float
    act_bytes: float
    recompute_act_bytes: float
    p2p_bytes: float  # one way, per micro-batch
    p2p_bandwidth: float
    optimizer_params: float
    model_flops: float  # the whole step, all devices, no recomputation
    devices: int
    train: bool = True
    #: bytes offloaded to host memory per micro-batch (``remat="offload"``, and the layers
    #: ``offload_layers`` offloads), each way
    host_bytes: float = 0.0
    host_bandwidth: float = 0.0
    #: optimizer state in host memory, streamed in for the update and back (each way)
    host_optimizer_bytes: float = 0.0
    #: the share of the multiprocessors a transfer between stages holds while it runs
    #: beside compute (``pp_overlap``; :func:`~shardscope._src.cost.links.stage_held_share`)
    p2p_held: float = 0.0
    #: the element type of the layers' matmuls, and the part of ``fwd_flops`` and of
    #: ``recompute_flops`` that runs in it when it is fp8
    matmul_dtype: str = MatmulDtype.BFLOAT16
    fp8_flops: float = 0.0
    fp8_recompute_flops: float = 0.0
    #: HBM bytes of the fp8 casts (scale and copy) of one forward, one backward and the
    #: recomputed part, per micro-batch
    cast_bytes: float = 0.0
    cast_bwd_bytes: float = 0.0
    cast_recompute_bytes: float = 0.0
    #: HBM bytes of the casts made once a step, not once a pass: Transformer Engine's fp8
    #: weights (``fp8_saved_inputs="fp8"``), cast on the first micro-batch and kept
    cast_step_bytes: float = 0.0
    #: the share of the elements ZeRO's all-gather of updated parameters moves that are fp8
    #: weights (``fp8_params``: one byte an element; 0: every element 16-bit)
    fp8_param_share: float = 0.0
    #: model chunks per device (interleaved 1F1B; 1: plain 1F1B)
    virtual_stages: int = 1
    #: the routed experts' part of ``fwd_flops`` and of ``recompute_flops``, and the bytes
    #: of the experts' weights one pass reads (a mixture of experts; 0 for a dense model)
    expert_flops: float = 0.0
    expert_recompute_flops: float = 0.0
    expert_weight_bytes: float = 0.0
    #: the grouped kernels that read them in one pass (each layer's of each expert weight)
    expert_weight_kernels: int = 0
    #: the share of the flat matmul rate the routed experts' forward (and recomputed) and
    #: backward matmuls reach at their shapes (:func:`~shardscope._src.cost.compute.
    #: gemms_efficiency`, measured; 1: the flat rate)
    expert_fwd_share: float = 1.0
    expert_bwd_share: float = 1.0
    #: memory-efficient attention's core (``QK^T`` and ``PV``, counted non-causal) in
    #: ``fwd_flops``, and in ``recompute_flops`` as a forward run again (recomputation): what
    #: a fused attention kernel runs at its own rates (:attr:`Hardware.attention_fwd_flops`);
    #: 0 otherwise. ``recompute_flops`` also holds its backward's recomputed scores,
    #: :attr:`attention_scores_flops`.
    attention_flops: float = 0.0
    attention_rerun_flops: float = 0.0
    #: context parallelism's ring: its shards ``c`` (0: no ring), and the attention core's
    #: FLOPs (counted non-causal) of one forward and of its recomputation, which the ring's
    #: steps run beside
    ring_shards: int = 0
    ring_core_flops: float = 0.0
    ring_rerun_flops: float = 0.0
    #: a dropless mixture's routing beyond its matmuls (:mod:`~shardscope._src.cost.
    #: routing`): the HBM bytes of the router's scores and the slots' permutations in one
    #: forward, one backward and the recomputed part, per micro-batch, and the host's waits
    #: for the tokens' counts in one forward and in the recomputed part (a layer each)
    routing_bytes: float = 0.0
    routing_bwd_bytes: float = 0.0
    routing_recompute_bytes: float = 0.0
    host_syncs: int = 0
    host_recompute_syncs: int = 0
    #: the output layer's matmul FLOPs in ``fwd_flops`` (16-bit; 0 on a stage without it),
    #: and the share of the stage's layers that have experts: what Megatron's combined 1F1B
    #: schedule (``ep_overlap``) runs beside a mixture's all-to-alls is those layers'
    #: sub-modules, never the loss's or a dense layer's (:func:`_exchange_seconds`)
    logits_flops: float = 0.0
    expert_layer_share: float = 1.0

    @property
    def matmul_flops(self) -> float:
        """The matmul FLOPs of one micro-batch: its forward, and when training its backward
        (twice the forward) and what is recomputed."""
        if not self.train:
            return self.fwd_flops
        return 3 * self.fwd_flops + self.recompute_flops

    @property
    def step_matmul_flops(self) -> float:
        """The matmul FLOPs of the whole step, every micro-batch (:attr:`matmul_flops`)."""
        return self.microbatches * self.matmul_flops

    @property
    def attention_scores_flops(self) -> float:
        """The scores (``QK^T``, half the core) the blocked backward recomputes, in
        ``recompute_flops``."""
        return self.attention_flops / 2

    @property
    def step_attention_flops(self) -> float:
        """The attention core's FLOPs in :attr:`step_matmul_flops` (0 for a program that
        materializes the scores)."""
        if not self.train:
            return self.microbatches * self.attention_flops
        core = 3 * self.attention_flops + self.attention_rerun_flops
        return self.microbatches * (core + self.attention_scores_flops)

    def with_step_matmul_flops(self, flops: float, *, keep_attention: bool = False) -> StepWork:
        """This work doing ``flops`` matmul FLOPs in the whole step (a compiled program's
        count) instead of :attr:`step_matmul_flops`: the forward, the recomputed part and
        their fp8 shares scaled alike, so that the formula's split between forward and
        backward and between fp8 and 16-bit matmuls stays as it was. A count says how much
        the program computes, not where; its step then takes ``flops`` at the matmul rates.
        ``keep_attention`` (the hardware runs a fused attention kernel at its own rates):
        the formula's attention core stays as it is, at the kernel's rates, and the count
        beyond it scales the other matmuls (a count below the core's: everything scaled
        alike, the core too).

        >>> w = StepWork(
        ...     microbatches=2, stages=1, fwd_flops=10.0, recompute_flops=4.0, act_bytes=0,
        ...     recompute_act_bytes=0, p2p_bytes=0, p2p_bandwidth=1, optimizer_params=0,
        ...     model_flops=0, devices=1,
        ... )
        >>> w.step_matmul_flops  # 2 x (10 + 2 x 10 + 4)
        68.0
        >>> twice = w.with_step_matmul_flops(136.0)
        >>> twice.fwd_flops, twice.recompute_flops
        (20.0, 8.0)
        """
        own = self.step_matmul_flops
        if own <= 0:
            return self
        kept = self.step_attention_flops
        # With a fused kernel the attention stays at the kernel's rates and the count scales
        # the rest; otherwise (or below the attention's share) it scales every part alike.
        keep = keep_attention and 0 < kept < min(flops, own)
        r = (flops - kept) / (own - kept) if keep else flops / own
        a = self.attention_flops if keep else 0.0
        ar = self.attention_rerun_flops + self.attention_scores_flops if keep else 0.0
        core = 1.0 if keep else r
        return replace(
            self,
            fwd_flops=a + (self.fwd_flops - a) * r,
            recompute_flops=ar + (self.recompute_flops - ar) * r,
            fp8_flops=self.fp8_flops * r,
            fp8_recompute_flops=self.fp8_recompute_flops * r,
            expert_flops=self.expert_flops * r,
            expert_recompute_flops=self.expert_recompute_flops * r,
            logits_flops=self.logits_flops * r,
            attention_flops=self.attention_flops * core,
            attention_rerun_flops=self.attention_rerun_flops * core,
        )


@dataclass(frozen=True)
class StepTime(Record):
    """The step time and its parts (seconds); ``mfu`` is model FLOPs utilization."""

    compute_s: float
    tp_comm_s: float
    data_comm_s: float
    data_exposed_s: float
    p2p_s: float
    bubble_s: float
    optimizer_s: float
    step_s: float
    mfu: float
    bubble_fraction: float
    #: the step's copies to and from host memory (``remat="offload"``), hidden behind the
    #: forward and backward they run beside as far as those last
    offload_s: float = 0.0
    #: the compute the collectives hidden behind it take from it (on a GPU their
    #: multiprocessors' share of their time), beyond ``data_exposed_s``
    contention_s: float = 0.0
    #: a dropless mixture's routing in ``compute_s``: its permutations' and router's bytes
    #: through HBM and the host's waits for the tokens' counts (:mod:`~shardscope._src.
    #: cost.routing`)
    routing_s: float = 0.0
    #: what the tensor-, sequence-, expert- and context-parallel collectives add to the
    #: step on its critical path (of ``tp_comm_s``)
    tp_exposed_s: float = 0.0
    #: what the pipeline's transfers add to the step beyond its bubble (of ``p2p_s``)
    p2p_exposed_s: float = 0.0

    @property
    def comm_s(self) -> float:
        """Every collective and pipeline transfer of the step as it is priced, hidden or
        not: the tensor, sequence, expert and context ones, the data-parallel ones and the
        stages' transfers."""
        return self.tp_comm_s + self.data_comm_s + self.p2p_s

    def parts(self) -> dict[str, float]:
        """The step in parts that add up to ``step_s``, by what each part is: the compute
        (with the weights' fp8 casts and host offload it waits on), a mixture's routing
        (``routing_s``, taken out of the compute), the collectives on the critical path,
        the pipeline's transfers and its bubble, the data-parallel collectives' exposed
        time with the compute they slow, and the optimizer's update.

        >>> t = StepTime(compute_s=2.0, tp_comm_s=1.0, data_comm_s=3.0, data_exposed_s=0.5,
        ...              p2p_s=0.2, bubble_s=0.3, optimizer_s=0.1, step_s=4.0, mfu=0.4,
        ...              bubble_fraction=0.1, contention_s=0.25, tp_exposed_s=0.75,
        ...              p2p_exposed_s=0.1)
        >>> sum(t.parts().values())
        4.0
        """
        seconds = (
            self.compute_s - self.routing_s,
            self.routing_s,
            self.tp_exposed_s,
            self.p2p_exposed_s,
            self.bubble_s,
            self.data_exposed_s + self.contention_s,
            self.optimizer_s,
        )
        return dict(zip(STEP_PARTS, seconds, strict=True))


#: The parts of a step (:meth:`StepTime.parts`), in the words a plan's notes use.
STEP_PARTS = (
    "compute",
    "the experts' token routing",
    "tensor, sequence, expert and context collectives on the critical path",
    "pipeline transfers",
    "pipeline bubble",
    "data-parallel collectives exposed and the compute they slow",
    "optimizer update",
)


def step_time(hw: Hardware, work: StepWork, comm: Sequence[CommItem] | CommLoad) -> StepTime:
    """The step time of ``work`` with collectives ``comm`` (see the module docstring), or
    with their sums (:meth:`CommLoad.of`, for the many steps that share them)."""
    load = comm if isinstance(comm, CommLoad) else CommLoad.of(comm)
    m, p = work.microbatches, work.stages

    def weights_wait(flops: float, passes: int, share: float) -> float:
        # What the routed experts' matmuls take beyond their FLOPs at the flat rate: the
        # longer of their time at the ``share`` of it their shapes reach and reading their
        # weights (the experts' matmuls run in fp8 with the layers'); nothing where no pass
        # runs them.
        if not flops:
            return 0.0
        run = matmul_seconds(hw, flops, flops if work.fp8_flops else 0.0)
        read = 0.0
        if work.expert_weight_bytes:
            size = work.expert_weight_bytes / max(1, work.expert_weight_kernels)
            read = matmul_read_seconds(hw, passes * work.expert_weight_bytes, size)
        return max(run / share, read) - run

    def experts(flops: float, passes: int, share: float) -> float:
        # the routed experts' matmuls of a pass, as the step prices them
        run = matmul_seconds(hw, flops, flops if work.fp8_flops else 0.0)
        return run + weights_wait(flops, passes, share)

    act = stream_seconds(hw, HBM_PASSES * work.act_bytes)
    # a fused attention kernel's causal FLOPs (half the non-causal count) at its own rates
    attention = work.attention_flops if hw.attention_fwd_flops > 0 else 0.0
    rerun = work.attention_rerun_flops if attention else 0.0
    scores = work.attention_scores_flops if attention else 0.0
    attn_fwd = fused_attention_seconds(hw, attention) if attention else 0.0
    attn_bwd = fused_attention_seconds(hw, attention, backward=True) if attention else 0.0
    attn_rerun = fused_attention_seconds(hw, rerun) if attention else 0.0
    dense = work.fwd_flops - attention
    # the fp8 part at the fp8 rate, the rest (the unembedding, and the attention core unless
    # a fused kernel's rates price it) at 16 bits
    fwd = (
        matmul_seconds(hw, dense, work.fp8_flops)
        + attn_fwd
        + act
        + weights_wait(work.expert_flops, 1, work.expert_fwd_share)
    )
    bwd = matmul_seconds(hw, 2 * dense, 2 * work.fp8_flops) + attn_bwd + act
    bwd += weights_wait(2 * work.expert_flops, 2, work.expert_bwd_share)
    bwd += (
        matmul_seconds(hw, work.recompute_flops - rerun - scores, work.fp8_recompute_flops)
        + attn_rerun
    )
    bwd += stream_seconds(hw, HBM_PASSES * work.recompute_act_bytes)
    bwd += weights_wait(work.expert_recompute_flops, 1, work.expert_fwd_share)
    if work.cast_bytes or work.cast_bwd_bytes or work.cast_recompute_bytes:
        fwd += stream_seconds(hw, work.cast_bytes)
        bwd += stream_seconds(hw, work.cast_bwd_bytes + work.cast_recompute_bytes)
    # a dropless mixture's routing: its moves through HBM, and the device dry while the host
    # waits for the tokens' counts, in each forward (and the recomputed one)
    route_fwd = stream_seconds(hw, work.routing_bytes) + host_sync_seconds(hw, work.host_syncs)
    route_bwd = stream_seconds(hw, work.routing_bwd_bytes + work.routing_recompute_bytes)
    route_bwd += host_sync_seconds(hw, work.host_recompute_syncs)
    if not work.train:
        bwd = route_bwd = 0.0
    fwd += route_fwd
    bwd += route_bwd
    # Offloaded activations go out during the forward and come back during the backward,
    # on the host link beside the compute: a pass lasts as long as the longer of the two.
    host = work.host_bytes / work.host_bandwidth if work.host_bytes else 0.0
    fwd = max(fwd, host)
    bwd = max(bwd, host) if work.train else 0.0
    tp = load.critical_s
    # a mixture's all-to-alls beside another micro-batch's compute (ep_overlap), apart
    exchanged = hw.ep_overlap and work.train
    ex = load.exchange_s if exchanged else 0
    ex_held = load.exchange_held_s if exchanged else 0
    rest = tp - ex
    rest_held = load.critical_held_s - ex_held
    tp_exposed = overlap_seconds(fwd + bwd, rest / m, rest_held / m) if hw.tp_overlap else rest / m
    ring_s = load.ring_s
    tp_exposed += ring_seconds(hw, work, ring_s / m, load.ring_held_s / m)
    # one point-to-point transfer: one latency, its bytes at the bandwidth between stages
    p2p_one = (
        alpha_beta_seconds(1, hw.latency_s, work.p2p_bytes, work.p2p_bandwidth) if p > 1 else 0.0
    )
    # One model chunk of one micro-batch, forward and backward, with its two transfers: the
    # whole stage's work per micro-batch without interleaving.
    v = work.virtual_stages
    chunk = (fwd + bwd + tp_exposed) / v
    # Under ep_overlap a chunk's all-to-alls (forward's and backward's) run beside the
    # compute of the chunk it is paired with (Megatron's combined 1F1B), each beside the
    # one sub-module the schedule pairs it with (_exchange_seconds), but the chunks that
    # run alone, and the fill's and flush's slots, wait for theirs.
    alone = ex / (m * v)
    ex_exposed = 0.0
    if ex:
        paired = v * m - _unpaired_chunks(p, v, m)
        # the four sub-modules' compute beside a layer's four all-to-alls, per micro-batch
        e_fwd = experts(work.expert_flops, 1, work.expert_fwd_share)
        e_bwd = experts(2 * work.expert_flops, 2, work.expert_bwd_share)
        e_rerun = experts(work.expert_recompute_flops, 1, work.expert_fwd_share)
        logits = matmul_seconds(hw, work.logits_flops)
        # the other weights' gradients (one forward's matmuls but the experts' and the
        # output layer's), which the schedule delays to the end of the layer's backward
        fp8_experts = work.expert_flops if work.fp8_flops else 0.0
        wgrad = matmul_seconds(
            hw, dense - work.expert_flops - work.logits_flops, work.fp8_flops - fp8_experts
        )
        beside = _exchange_seconds(
            fwd - e_fwd - logits, bwd - e_bwd - e_rerun - 2 * logits, wgrad,
            e_fwd, e_bwd, e_rerun, work.expert_layer_share,
        )  # fmt: skip
        q, q_held = ex / (4 * m), ex_held / (4 * m)  # one of the four, per micro-batch
        hidden_ex = sum(overlap_seconds(c, q, q_held) for c in beside) / v
        ex_exposed = paired * hidden_ex + (v * m - paired) * alone
    slot = chunk + alone + 2 * p2p_one
    pipeline = (v * m + p - 1) * (chunk + 2 * p2p_one) + (p - 1) * alone + ex_exposed
    p2p_exposed = 2 * v * m * p2p_one
    if hw.pp_overlap and p > 1:
        # The steady phase's v m chunks send and receive beside the next chunk's compute
        # (Megatron's overlap_p2p_comm): what the transfers add is what the chunk does not
        # cover, or the compute their multiprocessors take; the fill's and the flush's
        # p - 1 slots keep theirs on the critical path.
        hidden = overlap_seconds(chunk, 2 * p2p_one, 2 * p2p_one * work.p2p_held)
        pipeline = v * m * (chunk + hidden) + (p - 1) * slot + ex_exposed
        p2p_exposed = v * m * hidden
    # The collectives of one class share its window: they go over the same links one after
    # another, so what exceeds the window in all is exposed.
    # On a GPU each holds some of the multiprocessors while it runs, and the compute beside
    # it goes at the rest of its rate (overlap_seconds).
    data = sum(seconds for _, seconds, _, _ in load.by_class)
    exposed = added = 0.0
    for cls, seconds, held, forward in load.by_class:
        # the windows each repetition hides behind, with the seconds (and held seconds) each
        # hides, and how often it repeats
        n = m if cls in (PER_MICROBATCH_FWD_BWD, PER_MICROBATCH_BWD) else 1
        if cls == PER_MICROBATCH_FWD_BWD:
            # FSDP's: the forward's gathers behind the forward, the rest behind the backward
            # (behind the forward alone without one), or alone (``fsdp_overlap`` unset)
            share = forward / seconds if seconds and work.train else 1.0
            on = 1.0 if hw.fsdp_overlap else 0.0
            windows = [(on * fwd, share), (on * bwd, 1.0 - share)]
        else:
            windows = [(bwd if cls in (PER_MICROBATCH_BWD, PER_STEP_BWD) else fwd, 1.0)]
        for window, part in windows:
            if part:
                exposed += n * max(0.0, part * seconds / n - window)
                added += n * overlap_seconds(window, part * seconds / n, part * held / n)
    optimizer = stream_seconds(hw, work.optimizer_params * OPTIMIZER_BYTES) if work.train else 0.0
    if work.train and work.host_optimizer_bytes:
        # In from the host before the update and back after it, after the last backward.
        optimizer += 2 * work.host_optimizer_bytes / work.host_bandwidth
    # the weights' fp8 copies, made once on the stage's first micro-batch
    once = stream_seconds(hw, work.cast_step_bytes) if work.cast_step_bytes else 0.0
    step = pipeline + added + optimizer + once
    compute = m * (fwd + bwd) + once
    return StepTime(
        compute_s=compute,
        tp_comm_s=tp + ring_s,
        data_comm_s=data,
        data_exposed_s=exposed,
        p2p_s=2 * v * m * p2p_one,
        bubble_s=(p - 1) * slot,
        optimizer_s=optimizer,
        step_s=step,
        mfu=work.model_flops / (work.devices * hw.peak_flops * step) if step > 0 else 0.0,
        bubble_fraction=(p - 1) / (v * m + p - 1),
        offload_s=2 * m * host,
        contention_s=added - exposed,
        tp_exposed_s=m * tp_exposed + ex_exposed,
        p2p_exposed_s=p2p_exposed,
        routing_s=m * (route_fwd + route_bwd),
    )


def _exchange_seconds(
    rest_fwd: float,
    rest_bwd: float,
    rest_wgrad: float,
    experts_fwd: float,
    experts_bwd: float,
    experts_rerun: float,
    share: float,
) -> tuple[float, float, float, float]:
    """The compute Megatron-Core's combined 1F1B schedule runs beside each of a mixture
    layer's four all-to-alls, summed over a micro-batch's layers with experts (``share``
    of its layers), when one micro-batch's forward of a layer runs with another's backward
    of a layer (``schedule_layer_1f1b``, ``--overlap-moe-expert-parallel-comm`` with the
    ``--delay-wgrad-compute`` the recipes set beside it; sources in
    :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`). Its sub-modules take
    turns on a compute and a communication stream, and each waits for the one before it of
    its own micro-batch, so a layer is four pairs, each as long as the longer of its two:

    1. the backward's combine beside the forward's attention and router (``rest_fwd``:
       the forward but the experts' matmuls and the output layer's), with the previous
       layer's delayed weight gradients of the same (``rest_wgrad``);
    2. the forward's dispatch beside the experts' backward, input gradients
       (``experts_bwd / 2``) and the experts recomputed (``experts_rerun``);
    3. the backward's dispatch beside the experts' delayed weight gradients
       (``experts_bwd / 2``) and the forward's experts (``experts_fwd``);
    4. the forward's combine beside the backward's router and attention (``rest_bwd`` but
       their weight gradients).

    A layer without experts has no all-to-all: its compute, the output layer's and the
    embedding's run with nothing beside them.

    >>> _exchange_seconds(4.0, 8.0, 2.0, 3.0, 6.0, 0.0, 0.5)
    (3.0, 3.0, 6.0, 3.0)
    """
    wgrad = min(share * rest_wgrad, share * max(0.0, rest_bwd))
    return (
        share * max(0.0, rest_fwd) + wgrad,
        experts_bwd / 2 + experts_rerun,
        experts_bwd / 2 + experts_fwd,
        share * max(0.0, rest_bwd) - wgrad,
    )


def _unpaired_chunks(p: int, v: int, m: int) -> int:
    """The model chunks of a step, each a micro-batch's forward and backward on one
    device, whose forward (and, as many, whose backward) Megatron's combined 1F1B runs
    alone, not beside another chunk: without a pipeline the first forward and the last
    backward (one chunk's worth); with one, the first stage's warm-up forwards and the
    cool-down backwards as many, ``p - 1`` of them plain, ``2 (p - 1) + (v - 1) p``
    interleaved, and one more under the overlap
    (``forward_backward_pipelining_with_interleaving``); at most all ``v m``.

    >>> _unpaired_chunks(1, 1, 8), _unpaired_chunks(4, 1, 8), _unpaired_chunks(8, 4, 128)
    (1, 4, 39)
    """
    if p == 1:
        return 1
    warm = p - 1 if v == 1 else 2 * (p - 1) + (v - 1) * p
    return min(v * m, warm + 1)


def ring_seconds(hw: Hardware, work: StepWork, transfers_s: float, held_s: float) -> float:
    """What context parallelism's ring adds to one micro-batch: its transfers
    (``transfers_s``, every step's; ``held_s`` their seconds times the multiprocessors'
    share they hold) beside the attention of the chunks in hand. Each layer's ``c - 1`` steps
    of a pass each run beside one chunk's attention, ``1 / c`` of the layer's attention core
    (the last chunk's has no transfer beside it), so the transfers hide behind ``(c - 1) /
    c`` of the micro-batch's attention core, forward, backward and recomputed, the core
    priced as the rest of the step prices it (a fused kernel's rates where the hardware
    names them and the program's attention is blocked, else the matmul rate); the steps
    taken alike, what exceeds it is exposed
    (:func:`~shardscope._src.cost.compute.overlap_seconds`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> w = StepWork(
    ...     microbatches=1, stages=1, fwd_flops=0.0, recompute_flops=0.0, act_bytes=0,
    ...     recompute_act_bytes=0, p2p_bytes=0, p2p_bandwidth=1, optimizer_params=0,
    ...     model_flops=0, devices=1, ring_shards=4, ring_core_flops=1e12,
    ... )
    >>> h100 = hardware("h100")
    >>> core = 3 * 1e12 / (h100.peak_flops * h100.matmul_fraction)  # forward and backward
    >>> ring_seconds(h100, w, 0.75 * core + 1e-3, 0.0) == 1e-3  # 1 ms beyond 3/4 of it
    True
    """
    c = work.ring_shards
    if c < 2 or transfers_s <= 0:
        return 0.0
    if hw.attention_fwd_flops > 0 and work.attention_flops > 0:
        core = fused_attention_seconds(hw, work.ring_core_flops)
        if work.train:
            core += fused_attention_seconds(hw, work.ring_core_flops, backward=True)
            core += fused_attention_seconds(hw, work.ring_rerun_flops)
    elif work.train:
        # the forward's matmuls, the backward's two for each, and the recomputed ones
        core = matmul_seconds(hw, 3 * work.ring_core_flops + work.ring_rerun_flops)
    else:
        core = matmul_seconds(hw, work.ring_core_flops)
    return overlap_seconds((c - 1) / c * core, transfers_s, held_s)


def describe(hw: Hardware, matmul_dtype: str = MatmulDtype.BFLOAT16) -> dict[str, Any]:
    """The constants the time model used, for the JSON and the report (the fp8 rate and
    fraction when the layers' matmuls run in fp8, a fused attention kernel's rates where
    the hardware names them, the multiprocessors a GPU's collectives hold)."""
    constants = {
        "matmul_fraction": hw.matmul_fraction,
        "hbm_bandwidth": hw.hbm_bandwidth,
        "hbm_fraction": hw.hbm_fraction,
        "comm_fraction": hw.comm_fraction,
        "hbm_passes": HBM_PASSES,
        "optimizer_bytes_per_param": OPTIMIZER_BYTES,
        "latency_s": hw.latency_s,
    }
    if hw.hbm_by_size:  # a matmul's bandwidth by the bytes it moves, not the fraction
        del constants["hbm_fraction"]
        constants["hbm_by_size"] = True
    if matmul_dtype == MatmulDtype.FP8:
        constants.update(
            fp8_peak_flops=hw.fp8_peak_flops, fp8_matmul_fraction=hw.fp8_matmul_fraction
        )
    if hw.attention_fwd_flops > 0:
        constants.update(
            attention_fwd_flops=hw.attention_fwd_flops, attention_bwd_flops=hw.attention_bwd_flops
        )
    if hw.comm_sms or hw.comm_sms_net:
        constants.update(sms=hw.sms, comm_sms=hw.comm_sms, comm_sms_net=hw.comm_sms_net)
    if hw.exchange_sms:
        constants.update(sms=hw.sms, exchange_sms=hw.exchange_sms)
    return constants


# -- what a plan does, from its strategy, schedule and mesh ------------------------------------


def classify(kind: str, axes: Sequence[str], placement: Placement) -> OverlapClass:
    """The overlap class of a collective over ``axes`` of ``placement``'s program."""
    model_axes = set(placement.axes.get(Role.MODEL, ()))
    context_axes = set(placement.axes.get(Role.CONTEXT, ()))
    if axes and set(axes) <= model_axes:
        return CRITICAL
    if kind == ALL_TO_ALL:
        # a mixture of experts' dispatch and combine: the experts wait for their tokens,
        # the next layer for their outputs
        return CRITICAL
    if kind == COLLECTIVE_PERMUTE and axes and set(axes) <= context_axes:
        # Context parallelism's ring: each step beside the attention of the chunk in hand.
        return CONTEXT_RING
    if axes and set(axes) <= context_axes and kind != ALL_REDUCE:
        # Context parallelism's keys and values, gathered and their gradients scattered:
        # the layer's attention waits for them. An all-reduce over 'context' alone sums
        # gradients (a compiler that reduces one axis at a time, as XLA:CPU does).
        return CRITICAL
    s = placement.strategy
    if kind == ALL_GATHER and s.updates_shards and not set(axes) & model_axes:
        return PER_STEP_FWD
    if s.shards_weights and kind in (ALL_GATHER, REDUCE_SCATTER):
        return PER_MICROBATCH_FWD_BWD
    if kind == REDUCE_SCATTER:
        return PER_MICROBATCH_BWD
    return PER_STEP_BWD


# the screen asks it of every candidate, of a handful of policies
@functools.lru_cache(maxsize=256)
def reruns_forward_collectives(remat: str) -> bool:
    """Whether a train step under ``remat`` runs its forward's collectives again for the
    backward: where it computes the out-projection or the MLP's down-projection again
    (:attr:`~shardscope._src.model.remat.RematPolicy.reruns_forward_collectives`: full
    recomputation and offload do; the rest keep what the backward needs and gather only
    FSDP's weights again)."""
    return remat_policy(remat).reruns_forward_collectives


def step_bound(
    placement: Placement,
    schedule: Schedule,
    mode: str = Mode.TRAIN,
    *,
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> Bound:
    """The communication one step of ``placement``'s program needs under ``schedule``:
    :func:`~shardscope._src.bounds.transformer.transformer_bound` of one micro-batch, repeated
    per micro-batch, except the terms a step runs once: ZeRO's gather of the updated
    parameters, the all-reduce of replicated gradients and of the loss, and a reduce-scatter
    of gradients that each device adds up over the micro-batches: ZeRO-1's, which the
    reference program accumulates locally and reduces once a step, as Megatron-LM's
    distributed optimizer does, over the data axes and, under context parallelism, the
    context axis too: each context shard adds up the partial gradients of its part of the
    sequences (:func:`~shardscope._src.sharding.programs.accumulated_roles`), and a
    mixture's dense weights' over the expert axes too where they are replicated there
    (:func:`~shardscope._src.sharding.programs.dense_local_roles`: ZeRO-1 with expert
    parallelism, as Megatron-LM's distributed optimizer reduces them over data x expert once;
    the routed experts' gradients are never reduced over ``expert``). Under sequence
    parallelism the sums over ``model`` (the norms' gains, the loss) are once a step where
    each model shard adds up its own, as Megatron-LM's ``finalize_model_grads`` sums the
    norms' (:func:`~shardscope._src.sharding.programs.local_sequence`), and after every
    micro-batch where the program sums them so (a mixture of experts);
    under full recomputation (and offload) the recomputed forward's collectives again;
    otherwise the layers' FSDP gathers again for the backward, and context parallelism's keys
    and values. ``parts``: what earlier calls on the same placement and mode worked out (one
    micro-batch's placement and its bounds depend only on the micro-batch count)."""

    m = schedule.microbatches if mode == Mode.TRAIN else 1
    known = {} if parts is None else parts

    def part(key: tuple[Any, ...], make: Callable[[], _T]) -> _T:
        return _kept(known, key, make)

    def once(t: Term, local: set[str], dense: set[str], model: set[str]) -> bool:
        if t.role.sums_token_shards and set(t.axes) & model:
            # sequence parallelism's sums over 'model': once where each model shard adds up
            # its own over the micro-batches, else after every micro-batch
            return model <= local
        # a reduce-scatter over an expert axis is of the dense weights' gradients alone:
        # once where they are replicated over its roles
        scattered_once = t.role == TermRole.GRADIENT_SCATTER and set(t.axes) <= dense
        return t.role.once_per_step or scattered_once

    def repeated(terms: Sequence[Term]) -> tuple[Term, ...]:
        local = set(placement.group(accumulated_roles(placement))[0])
        dense = local | set(placement.group(dense_local_roles(placement))[0])
        model = set(placement.axes.get(Role.MODEL, ()))
        return tuple(
            t if m == 1 or once(t, local, dense, model) else replace(t, count=t.count * m)
            for t in terms
        )

    def micro_batch() -> Placement:
        if m == 1:
            return placement
        return placement.strategy.place(
            replace(placement.config, batch=placement.config.batch // m),
            placement.mesh,
            axes=placement.axes,
            constraints=placement.constraints,
        )

    def one() -> Placement:
        return part(("placement", m), micro_batch)

    base = part(("bound", m, mode), lambda: transformer_bound(one(), mode))
    terms = part(("repeated", m, mode), lambda: repeated(base.terms))
    again: tuple[Term, ...] = ()
    if mode == Mode.TRAIN and reruns_forward_collectives(schedule.remat):

        def recomputed() -> tuple[Term, ...]:
            forward = part(
                ("bound", m, Mode.FORWARD), lambda: transformer_bound(one(), Mode.FORWARD)
            )
            return tuple(_rerun(t, m, "recomputed forward") for t in forward.terms)

        again = part(("recomputed", m), recomputed)
    elif mode == Mode.TRAIN:
        # The layers' weights gathered at use (FSDP) are gathered again for the backward, as
        # PyTorch FSDP and ZeRO-3 do, rather than kept for it (the bound's minimum); so are
        # context parallelism's keys and values.
        again = part(
            ("regathered", m),
            lambda: tuple(_rerun(t, m, "again for the backward") for t in regathered_terms(one())),
        )
    return Bound(base.label, terms + again, base.notes)


def _kept(known: dict[tuple[Any, ...], Any], key: tuple[Any, ...], make: Callable[[], _T]) -> _T:
    """``known[key]``, made (``make()``) and kept there the first time it is asked for."""
    if key not in known:
        known[key] = make()
    return cast(_T, known[key])


def _rerun(t: Term, microbatches: int, rerun: str) -> Term:
    """``t`` run again in pass ``rerun`` of each of the ``microbatches``."""
    return replace(t, count=t.count * microbatches, what=f"{t.what} ({rerun})", rerun=rerun)


def step_work(
    placement: Placement,
    schedule: Schedule,
    full_config: ModelConfig,
    devices: int,
    hw: Hardware,
    *,
    flash_attention: bool,
    mode: str = Mode.TRAIN,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    matmul_dtype: str = MatmulDtype.BFLOAT16,
    fp8_saved_inputs: str | None = None,
    fp8_params: int | None = None,
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> StepWork:
    """The work of one device on the slowest stage (the one with the unembedding) of a step
    of ``placement``'s program (one stage's layers, the whole batch) under ``schedule``;
    with ``matmul_dtype="fp8"`` the layers' matmul FLOPs that run in fp8 and the bytes of
    their casts (see the module docstring), the weights' once a pass, or once a step with
    ``fp8_saved_inputs="fp8"`` (Transformer Engine's,
    :func:`~shardscope._src.plan.estimates.fp8_weight_cast_bytes`); with ``fp8_params``
    (the weights kept in fp8) the optimizer's cast of its master shard and the gathered
    weights' transpose instead
    (:func:`~shardscope._src.plan.estimates.fp8_param_cast_bytes`), and ZeRO's gather of
    updated parameters moving the fp8 weights at one byte (:attr:`StepWork.fp8_param_share`).
    Interleaved, the device
    runs the same layers in ``virtual_stages`` chunks: the same work, in more, shorter slots
    (:func:`step_time`). ``parts``: what earlier calls on the same placement worked out (the
    work of schedules with the same micro-batches and recomputation, which differ only in
    their model chunks and where the optimizer state lives)."""

    known = {} if parts is None else parts
    key = (
        "work", schedule.microbatches, schedule.remat, schedule.stages, full_config, devices,
        hw, flash_attention, mode, matmul_dtype, fp8_saved_inputs, schedule.stage,
        schedule.offload_layers, fp8_params, schedule.virtual_stages if fp8_params else 0,
    )  # fmt: skip
    # the optimizer state's elements a device of the stage updates: the placement's
    optimizer_key = ("optimizer elements", schedule.stages, schedule.stage)
    if optimizer_key not in known:
        rules = placement.strategy.optimizer_rules()
        known[optimizer_key] = stage_elements_per_device(
            placement, rules, schedule.stages, schedule.stage
        )
    optimizer_params: int = known[optimizer_key]
    work: StepWork | None = known.get(key)
    if work is None:
        work = known[key] = _pass_work(
            placement, schedule, full_config, devices, hw, flash_attention, mode, matmul_dtype,
            fp8_saved_inputs, optimizer_params, fp8_params, known,
        )  # fmt: skip
    host_optimizer = 0
    if schedule.offload_optimizer:
        host_optimizer = optimizer_params * (bytes_per_param - 2 * placement.config.itemsize)
    if work.virtual_stages == schedule.virtual_stages and not host_optimizer:
        return work
    return replace(
        work, virtual_stages=schedule.virtual_stages, host_optimizer_bytes=host_optimizer
    )


def _pass_work(
    placement: Placement,
    schedule: Schedule,
    full_config: ModelConfig,
    devices: int,
    hw: Hardware,
    flash_attention: bool,
    mode: str,
    matmul_dtype: str,
    fp8_saved_inputs: str | None,
    optimizer_params: int,
    fp8_params: int | None,
    known: dict[tuple[Any, ...], Any],
) -> StepWork:
    """:func:`step_work` of one model chunk per device, its optimizer state on the device
    (``optimizer_params`` its elements); ``known``: :func:`step_work`'s ``parts``, where the
    routed experts' pieces are kept for the placement's other recomputations (they depend on
    the micro-batches alone)."""

    c = placement.config
    m, p = schedule.microbatches, schedule.stages
    t = model_ways(placement)
    tokens = tokens_per_device(placement, m)  # each device's own tokens (s / c of a sequence)
    # one layer's matmuls on average (a mixture of experts' layers are of two kinds)
    split, whole = matmul_params_per_token(placement)
    layer = weight_flops(split / t + whole, tokens) / c.layers
    # a mixture's routers (``whole``; 0 for a dense model): 16-bit under fp8 (Megatron-Core's
    # moe_router_dtype), and run again under every policy that keeps not everything (their
    # logits are named by none)
    router = weight_flops(whole, tokens) / c.layers if whole else 0.0
    # QK^T and PV, non-causal as Eq. 7 counts (latent attention: queries and keys of
    # qk_head_dim, values of value_head_dim)
    core = attention_core_flops(c, tokens, c.seq) / t
    own = logits_model_split(placement)  # sequence parallelism or a vocabulary split
    # the output layer's vocabulary: on the planned stage, or on a split's last stage alone
    vocab = (c.vocab or 0) if schedule.stage is None or schedule.stage.output else 0
    logits = weight_flops(c.d_model * vocab, tokens) / own
    fwd = c.layers * (layer + core) + logits
    policy = remat_policy(schedule.remat)
    # The recomputed forward: each projection with an output the policy recomputes runs
    # again (producer_params: the weights of each), and the attention core when its output
    # is recomputed; a policy that keeps everything runs nothing again but, selective
    # without memory-efficient attention, the attention core (Korthikanti et al.).
    rerun_ops = policy.rerun_producers()
    weights = producer_params(c)
    # the projections the model has (a GELU MLP has no mlp_in_1)
    present = [op for op in PROJECTIONS if weights[op]]
    again_ops = [op for op in present if op in rerun_ops]
    kept_ops = [op for op in present if op not in rerun_ops]
    if not kept_ops:
        matmuls = layer  # the whole layer's (a mixture of experts' routers and experts too)
    elif not again_ops:
        matmuls = router
    else:
        matmuls = layer - weight_flops(sum(weights[op] for op in kept_ops), tokens) / t
    if policy.keeps_everything:
        core_rerun = schedule.remat == Remat.SELECTIVE and not flash_attention
        again = c.layers * core if core_rerun else 0.0
    elif core_rerun := "core" in rerun_ops:
        again = c.layers * (matmuls + core)
    else:
        again = c.layers * matmuls
    rerun = c.layers * core if core_rerun else 0.0  # the attention core run again
    if flash_attention:
        again += c.layers * core / 2  # the blocked backward recomputes QK^T
    per_layer = activation_bytes_per_layer(
        placement, flash_attention=flash_attention, microbatches=m
    )
    logit_bytes = tokens * vocab * 2 * c.itemsize / own  # the logits, their gradient
    host_bytes = 0
    if policy.offloaded:
        host_bytes = c.layers * offloaded_bytes_per_layer(placement, m, schedule.remat)
    layers_host = 0
    if schedule.offload_layers:
        # what each of those layers keeps, out in its forward and back in its backward
        layers_host = schedule.offload_layers * stored_activation_bytes_per_layer(
            placement,
            Schedule(m, schedule.remat),
            flash_attention=flash_attention,
            fp8_saved=fp8_saved_inputs == Fp8SavedInputs.FP8,
        )
    if policy.keeps_everything:
        again_bytes = 0
        if schedule.remat == Remat.SELECTIVE and not flash_attention:
            dense = activation_bytes_per_layer(placement, flash_attention=False, microbatches=m)
            flash = activation_bytes_per_layer(placement, flash_attention=True, microbatches=m)
            again_bytes = c.layers * (dense - flash)
    elif policy.keeps_only_input:
        # the whole layer's forward again: Table 2's tensors, its input read again with them
        again_bytes = c.layers * per_layer
    else:
        # the element-wise work between the kept and offloaded tensors, again
        kept = named_tensor_bytes(placement, policy.on_device, m)
        again_bytes = max(0, c.layers * max(0, per_layer - kept) - host_bytes)
    fp8 = check_matmul_dtype(matmul_dtype, hw) == MatmulDtype.FP8
    fp8_work: dict[str, Any] = {"matmul_dtype": MatmulDtype.FP8} if fp8 else {}
    expert_flops, expert_weights = _kept(
        known, ("routed experts", m), lambda: routed_expert_work(placement, m)
    )
    # the routed experts' share run again: each of their matmuls that runs again (the gate,
    # the up and the down-projection, d x f each; GELU's one up-projection and its down)
    experts_again = [op for op in again_ops if op in (*MLP_IN, "mlp_out")]
    recomputes_experts = bool(experts_again)
    expert_share = len(experts_again) * c.d_model * (c.expert_ff or c.ff) / expert_mlp_params(c)
    routing = expert_routing(placement, m, dropless=full_config.capacity_factor is None)
    route: dict[str, Any] = {}
    if routing is not None:
        # the experts run again from the layer's recomputed input: routed again
        rerouted = recomputes_experts
        route = {
            "routing_bytes": c.moe_layers * routing.forward_bytes(),
            "routing_bwd_bytes": c.moe_layers * routing.backward_bytes(),
            "routing_recompute_bytes": c.moe_layers * routing.forward_bytes() if rerouted else 0.0,
            "host_syncs": c.moe_layers,
            "host_recompute_syncs": c.moe_layers if rerouted else 0,
        }
    if fp8:
        # Transformer Engine's weights: cast once a step, not in each pass
        cached = fp8_saved_inputs == Fp8SavedInputs.FP8
        cast_fwd, cast_bwd = fp8_cast_elements_per_layer(placement, m, weights_cached=cached)
        if not again_ops:
            fp8_again, cast_again = 0.0, 0.0
        elif not kept_ops:
            fp8_again, cast_again = c.layers * (layer - router), c.layers * cast_fwd
        else:
            rest = fp8_cast_elements_per_layer(placement, m, kept=kept_ops, weights_cached=cached)[
                0
            ]
            fp8_again, cast_again = c.layers * (matmuls - router), c.layers * rest
        weights_once = c.layers * fp8_weight_elements_per_layer(placement) if cached else 0.0
        cast_once = fp8_weight_cast_bytes(weights_once, c.itemsize)
        if fp8_params is not None:
            cast_once, share = _fp8_param_work(placement, schedule, fp8_params)
            fp8_work["fp8_param_share"] = share
        fp8_work.update(
            fp8_flops=c.layers * (layer - router),
            fp8_recompute_flops=fp8_again,
            cast_bytes=fp8_cast_bytes(c.layers * cast_fwd, c.itemsize),
            cast_bwd_bytes=fp8_cast_bytes(c.layers * cast_bwd, c.itemsize),
            cast_recompute_bytes=fp8_cast_bytes(cast_again, c.itemsize),
            cast_step_bytes=cast_once,
        )
    p2p_bw = stage_bandwidth(hw, devices // p)
    return StepWork(
        microbatches=m,
        stages=p,
        fwd_flops=fwd,
        recompute_flops=again,
        act_bytes=c.layers * per_layer + logit_bytes,
        recompute_act_bytes=again_bytes,
        p2p_bytes=tokens * c.d_model * c.itemsize / t,
        p2p_bandwidth=p2p_bw,
        p2p_held=stage_held_share(hw, devices // p),
        optimizer_params=optimizer_params,
        model_flops=model_flops(full_config, mode),
        devices=devices,
        train=mode == Mode.TRAIN,
        host_bytes=host_bytes + layers_host,
        host_bandwidth=hw.host_bandwidth,
        host_optimizer_bytes=0,
        **fp8_work,
        expert_flops=expert_flops,
        expert_recompute_flops=expert_flops * expert_share if recomputes_experts else 0.0,
        # memory-efficient attention is the fused kernel a hardware's rates describe
        attention_flops=c.layers * core if flash_attention else 0.0,
        attention_rerun_flops=rerun if flash_attention else 0.0,
        # the weights as the matmuls read them: 16-bit, or their fp8 copies
        expert_weight_bytes=expert_weights * (FP8_ITEMSIZE if fp8 else c.itemsize),
        expert_weight_kernels=c.moe_layers
        * _kept(known, ("expert weights",), lambda: len(expert_weight_elements(placement))),
        **_kept(known, ("expert shares", hw, m), lambda: _expert_shares(hw, placement, m)),
        **_ring_work(placement, c.layers * core, rerun),
        **route,
        logits_flops=logits,
        expert_layer_share=c.moe_layers / c.layers if c.layers else 0.0,
    )


def _fp8_param_work(
    placement: Placement, schedule: Schedule, fp8_params: int
) -> tuple[float, float]:
    """``(cast_step_bytes, fp8_param_share)`` of a step whose layers keep their linear weights
    in fp8 but ``fp8_params`` layers at each end
    (:func:`~shardscope._src.plan.estimates.bf16_end_layers`): the optimizer's cast of the
    device's master shard of the fp8 weights and the transpose of those it runs
    (:func:`~shardscope._src.plan.estimates.fp8_param_cast_bytes`), and the share of the
    stage's parameters (as its devices store them) that are fp8 weights, which ZeRO's
    all-gather of updated parameters moves at one byte an element."""
    c = placement.config
    s = placement.strategy
    bf16 = bf16_end_layers(
        c.layers, fp8_params, schedule.stages, schedule.stage, schedule.virtual_stages
    )
    fp8_layers = c.layers - bf16
    used = fp8_layers * fp8_weight_elements_per_layer(placement)
    shard = fp8_param_elements(placement, s.optimizer_rules(), bf16)
    stored = fp8_param_elements(placement, s.param_rules(), bf16)
    every = stage_elements_per_device(placement, s.param_rules(), schedule.stages, schedule.stage)
    return fp8_param_cast_bytes(shard, used, c.itemsize), stored / every if every else 0.0


def _expert_shares(hw: Hardware, placement: Placement, microbatches: int) -> dict[str, Any]:
    """:class:`StepWork`'s shares of the flat rate the routed experts' matmuls reach at their
    shapes (:func:`~shardscope._src.plan.estimates.expert_gemms`), where the hardware
    measures matmuls by shape and the model has experts (none else: the flat rate)."""
    if not hw.matmul_by_shape or not placement.config.is_moe:
        return {}
    fwd, bwd = expert_gemms(placement, microbatches)
    return {
        "expert_fwd_share": gemms_efficiency(hw, fwd, measured=True),
        "expert_bwd_share": gemms_efficiency(hw, bwd, measured=True),
    }


def _ring_work(placement: Placement, core: float, rerun: float) -> dict[str, Any]:
    """:class:`StepWork`'s ring fields under context parallelism's ring form (none else)."""
    if not placement.strategy.context_ring:
        return {}
    c = placement.role_size(Role.CONTEXT)
    return {"ring_shards": c, "ring_core_flops": core, "ring_rerun_flops": rerun}


def gathered_bytes(
    kind: str,
    cls: OverlapClass,
    traffic: float,
    placement: Placement,
    fp8_gathers: bool,
    fp8_param_share: float = 0.0,
) -> float:
    """The bytes a collective of ``traffic`` 16-bit bytes moves when FSDP gathers its weights
    in fp8 (``fp8_gathers``): its all-gathers of the per-micro-batch class (FSDP's weights)
    move one byte per element (torchtitan's ``enable_fsdp_float8_all_gather`` casts each
    shard before the gather); every other collective is unchanged (gradients, ZeRO's gather
    of updated parameters and the tensor-parallel ones stay 16-bit). The one home of that
    rule: the formula's terms and the compiled program's collectives are priced by it.

    ``fp8_param_share``: the share of ZeRO's gathered parameters that are kept in fp8
    (``fp8_params``: Megatron-Core's ``fp8_param_gather``, whose parameter buffer of
    Transformer Engine's fp8 weights is ``torch.uint8``); its all-gathers of updated
    parameters move those at one byte an element, the rest (norms, embedding, output layer,
    the layers kept 16-bit) at the model's dtype."""
    item = placement.config.itemsize
    if fp8_gathers and kind == ALL_GATHER and cls == PER_MICROBATCH_FWD_BWD:
        return traffic * FP8_ITEMSIZE / item
    if fp8_param_share and kind == ALL_GATHER and cls == PER_STEP_FWD:
        return traffic * (1 - fp8_param_share * (item - FP8_ITEMSIZE) / item)
    return traffic


def comm_items(
    hw: Hardware,
    placement: Placement,
    terms: Sequence[Term],
    *,
    fp8_gathers: bool = False,
    fp8_param_share: float = 0.0,
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> list[CommItem]:
    """The terms of ``placement``'s program (a :class:`Bound`'s), timed and classified;
    ``fp8_gathers``: FSDP's weight gathers in fp8, ``fp8_param_share``: ZeRO's gathered
    parameters' share in fp8 (:func:`gathered_bytes`). ``parts``: the
    terms and collectives earlier calls on the same placement priced (a sweep's schedules
    share most of their terms).

    A layer's weights are gathered, and their gradients reduce-scattered, together: one
    collective a layer and a pass over each group of devices, as PyTorch FSDP gathers the
    flat parameter of each wrapped layer. The terms of one layer, pass and group (the same
    kind, axes, executions, pass and stack of layers) are timed as one collective of their
    bytes: the latency once, not once a weight (on 1,024 devices a ring's 1,023 steps of
    latency each). XLA's combiners merge part of them (the H100 compile of DeepSeek-V3's
    ``fsdp_ep`` on 1,024 devices issues about five gathers over ``data`` x ``expert`` a
    layer and a pass, for eight weights); a compiled plan is priced by the collectives its
    program issues.
    """

    sizes = mesh_axes(placement.mesh)
    # what earlier calls priced with this hardware and these gathers, looked up once a call
    # rather than once a term (the hardware's hash is its every field's)
    known = {} if parts is None else parts
    priced_here = known.setdefault(("comm", fp8_gathers, fp8_param_share, hw), {})
    items = []
    together: dict[tuple[Any, ...], tuple[list[str], float]] = {}
    for t in terms:
        priced = priced_here.get(t)
        if priced is None:
            cls = classify(t.kind, t.axes, placement)
            traffic = gathered_bytes(
                t.kind, cls, t.traffic_bytes, placement, fp8_gathers, fp8_param_share
            )
            item = None
            if t.role not in (TermRole.WEIGHT_GATHER, TermRole.GRADIENT_SCATTER):
                item = _item(
                    t.what, cls, hw, sizes, t.kind, t.axes, t.group_size, traffic, t.count,
                    once_per_node=t.once_per_node,
                )  # fmt: skip
            priced = priced_here[t] = (cls, traffic, item)
        cls, traffic, item = priced
        if item is None:  # timed with the rest of its layer's, pass's and group's
            key: tuple[Any, ...] = (t.kind, t.axes, t.group_size, t.count, t.rerun, t.stack, cls)
            names, sent = together.setdefault(key, ([], 0.0))
            together[key] = ([*names, t.what], sent + traffic)
            continue
        items.append(item)
    for (kind, axes, group, count, rerun, _, cls), (names, sent) in together.items():
        what = "; ".join(names)
        key = ("together", what, cls, kind, axes, group, sent, count)
        item = priced_here.get(key)
        if item is None:
            item = _item(what, cls, hw, sizes, kind, axes, group, sent, count)
            if kind == ALL_GATHER and not rerun and cls == PER_MICROBATCH_FWD_BWD:
                # FSDP's weights gathered at their use in the forward (the backward's again
                # are the terms it reruns)
                item = replace(item, forward_s=item.seconds)
            priced_here[key] = item
        items.append(item)
    return items


def _item(
    what: str,
    cls: OverlapClass,
    hw: Hardware,
    sizes: Mapping[str, int],
    kind: str,
    axes: Sequence[str],
    group_size: int,
    traffic: float,
    count: int,
    *,
    once_per_node: tuple[int, ...] = (),
) -> CommItem:
    """One :class:`CommItem`: the collectives' time by the one pricing
    (:func:`~shardscope._src.cost.links.collective_seconds`) and the share of the
    multiprocessors they hold (:func:`~shardscope._src.cost.links.held_share`)."""
    seconds = collective_seconds(
        hw, sizes, kind, axes, group_size, traffic, count, once_per_node=once_per_node
    )
    return CommItem(what, cls, seconds, held_share(hw, sizes, axes, kind), kind)


def compiled_comm_items(
    hw: Hardware,
    placement: Placement,
    collectives: Sequence[PlanCollective],
    bound: Bound,
    *,
    reduce_scatter_for_all_reduce: bool = False,
    fp8_gathers: bool = False,
    fp8_param_share: float = 0.0,
) -> list[CommItem]:
    """A compiled program's collectives (one step's, every execution counted), timed by the
    one pricing and classified as :func:`classify` classifies the formula's terms.

    ``fp8_gathers``: the program's FSDP all-gathers over the data axes are priced at the
    bytes of fp8 weights (:func:`gathered_bytes`), as the formula's are: the compiled
    program gathers 16-bit weights (the reference program runs no fp8 matmul); and
    ``fp8_param_share`` of ZeRO's gathered parameters in fp8 (``fp8_params``), likewise.

    ``reduce_scatter_for_all_reduce``: the program comes from a compiler that forms no
    reduce-scatter (it all-reduces and slices, twice the bytes) while the hardware's own
    compiler forms one: up to the formula's reduce-scatter bytes on the same axes, the
    all-reduces are priced as the reduce-scatters the hardware's compiler emits.
    """
    sizes = mesh_axes(placement.mesh)
    # All-reduce bytes (twice a reduce-scatter's) that stand for a reduce-scatter, per axes.
    budget: dict[tuple[str, ...], float] = {}
    # FSDP's gather bytes the formula runs in the forward, per axes: the program's gathers
    # of that class are the forward's up to them, the backward's beyond
    forward: dict[tuple[str, ...], float] = {}
    for t in bound.terms:
        if reduce_scatter_for_all_reduce and t.kind == REDUCE_SCATTER:
            budget[t.axes] = budget.get(t.axes, 0.0) + 2 * t.traffic_bytes
        if t.role is TermRole.WEIGHT_GATHER and not t.rerun:
            forward[t.axes] = forward.get(t.axes, 0.0) + t.traffic_bytes
    items = []
    for c in collectives:
        axes = () if c.irregular else c.axes
        traffic, kind = float(c.traffic_bytes), c.kind
        as_scatter = min(traffic, budget.get(axes, 0.0)) if kind == ALL_REDUCE else 0.0
        if as_scatter:
            budget[axes] -= as_scatter
            cls = classify(REDUCE_SCATTER, axes, placement)
            items.append(
                _item(
                    c.op_name or kind, cls, hw, sizes, REDUCE_SCATTER, axes, c.group_size,
                    as_scatter / 2, c.count,
                )
            )  # fmt: skip
            traffic -= as_scatter
        if traffic > 0:
            cls = classify(kind, axes, placement)
            ahead = 0.0
            if kind == ALL_GATHER and cls == PER_MICROBATCH_FWD_BWD:
                ahead = min(traffic, forward.get(axes, 0.0))
                forward[axes] = forward.get(axes, 0.0) - ahead
            share = ahead / traffic
            traffic = gathered_bytes(kind, cls, traffic, placement, fp8_gathers, fp8_param_share)
            item = _item(
                c.op_name or kind, cls, hw, sizes, kind, axes, c.group_size, traffic, c.count
            )
            items.append(replace(item, forward_s=share * item.seconds) if share else item)
    return items


def substitutes_reduce_scatter(hw: Hardware, compiler: Capabilities) -> bool:
    """Whether a program of ``compiler`` has its all-reduces priced as the reduce-scatters
    ``hw``'s own compiler forms (it always forms them; ``compiler`` never does)."""
    own = hardware_compiler(hw)
    return (
        compiler.forms_reduce_scatter is Support.NEVER
        and own is not None
        and own.forms_reduce_scatter is Support.ALWAYS
    )


def compiled_step(
    hw: Hardware,
    pricing: Pricing,
    collectives: Sequence[PlanCollective],
    bound: Bound,
    compiler: Capabilities,
    flops: float | None = None,
) -> StepTime:
    """A compiled plan's step: the time model's schedule, with the collectives the compiler
    produced in place of the formula's (see :func:`compiled_comm_items`) and, given
    ``flops``, the matmul FLOPs its program computes in place of the formula's
    (:meth:`StepWork.with_step_matmul_flops`).

    ``flops`` is the program's count per device for the whole step (every micro-batch):
    the planner compiles one pipeline stage's layers with the unembedding (the slowest
    stage, as the formula prices it), the whole batch in its micro-batches, and the
    recomputation and blocked attention the formula assumes, so where the program computes
    what the formula counts the two steps are the same. None or 0 (nothing counted) keeps
    the formula's."""
    items = compiled_comm_items(
        hw,
        pricing.placement,
        collectives,
        bound,
        reduce_scatter_for_all_reduce=substitutes_reduce_scatter(hw, compiler),
        fp8_gathers=pricing.fp8_gathers,
        fp8_param_share=pricing.fp8_param_share,
    )
    return pricing.step(hw, items, flops)


def hardware_compiler(hw: Hardware) -> Capabilities | None:
    """The record of the compiler of ``hw``'s compile target of the same name, if any."""
    target = TARGETS.get(hw.name)
    return None if target is None else target.capabilities
