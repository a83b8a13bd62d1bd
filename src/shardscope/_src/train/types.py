"""The training planner's records: candidates, their screen, compiled facts, validations, plans
and a sweep's result.

Plain frozen dataclasses with ``to_dict()``; every renderer (table, JSON, Markdown, PNG) reads
these and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jax

from shardscope._src.base.comm import ratio
from shardscope._src.base.errors import PlanError
from shardscope._src.base.notes import Note
from shardscope._src.base.records import Record, json_value, record_dict
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.bounds.terms import Bound
from shardscope._src.cost.compute import hidden_seconds, serial_seconds
from shardscope._src.cost.memory import CompiledMemory, least_devices_for_state, memory_fits
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import Mode, ModelConfig, Remat
from shardscope._src.plan.collectives import AxisComm, PlanCollective
from shardscope._src.plan.estimates import MemoryEstimate, PipelineSplit, PipelineStage, Schedule
from shardscope._src.plan.notes import NoTargetFitValues, PlanNote, TargetOutOfMemoryValues
from shardscope._src.plan.rank import StepSource
from shardscope._src.plan.types import (
    PLAN_EXTRA,
    PLAN_KEYS,
    Skipped,
    no_fit_note,
    no_plan_note,
)
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import Strategy, get_strategy
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import CPU_TARGET, Target, get_target
from shardscope._src.train.timing import Pricing, StepTime

#: The mesh axis that holds pipeline stages (1F1B); every other axis is within one stage.
STAGE_AXIS = "stage"


@dataclass(frozen=True)
class Candidate:
    """One strategy on one mesh shape with its schedule, before it is filtered or compiled.

    A mesh axis named ``stage`` holds pipeline stages (1F1B); ``microbatches`` and ``remat``
    are the train step's gradient accumulation and activation recomputation;
    ``virtual_stages`` the model chunks each stage's device runs (interleaved 1F1B).
    """

    strategy: str
    #: its mesh's shape (given as ``(name, size)`` pairs, a description or a mapping, it is
    #: kept as its :class:`~shardscope._src.mesh.MeshShape`)
    mesh: MeshShape
    microbatches: int = 1
    remat: str = Remat.NONE
    #: the optimizer state kept in host memory and streamed in for the update
    offload_optimizer: bool = False
    #: the embedding, unembedding and logits split over ``model`` along the vocabulary
    vocab_split: bool = False
    #: model chunks per device, each ``1 / virtual_stages`` of a stage's layers (interleaved
    #: 1F1B, Narayanan et al., arXiv 2104.04473, section 2.2.2); 1: plain 1F1B
    virtual_stages: int = 1
    #: what the pipeline stages split: the layers alone, or with the embedding and the loss
    #: counted as a layer each (Megatron's, :class:`~shardscope._src.plan.estimates.PipelineSplit`)
    pipeline_split: str = PipelineSplit.LAYERS
    #: how many of the first layers have the activations they keep copied to host memory
    #: after their forward and back for their backward (Megatron-Core's
    #: ``cpu_offloading_num_layers``); 0: every layer keeps them on the device
    offload_layers: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh", MeshShape.of(self.mesh))
        split = PipelineSplit.parse(
            self.pipeline_split, what="pipeline_split", error=PlanError, param="pipeline_split"
        )
        object.__setattr__(self, "pipeline_split", split)

    @property
    def split(self) -> PipelineSplit:
        """:attr:`pipeline_split` as its member."""
        return PipelineSplit.parse(self.pipeline_split)

    def schedule(self, stage: PipelineStage | None = None) -> Schedule:
        """How this candidate runs its step (its micro-batches, recomputation, stages,
        offloads and virtual stages), priced on the pipeline ``stage`` of its split where
        one is given (:class:`~shardscope._src.plan.estimates.Schedule`)."""
        return Schedule(
            self.microbatches,
            self.remat,
            self.stages,
            self.offload_optimizer,
            self.virtual_stages,
            stage,
            offload_layers=self.offload_layers,
        )

    @property
    def sizes(self) -> dict[str, int]:
        return self.mesh.sizes

    @property
    def mesh_spec(self) -> str:
        return self.mesh.spec

    @property
    def stages(self) -> int:
        return self.mesh.get(STAGE_AXIS, 1)

    @property
    def stage_mesh(self) -> MeshShape:
        """The mesh of one pipeline stage (the whole mesh without its ``stage`` axis)."""
        return self.mesh.without(STAGE_AXIS)

    @property
    def stage_mesh_spec(self) -> str:
        return self.stage_mesh.spec

    @property
    def schedule_label(self) -> str:
        """``"4 micro-batches, 2 virtual stages, full recompute"``, or ``""`` for one
        micro-batch, no recompute."""
        parts = []
        if self.microbatches > 1:
            parts.append(f"{self.microbatches} micro-batches")
        if self.virtual_stages > 1:
            parts.append(f"{self.virtual_stages} virtual stages")
        if self.remat != Remat.NONE:
            parts.append(f"{self.remat} recompute")
        if self.offload_optimizer:
            parts.append("optimizer on host")
        if self.vocab_split:
            parts.append("vocab split")
        if self.split.accounted and self.stages > 1:
            parts.append(f"{self.pipeline_split} counted as layers")
        if self.offload_layers:
            parts.append(f"{self.offload_layers} layers' activations on host")
        return ", ".join(parts)

    @property
    def strategy_record(self) -> Strategy:
        """The strategy this candidate runs: the named one, with its vocabulary split when
        ``vocab_split``."""
        s = get_strategy(self.strategy)
        return s.with_vocab_split() if self.vocab_split else s

    @property
    def label(self) -> str:
        extra = self.schedule_label
        return f"{self.strategy} {self.mesh_spec}" + (f" ({extra})" if extra else "")


@dataclass(frozen=True)
class StageProgram:
    """The program a plan compiles: one pipeline stage's model
    (:func:`~shardscope._src.train.candidates.stage_config`) under the candidate's strategy
    on the stage's mesh shape, at its micro-batches. Made once per compiled candidate; it is
    compiled on simulated CPU devices (in this process or, pickled, in a worker), and again
    on a target's compile-only devices for the leading plans."""

    #: the strategy, or its name
    strategy: str | Strategy
    #: one stage's mesh (given as a description or pairs, kept as its ``MeshShape``)
    mesh: MeshShape
    config: ModelConfig
    mode: str
    microbatches: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh", MeshShape.of(self.mesh))

    def lower(self, mesh: jax.sharding.Mesh) -> jax.stages.Lowered:
        """The program lowered for ``mesh``, a mesh of devices of this shape (simulated CPU
        devices, or a target's compile-only ones): built from abstract arguments, nothing
        allocated."""
        placement = get_strategy(self.strategy).place(self.config, mesh)
        # The planner's programs gather FSDP's weights again for the backward, as PyTorch FSDP
        # and ZeRO-3 do: every layer's gathered weights never live at once.
        program = build_reference_program(
            placement, mode=self.mode, microbatches=self.microbatches, regather=True
        )
        lowered: jax.stages.Lowered = program.lower()
        return lowered


