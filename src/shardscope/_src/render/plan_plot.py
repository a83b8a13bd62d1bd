"""The planner's chart: step time against the memory per device that decided the fit, one
point per plan, the Pareto front marked. Drawn headless with matplotlib's Agg canvas, written
atomically."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.comm import format_bytes, format_seconds

if TYPE_CHECKING:
    from shardscope._src.render.protocols import PlanSet, RankedPlan


def plot_plans(result: PlanSet[RankedPlan], path: str | os.PathLike[str]) -> Path:
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
    if result.plans:
        _draw_plans(ax, result)
    else:
        _say_why_empty(ax, str(result.empty_reason or "no plan"))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_atomic(path, lambda f: f.write(buf.getvalue()), binary=True)


def _say_why_empty(ax: Any, reason: str) -> None:
    ax.text(
        0.5,
        0.5,
        reason,
        ha="center",
        va="center",
        wrap=True,
        fontsize=9,
        transform=ax.transAxes,
    )
    ax.set_axis_off()


def _draw_plans(ax: Any, result: PlanSet[RankedPlan]) -> None:
    """Every plan, the Pareto front, the best plan and the device memory, then the axes."""
    plans, hw = result.plans, result.hardware
    top = max(p.fit_memory_bytes_per_device for p in plans)
    scale, unit = _memory_unit(top)
    _scatter_strategies(ax, plans, scale)
    _draw_front(ax, plans, scale)
    _mark_best(ax, result.best, scale)
    _mark_device_memory(ax, hw.memory_bytes, top, scale)
    if any(not p.fits for p in plans):
        ax.scatter([], [], s=46, facecolors="none", edgecolors="grey", label="hollow: does not fit")
    _time_axis(ax, plans)
    ax.set_xlabel(f"memory per device that decided the fit ({unit})")
    ax.set_ylabel("step time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def _memory_unit(top: int) -> tuple[int, str]:
    """The largest binary unit the largest memory reaches: ``(bytes per unit, its name)``."""
    return next(
        ((sc, u) for sc, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if top >= sc),
        (1, "B"),
    )


def _scatter_strategies(ax: Any, plans: Sequence[RankedPlan], scale: int) -> None:
    """One colour a strategy; filled where the plan fits, hollow where it does not."""
    strategies = list(dict.fromkeys(p.strategy for p in plans))
    colors = {s: f"C{i % 10}" for i, s in enumerate(strategies)}
    for s in strategies:
        group = [p for p in plans if p.strategy == s]
        for fits in (True, False):
            pts = [p for p in group if p.fits == fits]
            if not pts:
                continue
            ax.scatter(
                [p.fit_memory_bytes_per_device / scale for p in pts],
                [p.step_time_s for p in pts],
                s=46,
                marker="o",
                facecolors=colors[s] if fits else "none",
                edgecolors=colors[s],
                label=s if fits or not any(q.fits for q in group) else None,
                zorder=3,
            )


def _draw_front(ax: Any, plans: Sequence[RankedPlan], scale: int) -> None:
    """The Pareto front as a step line, each of its plans named."""
    front = sorted(
        (p for p in plans if p.pareto),
        key=lambda p: (p.fit_memory_bytes_per_device, p.step_time_s),
    )
    if not front:
        return
    ax.step(
        [p.fit_memory_bytes_per_device / scale for p in front],
        [p.step_time_s for p in front],
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
            (p.fit_memory_bytes_per_device / scale, p.step_time_s),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=7,
        )


def _mark_best(ax: Any, best: RankedPlan | None, scale: int) -> None:
    """A star on the best plan, or a legend line saying none fits."""
    if best is None:
        ax.plot([], [], " ", label="no plan fits the device memory")
        return
    ax.scatter(
        [best.fit_memory_bytes_per_device / scale],
        [best.step_time_s],
        marker="*",
        s=220,
        color="gold",
        edgecolors="black",
        zorder=4,
        label=f"best: {best.label} ({format_seconds(best.step_time_s)}/step)",
    )


def _mark_device_memory(ax: Any, memory_bytes: float, top: int, scale: int) -> None:
    """A dashed line at the device memory, or a legend line where it lies far off the chart."""
    if memory_bytes <= 2 * top:
        ax.axvline(
            memory_bytes / scale,
            color="grey",
            linestyle="--",
            linewidth=1,
            label=f"device memory {format_bytes(memory_bytes)}",
        )
    else:
        ax.plot([], [], " ", label=f"device memory {format_bytes(memory_bytes)} (off the chart)")


def _time_axis(ax: Any, plans: Sequence[RankedPlan]) -> None:
    """Seconds on the y axis, logarithmic where the times span more than ten times."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    times = [p.step_time_s for p in plans if p.step_time_s > 0]
    if times and max(times) / min(times) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_seconds(v)))
