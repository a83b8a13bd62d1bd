"""Terminal rendering of a :class:`~shardscope._src.verdict.Verdict`: a rich table and its lines.

The table lists, per mesh axes and collective kind, the bytes each device sends in the
compiled program beside the bound; below it the instructions that exceed the bound (with
source lines), the verified hints, notes, and last the one-line verdict.
``rich`` is imported only here, when a table is drawn.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import ALL_REDUCE, REDUCE_SCATTER, format_bytes
from shardscope._src.render.brief import NAMED, print_line
from shardscope._src.render.console import output_console

if TYPE_CHECKING:
    from shardscope._src.verdict import Excess, Verdict


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _short(source: str) -> str:
    path, _, line = source.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else source


def _where(excess: Excess) -> str:
    """The instruction's source line, else ``after`` its input's."""
    if excess.source:
        return _short(excess.source)
    if excess.operand_source:
        return f"after {_short(excess.operand_source)}"
    return "(no source line)"


def verdict_table(verdict: Verdict, *, title: str | None = None) -> Any:
    """A ``rich.table.Table``: bound against compiled traffic per (axes, kind)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title or f"Verdict: {verdict.label}", header_style="bold")
    table.add_column("axes")
    table.add_column("kind")
    table.add_column("bound count", justify="right")
    table.add_column("count", justify="right")
    table.add_column("bound sent/device", justify="right")
    table.add_column("sent/device", justify="right")
    table.add_column("ratio", justify="right")
    if not verdict.rows:
        table.add_row("-", "none", "0", "0", "0 B", "0 B", "1.00x")
    # A reduce-scatter of the bound that the program sends as an all-reduce over the same
    # axes (a compiler that forms none): that all-reduce row is read against both bounds.
    unformed = {
        r.axes: r.bound_bytes
        for r in verdict.rows
        if r.kind == REDUCE_SCATTER and r.bound_bytes and not r.actual_bytes
    }
    substituted = False
    for r in verdict.rows:
        over = r.ratio is None or r.ratio > 1.05
        # A ratio is meaningful where the bound and the program both send something here.
        shown = r.ratio if r.bound_bytes and r.actual_bytes else None
        text = _ratio_text(shown)
        if r.kind == ALL_REDUCE and r.axes in unformed and r.actual_bytes:
            shown = r.actual_bytes / (r.bound_bytes + unformed[r.axes])
            over, text, substituted = shown > 1.05, f"{shown:.2f}x*", True
        table.add_row(
            ",".join(r.axes) or "-",
            r.kind,
            str(r.bound_count),
            str(r.actual_count),
            format_bytes(r.bound_bytes),
            format_bytes(r.actual_bytes),
            Text(text, style="red" if over else "green"),
        )
    if substituted:
        table.caption = (
            "* an all-reduce where the bound has a reduce-scatter over the same axes, which "
            "the program does not form: read against both rows' bounds"
        )
    table.add_section()
    table.add_row(
        Text("all", style="bold"),
        "",
        "",
        "",
        format_bytes(verdict.bound_bytes),
        Text(format_bytes(verdict.actual_bytes), style="bold"),
        Text(_ratio_text(verdict.ratio), style="bold"),
    )
    return table


def verdict_lines(verdict: Verdict, *, verbose: bool = True) -> list[str]:
    """The lines printed under the table, ending with the verdict itself; not ``verbose``,
    the instructions that exceed the bound for the same reason are one line, naming a few."""
    lines = []
    if verbose:
        for e in verdict.excess:
            scope = f" [{e.scope}]" if e.scope else ""
            lines.append(
                f"exceeds: {e.instruction} ({e.kind} x{e.count} of {e.array}, "
                f"{format_bytes(e.traffic_bytes)}) at {_where(e)}{scope}: {e.reason}"
            )
    else:
        by: dict[str, list[Excess]] = {}
        for e in verdict.excess:
            by.setdefault(e.reason, []).append(e)
        for reason, group in by.items():
            names = ", ".join(e.instruction for e in group[:NAMED])
            more = f" and {len(group) - NAMED} more" if len(group) > NAMED else ""
            lines.append(f"exceeds ({len(group)}: {names}{more}): {reason}")
    for h in verdict.hints:
        status = "reaches the bound" if h.reaches_bound else f"{_ratio_text(h.ratio)} the bound"
        if h.traffic_bytes >= verdict.actual_bytes:
            status += ", no better than the program on this backend"
        lines.append(f"hint (compiled: {format_bytes(h.traffic_bytes)}, {status}): {h.change}")
        lines.append(f"      {h.code}")
    for note in (*verdict.bound_notes, *verdict.notes):
        lines.append(f"note: {note}")
    lines.append(f"verdict: {verdict.summary()}")
    return lines


def render_verdict(
    verdict: Verdict, *, console: Any = None, title: str | None = None, verbose: bool = True
) -> None:
    """Prints the verdict table and its lines to ``console`` (a new rich Console by default);
    not ``verbose``, each line but the verdict's own is cut to one line of the console, but
    for the notes whose kind is printed whole (those that reconcile two figures shown)."""

    console = console or output_console()
    console.print(verdict_table(verdict, title=title))
    lines = verdict_lines(verdict, verbose=verbose)
    notes = (*verdict.bound_notes, *verdict.notes)
    whole = {f"note: {n}" for n in notes if n.kind.whole}
    for line in lines[:-1]:
        if verbose or line in whole:
            console.print(line, highlight=False, markup=False)
        else:
            print_line(console, line)
    console.print(lines[-1], highlight=False, markup=False)


def format_verdict(verdict: Verdict, *, width: int = 140) -> str:
    """The rendered verdict as plain text (no colour)."""

    from rich.console import Console

    buf = io.StringIO()
    render_verdict(
        verdict, console=Console(file=buf, width=width, color_system=None, force_terminal=False)
    )
    return buf.getvalue()
