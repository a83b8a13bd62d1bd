"""Which compute hides each asynchronous collective, as the compiler scheduled the program.

A scheduled module (``is_scheduled=true``: what ``compiled.as_text()`` prints) lists each
computation's instructions in the order the device runs them. An asynchronous collective is a
``*-start`` and its ``*-done``: the transfer runs while the instructions scheduled between the
two run, and the ``-done`` waits for what is left of it. So the compute between them is what
can hide the collective, and whatever of its time that compute does not cover is exposed,
or, where it is less, the compute the collective takes from the window (on a GPU a
collective holds some of the multiprocessors while it runs, and the compute beside it goes
at the rest of its rate: :func:`~shardscope._src.cost.compute.overlap_seconds`, the
training step's rule too):

    exposed = max(collective time - compute time scheduled inside its window,
                  collective time x its share of the multiprocessors)

Compute time is the roofline of what the window's instructions compute and move
(:func:`~shardscope._src.cost.compute.roofline_seconds` of their counts from
:mod:`shardscope._src.hlo.cost`: FLOPs of matrix products at the achievable fraction of peak,
bytes at the memory bandwidth), a ``while`` loop inside the window counted with its trip
count. A synchronous collective hides behind nothing. Two collectives whose windows overlap
share the same compute (each is said to be hidden by it): the link they share is not
modelled, which makes the exposed time a lower bound where many transfers are in flight at
once.

The collective time is the caller's (the audit prices each collective with the same model the
planner uses); this module finds the windows and prices the compute.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardscope._src.audit.loops import derived_trip_count, known_trip_count
from shardscope._src.base import comm
from shardscope._src.base.records import Record, field_of, record_dict
from shardscope._src.cost.compute import Roofline, overlap_seconds, roofline_seconds
from shardscope._src.hlo.cost import (
    FREE,
    Cost,
    CostCounter,
    fusible,
    operand_reads,
    result_bytes,
    total,
)
from shardscope._src.hlo.parse import Computation, HloModule, Instruction

#: Instructions whose computations run as part of the schedule they sit in (a fusion's or a
#: reduction's computation does not: it is part of the one instruction).
_RUNS_SCHEDULED = frozenset({"while", "conditional", "call", "async-start"})


@dataclass(frozen=True)
class Window(Record):
    """One asynchronous collective's window: its ``-start``, its ``-done`` and what the
    compiler scheduled between them (``compute``: per run of the window)."""

    start: str
    done: str
    computation: str
    compute: Cost
    instructions: int  # compute instructions scheduled inside
    collectives: int  # other collectives in flight inside the same window

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, omit=("compute",)),
            "flops": self.compute.flops,
            "bytes": self.compute.bytes,
            "matmul_bytes": self.compute.matmul_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        what = "an overlap window"
        return cls(
            start=str(field_of(data, "start", what)),
            done=str(field_of(data, "done", what)),
            computation=str(field_of(data, "computation", what)),
            compute=Cost(
                int(field_of(data, "flops", what)),
                int(field_of(data, "bytes", what)),
                int(data.get("matmul_bytes", 0)),  # absent from records before it was kept
            ),
            instructions=int(field_of(data, "instructions", what)),
            collectives=int(field_of(data, "collectives", what)),
        )


@dataclass(frozen=True)
class Overlap(Record):
    """One execution of a collective (the :class:`Collective` that holds it): its time, and
    how much of it the compute scheduled alongside hides.

    ``exposed_s`` is what the collective adds to the step: what of its time the compute
    inside its window does not cover (all of it for a synchronous collective), or the
    compute it takes from the window, whichever is more
    (:func:`~shardscope._src.cost.compute.overlap_seconds`); ``hidden_s`` the rest of its
    time.
    """

    is_async: bool
    comm_s: float
    hidden_s: float
    exposed_s: float
    window: Window | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Overlap:
        what = "a collective's overlap"
        window = data.get("window")
        return cls(
            is_async=bool(field_of(data, "is_async", what)),
            comm_s=float(field_of(data, "comm_s", what)),
            hidden_s=float(field_of(data, "hidden_s", what)),
            exposed_s=float(field_of(data, "exposed_s", what)),
            window=None if window is None else Window.from_dict(window),
        )


@dataclass(frozen=True)
class Exposure(Record):
    """Communication seconds per program run, and how much of them compute hides."""

    comm_s: float
    hidden_s: float
    exposed_s: float

    def __add__(self, other: Exposure) -> Exposure:
        return Exposure(
            self.comm_s + other.comm_s,
            self.hidden_s + other.hidden_s,
            self.exposed_s + other.exposed_s,
        )

    def scaled(self, share: float) -> Exposure:
        """``share`` of each of these seconds."""
        return Exposure(self.comm_s * share, self.hidden_s * share, self.exposed_s * share)

    @staticmethod
    def of(overlap: Overlap, count: int) -> Exposure:
        """``count`` executions of ``overlap``'s collective."""
        return Exposure(overlap.comm_s * count, overlap.hidden_s * count, overlap.exposed_s * count)


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


