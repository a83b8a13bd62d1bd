"""The verdict's hints: changes that should bring a program to its bound, each compiled and
audited, so that a hint is only ever given with the bytes it was measured to send.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from shardscope._src.audit.compile import audit
from shardscope._src.base.comm import (
    REDUCE_SCATTER,
)
from shardscope._src.base.notes import Note
from shardscope._src.base.text import format_spec
from shardscope._src.bounds.matmul import (
    MatmulProblem,
    MatmulSchedule,
    best_schedule,
)
from shardscope._src.bounds.terms import Bound
from shardscope._src.check.compare import (
    ExcessCause,
    Hint,
    Verdict,
    VerdictNote,
    narrowed_bytes,
    ratio,
)
from shardscope._src.sharding.programs import (
    Program,
    build_matmul,
    build_reference_program,
    twin_needs_capacity,
)
from shardscope._src.sharding.strategies import Placement


def _verify(
    change: str, code: str, lower: Callable[[], Any], bound_bytes: int, program_dtype: str
) -> Hint:

    result = audit(lower())
    counts = {k: v for k, v in result.counts().items() if v}
    return Hint(
        change,
        code,
        narrowed_bytes(result, program_dtype),
        bound_bytes,
        counts,
        result.total().traffic_bytes,
    )


def _describe_schedule(schedule: MatmulSchedule, problem: MatmulProblem) -> str:
    parts = []
    for which, given in (("a", problem.a_spec), ("b", problem.b_spec)):
        want = schedule.layout(which)
        if tuple(want) != tuple(given):
            parts.append(f"constrain {which.upper()} to {format_spec(want)}")
    if not any(p.partition == "k" for p in schedule.axes):
        want = schedule.layout("product")
        if tuple(want) != tuple(problem.out_spec):
            parts.append(f"constrain the product to {format_spec(want)}")
    steps = "; ".join(p.describe() for p in schedule.axes if p.terms or p.partition)
    head = ", ".join(parts) if parts else "keep the specs"
    return f"{head} ({steps})"


def matmul_hints(
    problem: MatmulProblem, mesh: Any, schedule: MatmulSchedule, bound: Bound, actual_bytes: int
) -> tuple[Hint, ...]:
    """The cheapest schedule forced with sharding constraints, as a shard_map with an explicit
    psum_scatter when the bound reduce-scatters, and the cheapest schedule that keeps the
    compute split when that one duplicates it and sends less than the program; each compiled."""
    candidates = [(schedule, False)]
    if any(t.kind == REDUCE_SCATTER for t in bound.terms):
        candidates.append((schedule, True))
    if any(p.duplicated_flops for p in schedule.axes):
        split = best_schedule(problem, duplicate_flops=False)
        if split.traffic_bytes < actual_bytes:
            candidates.append((split, False))
    found = []
    for cand, explicit in candidates:
        prog = build_matmul(problem, mesh, cand, explicit=explicit)
        change = _describe_schedule(cand, problem)
        if explicit:
            change = "shard_map with explicit psum_scatter: " + change
        if any(p.duplicated_flops for p in cand.axes):
            devices = math.prod(problem.mesh.values())
            change += (
                f" [duplicates the compute: {cand.flops_per_device:,} flops per "
                f"device instead of {problem.flops // devices:,}]"
            )
        found.append(_verify(change, prog.code, prog.lower, bound.traffic_bytes, problem.dtype))
    return tuple(found)


def duplicated_compute_note(
    problem: MatmulProblem, schedule: MatmulSchedule, actual_bytes: int
) -> Note:
    split = best_schedule(problem, duplicate_flops=False)
    return Note(
        VerdictNote.DUPLICATED_COMPUTE,
        {
            "flops_per_device": schedule.flops_per_device,
            "split_flops_per_device": problem.flops // math.prod(problem.mesh.values()),
            "split_bytes": split.traffic_bytes,
            "split_ratio": ratio(actual_bytes, split.traffic_bytes),
        },
    )


def _constraint_text(placement: Placement) -> str:
    parts = []
    for point in ("residual", "enter", "heads", "hidden"):
        spec = placement.activation_spec(point)
        if spec is not None:
            parts.append(f"{point} {format_spec(tuple(spec))}")
    return ", ".join(parts)


def transformer_hints(
    program: Program, bound: Bound, mode: str, impl: str, constraints: bool
) -> tuple[tuple[Hint, ...], tuple[Note, ...]]:
    """The strategy's activation constraints (when left out) and its shard_map twin (when it
    has one and can place the model), each compiled; and the notes of the hints not tried
    (a twin that cannot place a dropless mixture of experts)."""
    found = []
    notes = []
    s = program.placement.strategy
    if impl == "jit" and not constraints and s.activations:
        fixed = build_reference_program(s, program.config, program.mesh, mode=mode, impl="jit")
        found.append(
            _verify(
                "add the strategy's activation sharding constraints: "
                + _constraint_text(fixed.placement),
                "jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec)) at each point",
                fixed.lower,
                bound.traffic_bytes,
                program.config.dtype,
            )
        )
    if impl == "jit" and s.twin and twin_needs_capacity(program.placement):
        notes.append(Note(VerdictNote.NO_TWIN_FOR_DROPLESS, {"strategy": s.name}))
    elif impl == "jit" and s.twin:
        twin = build_reference_program(s, program.config, program.mesh, mode=mode, impl="shard_map")
        collectives = (
            "all_gather before the column-parallel matmuls and psum_scatter "
            "after the row-parallel ones"
            if s.sequence_parallel
            else "psum after the row-parallel matmuls"
        )
        found.append(
            _verify(
                f"use the shard_map twin of {s.name!r}: {collectives}",
                "build_reference_program(strategy, config, mesh, impl='shard_map')",
                twin.lower,
                bound.traffic_bytes,
                program.config.dtype,
            )
        )
    return tuple(found), tuple(notes)


def no_hint_note(verdict: Verdict) -> Note | None:
    """Why no hint can reach the bound: an all-reduce for a reduce-scatter that the compiler
    which built the program chose itself (its ``Capabilities.forms_reduce_scatter``)."""
    for e in verdict.excess:
        c = e.compiler
        if e.cause == ExcessCause.ALL_REDUCE_FOR_REDUCE_SCATTER and c is not None:
            if c.may_all_reduce_for_reduce_scatter:
                values = {"compiler": c.compiler, "forms": c.forms_reduce_scatter}
                return Note(VerdictNote.NO_REDUCE_SCATTER_FORMED, values)
    return None
