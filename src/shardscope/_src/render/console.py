"""Terminal rendering of layouts (rich), imported lazily so ``import shardscope`` stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_bytes

if TYPE_CHECKING:
    from shardscope._src.layout import Layout


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


PIPED_WIDTH = 140  # piped or captured output has no terminal width to follow


def output_console(*, piped_width: int = PIPED_WIDTH, **kwargs: Any) -> Any:
    """A rich Console for stdout: the terminal's width, or ``piped_width`` columns in a log or
    pipe, so that wide tables stay readable rather than squeezed into 80 columns."""
    from rich.console import Console

    console = Console(**kwargs)
    if console.is_terminal or console.is_jupyter:
        return console
    return Console(**kwargs, width=piped_width)


def mimebundle(renderable: Any, width: int = 110) -> dict[str, str]:
    """Plain text and HTML of a rich renderable, for notebooks' ``_repr_mimebundle_``."""
    from rich.console import Console

    rec = Console(width=width, record=True, file=_Discard(), force_jupyter=False)
    rec.print(renderable)
    return {
        "text/plain": rec.export_text(clear=False),
        "text/html": rec.export_html(inline_styles=True, code_format="<pre>{code}</pre>"),
    }


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
