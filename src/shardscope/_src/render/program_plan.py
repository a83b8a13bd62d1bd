"""Renderers of a user's program plans
(:class:`~shardscope._src.program.program.ProgramPlanResult`): the ranked table, communication
per axis, skipped candidates, and a Markdown report, in the shape of the built-in planner's
(the PNG is the planner's chart, :func:`plot_plans`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_bytes, format_memory, format_seconds
from shardscope._src.plan.notes import PlanNote
from shardscope._src.render.brief import print_line, skipped_lines
from shardscope._src.render.columns import Column, markdown_table
from shardscope._src.render.plan import (
    ASKED_NOTES,
    COMM_BOUND,
    COMM_BYTES,
    COMM_COLUMNS,
    COMM_TIME,
    COMPUTE,
    FITS,
    KIND_SHORT,
    LONG_NOTES,
    MEMORY,
    MESH,
    PARETO,
    RANK,
    RANK_MARKDOWN,
    STEP,
    comm_sections,
    figure,
    hardware_text,
    no_flags,
    ranked_table,
    skipped_section,
    skipped_table,
)
from shardscope._src.render.suggest import distinct_work
from shardscope._src.sharding.rules import format_rules

if TYPE_CHECKING:
    from shardscope._src.program.program import ProgramPlan, ProgramPlanResult


def headline(result: ProgramPlanResult) -> str:
    hw = result.hardware
    return (
        f"{result.program} on {result.devices} x {hw.name}, {format_memory(hw.memory_bytes)} "
        f"and {hw.peak_flops / 1e12:g} TFLOP/s each, mesh axes {', '.join(result.axes)}, "
        f"{len(result.rule_sets)} rule set(s)"
    )


def comm_summary(p: ProgramPlan) -> str:
    parts = [f"{a.axes} {KIND_SHORT.get(a.kind, a.kind)} x{a.count}" for a in p.comm if a.count]
    return "; ".join(parts) or "none"


#: The ranked plans of a user's program: the planner's columns where they mean the same.
PROGRAM_PLAN_COLUMNS: tuple[Column[ProgramPlan], ...] = (
    RANK,
    RANK_MARKDOWN,
    Column("rules", lambda p: p.rules_name, no_wrap=True),
    MESH,
    MEMORY,
    FITS,
    Column(
        "distinct work",
        lambda p: distinct_work(p.working_devices, p.devices),
        justify="right",
        no_wrap=True,
    ),
    COMM_BYTES,
    Column("collectives", comm_summary, only="rich"),
    COMM_TIME,
    COMPUTE,
    STEP,
    figure("overlap", lambda p: format_seconds(p.step_time_overlap_s), "step (overlap)"),
    PARETO,
)


#: Memory per device as the compiler's buffer assignment gives it (0 where it reports none).
PROGRAM_MEMORY_COLUMNS: tuple[Column[ProgramPlan], ...] = (
    Column("#", lambda p: str(p.rank)),
    Column("plan", lambda p: p.label),
    Column("arguments", lambda p: format_bytes(p.compiled_memory.argument_size_in_bytes or 0)),
    Column("outputs", lambda p: format_bytes(p.compiled_memory.output_size_in_bytes or 0)),
    Column("temporaries", lambda p: format_bytes(p.compiled_memory.temp_size_in_bytes or 0)),
    Column("aliased", lambda p: format_bytes(p.compiled_memory.alias_size_in_bytes or 0)),
    Column("total", lambda p: format_bytes(p.memory_bytes_per_device)),
)

#: Communication per axis: the planner's columns but the lower bound (a user's program has
#: no analytic minimum).
PROGRAM_COMM_COLUMNS = tuple(c for c in COMM_COLUMNS if c is not COMM_BOUND)


def program_plan_table(
    result: ProgramPlanResult, *, top: int | None = None, verbose: bool = True
) -> Any:
    """The ranked plans as a rich table; its caption explains the columns where
    ``verbose``."""
    caption = (
        f"{len(result.plans)} plans compiled, {len(result.skipped)} skipped, "
        f"{result.wall_s:.1f} s. * Pareto front (memory vs step time)."
    )
    if verbose:
        step = (
            "compute + the comm its schedule leaves exposed"
            if any(p.exposed_time_s is not None for p in result.plans)
            else "compute + comm"
        )
        caption += (
            f" Memory: the compiler's buffers per device. Step: {step}; overlap: compute or "
            "comm, the larger."
        )
    return ranked_table(
        PROGRAM_PLAN_COLUMNS,
        result,
        heading=headline(result),
        caption=caption,
        top=top,
        edge=verbose,
    )


def render_program_plan(
    result: ProgramPlanResult,
    *,
    console: Any = None,
    top: int | None = None,
    flags: Callable[[Sequence[str]], str] = no_flags,
    verbose: bool = True,
) -> None:
    """Prints the ranked plans, what was skipped, the rule sets and the caveats; ``flags``
    and ``verbose`` as in :func:`~shardscope._src.render.plan.render_plan`."""
    from rich.console import Console

    console = console or Console()
    if result.plans:
        console.print(program_plan_table(result, top=top, verbose=verbose))
        if result.fit_note:
            note = result.fit_note
            console.print(f"[bold red]{note}{flags(note.params)}[/]", highlight=False)
    if result.skipped:
        if verbose:
            console.print(skipped_table(result, first="rules"))
        else:
            for line in skipped_lines(result.skipped):
                print_line(console, line)

    for name, rules in result.rule_sets.items():
        console.print(f"rules {name}: {format_rules(rules)}", highlight=False)
    # beside the rules they are about, with or without plans
    for note in result.notes:
        if note.kind == PlanNote.UNUSED_RULES:
            console.print(f"note: {note}", highlight=False)
    if not result.plans:
        return
    for note in result.notes:
        if note.kind == PlanNote.UNUSED_RULES:
            continue
        if verbose or note.kind in ASKED_NOTES:
            console.print(f"note: {note}", highlight=False)
        elif note.kind not in LONG_NOTES:
            print_line(console, f"note: {note}")


def program_markdown_report(result: ProgramPlanResult) -> str:
    """The whole sweep as Markdown: ranked plans, memory, communication per axis, skipped."""

    hw = result.hardware
    lines = [
        f"# Sharding plan: {result.program} on {result.devices} x {hw.name}",
        "",
        headline(result) + ".",
        "",
        hardware_text(hw),
        "",
        f"{result.candidates} candidates: {len(result.plans)} compiled (in "
        f"{result.wall_s:.1f} s), {len(result.skipped)} skipped.",
        "",
        "## Rule sets",
        "",
    ]
    lines += [f"- **{n}**: {format_rules(r)}" for n, r in result.rule_sets.items()]
    unused = [n for n in result.notes if n.kind == PlanNote.UNUSED_RULES]
    lines += ["", *(f"Note: {n}" for n in unused)] if unused else []
    lines.append("")
    if not result.plans:
        lines += [f"**{result.empty_reason}**", ""]
    else:
        lines += ["## Ranked plans", "", *markdown_table(PROGRAM_PLAN_COLUMNS, result.plans)]
        best = result.best
        lines += ["", f"Best: **{best.label}**." if best else f"**{result.fit_note}**", ""]
        lines += ["## Memory per device (the compiler's buffer assignment)", ""]
        lines += [*markdown_table(PROGRAM_MEMORY_COLUMNS, result.plans), ""]
        lines += comm_sections(result.plans, PROGRAM_COMM_COLUMNS)
    lines += skipped_section(result, first="rules")
    lines += ["## Conventions and caveats", ""]
    lines += [f"- {n}" for n in result.notes if n.kind != PlanNote.UNUSED_RULES]
    lines.append("")
    return "\n".join(lines)