@dataclass(frozen=True)
class Screened:
    """A candidate estimated without compiling: its memory per device, its step time by the
    time model, and the communication its schedule needs (``bound``, the formula a compiled
    plan is validated against)."""

    candidate: Candidate
    memory: MemoryEstimate
    time: StepTime
    bound: Bound
    memory_limit_bytes: int
    pricing: Pricing | None = field(default=None, compare=False, repr=False)
    #: The host memory per device, where offloaded activations live.
    host_memory_limit_bytes: int = 0

    @property
    def fits(self) -> bool:
        return memory_fits(
            self.memory.total,
            self.memory_limit_bytes,
            host_bytes=self.memory.host,
            host_limit_bytes=self.host_memory_limit_bytes,
        )

    @property
    def step_time_s(self) -> float:
        """The step by the time model, nothing compiled (what the screen ranks by)."""
        return self.time.step_s

    @property
    def step_source(self) -> StepSource:
        return StepSource.ESTIMATED

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(
                self.candidate,
                keys={"mesh_spec": "mesh"},
                # the planner's own split is not written: old JSON reads the same
                omit=(
                    "mesh",
                    *(() if self.candidate.split.accounted else ("pipeline_split",)),
                    *(() if self.candidate.offload_layers else ("offload_layers",)),
                ),
                extra=("label", "mesh_spec", "stages"),
            ),
            "memory_bytes_per_device": self.memory.total,
            "fits": self.fits,
            "time": json_value(self.time),
        }


