"""What a plan or a sweep notes: the kinds (:class:`PlanNote`), the record of each kind's
values (a small frozen dataclass, read by attribute: :class:`NoFitValues`, ...) and their
words, one template or one small function per kind, written from a note's values when it is
shown. A note's values are made from their mapping too (:meth:`PlanNote.values_of`), and its
JSON is the mapping's (:meth:`~shardscope._src.base.notes.NoteValues.to_dict`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from shardscope._src.audit.ragged import RaggedDots
from shardscope._src.audit.records import MemoryPressure
from shardscope._src.audit.width import widened_words
from shardscope._src.base.comm import format_bytes, format_flops, format_memory, format_seconds
from shardscope._src.base.notes import Note, NoteKind, NoteValues
from shardscope._src.base.text import and_list
from shardscope._src.sharding.rules import UnusedRules
from shardscope._src.targets import specs
from shardscope._src.targets.capabilities import CPU_COMPILER, Support, reduce_scatter_words
from shardscope._src.targets.hardware import TIME_MODEL_SOURCES, Hardware
from shardscope._src.targets.specs import Family


class PlanNote(NoteKind):
    """What a plan or a sweep notes (its :class:`~shardscope._src.base.notes.Note` kinds)."""

    # -- a plan's notes
    #: the compiler all-reduced and sliced where the bound reduce-scatters, its own choice
    #: (values: ``compiler``, ``forms``: its ``Capabilities.forms_reduce_scatter``)
    ALL_REDUCE_FOR_REDUCE_SCATTER = "all-reduce-for-reduce-scatter"
    #: the former name of :attr:`ALL_REDUCE_FOR_REDUCE_SCATTER`
    CPU_ALL_REDUCE_FOR_REDUCE_SCATTER = "all-reduce-for-reduce-scatter"
    #: the partitioner replicated a whole array then sliced it (values: ``sites``)
    REMATERIALIZATION = "rematerialization"
    #: some collective counts are not exact (unknown trip count or a branch)
    INEXACT = "inexact"
    #: the jit program reduces replicated gradients after every micro-batch
    PER_MICROBATCH_REDUCTION = "per-microbatch-reduction"
    #: one pipeline stage was compiled (values: ``stages``, ``layers``, ``devices``, the
    #: model's ``of_layers``; and ``virtual_stages`` when interleaved)
    PIPELINE_STAGE = "pipeline-stage"
    #: compiled again by a target's compiler (values: ``target``, ``memory_bytes``,
    #: ``estimate_bytes``, and ``room_bytes`` where a GPU's compiler was told the program
    #: may hold less than the device, ``optimizer_bytes`` the state beside it; or
    #: ``target`` and ``error`` when it failed)
    COMPILED_BY_TARGET = "compiled-by-target"
    #: the CPU compiler's buffers (with the optimizer state beside them) stand more than
    #: :data:`MEMORY_DISAGREEMENT` from the analytic estimate, on which the fit is judged
    #: (values: ``compiler``, ``compiled_bytes``, ``optimizer_bytes``, ``estimate_bytes``,
    #: ``stages``)
    FIT_ON_ESTIMATE = "fit-on-estimate"
    #: the target's compiler failed on the plan, which keeps its CPU compile (values:
    #: ``target``, ``error``: the compiler's first line)
    TARGET_COMPILE_FAILED = "target-compile-failed"
    #: the compiler's rematerialization could not bring the program under its memory
    #: (values: ``compiler``, ``limit_bytes``, ``reached_bytes``, ``original_bytes``)
    MEMORY_PRESSURE = "memory-pressure"
    #: the compiled program's matmul FLOPs differ from the time model's, or were not counted
    #: (values: ``compiler``, ``formula``: the time model's per device and step, ``compiled``:
    #: the program's, None when not counted)
    COMPILED_FLOPS = "compiled-flops"
    #: a user's program's ragged dots (``jax.lax.ragged_dot``) compiled as dense matmuls over
    #: every group, each computing its group count times its useful FLOPs (values:
    #: ``compiler``, ``count``, ``groups``; :mod:`~shardscope._src.audit.ragged`)
    RAGGED_DOT_DENSE = "ragged-dot-dense"
    # -- a sweep's notes
    #: rules of a user's rule set that shard a logical name no array of the program carries,
    #: and so change nothing (values: ``rule_set``, ``rules``;
    #: :class:`~shardscope._src.sharding.rules.UnusedRules`)
    UNUSED_RULES = "unused-rules"
    #: memory is the analytic estimate, the CPU compiler's beside it
    ANALYTIC_MEMORY = "analytic-memory"
    #: memory is a compiler's buffer assignment (values: ``target``, None for the CPU)
    COMPILED_MEMORY = "compiled-memory"
    #: what the communication column counts
    COMMUNICATION = "communication"
    #: the planner's time model and its sources (values: the hardware's fields)
    TIME_MODEL = "time-model"
    #: a user's program's time model (values: the hardware's fields)
    PROGRAM_TIME_MODEL = "program-time-model"
    #: the time model runs the layers' matmuls in fp8 while the compiled program is 16-bit
    #: (values: ``name``, ``fp8_peak_flops``, ``fp8_matmul_fraction``, ``dtype``)
    FP8_MATMULS = "fp8-matmuls"
    #: 16-bit collectives moved as f32 by a compiler that widens them (values: ``dtype``,
    #: ``itemsize``, ``compiler``)
    WIDENED = "widened"
    #: the former name of :attr:`WIDENED`
    CPU_WIDENED = "widened"
    #: a compiler formed no reduce-scatter where plans need one; they are charged its
    #: all-reduce (values: ``compiler``, ``forms``)
    NO_REDUCE_SCATTER = "no-reduce-scatter"
    #: the former name of :attr:`NO_REDUCE_SCATTER`
    CPU_NO_REDUCE_SCATTER = "no-reduce-scatter"
    #: the hardware's own compiler is not installed (values: ``target``, ``extra``)
    TARGET_COMPILER_MISSING = "target-compiler-missing"
    #: the leading plans were compiled again (values: ``target``, ``ranks``)
    RECOMPILED_BY_TARGET = "recompiled-by-target"
    #: the compiler gave no FLOP count for some plans
    NO_FLOP_COUNT = "no-flop-count"
    #: rule sets that compiled to the same program (values: ``same``: label, same as, mesh)
    IDENTICAL_PROGRAMS = "identical-programs"
    #: strategies the screen priced, a plan of each fitting, none of which was compiled (a
    #: default sweep compiles a composed strategy only among its best pairs) (values:
    #: ``strategies``, ``labels``, ``estimates``: each one's best screened plan and its step)
    NOT_COMPILED = "not-compiled"
    #: a pinned mesh read as the planner's (values: ``given``, ``read``, ``node_size``, the
    #: axes whose groups cross nodes as given, ``given_crossing``, and as read,
    #: ``read_crossing``, and ``maxtext``: given as MaxText's parallelism)
    MESH_READ = "mesh-read"
    #: a pinned layout beside the fastest of every layout screened, by the estimate
    #: (values: ``pinned``, ``best``: their labels, ``pinned_s``, ``best_s``: their steps,
    #: ``parts``: each part of the step, its seconds pinned and best)
    BESIDE_BEST = "beside-best"
    #: plans of a mixture of experts that split no expert over an expert axis, each device
    #: running every expert on its own tokens, a layout whose estimate the one published A/B
    #: of it against expert parallelism does not bear out (values: ``labels``)
    EXPERTS_UNSPLIT = "experts-unsplit"
    #: a mixture of experts' step is an estimate that has come out faster than the measured
    #: step on most of the published mixture runs it is judged on
    MIXTURE_STEP = "mixture-step"
    #: a mixture of experts trained in fp8, whose estimate runs the experts' matmuls at the
    #: fp8 rate and so comes out faster than in 16 bits, which the published runs of one
    #: fine-grained mixture in both do not bear out
    MIXTURE_FP8 = "mixture-fp8"
    #: a search's best proposal replicates every array, and the fastest that splits the
    #: work spends more on collectives than it saves in compute (values: ``devices``,
    #: ``split``: what the other shards and its mesh, ``saved_s``, ``comm_s``)
    ALL_REPLICATED = "all-replicated"
    #: a search's compiled proposals, none faster than the best plan of the user's own rules,
    #: which fits: keep those (values: ``proposals``: how many compiled, ``fitting``: how many
    #: of them fit, ``rules_name``, ``mesh``, ``step_s``, ``memory_bytes``: the user's best,
    #: ``settled``: whether the search reached a local optimum)
    KEEP_OWN = "keep-own"
    #: a search's logical names whose arrays hold too little to search, replicated in every
    #: proposal (values: ``names``, ``bytes``: their arrays', with their optimizer state,
    #: ``arguments_bytes``: every argument's, ``share``: the share under which a name is not
    #: searched)
    NEGLIGIBLE_NAMES = "negligible-names"
    #: the best plan or proposal of a user's program leaves devices repeating others' work,
    #: by its compiled matmul FLOPs against the whole step's (values: ``label``, ``what``:
    #: how the note names it, ``devices``, ``working``: the devices doing distinct work,
    #: ``copies``: how many compute each share)
    REPEATED_WORK = "repeated-work"
    # -- why a sweep has no plan that fits, or none at all
    #: none fits (values: ``label``, ``need``, ``have``, ``hardware``, ``searched``: whether
    #: every recomputation, micro-batch and stage choice was searched)
    NO_FIT = "no-fit"
    #: the target's compiler ran out of memory on every plan (values: ``target``, ``count``,
    #: ``label``, ``error``)
    TARGET_OUT_OF_MEMORY = "target-out-of-memory"
    #: none the target compiled fits (values: ``target``, ``label``, ``need``, ``have``,
    #: ``hardware``)
    NO_TARGET_FIT = "no-target-fit"
    #: no plan at all (values: ``what``, ``devices``, ``skipped``: count per reason,
    #: ``example``: one skipped candidate's message, ``limit``/``hardware`` when the model
    #: state alone does not fit)
    NO_PLAN = "no-plan"

    @classmethod
    def _missing_(cls, value: object) -> PlanNote | None:
        # Values written by earlier versions, read back.
        return _FORMER_VALUES.get(str(value))

    def values_of(self, values: Any) -> NoteValues:
        """``values`` as the record of this kind's (:data:`_VALUES`): as given when they are
        one, else made from their mapping (its keys the record's fields)."""
        record = _VALUES[self]
        if isinstance(values, record):
            return values
        if isinstance(values, Mapping):
            return record.from_dict(values)
        raise TypeError(
            f"a {self.value!r} note's values are a {record.__name__} or its mapping, not "
            f"{type(values).__name__}"
        )

    def describe(self, values: Any) -> str:
        """The note's words: its template filled with ``values`` (as ``v``), or its function
        of them."""
        v = self.values_of(values)
        text = _TEXTS[self]
        return text.format(v=v) if isinstance(text, str) else text(v)


# -- the values of each kind ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NoValues(NoteValues):
    """The values of a kind whose words take none."""


@dataclass(frozen=True, kw_only=True)
class MixtureStepValues(NoteValues):
    """How the estimate of a mixture of experts' step has fared on the published runs held
    out from it (``benchmarks/moe_heldout.py``'s summary, which prints where it has come to
    differ from these): the ``runs`` judged, the signed median error of each run as it was
    laid out (negative: faster than measured), how many of them came within 25%, the
    fastest and the slowest error, and the signed median of the planner's best plan for
    each against what ran. The defaults are the figures at this version."""

    runs: int = 53
    signed_median: float = -0.178
    within_25: int = 28
    fastest: float = -0.626
    slowest: float = 0.368
    best_signed_median: float = -0.381


@dataclass(frozen=True, kw_only=True)
class ReduceScatterValues(NoteValues):
    """A compiler and how dependably it forms reduce-scatters
    (:attr:`~shardscope._src.targets.capabilities.Capabilities.forms_reduce_scatter`), and
    ``priced_as``: the hardware whose own compiler forms them, where the step prices the
    compiled all-reduces as those reduce-scatters (None: as compiled)."""

    optional: ClassVar[tuple[str, ...]] = ("priced_as",)

    compiler: str
    forms: Support | str
    priced_as: str | None = None


@dataclass(frozen=True, kw_only=True)
class RematerializationValues(NoteValues):
    """Where the partitioner replicated a whole array, then sliced it."""

    sites: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", tuple(self.sites))


@dataclass(frozen=True, kw_only=True)
class PipelineStageValues(NoteValues):
    """The stage compiled: the ``stages``, its ``layers`` (of the model's ``of_layers``), the
    ``virtual_stages`` each device runs (when interleaved) and its ``devices``; and the
    ``pipeline_split`` where it counts the embedding or the loss as a layer
    (:class:`~shardscope._src.plan.estimates.PipelineSplit`)."""

    optional = ("of_layers", "virtual_stages", "pipeline_split")

    stages: int
    layers: int
    of_layers: int | None = None
    virtual_stages: int | None = None
    devices: int
    pipeline_split: str | None = None


@dataclass(frozen=True, kw_only=True)
class CompiledByTargetValues(NoteValues):
    """A target's compile: the bytes per device of its buffer assignment beside the
    estimate's, or its ``error``; where a GPU's compiler was told the program may hold less
    than the device, that room and the optimizer state beside it."""

    optional = (
        "memory_bytes",
        "estimate_bytes",
        "error",
        "room_bytes",
        "optimizer_bytes",
        "fit_bytes",
        "stage_layers",
        "held_layers",
    )

    target: str
    memory_bytes: int | None = None
    estimate_bytes: int | None = None
    error: str | None = None
    room_bytes: int | None = None
    optimizer_bytes: int | None = None
    #: what the fit is judged on: the buffers and the optimizer state beside them (None in
    #: a note written before it was kept)
    fit_bytes: int | None = None
    #: a pipeline stage's program: its layers (one micro-batch's activations through them at
    #: a time), and the layers' activations the first stage of its 1F1B schedule holds at
    #: once (:attr:`~shardscope._src.plan.estimates.Schedule.in_flight` chunks)
    stage_layers: int | None = None
    held_layers: int | None = None


#: How far a compiler's memory may stand from the estimate before a plan says which of the
#: two it judged its fit on, and why.
MEMORY_DISAGREEMENT = 0.10


def disagree(compiled_bytes: int, estimate_bytes: int) -> bool:
    """Whether a compiler's memory stands more than :data:`MEMORY_DISAGREEMENT` from the
    estimate, either way.

    >>> disagree(111, 100), disagree(110, 100), disagree(89, 100)
    (True, False, True)
    """
    return estimate_bytes > 0 and abs(compiled_bytes - estimate_bytes) > (
        MEMORY_DISAGREEMENT * estimate_bytes
    )


@dataclass(frozen=True, kw_only=True)
class FitOnEstimateValues(NoteValues):
    """A CPU-compiled plan's two memories: the ``compiler``'s buffer assignment
    (``compiled_bytes``, the step's program) with the optimizer state beside it
    (``optimizer_bytes``, which the step does not hold), and the analytic estimate the fit
    is judged on; the pipeline ``stages`` (the program compiles one stage)."""

    compiler: str
    compiled_bytes: int
    optimizer_bytes: int
    estimate_bytes: int
    stages: int = 1

    @property
    def other_bytes(self) -> int:
        """The compiler's memory beside the estimate: its buffers and the optimizer state."""
        return self.compiled_bytes + self.optimizer_bytes


@dataclass(frozen=True, kw_only=True)
class TargetErrorValues(NoteValues):
    """A target and its compiler's error (its first line)."""

    target: str
    error: str


@dataclass(frozen=True, kw_only=True)
class MemoryPressureValues(NoteValues):
    """The compiler (in words, ``"XLA:GPU"``) and what its rematerialization reached
    (:class:`~shardscope._src.audit.records.MemoryPressure`'s fields)."""

    compiler: str
    limit_bytes: int
    reached_bytes: int
    original_bytes: int

    @property
    def pressure(self) -> MemoryPressure:
        return MemoryPressure(self.limit_bytes, self.reached_bytes, self.original_bytes)


@dataclass(frozen=True, kw_only=True)
class CompiledFlopsValues(NoteValues):
    """The time model's matmul FLOPs per device and step (``formula``) and the compiled
    program's (None: not counted)."""

    compiler: str
    formula: float
    compiled: int | None


@dataclass(frozen=True, kw_only=True)
class RaggedDotDenseValues(NoteValues):
    """The compiler (in words, ``"XLA:CPU"``), the ``count`` of ragged dots its program
    computes densely, and their ``groups`` (each group count once, ascending)
    (:class:`~shardscope._src.audit.ragged.RaggedDots`)."""

    compiler: str
    count: int
    groups: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))


