"""Compiled communication against the analytic formula: one validation per strategy (its best
plan), and the notes a compiled plan gets where the CPU backend or jit departs from the
formula.

The CPU backend forms no reduce-scatter (it all-reduces and slices, twice the bytes), and jit
reduces replicated gradients after every micro-batch of a gradient accumulation loop where the
formula (and the time model) reduce them once per step; a validation that matches only with
one of these substitutions says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from shardscope._src.base.comm import ALL_REDUCE, REDUCE_SCATTER, ratio
from shardscope._src.base.notes import Note
from shardscope._src.bounds.terms import Bound
from shardscope._src.plan.notes import PlanNote
from shardscope._src.plan.types import (
    Candidate,
    CompiledFacts,
    Plan,
    PlanCollective,
    Validation,
)

#: Strategies whose compiled communication must match the analytic formula within 5%; every
#: strategy's best plan is validated and reported.
VALIDATED_STRATEGIES = ("dp", "fsdp", "tp")
#: How far the compiled bytes may be from the formula's and still "match".
VALIDATION_TOLERANCE = 0.05


def reduces_per_microbatch(got: CompiledFacts, bound: Bound, cand: Candidate) -> bool:
    """Whether the compiled program all-reduces replicated gradients more often than once."""
    once = sum(
        t.traffic_bytes for t in bound.terms if t.kind == ALL_REDUCE and t.role.sums_token_shards
    )
    compiled = sum(c.traffic_bytes for c in got.collectives if c.kind == ALL_REDUCE)
    return once > 0 and compiled > 1.5 * once


def cpu_formula(bound: Bound) -> Bound:
    """The bound with every reduce-scatter as the all-reduce the CPU backend emits."""

    terms = tuple(
        replace(t, kind=ALL_REDUCE) if t.kind == REDUCE_SCATTER else t for t in bound.terms
    )
    return Bound(bound.label + " (CPU: all-reduce for reduce-scatter)", terms, bound.notes)


def jit_formula(bound: Bound, microbatches: int) -> Bound:
    """The formula with the gradient all-reduces repeated per micro-batch, as jit compiles a
    gradient accumulation loop."""

    terms = tuple(
        replace(t, count=t.count * microbatches) if t.role.sums_token_shards else t
        for t in bound.terms
    )
    return Bound(bound.label + " (gradients reduced per micro-batch)", terms, bound.notes)


def _within(r: float | None) -> bool:
    return r is not None and abs(r - 1.0) <= VALIDATION_TOLERANCE + 1e-12


def validate(plan: Plan, bound: Bound) -> Validation:
    """``plan``'s compiled communication against ``bound``, the formula of its schedule: a
    match within :data:`VALIDATION_TOLERANCE`, or the substitution that makes one, or the
    largest difference."""
    formula = bound.traffic_bytes
    compiled_ratio = ratio(plan.comm_bytes_per_device, formula)
    cpu = cpu_formula(bound).traffic_bytes
    cpu_ratio = ratio(plan.comm_bytes_per_device, cpu)
    jit = jit_formula(bound, plan.microbatches)
    jit_cpu = cpu_formula(jit)
    if _within(compiled_ratio):
        explanation = ""
    elif cpu != formula and _within(cpu_ratio):
        explanation = (
            "CPU backend: all-reduce + slice where the formula has a reduce-scatter (2x its "
            "bytes); with that substitution they match. GPU/TPU form the reduce-scatter."
        )
    elif jit.traffic_bytes != formula and (
        _within(ratio(plan.comm_bytes_per_device, jit.traffic_bytes))
        or _within(ratio(plan.comm_bytes_per_device, jit_cpu.traffic_bytes))
    ):
        explanation = (
            f"the jit program reduces replicated gradients after each of the "
            f"{plan.microbatches} micro-batches, where the formula (and the time model) "
            f"reduces them once per step; counted so they match"
            + (
                " (with the CPU backend's all-reduce for each reduce-scatter)"
                if not _within(ratio(plan.comm_bytes_per_device, jit.traffic_bytes))
                else ""
            )
        )
    else:
        worst = max(plan.comm, key=lambda a: abs(a.traffic_bytes - a.bound_bytes), default=None)
        where = (
            f"; the largest difference is {worst.kind} over {worst.axes}: "
            f"{worst.traffic_bytes} compiled vs {worst.bound_bytes} in the formula"
            if worst
            else ""
        )
        explanation = (
            f"compiled communication is {compiled_ratio:.3g}x the formula"
            if compiled_ratio is not None
            else "the formula needs no communication but the compiled program has some"
        ) + where
    return Validation(
        plan.strategy,
        plan.mesh_spec,
        formula,
        plan.comm_bytes_per_device,
        compiled_ratio,
        _within(compiled_ratio),
        cpu,
        cpu_ratio,
        explanation,
    )


def validations(
    ranked: Sequence[Plan], order: Sequence[Plan], bound_of: Mapping[int, Bound]
) -> tuple[Validation, ...]:
    """One validation per strategy, on its best plan."""
    first: dict[str, tuple[Plan, Bound]] = {}
    for p, q in zip(ranked, order, strict=True):
        first.setdefault(p.strategy, (p, bound_of[id(q)]))
    return tuple(validate(p, b) for p, b in first.values())


def _lacks_reduce_scatter(bound: Bound, collectives: Sequence[PlanCollective]) -> bool:
    """Whether the bound reduce-scatters over axes the compiled program never does."""
    bound_rs = {t.axes for t in bound.terms if t.kind == REDUCE_SCATTER}
    compiled_rs = {c.axes for c in collectives if c.kind == REDUCE_SCATTER}
    return bool(bound_rs - compiled_rs)


def compiled_notes(
    facts: CompiledFacts, bound: Bound, collectives: Sequence[PlanCollective]
) -> list[Note]:
    """What a compiled plan notes: a reduce-scatter of ``bound`` the CPU backend did not form,
    the partitioner's rematerializations, and counts that are not exact."""
    notes = []
    if _lacks_reduce_scatter(bound, collectives):
        notes.append(Note(PlanNote.CPU_ALL_REDUCE_FOR_REDUCE_SCATTER))
    if facts.rematerializations:
        sites = sorted(set(facts.rematerializations))
        notes.append(Note(PlanNote.REMATERIALIZATION, {"sites": sites}))
    if not facts.exact:
        notes.append(Note(PlanNote.INEXACT))
    return notes