@dataclass(frozen=True)
class CompiledFacts:
    """What compiling and auditing one plan found: independent of the hardware preset."""

    collectives: tuple[PlanCollective, ...]
    memory: CompiledMemory
    rematerializations: tuple[str, ...]
    exact: bool
    lower_s: float
    compile_s: float
    audit_s: float
    #: the program's matmul FLOPs per device, one run (the whole step), counted from its HLO
    #: (:mod:`~shardscope._src.hlo.cost`); None where they could not be counted
    hlo_flops: int | None = None

    @property
    def analysis_s(self) -> float:
        return self.lower_s + self.compile_s + self.audit_s


@dataclass(frozen=True)
class Validation(Record):
    """Compiled communication against the analytic formula for one plan.

    ``ok`` when the compiled bytes match the formula (within the tolerance of
    :mod:`~shardscope._src.check.bound`, either way). Otherwise ``explanation`` says why, and
    ``cpu_formula_bytes`` is the formula with every reduce-scatter replaced by the all-reduce
    a compiler that forms none (XLA:CPU) emits (``cpu_ratio`` against it).
    """

    strategy: str
    mesh: str
    formula_bytes: int
    compiled_bytes: int
    ratio: float | None
    ok: bool
    cpu_formula_bytes: int
    cpu_ratio: float | None
    explanation: str


