"""Rendering of an audit diff, imported lazily: a rich table for the terminal and the same
columns as plain text (for ``expect``'s failure message), from one column spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardscope._src.audit.diff import AuditDiff
from shardscope._src.base.comm import format_bytes
from shardscope._src.base.display import View, register
from shardscope._src.render.columns import Alarm, Column, rich_table, text_table

if TYPE_CHECKING:
    from shardscope._src.audit.diff import DiffRow


def _signed(n: int) -> str:
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + format_bytes(abs(n))


def _mark(r: DiffRow) -> str:
    return {"new": Alarm("+ new"), "gone": "- gone", "changed": "~"}.get(r.status, "")


def _count(r: DiffRow) -> str:
    return f"{r.old_count} -> {r.new_count}" if r.old_count != r.new_count else str(r.new_count)


def _bytes(r: DiffRow) -> str:
    if r.old_traffic_bytes == r.new_traffic_bytes:
        return format_bytes(r.new_traffic_bytes)
    return f"{format_bytes(r.old_traffic_bytes)} -> {format_bytes(r.new_traffic_bytes)}"


def _figure(header: str, value: Any) -> Column[DiffRow]:
    return Column(header, value, justify="right", no_wrap=True)


SCOPE: Column[DiffRow] = Column("scope", lambda r: r.scope or "-", no_wrap=True)

#: A diff's rows: what changed, where (the scope column only in a diff by scope), how much.
DIFF_COLUMNS: tuple[Column[DiffRow], ...] = (
    Column("", _mark, no_wrap=True),
    SCOPE,
    Column("axes", lambda r: r.axes, no_wrap=True),
    Column("kind", lambda r: r.kind, no_wrap=True),
    _figure("count", _count),
    _figure("bytes/device", _bytes),
    _figure("change", lambda r: _signed(r.traffic_change)),
)


def diff_columns(diff: AuditDiff) -> tuple[Column[DiffRow], ...]:
    return DIFF_COLUMNS if diff.by_scope else tuple(c for c in DIFF_COLUMNS if c is not SCOPE)


def _total_line(diff: AuditDiff) -> str:
    return (
        f"bytes sent per device per run: {format_bytes(diff.old_traffic_bytes)} -> "
        f"{format_bytes(diff.new_traffic_bytes)}"
    )


def diff_table(diff: AuditDiff, *, all_rows: bool = False) -> Any:
    """One row per (axes, kind) that appeared, disappeared or changed (``all_rows``: every one)."""
    shown = diff.rows if all_rows else diff.changed
    total = _signed(diff.new_traffic_bytes - diff.old_traffic_bytes)
    same = len(diff.rows) - len(diff.changed)
    caption = f"{_total_line(diff)} ({total}); " + (
        f"{same} {'row' if same == 1 else 'rows'} unchanged" if not all_rows else ""
    )
    return rich_table(
        diff_columns(diff),
        shown,
        title=f"Collectives: {diff.old_name} -> {diff.new_name}",
        caption=caption.rstrip("; "),
    )


def diff_text(diff: AuditDiff, *, all_rows: bool = False) -> str:
    """The same table as plain text, with the total bytes under it."""
    shown = diff.rows if all_rows else diff.changed
    lines = [*text_table(diff_columns(diff), shown, indent=""), _total_line(diff)]
    return "\n".join([*lines, *(f"warning: {w}" for w in diff.warnings)])


def render_diff(diff: AuditDiff, *, console: Any = None) -> None:
    """Prints the table, then what makes the comparison doubtful, then each broken budget."""
    from rich.console import Console

    console = console or Console()
    if diff.changed:
        console.print(diff_table(diff))
    else:
        console.print(
            f"no change in collectives: {diff.old_name} and {diff.new_name} send "
            f"{format_bytes(diff.new_traffic_bytes)} per device in the same collectives",
            highlight=False,
        )
    for w in diff.warnings:
        console.print(f"[bold yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    for v in diff.violations:
        console.print(f"[bold red]budget broken:[/] {v}", highlight=False)


register(AuditDiff, View.RICH, diff_table)
register(AuditDiff, View.TEXT, diff_text)
