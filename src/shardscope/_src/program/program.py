"""Planning a user's own program: every mesh shape x logical-axis rule set, compiled and ranked.

``make_step(mesh)`` (or ``make_step(mesh, rules)``) returns the user's jitted step and its
abstract arguments for one mesh; :func:`plan_program` calls it for each mesh shape of N devices
and each candidate rule set, compiles the step (nothing allocated), audits it and ranks the
plans with the planner's estimates: compiled communication priced per collective on the
hardware preset (alpha-beta), compute from the compiler's FLOP count, memory from the
compiler's buffer assignment (there is no analytic model of a program we did not write).

Rules are Flax's logical-axis rules: pairs ``(logical name, mesh axes)``, the mesh axes a
name, a tuple of names or None (not sharded). They reach the program two ways: Flax's
``logical_axis_rules`` context is set while ``make_step`` runs and while the step is traced
(when the program imported Flax), and a ``make_step`` taking a second argument receives them
(:func:`shardscope.logical_to_spec` turns logical names into a ``PartitionSpec`` for code
that is not Flax).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp

from shardscope._src.audit.names import carried_names
from shardscope._src.audit.overlap import Kernel, kernel_costs, program_cost
from shardscope._src.audit.pricing import priced
from shardscope._src.audit.stages import lower_step_traced
from shardscope._src.audit.user_program import load_program
from shardscope._src.base.errors import (
    AxisTypeError,
    DeviceMemoryError,
    HloParseError,
    LayoutError,
    MissingMeshError,
    PlanError,
    ProgramError,
    RulesError,
    ShardingTypeCheckError,
    TargetError,
    is_int,
    one_line,
)
from shardscope._src.base.notes import Note
from shardscope._src.base.records import record_dict
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.bounds.terms import Bound
from shardscope._src.cost.compute import (
    by_kernel,
    compiled_step_seconds,
    counted_matmul_seconds,
    hidden_seconds,
    kernels_seconds,
    matmul_seconds,
    moved_seconds,
    serial_seconds,
)
from shardscope._src.cost.memory import CompiledMemory, memory_fits
from shardscope._src.hlo.cost import total
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.mesh import MeshShape, axis_types_of, parse_mesh_spec
from shardscope._src.plan.collectives import AxisComm, PlanCollective, axis_comm
from shardscope._src.plan.compile import (
    COMPILE_OPTIONS,
    CompiledProgram,
    compile_plan,
    gpu_kernel_cache,
    local_devices,
)
from shardscope._src.plan.estimates import divisors
from shardscope._src.plan.notes import (
    NoFitValues,
    PlanNote,
    ProgramTimeModelValues,
    RepeatedWorkValues,
)
from shardscope._src.plan.rank import StepSource, memory_time_front, step_rank_key
from shardscope._src.plan.request import ProgramRequest
from shardscope._src.plan.tasks import LostTask
from shardscope._src.plan.types import (
    PLAN_EXTRA,
    PLAN_KEYS,
    ProgramFacts,
    Skipped,
    SkipReason,
    no_plan_note,
)
from shardscope._src.plan.worker import WorkerError
from shardscope._src.program.dataflow import by_dataflow
from shardscope._src.sharding.rules import (
    Rules,
    check_rules_axes,
    choose_rule_set,
    find_rule_sets,
    format_rules,
    normalize_rules,
    rules_axes,
    takes_rules,
    unmapped_name_error,
    unused_rules,
    uses_flax,
)
from shardscope._src.targets.devices import require_compiler
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.hardware import hardware as get_hardware
from shardscope._src.targets.mesh import target_mesh
from shardscope._src.targets.specs import CPU, CPU_TARGET, Family, get_target

# -- mesh shapes --------------------------------------------------------------------------------


def mesh_shapes(devices: int, axes: Sequence[str]) -> list[MeshShape]:
    """Every way to spread ``devices`` over ``axes`` (sizes multiply to it; 1 allowed).

    >>> [tuple(m.values()) for m in mesh_shapes(4, ("data", "model"))]
    [(1, 4), (2, 2), (4, 1)]
    """
    out = []
    for sizes in itertools.product(divisors(devices), repeat=max(len(axes) - 1, 0)):
        head = math.prod(sizes)
        if devices % head == 0:
            out.append(MeshShape(tuple(zip(axes, (*sizes, devices // head), strict=True))))
    return out


#: What changes whether a program's plan fits: the devices and the memory a device (its
#: batch is its make_step's, not a request's field).
PROGRAM_FIT_PARAMS = ("devices", "memory_bytes")


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramPlan:
    """One rule set on one mesh shape, compiled and estimated. ``rank`` 1 is the best.

    Memory is the compiler's buffer assignment per device (arguments + outputs + temporaries
    - aliased): on the CPU compiler that is not a GPU/TPU prediction, on a target's compiler
    it is that compiler's own. ``flops_per_device`` is the compiler's count, or where it gives
    none (the GPU compiler) the one counted from the program's HLO; ``compute_time_s`` runs
    them at the time model's matmul rate (peak x ``matmul_fraction``) and, compiled by an
    accelerator's compiler, its kernels' traffic, least times and launches too
    (:func:`compute_seconds`). ``exposed_time_s`` is the communication the compute its
    compiler scheduled beside it leaves exposed (:func:`exposed_seconds`, the audit's exposed
    time), None where the CPU's compiler built it, which runs each collective on its own.
    """

    rules_name: str
    rules: Rules
    mesh: Mapping[str, int]
    compiled_memory: CompiledMemory
    memory_limit_bytes: int
    collectives: tuple[PlanCollective, ...]
    comm: tuple[AxisComm, ...]
    comm_time_s: float
    flops_per_device: float | None
    compute_time_s: float
    rank: int = 0
    pareto: bool = False
    notes: tuple[Note, ...] = ()
    timing: Mapping[str, float] = field(default_factory=dict)
    exact: bool = True
    same_as: str | None = None
    #: the compiler that built it (``"cpu"``, or a target's name)
    target: str = "cpu"
    exposed_time_s: float | None = None
    #: the FLOPs of the matrix products a device runs a step, counted from the compiled HLO
    #: (:func:`~shardscope._src.audit.overlap.program_cost`), and those of the whole step,
    #: counted alike from its lowering before the partitioner split it over the mesh
    #: (:func:`step_matmul_flops`); None where either is unknown
    matmul_flops_per_device: int | None = None
    step_matmul_flops: int | None = None

    def __post_init__(self) -> None:
        # A memory dict by XLA's field names (what earlier versions held) stands for the record.
        object.__setattr__(self, "compiled_memory", CompiledMemory.from_dict(self.compiled_memory))

    @property
    def fit_memory_bytes_per_device(self) -> int:
        """The memory ``fits`` reads: what the compiled program holds at once."""
        return self.memory_bytes_per_device

    @property
    def fit_memory_source(self) -> str:
        return "compiled"

    @property
    def strategy(self) -> str:
        """The rule set's name (the column the planner's renderers call strategy)."""
        return self.rules_name

    @property
    def summary(self) -> str:
        return format_rules(self.rules)

    @property
    def mesh_spec(self) -> str:
        return format_mesh_spec(self.mesh)

    @property
    def label(self) -> str:
        return f"{self.rules_name} {self.mesh_spec}"

    @property
    def memory_bytes_per_device(self) -> int:
        """What the compiled program holds at once
        (:meth:`~shardscope._src.cost.memory.CompiledMemory.held_by` its compiler)."""
        return self.compiled_memory.held_by(get_target(self.target))

    @property
    def fits(self) -> bool:
        return memory_fits(self.memory_bytes_per_device, self.memory_limit_bytes)

    @property
    def comm_bytes_per_device(self) -> int:
        return sum(c.traffic_bytes for c in self.collectives)

    @property
    def cpu_comm_bytes_per_device(self) -> int:
        return sum(c.cpu_traffic_bytes for c in self.collectives)

    @property
    def bound_ratio(self) -> None:
        """No lower bound is known for a program we did not write."""
        return None

    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def work_copies(self) -> float | None:
        """How many times the devices together compute each share of the step's matrix
        products: a device's matmul FLOPs times the devices over the whole step's (1: no
        device repeats another's work; 8 copies on 32 devices: 4 shares, each computed by 8).
        A product the compiler computes again (rematerialized for memory) counts as a copy
        too; a product it folded away is never less than one copy. None where either count
        is unknown or zero."""
        mine, whole = self.matmul_flops_per_device, self.step_matmul_flops
        if not mine or not whole:
            return None
        return max(1.0, mine * self.devices / whole)

    @property
    def working_devices(self) -> float | None:
        """The devices that do distinct work: the devices over :attr:`work_copies` (the
        whole step's matmul FLOPs over one device's)."""
        copies = self.work_copies
        return None if copies is None else self.devices / copies

    @property
    def step_time_s(self) -> float:
        """Compute and the communication its compiler's schedule leaves exposed, never less
        than the communication alone (its links carry every collective's bytes); compute
        and communication one after the other where no schedule hides any
        (``exposed_time_s`` None: the CPU's compiler)."""
        if self.exposed_time_s is None:
            return serial_seconds(self.compute_time_s, self.comm_time_s)
        return max(self.compute_time_s + self.exposed_time_s, self.comm_time_s)

    @property
    def step_source(self) -> StepSource:
        """Always compiled: every program plan prices its compiled program."""
        return StepSource.COMPILED

    @property
    def step_time_overlap_s(self) -> float:
        return hidden_seconds(self.compute_time_s, self.comm_time_s)

    @property
    def analysis_s(self) -> float:
        return sum(self.timing.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(
                self,
                keys={**PLAN_KEYS, "same_as": "same_program_as"},
                omit=("memory_limit_bytes",),
                extra=(*PLAN_EXTRA, "work_copies", "working_devices"),
            ),
            "memory_source": "compiled",
        }


@dataclass(frozen=True)
class ProgramPlanResult:
    """A sweep of a user's program: plans best first, what was skipped and why."""

    program: str
    devices: int
    hardware: Hardware
    axes: tuple[str, ...]
    rule_sets: Mapping[str, Rules]
    plans: tuple[ProgramPlan, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[Note, ...]
    target: str = "cpu"
    axis_types: str = "explicit"
    wall_s: float = 0.0
    candidates: int = 0

    #: What the planner's chart calls the model and its mode, and where memory comes from.
    mode = "step"
    memory_source = "compiled"

    @property
    def model(self) -> str:
        return self.program

    @property
    def backend(self) -> str:
        """The platform of the compiler that compiled the plans: ``"cpu"``, ``"gpu"`` or
        ``"tpu"`` (its target's family)."""
        return get_target(self.target).family

    @property
    def best(self) -> ProgramPlan | None:
        """The fastest plan that fits the device memory (None when none fits)."""
        return next((p for p in self.plans if p.fits), None)

    @property
    def fit_note(self) -> Note | None:
        """When no plan fits the device memory: the smallest, by how much, and what to do."""
        if not self.plans or self.best is not None:
            return None
        small = min(self.plans, key=lambda p: p.memory_bytes_per_device)
        memory = small.compiled_memory
        # make_step sets the batch: the flags of the built-in model's are no way out here
        values = NoFitValues(
            label=small.label,
            need=small.memory_bytes_per_device,
            have=int(self.hardware.memory_bytes),
            hardware=self.hardware.name,
            searched=False,
            program=True,
            arguments=memory.argument_size_in_bytes or 0,
            outputs=memory.output_size_in_bytes or 0,
            temporaries=memory.temp_size_in_bytes or 0,
            aliased=memory.alias_size_in_bytes or 0,
        )
        return Note(PlanNote.NO_FIT, values, PROGRAM_FIT_PARAMS)

    @property
    def empty_reason(self) -> Note | None:
        """Why there is no plan (None when there is one)."""
        if self.plans:
            return None
        return no_plan_note(self.program, self.devices, self.skipped)

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, extra=("empty_reason", "fit_note")),
            "best": None if self.best is None else self.best.label,
        }


# -- compiling one candidate --------------------------------------------------------------------


def _itemsize(args: Any) -> int:
    """2 when every floating-point argument is 16-bit, else 4: how the CPU backend's f32
    collectives are counted (it moves 16-bit values as f32; GPU/TPU compilers do not)."""

    sizes = set()
    for leaf in jax.tree.leaves(args):
        dt = getattr(leaf, "dtype", None)
        if dt is not None and jnp.issubdtype(dt, jnp.floating):
            sizes.add(jnp.dtype(dt).itemsize)
    return 2 if sizes == {2} else 4


def _compile_options(target: str | None) -> Mapping[str, Any] | None:
    """The XLA options a candidate compiles with: the planner's on simulated CPU devices
    (:data:`~shardscope._src.plan.compile.COMPILE_OPTIONS`), the kernel file of this
    process on a GPU target (:func:`~shardscope._src.plan.compile.gpu_kernel_cache`), none
    on a TPU's."""
    if target is None:
        return COMPILE_OPTIONS
    if get_target(target).family == Family.GPU:
        return gpu_kernel_cache()
    return None


def compile_candidate(
    make_step: Callable[..., Any],
    rules: Rules,
    sizes: Mapping[str, int],
    devices: Sequence[jax.Device] | None,
    *,
    where: str,
    target: str | None = None,
    axis_types: Any = None,
) -> tuple[CompiledProgram, Mapping[str, float], int, str, int | None]:
    """``(compiled program, timing, itemsize, hlo fingerprint, step FLOPs)`` of one candidate: on
    simulated CPU devices with the planner's options (the partitioned program and its
    buffers, not fast CPU code), or on ``target``'s compile-only devices with its own
    compiler. A ``Compiled`` that ``make_step`` returned is audited as it is. Also the
    whole step's matmul FLOPs (:func:`step_matmul_flops`), the fifth of the tuple."""

    t0 = time.perf_counter()
    shape = MeshShape.of(sizes)
    if target is None:
        mesh = shape.on(devices, axis_types=axis_types)
    else:
        mesh = target_mesh(target, shape, axis_types=axis_types)
    stage, jaxpr = lower_step_traced(make_step, mesh, rules, where=where)
    t1 = time.perf_counter()
    # a Compiled is audited as it is
    options = None if isinstance(stage, jax.stages.Compiled) else _compile_options(target)
    compiled = compile_plan(stage, mesh=mesh, options=options, jaxpr=jaxpr)
    t2 = time.perf_counter()
    result = compiled.audit
    cpu = CPU_TARGET.name  # an audit of simulated CPU devices names no target
    if (result.target or cpu) != (target or cpu):
        raise ProgramError(
            f"{where} returned a program for {result.target or result.backend} devices, not "
            f"{target or 'cpu'}; build it on the mesh make_step is given"
        )
    fingerprint = hashlib.sha256(result.hlo_text.encode()).hexdigest()[:16]
    itemsize = _itemsize(stage.args_info)
    whole = _step_flops(make_step, sizes, stage)
    timing = {
        "lower_s": t1 - t0,
        "compile_s": compiled.compile_s,
        "audit_s": time.perf_counter() - t2,
    }
    return compiled, timing, itemsize, fingerprint, whole


#: The custom calls that open a ``shard_map``'s region in a lowered program: its body is
#: written per device there, so the lowering is no longer the whole step's work.
_MANUAL_REGIONS = frozenset(
    {"xla.sdy.GlobalToLocalShape", "SPMDFullToShardShape", "xla.sdy.LocalToGlobalShape"}
)


#: The whole step's matmul FLOPs of a ``make_step`` by mesh shape and its arguments' shapes
#: and types, counted once (:func:`_step_flops`).
_STEP_FLOPS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], int | None]] = (
    weakref.WeakKeyDictionary()
)


