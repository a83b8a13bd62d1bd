"""Terminal rendering of a :class:`~shardscope._src.profile.records.Profile`: measured beside
predicted, per collective, per scope and per step, and how much of the audit the join found.
``rich`` is imported only when a table is drawn."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_seconds
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.render.columns import Alarm, Column, rich_table
from shardscope._src.render.console import natural_width, output_console

if TYPE_CHECKING:
    from shardscope._src.profile.records import (
        MeasuredCollective,
        Profile,
        ScopeRow,
        StepFigures,
    )


def _s(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def _short(where: str | None) -> str:
    """``/a/b/model.py:12`` -> ``model.py:12``."""
    if not where:
        return "-"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else where


def _scope(r: ScopeRow) -> str:
    """A row's scope; a combined collective's the scopes it carries, joined by ``+``."""
    if r.scopes:
        return " + ".join(s or "(no scope)" for s in r.scopes)
    return r.scope or "(no scope)"


def _spread(c: MeasuredCollective) -> str:
    if c.time_min_s is None or c.time_max_s is None:
        return "-"
    return f"{format_seconds(c.time_min_s)} - {format_seconds(c.time_max_s)}"


def _runs(c: MeasuredCollective) -> str:
    """Executions per step per device as measured; marked when they differ from the count."""
    text = f"{c.executions:g}"
    return text if c.executions == c.count else Alarm(text)


def _exposed(measured: float | None, whole: float | None) -> str:
    """A measured exposed time, marked when it is at least half of the collective's time."""
    text = _s(measured)
    if measured is not None and whole and measured >= 0.5 * whole:
        return Alarm(text)
    return text


def _figure(header: str, value: Any) -> Any:
    return Column(header, value, justify="right", no_wrap=True)


COLLECTIVE_COLUMNS: tuple[Column[MeasuredCollective], ...] = (
    Column("axes", lambda c: c.axes, no_wrap=True),
    Column("kind", lambda c: c.kind, no_wrap=True),
    Column("scope", lambda c: c.scope or "-", fold=True),
    _figure("count", lambda c: str(c.count)),
    _figure("runs", _runs),
    _figure("measured\n(median)", lambda c: _s(c.time_s)),
    _figure("spread", _spread),
    _figure("predicted", lambda c: _s(c.predicted_s)),
    _figure("exposed\n(measured)", lambda c: _exposed(c.exposed_s, c.time_s)),
    _figure("exposed\n(predicted)", lambda c: _s(c.predicted_exposed_s)),
    Column("source", lambda c: _short(c.source), no_wrap=True),
    Column("HLO", lambda c: c.name, fold=True),
)

SCOPE_COLUMNS: tuple[Column[ScopeRow], ...] = (
    Column("scope", lambda r: _scope(r), fold=True),
    Column("axes", lambda r: r.axes, no_wrap=True),
    Column("kind", lambda r: r.kind, no_wrap=True),
    _figure("count", lambda r: str(r.count)),
    _figure("measured", lambda r: _s(r.time_s)),
    _figure("predicted", lambda r: _s(r.predicted_s)),
    _figure("exposed\n(measured)", lambda r: _exposed(r.exposed_s, r.time_s)),
    _figure("exposed\n(predicted)", lambda r: _s(r.predicted_exposed_s)),
)

_STEP_ROWS = (
    ("step time", "step_s", "step_s"),
    ("compute busy", "compute_s", "compute_s"),
    ("communication busy", "comm_s", "comm_s"),
    ("exposed communication", "exposed_s", "exposed_s"),
    ("idle", "idle_s", None),
)


