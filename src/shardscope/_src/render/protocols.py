"""What the planner's renderers read of a plan and of a sweep.

The built-in planner's :class:`~shardscope._src.train.types.Plan` and a user's program's
:class:`~shardscope._src.program.program.ProgramPlan` are drawn by the same columns, chart and
report sections; these protocols are the part of them those renderers rely on, so that a
record missing a field is caught by the type checker rather than at drawing time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from shardscope._src.base.notes import Note
    from shardscope._src.plan.collectives import AxisComm
    from shardscope._src.plan.types import Skipped
    from shardscope._src.targets.hardware import Hardware


class RankedPlan(Protocol):
    """One compiled plan as the ranked table, the chart and the report sections read it."""

    @property
    def rank(self) -> int: ...
    @property
    def pareto(self) -> bool: ...
    @property
    def label(self) -> str: ...
    @property
    def strategy(self) -> str: ...
    @property
    def mesh(self) -> Mapping[str, int]: ...
    @property
    def mesh_spec(self) -> str: ...
    @property
    def fits(self) -> bool: ...
    @property
    def memory_bytes_per_device(self) -> int: ...
    @property
    def fit_memory_bytes_per_device(self) -> int:
        """The memory its fit was judged by (a compiler's, or the estimate)."""
        ...

    @property
    def comm_bytes_per_device(self) -> int: ...
    @property
    def comm_time_s(self) -> float: ...
    @property
    def compute_time_s(self) -> float: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def comm(self) -> Sequence[AxisComm]: ...
    @property
    def notes(self) -> Sequence[Note]: ...


PlanT_co = TypeVar("PlanT_co", bound=RankedPlan, covariant=True)


class PlanSet(Protocol[PlanT_co]):
    """A sweep's plans, best first, with what was skipped, as the renderers read it."""

    @property
    def plans(self) -> Sequence[PlanT_co]: ...
    @property
    def skipped(self) -> Sequence[Skipped]: ...
    @property
    def best(self) -> PlanT_co | None: ...
    @property
    def fit_note(self) -> Note | None: ...
    @property
    def empty_reason(self) -> Note | None: ...
    @property
    def hardware(self) -> Hardware: ...
    @property
    def devices(self) -> int: ...
    @property
    def model(self) -> str: ...
    @property
    def mode(self) -> str: ...
