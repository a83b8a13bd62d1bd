"""PNG charts, drawn headless with matplotlib's Agg canvas and written atomically."""

from __future__ import annotations

import importlib
import io
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.comm import format_bytes

if TYPE_CHECKING:
    from shardscope._src.layout import Layout


#: What drawing a chart imports: about a second of a cold start, spent once per process.
_CHART_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg")


def prefetch_chart_library() -> threading.Thread:
    """Imports the chart library in a background thread and returns it, so that a caller who
    will draw later pays for the import while it waits on something else: XLA releases the
    GIL while it compiles. An import that fails is left for the drawing to raise."""

    def load() -> None:
        for name in _CHART_MODULES:
            try:
                importlib.import_module(name)
            except ImportError:  # pragma: no cover - matplotlib is a dependency
                return

    thread = threading.Thread(target=load, name="shardscope-chart-import", daemon=True)
    thread.start()
    return thread


def plot_device_bytes(
    layouts: Mapping[str, Layout], path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """A grouped bar chart of bytes held per device, one group of bars per layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(layouts)
    devices = sorted({s.device_id for lay in layouts.values() for s in lay.shards})
    fig = Figure(figsize=(max(6.0, 0.6 * len(devices) + 3), 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(names))
    top = max((lay.max_device_bytes for lay in layouts.values()), default=1)
    scale, unit = next(
        ((s, u) for s, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if top >= s),
        (1, "B"),
    )
    for i, name in enumerate(names):
        held = layouts[name].device_bytes
        xs = [d + (i - (len(names) - 1) / 2) * width for d in range(len(devices))]
        bars = ax.bar(
            xs,
            [held.get(d, 0) / scale for d in devices],
            width=width,
            label=f"{name}: {format_bytes(layouts[name].max_device_bytes)}/device",
        )
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
    ax.set_xticks(range(len(devices)), [str(d) for d in devices])
    ax.set_xlabel("device id")
    ax.set_ylabel(f"bytes held ({unit})")
    first = next(iter(layouts.values()), None)
    ax.set_title(
        title
        or (
            f"Per-device memory of one {first.dtype}[{'x'.join(map(str, first.shape))}] array"
            if first
            else "Per-device memory"
        )
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=min(3, len(names)))
    ax.margins(y=0.12)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_atomic(path, lambda f: f.write(buf.getvalue()), binary=True)
