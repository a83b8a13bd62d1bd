"""Renderers of a sharding search (:class:`~shardscope._src.suggest.suggest.SuggestResult`): the
proposals ranked, what the best changes in the user's own plan, the spec and bytes per device
of each array of the best, and a Markdown report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_bytes, format_memory, format_seconds
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.plan.notes import PlanNote, format_count
from shardscope._src.plan.types import Skipped, skipped_by_reason
from shardscope._src.render.brief import NAMED
from shardscope._src.render.columns import Column, markdown_table, rich_table
from shardscope._src.sharding.rules import sharded_rules

if TYPE_CHECKING:
    from shardscope._src.suggest.suggest import ArrayShard, Change, Proposal, SuggestResult


def headline(result: SuggestResult) -> str:
    hw = result.hardware
    compiler = result.target if result.target != "cpu" else "simulated CPU devices"
    named = "axes its dataflow joins" if result.by_dataflow else "logical names"
    return (
        f"{result.program} on {result.devices} x {hw.name}, {format_memory(hw.memory_bytes)} "
        f"each, "
        f"mesh axes {', '.join(result.axes)}, {named} {', '.join(result.names)}: "
        f"{result.candidates} candidates screened ({result.layouts} distinct layouts), "
        f"{result.compiled} compiled "
        f"({compiler}) in {result.wall_s:.1f} s"
    )


def dataflow_names(result: SuggestResult) -> str | None:
    """What each axis a program's dataflow joins is named after, where it has no logical
    names: the first array dimension it holds, with its size, and how many other dimensions
    it joins (``arg2_0 = [2] dim 0 (16) and 1 other dimensions``); None for a named program."""
    if not result.by_dataflow:
        return None
    first: dict[str, tuple[str, int, int]] = {}
    more: dict[str, int] = {}
    for a in result.arrays:
        for d, names in enumerate(a.names):
            for n in names:
                if n in first:
                    more[n] = more.get(n, 0) + 1
                else:
                    first[n] = (a.path, d, a.shape[d])
    parts = []
    for n in result.names:
        if n not in first:
            continue
        path, d, size = first[n]
        also = f" and {more[n]} other dimensions" if more.get(n) else ""
        parts.append(f"{n} = {path} dim {d} ({size}){also}")
    return "the axes, each named after the first array dimension it holds: " + "; ".join(parts)


def _rules(p: Proposal) -> str:
    return sharded_rules(p.rules)


def format_against(ratio: float | None) -> str:
    """A step time over yours (:attr:`~shardscope._src.suggest.suggest.Proposal.ratio`) in
    words that cannot be read the wrong way round: ``'1.15x slower'``, ``'4.72x faster'``,
    ``'same'`` where the two round alike (``'-'``: no yardstick, or no time).

    >>> format_against(1.148), format_against(0.2119), format_against(1.001), format_against(None)
    ('1.15x slower', '4.72x faster', 'same', '-')
    """
    if ratio is None or ratio <= 0:
        return "-"
    if f"{ratio:.2f}" == "1.00" and f"{1 / ratio:.2f}" == "1.00":
        return "same"
    return f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"


def distinct_work(working: float | None, devices: int) -> str:
    """The devices doing distinct work of ``devices``: ``'4 of 32'`` (``'-'``: unknown)."""
    return "-" if working is None else f"{format_count(working)} of {devices}"


PROPOSAL_COLUMNS: tuple[Column[Proposal], ...] = (
    Column("#", lambda p: str(p.rank)),
    Column("mesh", lambda p: format_mesh_spec(p.mesh), no_wrap=True),
    Column("rules", _rules, fold=True),
    Column("memory", lambda p: format_bytes(p.memory_bytes_per_device), justify="right"),
    Column("fits", lambda p: "yes" if p.fits else "no"),
    Column(
        "distinct work",
        lambda p: distinct_work(p.working_devices, p.plan.devices),
        justify="right",
        no_wrap=True,
    ),
    Column("step", lambda p: format_seconds(p.step_time_s), justify="right"),
    Column("vs yours", lambda p: format_against(p.ratio), justify="right"),
)


def _spec(a: ArrayShard) -> str:
    return "P(" + ", ".join("None" if x is None else repr(x) for x in a.spec) + ")"


ARRAY_COLUMNS: tuple[Column[ArrayShard], ...] = (
    Column("array", lambda a: a.path, fold=True, code=True),
    Column("shape", lambda a: str(a.shape), no_wrap=True),
    Column("spec", _spec, no_wrap=True, code=True),
    Column("per device", lambda a: format_bytes(a.bytes_per_device), justify="right"),
)


def settled_line(result: SuggestResult) -> str:
    """Whether the search reached a local optimum the compiler checked, or its budget."""
    if result.settled:
        return (
            "the best proposal is a local optimum: every neighbour (one name moved, or the "
            "next mesh shape) was compiled and none is faster"
        )
    return (
        f"the budget of {result.compiled} compiles ran out before every neighbour of the best "
        f"proposal was compiled (more: --compiles, compiles=)"
    )


def change_lines(change: Change, *, keep_own: bool = False) -> list[str]:
    """What the best proposal changes in the user's best plan, in words; ``keep_own``: the
    user's plan is at least as fast, and the words say the proposal does not beat it."""
    moves = [f"{n}: {a or 'replicated'} -> {b or 'replicated'}" for n, a, b in change.moves]
    mesh = format_mesh_spec(change.mesh)
    own_mesh = format_mesh_spec(change.own_mesh)
    yours = (
        f"your best, {change.own_label} ({format_seconds(change.own_step_time_s)}, "
        f"{format_bytes(change.own_memory_bytes_per_device)} a device)"
    )
    lines = [
        f"the best proposal against {yours}, which it does not beat:"
        if keep_own
        else f"against {yours}:"
    ]
    if change.same:
        lines.append("  nothing: your best shards every name as the best proposal does")
    else:
        if own_mesh != mesh:
            lines.append(f"  mesh {own_mesh} -> {mesh}")
        lines += [f"  {m}" for m in moves]
    ratio = change.step_time_s / change.own_step_time_s if change.own_step_time_s else None
    lines.append(
        f"  step {format_seconds(change.own_step_time_s)} -> "
        f"{format_seconds(change.step_time_s)} ({format_against(ratio)}), memory "
        f"{format_bytes(change.own_memory_bytes_per_device)} -> "
        f"{format_bytes(change.memory_bytes_per_device)} a device"
    )
    return lines


