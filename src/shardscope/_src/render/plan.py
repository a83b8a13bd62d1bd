"""Renderers of a :class:`~shardscope._src.train.types.PlanResult`: rich tables and a Markdown
report, each table from one column spec (:mod:`~shardscope._src.render.columns`).

Both read the plain data only; rich is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardscope._src.base.comm import (
    CollectiveKind,
    format_bytes,
    format_flops,
    format_memory,
    format_seconds,
)
from shardscope._src.base.errors import ShardscopeError
from shardscope._src.base.text import and_list
from shardscope._src.check.bound import TOLERANCE
from shardscope._src.cost.memory import memory_fits
from shardscope._src.hlo.groups import AxisRef
from shardscope._src.plan.notes import (
    FitOnEstimateValues,
    PlanNote,
    fit_judged,
    fit_on_estimate_why,
)
from shardscope._src.render.brief import print_line, skipped_lines
from shardscope._src.render.columns import (
    Alarm,
    Column,
    markdown_lines,
    markdown_table,
    rich_cells,
    rich_columns,
    rich_table,
)
from shardscope._src.targets.hardware import hardware as get_hardware

if TYPE_CHECKING:
    from shardscope._src.base.notes import Note
    from shardscope._src.plan.collectives import AxisComm
    from shardscope._src.plan.types import Skipped
    from shardscope._src.render.protocols import PlanSet, RankedPlan
    from shardscope._src.targets.hardware import Hardware
    from shardscope._src.train.types import Plan, PlanResult, Validation

Row = TypeVar("Row")
PlanT = TypeVar("PlanT", bound="RankedPlan")

#: Short names of the collective kinds, for one-line summaries.
KIND_SHORT: dict[str, str] = {
    CollectiveKind.ALL_REDUCE: "AR",
    CollectiveKind.ALL_GATHER: "AG",
    CollectiveKind.REDUCE_SCATTER: "RS",
    CollectiveKind.ALL_TO_ALL: "A2A",
    CollectiveKind.RAGGED_ALL_TO_ALL: "RA2A",
    CollectiveKind.COLLECTIVE_PERMUTE: "CP",
    CollectiveKind.COLLECTIVE_BROADCAST: "CB",
}


def format_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def schedule_text(p: Plan) -> str:
    """``'m=4, full'``: micro-batches per data shard and recomputation (stages are the
    mesh's ``stage`` axis), ``'m=4, v=2, full'`` with 2 virtual stages (interleaved), and
    ``', opt. on host'`` and ``', vocab split'`` where the plan offloads its optimizer state
    or splits the vocabulary."""
    chunks = f"v={p.virtual_stages}, " if p.virtual_stages > 1 else ""
    extra = "".join(
        f", {words}"
        for words, on in (
            ("opt. on host", p.offload_optimizer),
            ("vocab split", p.vocab_split),
        )
        if on
    )
    return f"m={p.microbatches}, {chunks}{p.remat}{extra}"


def format_mfu(mfu: float | None) -> str:
    return "-" if mfu is None else f"{mfu:.0%}"


def headline(result: PlanResult) -> str:
    c, hw = result.config, result.hardware
    params = c.param_count()
    experts = f"{c.experts_words}, " if c.is_moe else ""
    # the layers' matmuls in fp8 where the request runs them so, the rest at the model's dtype
    fp8 = result.settings.get("matmul_dtype") == "fp8"
    dtype = f"{c.dtype}, the layers' matmuls in fp8" if fp8 else c.dtype
    return (
        f"{result.model} ({params / 1e9:.3g}B params: d_model {c.d_model}, {c.heads} heads, "
        f"ff {c.ff}, {c.layers} layers, {experts}vocab {c.vocab}) {result.mode}, batch "
        f"{c.batch} x seq "
        f"{c.seq}, {dtype}, on {result.devices} x {hw.name}, {format_memory(hw.memory_bytes)} "
        f"and {hw.peak_flops / 1e12:g} TFLOP/s each{_overlaps(hw)}"
    )


#: The overlap settings of a step's collectives, in the words the headline gives them where a
#: request sets them other than the hardware's own.
_OVERLAPS = {
    "tp_overlap": "tensor-parallel collectives",
    "pp_overlap": "pipeline transfers",
    "ep_overlap": "expert all-to-alls",
    "fsdp_overlap": "FSDP collectives",
}


def _overlaps(hw: Hardware) -> str:
    """``; FSDP collectives not overlapped`` and the like: the overlaps ``hw`` sets other
    than its preset's ("" where none, or where it is no preset)."""
    try:
        preset = get_hardware(hw.name)
    except ShardscopeError:
        return ""
    said = [
        f"{words} {'overlapped' if getattr(hw, name) else 'not overlapped'}"
        for name, words in _OVERLAPS.items()
        if getattr(hw, name) != getattr(preset, name)
    ]
    return "".join(f"; {s}" for s in said)


# -- columns: each table's columns written once, for the terminal and for Markdown -------------


def figure(
    header: str, value: Callable[[Row], str], markdown: str | None = None, **options: Any
) -> Column[Row]:
    """A column of numbers: right-aligned, one line a cell (``options``: more of
    :class:`Column`'s fields)."""
    return Column(header, value, markdown=markdown, justify="right", no_wrap=True, **options)


def _fits(p: RankedPlan) -> str:
    return "yes" if p.fits else Alarm("no")


#: The ranked plans' columns shared by the planner and a user's program plans.
def _rank(p: RankedPlan) -> str:
    return f"{p.rank}{'*' if p.pareto else ''}"


RANK: Column[RankedPlan] = figure("#", _rank, only="rich")
RANK_MARKDOWN: Column[RankedPlan] = Column("#", lambda p: str(p.rank), only="markdown")
MESH: Column[RankedPlan] = Column("mesh", lambda p: p.mesh_spec, no_wrap=True, code=True)
MEMORY: Column[RankedPlan] = figure(
    "mem/dev", lambda p: format_bytes(p.fit_memory_bytes_per_device), "memory/device"
)
FITS: Column[RankedPlan] = figure("fits", _fits)
COMM_BYTES: Column[RankedPlan] = figure(
    "comm/dev", lambda p: format_bytes(p.comm_bytes_per_device), "comm/device"
)
COMM_TIME: Column[RankedPlan] = figure("comm", lambda p: format_seconds(p.comm_time_s), "comm time")
COMPUTE: Column[RankedPlan] = figure("compute", lambda p: format_seconds(p.compute_time_s))
STEP: Column[RankedPlan] = figure("step", lambda p: format_seconds(p.step_time_s))
PARETO: Column[RankedPlan] = Column("Pareto", lambda p: "yes" if p.pareto else "", only="markdown")


def _memory_by(p: Plan) -> str:
    """Whose memory decided the fit, and the estimate beside a compiler's."""
    if p.fit_memory_source == "estimate":
        return "estimate"
    return f"{p.compiled_by.name} (est. {format_bytes(p.memory.total)})"


PLAN_COLUMNS: tuple[Column[Plan], ...] = (
    RANK,
    RANK_MARKDOWN,
    Column("strategy", lambda p: p.strategy, no_wrap=True),
    MESH,
    Column("schedule", schedule_text, no_wrap=True, only="rich"),
    Column("micro-batches", lambda p: str(p.microbatches), only="markdown"),
    Column("recompute", lambda p: p.remat, only="markdown"),
    MEMORY,
    Column("memory by", _memory_by, no_wrap=True),
    FITS,
    COMM_BYTES,
    figure("x bound", lambda p: format_ratio(p.bound_ratio)),
    # the collectives as the step prices them (a compiler's that forms no reduce-scatter
    # has its all-reduces priced as the reduce-scatters the hardware's compiler forms)
    figure(
        "comm",
        lambda p: format_seconds(p.time.comm_s if p.time is not None else p.comm_time_s),
        "comm time",
    ),
    COMPUTE,
    # what the step takes beyond its compute: the collectives it does not hide and the
    # compute they slow, the pipeline's bubble and transfers, the optimizer's update
    figure("rest", lambda p: format_seconds(max(0.0, p.step_time_s - p.compute_time_s))),
    STEP,
    figure("MFU", lambda p: format_mfu(p.mfu)),
    PARETO,
)

#: A plan's communication per mesh axis and kind (the planner's and a user's program's).
COMM_BOUND: Column[AxisComm] = figure("bound", lambda a: format_bytes(a.bound_bytes), "lower bound")
COMM_COLUMNS: tuple[Column[AxisComm], ...] = (
    Column("axes", lambda a: a.axes, no_wrap=True),
    Column("kind", lambda a: a.kind, no_wrap=True),
    figure("count", lambda a: str(a.count)),
    figure("bytes/dev", lambda a: format_bytes(a.traffic_bytes), "bytes/device"),
    COMM_BOUND,
    figure("time", lambda a: format_seconds(a.time_s)),
    figure("nodes", lambda a: "across" if a.crosses_nodes else "within", only="rich"),
    Column("crosses nodes", lambda a: "yes" if a.crosses_nodes else "no", only="markdown"),
)

VALIDATION_COLUMNS: tuple[Column[Validation], ...] = (
    Column("strategy", lambda v: v.strategy),
    Column("mesh", lambda v: v.mesh, code=True),
    Column("formula", lambda v: format_bytes(v.formula_bytes)),
    Column("compiled", lambda v: format_bytes(v.compiled_bytes)),
    Column("ratio", lambda v: format_ratio(v.ratio)),
    Column("ok", lambda v: "yes" if v.ok else "no", markdown=f"within {TOLERANCE:.0%}"),
    Column("why not", lambda v: v.explanation, fold=True),
)

MEMORY_COLUMNS: tuple[Column[Plan], ...] = (
    Column("#", lambda p: str(p.rank)),
    Column("plan", lambda p: p.label),
    Column("params", lambda p: format_bytes(p.memory.params)),
    Column("grads", lambda p: format_bytes(p.memory.grads)),
    Column("optimizer", lambda p: format_bytes(p.memory.optimizer)),
    Column("activations", lambda p: format_bytes(p.memory.activations)),
    Column("gathered weights", lambda p: format_bytes(p.memory.gathered_weights)),
    Column("total (analytic)", lambda p: format_bytes(p.memory.total)),
    Column("compiled on CPU", lambda p: format_bytes(p.compiled_memory_bytes_per_device)),
)


def skipped_columns(first: str = "strategy") -> tuple[Column[Skipped], ...]:
    """What was skipped and why; ``first`` heads the first column (a user's program's plans
    are skipped per rule set)."""
    return (
        Column(first, lambda s: s.strategy),
        Column("mesh", lambda s: s.mesh, code=True),
        Column("reason", lambda s: s.reason),
        Column("why", lambda s: s.message, fold=True),
    )


# -- terminal --------------------------------------------------------------------------------


def ranked_table(
    columns: Sequence[Column[PlanT]],
    result: PlanSet[PlanT],
    *,
    heading: str,
    caption: str,
    top: int | None,
    edge: bool = True,
) -> Any:
    """The ranked plans (the best ``top``; None: all) as a rich table (without ``edge``, no
    blank line above and below its rows)."""
    return rich_table(
        columns,
        result.plans[: top or None],
        title=f"Plans: {heading}",
        caption=caption,
        show_edge=edge,
    )


def plan_table(result: PlanResult, *, top: int | None = None, verbose: bool = True) -> Any:
    """The ranked plans as a rich table; its caption explains the columns where
    ``verbose``, else it counts the candidates alone."""
    caption = (
        f"{result.screened} candidates estimated, {len(result.plans)} compiled, "
        f"{len(result.skipped)} skipped, {result.wall_s:.1f} s. * Pareto front (memory vs "
        f"step time)."
    )
    if verbose:
        caption += _PLAN_COLUMNS_TEXT
    return ranked_table(
        PLAN_COLUMNS, result, heading=headline(result), caption=caption, top=top, edge=verbose
    )


#: What the ranked plans' columns mean (the caption's second part, when verbose).
_PLAN_COLUMNS_TEXT = (
    " Memory: what the fit was judged by (a target compiler's buffer "
    "assignment where it compiled the plan, else the analytic estimate; the CPU "
    "compiler's numbers are in the JSON and report). Schedule: micro-batches per data "
    "shard, recomputation, the optimizer state on the host (streamed in and out for the "
    "update, exposed) and the vocabulary split over 'model' where chosen. x bound: the "
    "bytes the compiled program's collectives move over the formula's lower bound for the "
    "plan (above 1: more than the least; below 1: the program moves less than the formula "
    "counts, as where the compiler does not run a recomputed layer's collectives again, "
    "which the plan's notes say). Comm: every "
    "collective and pipeline transfer of the step as the time model prices it, hidden or "
    "not (the per-axis table has the compiled program's own). Rest: what the step takes "
    "beyond its compute (the collectives it does not hide and the compute they slow, the "
    "pipeline's bubble and transfers, the optimizer's update). Step: the "
    "compiled program's collectives in the time model (compute at the achievable "
    "fraction of peak, tensor-parallel collectives exposed, data-parallel ones overlapped "
    "as the schedule allows, pipeline bubble, optimizer); MFU: model FLOPs over the "
    "devices' peak."
)


def sub_axis_words(labels: Sequence[str]) -> str | None:
    """What an axis label of the compiler's sub-axes means, with the first among ``labels``
    (comma-separated mesh axes) as its example; None where none is one.

    >>> print(sub_axis_words(["data", "data:(2)2,model"])[:56])
    data:(2)2: a part of the mesh axis data the compiler spl
    >>> sub_axis_words(["data,model"]) is None
    True
    """
    for label in labels:
        for part in label.split(","):
            ref = AxisRef.parse(part.strip())
            if ref.size is not None:
                return (
                    f"{ref.label}: a part of the mesh axis {ref.name} the compiler split it "
                    f"into (Shardy's sub-axis name:(k)n: n of the axis's devices, the factor of "
                    f"it after factors of k)"
                )
    return None


def comm_table(result: PlanResult, *, top: int = 3, edge: bool = True) -> Any:
    """The best plans' collectives per mesh axis and kind, loop trips counted: one row per
    axis and kind, the plan named on its first (without ``edge``, no blank line above and
    below its rows)."""
    label: Column[tuple[str, AxisComm]] = Column("plan", lambda row: row[0], fold=True)

    def comm_of(row: tuple[str, AxisComm]) -> AxisComm:
        return row[1]

    columns = [label, *(c.on(comm_of) for c in rich_columns(COMM_COLUMNS))]
    shown = min(top, len(result.plans))
    best = "the best plan" if shown == 1 else f"the best {shown} plans"
    axes = [a.axes for p in result.plans[:top] for a in p.comm]
    table = rich_table(
        columns,
        (),
        title=f"Communication of {best}, per axis",
        caption=sub_axis_words(axes),
        show_edge=edge,
    )
    for p in result.plans[:top]:
        for i, a in enumerate(p.comm):
            table.add_row(*rich_cells(columns, (f"{p.rank}. {p.label}" if i == 0 else "", a)))
        if not p.comm:
            table.add_row(f"{p.rank}. {p.label}", "-", "none", "0", "0 B", "0 B", "0", "")
    return table


def skipped_table(result: PlanSet[RankedPlan], *, first: str = "strategy") -> Any:
    """What was skipped and why; ``first`` heads the first column (a user's program's plans
    are skipped per rule set)."""
    return rich_table(skipped_columns(first), result.skipped, title="Skipped")


def validation_line(result: PlanResult) -> str:
    """The validation table in one line: how many strategies' compiled communication is
    within the tolerance of the formula's."""
    ok = sum(v.ok for v in result.validations)
    return (
        f"compiled communication vs the analytic formula: {ok} of "
        f"{len(result.validations)} strategies' best plans within {TOLERANCE:.0%}"
    )


def validation_table(result: PlanResult) -> Any:
    return rich_table(
        VALIDATION_COLUMNS,
        result.validations,
        title="Compiled communication vs the analytic formula (best plan of each strategy; "
        f"ok: within {TOLERANCE:.0%} either way)",
    )


#: The notes the terminal prints only when verbose: the time model's constants and their
#: sources (the report's conventions, the JSON's notes and the docs' models page have them).
LONG_NOTES = frozenset({PlanNote.TIME_MODEL})
#: The notes the terminal prints whole, not cut to one line: those that answer what the
#: request asked (``beside_best``) and those that say a figure is not to be trusted, or what
#: it is made of (``ragged_dot_dense``: a program's compute at every group; ``repeated_work``:
#: a mesh's devices that repeat others' work).
ASKED_NOTES = frozenset(
    {
        PlanNote.BESIDE_BEST,
        PlanNote.NOT_COMPILED,
        PlanNote.EXPERTS_UNSPLIT,
        PlanNote.MIXTURE_STEP,
        PlanNote.MIXTURE_FP8,
        PlanNote.RAGGED_DOT_DENSE,
        PlanNote.REPEATED_WORK,
    }
)


def _fits_on_estimate(fits: Sequence[tuple[Plan, Note]]) -> str:
    """The fit-on-estimate notes of several plans as one line: which plans, the two figures'
    ranges, and why the compiler's are not the device's (each plan's note in full is in the
    JSON, the report and ``--verbose``)."""
    values = [n.values for _, n in fits if isinstance(n.values, FitOnEstimateValues)]

    def span(xs: Sequence[int]) -> str:
        low, high = format_bytes(min(xs)), format_bytes(max(xs))
        return low if low == high else f"{low} to {high}"

    # the reasons of the plan with the most stages (a staged one's has the schedule's too)
    most = max(values, key=lambda v: v.stages)
    return (
        f"note: plans {and_list([p.rank for p, _ in fits])}: each fit is judged on the "
        f"analytic estimate "
        f"({span([v.estimate_bytes for v in values])}), not on the {most.compiler} compiler's "
        f"buffers ({span([v.other_bytes for v in values])}), which would judge it otherwise: "
        f"{fit_on_estimate_why(most)} (each plan's figures: --verbose, the JSON, the report)"
    )


def _says_the_fit(p: Plan, note: Note, verbose: bool) -> bool:
    """Whether the terminal shows ``note`` of ``p``: one saying which of a compiler's memory
    and the estimate the fit was judged on, every one when ``verbose``, else where the other
    figure would have judged the fit otherwise."""
    judged = fit_judged(note)
    if judged is None:
        return False
    on, other = judged
    limit = p.memory_limit_bytes
    return verbose or memory_fits(on, limit) != memory_fits(other, limit)


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
    verbose: bool = True,
) -> None:
    """Prints the plan table, the best plans' communication, then what was skipped, the
    validation and the caveats.

    With no plan it prints why (unless ``empty_reason=False``: the CLI says it on stderr).
    ``flags`` turns the parameters a note names into the words that follow it (the command
    line names its flags). Not ``verbose`` (the command line's default), the skipped
    candidates are a line a reason, the validation one line, each note one line (but one
    saying which memory a fit was judged on, shown for the other figure, whole) and the
    time model's constants and their sources left out (the JSON and the report have them).
    """
    from rich.console import Console

    console = console or Console()
    if result.plans:
        console.print(plan_table(result, top=top, verbose=verbose))
        if result.fit_note:
            note = result.fit_note
            console.print(f"[bold red]{note}{flags(note.params)}[/]", highlight=False)
        console.print(comm_table(result, edge=verbose))
    elif empty_reason:
        console.print(f"[bold]{result.empty_reason}[/bold]")
    if result.skipped:
        if verbose:
            console.print(skipped_table(result))
        else:
            for line in skipped_lines(result.skipped):
                print_line(console, line)
    if result.validations:
        if verbose:
            console.print(validation_table(result))
        else:
            print_line(console, validation_line(result))
    if not result.plans:
        return
    # what a compiler said of the memory of a plan in the table, and which memory its fit
    # was judged on where two stand apart (its other notes are in the JSON and the report)
    notes = [
        (f"note: {note}", note.kind in ASKED_NOTES)
        for note in result.notes
        if verbose or note.kind not in LONG_NOTES
    ]
    shown = [
        (p, note)
        for p in result.plans[: top or None]
        for note in p.notes
        if note.kind == PlanNote.MEMORY_PRESSURE or _says_the_fit(p, note, verbose)
    ]
    fits = [(p, n) for p, n in shown if n.kind == PlanNote.FIT_ON_ESTIMATE]
    if not verbose and len(fits) > 1:
        # one line for the plans whose fit a CPU compile's buffers would judge otherwise
        notes.append((_fits_on_estimate(fits), True))
        shown = [(p, n) for p, n in shown if n.kind != PlanNote.FIT_ON_ESTIMATE]
    # a fit note is shown for the figure it sets beside the one judged on: printed whole, as
    # the line for several plans is, so that figure is not cut off
    notes += [
        (f"note: plan {p.rank} ({p.label}): {note}", fit_judged(note) is not None)
        for p, note in shown
    ]
    for line, whole in notes:
        if verbose or whole:
            console.print(line, highlight=False, markup=False)
        else:
            print_line(console, line)


