"""A plan's compiled collectives on the hardware: each priced by the one model of
:mod:`~shardscope._src.cost.links` (the same the screening estimate and the bound use),
and summed per (mesh axes, kind) beside the bound's bytes; and the time of the bound itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardscope._src.base.comm import KINDS, latency_steps
from shardscope._src.base.records import Record
from shardscope._src.bounds.terms import Bound
from shardscope._src.cost.links import (
    alpha_beta_seconds,
    collective_seconds,
    crosses_nodes,
    group_bandwidth,
)
from shardscope._src.targets.hardware import Hardware


@dataclass(frozen=True)
class PlanCollective(Record):
    """One compiled collective as the plan counts it.

    ``payload_bytes`` is at the model's dtype (see :mod:`shardscope._src.train.sweep`);
    ``cpu_payload_bytes`` what the CPU program moves. ``traffic_bytes`` is per device over all
    ``count`` executions.
    """

    kind: str
    axes: tuple[str, ...]
    group_size: int
    count: int
    count_exact: bool
    irregular: bool
    dtype: str
    payload_bytes: int
    cpu_payload_bytes: int
    traffic_bytes: int
    cpu_traffic_bytes: int
    op_name: str | None
    source: str | None

    @property
    def axes_label(self) -> str:
        return axes_label(self.axes, self.irregular)


def axes_label(axes: tuple[str, ...], irregular: bool = False) -> str:
    """``"dp,mp"``; ``"irregular"``; ``"-"`` for no axes (no data leaves a device)."""
    if irregular:
        return "irregular"
    return ",".join(axes) if axes else "-"


@dataclass(frozen=True)
class AxisComm(Record):
    """The collectives of one kind over one set of axes, summed, with their bound and time."""

    axes: str
    kind: str
    count: int
    traffic_bytes: int
    bound_bytes: int
    time_s: float
    crosses_nodes: bool


def _axes(c: PlanCollective) -> tuple[str, ...]:
    return () if c.irregular else c.axes


def collective_time(hw: Hardware, sizes: Mapping[str, int], c: PlanCollective) -> float:
    """Alpha-beta seconds of all ``count`` executions of a collective."""
    return collective_seconds(hw, sizes, c.kind, _axes(c), c.group_size, c.traffic_bytes, c.count)


def bound_time(hw: Hardware, sizes: Mapping[str, int], bound: Bound) -> float:
    """A lower bound on the seconds of ``bound``'s communication on a mesh of ``sizes``."""
    # Every byte of the bound at its group's bandwidth, and one collective's latency per
    # (axes, kind), since a compiler may merge the bound's terms (it does merge the
    # per-weight gradient all-reduces): each term priced without its latency, and its
    # latency without its bytes.
    total = 0.0
    latency: dict[tuple[tuple[str, ...], str], float] = {}
    for t in bound.terms:
        if t.traffic_bytes <= 0 or t.group_size <= 1:
            continue
        bandwidth = group_bandwidth(hw, sizes, t.axes)
        total += alpha_beta_seconds(0, hw.latency_s, t.traffic_bytes, bandwidth)
        steps = alpha_beta_seconds(latency_steps(t.kind, t.group_size), hw.latency_s, 0, bandwidth)
        latency[(t.axes, t.kind)] = max(latency.get((t.axes, t.kind), 0.0), steps)
    return total + sum(latency.values())


def axis_comm(
    hw: Hardware, sizes: Mapping[str, int], collectives: Sequence[PlanCollective], bound: Bound
) -> tuple[AxisComm, ...]:
    """The compiled ``collectives`` summed and timed per (mesh axes, kind), beside ``bound``'s
    bytes of the same axes and kind; rows in mesh-axis order, then by kind."""
    # A compiled group never varies over an axis of size 1, so neither is the bound's term
    # named by it (FSDP's gathers over 'data,expert' with data=1 are the compiled 'expert's).
    bound_by: dict[_Row, int] = {}
    for (axes, kind), b in bound.by_axes_kind().items():
        row = _Row(tuple(a for a in axes if sizes.get(a) != 1), False, kind)
        bound_by[row] = bound_by.get(row, 0) + b
    rows: dict[_Row, list[PlanCollective]] = {}
    for c in collectives:
        rows.setdefault(_Row(() if c.irregular else c.axes, c.irregular, c.kind), []).append(c)
    keys = set(rows) | set(bound_by)
    names = list(sizes)

    def order(row: _Row) -> tuple[Any, ...]:
        first = row.axes[0] if row.axes else None
        return (
            names.index(first) if first in names else len(names),
            row.label,
            KINDS.index(row.kind) if row.kind in KINDS else len(KINDS),
        )

    out = []
    for row in sorted(keys, key=order):
        group = rows.get(row, [])
        out.append(
            AxisComm(
                axes=row.label,
                kind=row.kind,
                count=sum(c.count for c in group),
                traffic_bytes=sum(c.traffic_bytes for c in group),
                bound_bytes=bound_by.get(row, 0),
                time_s=sum(collective_time(hw, sizes, c) for c in group),
                crosses_nodes=any(crosses_nodes(sizes, _axes(c), hw.node_size) for c in group)
                if group
                else crosses_nodes(sizes, row.axes, hw.node_size),
            )
        )
    return tuple(out)


class _Row(NamedTuple):
    """One row of :func:`axis_comm`: the mesh axes (labels of axes and sub-axes), whether the
    groups fit none, and the kind."""

    axes: tuple[str, ...]
    irregular: bool
    kind: str

    @property
    def label(self) -> str:
        return axes_label(self.axes, self.irregular)