class Kernel(NamedTuple):
    """What one kernel computes and moves a run, and whether it is a fused scope's
    (:func:`kernel_costs`)."""

    cost: Cost
    fused: bool = False


class _Walk:
    """Costs of one module's scheduled computations, each computed once; ``scope``: a
    named scope whose instructions run as one kernel (:func:`kernel_costs`)."""

    def __init__(self, module: HloModule, scope: str | None = None, widened: bool = False) -> None:
        self.module = module
        self.counter = CostCounter(module, widened=widened)
        self.scope = scope
        self._runs: dict[str, Cost] = {}
        self._kernels: dict[str, dict[Kernel, int]] = {}

    def computation(self, name: str, seen: frozenset[str] = frozenset()) -> Cost:
        if name in self._runs:
            return self._runs[name]
        comp = self.module.computations.get(name)
        if comp is None or name in seen:
            return Cost()
        got = total(self.instruction(comp, ins, seen | {name}) for ins in comp.instructions)
        self._runs[name] = got
        return got

    def instruction(self, comp: Computation, ins: Instruction, seen: frozenset[str]) -> Cost:
        out = self.counter.instruction(comp, ins)
        for callee in _scheduled_callees(ins):
            runs = _runs_of(self.module, comp, ins, callee)
            out += self.computation(callee, seen) * runs
        return out

    def kernels(self, name: str, seen: frozenset[str] = frozenset()) -> dict[Kernel, int]:
        """The kernels of one run of ``name`` (those of the computations it runs
        included) by what each costs a run: how many run at that cost, counted as often as
        they run; the scope's instructions as the fused kernels of :meth:`_fused`."""
        if name in self._kernels:
            return self._kernels[name]
        comp = self.module.computations.get(name)
        if comp is None or name in seen:
            return {}
        out: dict[Kernel, int] = {}

        def add(kernel: Kernel, n: int = 1) -> None:
            out[kernel] = out.get(kernel, 0) + n

        inside, used = self._scope(comp)
        for cost in self._fused(comp, inside, used):
            add(Kernel(cost, fused=True))
        for ins in comp.instructions:
            if ins.name in inside:
                continue
            cost = self.counter.instruction(comp, ins)
            if cost.flops or cost.bytes:
                add(Kernel(cost))
            for callee in _scheduled_callees(ins):
                runs = _runs_of(self.module, comp, ins, callee)
                for inner, n in self.kernels(callee, seen | {name}).items():
                    add(inner, n * runs)
        self._kernels[name] = out
        return out

    def _scope(self, comp: Computation) -> tuple[set[str], set[str]]:
        """The instructions of ``comp`` in the scope, and those of them whose results are
        used outside it (the computation's result included). In it: the
        :func:`~shardscope._src.hlo.cost.fusible` ones whose JAX op name has it as a
        segment; one that only renames another's result (a bitcast, a tuple's element)
        where that is in it; and those the compiler made without an op name (a softmax's
        reductions) that read from it, directly or through one another, and whose results
        only it and they use."""
        if self.scope is None:
            return set(), set()
        mark = f"/{self.scope}/"
        inside: set[str] = set()
        nameless = []
        for ins in comp.instructions:
            if ins.opcode in FREE or not fusible(self.module, ins):
                continue
            op_name = ins.metadata.op_name
            if op_name is None:
                nameless.append(ins)
            elif mark in f"/{op_name}/":
                inside.add(ins.name)
        users: dict[str, list[str]] = {}
        for ins in comp.instructions:
            for op in ins.operands:
                users.setdefault(op, []).append(ins.name)
        renames = [i for i in comp.instructions if i.opcode in FREE and len(i.operands) == 1]
        root = comp.root
        # The nameless ones come in chains (a softmax's maximum, then its sum, each reading
        # the scores and the one before): every nameless instruction or rename that reads,
        # through others of them, from the scope is a candidate, and candidates are struck
        # off while any has a result used outside the scope and the candidates left (the
        # greatest such set: a chain joins whole or not at all).
        candidates: set[str] = set()
        grown = True
        while grown:
            before = len(candidates)
            for ins in (*renames, *nameless):
                if ins.name in inside or ins.name in candidates or ins is root:
                    continue
                if any(op in inside or op in candidates for op in ins.operands):
                    candidates.add(ins.name)
            grown = len(candidates) > before
        struck = True
        while struck:
            struck = False
            for name in sorted(candidates):
                outside = users.get(name, [])
                if not outside or any(u not in inside and u not in candidates for u in outside):
                    candidates.discard(name)
                    struck = True
        inside |= candidates
        grown = True
        while grown:
            before = len(inside)
            for ins in renames:
                if ins.operands[0] in inside:
                    inside.add(ins.name)
            grown = len(inside) > before
        used: set[str] = set()
        if root is not None and root.name in inside:
            used.add(root.name)
        for ins in reversed(comp.instructions):
            if ins.name not in inside or (ins.opcode in FREE and ins.name in used):
                used.update(op for op in ins.operands if op in inside)
        return inside, used

    def _fused(self, comp: Computation, inside: set[str], used: set[str]) -> list[Cost]:
        """The scope's instructions in ``comp`` as kernels: each set of them that pass one
        another their results (whatever the schedule puts between) one kernel, which keeps
        those results on chip, reads what it takes from outside them once (a buffer under
        two names, bitcasts of it, once: the most any of them takes of it), and writes
        what is used outside them."""
        parent = {n: n for n in inside}

        def find(n: str) -> str:
            while parent[n] != n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        for ins in comp.instructions:
            if ins.name in inside:
                for operand in ins.operands:
                    if operand in inside:
                        parent[find(operand)] = find(ins.name)
        flops: dict[str, Cost] = {}
        written: dict[str, int] = {}
        reads: dict[str, dict[str, int]] = {}
        for ins in comp.instructions:
            if ins.name not in inside or ins.opcode in FREE:
                continue
            group = find(ins.name)
            matmuls = self.counter.instruction(comp, ins).matmuls
            flops[group] = flops.get(group, Cost()) + matmuls
            out = result_bytes(ins) if ins.name in used else 0
            written[group] = written.get(group, 0) + out
            taken = reads.setdefault(group, {})
            for operand, nbytes in operand_reads(self.module, comp, ins):
                if operand not in inside:
                    source = _source(comp, operand)
                    taken[source] = max(taken.get(source, 0), nbytes)
        out_costs = []
        for group, f in flops.items():
            moved = written[group] + sum(reads[group].values())
            if f.flops or moved:
                out_costs.append(f + Cost(0, moved, moved if f.flops else 0))
        return out_costs