# -- Markdown --------------------------------------------------------------------------------


def time_breakdown(p: Plan) -> list[str]:
    """The best plan's step time, part by part (Markdown lines): the compiled program's, with
    the screening estimate beside it."""
    t, e = p.time, p.estimated_time
    if t is None:
        return []
    rows = [
        ("compute (all micro-batches)", t.compute_s, e and e.compute_s),
        (
            "tensor-parallel collectives (on the critical path unless overlapped)",
            t.tp_comm_s,
            e and e.tp_comm_s,
        ),
        ("data-parallel / FSDP / ZeRO collectives", t.data_comm_s, e and e.data_comm_s),
        ("of which exposed (not hidden behind compute)", t.data_exposed_s, e and e.data_exposed_s),
        (
            "compute slowed by the collectives hidden behind it (the multiprocessors they hold)",
            t.contention_s,
            e and e.contention_s,
        ),
        ("pipeline stage-to-stage transfers", t.p2p_s, e and e.p2p_s),
        (
            f"pipeline bubble ({t.bubble_fraction:.0%} of the pipeline)",
            t.bubble_s,
            e and e.bubble_s,
        ),
        ("optimizer update", t.optimizer_s, e and e.optimizer_s),
        ("step", t.step_s, e and e.step_s),
    ]
    out = ["### Step time of the best plan", ""]
    out += markdown_lines(
        ["part", "seconds (compiled program)", "seconds (estimate)"],
        [[k, f"{v:.4g}", "-" if w is None else f"{w:.4g}"] for k, v, w in rows],
    )
    out += ["", f"Predicted MFU {t.mfu:.1%}."]
    compiled, formula = p.matmul_flops_per_device, p.estimated_matmul_flops_per_device
    if formula is not None:
        counted = "not counted" if compiled is None else format_flops(compiled)
        out.append(
            f"Matmul FLOPs per device in the step: {counted} in the compiled program, "
            f"{format_flops(formula)} by the time model's formula."
        )
    out.append("")
    return out