@dataclass(frozen=True)
class Plan:
    """One compiled plan with its estimates. ``rank`` 1 is the best (see ``shardscope.plan``)."""

    strategy: str
    summary: str
    mesh: Mapping[str, int]
    memory: MemoryEstimate
    compiled_memory: CompiledMemory
    memory_limit_bytes: int
    collectives: tuple[PlanCollective, ...]
    comm: tuple[AxisComm, ...]
    bound_bytes_per_device: int
    bound_comm_time_s: float
    comm_time_s: float
    flops_per_device: float
    compute_time_s: float
    rank: int = 0
    pareto: bool = False
    notes: tuple[Note, ...] = ()
    analysis_s: float = 0.0
    timing: Mapping[str, float] = field(default_factory=dict)
    exact: bool = True
    microbatches: int = 1
    remat: str = Remat.NONE
    stages: int = 1
    #: The optimizer state kept in host memory (MaxText's ``optimizer_memory_host_offload``).
    offload_optimizer: bool = False
    #: The embedding, unembedding and logits split over ``model`` along the vocabulary.
    vocab_split: bool = False
    #: Model chunks per device (interleaved 1F1B; 1: plain 1F1B).
    virtual_stages: int = 1
    #: What the pipeline stages split (:class:`~shardscope._src.plan.estimates.PipelineSplit`;
    #: written only where the embedding or the loss is counted as a layer).
    pipeline_split: str = PipelineSplit.LAYERS
    #: How many of the first layers' kept activations live in host memory (written only
    #: where some do).
    offload_layers: int = 0
    #: The compiled program's step time and its parts (None: no time model).
    time: StepTime | None = None
    #: The screening estimate's step time and its parts.
    estimated_time: StepTime | None = None
    #: The matmul FLOPs per device of the whole step that ``time`` is priced with: the
    #: compiled program's, counted from its HLO (None: not counted, the formula's are used).
    matmul_flops_per_device: float | None = None
    #: The time model's matmul FLOPs per device of the whole step (``estimated_time``'s):
    #: the forward, the backward and the recomputed part on the slowest pipeline stage.
    estimated_matmul_flops_per_device: float | None = None
    #: What the compiled collectives are priced with (not written: it holds the placement).
    pricing: Pricing | None = field(default=None, compare=False, repr=False)
    #: The formula the plan's compiled communication is validated against (not written).
    bound: Bound | None = field(default=None, compare=False, repr=False)
    #: The target whose compiler built the program the collectives and the fit come from:
    #: ``cpu`` (the screening compile), or a GPU's or TPU's (``h100``, ``tpu-v5p``). A
    #: target's name is taken too; the JSON writes the name.
    compiled_by: Target = CPU_TARGET
    #: The target compiler's buffer assignment per device (None when compiled by cpu, or
    #: when it found the program does not fit: ``target_error`` has its words).
    target_memory: CompiledMemory | None = None
    target_error: str | None = None
    #: The TPU compiler's own estimate of the step's seconds (None elsewhere).
    target_optimal_seconds: float | None = None
    #: The host memory per device, where offloaded activations live (``remat="offload"``).
    host_memory_limit_bytes: int = 0
    #: The candidate the plan was made from (not written: its fields above say it).
    candidate: Candidate | None = field(default=None, compare=False, repr=False)
    #: The program the plan compiled (not written): a target's compiler compiles it again.
    program: StageProgram | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # A target's name (as the JSON writes it) stands for the target, and a memory dict
        # by XLA's field names for its record.
        object.__setattr__(self, "compiled_by", get_target(self.compiled_by))
        if self.candidate is None:  # a plan made field by field, not by the sweep
            made = Candidate(
                self.strategy,
                MeshShape.of(self.mesh),
                self.microbatches,
                self.remat,
                self.offload_optimizer,
                self.vocab_split,
                self.virtual_stages,
                self.pipeline_split,
                self.offload_layers,
            )
            object.__setattr__(self, "candidate", made)
        object.__setattr__(self, "compiled_memory", CompiledMemory.from_dict(self.compiled_memory))
        if self.target_memory is not None:
            object.__setattr__(self, "target_memory", CompiledMemory.from_dict(self.target_memory))

    @property
    def compiled_by_accelerator(self) -> bool:
        """Whether a GPU's or a TPU's compiler (``compiled_by``) built the plan's program, so
        that its fit is judged from that compiler's buffer assignment rather than the
        analytic estimate."""
        return self.compiled_by.is_accelerator

    @property
    def mesh_spec(self) -> str:
        return format_mesh_spec(self.mesh)

    @property
    def schedule_label(self) -> str:
        assert self.candidate is not None  # set when the plan is made
        return self.candidate.schedule_label

    @property
    def label(self) -> str:
        extra = self.schedule_label
        return f"{self.strategy} {self.mesh_spec}" + (f" ({extra})" if extra else "")

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization the time model predicts (None without a time model)."""
        return None if self.time is None else self.time.mfu

    @property
    def memory_bytes_per_device(self) -> int:
        """The analytic estimate (what ``fits`` compares with the device memory)."""
        return self.memory.total

    @property
    def compiled_memory_bytes_per_device(self) -> int:
        """CPU buffer assignment: arguments + outputs + temporaries - aliased."""
        return self.compiled_memory.held_by(CPU_TARGET)

    @property
    def target_memory_bytes_per_device(self) -> int | None:
        """What the target's program holds at once
        (:attr:`~shardscope._src.cost.memory.CompiledMemory.held_bytes`)."""
        m = self.target_memory
        if m is None:
            return None
        return m.held_bytes

    @property
    def fit_memory_bytes_per_device(self) -> int:
        """The memory ``fits`` reads: when a target compiler compiled the plan, its buffer
        assignment and the optimizer state (fp32 master copy, Adam moments), which the
        compiled step does not hold; else the analytic estimate."""
        target = self.target_memory_bytes_per_device
        if self.compiled_by_accelerator and target is not None:
            return target + self.memory.device_optimizer
        return self.memory.total

    @property
    def fit_memory_source(self) -> str:
        """What :attr:`fit_memory_bytes_per_device` is: ``"estimate"`` or the compiler's."""
        if self.compiled_by_accelerator and self.target_memory is not None:
            return f"{self.compiled_by.name} compiler"
        return "estimate"

    @property
    def fits(self) -> bool:
        """Judged from the target compiler's memory when it compiled the plan, else from the
        analytic estimate."""
        if self.compiled_by_accelerator and self.target_memory is None:
            return False  # the target compiler found it does not fit
        return memory_fits(
            self.fit_memory_bytes_per_device,
            self.memory_limit_bytes,
            host_bytes=self.memory.host,
            host_limit_bytes=self.host_memory_limit_bytes,
        )

    @property
    def comm_bytes_per_device(self) -> int:
        return sum(c.traffic_bytes for c in self.collectives)

    @property
    def cpu_comm_bytes_per_device(self) -> int:
        return sum(c.cpu_traffic_bytes for c in self.collectives)

    @property
    def bound_ratio(self) -> float | None:
        """Compiled bytes over the lower bound (1.0 when both are 0; None if only it is)."""
        return ratio(self.comm_bytes_per_device, self.bound_bytes_per_device)

    @property
    def step_time_s(self) -> float:
        """The step of the compiled program: the time model with its compiled collectives
        (the ranking key; see :func:`~shardscope._src.train.timing.compiled_step`;
        ``estimated_time`` has the screen's); without one, compute then communication,
        nothing overlapped."""
        if self.time is not None:
            return self.time.step_s
        return serial_seconds(self.compute_time_s, self.comm_time_s)

    @property
    def step_source(self) -> StepSource:
        """Compiled: every plan is a compiled program (on the CPU, or a target's compiler),
        its collectives and matmul FLOPs priced; ``estimated_time`` keeps the screen's."""
        return StepSource.COMPILED

    @property
    def step_time_overlap_s(self) -> float:
        """Communication perfectly hidden behind compute (or the reverse)."""
        return hidden_seconds(self.compute_time_s, self.comm_time_s)

    def to_dict(self) -> dict[str, Any]:
        out = record_dict(
            self,
            keys=PLAN_KEYS,
            omit=(
                "memory_limit_bytes",
                "host_memory_limit_bytes",
                "pricing",
                "bound",
                "candidate",
                "program",
                *(
                    ()
                    if PipelineSplit.parse(self.pipeline_split).accounted
                    else ("pipeline_split",)
                ),
                *(() if self.offload_layers else ("offload_layers",)),
            ),
            extra=(
                *PLAN_EXTRA,
                "compiled_memory_bytes_per_device",
                "bound_ratio",
                "mfu",
                "target_memory_bytes_per_device",
                "fit_memory_bytes_per_device",
                "fit_memory_source",
            ),
        )
        out["compiled_by"] = self.compiled_by.name  # in its place among the fields
        return out