def _step_flops(make_step: Any, sizes: Mapping[str, int], stage: Any) -> int | None:
    """:func:`step_matmul_flops` of ``stage``, ``make_step``'s program on a mesh of
    ``sizes``, counted once for the shapes and types of its arguments on that mesh shape:
    the rule sets and layouts a search compiles there change where the products run, not
    what the whole step computes."""
    if not isinstance(stage, jax.stages.Lowered):
        return None
    args = tuple(
        (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "")))
        for x in jax.tree.leaves(stage.args_info)
    )
    # (not the arguments' tree: a Flax model's carries its variables' shardings)
    key = (tuple(sizes.items()), args)
    try:
        known = _STEP_FLOPS.setdefault(make_step, {})
    except TypeError:  # not weakly referable: counted each time
        return step_matmul_flops(stage)
    if key not in known:
        known[key] = step_matmul_flops(stage)
    return known[key]


def step_matmul_flops(stage: Any) -> int | None:
    """The FLOPs of the matrix products of one whole step: its lowering, before the
    partitioner split it over the mesh, counted as a compiled program's are
    (:func:`~shardscope._src.audit.overlap.program_cost`: a dot's, loops by their trip
    counts), so that a device's count over it is exact (``ProgramPlan.work_copies``). None
    for a program compiled already (no lowering to read), one with a ``shard_map`` (its body
    is lowered per device), or HLO the counter cannot read."""
    if not isinstance(stage, jax.stages.Lowered):
        return None
    try:
        module = parse_hlo(stage.as_text(dialect="hlo"))
        for comp in module.computations.values():
            for ins in comp.instructions:
                target = ins.attributes.get("custom_call_target", "").strip('"')
                if ins.opcode == "custom-call" and target in _MANUAL_REGIONS:
                    return None
        return program_cost(module).flops
    except (HloParseError, RecursionError):  # unknown, said as such (None), not guessed
        return None


