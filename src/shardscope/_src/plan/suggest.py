"""Suggesting logical-axis rules for a user's program: searched, screened, then compiled.

How it searches, and why this way:

1. **The program's arrays, once.** ``make_step`` is built on a probe mesh whose axes are the
   program's logical names (each of size 1) under the identity rules (``embed -> embed``), so
   every argument's ``PartitionSpec`` spells its dimensions' logical names. One build, one
   device, nothing compiled. Flax NNX passes a name its rules do not map through as it is,
   so a program naming an axis the rules lack fails here, with the name.
2. **Every candidate.** Each mesh shape of the devices over the axes (:func:`mesh_shapes`)
   times each assignment of every logical name to one mesh axis or to none. An axis of size 1
   shards nothing, so it counts as none and equal candidates are kept once. A candidate is
   dropped when an array would use a mesh axis twice (Flax NNX refuses that) or a dimension
   is not divisible by its axes.
3. **A cheap screen.** Arithmetic on the probed arrays alone: bytes per device of the
   arguments; compute as the step's FLOPs (JAX's count of the probe's lowering) over the
   devices doing distinct work (the batch's axes split all of it, a model axis the share of
   the weights it splits); and, as communication, an all-reduce over each used mesh axis
   an array is replicated over (a weight replicated over the data axis reduces its gradient,
   an input replicated over the model axis meets partial sums), and a gather and a scatter
   of each array sharded over an axis that also splits other names (FSDP's weights), priced
   per axis with the hardware's alpha-beta; and for a weight split over an axis the batch
   does not use, the tokens' activations through it (``flops / (6 x weights)`` tokens) met
   across that axis, forward and backward (Megatron's tensor parallelism). It cannot see
   what the compiler will do, only rank.
4. **The compiler decides.** The leading ``top`` of the screen (the leader of each mesh
   shape first, since the screen is coarse) are compiled by the planner's
   own compile loop (``compile_and_rank``, the one :func:`plan_program` runs) and ranked as it
   ranks: those that fit first, then the estimated step time. Every order is total (ties fall
   to the mesh sizes and the rules), so the same input gives the same ranking.

Exhaustive enumeration is affordable because a program has few logical names (3**7 for seven
names on two axes) and the screen is arithmetic; the compiles, seconds each, are what is
budgeted.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from shardscope._src.audit.stages import build_step, check_step_pair, lower, program_stage
from shardscope._src.base.atomic import write_json_atomic
from shardscope._src.base.comm import format_bytes, traffic_bytes
from shardscope._src.base.errors import PlanError, RulesError, is_int, one_line
from shardscope._src.base.records import record_dict
from shardscope._src.mesh import axis_types_of, make_mesh
from shardscope._src.plan.compile import local_devices
from shardscope._src.plan.program import (
    ProgramPlan,
    ProgramPlanResult,
    _mesh_list,
    _name_of,
    _target_hardware,
    compile_and_rank,
    mesh_shapes,
    plan_program,
)
from shardscope._src.plan.types import Skipped
from shardscope._src.sharding.rules import (
    Rules,
    RuleSets,
    check_rules_axes,
    find_rule_sets,
    rules_context,
    takes_rules,
    uses_flax,
)
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.links import collective_seconds

#: The mesh axes searched when neither the rules nor the caller name any.
DEFAULT_AXES = ("data", "model")
#: How many of the screen's leaders are compiled by default.
DEFAULT_TOP = 8
#: The rule set name the written rules file holds.
SUGGESTED = "suggested"


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbedArray:
    """One argument of the program: its path, shape, bytes per element and the logical names
    of each dimension (empty for a dimension the program does not name)."""

    path: str
    shape: tuple[int, ...]
    itemsize: int
    names: tuple[tuple[str, ...], ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Screen:
    """The screen's arithmetic for one candidate (a ranking, not a prediction)."""

    argument_bytes_per_device: int
    compute_time_s: float
    comm_time_s: float
    fits: bool

    @property
    def step_time_s(self) -> float:
        return self.compute_time_s + self.comm_time_s


@dataclass(frozen=True)
class ArrayShard:
    """One argument under a proposal: its spec over the mesh axes and its bytes per device."""

    path: str
    shape: tuple[int, ...]
    spec: tuple[str | None, ...]
    bytes_per_device: int


