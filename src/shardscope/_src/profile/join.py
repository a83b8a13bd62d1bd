"""The join of a trace to the audit of the program it ran: every event of the program's HLO
module is one of its instructions, named as the audit names them.

* An event is the program's when its ``hlo_module`` is the audit's module; the others (other
  programs run while the trace was taken) are left out and counted.
* Each of the program's events must name an instruction of the audited module (when the
  audit holds its module; else every collective-looking one must be a collective of the
  audit): a trace of another compile of a program of the same name is refused.
* A collective's events are those of its instruction (for an asynchronous one, of its
  ``-start``, the instruction that launches the transfer; its ``-done``'s events are
  communication time too). A ``while``, ``conditional`` or ``call`` event only encloses the
  events of the computations it runs: it is neither compute nor communication. Every other
  event is compute.
* Steps are the program's runs: XLA:CPU tags each event with its run; otherwise each device's
  events are cut at each run of the instruction that starts the program.

Per device and step, the timeline's union gives the figures: compute time (the union of the
compute events, which may run at once), communication time (the union of the collectives'),
exposed communication (communication that no compute of the same device overlaps) and idle
time. A collective's exposed time is the part of its event outside the device's compute union.
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from shardscope._src.audit.records import Audit, Collective
from shardscope._src.base import comm
from shardscope._src.base.errors import ProfileError
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.profile.records import (
    MeasuredCollective,
    PredictedStep,
    Profile,
    Span,
    StepFigures,
    TimelineRow,
)
from shardscope._src.profile.trace import OpEvent, Trace

#: Instructions whose event encloses those of the computations they run.
CONTAINERS = frozenset({"while", "conditional", "call"})
_CONTAINER_NAME = re.compile(r"^(?:while|conditional|call)(?:\.\d+)?$")
_COLLECTIVE_NAME = re.compile(
    r"^(?:" + "|".join(re.escape(k) for k in comm.KINDS) + r")(?:-start|-done)?(?:\.\d+)?$"
)
_COMPUTE, _COMM, _CONTAINER = 0, 1, 2

Intervals = list[tuple[float, float]]


class _Union:
    """Disjoint sorted intervals, with how much of any stretch of time they cover."""

    def __init__(self, intervals: Iterable[tuple[float, float]]) -> None:
        merged: Intervals = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                if b > merged[-1][1]:
                    merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        self.intervals = merged
        self.starts = [a for a, _ in merged]
        self._before = [0.0, *accumulate(b - a for a, b in merged)]

    @property
    def length(self) -> float:
        return self._before[-1]

    def _upto(self, t: float) -> float:
        i = bisect_right(self.starts, t) - 1
        if i < 0:
            return 0.0
        a, b = self.intervals[i]
        return self._before[i] + min(b, t) - a

    def covered(self, a: float, b: float) -> float:
        """How much of ``[a, b]`` the intervals cover."""
        return self._upto(b) - self._upto(a)

    def outside(self, a: float, b: float) -> Intervals:
        """The stretches of ``[a, b]`` the intervals leave uncovered."""
        out = []
        i = max(bisect_right(self.starts, a) - 1, 0)
        t = a
        while i < len(self.intervals) and t < b:
            s, e = self.intervals[i]
            if e <= t:
                i += 1
                continue
            if s > t:
                out.append((t, min(s, b)))
            t = max(t, e)
            i += 1
        if t < b:
            out.append((t, b))
        return out


@dataclass
class _Measure:
    """What the events of one collective add up to."""

    durations: list[float] = field(default_factory=list)
    exposed: list[float] = field(default_factory=list)
    per_step: dict[int, list[float]] = field(default_factory=dict)  # step -> [time, exposed]


def collective_aliases(audit: Audit) -> tuple[dict[str, int], set[str]]:
    """``{instruction: collective's index}`` of the instructions whose events are a
    collective's runs (its own, the ``-start`` or ``async-start`` that launches it), and the
    ``-done`` instructions whose events are its waits."""
    runs: dict[str, int] = {}
    waits: set[str] = set()
    for i, c in enumerate(audit.collectives):
        runs[c.name] = i
        window = None if c.overlap is None else c.overlap.window
        if window is not None:
            runs.setdefault(window.start, i)
            waits.add(window.done)
    module = audit.module
    if module is not None:
        for comp in module.computations.values():
            for ins in comp.instructions:
                if ins.opcode == "async-start":
                    inner = {
                        x.name
                        for _, callee in ins.called_computations
                        for x in getattr(module.computations.get(callee), "instructions", ())
                    }
                    found = [runs[n] for n in inner if n in runs]
                    if found:
                        runs.setdefault(ins.name, found[0])
        for comp in module.computations.values():
            for ins in comp.instructions:
                if ins.opcode.endswith("-done") and ins.operands and ins.operands[0] in runs:
                    waits.add(ins.name)
    return runs, waits


def _read(trace: Trace) -> str:
    """``"; read session ..."`` where the trace's folder holds several sessions, else ``""``:
    said with an error, for the newest session may not be the one meant."""
    where = trace.where()
    return f"; {where}" if where else ""


def _kinds(trace: Trace, audit: Audit, ops: Iterable[str]) -> dict[str, int]:
    """Each instruction the program's events name as compute, communication or container;
    a :class:`ProfileError` for one that is not the audited program's."""
    runs, waits = collective_aliases(audit)
    module = audit.module
    opcodes: dict[str, str] | None = None
    if module is not None:
        opcodes = {
            ins.name: ins.opcode for c in module.computations.values() for ins in c.instructions
        }
    out: dict[str, int] = {}
    strangers = []
    for op in ops:
        if op in runs or op in waits:
            out[op] = _COMM
        elif opcodes is not None:
            if op not in opcodes:
                strangers.append(op)
            out[op] = _CONTAINER if opcodes.get(op) in CONTAINERS else _COMPUTE
        elif _COLLECTIVE_NAME.match(op):
            strangers.append(op)
        else:
            out[op] = _CONTAINER if _CONTAINER_NAME.match(op) else _COMPUTE
    if strangers:
        strangers.sort()
        shown = ", ".join(strangers[:4]) + (
            f" and {len(strangers) - 4} more" if len(strangers) > 4 else ""
        )
        what = "instructions" if opcodes is not None else "collectives"
        raise ProfileError(
            f"the trace's events of module {audit.module_name!r} name {len(strangers)} "
            f"{what} the audited program does not have ({shown}): it is a trace of another "
            f"program of that name, or of another compile of it; audit the program that ran "
            f"(the same JAX, flags and target){_read(trace)}"
        )
    return out


def _steps(events: Sequence[OpEvent]) -> list[list[OpEvent]]:
    """The program's runs: by the run each event names, else each device's events cut at
    each run of the instruction its first event ran (one step when they do not agree)."""
    if all(e.run is not None for e in events):
        by_run: dict[int | None, list[OpEvent]] = {}
        for e in events:
            by_run.setdefault(e.run, []).append(e)
        return sorted(by_run.values(), key=lambda es: min(e.start_s for e in es))
    per_device: dict[int, list[OpEvent]] = {}
    for e in sorted(events, key=lambda e: (e.start_s, -e.end_s)):
        per_device.setdefault(e.device, []).append(e)
    first = next(iter(per_device.values()))[0].op
    cuts = {d: [i for i, e in enumerate(es) if e.op == first] for d, es in per_device.items()}
    n = {len(c) for c in cuts.values()}
    if len(n) != 1 or any(c[0] != 0 for c in cuts.values()):
        return [list(events)]
    steps: list[list[OpEvent]] = [[] for _ in range(n.pop())]
    for d, es in per_device.items():
        bounds = [*cuts[d], len(es)]
        for k in range(len(steps)):
            steps[k] += es[bounds[k] : bounds[k + 1]]
    return steps


def join(
    trace: Trace,
    audit: Audit,
    *,
    program: str,
    predicted: PredictedStep | None = None,
    keep_trace: bool = True,
    joined_by: str = "names",
) -> Profile:
    """The :class:`Profile` of ``trace``'s runs of ``audit``'s program. ``joined_by``:
    ``"run"`` where ``trace`` is of the audited executable, run here; ``"names"`` where it was
    taken elsewhere, and only the names of the program and its instructions join the two.

    Raises:
        ProfileError: the trace holds no event of the audit's module, events of it that name
            instructions the audited program lacks (a trace of another program), or events on
            more devices than the audit's mesh has (a trace of another mesh).
    """
    modules = trace.modules()
    mine = [e for e in trace.events if e.module == audit.module_name]
    if not mine:
        found = ", ".join(f"{m!r} ({n} events)" for m, n in modules.most_common(5))
        raise ProfileError(
            f"the trace {trace.path!r} holds no event of program {audit.module_name!r} (the "
            f"audit's HLO module); it holds {found}: a trace of another program. Trace the "
            f"audited program, or audit the one traced{_read(trace)}"
        )
    devices = sorted({e.device for e in mine})
    # A program compiled for a mesh runs on its devices: a trace of it on more is of another
    # mesh. Fewer may be one host's file of several.
    mesh_devices = math.prod(audit.mesh_axes.values())
    if len(devices) > mesh_devices:
        raise ProfileError(
            f"the trace's events of program {audit.module_name!r} ran on {len(devices)} "
            f"devices, and the audited program's mesh {format_mesh_spec(audit.mesh_axes)} has "
            f"{mesh_devices}: a trace of the program on another mesh; audit it on the mesh "
            f"that ran{_read(trace)}"
        )
    kinds = _kinds(trace, audit, {e.op for e in mine})
    runs, _ = collective_aliases(audit)
    steps = _steps(mine)
    measures = [_Measure() for _ in audit.collectives]
    figures: list[StepFigures] = []
    rows_of_step: list[list[TimelineRow]] = []
    for k, events in enumerate(steps):
        t0 = min(e.start_s for e in events)
        span = max(e.end_s for e in events) - t0
        by_device: dict[int, list[OpEvent]] = {d: [] for d in devices}
        for e in events:
            by_device[e.device].append(e)
        sums = [0.0, 0.0, 0.0, 0.0]
        rows = []
        for d in devices:
            row, busy = _device_step(
                d, by_device[d], kinds, runs, audit.collectives, measures, k, t0
            )
            rows.append(row)
            for i, v in enumerate(busy):
                sums[i] += v
        n = len(devices)
        compute, communication, exposed, busy_all = (s / n for s in sums)
        figures.append(
            StepFigures(span, compute, communication, exposed, max(span - busy_all, 0.0))
        )
        rows_of_step.append(rows)
    middle = sorted(range(len(figures)), key=lambda i: figures[i].step_s)[(len(figures) - 1) // 2]
    rank = {c.name: k for k, c in enumerate(audit.sorted_collectives())}
    collectives = tuple(
        sorted(
            (
                _measured(c, m, len(steps), len(devices))
                for c, m in zip(audit.collectives, measures, strict=True)
            ),
            key=lambda m: rank[m.name],
        )
    )
    return Profile(
        program=program,
        module=audit.module_name,
        backend=audit.backend or ("cpu" if trace.source == "host" else "gpu"),
        mesh_axes=dict(audit.mesh_axes),
        devices=len(devices),
        steps=len(steps),
        collectives=collectives,
        per_step=tuple(figures),
        predicted=predicted,
        priced_on=audit.priced_on,
        timeline=tuple(rows_of_step[middle]),
        timeline_step=middle,
        events=len(mine),
        other_events=len(trace.events) - len(mine),
        trace=trace.path if keep_trace else None,
        joined_by=joined_by,
        session=trace.session or None,
        sessions=trace.sessions,
    ).with_audit(audit)


def _device_step(
    device: int,
    events: Sequence[OpEvent],
    kinds: Mapping[str, int],
    runs: Mapping[str, int],
    collectives: Sequence[Collective],
    measures: list[_Measure],
    step: int,
    t0: float,
) -> tuple[TimelineRow, tuple[float, float, float, float]]:
    """One device's row of one step, and its compute, communication, exposed and busy time;
    each collective's events measured into ``measures``."""
    compute = _Union((e.start_s, e.end_s) for e in events if kinds[e.op] == _COMPUTE)
    talking = [e for e in events if kinds[e.op] == _COMM]
    communication = _Union((e.start_s, e.end_s) for e in talking)
    spans = []
    for e in talking:
        i = runs.get(e.op)
        if i is None:  # a -done: communication time, not a run of its own
            continue
        duration = e.end_s - e.start_s
        exposed = duration - compute.covered(e.start_s, e.end_s)
        m = measures[i]
        m.durations.append(duration)
        m.exposed.append(exposed)
        acc = m.per_step.setdefault(step, [0.0, 0.0])
        acc[0] += duration
        acc[1] += exposed
        spans.append(Span(e.op, collectives[i].kind, e.start_s - t0, e.end_s - t0))
    open_parts = [
        (a - t0, b - t0) for s, e in communication.intervals for a, b in compute.outside(s, e)
    ]
    exposed_s = sum(b - a for a, b in open_parts)
    busy = compute.length + exposed_s
    row = TimelineRow(
        device,
        tuple((a - t0, b - t0) for a, b in compute.intervals),
        tuple(sorted(spans, key=lambda s: s.start_s)),
        tuple(open_parts),
    )
    return row, (compute.length, communication.length, exposed_s, busy)


def _measured(c: Collective, m: _Measure, steps: int, devices: int) -> MeasuredCollective:
    per_step = [m.per_step.get(k, [0.0, 0.0]) for k in range(steps)]
    has = bool(m.durations)
    scopes = tuple(dict.fromkeys(p.scope for p in c.parts))
    return MeasuredCollective(
        name=c.name,
        kind=c.kind,
        axes=c.axes_label,
        scope=c.scope,
        source=c.user_source or c.source,
        count=c.count,
        count_exact=c.count_exact,
        events=len(m.durations),
        executions=len(m.durations) / (steps * devices),
        time_s=statistics.median(m.durations) if has else None,
        time_min_s=min(m.durations) if has else None,
        time_max_s=max(m.durations) if has else None,
        exposed_s=statistics.median(m.exposed) if has else None,
        step_time_s=statistics.median(t / devices for t, _ in per_step),
        step_exposed_s=statistics.median(x / devices for _, x in per_step),
        predicted_s=None if c.overlap is None else c.overlap.comm_s,
        predicted_exposed_s=None if c.overlap is None else c.overlap.exposed_s,
        scopes=scopes if len(scopes) > 1 else (),
    )