def hardware_text(hw: Hardware) -> str:
    """The hardware's links and latency, with where the numbers come from (one sentence)."""
    return (
        f"Hardware ({hw.source}): link {hw.link_bandwidth / 1e9:g} GB/s within a node of "
        f"{hw.node_size}, {hw.cross_node_bandwidth / 1e9:g} GB/s across nodes, "
        f"{hw.latency_s * 1e6:g} us latency per step."
    )


def comm_sections(plans: Sequence[RankedPlan], columns: Sequence[Column[AxisComm]]) -> list[str]:
    """Each plan's communication per axis (a Markdown section a plan), with its notes."""
    lines = ["## Communication per axis (loop trips counted)", ""]
    for p in plans:
        lines += [f"### {p.rank}. {p.label}", ""]
        if not p.comm:
            lines += ["No communication.", ""]
            continue
        lines += markdown_table(columns, p.comm)
        sub_axes = sub_axis_words([a.axes for a in p.comm])
        lines += [f"- {n}" for n in (*p.notes, *([sub_axes] if sub_axes else []))]
        lines.append("")
    return lines


def skipped_section(result: PlanSet[RankedPlan], *, first: str = "strategy") -> list[str]:
    """The skipped candidates as a Markdown section (none: no section)."""
    if not result.skipped:
        return []
    return [
        "## Skipped candidates",
        "",
        *markdown_table(skipped_columns(first), result.skipped),
        "",
    ]