@dataclass(frozen=True)
class Proposal:
    """One suggested rule set on one mesh shape, compiled; ``rank`` 1 is the best.

    ``plan`` is the planner's record of the compile (collectives, memory, time); ``ratio`` the
    step time over that of the best plan of the user's own rules (None without them).
    """

    plan: ProgramPlan
    screen: Screen
    arrays: tuple[ArrayShard, ...]
    ratio: float | None = None

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def mesh(self) -> Mapping[str, int]:
        return self.plan.mesh

    @property
    def rules(self) -> Rules:
        return self.plan.rules

    @property
    def label(self) -> str:
        return self.plan.label

    @property
    def memory_bytes_per_device(self) -> int:
        return self.plan.memory_bytes_per_device

    @property
    def step_time_s(self) -> float:
        return self.plan.step_time_s

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def rules_file(self, axes: Sequence[str]) -> dict[str, Any]:
        """The rules file of this proposal, as ``audit``, ``plan --program`` and ``suggest``
        read one; its pairs are what Flax's ``logical_axis_rules`` takes."""
        return {"axes": list(axes), "rules": {SUGGESTED: [list(p) for p in self.rules]}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "label": self.label,
            "mesh": dict(self.mesh),
            "rules": [list(p) for p in self.rules],
            "memory_bytes_per_device": self.memory_bytes_per_device,
            "step_time_s": self.step_time_s,
            "fits": self.fits,
            "ratio_to_own": self.ratio,
            "screen": record_dict(self.screen, extra=("step_time_s",)),
            "arrays": [record_dict(a) for a in self.arrays],
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class SuggestResult:
    """A search of a program's shardings: proposals best first, and how the search went."""

    program: str
    devices: int
    hardware: Hardware
    axes: tuple[str, ...]
    names: tuple[str, ...]
    arrays: tuple[ProbedArray, ...]
    proposals: tuple[Proposal, ...]
    skipped: tuple[Skipped, ...]
    own: ProgramPlanResult | None
    candidates: int
    compiled: int
    target: str = "cpu"
    wall_s: float = 0.0
    timing: Mapping[str, float] = field(default_factory=dict)

    @property
    def best(self) -> Proposal | None:
        """The fastest compiled proposal that fits the device memory (None when none fits)."""
        return next((p for p in self.proposals if p.fits), None)

    @property
    def own_best(self) -> ProgramPlan | None:
        """The best plan of the user's own rules (None without rules, or when none fits)."""
        return None if self.own is None else self.own.best

    @property
    def fit_advice(self) -> str | None:
        """When no proposal fits: the arrays that dominate the smallest and the smallest
        device count whose screen fits (None when one fits)."""
        if self.best is not None:
            return None
        return no_fit_advice(self.arrays, self.names, self.axes, self.devices, self.hardware)

    def rules_file(self) -> dict[str, Any]:
        """The best proposal's rules file (raises when none fits)."""
        if self.best is None:
            raise PlanError(self.fit_advice or f"no proposal for {self.program}")
        return self.best.rules_file(self.axes)

    def write_rules(self, path: Any) -> None:
        """Writes :meth:`rules_file` to ``path`` atomically."""
        write_json_atomic(path, self.rules_file())

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "devices": self.devices,
            "hardware": self.hardware.name,
            "target": self.target,
            "axes": list(self.axes),
            "names": list(self.names),
            "candidates": self.candidates,
            "compiled": self.compiled,
            "wall_s": self.wall_s,
            "timing": dict(self.timing),
            "best": None if self.best is None else self.best.label,
            "fit_advice": self.fit_advice,
            "proposals": [p.to_dict() for p in self.proposals],
            "skipped": [record_dict(s) for s in self.skipped],
            "own_best": None if self.own_best is None else self.own_best.to_dict(),
        }


# -- the probe ----------------------------------------------------------------------------------