def step_table(p: Profile) -> Any:
    """The measured step (median and spread over the steps) beside the planner's."""
    rows = []
    for label, measured, predicted in _STEP_ROWS:
        values = [getattr(s, measured) for s in p.per_step]
        guess = None
        if p.predicted is not None and predicted is not None:
            guess = getattr(p.predicted, predicted)
        rows.append(
            (
                label,
                format_seconds(getattr(p.step, measured)),
                f"{format_seconds(min(values))} - {format_seconds(max(values))}",
                _s(guess),
            )
        )
    where = f"predicted ({p.predicted.hardware})" if p.predicted else "predicted"
    columns: tuple[Column[tuple[str, str, str, str]], ...] = (
        Column("per step", lambda r: r[0], no_wrap=True),
        _figure("measured", lambda r: r[1]),
        _figure("spread", lambda r: r[2]),
        _figure(where, lambda r: r[3]),
    )
    caption = None
    if p.predicted is not None:
        caption = (
            f"predicted: the planner's step (compute, then communication); with all of it "
            f"hidden {format_seconds(p.predicted.step_overlap_s)}"
        )
    return rich_table(columns, rows, title="Step, a device's time averaged", caption=caption)


def coverage_line(p: Profile) -> str:
    """How much of the audit the join found, in one sentence."""
    total, found, whole = p.coverage
    line = (
        f"joined {p.events:,} events of {p.module} ({p.steps} steps x {p.devices} devices): "
        f"{found} of {total} collectives found, {whole} run as often as the audit counts"
    )
    if p.other_events:
        line += f"; {p.other_events:,} events of other programs left out"
    if p.joined_by == "names":
        line += (
            "; joined by the program's and its instructions' names alone, which is all a "
            "trace records of them (not their shapes, nor the mesh): the audit must be of "
            "the batch and mesh that ran"
        )
    if p.sessions > 1:
        line += (
            f"; read session {p.session}, the newest of the {p.sessions} under {p.trace} "
            f"(give a session's folder to read another)"
        )
    return line


def _main_table(p: Profile, by_scope: bool) -> Any:
    """The profile's first table: per collective, or per scope."""
    where = f"{p.program} on {format_mesh_spec(p.mesh_axes)} ({p.backend})"
    if by_scope:
        table = rich_table(SCOPE_COLUMNS, p.by_scope(), title=f"{where}: per step, by scope")
    else:
        title = f"{where}: each collective, one execution on a device"
        table = rich_table(COLLECTIVE_COLUMNS, p.collectives, title=title)
    if p.priced_on is None:
        audit = p.audit
        if audit is not None and audit.module is None:  # read from JSON: nothing to price
            how = (
                "an audit read from JSON holds no program to price: join the trace to the "
                "program, with a hardware preset (FILE.py:FUNCTION --mesh SPEC --hardware "
                "h100), to price it"
            )
        else:
            how = "give a hardware preset (--hardware h100, hardware='h100') to price on one"
        table.caption = (
            f"predicted: '-' where nothing is priced (the CPU backend has no hardware preset; "
            f"{how})"
        )
    return table


def profile_width(p: Profile, *, by_scope: bool = False) -> int:
    """The columns the profile's tables take unsqueezed (a pipe's or a log's width)."""
    return natural_width(_main_table(p, by_scope))


def render_profile(p: Profile, *, console: Any = None, by_scope: bool = False) -> None:
    """Prints the profile's tables: per collective (or per scope), the step, the coverage."""
    console = console or output_console(piped_width=profile_width(p, by_scope=by_scope))
    console.print(_main_table(p, by_scope))
    console.print(step_table(p))
    console.print(coverage_line(p), highlight=False, markup=False)


def format_profile(p: Profile, *, width: int = 160, by_scope: bool = False) -> str:
    """The rendered tables as plain text (no colour), e.g. for logs and tests."""
    from rich.console import Console

    buf = io.StringIO()
    render_profile(p, console=Console(file=buf, width=width, color_system=None), by_scope=by_scope)
    return buf.getvalue()


def step_figures_text(s: StepFigures) -> str:
    """``step 8.8 ms: compute 0.81 ms, communication 6.4 ms (6.4 ms exposed), idle 1.6 ms``."""
    return (
        f"step {format_seconds(s.step_s)}: compute {format_seconds(s.compute_s)}, "
        f"communication {format_seconds(s.comm_s)} ({format_seconds(s.exposed_s)} exposed), "
        f"idle {format_seconds(s.idle_s)}"
    )
