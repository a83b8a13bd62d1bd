"""The timeline PNG of one measured step: a row per device, its compute, its collectives by
kind, and underneath the stretches of communication that no compute overlapped (exposed)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.comm import KINDS, format_seconds

if TYPE_CHECKING:
    from shardscope._src.profile.records import Profile

#: Compute in a quiet colour, each collective kind in its own, exposed time in red.
COMPUTE_COLOUR = "#9db4cc"
EXPOSED_COLOUR = "#d62728"
KIND_COLOURS: dict[str, str] = dict(
    zip(
        (str(k) for k in KINDS),
        ("#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"),
        strict=False,
    )
)


def _unit(seconds: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return scale, unit
    return 1e-9, "ns"


def plot_profile_timeline(
    profile: Profile, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Draws :attr:`Profile.timeline` (the step of median time) and writes it as a PNG,
    atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = profile.timeline
    step = profile.per_step[profile.timeline_step]
    scale, unit = _unit(step.step_s)
    fig = Figure(figsize=(11.0, 1.6 + 0.55 * max(len(rows), 1)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    kinds_seen: list[str] = []
    for y, row in enumerate(rows):
        ax.broken_barh(
            [(a / scale, (b - a) / scale) for a, b in row.compute],
            (y - 0.32, 0.64),
            facecolors=COMPUTE_COLOUR,
        )
        for kind in dict.fromkeys(s.kind for s in row.collectives):
            if kind not in kinds_seen:
                kinds_seen.append(kind)
            ax.broken_barh(
                [
                    (s.start_s / scale, (s.end_s - s.start_s) / scale)
                    for s in row.collectives
                    if s.kind == kind
                ],
                (y - 0.22, 0.44),
                facecolors=KIND_COLOURS.get(kind, "#7f7f7f"),
                edgecolors="white",
                linewidth=0.6,
            )
        ax.broken_barh(
            [(a / scale, (b - a) / scale) for a, b in row.exposed],
            (y + 0.34, 0.1),
            facecolors=EXPOSED_COLOUR,
        )
    if rows:  # name the wide collectives once, on the first row
        for s in rows[0].collectives:
            if (s.end_s - s.start_s) >= 0.06 * step.step_s:
                ax.annotate(
                    s.name,
                    ((s.start_s + s.end_s) / 2 / scale, -0.5),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    annotation_clip=False,
                )
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_yticks(range(len(rows)), [f"device {r.device}" for r in rows])
    ax.set_xlim(0, step.step_s / scale)
    ax.set_xlabel(f"time from the step's start ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    handles = [Patch(facecolor=COMPUTE_COLOUR, label="compute")]
    handles += [Patch(facecolor=KIND_COLOURS.get(k, "#7f7f7f"), label=k) for k in kinds_seen]
    handles.append(Patch(facecolor=EXPOSED_COLOUR, label="exposed communication"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 if len(rows) > 3 else -0.3),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    share = step.exposed_s / step.step_s if step.step_s else 0.0
    ax.set_title(
        title
        or (
            f"{profile.program}: step {profile.timeline_step + 1} of {profile.steps} on "
            f"{profile.devices} {profile.backend} devices, {format_seconds(step.step_s)}; "
            f"exposed communication {format_seconds(step.exposed_s)} ({share:.0%})"
        ),
        fontsize=10,
        loc="left",
        pad=16,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_atomic(path, lambda f: f.write(buf.getvalue()), binary=True)