def probe_program(
    make_step: Callable[..., Any], names: Sequence[str], *, where: str, axis_type: Any = None
) -> tuple[tuple[ProbedArray, ...], float]:
    """The program's arguments with their logical names, and the step's FLOPs (JAX's count
    of the lowering; 0 when it gives none), from one build on a one-device mesh whose axes
    are ``names``.

    Raises:
        RulesError: the program could not be built with its logical names as the axes (it
            names one that ``names`` lacks, or a mesh axis of its own).
    """
    mesh = make_mesh(
        {n: 1 for n in names},
        devices=jax.devices()[:1],
        axis_types=axis_type,
    )
    identity = tuple((n, n) for n in names)
    try:
        got = build_step(make_step, mesh, identity, where=where)
        if program_stage(got) is not None:
            raise RulesError(
                f"{where} returned a lowered or compiled program; suggest needs (step, args) "
                f"to search its shardings"
            )
        step, args = check_step_pair(got, where)
        with jax.set_mesh(mesh), rules_context(identity):
            lowered = lower(step, args, {})
    except RulesError:
        raise
    except Exception as e:
        raise RulesError(
            f"{where} could not be built with its logical names ({', '.join(names)}) as the "
            f"mesh's axes: a name it uses is missing from the rules, or it names mesh axes "
            f"of its own; {one_line(e)}",
            param=("rules", "logical_axes"),
        ) from e
    arrays = []
    flat = jax.tree_util.tree_flatten_with_path(args)[0]
    for path, leaf in flat:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        spec = getattr(getattr(leaf, "sharding", None), "spec", None) or ()
        dims = []
        for i in range(len(shape)):
            entry = spec[i] if i < len(spec) else None
            dims.append(() if entry is None else (entry,) if isinstance(entry, str) else entry)
        arrays.append(
            ProbedArray(
                path=jax.tree_util.keystr(path),
                shape=tuple(int(d) for d in shape),
                itemsize=jnp.dtype(dtype).itemsize,
                names=tuple(tuple(d) for d in dims),
            )
        )
    cost = lowered.cost_analysis() or {}
    return tuple(arrays), float(cost.get("flops", 0.0) or 0.0)


# -- the search and the screen ------------------------------------------------------------------


def _spec(array: ProbedArray, assign: Mapping[str, str | None]) -> tuple[str | None, ...] | None:
    """``array``'s spec under ``assign`` (one mesh axis or None per dimension), or None when
    it uses a mesh axis twice."""
    used: set[str] = set()
    out: list[str | None] = []
    for names in array.names:
        axes = [a for n in names if (a := assign.get(n)) is not None]
        if len(axes) > 1 or any(a in used for a in axes):
            return None
        used.update(axes)
        out.append(axes[0] if axes else None)
    return tuple(out)


def _shards(spec: Sequence[str | None], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in spec if a is not None)


def _divisible(array: ProbedArray, spec: Sequence[str | None], sizes: Mapping[str, int]) -> bool:
    return all(a is None or d % sizes[a] == 0 for d, a in zip(array.shape, spec, strict=True))


@dataclass(frozen=True)
class Workload:
    """What the screen knows of a step beyond its arrays: its FLOPs, each array's number of
    copies (a weight and its optimizer moments share shape and names), the names of the
    weights (those of the most-copied arrays) and the tokens, ``flops / (6 x weights)``."""

    flops: float
    copies: tuple[int, ...]
    weight_names: frozenset[str]
    tokens: float


def workload(arrays: Sequence[ProbedArray], flops: float) -> Workload:
    """The :class:`Workload` of a probed program."""
    keys = [(a.shape, a.names) for a in arrays]
    count = {k: keys.count(k) for k in keys}
    copies = tuple(count[k] for k in keys)
    most = max(copies, default=1)
    weights = [a for a, c in zip(arrays, copies, strict=True) if c == most and a.names]
    names = frozenset(n for a in weights for d in a.names for n in d)
    params = sum(math.prod(a.shape) for a in weights) / most
    return Workload(flops, copies, names, flops / (6 * params) if params else 0.0)