@dataclass(frozen=True, kw_only=True)
class CompiledMemoryValues(NoteValues):
    """The target whose compiler's buffer assignment memory is (None: the CPU's)."""

    target: str | None


@dataclass(frozen=True, kw_only=True)
class TimeModelValues(NoteValues):
    """The hardware whose fields the time model runs at; its JSON is the hardware's."""

    hardware: Hardware

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls(hardware=Hardware(**data))

    def to_dict(self) -> dict[str, Any]:
        return self.hardware.to_dict()


@dataclass(frozen=True, kw_only=True)
class ProgramTimeModelValues(TimeModelValues):
    """The hardware a user's program is priced on and, where an accelerator's compiler
    scheduled its collectives beside its compute, that compiler's name (``scheduled_by``;
    None: the CPU's compiler, which runs each on its own). Its JSON is the hardware's, with
    ``scheduled_by`` where set."""

    scheduled_by: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        fields = dict(data)
        scheduled_by = fields.pop("scheduled_by", None)
        return cls(hardware=Hardware(**fields), scheduled_by=scheduled_by)

    def to_dict(self) -> dict[str, Any]:
        out = self.hardware.to_dict()
        if self.scheduled_by is not None:
            out["scheduled_by"] = self.scheduled_by
        return out


@dataclass(frozen=True, kw_only=True)
class Fp8MatmulsValues(NoteValues):
    """The hardware's fp8 rate and the model's 16-bit ``dtype``; ``fp8_params``: the layers
    at each end whose weights stay 16-bit where the others' are kept in fp8 (None: every
    weight 16-bit)."""

    optional = ("fp8_params",)

    name: str
    fp8_peak_flops: float
    fp8_matmul_fraction: float
    dtype: str
    fp8_params: int | None = None


