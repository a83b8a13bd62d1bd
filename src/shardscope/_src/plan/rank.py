"""How every planner orders its plans: one step price, one rank key and one Pareto front.

Every plan is priced by one step time, and says which source gave it (:class:`StepCost`):
the planner's estimate, or a compiled program (:class:`StepSource`), so that the ranking
and the renderers read the figure without asking which planner made it. Training plans, a
program's plans (and ``suggest``'s, which are those) and serving plans are ranked by
:func:`rank_key`: the plans that fit first, then by their merits in turn, the last of them
breaking ties so that the same plans always give the same order (:func:`step_rank_key` is
the step planners' merits). Each marks the plans no other beats on all of two merits
(:func:`pareto_front`): memory and step time for training and programs, time per output
token and throughput per chip (or time to first token) for serving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from shardscope._src.base.vocab import Vocab


class StepSource(Vocab):
    """What gave a plan's step time."""

    #: the planner's model of the step, nothing compiled for it (a training candidate's
    #: screen, ``suggest``'s screen, a serving plan's roofline)
    ESTIMATED = "estimated"
    #: a compiled program: its collectives, FLOPs or kernels priced (a training plan,
    #: ``suggest``'s proposal, a serving plan whose decode step was compiled)
    COMPILED = "compiled"


@runtime_checkable
class StepCost(Protocol):
    """A plan as priced: the step time it is ranked by (a training or program step; a
    serving plan's time per output token), and which source gave it. A plan that a compile
    replaced the estimate of keeps the estimate beside it (a training plan's
    ``estimated_time``, a serving plan's ``estimated``)."""

    @property
    def step_time_s(self) -> float: ...
    @property
    def step_source(self) -> StepSource: ...


class Fitting(Protocol):
    """A plan as a ranking reads it: whether it fits its devices."""

    @property
    def fits(self) -> bool: ...


class StepPlan(Fitting, StepCost, Protocol):
    """A training or program plan as :func:`step_rank_key` reads it."""

    @property
    def memory_bytes_per_device(self) -> int: ...
    @property
    def strategy(self) -> str: ...
    @property
    def mesh(self) -> Mapping[str, int]: ...


_F = TypeVar("_F", bound=Fitting)
_S = TypeVar("_S", bound=StepPlan)
_P = TypeVar("_P")


def rank_key(*merits: Callable[[_F], Any]) -> Callable[[_F], tuple[Any, ...]]:
    """The sort key of a ranking, best first: the plans that fit, then the lower on each of
    ``merits`` in turn.

    >>> from types import SimpleNamespace as Plan
    >>> plans = [Plan(fits=False, s=1.0), Plan(fits=True, s=3.0), Plan(fits=True, s=2.0)]
    >>> [p.s for p in sorted(plans, key=rank_key(lambda p: p.s))]
    [2.0, 3.0, 1.0]
    """

    def key(plan: _F) -> tuple[Any, ...]:
        return (not plan.fits, *(merit(plan) for merit in merits))

    return key


def step_rank_key(names: Sequence[str]) -> Callable[[_S], tuple[Any, ...]]:
    """A training or program plan's :func:`rank_key`: the step time, then the memory a
    device holds, then the order of its strategy (or rule set) in ``names``, then the mesh
    sizes (a total order: the same plans give the same ranking)."""
    merits: tuple[Callable[[_S], Any], ...] = (
        lambda p: p.step_time_s,
        lambda p: p.memory_bytes_per_device,
        lambda p: names.index(p.strategy),
        lambda p: tuple(p.mesh.values()),
    )
    return rank_key(*merits)


class _Fitting(Protocol):
    @property
    def fits(self) -> bool: ...
    @property
    def fit_memory_bytes_per_device(self) -> int: ...
    @property
    def step_time_s(self) -> float: ...


_Fit = TypeVar("_Fit", bound=_Fitting)


def memory_time_front(plans: Sequence[_Fit]) -> set[int]:
    """Indices of the plans that fit and that no other plan that fits beats on both the
    memory that decided the fit and the step time (:func:`pareto_front`): a plan a device
    cannot hold is on no front."""
    fitting = [i for i, p in enumerate(plans) if p.fits]
    front = pareto_front(
        [plans[i] for i in fitting],
        lambda p: p.fit_memory_bytes_per_device,
        lambda p: p.step_time_s,
    )
    return {fitting[j] for j in front}


def pareto_front(plans: Sequence[_P], *merits: Callable[[_P], float]) -> set[int]:
    """Indices of the plans no other plan beats on all ``merits`` (each the lower the
    better): none other is as good on every one and better on one.

    >>> sorted(pareto_front([(4, 1.0), (2, 2.0), (4, 2.0)], lambda p: p[0], lambda p: p[1]))
    [0, 1]
    """
    scores = [tuple(merit(p) for merit in merits) for p in plans]
    front = set()
    for i, mine in enumerate(scores):
        beaten = any(
            all(a <= b for a, b in zip(theirs, mine, strict=True)) and theirs != mine
            for j, theirs in enumerate(scores)
            if j != i
        )
        if not beaten:
            front.add(i)
    return front