# -- the front door -----------------------------------------------------------------------------


def plan_program(
    make_step: Callable[..., Any],
    devices: int = 8,
    *,
    compiler: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    **knobs: Any,
) -> ProgramPlanResult:
    """Plans a user's program on ``devices`` accelerators: every mesh shape x rule set
    (:func:`plan_program_request` of the :class:`~shardscope._src.plan.request.ProgramRequest`
    its arguments make).

    Args:
        make_step: ``make_step(mesh)`` (or ``make_step(mesh, rules)``) returning ``(step,
            args)``: the jitted step (``jax.jit``, ``flax.nnx.jit``, ``equinox.filter_jit``)
            and its arguments for that mesh, best abstract (``shardscope.abstract`` or
            ``jax.ShapeDtypeStruct`` with shardings) so that nothing is allocated.
        devices: accelerators to plan for; this process must simulate at least as many
            (``shardscope.use_cpu_devices(n)`` before JAX starts).
        rules: candidate logical-axis rule sets, as ``shardscope plan --program --rules``
            takes them: one set of ``(logical name, mesh axes)`` pairs (or a mapping),
            ``{name: pairs}``, or the path of a rules file (JSON, which may name the axes).
            None (the default): the ``RULES`` of ``make_step``'s module when it defines
            them, else the program is planned as written.
        rule_set: plan only this one of the rule sets.
        axes: the mesh axis names (default: the rules file's, else those the rules name, in
            order).
        meshes: mesh shapes to try (``"data=4,model=2"``); default every way to spread
            ``devices`` over ``axes``, sizes of 1 included.
        hardware: a preset name or :class:`Hardware` (default: the target's, else
            ``h100``); ``hardware_overrides`` change fields.
        target: compile every candidate for this target (``"h100"``, ``"tpu-v5p"``; see
            ``shardscope.TARGETS``) with its own compiler, deviceless: its collectives and
            its memory per device (a TPU program that does not fit is skipped for memory).
            None (or ``"cpu"``): simulated CPU devices. ``compiler=`` is the same choice
            by the name :func:`shardscope.plan` and the command line give it.
        axis_types: the axis types of every candidate's mesh, as in
            :func:`shardscope.make_mesh`: ``"explicit"`` (the default, JAX's: sharding in
            types) or ``"auto"`` (the compiler propagates shardings).
        name: what to call the program in the output (default ``make_step``'s module and name).
        progress: called as ``progress(done, total, label)``.
        compiler: the same choice as ``target``, by the name :func:`shardscope.plan` gives it.

    Returns:
        A :class:`ProgramPlanResult`, plans ranked by estimated step time (those that fit the
        device memory first); candidates whose program failed to build are in ``skipped``.

    Raises:
        PlanError: no axes, too few devices, or a ``make_step`` that does not return
            ``(step, args)``.
        RulesError: bad rules (not pairs, unknown axes, an unreadable file, no such
            ``rule_set``); a :class:`PlanError` too.
        AxisTypeError: an axis type that does not exist, or a program whose shardings do not
            fit the meshes' axis types (it names the one they fit).
        MissingMeshError: a ``make_step`` that needs a mesh set while it runs.

    ``make_step`` runs with no mesh set (it is given the mesh); the step it returns is
    lowered inside ``with jax.set_mesh(mesh):``, with Flax's logical-axis rules in force
    through both when there are rules (see ``lower_step`` in the audit's stages).
    """
    target = one_compiler(knobs.pop("target", None), compiler)
    request = ProgramRequest(make_step, devices, target=target, **knobs)
    return plan_program_request(request, progress=progress)


def plan_program_request(
    request: ProgramRequest, *, progress: Callable[[int, int, str], None] | None = None
) -> ProgramPlanResult:
    """Plans ``request`` (see :func:`plan_program`); ``progress`` is called as
    ``progress(done, total, label)``."""
    return plan_rule_sets(request, progress=progress)


