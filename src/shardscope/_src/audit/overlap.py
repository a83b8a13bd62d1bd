"""Which compute hides each asynchronous collective, as the compiler scheduled the program.

A scheduled module (``is_scheduled=true``: what ``compiled.as_text()`` prints) lists each
computation's instructions in the order the device runs them. An asynchronous collective is a
``*-start`` and its ``*-done``: the transfer runs while the instructions scheduled between the
two run, and the ``-done`` waits for what is left of it. So the compute between them is what
can hide the collective, and whatever of its time that compute does not cover is exposed:

    exposed = max(0, collective time - compute time scheduled inside its window)

Compute time is the roofline of each instruction in the window (:mod:`shardscope._src.hlo.cost`:
FLOPs of its matrix products at the achievable fraction of peak, bytes at the memory
bandwidth), a ``while`` loop inside the window counted with its trip count. A synchronous
collective hides behind nothing. Two collectives whose windows overlap share the same compute
(each is said to be hidden by it): the link they share is not modelled, which makes the
exposed time a lower bound where many transfers are in flight at once.

The collective time is the caller's (the audit prices each collective with the same model the
planner uses); this module finds the windows and prices the compute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from shardscope._src.audit.loops import derived_trip_count, known_trip_count
from shardscope._src.base import comm
from shardscope._src.hlo.cost import Cost, instruction_cost, total
from shardscope._src.hlo.parse import Computation, HloModule, Instruction

#: Instructions whose computations run as part of the schedule they sit in (a fusion's or a
#: reduction's computation does not: it is part of the one instruction).
_RUNS_SCHEDULED = frozenset({"while", "conditional", "call", "async-start"})


class Roofline(Protocol):
    """The device figures compute time is read from (a hardware preset has them)."""

    @property
    def peak_flops(self) -> float: ...
    @property
    def matmul_fraction(self) -> float: ...
    @property
    def hbm_bandwidth(self) -> float: ...


@dataclass(frozen=True)
class Window:
    """One asynchronous collective's window: its ``-start``, its ``-done`` and what the
    compiler scheduled between them."""

    start: str
    done: str
    computation: str
    compute: Cost
    instructions: int  # compute instructions scheduled inside
    collectives: int  # other collectives in flight inside the same window


@dataclass(frozen=True)
class Overlap:
    """A collective's time, and how much of it the compute scheduled alongside hides.

    ``hidden_s`` is the compute time inside its window, ``exposed_s`` what of the collective's
    own time is left over (all of it for a synchronous collective).
    """

    name: str
    computation: str
    is_async: bool
    comm_s: float
    hidden_s: float
    exposed_s: float
    window: Window | None = None


def _scheduled_callees(ins: Instruction) -> Iterator[str]:
    if ins.opcode in _RUNS_SCHEDULED:
        for _, name in ins.called_computations:
            yield name


def _trips(module: HloModule, comp: Computation, ins: Instruction) -> int:
    trips = known_trip_count(ins)
    if trips is None:
        trips = derived_trip_count(module, comp, ins)
    return 1 if trips is None else trips


def _runs_of(module: HloModule, comp: Computation, ins: Instruction, callee: str) -> int:
    if ins.opcode != "while":
        return 1
    trips = _trips(module, comp, ins)
    body = dict((attr, name) for attr, name in ins.called_computations).get("body")
    return trips if callee == body else trips + 1


def computation_cost(module: HloModule, name: str, _seen: frozenset[str] = frozenset()) -> Cost:
    """What one run of a scheduled computation computes and moves, loops counted with their
    trip counts (one trip where the count cannot be read), every branch of a conditional
    counted (an upper bound)."""
    comp = module.computations.get(name)
    if comp is None or name in _seen:
        return Cost()
    return total(_cost(module, comp, ins, _seen | {name}) for ins in comp.instructions)


def _cost(module: HloModule, comp: Computation, ins: Instruction, seen: frozenset[str]) -> Cost:
    out = instruction_cost(module, comp, ins)
    for callee in _scheduled_callees(ins):
        out += computation_cost(module, callee, seen) * _runs_of(module, comp, ins, callee)
    return out


def program_cost(module: HloModule) -> Cost:
    """What one run of the whole program computes and moves, per device."""
    return computation_cost(module, module.entry_name)


def _done_of(comp: Computation, start: Instruction) -> tuple[int, Instruction] | None:
    """The ``-done`` that ends ``start``'s transfer (through any ``-update``), with its
    position in the schedule."""
    names = {start.name}
    for i, ins in enumerate(comp.instructions):
        if not ins.operands or ins.operands[0] not in names:
            continue
        if ins.opcode.endswith("-update"):
            names.add(ins.name)
        elif ins.opcode.endswith("-done"):
            return i, ins
    return None


def _is_collective(ins: Instruction) -> bool:
    base = ins.opcode.removesuffix("-start").removesuffix("-done")
    return base in comm.KINDS


def windows(module: HloModule) -> dict[str, Window]:
    """Each asynchronous collective's window, keyed by its ``-start``'s name."""
    out: dict[str, Window] = {}
    for comp in module.computations.values():
        position = {ins.name: i for i, ins in enumerate(comp.instructions)}
        for ins in comp.instructions:
            if not ins.opcode.endswith("-start") or ins.opcode == "copy-start":
                continue
            found = _done_of(comp, ins)
            if found is None:
                continue
            end, done = found
            inside = comp.instructions[position[ins.name] + 1 : end]
            costs = [_cost(module, comp, i, frozenset({comp.name})) for i in inside]
            busy = [c for c in costs if c.flops or c.bytes]
            out[ins.name] = Window(
                ins.name,
                done.name,
                comp.name,
                total(costs),
                len(busy),
                sum(1 for i in inside if _is_collective(i) and i.opcode.endswith("-start")),
            )
    return out


def compute_seconds(cost: Cost, device: Roofline) -> float:
    """The roofline time of ``cost`` on ``device``."""
    return cost.seconds(device.peak_flops * device.matmul_fraction, device.hbm_bandwidth)


def overlaps(
    module: HloModule,
    collectives: Mapping[str, tuple[str, bool]],
    comm_seconds: Callable[[str], float],
    device: Roofline,
) -> list[Overlap]:
    """How much of each collective the compute beside it hides.

    ``collectives`` maps each collective's instruction name (a ``-start`` for an asynchronous
    one) to its computation and whether it is asynchronous; ``comm_seconds(name)`` is its
    time by the communication model.
    """
    found = windows(module)
    out = []
    for name, (computation, is_async) in collectives.items():
        seconds = comm_seconds(name)
        window = found.get(name) if is_async else None
        hidden = compute_seconds(window.compute, device) if window is not None else 0.0
        exposed = max(0.0, seconds - hidden)
        out.append(Overlap(name, computation, is_async, seconds, hidden, exposed, window))
    return out