def computation_cost(module: HloModule, name: str) -> Cost:
    """What one run of a scheduled computation computes and moves, loops counted with their
    trip counts (one trip where the count cannot be read), every branch of a conditional
    counted (an upper bound)."""
    return _Walk(module).computation(name)


def program_cost(module: HloModule) -> Cost:
    """What one run of the whole program computes and moves, per device."""
    return computation_cost(module, module.entry_name)


def _source(comp: Computation, name: str) -> str:
    """The instruction whose buffer ``name`` is: through bitcasts, which only name it anew."""
    seen = {name}
    ins = comp.by_name.get(name)
    while ins is not None and ins.opcode == "bitcast" and ins.operands:
        name = ins.operands[0]
        if name in seen:
            break
        seen.add(name)
        ins = comp.by_name.get(name)
    return name


def program_kernels(module: HloModule) -> int:
    """The kernels one run of the whole program launches per device: its instructions that
    compute or move data (a fusion, a matmul's library call, a copy), loops counted with
    their trip counts as :func:`computation_cost` counts them. Collectives are not among
    them: the communication model prices each one's start in its latency."""
    return sum(kernel_costs(module).values())


def kernel_costs(
    module: HloModule, scope: str | None = None, *, widened: bool = False
) -> dict[Kernel, int]:
    """The kernels one run of the whole program launches per device, by what each computes
    and moves a run: how many of them cost that (:func:`program_kernels` counts them). A
    GPU runs them one after another, so that its program's time is theirs summed. ``scope``
    names a ``jax.named_scope`` whose instructions run as one kernel where a hand-written
    kernel does their work (an attention core): each set of them that pass one another
    their results is one kernel, which keeps those on chip. ``widened``: the compiler
    widened 16-bit products to f32 (XLA:CPU's), whose FLOPs are counted as 16-bit's
    (:class:`~shardscope._src.hlo.cost.CostCounter`)."""
    return _Walk(module, scope, widened).kernels(module.entry_name)