def plan_rule_sets(
    request: ProgramRequest,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    pool: Any = None,
    ref: ProgramRef | None = None,
    cache: CompileCache | None = None,
    floor: Callable[[Mapping[str, int], Rules], float] | None = None,
    batch: int = 2,
) -> ProgramPlanResult:
    """:func:`plan_program_request`, its compiles in ``pool``'s workers where it has one (and
    the program's ``ref``): ``suggest`` plans the user's own rule sets in the pool of its
    search.

    ``cache`` (a :class:`CompileCache`) gives the plan of a layout compiled before instead of
    compiling it again, and keeps what is compiled. ``floor(sizes, rules)``, a lower bound of
    a plan's step time, makes the sweep compile only the plans that could be the best: the
    lowest floors first, ``batch`` at a time, each round leaving out the plans whose floor is
    above the step time of the best plan that fits so far (skipped as ``slower``). Without
    it every plan is compiled."""
    make_step, devices, rules = request.make_step, request.devices, request.rules
    axes, meshes, axis_types = request.axes, request.meshes, request.axis_types
    name = request.name
    start = time.perf_counter()
    rule_sets, axes, axes_from = _check_program(
        make_step, devices, rules, request.rule_set, axes, meshes
    )
    kinds = axis_types_of(axis_types, axes)
    shapes = mesh_list(meshes, axes, devices, axes_from=axes_from)
    target_name, hw = target_hardware(
        request.target, request.hardware, request.hardware_overrides, devices
    )
    local = None
    if target_name is None and (pool is None or ref is None):
        local = local_devices(devices, otherwise=" (the command line does it for you)")
    label = name or program_name(make_step)
    # The logical names the program's arrays carry: every one a set lacks is named at once,
    # and a rule for a name none carries is noted (it changes nothing).
    names = list(dict.fromkeys(n for r in rule_sets.values() for n, _ in r))
    used = carried_names(make_step, names, axis_type=kinds[0], where=label) if names else None
    unused = () if used is None else unused_rules(rule_sets, used)

    todo = [(rn, r, s) for rn, r in rule_sets.items() for s in shapes]

    def run(items: Sequence[tuple[str, Rules, Mapping[str, int]]]) -> list[ProgramFacts]:
        return compile_program(
            make_step,
            items,
            hw,
            local,
            label=label,
            target=target_name,
            kinds=kinds,
            progress=progress if floor is None else None,
            pool=pool,
            ref=ref,
            cache=cache,
            used=used,
        )

    if floor is None:
        facts: Sequence[ProgramFacts | None] = run(todo)
    else:
        facts = _compile_below(todo, run, floor, kinds, cache, batch)
    plans, skipped = mark_same(facts, {})
    ranked = rank_plans(plans, [rn for rn, _, _ in todo])
    return ProgramPlanResult(
        program=label,
        devices=devices,
        hardware=hw,
        axes=axes,
        rule_sets=rule_sets,
        plans=ranked,
        skipped=tuple(skipped),
        notes=(
            *(Note(PlanNote.UNUSED_RULES, u) for u in unused),
            *_result_notes(hw, ranked, target_name),
        ),
        target=target_name or CPU_TARGET.name,
        axis_types=",".join(sorted(set(k.name.lower() for k in kinds))),
        wall_s=time.perf_counter() - start,
        candidates=len(todo),
    )


def _compile_below(
    todo: Sequence[tuple[str, Rules, Mapping[str, int]]],
    run: Callable[[Sequence[tuple[str, Rules, Mapping[str, int]]]], list[ProgramFacts]],
    floor: Callable[[Mapping[str, int], Rules], float],
    kinds: Any,
    cache: CompileCache | None,
    batch: int,
) -> list[ProgramFacts | None]:
    """The facts of each item of ``todo``, compiled by ``run`` only where the plan could be
    the best: the layouts ``cache`` holds first (they cost nothing), then the lowest
    ``floor`` first, ``batch`` at a time (or all of the lowest floor at once); an item whose
    floor is above the step time of the best plan that fits so far is skipped as
    ``slower``, not compiled."""
    facts: list[ProgramFacts | None] = [None] * len(todo)

    def compile_now(items: Sequence[int]) -> None:
        if items:
            for i, got in zip(items, run([todo[i] for i in items]), strict=True):
                facts[i] = got

    left = list(range(len(todo)))
    while left:
        if cache is not None:  # a layout compiled before costs nothing
            compile_now([i for i in left if layout_key(todo[i][2], todo[i][1], kinds) in cache])
            left = [i for i in left if facts[i] is None]
        best = min(
            (f.plan.step_time_s for f in facts if f is not None and f.plan and f.plan.fits),
            default=math.inf,
        )
        # read again each round: a floor may learn from what was compiled
        bounds = {i: floor(todo[i][2], todo[i][1]) for i in left}
        for i in left:
            if bounds[i] > best:
                why = (
                    f"not compiled: its step takes at least {bounds[i] * 1e3:.4g} ms, more "
                    f"than the {best * 1e3:.4g} ms of the best plan that fits"
                )
                spec = format_mesh_spec(todo[i][2])
                facts[i] = ProgramFacts(None, "", Skipped(todo[i][0], spec, SkipReason.SLOWER, why))
        left = sorted((i for i in left if bounds[i] <= best), key=lambda i: (bounds[i], i))
        # A compiled step is no faster than its floor, so the plans of the lowest floor left
        # are compiled whatever the others show: all of them go in this round.
        lowest = sum(bounds[i] <= bounds[left[0]] for i in left) if left else 0
        take = max(1, batch, lowest)
        compile_now(left[:take])
        left = left[take:]
    return facts


# -- compiles by layout --------------------------------------------------------------------------

#: What a rule set places on a mesh (:func:`layout_key`).
LayoutKey = tuple[Any, ...]


def _axis_names(axes: Any) -> tuple[str, ...]:
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def layout_key(sizes: Mapping[str, int], rules: Rules, kinds: Any) -> LayoutKey:
    """What ``rules`` place on a mesh of ``sizes``, as the compiled program can tell: one
    program's plans of equal keys compile to the same program (on the same compiler).

    The mesh's sizes and the rules' pairs as written; or, where no two logical names share a
    mesh axis (no array can have two dimensions ask for one, so the rules' order decides
    nothing), the pairs in name order, and on Auto axes (``kinds``) each mesh axis of size 1
    read as none: it splits nothing, and the compiler is given the same shardings. Where
    names share an axis, Flax Linen gives it to the first rule and Flax NNX refuses the
    array, so the pairs and their order are kept as they are.

    >>> auto = (jax.sharding.AxisType.Auto,) * 2
    >>> mesh = {"data": 8, "model": 1}
    >>> layout_key(mesh, (("batch", "data"), ("mlp", "model")), auto) == layout_key(
    ...     mesh, (("mlp", None), ("batch", "data")), auto)
    True
    """
    pairs = tuple((n, _axis_names(a)) for n, a in rules)
    names = [n for n, _ in pairs]
    used = [a for _, axes in pairs for a in axes]
    if len(set(names)) == len(names) and len(set(used)) == len(used):
        auto = all(k == jax.sharding.AxisType.Auto for k in kinds)
        placed = sorted(
            (n, tuple(a for a in axes if not auto or sizes.get(a, 1) > 1)) for n, axes in pairs
        )
        return (tuple(sizes.items()), "placed", tuple(placed))
    return (tuple(sizes.items()), "rules", pairs)