def skipped_lines(result: SuggestResult) -> list[str]:
    """A line per candidate whose compile failed (its mesh and why), the JSON's ``skipped``."""
    return [f"skipped {s.strategy} {s.mesh} ({s.reason}): {s.message}" for s in result.skipped]


def grouped_skipped_lines(skipped: Sequence[Skipped], *, named: int = NAMED) -> list[str]:
    """A line a reason the candidates were skipped for: how many, what to do where there is
    a fix (:data:`~shardscope._src.suggest.suggest.SKIP_FIXES`), then the first ``named`` of
    them, each its rules and mesh, set apart by ``;`` (a candidate's rules are themselves a
    list with commas)."""
    from shardscope._src.suggest.suggest import SKIP_FIXES  # (jax's import, where it runs)

    lines = []
    for reason, group in skipped_by_reason(skipped).items():
        shown = "; ".join(f"{s.strategy} on {s.mesh}" for s in group[:named])
        more = f"; and {len(group) - named} more" if len(group) > named else ""
        many = f"{len(group)} candidate{'s' if len(group) != 1 else ''}"
        fix = SKIP_FIXES.get(reason)
        head = f"{many} {fix}" if fix else f"skipped for {reason}: {many}"
        lines.append(f"{head} ({shown}{more})")
    return lines


#: The arrays of the best proposal the terminal lists when not verbose.
ARRAYS_SHOWN = 10


