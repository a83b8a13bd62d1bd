"""Terminal rendering of an audit diff (rich), imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_bytes

if TYPE_CHECKING:
    from shardscope._src.audit.diff import AuditDiff


def _signed(n: int) -> str:
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + format_bytes(abs(n))


def diff_table(diff: AuditDiff, *, all_rows: bool = False) -> Any:
    """One row per (axes, kind) that appeared, disappeared or changed (``all_rows``: every one)."""
    from rich import box
    from rich.table import Table

    shown = diff.rows if all_rows else diff.changed
    total = _signed(diff.new_traffic_bytes - diff.old_traffic_bytes)
    caption = (
        f"bytes sent per device per run: {format_bytes(diff.old_traffic_bytes)} -> "
        f"{format_bytes(diff.new_traffic_bytes)} ({total}); "
        + (f"{len(diff.rows) - len(diff.changed)} rows unchanged" if not all_rows else "")
    )
    table = Table(
        title=f"Collectives: {diff.old_name} -> {diff.new_name}",
        caption=caption.rstrip("; "),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    names = ("", "scope", "axes", "kind", "count", "bytes/device", "change")
    for name in names if diff.by_scope else names[:1] + names[2:]:
        table.add_column(
            name,
            justify="right" if name in ("count", "bytes/device", "change") else "left",
            no_wrap=True,
        )
    marks = {"new": "[red]+ new[/]", "gone": "[green]- gone[/]", "changed": "~", "same": ""}
    for r in shown:
        cells = [marks[r.status]] + ([r.scope or "-"] if diff.by_scope else [])
        table.add_row(
            *cells,
            r.axes,
            r.kind,
            f"{r.old_count} -> {r.new_count}" if r.old_count != r.new_count else str(r.new_count),
            f"{format_bytes(r.old_traffic_bytes)} -> {format_bytes(r.new_traffic_bytes)}"
            if r.old_traffic_bytes != r.new_traffic_bytes
            else format_bytes(r.new_traffic_bytes),
            _signed(r.traffic_change),
        )
    return table


def render_diff(diff: AuditDiff, *, console: Any = None) -> None:
    """Prints the table, then each broken budget (or that none is)."""
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
    for v in diff.violations:
        console.print(f"[bold red]budget broken:[/] {v}", highlight=False)