def renamed(facts: ProgramFacts, rules_name: str, rules: Rules) -> ProgramFacts:
    """``facts`` of one compile as those of the rule set ``rules_name`` (``rules``) whose
    layout it is: its plan, or its reason to be skipped, under that name."""
    plan = facts.plan
    if plan is not None:
        plan = replace(plan, rules_name=rules_name, rules=tuple(rules), same_as=None)
    skipped = facts.skipped
    if skipped is not None:
        skipped = replace(skipped, strategy=rules_name)
    return ProgramFacts(plan, facts.fingerprint, skipped)


class CompileCache:
    """The compiles of one program by layout (:func:`layout_key`), for one compiler, hardware
    and set of axis types: a layout compiled before is taken from here, under the name and
    rules it is asked for, instead of compiling it again (``suggest``'s search and its
    yardstick share one). ``hits`` counts the compiles it saved."""

    def __init__(self) -> None:
        self._facts: dict[LayoutKey, ProgramFacts] = {}
        self.hits = 0

    def __contains__(self, key: LayoutKey) -> bool:
        return key in self._facts

    def __len__(self) -> int:
        return len(self._facts)

    def get(self, key: LayoutKey, rules_name: str, rules: Rules) -> ProgramFacts | None:
        """The facts of ``key``'s compile as those of ``rules_name`` (None: not compiled)."""
        facts = self._facts.get(key)
        if facts is None:
            return None
        self.hits += 1
        return renamed(facts, rules_name, rules)

    def put(self, key: LayoutKey, facts: ProgramFacts) -> None:
        self._facts.setdefault(key, facts)

    def plans(self) -> list[ProgramPlan]:
        """Every plan compiled, in the order compiled."""
        return [f.plan for f in self._facts.values() if f.plan is not None]


def mark_same(
    facts: Sequence[ProgramFacts | None], seen: dict[tuple[str, str], str]
) -> tuple[list[ProgramPlan], list[Skipped]]:
    """The plans and the skipped candidates of ``facts``, in their order (None: neither): a
    plan whose program (its fingerprint on its mesh) is in ``seen`` or came earlier is
    marked the same as that one's (``same_as``), and ``seen`` learns the others."""
    plans: list[ProgramPlan] = []
    skipped: list[Skipped] = []
    for got in facts:
        if got is None:
            continue
        if got.plan is None:
            if got.skipped is not None:
                skipped.append(got.skipped)
            continue
        plan = got.plan
        same = seen.setdefault((plan.mesh_spec, got.fingerprint), plan.rules_name)
        plans.append(replace(plan, same_as=same) if same != plan.rules_name else plan)
    return plans, skipped


def compile_program(
    make_step: Callable[..., Any],
    todo: Sequence[tuple[str, Rules, Mapping[str, int]]],
    hw: Hardware,
    local: Sequence[jax.Device] | None,
    *,
    label: str,
    target: str | None,
    kinds: Any,
    progress: Callable[[int, int, str], None] | None = None,
    pool: Any = None,
    ref: ProgramRef | None = None,
    cache: CompileCache | None = None,
    used: Sequence[str] | None = None,
) -> list[ProgramFacts]:
    """The facts of each item of ``todo`` (each a ``(rule set name, rules, mesh sizes)``): its
    plan and its program's fingerprint, or why it was skipped, in ``todo``'s order. The one
    compile loop of :func:`plan_program` and ``suggest`` (:func:`mark_same` turns the facts
    into plans and skipped candidates). With a ``pool`` (a
    :class:`~shardscope._src.plan.worker.WorkerPool`, or a Ray cluster's
    :class:`~shardscope._src.plan.cluster.RayPool`) and the program's ``ref`` the compiles
    run in its workers, each loading the program from its file; a candidate a cluster lost
    is skipped as ``lost``. With a ``cache`` (a :class:`CompileCache`), a layout it holds is
    taken from it, one that ``todo`` names twice is compiled once, and every compile is kept
    there. ``used``, the logical names the program's arrays carry
    (:func:`~shardscope._src.audit.names.carried_names`), lets a candidate whose rules lack
    some be skipped naming every one."""
    total = len(todo)
    if progress:
        progress(0, total, "")
    got: list[ProgramFacts | None] = [None] * total
    keys = [layout_key(sizes, r, kinds) if cache is not None else () for _, r, sizes in todo]
    fresh: list[int] = []
    first: dict[LayoutKey, int] = {}
    for i, (rn, r, _) in enumerate(todo):
        if cache is None:
            fresh.append(i)
        elif (held := cache.get(keys[i], rn, r)) is not None:
            got[i] = held
        elif keys[i] not in first:  # (a second of one layout: the first's, below)
            first[keys[i]] = i
            fresh.append(i)
    done = sum(g is not None for g in got)

    def finished(i: int, facts: ProgramFacts) -> None:
        nonlocal done
        got[i] = facts
        if cache is not None and (facts.skipped is None or facts.skipped.reason != SkipReason.LOST):
            cache.put(keys[i], facts)
        done += 1
        if progress:
            progress(done, total, f"{todo[i][0]} {format_mesh_spec(todo[i][2])}")

    if pool is not None and ref is not None:
        tasks = [
            ProgramTask(
                ref=ref.ref,
                by_dataflow=ref.by_dataflow,
                rules_name=todo[i][0],
                rules=tuple(todo[i][1]),
                mesh=MeshShape.of(todo[i][2]),
                target=target,
                axis_types=tuple(k.name for k in kinds),
                hardware=hw,
                where=f"{label}(mesh {format_mesh_spec(todo[i][2])})",
                used=None if used is None else tuple(used),
            )
            for i in fresh
        ]
        for j, answer in pool.run(tasks):
            i = fresh[j]
            if isinstance(answer, LostTask):  # a cluster's: not compiled, so not a plan
                lost = Skipped(
                    todo[i][0], format_mesh_spec(todo[i][2]), SkipReason.LOST, str(answer)
                )
                finished(i, ProgramFacts(None, "", lost))
            elif isinstance(answer, BaseException):
                raise _worker_error(answer, tasks[j].where)
            else:
                finished(i, answer)
    else:
        for i in fresh:
            rn, r, sizes = todo[i]
            plan, skip, fingerprint = _compile_one(
                make_step, rn, r, sizes, hw, local, label, target, kinds, used
            )
            finished(i, ProgramFacts(plan, fingerprint, skip))
    out = []
    for i, (rn, r, _) in enumerate(todo):
        facts = got[i]
        if facts is None:  # its layout came earlier in ``todo`` (a cluster lost it: not kept)
            held = cache.get(keys[i], rn, r) if cache is not None else None
            facts = held or renamed(got[first[keys[i]]] or ProgramFacts(), rn, r)
            done += 1
            if progress:
                progress(done, total, f"{rn} {format_mesh_spec(todo[i][2])}")
        out.append(facts)
    return out


