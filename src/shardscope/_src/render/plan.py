"""Renderers of a :class:`~shardscope._src.plan.types.PlanResult`: a rich table and a Markdown
report.

Both read the plain data only; rich is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardscope._src.render.console import format_bytes

if TYPE_CHECKING:
    from shardscope._src.plan.types import Plan, PlanResult

#: Short names of the collective kinds, for one-line summaries.
KIND_SHORT = {
    "all-reduce": "AR",
    "all-gather": "AG",
    "reduce-scatter": "RS",
    "all-to-all": "A2A",
    "ragged-all-to-all": "RA2A",
    "collective-permute": "CP",
    "collective-broadcast": "CB",
}


def format_seconds(s: float) -> str:
    """``0.00123`` -> ``'1.23 ms'``."""
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def format_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def schedule_text(p: Plan) -> str:
    """``'m=4, full'``: micro-batches per data shard and recomputation (stages are the
    mesh's ``stage`` axis)."""
    return f"m={p.microbatches}, {p.remat}"


def format_mfu(mfu: float | None) -> str:
    return "-" if mfu is None else f"{mfu:.0%}"


def headline(result: PlanResult) -> str:
    c, hw = result.config, result.hardware
    params = c.param_count()
    return (
        f"{result.model} ({params / 1e9:.3g}B params: d_model {c.d_model}, {c.heads} heads, "
        f"ff {c.ff}, {c.layers} layers, vocab {c.vocab}) {result.mode}, batch {c.batch} x seq "
        f"{c.seq}, {c.dtype}, on {result.devices} x {hw.name} "
        f"({format_bytes(hw.memory_bytes)}, {hw.peak_flops / 1e12:g} TFLOP/s)"
    )


def plan_table(result: PlanResult, *, top: int | None = None) -> Any:
    """The ranked plans as a rich table."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"Plans: {headline(result)}",
        caption=(
            f"{result.screened} candidates estimated, {len(result.plans)} compiled, "
            f"{len(result.skipped)} skipped, {result.wall_s:.1f} s. * Pareto front (memory vs "
            f"comm time). Memory: analytic per device (the CPU compiler's numbers are in the "
            f"JSON and report). Schedule: micro-batches per data shard, recomputation. Step: "
            f"the time model (compute at the achievable fraction of peak, tensor-parallel "
            f"collectives exposed, data-parallel ones overlapped as the schedule allows, "
            f"pipeline bubble, optimizer); MFU: model FLOPs over the devices' peak."
        ),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for name in (
        "#",
        "strategy",
        "mesh",
        "schedule",
        "mem/dev",
        "fits",
        "comm/dev",
        "x bound",
        "comm",
        "compute",
        "step",
        "MFU",
    ):
        table.add_column(
            name,
            justify="left" if name in ("strategy", "mesh", "schedule") else "right",
            no_wrap=True,
        )
    for p in result.plans[: top or None]:
        table.add_row(
            f"{p.rank}{'*' if p.pareto else ''}",
            p.strategy,
            p.mesh_spec,
            schedule_text(p),
            format_bytes(p.memory_bytes_per_device),
            "yes" if p.fits else "[red]no[/red]",
            format_bytes(p.comm_bytes_per_device),
            format_ratio(p.bound_ratio),
            format_seconds(p.comm_time_s),
            format_seconds(p.compute_time_s),
            format_seconds(p.step_time_s),
            format_mfu(p.mfu),
        )
    return table


def comm_table(result: PlanResult, *, top: int = 3) -> Any:
    """The best plans' collectives per mesh axis and kind, loop trips counted."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"Communication of the best {min(top, len(result.plans))} plans, per axis",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for name in ("plan", "axes", "kind", "count", "bytes/dev", "bound", "time", "nodes"):
        table.add_column(
            name, justify="left" if name in ("plan", "axes", "kind") else "right", no_wrap=True
        )
    for p in result.plans[:top]:
        for i, a in enumerate(p.comm):
            table.add_row(
                f"{p.rank}. {p.label}" if i == 0 else "",
                a.axes,
                a.kind,
                str(a.count),
                format_bytes(a.traffic_bytes),
                format_bytes(a.bound_bytes),
                format_seconds(a.time_s),
                "across" if a.crosses_nodes else "within",
            )
        if not p.comm:
            table.add_row(f"{p.rank}. {p.label}", "-", "none", "0", "0 B", "0 B", "0", "")
    return table


def skipped_table(result: Any, *, first: str = "strategy") -> Any:
    """What was skipped and why; ``first`` heads the first column (a user's program's plans
    are skipped per rule set)."""
    from rich import box
    from rich.table import Table

    table = Table(title="Skipped", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(first)
    table.add_column("mesh")
    table.add_column("reason")
    table.add_column("why", overflow="fold")
    for s in result.skipped:
        table.add_row(s.strategy, s.mesh, s.reason, s.message)
    return table


def validation_table(result: PlanResult) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title="Compiled communication vs the analytic formula (best plan of each strategy; "
        "ok: within 5%)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("strategy", "mesh", "formula", "compiled", "ratio", "ok", "why not"):
        table.add_column(col, overflow="fold" if col == "why not" else "ellipsis")
    for v in result.validations:
        table.add_row(
            v.strategy,
            v.mesh,
            format_bytes(v.formula_bytes),
            format_bytes(v.compiled_bytes),
            format_ratio(v.ratio),
            "yes" if v.ok else "no",
            v.explanation,
        )
    return table


def no_flags(params: Sequence[str]) -> str:
    """No words after a note: the library's renderers leave the parameters to the docs."""
    return ""


def render_plan(
    result: PlanResult,
    *,
    console: Any = None,
    top: int | None = None,
    empty_reason: bool = True,
    flags: Callable[[Sequence[str]], str] = no_flags,
) -> None:
    """Prints the plan table, then what was skipped, the validation and the caveats.

    With no plan it prints why (unless ``empty_reason=False``: the CLI says it on stderr).
    ``flags`` turns the parameters a note names into the words that follow it (the command
    line names its flags).
    """
    from rich.console import Console

    console = console or Console()
    if result.plans:
        console.print(plan_table(result, top=top))
        if result.fit_note:
            note = result.fit_note
            console.print(f"[bold red]{note}{flags(note.params)}[/]", highlight=False)
        console.print(comm_table(result))
    elif empty_reason:
        console.print(f"[bold]{result.empty_reason}[/bold]")
    if result.skipped:
        console.print(skipped_table(result))
    if result.validations:
        console.print(validation_table(result))
    if result.plans:
        for note in result.notes:
            console.print(f"note: {note}", highlight=False)


# -- Markdown --------------------------------------------------------------------------------


def time_breakdown(p: Plan) -> list[str]:
    """The best plan's step time, part by part (Markdown lines)."""
    t = p.time
    if not t:
        return []
    rows = [
        ("compute (all micro-batches)", t["compute_s"]),
        ("tensor-parallel collectives (on the critical path unless overlapped)", t["tp_comm_s"]),
        ("data-parallel / FSDP / ZeRO collectives", t["data_comm_s"]),
        ("of which exposed (not hidden behind compute)", t["data_exposed_s"]),
        ("pipeline stage-to-stage transfers", t["p2p_s"]),
        (f"pipeline bubble ({t['bubble_fraction']:.0%} of the pipeline)", t["bubble_s"]),
        ("optimizer update", t["optimizer_s"]),
        ("step", t["step_s"]),
    ]
    out = ["### Step time of the best plan", ""]
    out += _md_table(["part", "seconds"], [[k, f"{v:.4g}"] for k, v in rows])
    out += ["", f"Predicted MFU {t['mfu']:.1%}.", ""]
    return out


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return out


def markdown_report(result: PlanResult) -> str:
    """The whole sweep as Markdown: ranked plans, communication per axis, memory breakdown,
    validation, skipped candidates, conventions."""
    hw = result.hardware
    lines = [
        f"# Sharding plan: {result.model} on {result.devices} x {hw.name}, {result.mode}",
        "",
        headline(result) + ".",
        "",
        f"Hardware ({hw.source}): link {hw.link_bandwidth / 1e9:g} GB/s within a node of "
        f"{hw.node_size}, {hw.cross_node_bandwidth / 1e9:g} GB/s across nodes, "
        f"{hw.latency_s * 1e6:g} us latency per step.",
        "",
        f"{result.candidates} strategy-and-mesh candidates, {result.screened} schedules "
        f"estimated: {len(result.plans)} compiled (in {result.wall_s:.1f} s), "
        f"{len(result.skipped)} skipped.",
        "",
    ]
    if not result.plans:
        lines += [f"**{result.empty_reason}**", ""]
    else:
        lines += ["## Ranked plans", ""]
        lines += _md_table(
            [
                "#",
                "strategy",
                "mesh",
                "micro-batches",
                "recompute",
                "memory/device",
                "fits",
                "comm/device",
                "x bound",
                "comm time",
                "compute",
                "step",
                "MFU",
                "Pareto",
            ],
            [
                [
                    str(p.rank),
                    p.strategy,
                    f"`{p.mesh_spec}`",
                    str(p.microbatches),
                    p.remat,
                    format_bytes(p.memory_bytes_per_device),
                    "yes" if p.fits else "**no**",
                    format_bytes(p.comm_bytes_per_device),
                    format_ratio(p.bound_ratio),
                    format_seconds(p.comm_time_s),
                    format_seconds(p.compute_time_s),
                    format_seconds(p.step_time_s),
                    format_mfu(p.mfu),
                    "yes" if p.pareto else "",
                ]
                for p in result.plans
            ],
        )
        best = result.best
        if best is not None:
            lines += ["", f"Best: **{best.label}** ({best.summary}).", ""]
            lines += time_breakdown(best)
        else:
            lines += ["", f"**{result.fit_note}**", ""]
        lines += ["## Memory per device", ""]
        lines += _md_table(
            [
                "#",
                "plan",
                "params",
                "grads",
                "optimizer",
                "activations",
                "gathered weights",
                "total (analytic)",
                "compiled on CPU",
            ],
            [
                [
                    str(p.rank),
                    p.label,
                    format_bytes(p.memory.params),
                    format_bytes(p.memory.grads),
                    format_bytes(p.memory.optimizer),
                    format_bytes(p.memory.activations),
                    format_bytes(p.memory.gathered_weights),
                    format_bytes(p.memory.total),
                    format_bytes(p.compiled_memory_bytes_per_device),
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
                ["axes", "kind", "count", "bytes/device", "lower bound", "time", "crosses nodes"],
                [
                    [
                        a.axes,
                        a.kind,
                        str(a.count),
                        format_bytes(a.traffic_bytes),
                        format_bytes(a.bound_bytes),
                        format_seconds(a.time_s),
                        "yes" if a.crosses_nodes else "no",
                    ]
                    for a in p.comm
                ],
            )
            lines += [f"- {n}" for n in p.notes]
            lines.append("")
    if result.validations:
        lines += ["## Validation: compiled communication vs the analytic formula", ""]
        lines += _md_table(
            ["strategy", "mesh", "formula", "compiled", "ratio", "within 5%", "why not"],
            [
                [
                    v.strategy,
                    f"`{v.mesh}`",
                    format_bytes(v.formula_bytes),
                    format_bytes(v.compiled_bytes),
                    format_ratio(v.ratio),
                    "yes" if v.ok else "no",
                    v.explanation,
                ]
                for v in result.validations
            ],
        )
        lines.append("")
    if result.skipped:
        lines += ["## Skipped candidates", ""]
        lines += _md_table(
            ["strategy", "mesh", "reason", "why"],
            [[s.strategy, f"`{s.mesh}`", s.reason, s.message] for s in result.skipped],
        )
        lines.append("")
    lines += ["## Conventions and caveats", ""]
    lines += [f"- {n}" for n in result.notes]
    lines += [
        f"- {result.settings.get('flops_convention', '')}",
        f"- {result.settings.get('activation_convention', '')}; flash attention "
        f"{'assumed' if result.settings.get('flash_attention') else 'not assumed'}",
        f"- model state: {result.settings.get('bytes_per_param')} bytes per parameter in "
        f"training (params and grads at the model dtype, the rest optimizer state)",
        "",
    ]
    return "\n".join(lines)
