"""Renderers of a user's program plans (:class:`~shardscope._src.plan.program.ProgramPlanResult`):
the ranked table, communication per axis, skipped candidates, and a Markdown report, in the
shape of the built-in planner's (the PNG is the planner's chart, :func:`plot_plans`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardscope._src.plan.program import format_rules
from shardscope._src.render.console import format_bytes
from shardscope._src.render.plan import (
    KIND_SHORT,
    _md_table,
    format_seconds,
    no_flags,
    skipped_table,
)

if TYPE_CHECKING:
    from shardscope._src.plan.program import ProgramPlan, ProgramPlanResult


def headline(result: ProgramPlanResult) -> str:
    hw = result.hardware
    return (
        f"{result.program} on {result.devices} x {hw.name} ({format_bytes(hw.memory_bytes)}, "
        f"{hw.peak_flops / 1e12:g} TFLOP/s), mesh axes {', '.join(result.axes)}, "
        f"{len(result.rule_sets)} rule set(s)"
    )


def comm_summary(p: ProgramPlan) -> str:
    parts = [f"{a.axes} {KIND_SHORT.get(a.kind, a.kind)} x{a.count}" for a in p.comm if a.count]
    return "; ".join(parts) or "none"


def program_plan_table(result: ProgramPlanResult, *, top: int | None = None) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"Plans: {headline(result)}",
        caption=(
            f"{len(result.plans)} plans compiled, {len(result.skipped)} skipped, "
            f"{result.wall_s:.1f} s. * Pareto front (memory vs comm time). Memory: the "
            f"compiler's buffers per device. Step: compute + comm; overlap: the larger."
        ),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for name in (
        "#",
        "rules",
        "mesh",
        "mem/dev",
        "fits",
        "comm/dev",
        "collectives",
        "comm",
        "compute",
        "step",
        "overlap",
    ):
        table.add_column(
            name,
            justify="left" if name in ("rules", "mesh", "collectives") else "right",
            no_wrap=name != "collectives",
        )
    for p in result.plans[: top or None]:
        table.add_row(
            f"{p.rank}{'*' if p.pareto else ''}",
            p.rules_name,
            p.mesh_spec,
            format_bytes(p.memory_bytes_per_device),
            "yes" if p.fits else "[red]no[/red]",
            format_bytes(p.comm_bytes_per_device),
            comm_summary(p),
            format_seconds(p.comm_time_s),
            format_seconds(p.compute_time_s),
            format_seconds(p.step_time_s),
            format_seconds(p.step_time_overlap_s),
        )
    return table


def render_program_plan(
    result: ProgramPlanResult,
    *,
    console: Any = None,
    top: int | None = None,
    flags: Callable[[Sequence[str]], str] = no_flags,
) -> None:
    """Prints the ranked plans, what was skipped, the rule sets and the caveats; ``flags``
    as in :func:`~shardscope._src.render.plan.render_plan`."""
    from rich.console import Console

    console = console or Console()
    if result.plans:
        console.print(program_plan_table(result, top=top))
        if result.fit_note:
            note = result.fit_note
            console.print(f"[bold red]{note}{flags(note.params)}[/]", highlight=False)
    if result.skipped:
        console.print(skipped_table(result, first="rules"))

    for name, rules in result.rule_sets.items():
        console.print(f"rules {name}: {format_rules(rules)}", highlight=False)
    if result.plans:
        for note in result.notes:
            console.print(f"note: {note}", highlight=False)


def program_markdown_report(result: ProgramPlanResult) -> str:
    """The whole sweep as Markdown: ranked plans, memory, communication per axis, skipped."""

    hw = result.hardware
    lines = [
        f"# Sharding plan: {result.program} on {result.devices} x {hw.name}",
        "",
        headline(result) + ".",
        "",
        f"Hardware ({hw.source}): link {hw.link_bandwidth / 1e9:g} GB/s within a node of "
        f"{hw.node_size}, {hw.cross_node_bandwidth / 1e9:g} GB/s across nodes, "
        f"{hw.latency_s * 1e6:g} us latency per step.",
        "",
        f"{result.candidates} candidates: {len(result.plans)} compiled (in "
        f"{result.wall_s:.1f} s), {len(result.skipped)} skipped.",
        "",
        "## Rule sets",
        "",
    ]
    lines += [f"- **{n}**: {format_rules(r)}" for n, r in result.rule_sets.items()]
    lines.append("")
    if not result.plans:
        lines += [f"**{result.empty_reason}**", ""]
    else:
        lines += ["## Ranked plans", ""]
        lines += _md_table(
            [
                "#",
                "rules",
                "mesh",
                "memory/device",
                "fits",
                "comm/device",
                "comm time",
                "compute",
                "step",
                "step (overlap)",
                "Pareto",
            ],
            [
                [
                    str(p.rank),
                    p.rules_name,
                    f"`{p.mesh_spec}`",
                    format_bytes(p.memory_bytes_per_device),
                    "yes" if p.fits else "**no**",
                    format_bytes(p.comm_bytes_per_device),
                    format_seconds(p.comm_time_s),
                    format_seconds(p.compute_time_s),
                    format_seconds(p.step_time_s),
                    format_seconds(p.step_time_overlap_s),
                    "yes" if p.pareto else "",
                ]
                for p in result.plans
            ],
        )
        best = result.best
        lines += ["", f"Best: **{best.label}**." if best else f"**{result.fit_note}**", ""]
        lines += ["## Memory per device (the compiler's buffer assignment)", ""]
        lines += _md_table(
            ["#", "plan", "arguments", "outputs", "temporaries", "aliased", "total"],
            [
                [
                    str(p.rank),
                    p.label,
                    format_bytes(p.compiled_memory.get("argument_size_in_bytes", 0)),
                    format_bytes(p.compiled_memory.get("output_size_in_bytes", 0)),
                    format_bytes(p.compiled_memory.get("temp_size_in_bytes", 0)),
                    format_bytes(p.compiled_memory.get("alias_size_in_bytes", 0)),
                    format_bytes(p.memory_bytes_per_device),
                ]
                for p in result.plans
            ],
        )
        lines += ["", "## Communication per axis (loop trips counted)", ""]
        for p in result.plans:
            lines += [f"### {p.rank}. {p.label}", ""]
            if not p.comm:
                lines += ["No communication.", ""]
                continue
            lines += _md_table(
                ["axes", "kind", "count", "bytes/device", "time", "crosses nodes"],
                [
                    [
                        a.axes,
                        a.kind,
                        str(a.count),
                        format_bytes(a.traffic_bytes),
                        format_seconds(a.time_s),
                        "yes" if a.crosses_nodes else "no",
                    ]
                    for a in p.comm
                ],
            )
            lines += [f"- {n}" for n in p.notes]
            lines.append("")
    if result.skipped:
        lines += ["## Skipped candidates", ""]
        lines += _md_table(
            ["rules", "mesh", "reason", "why"],
            [[s.strategy, f"`{s.mesh}`", s.reason, s.message] for s in result.skipped],
        )
        lines.append("")
    lines += ["## Conventions and caveats", ""]
    lines += [f"- {n}" for n in result.notes]
    lines.append("")
    return "\n".join(lines)