@dataclass(frozen=True)
class ProgramRef:
    """How a worker process finds a program: ``FILE.py:FUNCTION`` (:func:`load_program`),
    and whether it is searched array by array (``suggest``'s programs without names)."""

    ref: str
    by_dataflow: bool = False


def program_ref(fn: Any, *, by_dataflow: bool = False) -> ProgramRef | None:
    """``fn``'s :class:`ProgramRef` when it is a module-level function of a file (None for a
    closure, a lambda, a function of a module without a file or of the running script:
    those compile here)."""
    name = getattr(fn, "__module__", "") or ""
    if name == "__main__":  # a script: loading it again would run it again
        return None
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    qual = getattr(fn, "__qualname__", "") or ""
    if not path or not path.endswith(".py") or not qual.isidentifier():
        return None
    if not callable(getattr(module, qual, None)):  # (the file may have been loaded again)
        return None
    return ProgramRef(f"{path}:{qual}", by_dataflow)


def _compile_one(
    make_step: Callable[..., Any],
    rn: str,
    r: Rules,
    sizes: Mapping[str, int],
    hw: Hardware,
    local: Sequence[jax.Device] | None,
    label: str,
    target: str | None,
    kinds: Any,
    used: Sequence[str] | None = None,
) -> tuple[ProgramPlan | None, Skipped | None, str]:
    """``(plan, None, fingerprint)`` of one candidate, or ``(None, skipped, "")``; raises the
    errors that are the caller's (a bad program, rules or target). ``used``: the logical
    names the program's arrays carry, where known."""
    spec = format_mesh_spec(sizes)
    try:
        compiled = compile_candidate(
            make_step,
            r,
            sizes,
            local,
            where=f"{label}(mesh {spec})",
            target=target,
            axis_types=kinds,
        )
    except ShardingTypeCheckError as e:  # this layout's, not the program's
        why = (
            f"its shardings do not type-check on the Explicit axes (for code written for "
            f"Auto axes: axis_types='auto'): {e.jax_said or e}"
        )
        return None, Skipped(rn, spec, SkipReason.TYPE_CHECK, why), ""
    except (PlanError, ProgramError, TargetError, AxisTypeError, MissingMeshError):
        raise
    except DeviceMemoryError as e:  # the target's compiler found it does not fit
        return None, Skipped(rn, spec, SkipReason.MEMORY, str(e)), ""
    except Exception as e:  # the user's program failed for this mesh and rules
        reason = SkipReason.DIVISIBILITY if _indivisible(e) else SkipReason.ERROR
        # a logical name the set lacks reached JAX as a mesh axis: said in our words
        unmapped = unmapped_name_error(
            e,
            [n for n, _ in r],
            f"rule set {rn!r}",
            program=label,
            used=used,
            mesh_axes=list(sizes),
        )
        return None, Skipped(rn, spec, reason, str(unmapped) if unmapped else one_line(e)), ""
    return _program_plan(rn, r, sizes, compiled, hw, None), None, compiled[3]


#: The programs a worker process has loaded, by reference.
_LOADED: dict[ProgramRef, Callable[..., Any]] = {}

#: The errors of a task that are the caller's (a bad program, rules or target): raised as
#: they are where the task was asked for.
_CALLER_ERRORS: frozenset[type[Exception]] = frozenset(
    (PlanError, ProgramError, TargetError, AxisTypeError, MissingMeshError, RulesError)
)


@dataclass(frozen=True)
class ProgramTask:
    """One candidate of a user's program to compile (a
    :class:`~shardscope._src.plan.tasks.Task`), as sent to a worker (picklable): the program
    by reference (``FILE.py:FUNCTION``, loaded there as :func:`load_program` loads it;
    ``by_dataflow``: searched array by array), its rules and mesh, the compiler and the
    hardware it is timed on."""

    ref: str
    by_dataflow: bool
    rules_name: str
    rules: tuple[tuple[str, Any], ...]
    mesh: MeshShape
    target: str | None
    axis_types: tuple[str, ...]
    hardware: Hardware
    where: str
    used: tuple[str, ...] | None = None

    def run(self, devices: Sequence[jax.Device] | None = None) -> ProgramFacts:
        """The candidate's plan, compiled on ``devices`` (default: this process's first CPU
        devices; a target's compile-only ones when it names a target), the program loaded
        once per process."""
        key = ProgramRef(self.ref, self.by_dataflow)
        kinds = tuple(jax.sharding.AxisType[n] for n in self.axis_types)
        make_step = _LOADED.get(key)
        if make_step is None:
            make_step = load_program(self.ref)
            if self.by_dataflow:
                make_step, _ = by_dataflow(
                    make_step,
                    None,
                    where=self.where,
                    axes=self.mesh.names,
                    axis_types=kinds,
                )
            _LOADED[key] = make_step
        local = None
        if not self.target:
            local = list(devices or jax.devices("cpu"))[: self.mesh.devices]
        label = self.where.split("(mesh ")[0]
        plan, skipped, fingerprint = _compile_one(
            make_step,
            self.rules_name,
            self.rules,
            self.mesh,
            self.hardware,
            local,
            label,
            self.target,
            kinds,
            self.used,
        )
        return ProgramFacts(plan, fingerprint, skipped)


def _worker_error(error: BaseException, where: str) -> Exception:
    """The error a task's failure in a worker is raised as here: the caller's own class where
    the task raised one (a bad program or rules), else a :class:`ProgramError` naming it."""
    failure = error.failure if isinstance(error, WorkerError) else None
    if failure is not None and failure.error_class in _CALLER_ERRORS:
        return failure.error_class(failure.message)
    return ProgramError(f"{where}: a compile worker failed: {error}")


def rank_plans(plans: Sequence[ProgramPlan], names: Sequence[str]) -> tuple[ProgramPlan, ...]:
    """``plans`` ranked: those that fit first, then by estimated step time, memory, the order
    of their rule set in ``names`` and the mesh sizes (a total order: the same plans give the
    same ranking), with the Pareto front of memory and time marked."""
    order = sorted(plans, key=step_rank_key(list(dict.fromkeys(names))))
    front = memory_time_front(order)
    return tuple(replace(p, rank=k + 1, pareto=k in front) for k, p in enumerate(order))


