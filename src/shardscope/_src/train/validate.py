"""Compiled communication against the analytic formula: one validation per strategy (its best
plan), and the notes a compiled plan gets where its compiler or jit departs from the formula.

A compiler that does not dependably form reduce-scatters
(``Capabilities.forms_reduce_scatter``: XLA:CPU never, XLA:TPU for some steps) all-reduces
and slices, twice the bytes; and jit reduces replicated gradients after every micro-batch of
a gradient accumulation loop where the formula (and the time model) reduce them once per
step. A validation that matches only with one of these substitutions says which. A match is
the rule of :mod:`~shardscope._src.check.bound`: within its tolerance on either side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from shardscope._src.base.comm import ALL_REDUCE, REDUCE_SCATTER, format_bytes, ratio
from shardscope._src.base.notes import Note
from shardscope._src.bounds.terms import Bound, Term
from shardscope._src.check.bound import TOLERANCE, Standing, standing
from shardscope._src.plan.collectives import PlanCollective
from shardscope._src.plan.notes import (
    CompiledFlopsValues,
    PlanNote,
    ReduceScatterValues,
    RematerializationValues,
)
from shardscope._src.sharding.strategies import EXPERT_AXIS
from shardscope._src.targets.capabilities import Capabilities
from shardscope._src.train.types import Candidate, CompiledFacts, Plan, Validation

#: Strategies whose compiled communication must match the analytic formula (within
#: :data:`VALIDATION_TOLERANCE`); every strategy's best plan is validated and reported.
VALIDATED_STRATEGIES = ("dp", "fsdp", "tp")
#: How far the compiled bytes may be from the formula's and still match: the one tolerance of
#: :mod:`~shardscope._src.check.bound`.
VALIDATION_TOLERANCE = TOLERANCE


#: How far a compiled program's matmul FLOPs may be from the time model's, either way,
#: before its plan says so (:func:`flops_note`).
FLOPS_TOLERANCE = 0.03


def compiled_flops(hlo_flops: int | None, exact: bool) -> int | None:
    """The matmul FLOPs a compiled program's step is priced with: its HLO count, where every
    loop's trip count is known (``exact``; else a loop was counted once) and a matmul was
    found; None otherwise (the formula's are used)."""
    return hlo_flops if exact and hlo_flops else None


def flops_note(formula: float, compiled: int | None, compiler: Capabilities) -> Note | None:
    """The note of a compiled plan whose program computes more or fewer matmul FLOPs than
    the time model's ``formula`` (per device, the whole step) by more than
    :data:`FLOPS_TOLERANCE`, or whose FLOPs were not counted (``compiled`` None)."""
    if formula <= 0 or (compiled is not None and abs(compiled / formula - 1) <= FLOPS_TOLERANCE):
        return None
    values = CompiledFlopsValues(compiler=compiler.compiler, formula=formula, compiled=compiled)
    return Note(PlanNote.COMPILED_FLOPS, values)


def plan_compiler(plan: Plan) -> Capabilities:
    """The record of the compiler whose collectives ``plan`` holds (``plan.compiled_by``)."""
    return plan.compiled_by.capabilities


def reduces_per_microbatch(got: CompiledFacts, bound: Bound, cand: Candidate) -> bool:
    """Whether the compiled program all-reduces replicated gradients more often than once."""
    once = sum(
        t.traffic_bytes for t in bound.terms if t.kind == ALL_REDUCE and t.role.sums_token_shards
    )
    compiled = sum(c.traffic_bytes for c in got.collectives if c.kind == ALL_REDUCE)
    return once > 0 and compiled > 1.5 * once


def all_reduce_formula(bound: Bound) -> Bound:
    """The bound with every reduce-scatter as the all-reduce (and slice) a compiler that forms
    no reduce-scatter emits."""

    terms = tuple(
        replace(t, kind=ALL_REDUCE) if t.kind == REDUCE_SCATTER else t for t in bound.terms
    )
    return Bound(bound.label + " (all-reduce for reduce-scatter)", terms, bound.notes)


def jit_formula(bound: Bound, microbatches: int) -> Bound:
    """The formula with the gradient all-reduces repeated per micro-batch, as jit compiles a
    gradient accumulation loop."""

    terms = tuple(
        replace(t, count=t.count * microbatches) if t.role.sums_token_shards else t
        for t in bound.terms
    )
    return Bound(bound.label + " (gradients reduced per micro-batch)", terms, bound.notes)


def expert_jit_formula(bound: Bound, microbatches: int, sizes: Mapping[str, int]) -> Bound:
    """The formula as jit compiles a gradient accumulation loop over expert-parallel tokens:
    a sum over the tokens' shards reduced over ``expert`` after every micro-batch, and over
    the other axes that shard the tokens once a step (the partitioner sums what the expert
    axis's devices computed from one another's tokens inside the loop; the data axes' sums
    wait for the accumulated gradient). ``sizes``: the mesh's axis sizes."""
    e = sizes.get(EXPERT_AXIS, 1)
    terms: list[Term] = []
    for t in bound.terms:
        if not t.role.sums_token_shards or EXPERT_AXIS not in t.axes or e <= 1:
            terms.append(t)
            continue
        terms.append(replace(t, axes=(EXPERT_AXIS,), group_size=e, count=t.count * microbatches))
        rest = tuple(a for a in t.axes if a != EXPERT_AXIS)
        if rest and t.group_size // e > 1:
            terms.append(replace(t, axes=rest, group_size=t.group_size // e))
    label = bound.label + " (gradients reduced over expert per micro-batch)"
    return Bound(label, tuple(terms), bound.notes)


def validate(plan: Plan, bound: Bound) -> Validation:
    """``plan``'s compiled communication against ``bound``, the formula of its schedule: a
    match (:func:`~shardscope._src.check.bound.standing`), or the substitution that makes
    one, or the largest difference. The all-reduce for a reduce-scatter is a substitution
    only where the compiler that built the plan may make it itself."""
    compiled = plan.comm_bytes_per_device
    formula = bound.traffic_bytes
    compiled_ratio = ratio(compiled, formula)
    all_reduce = all_reduce_formula(bound).traffic_bytes
    jit = jit_formula(bound, plan.microbatches).traffic_bytes
    jit_all_reduce = all_reduce_formula(jit_formula(bound, plan.microbatches)).traffic_bytes
    by_expert = expert_jit_formula(bound, plan.microbatches, plan.mesh)
    expert_jit = by_expert.traffic_bytes
    expert_jit_all_reduce = all_reduce_formula(by_expert).traffic_bytes
    compiler = plan_compiler(plan)
    substitutes = compiler.may_all_reduce_for_reduce_scatter and all_reduce != formula

    def matches(bytes_: int) -> bool:
        return standing(compiled, bytes_) is Standing.MATCHES

    if matches(formula):
        explanation = ""
    elif substitutes and matches(all_reduce):
        explanation = (
            f"{compiler.reduce_scatter_words} where the formula has a reduce-scatter (2x its "
            f"bytes); with that substitution they match"
        )
    elif jit != formula and (matches(jit) or (substitutes and matches(jit_all_reduce))):
        explanation = (
            f"the jit program reduces replicated gradients after each of the "
            f"{plan.microbatches} micro-batches, where the formula (and the time model) "
            f"reduces them once per step; counted so they match"
            + (
                f" (with {compiler.compiler}'s all-reduce for each reduce-scatter)"
                if not matches(jit)
                else ""
            )
        )
    elif expert_jit != formula and (
        matches(expert_jit) or (substitutes and matches(expert_jit_all_reduce))
    ):
        explanation = (
            f"the jit program reduces replicated gradients over '{EXPERT_AXIS}' after each "
            f"of the {plan.microbatches} micro-batches and over the other axes once, where "
            f"the formula (and the time model) reduces them once per step; counted so they "
            f"match"
            + (
                f" (with {compiler.compiler}'s all-reduce for each reduce-scatter)"
                if not matches(expert_jit)
                else ""
            )
        )
    else:
        worst = max(plan.comm, key=lambda a: abs(a.traffic_bytes - a.bound_bytes), default=None)
        where = (
            f"; the largest difference is {worst.kind} over {worst.axes}: "
            f"{format_bytes(worst.traffic_bytes)} compiled vs {format_bytes(worst.bound_bytes)} "
            f"in the formula"
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
        compiled,
        compiled_ratio,
        matches(formula),
        all_reduce,
        ratio(compiled, all_reduce),
        explanation,
    )


def validations(ranked: Sequence[Plan]) -> tuple[Validation, ...]:
    """One validation per strategy, on its best plan, against the formula it carries."""
    first: dict[str, Plan] = {}
    for p in ranked:
        if p.bound is not None:
            first.setdefault(p.strategy, p)
    return tuple(validate(p, p.bound) for p in first.values() if p.bound is not None)


def _lacks_reduce_scatter(bound: Bound, collectives: Sequence[PlanCollective]) -> bool:
    """Whether the bound reduce-scatters over axes the compiled program never does."""
    bound_rs = {t.axes for t in bound.terms if t.kind == REDUCE_SCATTER}
    compiled_rs = {c.axes for c in collectives if c.kind == REDUCE_SCATTER}
    return bool(bound_rs - compiled_rs)


def reduce_scatter_note(
    bound: Bound, collectives: Sequence[PlanCollective], compiler: Capabilities
) -> Note | None:
    """The note for a reduce-scatter of ``bound`` that ``compiler`` did not form, where that is
    its own choice (a compiler that always forms them left it out because the program asked)."""
    if compiler.may_all_reduce_for_reduce_scatter and _lacks_reduce_scatter(bound, collectives):
        values = ReduceScatterValues(
            compiler=compiler.compiler, forms=compiler.forms_reduce_scatter
        )
        return Note(PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER, values)
    return None


def compiled_notes(
    facts: CompiledFacts,
    bound: Bound,
    collectives: Sequence[PlanCollective],
    compiler: Capabilities,
) -> list[Note]:
    """What a compiled plan notes: a reduce-scatter of ``bound`` its ``compiler`` did not form,
    the partitioner's rematerializations, and counts that are not exact."""
    notes = []
    rs = reduce_scatter_note(bound, collectives, compiler)
    if rs is not None:
        notes.append(rs)
    if facts.rematerializations:
        sites = tuple(sorted(set(facts.rematerializations)))
        notes.append(Note(PlanNote.REMATERIALIZATION, RematerializationValues(sites=sites)))
    if not facts.exact:
        notes.append(Note(PlanNote.INEXACT))
    return notes