def screen(
    arrays: Sequence[ProbedArray],
    assign: Mapping[str, str | None],
    sizes: Mapping[str, int],
    work: Workload,
    hw: Hardware,
) -> Screen | None:
    """The screen of one candidate, or None when an array cannot take it (an axis twice, or
    a dimension its axes do not divide)."""
    used = sorted({a for a in assign.values() if a is not None}, key=list(sizes).index)
    shared = {a: sum(v == a for v in assign.values()) > 1 for a in used}
    batch = {a for n, a in assign.items() if a is not None and n not in work.weight_names}
    split = math.prod(sizes[a] for a in batch)
    memory = 0
    comm = 0.0

    def price(kind: str, axis: str, payload: float) -> float:
        n = sizes[axis]
        sent = traffic_bytes(kind, int(payload), n)
        return collective_seconds(hw, sizes, kind, (axis,), n, sent)

    for array, copies in zip(arrays, work.copies, strict=True):
        spec = _spec(array, assign)
        if spec is None or not _divisible(array, spec, sizes):
            return None
        local = array.nbytes // _shards(spec, sizes)
        memory += local
        for axis in used:
            if axis not in spec:
                # a gradient reduced, or partial sums met, once per weight (not per moment)
                comm += price("all-reduce", axis, local) / copies
            elif shared[axis]:
                # the axis splits other dimensions too: gathered where it is used and its
                # gradient scattered back (as FSDP's weights are)
                comm += 2 * price("all-gather", axis, local * sizes[axis]) / copies
            elif axis not in batch and array.names and copies > 1:
                # a weight split over a model axis: the tokens' activations through it meet
                # partial sums or are gathered, forward and backward (Megatron's)
                width = array.nbytes // max(array.shape[spec.index(axis)], 1) / array.itemsize
                acts = work.tokens / split * width * array.itemsize
                comm += 2 * price("all-reduce", axis, acts) / copies
    # The batch's axes split all the work; a model axis only that of the weights it splits.
    parallel = float(split)
    total = sum(math.prod(a.shape) for a, c in zip(arrays, work.copies, strict=True) if c > 1)
    for axis in used:
        if axis in batch or not total:
            continue
        part = sum(
            math.prod(a.shape)
            for a, c in zip(arrays, work.copies, strict=True)
            if c > 1 and axis in (_spec(a, assign) or ())
        )
        parallel /= 1 - part / total + part / total / sizes[axis]
    compute = work.flops / parallel / (hw.peak_flops * hw.matmul_fraction)
    return Screen(memory, compute, comm, memory <= hw.memory_bytes)


def candidates(
    names: Sequence[str], axes: Sequence[str], shapes: Sequence[Mapping[str, int]]
) -> list[tuple[dict[str, int], dict[str, str | None]]]:
    """Every ``(mesh sizes, assignment)``: each name to one axis of size > 1 or to none,
    each once per mesh shape, in a fixed order."""
    out = []
    for sizes in shapes:
        live = [a for a in axes if sizes[a] > 1]
        for choice in itertools.product((None, *live), repeat=len(names)):
            out.append((dict(sizes), dict(zip(names, choice, strict=True))))
    return out


