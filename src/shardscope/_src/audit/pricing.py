"""An audit's collectives priced on a target's hardware, with what the schedule hides.

Each collective's one execution costs what :func:`~shardscope._src.cost.links.
collective_seconds` charges its bytes on the links its group uses (the planner's pricing);
an asynchronous one is hidden by the compute the compiler scheduled in its window, priced by
the roofline of the same hardware, less the multiprocessors it holds on a GPU
(:mod:`~shardscope._src.audit.overlap`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from shardscope._src.audit.overlap import overlaps
from shardscope._src.audit.records import Collective
from shardscope._src.cost.links import collective_seconds, held_share
from shardscope._src.hlo.parse import HloModule
from shardscope._src.targets.hardware import Hardware


def execution_seconds(c: Collective, mesh_axes: Mapping[str, int], hw: Hardware) -> float:
    """One execution of ``c`` on ``hw``'s links (an irregular group at the worst case)."""
    axes = () if c.irregular else c.axes
    return collective_seconds(hw, mesh_axes, c.kind, axes, c.group_size, c.traffic_bytes)


def priced(
    collectives: tuple[Collective, ...],
    module: HloModule,
    mesh_axes: Mapping[str, int],
    hw: Hardware,
) -> tuple[Collective, ...]:
    """``collectives``, each with its :attr:`~Collective.overlap` on ``hw``."""
    found = overlaps(
        module,
        {c.name: (execution_seconds(c, mesh_axes, hw), c.is_async) for c in collectives},
        hw,
        {c.name: held_share(hw, mesh_axes, () if c.irregular else c.axes) for c in collectives},
    )
    return tuple(replace(c, overlap=found[c.name]) for c in collectives)