def _check_program(
    make_step: Callable[..., Any],
    devices: int,
    rules: Any,
    rule_set: str | None,
    axes: Sequence[str] | None,
    meshes: Sequence[str | Mapping[str, int]] | None,
) -> tuple[dict[str, Rules], tuple[str, ...], str]:
    """The rule sets and mesh axes to plan over, once ``make_step`` and they fit together,
    and the words that say where the axes come from.

    The axes are ``axes``, else those the rules file names, else those of the meshes when
    they are given, else those every rule set of the program names: ``rule_set`` chooses
    the set to plan, not the axes, so its plans are the plans of that set the whole sweep
    ranks (meshes with an axis it does not name included)."""
    if not callable(make_step):
        raise PlanError(
            f"make_step must be a function of the mesh, got {type(make_step).__name__}",
            param="make_step",
        )
    if not is_int(devices, 1):
        raise PlanError(f"devices={devices!r}: must be a positive whole number", param="devices")
    found = find_rule_sets(rules, make_step)
    axes_from = "the axes given"
    if found is not None and found.axes:
        if axes:
            raise PlanError(
                f"axes={tuple(axes)!r} and {found.source} both name the mesh axes; keep one",
                param=("axes", "rules"),
            )
        axes, axes_from = found.axes, f"the axes {found.source} names"
    chosen = choose_rule_set(found, rule_set) if rule_set is not None else None
    if chosen is not None:
        rule_sets = dict([chosen])
    else:
        rule_sets = dict(found.sets) if found is not None else normalize_rules(None)
    if axes is None and meshes:
        axes, axes_from = tuple(parse_mesh_spec(meshes[0])), "the axes of the first mesh"
        for name, pairs in rule_sets.items():
            lacking = [a for a in rules_axes({name: pairs}) if a not in axes]
            if lacking:
                raise PlanError(
                    f"rule set {name!r} shards over mesh axis {lacking[0]!r}, which the meshes "
                    f"lack (their axes: {', '.join(axes)}); give meshes with {lacking[0]!r}, "
                    f"or plan another rule set",
                    param=("meshes", "rule_set"),
                )
    elif axes is None:
        axes = rules_axes(dict(found.sets) if found is not None else rule_sets)
        axes_from = "the axes the program's rule sets name"
        if found is not None:
            axes_from = f"the axes the rule sets of {found.source} name"
    axes = tuple(axes)
    if not axes:
        raise PlanError(
            "no mesh axes to plan over: give rules that map logical names to mesh axes, or "
            "the axes (axes=('data', 'model'); on the command line --axes data,model)",
            param="axes",
        )
    if len(set(axes)) != len(axes):
        raise PlanError(f"axes {axes} name an axis twice", param="axes")
    check_rules_axes(rule_sets, axes)
    if len(rule_sets) > 1 or any(rule_sets.values()):
        if not takes_rules(make_step) and not uses_flax(make_step):
            raise PlanError(
                "make_step(mesh) takes no rules and the program does not use Flax, so every "
                "rule set would give the same program; write make_step(mesh, rules) and build "
                "the shardings with shardscope.logical_to_spec(names, rules)",
                param="make_step",
            )
    return rule_sets, axes, axes_from


def one_compiler(target: str | None, compiler: str | None) -> str | None:
    """The target of ``target=`` or of ``compiler=``, the name :func:`shardscope.plan` and
    the command line give the same choice (``"cpu"``: simulated CPU devices, None); a
    :class:`PlanError` when both are given and differ."""
    if compiler is None:
        return target
    if target is not None and target != compiler:
        raise PlanError(
            f"target={target!r} and compiler={compiler!r} name one choice twice; give one of them",
            param="compiler",
        )
    return compiler


def target_hardware(
    target: str | None,
    hardware: str | Hardware | None,
    overrides: Mapping[str, float] | None,
    devices: int,
) -> tuple[str | None, Hardware]:
    """The target whose compiler compiles (None: the CPU) and the hardware timed on (the
    target's own unless ``hardware`` is given)."""
    target_name: str | None = None
    if target is not None:
        t = get_target(target)
        if t.family != Family.CPU:
            require_compiler(t, devices)  # also refuses a device count it is not built with
            target_name = t.name
            if hardware is None:
                hardware = t.hardware
    return target_name, get_hardware(hardware or "h100", **dict(overrides or {}))


def _program_plan(
    rules_name: str,
    rules: Rules,
    sizes: Mapping[str, int],
    compiled: tuple[CompiledProgram, Mapping[str, float], int, str, int | None],
    hw: Hardware,
    same_as: str | None,
) -> ProgramPlan:
    """The plan of one rule set on one mesh shape from its compile."""
    program, timing, itemsize, _, whole = compiled
    result = program.audit
    collectives = program.plan_collectives(itemsize=itemsize)
    comm = axis_comm(hw, sizes, collectives, Bound("none", (), ()))
    notes = []
    if program.rematerializations:
        sites = sorted({x.source or x.op_name or "?" for x in program.rematerializations})
        notes.append(Note(PlanNote.REMATERIALIZATION, {"sites": sites}))
    if program.memory_pressure is not None:
        compiler = get_target(result.target or CPU).capabilities.compiler
        pressure = {"compiler": compiler, **program.memory_pressure.to_dict()}
        notes.append(Note(PlanNote.MEMORY_PRESSURE, pressure))
    if not program.exact:
        notes.append(Note(PlanNote.INEXACT))
    if program.ragged_dots is not None:
        compiler = get_target(result.target or CPU).capabilities.compiler
        ragged = program.ragged_dots
        values = {"compiler": compiler, "count": ragged.count, "groups": ragged.groups}
        notes.append(Note(PlanNote.RAGGED_DOT_DENSE, values))
    # The compiler's own count where it gives one (CPU, TPU), else the HLO's (GPU).
    flops = program.flops if program.flops is not None else program.hlo_flops
    return ProgramPlan(
        rules_name=rules_name,
        rules=rules,
        mesh=dict(sizes),
        compiled_memory=program.memory,
        memory_limit_bytes=int(hw.memory_bytes),
        collectives=collectives,
        comm=comm,
        comm_time_s=sum(a.time_s for a in comm),
        flops_per_device=flops,
        compute_time_s=compute_seconds(program, hw, flops or 0.0),
        notes=tuple(notes),
        timing=timing,
        exact=program.exact,
        same_as=same_as,
        target=result.target or CPU,
        exposed_time_s=exposed_seconds(program, hw),
        matmul_flops_per_device=result.hlo_flops,
        step_matmul_flops=whole,
    )


def exposed_seconds(program: CompiledProgram, hw: Hardware) -> float | None:
    """The communication of one step of ``program`` on ``hw`` that the compute its
    compiler scheduled beside it does not hide: each collective priced on ``hw`` and, where
    asynchronous, less the compute scheduled in its window, or the compute it takes from
    that window, whichever is more (:func:`~shardscope._src.audit.pricing.priced`: the
    audit's exposed time, by the training step's one overlap rule). None where the CPU's
    compiler built it: it runs each collective on its own, and its schedule is no
    accelerator's. The audit priced its collectives on its target's hardware already: where
    that is ``hw``, its exposure is taken as it is, not priced again."""
    result = program.audit
    if result.program is None or get_target(result.target or CPU).family is Family.CPU:
        return None
    exposure = result.exposure()
    if exposure is not None and get_hardware(str(result.priced_on)) == hw:
        return exposure.exposed_s
    found = priced(result.collectives, result.program.module, result.mesh_axes, hw)
    return sum(c.overlap.exposed_s * c.count for c in found if c.overlap is not None)