def no_fit_advice(
    arrays: Sequence[ProbedArray],
    names: Sequence[str],
    axes: Sequence[str],
    devices: int,
    hw: Hardware,
    *,
    doublings: int = 12,
) -> str:
    """Which arrays dominate the smallest candidate, and the smallest device count (the
    devices times a power of two) whose arguments alone fit, by the screen's arithmetic."""

    def smallest(n: int) -> tuple[int, dict[str, int], dict[str, str | None]] | None:
        best = None
        for sizes, assign in candidates(names, axes, mesh_shapes(n, axes)):
            s = screen(arrays, assign, sizes, work, hw)
            if s is not None and (best is None or s.argument_bytes_per_device < best[0]):
                best = (s.argument_bytes_per_device, sizes, assign)
        return best

    work = workload(arrays, 0.0)
    here = smallest(devices)
    words = [f"no proposal fits {format_bytes(hw.memory_bytes)} per device on {hw.name}"]
    if here is not None:
        need, sizes, assign = here
        per = []
        for a in arrays:
            spec = _spec(a, assign) or ()
            per.append((a.nbytes // _shards(spec, sizes), a.path))
        top = sorted(per, reverse=True)[:3]
        words.append(
            f"the smallest needs {format_bytes(need)} of arguments alone, mostly "
            + ", ".join(f"{p} ({format_bytes(b)})" for b, p in top)
        )
    fits_at = None
    for k in range(1, doublings + 1):
        got = smallest(devices * 2**k)
        if got is not None and got[0] <= hw.memory_bytes:
            fits_at = devices * 2**k
            break
    if fits_at is None:
        words.append(f"no device count up to {devices * 2**doublings} fits")
    else:
        words.append(f"the smallest device count whose arguments fit is {fits_at}")
    return "; ".join(words)


# -- the front door -----------------------------------------------------------------------------


def suggest(
    make_step: Callable[..., Any],
    devices: int = 8,
    *,
    target: str | None = None,
    hardware: str | Hardware | None = None,
    rules: Any = None,
    logical_axes: Sequence[str] | None = None,
    axes: Sequence[str] | None = None,
    top: int = DEFAULT_TOP,
    axis_types: Any = None,
    name: str | None = None,
) -> SuggestResult:
    """Proposes logical-axis rules and a mesh shape for a program, proved by compiling them.

    Searches every mesh shape of ``devices`` over ``axes`` and every assignment of the
    program's logical names to a mesh axis (or none), screens them with arithmetic on the
    program's arrays and compiles the leading ``top`` with the planner's compile loop,
    ranked as :func:`plan_program` ranks (those that fit first, then the step time). The
    module docstring of ``shardscope._src.plan.suggest`` says how and why.

    Args:
        make_step: ``make_step(mesh, rules)`` returning ``(step, args)``, as
            :func:`plan_program` takes it; its arrays are named with logical names (Flax
            NNX's ``with_partitioning``, :func:`shardscope.logical_to_spec`).
        devices: accelerators to plan for; this process must simulate as many.
        target: compile with this target's compiler (``"h100"``, ``"tpu-v5p"``), deviceless;
            None: simulated CPU devices.
        hardware: the preset the step is timed on (default: the target's, else ``h100``).
        rules: the user's own rule sets, read as :func:`plan_program` reads them (default the
            ``RULES`` of ``make_step``'s module): their logical names are searched and their
            best plan is the yardstick of every proposal's ``ratio``.
        logical_axes: the program's logical names, when no rules name them.
        axes: the mesh axes (default: the rules file's, else ``("data", "model")``).
        top: how many of the screen's leaders to compile.
        axis_types: the meshes' axis types, as in :func:`shardscope.make_mesh`.
        name: what to call the program in the output.

    Returns:
        A :class:`SuggestResult`: ``proposals`` ranked, ``best``, ``to_dict()``, and
        ``write_rules(path)`` for a rules file that ``audit``, ``plan --program`` and Flax's
        ``logical_axis_rules`` (its pairs) take as they are.

    Raises:
        RulesError: no logical names to search, rules naming a mesh axis not among ``axes``,
            or a program that uses a logical name the rules lack (the error names them).
        PlanError: too few devices, a bad ``top``, or a ``make_step`` that takes no rules.

    >>> result = suggest(make_step, 8, axis_types="auto")  # doctest: +SKIP
    >>> result.best.label, result.best.fits  # doctest: +SKIP
    ('suggest-3 data=8,model=1', True)
    """
    start = time.perf_counter()
    if not is_int(top, 1):
        raise PlanError(f"top={top!r}: must be a positive whole number", param="top")
    if not is_int(devices, 1):
        raise PlanError(f"devices={devices!r}: must be a positive whole number", param="devices")
    label = name or _name_of(make_step)
    found = find_rule_sets(rules, make_step)
    axes = _axes(found, axes)
    names = _logical_names(found, logical_axes)
    if not takes_rules(make_step) and not uses_flax(make_step):
        raise PlanError(
            "make_step(mesh) takes no rules and the program does not use Flax, so no rules "
            "can change it; write make_step(mesh, rules) and build the shardings with "
            "shardscope.logical_to_spec(names, rules)",
            param="make_step",
        )
    target_name, hw = _target_hardware(target, hardware, None, devices)
    local = None
    if target_name is None:
        local = local_devices(devices, otherwise=" (the command line does it for you)")
    kinds = axis_types_of(axis_types, axes)

    t0 = time.perf_counter()
    arrays, flops = probe_program(make_step, names, where=f"{label}(probe)", axis_type=kinds[0])
    t1 = time.perf_counter()
    shapes = _mesh_list(None, axes, devices)
    work = workload(arrays, flops)
    screened: dict[tuple[tuple[int, ...], tuple[tuple[str, str | None], ...]], Screen] = {}
    for sizes, assign in candidates(names, axes, shapes):
        s = screen(arrays, assign, sizes, work, hw)
        if s is not None:
            screened.setdefault((tuple(sizes.values()), tuple(assign.items())), s)
    order = sorted(
        screened.items(),
        key=lambda kv: (
            not kv[1].fits,
            kv[1].step_time_s,
            kv[1].argument_bytes_per_device,
            kv[0][0],
            tuple(a or "" for _, a in kv[0][1]),
        ),
    )
    # Candidates that shard every array and name alike (an axis renamed, or a mesh's axes
    # swapped) compile to the same program: the first of each in the screen's order is kept.
    # The screen is a coarse guide, so the leader of each mesh shape is compiled first, then
    # the screen's next best.
    unique = []
    signatures: set[tuple[Any, ...]] = set()
    for key, s in order:
        sig = _signature(dict(zip(axes, key[0], strict=True)), dict(key[1]))
        if sig not in signatures:
            signatures.add(sig)
            unique.append((key, s))
    firsts = list({key[0]: (key, s) for key, s in reversed(unique)}.values())[::-1]
    lead = (firsts + [c for c in unique if c not in firsts])[:top]
    t2 = time.perf_counter()
    todo: list[tuple[str, Rules, Mapping[str, int]]] = []
    by_name: dict[str, tuple[Screen, dict[str, int], tuple[tuple[str, str | None], ...]]] = {}
    for i, ((sizes_t, rules_t), s) in enumerate(lead, start=1):
        sizes = dict(zip(axes, sizes_t, strict=True))
        rn = f"suggest-{i}"
        todo.append((rn, rules_t, sizes))
        by_name[rn] = (s, sizes, rules_t)
    ranked, skipped = compile_and_rank(
        make_step, todo, hw, local, label=label, target=target_name, kinds=kinds
    )
    t3 = time.perf_counter()
    own = None
    if found is not None:
        own = plan_program(
            make_step,
            devices,
            rules=dict(found.sets),
            axes=axes,
            hardware=hw,
            target=target_name,
            axis_types=axis_types,
            name=label,
        )
    own_time = None if own is None or own.best is None else own.best.step_time_s
    proposals = []
    for plan in ranked:
        s, sizes, rules_t = by_name[plan.rules_name]
        assign = dict(rules_t)
        shards = tuple(
            ArrayShard(a.path, a.shape, spec, a.nbytes // _shards(spec, sizes))
            for a in arrays
            if (spec := _spec(a, assign)) is not None
        )
        ratio = None if not own_time else plan.step_time_s / own_time
        proposals.append(Proposal(plan, s, shards, ratio))
    return SuggestResult(
        program=label,
        devices=devices,
        hardware=hw,
        axes=axes,
        names=names,
        arrays=arrays,
        proposals=tuple(proposals),
        skipped=tuple(skipped),
        own=own,
        candidates=len(screened),
        compiled=len(todo),
        target=target_name or "cpu",
        wall_s=time.perf_counter() - start,
        timing={
            "probe_s": t1 - t0,
            "screen_s": t2 - t1,
            "compile_s": t3 - t2,
            "own_s": time.perf_counter() - t3,
        },
    )


def _signature(sizes: Mapping[str, int], assign: Mapping[str, str | None]) -> tuple[Any, ...]:
    """What a candidate shards, up to the names of the mesh axes: each name's axis size, and
    which names share an axis."""
    order: list[str] = []
    for a in assign.values():
        if a is not None and a not in order:
            order.append(a)
    return tuple(
        (n, 1, -1) if a is None else (n, sizes[a], order.index(a)) for n, a in assign.items()
    )


def _axes(found: RuleSets | None, axes: Sequence[str] | None) -> tuple[str, ...]:
    if found is not None and found.axes:
        if axes:
            raise PlanError(
                f"axes={tuple(axes)!r} and {found.source} both name the mesh axes; keep one",
                param=("axes", "rules"),
            )
        axes = found.axes
    out = tuple(axes or DEFAULT_AXES)
    if len(set(out)) != len(out):
        raise PlanError(f"axes {out} name an axis twice", param="axes")
    if found is not None:
        check_rules_axes(found.sets, out)
    return out


def _logical_names(found: RuleSets | None, logical_axes: Sequence[str] | None) -> tuple[str, ...]:
    """The logical names to search: ``logical_axes`` and those the rules name, in order."""
    seen: dict[str, None] = dict.fromkeys(logical_axes or ())
    for rules in found.sets.values() if found is not None else ():
        for logical, _ in rules:
            seen.setdefault(logical, None)
    if not seen:
        raise RulesError(
            "no logical axis names to search: give rules (pairs, named sets or a rules file), "
            "define RULES in the program's module, or name them with logical_axes=('batch', "
            "'embed', ...)",
            param=("rules", "logical_axes"),
        )
    bad = [n for n in seen if not isinstance(n, str) or not n]
    if bad:
        raise RulesError(f"logical axis names {bad!r} must be non-empty strings")
    return tuple(seen)