@dataclass(frozen=True, kw_only=True)
class WidenedValues(NoteValues):
    """A 16-bit ``dtype`` counted at ``itemsize`` bytes, which ``compiler`` widens."""

    dtype: str
    itemsize: int
    compiler: str


@dataclass(frozen=True, kw_only=True)
class CompilerMissingValues(NoteValues):
    """The hardware's own target and the extra that installs its compiler."""

    target: str
    extra: str


@dataclass(frozen=True, kw_only=True)
class RecompiledValues(NoteValues):
    """The target and the ranks of the plans its compiler compiled again."""

    target: str
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))


@dataclass(frozen=True, kw_only=True)
class MeshReadValues(NoteValues):
    """A pinned mesh as written and as the planner reads it, with the axes whose groups
    cross nodes of ``node_size`` devices in each."""

    given: str
    read: str
    node_size: int
    given_crossing: tuple[str, ...]
    read_crossing: tuple[str, ...]
    #: ``given`` is MaxText's ici/dcn parallelism
    maxtext: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "given_crossing", tuple(self.given_crossing))
        object.__setattr__(self, "read_crossing", tuple(self.read_crossing))


@dataclass(frozen=True, kw_only=True)
class AllReplicatedValues(NoteValues):
    """A search whose best replicates every array: the devices, and the fastest proposal
    that splits the work: what it shards and where, the compute it saves against the best and
    the time its collectives take."""

    devices: int
    split: str
    saved_s: float
    comm_s: float


@dataclass(frozen=True, kw_only=True)
class KeepOwnValues(NoteValues):
    """A search none of whose compiled proposals beats the best plan of the user's own rules:
    how many it compiled and how many of those fit, that plan (its rule set, mesh, step and
    memory a device) and whether the search settled (every neighbour of its best compiled)."""

    proposals: int
    fitting: int
    rules_name: str
    mesh: str
    step_s: float
    memory_bytes: int
    settled: bool


@dataclass(frozen=True, kw_only=True)
class NegligibleNamesValues(NoteValues):
    """A search's names not searched: the names, their arrays' bytes (with the optimizer
    state), every argument's bytes and the share under which a name is not searched."""

    names: tuple[str, ...]
    bytes: int
    arguments_bytes: int
    share: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))


@dataclass(frozen=True, kw_only=True)
class RepeatedWorkValues(NoteValues):
    """A plan whose devices repeat others' work: its label and how the note names it, its
    devices, those doing distinct work (the step's matmul FLOPs over a device's) and how
    many devices compute each share (the devices over those)."""

    label: str
    what: str
    devices: int
    working: float
    copies: float

    @property
    def whole(self) -> int | None:
        """The devices doing distinct work where they are a whole number that divides the
        devices (each share computed by the same number of them), else None."""
        n = round(self.working)
        if n < 1 or abs(self.working - n) > 1e-6 * n or self.devices % n:
            return None
        return n


@dataclass(frozen=True, kw_only=True)
class BesideBestValues(NoteValues):
    """The fastest plan of a pinned layout that fits (``pinned``) and the fastest of every
    layout the planner screens that fits (``best``): their labels, their steps by the
    estimate, and each part of the step, ``(part, pinned seconds, best seconds)``."""

    pinned: str
    best: str
    pinned_s: float
    best_s: float
    parts: tuple[tuple[str, float, float], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(tuple(p) for p in self.parts))


#: A part of the step whose difference is below this fraction of the pinned step is left
#: out of :data:`PlanNote.BESIDE_BEST`'s words.
BESIDE_BEST_SHOWN = 0.01


@dataclass(frozen=True, kw_only=True)
class ExpertsUnsplitValues(NoteValues):
    """The labels of the plans that keep every expert on every device, and the label and
    rank of the best plan with an expert axis where the result holds one."""

    optional: ClassVar[tuple[str, ...]] = ("split", "split_rank")

    labels: tuple[str, ...]
    split: str | None = None
    split_rank: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(self.labels))