def compute_seconds(program: CompiledProgram, hw: Hardware, flops: float) -> float:
    """The compute of one step of ``program`` on ``hw``, its ``flops`` of matmuls at the time
    model's rate (peak x ``matmul_fraction``, train/timing.py's), each matmul at the rate of
    the arithmetic its HLO states (its operands' type and precision:
    :func:`~shardscope._src.cost.compute.dot_seconds`; f32 ones on a GPU as TF32, the CPU
    compiler's f32 products of widened 16-bit operands as 16-bit ones): compiled by an
    accelerator's compiler, its kernels as that compiler fused them, each reading and writing
    its bytes through HBM; on a GPU one after another, each the longer of its arithmetic and
    its traffic and never less than the least a kernel runs, each launched at
    ``kernel_launch_s``; on a TPU the slower of its matmuls and its traffic (as a compiled
    serving step is timed, :func:`~shardscope._src.cost.compute.compiled_step_seconds`).
    Compiled by the CPU's compiler, whose fusions and bytes are no accelerator's, its
    matmuls alone; on a GPU each of them a kernel of its own there too (a library call or a
    fusion of one), so each at least the least a kernel runs and launched: a step never
    priced below what its matmuls' kernels take on the device."""
    result = program.audit
    on_cpu = get_target(result.target or CPU).family is Family.CPU
    if result.program is None or (not on_cpu and result.hlo_bytes is None):
        return matmul_seconds(hw, flops)
    # XLA:CPU widens 16-bit products to f32: their operands' conversions say they were 16-bit
    runs: Mapping[Kernel, int] = kernel_costs(result.program.module, widened=on_cpu)
    compute_s = counted_matmul_seconds(hw, flops, total(k.cost * n for k, n in runs.items()))
    if on_cpu and not by_kernel(hw):
        return compute_s
    if on_cpu:  # its matmuls' kernels alone, their arithmetic without the CPU's bytes
        matmuls: Counter[Kernel] = Counter()
        for k, n in runs.items():
            if k.cost.flops:
                matmuls[Kernel(k.cost.matmuls, k.fused)] += n
        runs = matmuls
    return compiled_step_seconds(
        hw,
        memory_s=sum(n * moved_seconds(hw, k.cost) for k, n in runs.items()),
        compute_s=compute_s,
        kernels_s=kernels_seconds(hw, runs) if by_kernel(hw) else None,
        comm_s=0.0,
        kernels=sum(runs.values()),
    )


def compiled_plan(
    program: CompiledProgram, hw: Hardware, *, name: str = "as compiled"
) -> ProgramPlan:
    """The plan :func:`plan_program` makes of one program compiled already (its mesh the
    audit's, its collectives as compiled): the planner's figures for a program that is not
    to be compiled again (``shardscope.profile`` sets them beside what a run measured)."""
    timing: dict[str, float] = {}
    plan = (program, timing, 4, "", None)
    return _program_plan(name, (), dict(program.audit.mesh_axes), plan, hw, None)


def _indivisible(error: BaseException) -> bool:
    """Whether ``error`` says a shape the mesh does not divide (the planner's "divisibility";
    anything else a program raises is an "error"): our LayoutError, or JAX's refusal."""
    return isinstance(error, LayoutError) or _jax_refused_indivisible(error)


def _jax_refused_indivisible(error: BaseException) -> bool:
    """Whether ``error`` is JAX refusing a shape its sharding does not divide."""
    # JAX (0.10.2) has no public class for this refusal: on Auto axes it raises
    # jax._src.sharding.IndivisibleError, on Explicit ones a plain ValueError. The class's
    # name and the message's words are all there is to tell it by, so this is the one place
    # that reads them.
    if type(error).__name__ == "IndivisibleError":
        return True
    return isinstance(error, ValueError) and "does not evenly divide" in str(error)


def program_name(fn: Any) -> str:
    """What the output calls the program of ``fn``: ``module:qualname`` (its qualified name
    alone for the running script's functions)."""
    mod = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "make_step"
    return f"{mod}:{qual}" if mod and mod != "__main__" else qual


def mesh_list(
    meshes: Sequence[str | Mapping[str, int]] | None,
    axes: tuple[str, ...],
    devices: int,
    *,
    axes_from: str = "",
) -> list[MeshShape]:
    """The mesh shapes to plan over: ``meshes`` checked (each with the ``axes``, in order,
    and ``devices`` devices), or every shape of :func:`mesh_shapes` when None. ``axes_from``
    says where the axes come from (``"the axes of the first mesh"``), in the refusal of a
    mesh with others."""
    if meshes is None:
        return mesh_shapes(devices, axes)
    out = []
    for m in meshes:
        sizes = MeshShape.of(m)
        if sizes.names != axes:
            raise PlanError(
                f"mesh {m!r} has axes {', '.join(sizes)}; every mesh must have the axes "
                f"{', '.join(axes)}, in that order" + (f" ({axes_from})" if axes_from else ""),
                param="meshes",
            )
        if sizes.devices != devices:
            raise PlanError(f"mesh {m!r} holds {sizes.devices} devices, not {devices}")
        out.append(sizes)
    return out


def _time_model_values(
    hw: Hardware, plans: Sequence[ProgramPlan], target: str | None
) -> ProgramTimeModelValues:
    """The time model's note: ``hw``, and the compiler whose schedule priced the plans'
    exposed communication where one did (every plan of a sweep is one compiler's)."""
    scheduled = any(p.exposed_time_s is not None for p in plans)
    compiler = get_target(target or CPU).capabilities.compiler if scheduled else None
    return ProgramTimeModelValues(hardware=hw, scheduled_by=compiler)


def _result_notes(hw: Hardware, plans: Sequence[ProgramPlan], target: str | None) -> list[Note]:
    notes = [
        Note(PlanNote.COMPILED_MEMORY, {"target": target}),
        Note(PlanNote.COMMUNICATION),
        Note(PlanNote.PROGRAM_TIME_MODEL, _time_model_values(hw, plans, target)),
    ]
    if any(p.flops_per_device is None for p in plans):
        notes.append(Note(PlanNote.NO_FLOP_COUNT))
    same = [(p.label, p.same_as, p.mesh_spec) for p in plans if p.same_as]
    if same:
        notes.append(Note(PlanNote.IDENTICAL_PROGRAMS, {"same": same}))
    if any(c.payload_bytes != c.cpu_payload_bytes for p in plans for c in p.collectives):
        compiler = get_target(target or CPU).capabilities.compiler
        values = {"dtype": "16-bit", "itemsize": 2, "compiler": compiler}
        notes.append(Note(PlanNote.WIDENED, values))
    ragged = [n for p in plans for n in p.notes if n.kind == PlanNote.RAGGED_DOT_DENSE]
    if ragged:  # once for the sweep (the best plan's), where the terminal shows notes
        notes.append(ragged[0])
    best = next((p for p in plans if p.fits), None)
    repeated = None if best is None else repeated_work_note(best)
    if repeated is not None:
        notes.append(repeated)
    return notes


def repeated_work_note(
    plan: ProgramPlan, *, what: str = "the best", label: str | None = None
) -> Note | None:
    """Where at least one device's worth of ``plan``'s work repeats other devices' (its
    :attr:`~ProgramPlan.working_devices` at most its devices less one): how many devices do
    distinct work, how many copies of each share, and, where those are a whole number that
    divides the devices, that so many devices would compute its step as fast (``what`` and
    ``label``, default its label: how the note names the plan)."""
    working, copies = plan.working_devices, plan.work_copies
    if working is None or copies is None or working > plan.devices - 1:
        return None
    values = RepeatedWorkValues(
        label=plan.label if label is None else label,
        what=what,
        devices=plan.devices,
        working=working,
        copies=copies,
    )
    return Note(PlanNote.REPEATED_WORK, values)