def _dones(comp: Computation) -> dict[str, tuple[int, Instruction]]:
    """For each ``-start``, the ``-done`` that ends its transfer (through any ``-update``),
    with its position in the schedule."""
    after: dict[str, tuple[int, Instruction]] = {}
    for i, ins in enumerate(comp.instructions):
        if ins.operands and ins.opcode.endswith(("-done", "-update")):
            after.setdefault(ins.operands[0], (i, ins))
    out: dict[str, tuple[int, Instruction]] = {}
    for ins in comp.instructions:
        if not ins.opcode.endswith("-start"):
            continue
        step, seen = after.get(ins.name), {ins.name}
        while step is not None and step[1].opcode.endswith("-update") and step[1].name not in seen:
            seen.add(step[1].name)
            step = after.get(step[1].name)
        if step is not None and step[1].opcode.endswith("-done"):
            out[ins.name] = step
    return out


def _is_collective(ins: Instruction) -> bool:
    base = ins.opcode.removesuffix("-start").removesuffix("-done")
    return base in comm.KINDS


def windows(module: HloModule) -> dict[str, Window]:
    """Each asynchronous collective's window, keyed by its ``-start``'s name."""
    out: dict[str, Window] = {}
    walk = _Walk(module)
    for comp in module.computations.values():
        dones = _dones(comp)
        if not dones:
            continue
        # Running sums over the schedule, so that each window is two lookups.
        flops, moved, matmul, busy, starts = [0], [0], [0], [0], [0]
        for i in comp.instructions:
            c = walk.instruction(comp, i, frozenset({comp.name}))
            flops.append(flops[-1] + c.flops)
            moved.append(moved[-1] + c.bytes)
            matmul.append(matmul[-1] + c.matmul_bytes)
            busy.append(busy[-1] + bool(c.flops or c.bytes))
            starts.append(starts[-1] + (_is_collective(i) and i.opcode.endswith("-start")))
        for at, ins in enumerate(comp.instructions):
            if ins.opcode == "copy-start" or ins.name not in dones:
                continue
            end, done = dones[ins.name]
            lo = at + 1
            window = Window(
                ins.name,
                done.name,
                comp.name,
                Cost(flops[end] - flops[lo], moved[end] - moved[lo], matmul[end] - matmul[lo]),
                busy[end] - busy[lo],
                starts[end] - starts[lo],
            )
            out[ins.name] = window
            # A collective an async-start wraps runs in the same window (names are unique
            # in a module).
            for _, callee in ins.called_computations if ins.opcode == "async-start" else ():
                wrapped = module.computations.get(callee)
                for inner in wrapped.instructions if wrapped is not None else ():
                    if _is_collective(inner):
                        out[inner.name] = window
    return out


def overlaps(
    module: HloModule,
    collectives: Mapping[str, tuple[float, bool]],
    device: Roofline,
    held: Mapping[str, float] | None = None,
) -> dict[str, Overlap]:
    """How much of each collective the compute beside it hides.

    ``collectives`` maps each collective's instruction name (a ``-start`` for an asynchronous
    one; names are unique in a module) to its time by the communication model and whether it
    is asynchronous; ``held`` the share of the device's multiprocessors each holds while it
    runs (:func:`~shardscope._src.cost.links.held_share`; none given: 0).
    """
    found = windows(module)
    shares = held or {}
    out = {}
    for name, (seconds, is_async) in collectives.items():
        window = found.get(name) if is_async else None
        compute = roofline_seconds(window.compute, device) if window is not None else 0.0
        exposed = overlap_seconds(compute, seconds, seconds * shares.get(name, 0.0))
        out[name] = Overlap(is_async, seconds, seconds - exposed, exposed, window)
    return out