@dataclass(frozen=True, kw_only=True)
class IdenticalProgramsValues(NoteValues):
    """Each plan that compiled to another's program: ``(label, the other's rule set, mesh)``."""

    same: tuple[tuple[str, str, str], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "same", tuple(tuple(s) for s in self.same))


@dataclass(frozen=True, kw_only=True)
class NotCompiledValues(NoteValues):
    """The strategies screened and not compiled, each one's best screened plan and that
    plan's step by the estimate."""

    strategies: tuple[str, ...]
    labels: tuple[str, ...]
    estimates: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("strategies", "labels", "estimates"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


@dataclass(frozen=True, kw_only=True)
class NoFitValues(NoteValues):
    """The closest plan, the bytes a device it ``need``s of those it ``have``s, and whether
    every recomputation, micro-batch and stage choice was ``searched``; ``pinned``: the
    choices the request fixed that the search would otherwise have made (``remat none``,
    ``mesh data=8``, ...), with ``pinned_params`` the request's names for them."""

    label: str
    need: int
    have: int
    hardware: str
    searched: bool
    pinned: tuple[str, ...] = ()
    pinned_params: tuple[str, ...] = ()
    #: a user's program (``plan --program``): its ``make_step`` sets the batch, and the
    #: closest plan's compiled memory, part by part (None: a built-in model's plan)
    program: bool | None = None
    arguments: int | None = None
    outputs: int | None = None
    temporaries: int | None = None
    aliased: int | None = None

    optional: ClassVar[tuple[str, ...]] = (
        "program",
        "arguments",
        "outputs",
        "temporaries",
        "aliased",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "pinned", tuple(self.pinned))
        object.__setattr__(self, "pinned_params", tuple(self.pinned_params))


@dataclass(frozen=True, kw_only=True)
class TargetOutOfMemoryValues(NoteValues):
    """The target, how many plans its compiler ran out of memory on, and the first's words."""

    target: str
    count: int
    label: str
    error: str | None


@dataclass(frozen=True, kw_only=True)
class NoTargetFitValues(NoteValues):
    """The smallest plan the target compiled, and the bytes a device it needs of those the
    hardware has."""

    target: str
    label: str
    have: int
    need: int
    hardware: str


@dataclass(frozen=True, kw_only=True)
class NoPlanValues(NoteValues):
    """What was swept on how many devices, the candidates skipped by reason, the memory the
    model state outgrew (``limit`` of ``hardware``, when it did), the fewest devices that
    hold it (``least_devices``, when known), the fewest with the optimizer state on the host
    where the request kept it on the device and these devices would hold it there
    (``least_devices_offloaded``), and one skipped example."""

    optional = ("limit", "hardware", "example", "least_devices", "least_devices_offloaded")

    what: str
    devices: int
    skipped: Mapping[str, int]
    limit: int | None = None
    hardware: str | None = None
    example: str | None = None
    least_devices: int | None = None
    least_devices_offloaded: int | None = None


#: What earlier versions wrote for kinds since renamed.
_FORMER_VALUES = {
    "cpu-all-reduce-for-reduce-scatter": PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER,
    "cpu-widened": PlanNote.WIDENED,
    "cpu-no-reduce-scatter": PlanNote.NO_REDUCE_SCATTER,
}


def _all_reduce_for_reduce_scatter(v: ReduceScatterValues) -> str:
    return (
        f"{reduce_scatter_words(v.compiler, v.forms)}; it did so where the bound "
        f"reduce-scatters, so the compiled bytes exceed the bound"
    )


def _widened(v: WidenedValues) -> str:
    return (
        f"{widened_words(v.compiler, v.dtype)}; they are counted at {v.itemsize} bytes per "
        f"element, as compilers that keep 16 bits send them (cpu_comm_bytes_per_device has "
        f"the bytes it sends)"
    )


def _no_reduce_scatter(v: ReduceScatterValues) -> str:
    if v.priced_as:
        charged = (
            f"the step prices those all-reduces as the reduce-scatters the {v.priced_as}'s own "
            f"compiler forms, and the communication column (comm_time_s) counts them as "
            f"compiled"
        )
    else:
        charged = "are charged the compiled all-reduce"
        charged = f"plans that need one (FSDP gradients, sequence parallelism) {charged}"
    return (
        f"{reduce_scatter_words(v.compiler, v.forms)} (twice the bytes): {charged}; "
        f"bound_comm_time_s is the time at the lower bound"
    )


def _rematerialization(v: RematerializationValues) -> str:
    return (
        "the partitioner replicated a whole array then sliced it (involuntary full "
        f"rematerialization) at {', '.join(v.sites)}"
    )


def _memory_pressure(v: MemoryPressureValues) -> str:
    said = v.pressure.sentence(f"the {v.compiler}")
    if v.compiler == "XLA:GPU":
        # its limit is not the memory it was told: XLA:GPU takes out the program's
        # arguments and outputs and keeps 5% (gpu_compiler.cc, GetSchedulerMemoryLimit)
        said += (
            " (its limit: 95% of the memory it was told, less the program's arguments and "
            "outputs; its figures are its scheduler's count, the memory column its buffer "
            "assignment's); it recomputed what it could, the step is priced with what it "
            "runs, and whether the plan fits is judged on the memory column against the "
            "device's memory"
        )
    return said


def _compiled_flops(v: CompiledFlopsValues) -> str:
    formula, compiled = v.formula, v.compiled
    counted = (
        "the forward, the backward at twice the forward, and what the recomputation and the "
        "memory-efficient attention's backward compute again"
    )
    if compiled is None:
        return (
            f"the {v.compiler} program's matmul FLOPs were not counted from its HLO (a loop "
            f"whose trip count is unknown, or no matmul found): its step is priced with the "
            f"time model's {format_flops(formula)} per device ({counted})"
        )
    more = "more" if compiled > formula else "fewer"
    return (
        f"the {v.compiler} program computes {abs(compiled / formula - 1):.1%} {more} matmul "
        f"FLOPs than the time model counts ({format_flops(compiled)} against "
        f"{format_flops(formula)} per device per step; the formula counts {counted}): the "
        f"step is priced with the program's count, the estimate keeps the formula's"
    )


def _ragged_dot_dense(v: RaggedDotDenseValues) -> str:
    dots = RaggedDots(v.count, v.groups)
    cpu = v.compiler == CPU_COMPILER.compiler
    return dots.sentence(v.compiler, cpu=cpu, priced="the plans price them so, as compiled")


def _pipeline_stage(v: PipelineStageValues) -> str:
    text = (
        f"one of {v.stages} pipeline stages compiled ({v.layers} layers, on "
        f"{v.devices} devices, holding the embedding and the unembedding of the first and "
        f"last stages); the stage-to-stage transfers and the bubble are in the time model"
    )
    of = v.stages * v.layers if v.of_layers is None else v.of_layers
    if of % v.stages:
        text += (
            f"; the {of} layers make stages of {v.layers} and {v.layers - 1}, and the "
            f"pipeline goes at the pace of one of {v.layers}, the one compiled"
        )
    chunks = 1 if v.virtual_stages is None else v.virtual_stages
    if chunks > 1:
        text += (
            f"; interleaved, each device runs these layers as {chunks} virtual stages of "
            f"{v.layers // chunks}, whose collectives are the compiled stage's"
        )
    if v.pipeline_split is not None:
        text += (
            f"; the stages split the layers with the {v.pipeline_split.replace('+', ' and the ')}"
            f" counted as a layer (Megatron's), so the first stage's first chunk or the last "
            f"stage's last chunk holds a layer fewer: the estimate prices each stage with its "
            f"own layers, embedding and output layer, the compile the stage of the most "
            f"layers with both"
        )
    return text


def _compiled_by_target(v: CompiledByTargetValues) -> str:
    head = f"compiled by the {v.target} compiler: "
    if v.room_bytes is not None:
        head = (
            f"compiled by the {v.target} compiler, told the program may hold "
            f"{format_bytes(v.room_bytes)} (the device less its "
            f"{format_bytes(v.optimizer_bytes or 0)} of optimizer state): "
        )
    if v.error is not None:
        return head + v.error
    text = (
        f"{head}{format_bytes(v.memory_bytes or 0)} per device in its buffer "
        f"assignment (analytic estimate {format_bytes(v.estimate_bytes or 0)})"
    )
    fit, estimate = v.fit_bytes, v.estimate_bytes
    if fit is None or estimate is None or not disagree(fit, estimate):
        return text
    state = fit - (v.memory_bytes or 0)
    beside = f" and {format_bytes(state)} of optimizer state" * bool(state)
    text = (
        f"{text}; the two disagree by {fit / estimate - 1:+.0%}: the fit is judged on the "
        f"compiler's {format_bytes(fit)} (its buffers{beside}), what its program allocates "
        f"with its own fusions, schedule and rematerialization, where the estimate counts by "
        f"formula what each layer keeps"
    )
    if v.stage_layers is not None and v.held_layers is not None:
        text += (
            f"; but the program runs one pipeline stage's micro-batches one after another, "
            f"holding one micro-batch's activations through its {v.stage_layers} layers, where "
            f"the first stage of the 1F1B schedule holds {v.held_layers} layers' at once (the "
            f"estimate counts them)"
        )
    return text


def fit_on_estimate_why(v: FitOnEstimateValues) -> str:
    """Why a compiler's buffers are not what a plan's fit is judged on."""
    why = (
        f"the {v.compiler} backend computes 16-bit arithmetic in f32 and has no GPU/TPU memory "
        f"scheduler, so its buffers are no device's"
    )
    if v.stages > 1:
        why += (
            "; and its program runs one stage's micro-batches one after another, where the "
            "1F1B schedule the estimate counts holds several at once"
        )
    return why


def _fit_on_estimate(v: FitOnEstimateValues) -> str:
    other = v.other_bytes
    beside = f" and {format_bytes(v.optimizer_bytes)} of optimizer state" * bool(v.optimizer_bytes)
    why = fit_on_estimate_why(v)
    return (
        f"the fit is judged on the analytic estimate, {format_bytes(v.estimate_bytes)}, not on "
        f"the {v.compiler} compiler's {format_bytes(other)} (its buffers{beside}), which "
        f"stands {other / v.estimate_bytes - 1:+.0%} from it: {why}"
    )


def fit_judged(note: Note) -> tuple[int, int] | None:
    """``(judged, other)``: the memory a plan's fit was judged on and the other figure, for a
    note that says so (a compiler's memory more than :data:`MEMORY_DISAGREEMENT` from the
    estimate); None for any other note."""
    if note.kind == PlanNote.FIT_ON_ESTIMATE:
        v = note.values
        assert isinstance(v, FitOnEstimateValues)
        return v.estimate_bytes, v.other_bytes
    if note.kind == PlanNote.COMPILED_BY_TARGET:
        t = note.values
        assert isinstance(t, CompiledByTargetValues)
        if t.fit_bytes is not None and t.estimate_bytes is not None:
            if disagree(t.fit_bytes, t.estimate_bytes):
                return t.fit_bytes, t.estimate_bytes
    return None


def _compiled_memory(v: CompiledMemoryValues) -> str:
    if v.target is not None:
        return (
            f"memory per device is the {v.target} compiler's own buffer assignment "
            f"(arguments + outputs + temporaries - aliased), compiled deviceless"
        )
    return (
        "memory per device is the compiler's buffer assignment (arguments + outputs + "
        "temporaries - aliased) on the CPU backend, which computes 16-bit arithmetic in f32 and "
        "has no GPU/TPU memory scheduler: compare plans with it, do not read it as a GPU/TPU "
        "prediction"
    )


def _time_model(values: TimeModelValues) -> str:
    v = values.hardware
    overlap = "overlapped with their matmuls" if v.tp_overlap else "on the critical path"
    pp = (
        "beside the steady phase's compute (the fill's and flush's waiting)"
        if v.pp_overlap
        else "waiting for their chunks"
    )
    if v.ep_overlap:
        pp += (
            "; a mixture's expert all-to-alls each beside the one sub-module of another "
            "micro-batch that Megatron's combined 1F1B pairs it with (the chunks that run "
            "alone waiting)"
        )
    sources = "; ".join(f"{k}: {s}" for k, s in TIME_MODEL_SOURCES.items())
    data = (
        "data-parallel, FSDP and ZeRO collectives hidden behind compute as far as the "
        "schedule allows (FSDP's gathers for the forward behind the forward alone)"
        if v.fsdp_overlap
        else "FSDP's gathers and reduce-scatters alone, on the critical path; data-parallel "
        "and ZeRO collectives hidden behind compute as far as the schedule allows"
    )
    return (
        f"time model ({v.name}): matmuls at {v.matmul_fraction:.0%} of "
        f"{v.peak_flops / 1e12:g} TFLOP/s, activations through HBM at "
        f"{v.hbm_bandwidth / 1e12:g} TB/s, collectives at {v.comm_fraction:.0%} of "
        f"{v.link_bandwidth / 1e9:g} GB/s within a node of {v.node_size} and of "
        f"{v.cross_node_bandwidth / 1e9:g} GB/s per device across nodes, "
        f"{v.latency_s * 1e6:g} us per ring step; tensor-parallel collectives {overlap}; "
        f"{data}; 1F1B pipeline bubble, its stages' transfers {pp}; copies to "
        f"host memory beside the compute; "
        f"the optimizer's pass over its state. Plans rank by this step time with the "
        f"matmul FLOPs (counted from its HLO) and the collectives of the program the compiler "
        f"produced (the formula's screen which to compile). Sources: {sources}"
    )


def _fp8_matmuls(v: Fp8MatmulsValues) -> str:
    return (
        f"fp8 matmuls ({v.name}): the time model runs the layers' projections and MLP in "
        f"fp8 at {v.fp8_matmul_fraction:.0%} of {v.fp8_peak_flops / 1e12:g} TFLOP/s, "
        f"with each operand's scale and cast as HBM bytes, and the attention core and the "
        f"unembedding at {v.dtype} (torchtitan's float8 training, MaxText's fp8 "
        f"quantization); FSDP's weight all-gathers are priced at one byte per element "
        f"(torchtitan's enable_fsdp_float8_all_gather), the formula's and the compiled "
        f"program's alike. The compiled program is the {v.dtype} reference program, which "
        f"runs no fp8 matmul: its collectives and memory are {v.dtype}'s. Memory keeps "
        f"{v.dtype} weights and fp32 master weights and optimizer state, and casts copies "
        f"for the matmuls; the linear layers' inputs kept for the backward are "
        f"{v.dtype} (fp8_saved_inputs='high-precision', torchao's) or their fp8 copies "
        f"(fp8_saved_inputs='fp8', Transformer Engine's, which also casts the weights once "
        f"a step, not in every pass) in the estimate, {v.dtype} in the compiled program"
        + (
            ""
            if v.fp8_params is None
            else f". With fp8_params={v.fp8_params} the layers' linear weights are kept in "
            f"fp8 (1 byte an element) but {v.fp8_params} layer(s) at each end, stored, cast "
            f"from the fp32 master shard once a step and gathered by ZeRO and FSDP at one "
            f"byte, in the estimate; {v.dtype} in the compiled program"
        )
    )


def _dot_rates(v: Hardware) -> str:
    """The rates of a compiled program's matmuls by their arithmetic
    (:func:`~shardscope._src.cost.compute.dot_flop_seconds`), as the time note says them."""
    peak = f"{v.peak_flops / 1e12:g} TFLOP/s peak x {v.matmul_fraction:g}"
    if v.tf32_peak_flops > 0:
        highest = v.fp32_peak_flops or v.tf32_peak_flops
        f32 = (
            f"f32 at JAX's default or high precision as TF32, {v.tf32_peak_flops / 1e12:g} "
            f"TFLOP/s x {v.matmul_fraction:g}, at precision highest as fp32, "
            f"{highest / 1e12:g} TFLOP/s x {v.matmul_fraction:g}"
        )
    elif specs.family(v.name) is Family.GPU:
        f32 = "f32 at that rate too (no TF32 rate given)"
    else:
        f32 = "f32 as one bf16 pass at that rate, three at precision high, six at highest"
    fp8 = (
        f"; fp8 at {v.fp8_peak_flops / 1e12:g} TFLOP/s x {v.fp8_matmul_fraction:g}"
        if v.has_fp8
        else ""
    )
    return f"bf16 and f16 at {peak}; {f32}{fp8}"


def _program_time_model(values: ProgramTimeModelValues) -> str:
    v = values.hardware
    step = (
        f"step = compute + the communication the {values.scheduled_by} compiler's schedule "
        f"leaves exposed (each asynchronous collective less the compute scheduled beside "
        f"it, as the audit prices it), never less than the communication alone; overlap = "
        f"the larger of compute and communication (every collective hidden)"
        if values.scheduled_by
        else "step = compute + communication (the CPU's compiler runs each collective on its "
        "own: no overlap) or the larger of the two (perfect overlap)"
    )
    return (
        f"time: alpha-beta per collective ({v.name}: {v.link_bandwidth / 1e9:g} GB/s "
        f"within a node of {v.node_size}, {v.cross_node_bandwidth / 1e9:g} GB/s for "
        f"groups that span nodes, {v.latency_s * 1e6:g} us per step); compute = the "
        f"compiler's FLOP count per device at the achievable matmul rate of each matmul's "
        f"arithmetic as its HLO states it ({_dot_rates(v)}) and, where an "
        f"accelerator's compiler compiled the program, its kernels as that compiler fused "
        f"them, each its HBM traffic beside its arithmetic, on a GPU one after another, none "
        f"under {v.kernel_floor_s * 1e6:g} us and each launched at "
        f"{v.kernel_launch_s * 1e6:g} us (the CPU's compiler's fusions are no "
        f"accelerator's: its matmuls alone, on a GPU each a kernel of its own, none under "
        f"that least and each launched); {step}"
    )


def _faster(error: float) -> str:
    """A signed error as words: "18% faster" (negative: under the measured step), "37%
    slower"."""
    return f"{abs(error):.0%} {'faster' if error < 0 else 'slower'}"


def _mixture_step(v: MixtureStepValues) -> str:
    return (
        f"a mixture of experts' step is the estimate's, judged on {v.runs} published mixture "
        f"runs held out from it: as each was laid out it came out {_faster(v.signed_median)} "
        f"than measured at the median, {v.within_25} of them within 25%, from "
        f"{_faster(v.fastest)} to {_faster(v.slowest)}; the planner's best plan for each came "
        f"out {_faster(v.best_signed_median)} than what ran. Read a mixture's step, and the "
        f"order of its layouts, as that uncertain (each run and its error: "
        f"benchmarks/moe_heldout.py, docs/models/accuracy.md)"
    )


def _recompiled_by_target(v: RecompiledValues) -> str:
    return (
        f"plans ranked {', '.join(str(r) for r in v.ranks)} were compiled again by the "
        f"{v.target} compiler (deviceless): their fit is judged from its buffer assignment "
        f"and their communication is its collectives; the other plans are the CPU compiler's "
        f"screening"
    )


def _axis_names(spec: str) -> list[str]:
    """The axes' names of a mesh written ``data=8,expert=8``."""
    return [part.partition("=")[0].strip() for part in spec.split(",") if part.strip()]


def _mesh_read(v: MeshReadValues) -> str:
    added = [] if v.maxtext else [a for a in _axis_names(v.read) if a not in _axis_names(v.given)]
    if v.maxtext:
        how = (
            "MaxText's parallelism, each axis its DCN size times its ICI size, the DCN part "
            "outside (across nodes or slices)"
        )
    elif added:
        how = f"the strategy's axes written out: {', '.join(f'{a}=1' for a in added)}"
    else:
        how = "the planner's order: stage, replica, data, expert, context, model, the last inner"
    text = f"mesh {v.given!r} planned as {v.read} ({how})"
    if not v.maxtext and set(v.given_crossing) != set(v.read_crossing):

        def axes(names: tuple[str, ...]) -> str:
            return ", ".join(names) or "no axis"

        text += (
            f"; that reading crosses nodes of {v.node_size} differently: as written "
            f"{axes(v.given_crossing)}, as planned {axes(v.read_crossing)}, whose groups "
            f"span two nodes, and the plan prices the latter"
        )
    return text


def _beside_best(v: BesideBestValues) -> str:
    if v.best_s >= v.pinned_s:  # the pinned layout is the best (beside_best_note)
        return (
            f"the pinned layout {v.pinned} is the fastest that fits of every layout the "
            f"planner screens ({format_seconds(v.pinned_s)} a step by the estimate)"
        )
    shown = sorted(
        (p for p in v.parts if abs(p[1] - p[2]) >= BESIDE_BEST_SHOWN * v.pinned_s),
        key=lambda p: -abs(p[1] - p[2]),
    )
    why = "; ".join(
        f"{part} {format_seconds(best)} against {format_seconds(pinned)}"
        for part, pinned, best in shown
    )
    return (
        f"the fastest layout the planner screens that fits, {v.best}, takes "
        f"{format_seconds(v.best_s)} a step by the estimate, {1 - v.best_s / v.pinned_s:.0%} "
        f"less than the pinned {v.pinned} at {format_seconds(v.pinned_s)}: {why}"
    )


def _all_replicated(v: AllReplicatedValues) -> str:
    saved = f"{format_seconds(v.saved_s)} of compute" if v.saved_s > 0 else "no compute"
    return (
        f"all replicated: the {v.devices} devices each do the whole step; the fastest split, "
        f"{v.split}, saves {saved} and adds {format_seconds(v.comm_s)} of collectives: at "
        f"this size communication costs more than it saves"
    )


def _keep_own(v: KeepOwnValues) -> str:
    yours = f"your {v.rules_name} on {v.mesh}"
    held = f"{format_seconds(v.step_s)}, {format_bytes(v.memory_bytes)} a device"
    none = (
        "the one compiled proposal"
        if v.proposals == 1
        else f"none of the {v.proposals} compiled proposals"
    )
    beats, fits = ("does not beat", "does not fit") if v.proposals == 1 else ("beats", "fits")
    if v.fitting:
        head = f"{none} {beats} {yours} ({held}): keep it"
    else:
        head = f"{none} {fits}, and {yours} does ({held}): keep it"
    more = (
        "the search settled (every neighbour of its best proposal compiled, none faster)"
        if v.settled
        else "more compiles may find a faster one (--compiles, compiles=)"
    )
    return f"{head}; {more}"


def _negligible_names(v: NegligibleNamesValues) -> str:
    its = "its" if len(v.names) == 1 else "their"
    part = v.bytes / v.arguments_bytes if v.arguments_bytes else 0.0
    return (
        f"{and_list(list(v.names))} not searched: {its} arrays ({format_bytes(v.bytes)} with "
        f"their optimizer state, {part:.2%} of the arguments' "
        f"{format_bytes(v.arguments_bytes)}) stay replicated in every proposal; split, arrays "
        f"under {v.share:.0%} of the arguments change what a device holds and computes by "
        f"less than that, not worth compiles of their own"
    )


def format_count(x: float) -> str:
    """A count that may be fractional: ``'4'``, ``'4.57'``.

    >>> format_count(4.0), format_count(4.571428), format_count(1.75)
    ('4', '4.57', '1.75')
    """
    n = round(x)
    return str(n) if abs(x - n) <= 1e-6 * max(1, n) else f"{x:.3g}"


def _repeated_work(v: RepeatedWorkValues) -> str:
    copies = format_count(v.copies)
    head = (
        f"{v.what}, {v.label}, does distinct work on {format_count(v.working)} of "
        f"{v.devices} devices ({copies} {'copy' if copies == '1' else 'copies'} of each share, "
        f"by the compiled matmul FLOPs)"
    )
    n = v.whole
    if n is None:
        return f"{head}: part of the work repeats on other devices"
    return (
        f"{head}: the other {v.devices - n} repeat their work, and {n} "
        f"device{'s' if n != 1 else ''} would compute the step as fast; use {n}, or grow "
        f"the batch so that every device has a share of its own"
    )


def _experts_unsplit(v: ExpertsUnsplitValues) -> str:
    shown = ", ".join(v.labels[:3]) + (" ..." if len(v.labels) > 3 else "")
    return (
        f"a mixture with every expert on every device (no expert axis, the experts' weights "
        f"gathered) is priced by an estimate that the published sweeps of such a layout "
        f"against expert parallelism do not bear out: each ran it slower than its best layout "
        f"with an expert axis (Marin's 360B on one GB200 rack, a JAX program: 235,125 tokens a "
        f"second against expert parallelism's 316,473, and slower than the estimate even with "
        f"its FSDP collectives on the critical path as its timeline has them, which "
        f"--no-fsdp-overlap prices; BioNeMo's Mixtral 8x7B on one node of 8 B200s, PyTorch: "
        f"1.237 s a step against 0.962 s with 4-way expert parallelism, the slowest of its "
        f"four layouts); weigh {shown} against the best plan with an expert axis"
        + (
            f": {v.split}, ranked {v.split_rank}"
            if v.split
            else " (none is among these plans: plan again with --strategies naming one, "
            "fsdp_ep or ep)"
        )
    )


def _identical_programs(v: IdenticalProgramsValues) -> str:
    same = v.same
    pairs = "; ".join(f"{label} = {other} {mesh}" for label, other, mesh in same[:6])
    return "identical programs: " + pairs + (" ..." if len(same) > 6 else "")


def _not_compiled(v: NotCompiledValues) -> str:
    each = "; ".join(
        f"{label} {format_seconds(step)}" for label, step in zip(v.labels, v.estimates, strict=True)
    )
    return (
        f"not compiled, so not in the table: {', '.join(v.strategies)} (a default sweep "
        f"compiles a composed strategy only among its best pairs; compile more pairs, or "
        f"name the strategies to compile the best of each); their best by the estimate: "
        f"{each}"
    )


def compiled_memory_words(
    arguments: int, outputs: int, temporaries: int, aliased: int, have: float
) -> str:
    """A compiled program's memory a device part by part, which part takes it over
    ``have``, and where nothing is aliased and its outputs are at least half its arguments
    (a step returning the state it takes), donation: ``'arguments 117.1 MiB, outputs 117.1
    MiB, temporaries 164 MiB, none aliased: the arguments fit, the outputs and temporaries
    do not; donate ...'``."""
    alias = f"{format_bytes(aliased)} aliased" if aliased else "none aliased"
    parts = (
        f"arguments {format_bytes(arguments)}, outputs {format_bytes(outputs)}, "
        f"temporaries {format_bytes(temporaries)}, {alias}"
    )
    if arguments > have:
        return f"{parts}: the arguments alone do not fit"
    words = f"{parts}: the arguments fit, the outputs and temporaries do not"
    if not aliased and arguments and 2 * outputs >= arguments:
        words += (
            f"; donate the model and optimizer state (donate_argnums) and the outputs reuse "
            f"up to {format_bytes(min(arguments, outputs))} of the arguments' memory"
        )
    return words


def _no_fit(v: NoFitValues) -> str:
    need, have = v.need, v.have
    if v.program:
        parts = ""
        if None not in (v.arguments, v.outputs, v.temporaries, v.aliased):
            parts = "; " + compiled_memory_words(
                v.arguments or 0, v.outputs or 0, v.temporaries or 0, v.aliased or 0, have
            )
        return (
            f"no plan fits: the closest, {v.label}, needs {format_bytes(need)} per device of "
            f"the {format_memory(have)} one {v.hardware} has ({format_bytes(need - have)}, "
            f"{need / have - 1:.0%} over){parts}; use more devices, a smaller batch in "
            f"make_step, or more memory per device"
        )
    searched = (
        ", even with full recomputation, micro-batches and pipeline stages"
        if v.searched and not v.pinned
        else f" with what the request pinned ({', '.join(v.pinned)})"
        if v.pinned
        else ""
    )
    free = f"leave {and_list(v.pinned_params)} to the planner, or " if v.pinned_params else ""
    return (
        f"no plan fits{searched}: the closest, {v.label}, needs {format_bytes(need)} per "
        f"device of the {format_memory(have)} one {v.hardware} has ({format_bytes(need - have)}, "
        f"{need / have - 1:.0%} over); {free}use more devices, a smaller batch or sequence, or "
        f"more memory per device"
    )


def _no_target_fit(v: NoTargetFitValues) -> str:
    return (
        f"no plan the {v.target} compiler compiled fits: the smallest, {v.label}, needs "
        f"{format_bytes(v.need)} per device in its buffer assignment, of the "
        f"{format_memory(v.have)} one {v.hardware} has; use more devices, a smaller batch "
        f"or sequence, or compile more plans on the target"
    )


def _no_plan(v: NoPlanValues) -> str:
    head = f"no plan for {v.what} on {v.devices} device(s)"
    skipped = v.skipped
    if not skipped:
        return head + ": no candidate mesh"
    parts = ", ".join(f"{n} skipped for {reason}" for reason, n in skipped.items())
    text = f"{head}: {parts}"
    if v.limit is not None:
        more = (
            f"at least {v.least_devices:,} devices (the model state sharded over all of "
            f"them, before activations)"
            if v.least_devices is not None
            else "more devices"
        )
        text += (
            f"; the model state alone needs more than the {format_memory(v.limit)} of one "
            f"{v.hardware}"
        )
        if v.least_devices_offloaded is not None:
            text += (
                f" with the optimizer state kept on the device (offload_optimizer=False); with "
                f"it on the host {v.least_devices_offloaded:,} devices hold the model state: "
                f"leave offload_optimizer to the planner, or use {more}"
            )
        else:
            text += f": use {more}"
        text += ", a preset with more memory, more memory per device, or fewer bytes per parameter"
    if v.example:
        text += f"; e.g. {v.example}"
    return text


#: Each kind's words: a template (``str.format_map`` of the values) or a function of them.
_TEXTS: dict[PlanNote, str | Callable[[Any], str]] = {
    PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER: _all_reduce_for_reduce_scatter,
    PlanNote.REMATERIALIZATION: _rematerialization,
    PlanNote.INEXACT: "some collective counts are not exact (unknown trip count or a branch)",
    PlanNote.PER_MICROBATCH_REDUCTION: (
        "the compiled jit program reduces the replicated gradients after every micro-batch; the "
        "time model reduces them once per step, as Megatron-LM, DeepSpeed and PyTorch DDP do "
        "(shard_map with one psum at the end compiles so)"
    ),
    PlanNote.PIPELINE_STAGE: _pipeline_stage,
    PlanNote.COMPILED_BY_TARGET: _compiled_by_target,
    PlanNote.FIT_ON_ESTIMATE: _fit_on_estimate,
    PlanNote.TARGET_COMPILE_FAILED: (
        "the {v.target} compiler failed on this plan ({v.error}); its collectives, step and memory "
        "are the CPU compile's"
    ),
    PlanNote.MEMORY_PRESSURE: _memory_pressure,
    PlanNote.COMPILED_FLOPS: _compiled_flops,
    PlanNote.RAGGED_DOT_DENSE: _ragged_dot_dense,
    PlanNote.UNUSED_RULES: UnusedRules.sentence,
    PlanNote.ANALYTIC_MEMORY: (
        "memory per device: the analytic estimate (ZeRO model state, Korthikanti "
        "activations), or a target compiler's buffer assignment where it compiled the plan "
        "(with the optimizer state beside the step), is what the fit was judged by; the CPU "
        "compiler's buffer assignment in the JSON and report (bf16 computed in f32, no GPU/TPU "
        "memory scheduler) is no GPU/TPU prediction"
    ),
    PlanNote.COMPILED_MEMORY: _compiled_memory,
    PlanNote.COMMUNICATION: (
        "communication is the compiled program's collectives, loop trips counted, bytes each "
        "device sends under bandwidth-optimal algorithms"
    ),
    PlanNote.TIME_MODEL: _time_model,
    PlanNote.PROGRAM_TIME_MODEL: _program_time_model,
    PlanNote.FP8_MATMULS: _fp8_matmuls,
    PlanNote.WIDENED: _widened,
    PlanNote.NO_REDUCE_SCATTER: _no_reduce_scatter,
    PlanNote.TARGET_COMPILER_MISSING: (
        "every plan was compiled by the CPU backend; pip install 'shardscope[{v.extra}]' to "
        "compile the leading plans with the {v.target} compiler (deviceless) and judge their fit "
        "from its buffer assignment"
    ),
    PlanNote.RECOMPILED_BY_TARGET: _recompiled_by_target,
    PlanNote.NO_FLOP_COUNT: (
        "neither the compiler nor the program's HLO gave a FLOP count for some plans: their "
        "compute time is 0, so they rank by communication alone"
    ),
    PlanNote.IDENTICAL_PROGRAMS: _identical_programs,
    PlanNote.ALL_REPLICATED: _all_replicated,
    PlanNote.KEEP_OWN: _keep_own,
    PlanNote.NEGLIGIBLE_NAMES: _negligible_names,
    PlanNote.REPEATED_WORK: _repeated_work,
    PlanNote.NOT_COMPILED: _not_compiled,
    PlanNote.EXPERTS_UNSPLIT: _experts_unsplit,
    PlanNote.MIXTURE_STEP: _mixture_step,
    PlanNote.MIXTURE_FP8: (
        "a mixture of experts in fp8: the estimate runs the experts' matmuls at the fp8 rate, "
        "each cast priced as its bytes through HBM, and so expects fp8 to save time, which "
        "the published runs of a fine-grained mixture in both do not bear out: Megatron-Bridge's "
        "Qwen3-30B-A3B on 16 H100 (EP 16, HybridEP, each run as NVIDIA configured it) took "
        "29.26-29.70 s a step in fp8 (per-tensor scaling, three releases) and 24.71 s in "
        "bf16 (20.15 s with its expert all-to-alls overlapped and its permutation fused), where "
        "the estimate has the fp8 runs the faster (benchmarks/moe_heldout.py prints each run "
        'and its estimate). Plan it again with matmul_dtype="bfloat16" '
        "(--matmul-dtype bfloat16) and weigh the two"
    ),
    PlanNote.MESH_READ: _mesh_read,
    PlanNote.BESIDE_BEST: _beside_best,
    PlanNote.NO_FIT: _no_fit,
    PlanNote.TARGET_OUT_OF_MEMORY: (
        "no plan fits: the {v.target} compiler ran out of memory on each of the {v.count} plans it "
        "compiled ({v.label}: {v.error}); use more devices or a smaller batch or sequence"
    ),
    PlanNote.NO_TARGET_FIT: _no_target_fit,
    PlanNote.NO_PLAN: _no_plan,
}


#: The record of each kind's values.
_VALUES: dict[PlanNote, type[NoteValues]] = {
    PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER: ReduceScatterValues,
    PlanNote.REMATERIALIZATION: RematerializationValues,
    PlanNote.INEXACT: NoValues,
    PlanNote.PER_MICROBATCH_REDUCTION: NoValues,
    PlanNote.PIPELINE_STAGE: PipelineStageValues,
    PlanNote.COMPILED_BY_TARGET: CompiledByTargetValues,
    PlanNote.FIT_ON_ESTIMATE: FitOnEstimateValues,
    PlanNote.TARGET_COMPILE_FAILED: TargetErrorValues,
    PlanNote.MEMORY_PRESSURE: MemoryPressureValues,
    PlanNote.COMPILED_FLOPS: CompiledFlopsValues,
    PlanNote.RAGGED_DOT_DENSE: RaggedDotDenseValues,
    PlanNote.UNUSED_RULES: UnusedRules,
    PlanNote.ANALYTIC_MEMORY: NoValues,
    PlanNote.COMPILED_MEMORY: CompiledMemoryValues,
    PlanNote.COMMUNICATION: NoValues,
    PlanNote.TIME_MODEL: TimeModelValues,
    PlanNote.PROGRAM_TIME_MODEL: ProgramTimeModelValues,
    PlanNote.FP8_MATMULS: Fp8MatmulsValues,
    PlanNote.WIDENED: WidenedValues,
    PlanNote.NO_REDUCE_SCATTER: ReduceScatterValues,
    PlanNote.TARGET_COMPILER_MISSING: CompilerMissingValues,
    PlanNote.RECOMPILED_BY_TARGET: RecompiledValues,
    PlanNote.NO_FLOP_COUNT: NoValues,
    PlanNote.IDENTICAL_PROGRAMS: IdenticalProgramsValues,
    PlanNote.ALL_REPLICATED: AllReplicatedValues,
    PlanNote.KEEP_OWN: KeepOwnValues,
    PlanNote.NEGLIGIBLE_NAMES: NegligibleNamesValues,
    PlanNote.REPEATED_WORK: RepeatedWorkValues,
    PlanNote.NOT_COMPILED: NotCompiledValues,
    PlanNote.EXPERTS_UNSPLIT: ExpertsUnsplitValues,
    PlanNote.MIXTURE_STEP: MixtureStepValues,
    PlanNote.MIXTURE_FP8: NoValues,
    PlanNote.MESH_READ: MeshReadValues,
    PlanNote.BESIDE_BEST: BesideBestValues,
    PlanNote.NO_FIT: NoFitValues,
    PlanNote.TARGET_OUT_OF_MEMORY: TargetOutOfMemoryValues,
    PlanNote.NO_TARGET_FIT: NoTargetFitValues,
    PlanNote.NO_PLAN: NoPlanValues,
}
