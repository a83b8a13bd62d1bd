"""Terminal rendering of layouts (rich tables): an array's shards, and a pytree's arrays."""

from __future__ import annotations

from typing import Any

from shardscope._src.base.comm import format_bytes
from shardscope._src.base.display import View, register
from shardscope._src.layout import Layout, TreeLayout
from shardscope._src.render.console import mimebundle


def _slice_text(s: slice, size: int) -> str:
    return ":" if (s.start, s.stop) == (0, size) else f"{s.start}:{s.stop}"


def layout_table(lay: Layout, *, title: str | None = None) -> Any:
    """A rich table: one row per device with its mesh position, slices, shard shape and bytes."""
    from rich.table import Table

    shape = "x".join(str(d) for d in lay.shape) or "scalar"
    heading = title or f"{lay.dtype}[{shape}] {lay.spec_str}"
    axes = ", ".join(f"{k}={v}" for k, v in lay.mesh_axes.items())
    caption = (f"mesh ({axes}) | " if axes else "") + (
        f"{format_bytes(lay.max_device_bytes)} per device of {format_bytes(lay.nbytes)}, "
        f"replication {lay.replication}"
    )
    table = Table(title=heading, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("device", justify="right")
    if lay.mesh_axes:
        table.add_column("(" + ", ".join(lay.mesh_axes) + ")", justify="center")
    table.add_column("slices [" + ", ".join(f"d{i}" for i in range(len(lay.shape))) + "]")
    table.add_column("shard shape", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("replica", justify="right")
    for s in lay.shards:
        row = [str(s.device_id)]
        if lay.mesh_axes:
            row.append(",".join(str(p) for p in s.position))
        row += [
            "["
            + ", ".join(_slice_text(sl, n) for sl, n in zip(s.index, lay.shape, strict=True))
            + "]",
            "x".join(str(d) for d in s.shape) or "scalar",
            f"{s.nbytes:,}",
            str(s.replica_id),
        ]
        table.add_row(*row)
    return table


def tree_layout_table(tree: TreeLayout, *, title: str | None = None) -> Any:
    """A rich table: one row per array of a pytree (path, shape, dtype, spec, bytes per device,
    replication) and the totals per device."""
    from rich.table import Table

    axes = ", ".join(f"{k}={v}" for k, v in tree.mesh_axes.items())
    per_device = format_bytes(tree.max_device_bytes)
    if tree.min_device_bytes != tree.max_device_bytes:
        per_device = f"{format_bytes(tree.min_device_bytes)} to {per_device}"
    caption = (
        (f"mesh ({axes}) | " if axes else "")
        + f"{len(tree.leaves)} arrays, {format_bytes(tree.nbytes)} in all; "
        + f"{per_device} per device"
    )
    if tree.unplaced_bytes:
        caption += f" (unplaced arrays, {format_bytes(tree.unplaced_bytes)}, counted whole)"
    if tree.other_leaves:
        caption += f"; {tree.other_leaves} non-array leaves skipped"
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("path", overflow="fold")
    table.add_column("shape", justify="right", no_wrap=True)
    table.add_column("dtype")
    table.add_column("sharding", no_wrap=True)
    table.add_column("per device", justify="right", no_wrap=True)
    table.add_column("replicas", justify="right")
    for leaf in tree.leaves:
        table.add_row(
            leaf.path,
            "x".join(str(d) for d in leaf.shape) or "scalar",
            leaf.dtype,
            leaf.spec_str,
            format_bytes(leaf.max_device_bytes),
            "-" if leaf.replication is None else str(leaf.replication),
        )
    table.add_section()
    table.add_row("total", "", "", "", format_bytes(tree.max_device_bytes), "", end_section=True)
    return table


def layout_mimebundle(lay: Layout) -> dict[str, str]:
    """The layout table as plain text and HTML, for a notebook's display."""
    return mimebundle(layout_table(lay))


def tree_layout_mimebundle(tree: TreeLayout) -> dict[str, str]:
    """The pytree's table as plain text and HTML, for a notebook's display."""
    return mimebundle(tree_layout_table(tree), width=130)


register(Layout, View.RICH, layout_table)
register(Layout, View.NOTEBOOK, layout_mimebundle)
register(TreeLayout, View.RICH, tree_layout_table)
register(TreeLayout, View.NOTEBOOK, tree_layout_mimebundle)
