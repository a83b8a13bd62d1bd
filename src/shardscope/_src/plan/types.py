"""What every planner's records share: a skipped candidate and why, the notes of no plan and no fit,
and the JSON keys of a compiled plan.

Plain frozen dataclasses with ``to_dict()``; every renderer (table, JSON, Markdown, PNG) reads
these and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shardscope._src.base.notes import Note
from shardscope._src.base.records import Record
from shardscope._src.plan.notes import NoFitValues, NoPlanValues, PlanNote
from shardscope._src.targets.hardware import Hardware

#: The knobs a plan that does not fit can turn: the library's parameter names.
FIT_PARAMS = ("devices", "batch", "seq", "memory_bytes")


class SkipReason(StrEnum):
    """Why a candidate was not compiled."""

    #: a sharded dimension does not divide over its mesh axes
    DIVISIBILITY = "divisibility"
    #: the model state alone does not fit the device memory
    MEMORY = "memory"
    #: the compile itself failed (``Skipped.message`` has the error)
    ERROR = "error"
    #: its shardings do not type-check on the mesh's Explicit axes (code written for Auto
    #: axes; ``Skipped.message`` has JAX's words)
    TYPE_CHECK = "type-check"
    #: its program (one pipeline stage's) needs more simulated devices than one process has
    SIMULATION = "simulation"
    #: the cluster lost it: its worker died on every try, so it was not compiled
    LOST = "lost"
    #: its step cannot beat the best plan compiled (the least it can take is slower)
    SLOWER = "slower"


@dataclass(frozen=True)
class Skipped(Record):
    """A candidate that was not compiled: ``reason`` says why, ``message`` the details."""

    strategy: str
    mesh: str
    reason: SkipReason
    message: str


@dataclass(frozen=True)
class ProgramFacts:
    """A worker's answer to a :class:`~shardscope._src.program.program.ProgramTask`: the plan (a
    ``ProgramPlan``) and its program's fingerprint, or why the candidate was skipped."""

    plan: Any = None
    fingerprint: str = ""
    skipped: Skipped | None = None


#: A compiled plan's JSON (the model's and a user's program's alike): the keys that differ
#: from its attributes' names, and the properties it adds to its fields.
PLAN_KEYS = {
    "mesh": "mesh_shape",
    "mesh_spec": "mesh",
}


#: The keys that held a plan's step times before schema version 3.
OLD_STEP_KEYS = {"step_time_s": "est_step_time_s", "step_time_overlap_s": "est_step_time_overlap_s"}


def plan_step_time(plan: Mapping[str, Any], key: str = "step_time_s") -> float:
    """A plan's step time (or ``key``, ``"step_time_overlap_s"``) from its JSON, as any
    schema version wrote it (before version 3: ``est_step_time_s``).

    >>> plan_step_time({"est_step_time_s": 2.5}), plan_step_time({"step_time_s": 2.0})
    (2.5, 2.0)
    """
    if key in plan:
        return float(plan[key])
    return float(plan[OLD_STEP_KEYS[key]])


PLAN_EXTRA = (
    "mesh_spec",
    "memory_bytes_per_device",
    "fits",
    "comm_bytes_per_device",
    "cpu_comm_bytes_per_device",
    "step_time_s",
    "step_time_overlap_s",
)


def no_fit_note(
    label: str,
    need: int,
    have: int,
    hardware: str,
    searched: bool = True,
    pinned: Mapping[str, str] | None = None,
) -> Note:
    """The no-fit note of the closest plan; ``pinned``: the request's choices that narrowed
    the search, ``{param: words}`` (the note names them and their flags)."""
    pinned = dict(pinned or {})
    values = NoFitValues(
        label=label,
        need=need,
        have=have,
        hardware=hardware,
        searched=searched,
        pinned=tuple(pinned.values()),
        pinned_params=tuple(pinned),
    )
    return Note(PlanNote.NO_FIT, values, (*pinned, *FIT_PARAMS))


def skipped_by_reason(skipped: Sequence[Skipped]) -> dict[SkipReason, list[Skipped]]:
    """The skipped candidates grouped by their reason, the reasons in the order they first
    appear, each group in its candidates' order.

    >>> a, b = Skipped("tp", "model=64", SkipReason.DIVISIBILITY, ""), Skipped(
    ...     "dp", "data=64", SkipReason.MEMORY, "")
    >>> {str(r): [s.strategy for s in g] for r, g in skipped_by_reason([a, b, a]).items()}
    {'divisibility': ['tp', 'tp'], 'memory': ['dp']}
    """
    by: dict[SkipReason, list[Skipped]] = {}
    for s in skipped:
        by.setdefault(SkipReason(s.reason), []).append(s)
    return by


def no_plan_note(
    what: str,
    devices: int,
    skipped: Sequence[Skipped],
    hardware: Hardware | None = None,
    least_devices: int | None = None,
    least_devices_offloaded: int | None = None,
) -> Note:
    """Why a sweep of ``what`` on ``devices`` has no plan: what was skipped, for which
    reasons, one example, and (with ``hardware``) the memory the model state outgrew, with
    the fewest devices that hold it (``least_devices``, where known) and, where the request
    kept the optimizer state on the device, the fewest that hold it with the optimizer state
    on the host (``least_devices_offloaded``: named where these ``devices`` would)."""
    by = skipped_by_reason(skipped)
    counts = {str(reason): len(v) for reason, v in by.items()}
    limit = name = least = offloaded = None
    params: tuple[str, ...] = ()
    if hardware is not None and SkipReason.MEMORY in by:
        limit, name = int(hardware.memory_bytes), hardware.name
        params = ("devices", "hardware", "memory_bytes", "bytes_per_param")
        least = least_devices if least_devices is not None and least_devices > devices else None
        if least_devices_offloaded is not None and least_devices_offloaded <= devices:
            offloaded = least_devices_offloaded
            params = ("offload_optimizer", *params)
    example = by.get(SkipReason.DIVISIBILITY) or by.get(SkipReason.ERROR)
    if example is None and limit is None:
        example = list(skipped)
    first = f"{example[0].strategy} {example[0].mesh}: {example[0].message}" if example else None
    values = NoPlanValues(
        what=what,
        devices=devices,
        skipped=counts,
        limit=limit,
        hardware=name,
        example=first,
        least_devices=least,
        least_devices_offloaded=offloaded,
    )
    return Note(PlanNote.NO_PLAN, values, params)
