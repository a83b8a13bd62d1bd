"""What a profile measured, beside what the audit and the planner predicted: plain records.

Times are seconds. "Per execution" is one run of one collective instruction on one device; "per
step" is one run of the whole program, a device's share averaged over the devices. Figures
over several steps are medians, with the spread (smallest and largest) beside them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from shardscope._src.base.records import Record, field_of, record_dict

if TYPE_CHECKING:
    from shardscope._src.audit.records import Audit


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _pairs(value: Any) -> tuple[tuple[float, float], ...]:
    return tuple((float(a), float(b)) for a, b in value)


@dataclass(frozen=True)
class StepFigures(Record):
    """One step of the program, measured: its time (the first instruction's start to the last
    one's end, over all devices) and how a device spent it, averaged over the devices.

    ``compute_s``: time some compute instruction ran (their union: two at once count once);
    ``comm_s``: time some collective ran; ``exposed_s``: collective time no compute on the
    same device overlaps; ``idle_s``: neither ran (``step_s`` = compute + comm - overlap +
    idle, on each device)."""

    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    idle_s: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepFigures:
        return cls(*(float(field_of(data, f.name, "a step's figures")) for f in fields(cls)))

    @staticmethod
    def median(steps: Sequence[StepFigures]) -> StepFigures:
        """Each figure's median over ``steps``."""
        return StepFigures(
            *(statistics.median(getattr(s, f.name) for s in steps) for f in fields(StepFigures))
        )


@dataclass(frozen=True)
class PredictedStep(Record):
    """The planner's figures for the same program on ``hardware`` (what
    :func:`shardscope.plan_program` gives its plan): compute at the matmul rate, the
    collectives priced per axis; ``exposed_s`` what of the collectives the audit's schedule
    leaves unhidden (None: the audit was not priced). ``step_s`` is the planner's step (the
    two one after the other), ``step_overlap_s`` its bound with all communication hidden."""

    hardware: str
    compute_s: float
    comm_s: float
    exposed_s: float | None
    step_s: float
    step_overlap_s: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PredictedStep:
        what = "a predicted step"
        return cls(
            hardware=str(field_of(data, "hardware", what)),
            compute_s=float(field_of(data, "compute_s", what)),
            comm_s=float(field_of(data, "comm_s", what)),
            exposed_s=_opt_float(data.get("exposed_s")),
            step_s=float(field_of(data, "step_s", what)),
            step_overlap_s=float(field_of(data, "step_overlap_s", what)),
        )


@dataclass(frozen=True)
class MeasuredCollective(Record):
    """One collective of the audit and what the trace measured of it.

    Attributes:
        name, kind, axes, scope, source, count, count_exact: the audit's (``axes`` its label,
            ``source`` the user's line; ``count`` executions per step, loop trips counted).
        events: the trace's events of it: one per execution on each device, over all steps.
        executions: events per step per device (``count`` when the join is whole).
        time_s, time_min_s, time_max_s: one execution's duration on a device: the median
            over every execution the trace holds, and the spread.
        exposed_s: the median execution's time that no compute on its device overlapped.
        step_time_s, step_exposed_s: its time in one step (all its executions), a device's
            averaged over the devices: the median over the steps.
        predicted_s, predicted_exposed_s: one execution by the audit's pricing, and what of
            it the compute scheduled beside it does not hide (None: not priced).
        scopes: the scopes of the arrays it carries, where it combines arrays of several
            (two layers' gradients reduced in one all-reduce); empty otherwise (``scope``).
    """

    name: str
    kind: str
    axes: str
    scope: str
    source: str | None
    count: int
    count_exact: bool
    events: int
    executions: float
    time_s: float | None
    time_min_s: float | None
    time_max_s: float | None
    exposed_s: float | None
    step_time_s: float
    step_exposed_s: float
    predicted_s: float | None = None
    predicted_exposed_s: float | None = None
    scopes: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        """Whether the trace ran it at all."""
        return self.events > 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredCollective:
        what = f"measured collective {data.get('name', '?')!r}" if isinstance(data, Mapping) else ""

        def need(key: str) -> Any:
            return field_of(data, key, what or "a measured collective")

        source = data.get("source")
        return cls(
            name=str(need("name")),
            kind=str(need("kind")),
            axes=str(need("axes")),
            scope=str(need("scope")),
            source=None if source is None else str(source),
            count=int(need("count")),
            count_exact=bool(need("count_exact")),
            events=int(need("events")),
            executions=float(need("executions")),
            time_s=_opt_float(need("time_s")),
            time_min_s=_opt_float(need("time_min_s")),
            time_max_s=_opt_float(need("time_max_s")),
            exposed_s=_opt_float(need("exposed_s")),
            step_time_s=float(need("step_time_s")),
            step_exposed_s=float(need("step_exposed_s")),
            predicted_s=_opt_float(data.get("predicted_s")),
            predicted_exposed_s=_opt_float(data.get("predicted_exposed_s")),
            scopes=tuple(str(x) for x in data.get("scopes", ())),
        )


@dataclass(frozen=True)
class ScopeRow(Record):
    """The collectives of one scope over one set of axes with one kind, per step: measured
    beside predicted (None: the audit was not priced). A collective that combines arrays of
    several scopes is a row of its own, ``scopes`` naming them (``scope`` theirs in common):
    one execution carries them all, and its measured time cannot be split between them,
    where the audit's ``by_scope`` splits its bytes by array."""

    scope: str
    axes: str
    kind: str
    count: int
    time_s: float
    exposed_s: float
    predicted_s: float | None
    predicted_exposed_s: float | None
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Span(Record):
    """A collective's run on one device in the timeline's step, from the step's start."""

    name: str
    kind: str
    start_s: float
    end_s: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Span:
        what = "a timeline span"
        return cls(
            str(field_of(data, "name", what)),
            str(field_of(data, "kind", what)),
            float(field_of(data, "start_s", what)),
            float(field_of(data, "end_s", what)),
        )


@dataclass(frozen=True)
class TimelineRow(Record):
    """One device's step: when compute ran (the union of its instructions), its collectives,
    and the stretches of them no compute overlapped (exposed); seconds from the step's start."""

    device: int
    compute: tuple[tuple[float, float], ...]
    collectives: tuple[Span, ...]
    exposed: tuple[tuple[float, float], ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimelineRow:
        what = "a timeline row"
        return cls(
            int(field_of(data, "device", what)),
            _pairs(field_of(data, "compute", what)),
            tuple(Span.from_dict(s) for s in field_of(data, "collectives", what)),
            _pairs(field_of(data, "exposed", what)),
        )


@dataclass(frozen=True)
class Profile:
    """A program's measured run joined to its audit.

    Attributes:
        program: what was profiled (a function's or file's name).
        module: the HLO module the trace's events were joined by.
        backend: the platform it ran on (``"cpu"``, ``"gpu"``, ``"tpu"``).
        mesh_axes: the audit's mesh.
        devices, steps: the devices and program runs the trace holds.
        collectives: every collective of the audit with what was measured of it.
        per_step: each step's figures, in the order they ran.
        predicted: the planner's figures for the program (None: no hardware to price on).
        priced_on: the hardware the per-collective predictions are priced on (None: none).
        timeline: each device's row of the step the PNG draws (``timeline_step``: its
            index in ``per_step``, the step of median time).
        events: instruction events of the program joined; ``other_events`` those of other
            programs in the trace, left out.
        trace: the trace it was read from (None: a temporary one, removed).
        joined_by: ``"run"`` where the program was run here and traced (the executable the
            audit compiled); ``"names"`` where a trace taken elsewhere was joined to an
            audit by its program's and instructions' names, which is all a trace records of
            them: not their shapes, nor the mesh.
        session, sessions: the profiling session read (its folder's name) and how many the
            trace's folder holds (the newest is read).
    """

    program: str
    module: str
    backend: str
    mesh_axes: Mapping[str, int]
    devices: int
    steps: int
    collectives: tuple[MeasuredCollective, ...]
    per_step: tuple[StepFigures, ...]
    predicted: PredictedStep | None
    priced_on: str | None
    timeline: tuple[TimelineRow, ...]
    timeline_step: int
    events: int
    other_events: int
    trace: str | None = None
    joined_by: str = "run"
    session: str | None = None
    sessions: int = 1

    def with_audit(self, audit: Audit) -> Profile:
        """This profile, holding the ``audit`` it was joined to (returns ``self``)."""
        object.__setattr__(self, "_audit", audit)
        return self

    @property
    def audit(self) -> Audit | None:
        """The audit it was joined to (None for a profile read from JSON or unpickled)."""
        found: Audit | None = self.__dict__.get("_audit")
        return found

    def __getstate__(self) -> dict[str, Any]:
        # The audit holds a Compiled, which cannot be pickled; the record is its fields.
        return {k: v for k, v in self.__dict__.items() if k != "_audit"}

    @property
    def step(self) -> StepFigures:
        """The median step's figures."""
        return StepFigures.median(self.per_step)

    @property
    def coverage(self) -> tuple[int, int, int]:
        """``(collectives in the audit, found in the trace, run as often as the audit
        counts)``: the join is whole when the three are equal."""
        found = [c for c in self.collectives if c.found]
        whole = [c for c in found if c.events == c.count * self.steps * self.devices]
        return len(self.collectives), len(found), len(whole)

    def by_scope(self) -> tuple[ScopeRow, ...]:
        """Per step, per scope, axes and kind: measured beside predicted."""
        rows: dict[tuple[str, tuple[str, ...], str, str], list[Any]] = {}
        for c in self.collectives:
            key = (c.scope, c.scopes, c.axes, c.kind)
            row = rows.setdefault(key, [0, 0.0, 0.0, 0.0, 0.0, True])
            row[0] += c.count
            row[1] += c.step_time_s
            row[2] += c.step_exposed_s
            if c.predicted_s is None or c.predicted_exposed_s is None:
                row[5] = False
            else:
                row[3] += c.predicted_s * c.count
                row[4] += c.predicted_exposed_s * c.count
        out = []
        # stable: the audit's axes and kind order; a combined collective's row after its
        # scope's own
        for key in sorted(rows, key=lambda k: (k[0], k[1])):
            scope, scopes, axes, kind = key
            count, time_s, exposed_s, predicted_s, predicted_exposed_s, priced = rows[key]
            out.append(
                ScopeRow(
                    scope,
                    axes,
                    kind,
                    count,
                    time_s,
                    exposed_s,
                    predicted_s if priced else None,
                    predicted_exposed_s if priced else None,
                    scopes,
                )
            )
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data (:meth:`from_dict` reads it back)."""
        return record_dict(self, extra=("step", "coverage", "by_scope"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """The profile :meth:`to_dict` wrote (what ``shardscope profile --json`` writes,
        whose header and sums it reads past).

        Raises:
            RecordError: ``data`` lacks a field of a profile or holds one of another type.
        """

        def need(key: str) -> Any:
            return field_of(data, key, "a profile")

        predicted = data.get("predicted")
        priced = data.get("priced_on")
        trace = data.get("trace")
        return cls(
            program=str(need("program")),
            module=str(need("module")),
            backend=str(need("backend")),
            mesh_axes={str(k): int(v) for k, v in need("mesh_axes").items()},
            devices=int(need("devices")),
            steps=int(need("steps")),
            collectives=tuple(MeasuredCollective.from_dict(c) for c in need("collectives")),
            per_step=tuple(StepFigures.from_dict(s) for s in need("per_step")),
            predicted=None if predicted is None else PredictedStep.from_dict(predicted),
            priced_on=None if priced is None else str(priced),
            timeline=tuple(TimelineRow.from_dict(r) for r in need("timeline")),
            timeline_step=int(need("timeline_step")),
            events=int(need("events")),
            other_events=int(need("other_events")),
            trace=None if trace is None else str(trace),
            joined_by=str(data.get("joined_by", "run")),
            session=None if data.get("session") is None else str(data["session"]),
            sessions=int(data.get("sessions", 1)),
        )