@dataclass(frozen=True)
class PlanResult:
    """A sweep: the plans best first, what was skipped and why, and the validation."""

    model: str
    config: ModelConfig
    devices: int
    mode: str
    hardware: Hardware
    settings: Mapping[str, Any]
    plans: tuple[Plan, ...]
    skipped: tuple[Skipped, ...]
    validations: tuple[Validation, ...]
    notes: tuple[Note, ...]
    wall_s: float = 0.0
    workers: int = 0
    candidates: int = field(default=0)
    screened: int = 0
    closest: Mapping[str, Any] | None = None
    #: The target whose compiler compiled the leading plans (their ``compiled_by``), or
    #: ``cpu`` when none did. A target's name is taken too; the JSON writes the name.
    compiler: Target = CPU_TARGET

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiler", get_target(self.compiler))

    @property
    def backend(self) -> str:
        """The platform of the compiler that compiled the leading plans: ``"cpu"``,
        ``"gpu"`` or ``"tpu"`` (its target's family)."""
        return self.compiler.family

    @property
    def best(self) -> Plan | None:
        """The fastest plan that fits the device memory (None when none fits); with a target
        compiler, the fastest of the plans it compiled and found to fit."""
        return next(
            (
                p
                for p in self.plans
                if p.fits and (not self.compiler.is_accelerator or p.compiled_by == self.compiler)
            ),
            None,
        )

    @property
    def fit_note(self) -> Note | None:
        """When no plan fits the device memory: the closest one (with every recomputation,
        micro-batch and pipeline choice searched), by how much, and what to do."""
        if self.best is not None or (not self.plans and self.closest is None):
            return None
        hardware, have = self.hardware.name, int(self.hardware.memory_bytes)
        pinned = self.pinned_choices
        if self.closest is not None and not any(p.compiled_by_accelerator for p in self.plans):
            label, need = self.closest["label"], int(self.closest["bytes"])
            return no_fit_note(label, need, have, hardware, pinned=pinned)
        on_target = self.compiler.is_accelerator
        compiled = [p for p in self.plans if on_target and p.compiled_by == self.compiler]
        sized = [p for p in compiled if p.target_memory_bytes_per_device is not None]
        if compiled and not sized:
            oom = TargetOutOfMemoryValues(
                target=self.compiler.name,
                count=len(compiled),
                label=compiled[0].label,
                error=compiled[0].target_error,
            )
            return Note(PlanNote.TARGET_OUT_OF_MEMORY, oom, ("devices", "batch", "seq"))
        if sized:
            small = min(sized, key=lambda p: p.target_memory_bytes_per_device or 0)
            values = NoTargetFitValues(
                target=self.compiler.name,
                label=small.label,
                have=have,
                need=small.target_memory_bytes_per_device or 0,
                hardware=hardware,
            )
            params = ("devices", "batch", "seq", "target_plans")
            return Note(PlanNote.NO_TARGET_FIT, values, params)
        small = min(self.plans, key=lambda p: p.memory_bytes_per_device)
        return no_fit_note(
            small.label, small.memory_bytes_per_device, have, hardware, pinned=pinned
        )

    @property
    def pinned_choices(self) -> dict[str, str]:
        """The request's choices that kept the search from a smaller plan, ``{param:
        words}``: a recomputation other than full, a micro-batch or stage count, a mesh, the
        optimizer state kept on the device, attention without the fused kernel."""
        s = self.settings
        pinned = {}
        remat = s.get("remat")
        if remat and "full" not in remat:
            pinned["remat"] = f"remat {', '.join(remat)}"
        for param in ("microbatches", "stages", "mesh"):
            if s.get(param) is not None:
                pinned[param] = f"{param} {s[param]}"
        if s.get("offload_optimizer") is False:
            pinned["offload_optimizer"] = "the optimizer state on the device"
        if s.get("flash_attention") is False:
            pinned["flash_attention"] = "attention without the fused kernel"
        return pinned

    @property
    def least_devices(self) -> int | None:
        """The fewest devices of this hardware that hold the model state sharded over all
        of them (:func:`~shardscope._src.cost.memory.least_devices_for_state`), the optimizer
        state on the host where the request leaves it free to be; None for weights kept in
        fp8, which that count does not price."""
        s = self.settings
        if s.get("fp8_params") is not None:
            return None
        hw = self.hardware
        return least_devices_for_state(
            self.config.param_count(),
            self.config.itemsize,
            hw.memory_bytes,
            bytes_per_param=s["bytes_per_param"] if self.mode == Mode.TRAIN else None,
            host_memory_bytes=0 if s.get("offload_optimizer") is False else hw.host_memory_bytes,
        )

    @property
    def _least_devices_offloaded(self) -> int | None:
        """:attr:`least_devices` with the optimizer state on the host, where the request
        kept it on the device (``offload_optimizer=False``) and the hardware has host
        memory; else None."""
        s, hw = self.settings, self.hardware
        if s.get("offload_optimizer") is not False or not hw.host_memory_bytes:
            return None
        if s.get("fp8_params") is not None or self.mode != Mode.TRAIN:
            return None
        return least_devices_for_state(
            self.config.param_count(),
            self.config.itemsize,
            hw.memory_bytes,
            bytes_per_param=s["bytes_per_param"],
            host_memory_bytes=hw.host_memory_bytes,
        )

    @property
    def empty_reason(self) -> Note | None:
        """Why there is no plan (None when there is one)."""
        if self.plans:
            return None
        note = no_plan_note(
            self.model,
            self.devices,
            self.skipped,
            self.hardware,
            self.least_devices,
            self._least_devices_offloaded,
        )
        if self.settings.get("microbatches") is not None:
            # a micro-batch count the data shards' sequences do not split into
            note = replace(note, params=("microbatches", "batch", *note.params))
        return note

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, extra=("empty_reason", "fit_note")),
            "compiler": self.compiler.name,  # in its place among the fields
            "params": self.config.param_count(),
            "best": None if self.best is None else self.best.label,
        }