def markdown_report(result: PlanResult) -> str:
    """The whole sweep as Markdown: ranked plans, communication per axis, memory breakdown,
    validation, skipped candidates, conventions."""
    hw = result.hardware
    lines = [
        f"# Sharding plan: {result.model} on {result.devices} x {hw.name}, {result.mode}",
        "",
        headline(result) + ".",
        "",
        hardware_text(hw),
        "",
        f"{result.candidates} strategy-and-mesh candidates, {result.screened} schedules "
        f"estimated: {len(result.plans)} compiled (in {result.wall_s:.1f} s), "
        f"{len(result.skipped)} skipped.",
        "",
    ]
    if not result.plans:
        lines += [f"**{result.empty_reason}**", ""]
    else:
        lines += _plan_sections(result)
    if result.validations:
        lines += ["## Validation: compiled communication vs the analytic formula", ""]
        lines += markdown_table(VALIDATION_COLUMNS, result.validations)
        lines.append("")
    lines += skipped_section(result)
    lines += ["## Conventions and caveats", ""]
    lines += [f"- {n}" for n in result.notes]
    lines += _conventions(result.settings)
    return "\n".join(lines)


def _plan_sections(result: PlanResult) -> list[str]:
    """The ranked plans, the best one's step time, memory and communication (Markdown)."""
    lines = ["## Ranked plans", "", *markdown_table(PLAN_COLUMNS, result.plans)]
    best = result.best
    if best is not None:
        lines += ["", f"Best: **{best.label}** ({best.summary}).", ""]
        lines += time_breakdown(best)
    else:
        lines += ["", f"**{result.fit_note}**", ""]
    lines += ["## Memory per device", "", *markdown_table(MEMORY_COLUMNS, result.plans), ""]
    return lines + comm_sections(result.plans, COMM_COLUMNS)


def _conventions(settings: Mapping[str, Any]) -> list[str]:
    return [
        f"- {settings.get('flops_convention', '')}",
        f"- {settings.get('activation_convention', '')}; flash attention "
        f"{'assumed' if settings.get('flash_attention') else 'not assumed'}",
        f"- model state: {settings.get('bytes_per_param')} bytes per parameter in "
        f"training (params and grads at the model dtype, the rest optimizer state)",
        "",
    ]