def render_suggest(
    result: SuggestResult,
    *,
    console: Any,
    top: int | None = None,
    verbose: bool = True,
    advice: bool = True,
) -> None:
    """Prints the proposals, what the best changes in the user's plan and its arrays. Not
    ``verbose`` (the command line's default), the candidates whose compile failed are a line
    a reason and the best's first :data:`ARRAYS_SHOWN` arrays are listed (the JSON and the
    report have every one). Where nothing fits, the fit advice is printed unless not
    ``advice`` (the command line raises it as its one-line error instead)."""
    console.print(headline(result), highlight=False)
    legend = dataflow_names(result)
    if legend is not None:
        console.print(legend, highlight=False)
    # the answer first: where no proposal beats the user's own rules, that
    notes = result.notes
    for note in notes:
        if note.kind == PlanNote.KEEP_OWN:
            console.print(note.text, highlight=False)
    shown: Sequence[Proposal] = result.proposals[:top] if top else result.proposals
    console.print(
        rich_table(PROPOSAL_COLUMNS, shown, title="proposals (compiled, best first)"),
    )
    for line in skipped_lines(result) if verbose else grouped_skipped_lines(result.skipped):
        console.print(line, highlight=False)
    best = result.best
    if best is None:
        if advice and not result.keep_own:
            console.print(result.fit_advice or "no proposal compiled", highlight=False)
        return
    console.print(settled_line(result), highlight=False)
    for note in notes:
        if note.kind != PlanNote.KEEP_OWN:
            console.print(f"note: {note}", highlight=False)
    change = result.change
    if change is not None:
        for line in change_lines(change, keep_own=result.keep_own):
            console.print(line, highlight=False)
    arrays = best.arrays if verbose else best.arrays[:ARRAYS_SHOWN]
    which = "every array"
    if len(arrays) < len(best.arrays):
        which = f"the first {len(arrays)} of its {len(best.arrays)} arrays"
    what = "the best proposal" if result.keep_own else "the best"
    title = f"{what}, {format_mesh_spec(best.mesh)}: {which}"
    console.print(rich_table(ARRAY_COLUMNS, arrays, title=title))


def suggest_markdown_report(result: SuggestResult) -> str:
    """The search as Markdown: the headline, the proposals, the change, the best's arrays."""
    lines = [f"# Sharding proposals for {result.program}", "", headline(result), ""]
    legend = dataflow_names(result)
    if legend is not None:
        lines += [legend, ""]
    notes = result.notes
    keep = [n for n in notes if n.kind == PlanNote.KEEP_OWN]
    lines += [*(f"**{note}**" for note in keep), *([""] if keep else [])]
    lines += markdown_table(PROPOSAL_COLUMNS, result.proposals)
    best = result.best
    lines.append("")
    own = result.own_best
    if result.keep_own and own is not None:
        lines += [f"## Rules to keep: yours, {own.rules_name} on {own.mesh_spec}", "", "```json"]
        lines += [result.rules_text().rstrip("\n"), "```", ""]
    if best is None:
        if not result.keep_own:
            lines.append(result.fit_advice or "no proposal compiled")
        return "\n".join(lines) + "\n"
    lines += [settled_line(result), ""]
    others = [n for n in notes if n.kind != PlanNote.KEEP_OWN]
    if others:
        lines += [*(f"note: {note}" for note in others), ""]
    if not result.keep_own:
        lines += ["## Rules of the best", "", "```json"]
        lines += [result.rules_text().rstrip("\n"), "```", ""]
    change = result.change
    if change is not None:
        lines += [
            "## The best proposal against your rules"
            if result.keep_own
            else "## Against your rules",
            "",
        ]
        lines += [
            line.strip() if i == 0 else "-" + line[1:]
            for i, line in enumerate(change_lines(change, keep_own=result.keep_own))
        ]
        lines.append("")
    which = "the best proposal (not faster than yours)" if result.keep_own else "the best"
    lines += [f"## Every array of {which} ({format_mesh_spec(best.mesh)})", ""]
    lines += markdown_table(ARRAY_COLUMNS, best.arrays)
    return "\n".join(lines) + "\n"
