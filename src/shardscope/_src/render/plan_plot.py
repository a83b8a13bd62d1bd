"""The planner's chart: memory per device against communication time, one point per plan,
the Pareto front marked. Drawn headless with matplotlib's Agg canvas, written atomically."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope._src.base.io import write_atomic
from shardscope._src.render.console import format_bytes
from shardscope._src.render.plan import format_seconds

if TYPE_CHECKING:
    from shardscope._src.plan.types import PlanResult


def plot_plans(result: PlanResult, path: str | os.PathLike[str]) -> Path:
    """Writes the chart as PNG. Filled markers fit the device memory, hollow ones do not; the
    dashed line is the device memory, the step line the Pareto front, the star the best plan.
    With no plan, the chart says why."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    hw = result.hardware
    ax.set_title(
        f"{result.model} {result.mode} on {result.devices} x {hw.name}: {len(result.plans)} plans",
        fontsize=11,
    )
    if not result.plans:
        ax.text(
            0.5,
            0.5,
            result.empty_reason or "no plan",
            ha="center",
            va="center",
            wrap=True,
            fontsize=9,
            transform=ax.transAxes,
        )
        ax.set_axis_off()
    else:
        top = max(p.memory_bytes_per_device for p in result.plans)
        gib, unit = next(
            ((sc, u) for sc, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if top >= sc),
            (1, "B"),
        )
        strategies = list(dict.fromkeys(p.strategy for p in result.plans))
        colors = {s: f"C{i % 10}" for i, s in enumerate(strategies)}
        for s in strategies:
            group = [p for p in result.plans if p.strategy == s]
            for fits in (True, False):
                pts = [p for p in group if p.fits == fits]
                if not pts:
                    continue
                ax.scatter(
                    [p.memory_bytes_per_device / gib for p in pts],
                    [p.comm_time_s for p in pts],
                    s=46,
                    marker="o",
                    facecolors=colors[s] if fits else "none",
                    edgecolors=colors[s],
                    label=s if fits or not any(q.fits for q in group) else None,
                    zorder=3,
                )
        front = sorted(
            (p for p in result.plans if p.pareto),
            key=lambda p: (p.memory_bytes_per_device, p.comm_time_s),
        )
        if front:
            ax.step(
                [p.memory_bytes_per_device / gib for p in front],
                [p.comm_time_s for p in front],
                where="post",
                color="black",
                linewidth=1.0,
                alpha=0.7,
                zorder=2,
                label="Pareto front",
            )
            for p in front:
                short = f"{p.strategy} {'x'.join(str(v) for v in p.mesh.values())}"
                ax.annotate(
                    short,
                    (p.memory_bytes_per_device / gib, p.comm_time_s),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=7,
                )
        best = result.best
        if best is not None:
            ax.scatter(
                [best.memory_bytes_per_device / gib],
                [best.comm_time_s],
                marker="*",
                s=220,
                color="gold",
                edgecolors="black",
                zorder=4,
                label=f"best: {best.label} ({format_seconds(best.step_time_s)}/step)",
            )
        else:
            ax.plot([], [], " ", label="no plan fits the device memory")
        if hw.memory_bytes <= 2 * top:
            ax.axvline(
                hw.memory_bytes / gib,
                color="grey",
                linestyle="--",
                linewidth=1,
                label=f"device memory {format_bytes(hw.memory_bytes)}",
            )
        else:
            ax.plot(
                [], [], " ", label=f"device memory {format_bytes(hw.memory_bytes)} (off the chart)"
            )
        if any(not p.fits for p in result.plans):
            ax.scatter(
                [], [], s=46, facecolors="none", edgecolors="grey", label="hollow: does not fit"
            )
        times = [p.comm_time_s for p in result.plans if p.comm_time_s > 0]
        if times and max(times) / min(times) > 10:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            from matplotlib.ticker import FuncFormatter
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v)))
        source = getattr(result, "memory_source", "analytic")
        ax.set_xlabel(f"memory per device, {source} ({unit})")
        ax.set_ylabel("communication time per step (alpha-beta)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_atomic(path, lambda f: f.write(buf.getvalue()), binary=True)
