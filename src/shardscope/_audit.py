"""The collective audit: what a compiled JAX program communicates, by kind, axis and line.

``audit(f, *args)`` compiles (or takes) a program, parses its optimized HLO once
(:mod:`shardscope._hlo`), finds every collective, however deeply it sits in called, fused,
async-wrapped, looped or branched computations, names the user's mesh axes it runs over
(:mod:`shardscope._groups`) and prices it (:mod:`shardscope._comm`). The result is plain
data: :class:`Collective` records inside an :class:`Audit`.

Example (needs 8 simulated devices, so not run as a doctest)::

    mesh = shardscope.make_mesh("model=8")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32,
                             sharding=NamedSharding(mesh, P("model", None)))
    a = shardscope.audit(jax.jit(lambda x, w: x @ w), x, w)
    a.counts()["all-reduce"], a.collectives[0].axes     # (1, ('model',))
    a.expect(all_reduce=1, all_gather=0)                # raises AssertionError if not
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardscope import _comm
from shardscope._comm import format_bytes
from shardscope._errors import HloParseError, MeshSpecError, ShardscopeError
from shardscope._groups import (
    AxisMatch,
    axes_of_groups,
    axes_of_pairs,
    parse_replica_groups,
    parse_source_target_pairs,
)
from shardscope._hlo import Computation, HloModule, Instruction, parse_hlo
from shardscope._mesh import format_mesh_spec, mesh_axes, parse_mesh_spec

# Attributes a collective may carry that the audit understands or may ignore.
_KNOWN_COLLECTIVE_ATTRIBUTES = frozenset(
    """channel_id replica_groups use_global_device_ids to_apply metadata dimensions
    source_target_pairs backend_config constrain_layout sharding frontend_attributes
    control-predecessors split_dimension slice_sizes statistics origin
    is_cross_program_prefetch""".split()
)
_FALLBACK_AXIS = "devices"


@dataclass(frozen=True)
class Loop:
    """A ``while`` loop around a collective: its instruction and trip count (None: unknown)."""

    name: str
    trip_count: int | None


@dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled program.

    Attributes:
        kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
            ``ragged-all-to-all``, ``collective-permute`` or ``collective-broadcast``.
        name: the HLO instruction (the ``-start`` one of an async pair).
        computation: the HLO computation holding it.
        axes: the user's mesh axes it runs over, in mesh order; a sub-axis reads
            ``'name:(pre)size'``. Empty when each group is a single device or when irregular.
        group_size: devices in one replica group (for a permute: along its axes).
        irregular: the groups match no set of mesh axes; ``groups`` holds them, ``reason`` why.
        groups: the replica groups as partition ids (for a permute: the pairs' devices).
        dtype, shape: element type and shape of the payload array (the first, when the
            instruction combines several: ``shapes`` has them all). all-reduce,
            reduce-scatter, collective-permute, collective-broadcast: the operand;
            all-gather: the result; all-to-all: one device's buffer.
        payload_bytes: the full logical array ``S`` of ``shardscope.comm``: all-reduce and
            reduce-scatter operand, all-gather result, all-to-all group size times one
            device's buffer, collective-permute one device's buffer.
        traffic_bytes: bytes each device sends per execution (:func:`traffic_bytes`).
        count: executions per program run (known loop trip counts multiplied). When
            ``count_exact`` is False a loop around it has an unknown trip count (counted
            once) or it sits in a conditional branch (counted as if the branch runs);
            ``loops`` and ``conditionals`` say which.
        op_name, source: JAX's op name and the Python ``file:line`` that emitted it, from the
            module's metadata and stack-frame tables; None for a collective the partitioner
            added without metadata (``operand_source`` then gives its input's line).
        unknown_attributes: attributes this tool does not know, verbatim.
    """

    kind: str
    name: str
    computation: str
    axes: tuple[str, ...]
    group_size: int
    dtype: str
    shape: tuple[int, ...]
    payload_bytes: int
    traffic_bytes: int
    count: int
    count_exact: bool = True
    irregular: bool = False
    reason: str = ""
    groups: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    pairs: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    loops: tuple[Loop, ...] = ()
    conditionals: tuple[str, ...] = ()
    op_name: str | None = None
    source: str | None = None
    operand_source: str | None = None
    is_async: bool = False
    reduction: str | None = None
    channel_id: int | None = None
    replica_groups: str = field(default="", repr=False)
    unknown_attributes: Mapping[str, str] = field(default_factory=dict, repr=False)
    note: str = ""

    @property
    def axes_label(self) -> str:
        """``"dp,mp"``; ``"irregular"``; ``"-"`` when no data leaves a device."""
        if self.irregular:
            return "irregular"
        return ",".join(self.axes) if self.axes else "-"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "computation": self.computation,
            "axes": list(self.axes),
            "group_size": self.group_size,
            "irregular": self.irregular,
            "reason": self.reason,
            "groups": [list(g) for g in self.groups] if self.irregular else None,
            "pairs": [list(p) for p in self.pairs] or None,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "shapes": [list(s) for s in self.shapes],
            "payload_bytes": self.payload_bytes,
            "traffic_bytes": self.traffic_bytes,
            "count": self.count,
            "count_exact": self.count_exact,
            "loops": [{"name": lp.name, "trip_count": lp.trip_count} for lp in self.loops],
            "conditionals": list(self.conditionals),
            "op_name": self.op_name,
            "source": self.source,
            "operand_source": self.operand_source,
            "is_async": self.is_async,
            "reduction": self.reduction,
            "channel_id": self.channel_id,
            "replica_groups": self.replica_groups,
            "unknown_attributes": dict(self.unknown_attributes),
            "note": self.note,
        }


@dataclass(frozen=True)
class Totals:
    """Sums over collectives, each weighted by its ``count``."""

    count: int = 0
    payload_bytes: int = 0
    traffic_bytes: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.count + other.count,
            self.payload_bytes + other.payload_bytes,
            self.traffic_bytes + other.traffic_bytes,
        )

    @staticmethod
    def of(c: Collective) -> Totals:
        return Totals(c.count, c.payload_bytes * c.count, c.traffic_bytes * c.count)

    def to_dict(self) -> dict[str, int]:
        return {
            "count": self.count,
            "payload_bytes": self.payload_bytes,
            "traffic_bytes": self.traffic_bytes,
        }


@dataclass(frozen=True)
class Rematerialization:
    """The SPMD partitioner's "Involuntary full rematerialization": replicate, then slice."""

    instruction: str | None
    from_sharding: str | None
    to_sharding: str | None
    op_name: str | None
    source: str | None
    message: str = field(repr=False, default="")

    def to_dict(self) -> dict[str, Any]:
        return {
            "instruction": self.instruction,
            "from_sharding": self.from_sharding,
            "to_sharding": self.to_sharding,
            "op_name": self.op_name,
            "source": self.source,
        }


@dataclass(frozen=True)
class UnknownInstruction:
    """An instruction whose opcode this tool does not know, kept with its raw text."""

    name: str
    opcode: str
    computation: str
    raw: str

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "opcode": self.opcode,
            "computation": self.computation,
            "raw": self.raw,
        }


@dataclass(frozen=True)
class Audit:
    """What one compiled program communicates. Plain data; renderers live elsewhere.

    ``memory`` is per device (``compiled.memory_analysis()``, bytes), ``flops`` per device
    (``compiled.cost_analysis()``); both None for HLO text. ``rematerializations`` is None
    when the audit did not compile the program itself and so could not see the
    partitioner's log. ``compiled`` keeps the ``jax.stages.Compiled`` when there is one (a
    verdict can compile alternatives and compare), ``module`` the parsed HLO and ``hlo_text``
    its text.
    """

    collectives: tuple[Collective, ...]
    mesh_axes: Mapping[str, int]
    num_partitions: int
    module_name: str
    memory: Mapping[str, int] | None = None
    flops: float | None = None
    in_shardings: tuple[str, ...] | None = None
    out_shardings: tuple[str, ...] | None = None
    rematerializations: tuple[Rematerialization, ...] | None = None
    unknown_instructions: tuple[UnknownInstruction, ...] = ()
    module: HloModule | None = field(default=None, repr=False, compare=False)
    compiled: Any = field(default=None, repr=False, compare=False)
    hlo_text: str = field(default="", repr=False, compare=False)

    def counts(self) -> dict[str, int]:
        """``{kind: executions per run}`` for every collective kind (zeros included)."""
        out = dict.fromkeys(_comm.KINDS, 0)
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.count
        return out

    def totals(self) -> dict[tuple[str, str], Totals]:
        """``{(axes label, kind): Totals}`` in table order (mesh axes, then kinds)."""
        out: dict[tuple[str, str], Totals] = {}
        for c in sorted(self.collectives, key=self._order):
            key = (c.axes_label, c.kind)
            out[key] = out.get(key, Totals()) + Totals.of(c)
        return out

    def totals_by_axis(self) -> dict[str, Totals]:
        """``{axes label: Totals}``; a collective over ``dp,mp`` is its own label."""
        out: dict[str, Totals] = {}
        for (label, _), t in self.totals().items():
            out[label] = out.get(label, Totals()) + t
        return out

    def totals_by_kind(self) -> dict[str, Totals]:
        out: dict[str, Totals] = {}
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, Totals()) + Totals.of(c)
        return {k: out[k] for k in sorted(out, key=_kind_rank)}

    def total(self) -> Totals:
        t = Totals()
        for c in self.collectives:
            t = t + Totals.of(c)
        return t

    def axis_traffic(self, axis: str) -> int:
        """Bytes per device sent by the collectives that run over ``axis`` (or a sub-axis)."""
        if axis not in self.mesh_axes:
            raise ShardscopeError(
                f"{axis!r} is not an axis of this audit's mesh "
                f"({format_mesh_spec(self.mesh_axes)}); use one of {', '.join(self.mesh_axes)}"
            )
        return sum(
            c.traffic_bytes * c.count
            for c in self.collectives
            if any(a == axis or a.startswith(axis + ":(") for a in c.axes)
        )

    @property
    def exact(self) -> bool:
        """True when every count is exact (no unknown trip counts, no conditional branches)."""
        return all(c.count_exact for c in self.collectives)

    def _order(self, c: Collective) -> tuple[Any, ...]:
        names = list(self.mesh_axes)

        def axis_rank(a: str) -> int:
            base = a.split(":(")[0]
            return names.index(base) if base in names else len(names)

        return (
            c.irregular,
            not c.axes,
            tuple(axis_rank(a) for a in c.axes),
            c.axes,
            _kind_rank(c.kind),
            c.source or "",
            c.name,
        )

    def sorted_collectives(self) -> list[Collective]:
        """The collectives grouped by axes (mesh order), then kind, then source line."""
        return sorted(self.collectives, key=self._order)

    def expect(
        self,
        *,
        bytes_per_axis: Mapping[str, int] | None = None,
        traffic_bytes: int | None = None,
        **counts: int,
    ) -> Audit:
        """Checks budgets; raises ``AssertionError`` with a table of what differed.

        Args:
            **counts: exact executions per run of a kind, named with underscores:
                ``all_gather=0, all_reduce=2``. Kinds not named are not checked.
            bytes_per_axis: ``{axis: budget}``: the bytes each device sends over collectives
                that run over that axis (alone or with others) must not exceed the budget.
            traffic_bytes: budget for the bytes each device sends in all.

        Returns ``self``, so checks chain.

        >>> audit.expect(all_gather=0, all_reduce=2, bytes_per_axis={"mp": 2**20})  # doctest: +SKIP
        """
        rows: list[tuple[str, str, str, bool]] = []
        actual = self.counts()
        failing_kinds: list[str] = []
        for key, want in counts.items():
            kind = key.replace("_", "-")
            if kind not in _comm.KINDS:
                valid = ", ".join(k.replace("-", "_") for k in _comm.KINDS)
                raise TypeError(f"expect() got an unexpected keyword {key!r}; kinds are {valid}")
            if isinstance(want, bool) or not isinstance(want, int) or want < 0:
                raise ShardscopeError(f"expect({key}=...) needs a count >= 0, got {want!r}")
            ok = actual[kind] == want
            if not ok:
                failing_kinds.append(kind)
            rows.append((f"{kind} count", str(want), str(actual[kind]), ok))
        for axis, budget in (bytes_per_axis or {}).items():
            got = self.axis_traffic(axis)
            rows.append(
                (
                    f"bytes/device over {axis!r}",
                    f"<= {format_bytes(budget)}",
                    format_bytes(got),
                    got <= budget,
                )
            )
        if traffic_bytes is not None:
            got = self.total().traffic_bytes
            rows.append(
                (
                    "bytes/device in all",
                    f"<= {format_bytes(traffic_bytes)}",
                    format_bytes(got),
                    got <= traffic_bytes,
                )
            )
        bad = [r for r in rows if not r[3]]
        if not bad:
            return self
        w0 = max(len("check"), *(len(r[0]) for r in rows))
        w1 = max(len("expected"), *(len(r[1]) for r in rows))
        w2 = max(len("actual"), *(len(r[2]) for r in rows))
        lines = [
            f"audit of {self.module_name}: {len(bad)} of {len(rows)} checks differ",
            f"  {'check':<{w0}}  {'expected':>{w1}}  {'actual':>{w2}}",
        ]
        for name, want, got, ok in rows:
            lines.append(f"  {name:<{w0}}  {want:>{w1}}  {got:>{w2}}{'' if ok else '  <- differs'}")
        shown = [c for c in self.sorted_collectives() if c.kind in failing_kinds]
        if shown:
            lines.append("collectives of the kinds that differ:")
            for c in shown:
                where = c.source or (f"after {c.operand_source}" if c.operand_source else "?")
                lines.append(
                    f"  {c.kind} x{c.count} over {c.axes_label} ({c.dtype}{list(c.shape)}, "
                    f"{format_bytes(c.payload_bytes)}) at {where} [{c.name}]"
                )
        if not self.exact:
            lines.append("note: some counts are not exact (unknown trip counts or branches)")
        raise AssertionError("\n".join(lines))

    def __rich__(self) -> Any:
        from shardscope._render_audit import audit_table

        return audit_table(self)

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        from shardscope._render import mimebundle

        return mimebundle(self, width=140)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data."""
        return {
            "module": self.module_name,
            "num_partitions": self.num_partitions,
            "mesh_axes": dict(self.mesh_axes),
            "counts": self.counts(),
            "exact": self.exact,
            "totals": [
                {"axes": label, "kind": kind, **t.to_dict()}
                for (label, kind), t in self.totals().items()
            ],
            "total": self.total().to_dict(),
            "collectives": [c.to_dict() for c in self.sorted_collectives()],
            "memory": dict(self.memory) if self.memory is not None else None,
            "flops": self.flops,
            "in_shardings": list(self.in_shardings) if self.in_shardings is not None else None,
            "out_shardings": (list(self.out_shardings) if self.out_shardings is not None else None),
            "rematerializations": (
                [r.to_dict() for r in self.rematerializations]
                if self.rematerializations is not None
                else None
            ),
            "unknown_instructions": [u.to_dict() for u in self.unknown_instructions],
        }


def _kind_rank(kind: str) -> int:
    return _comm.KINDS.index(kind) if kind in _comm.KINDS else len(_comm.KINDS)


# --------------------------------------------------------------------------------------
# Analysis of a parsed module
# --------------------------------------------------------------------------------------


@dataclass
class _Context:
    count: int = 0
    exact: bool = True
    loops: tuple[Loop, ...] = ()
    conditionals: tuple[str, ...] = ()
    is_async: bool = False
    seen: bool = False


def _trip_count(ins: Instruction) -> int | None:
    cfg = ins.backend_config
    if isinstance(cfg, dict):
        known = cfg.get("known_trip_count")
        if isinstance(known, dict):
            n = known.get("n")
            if isinstance(n, int | str) and str(n).isdigit():
                return int(n)
    return None


def _edges(ins: Instruction) -> Iterator[tuple[str, int, bool, Loop | None, str | None, bool]]:
    """(callee, factor, exact, loop, conditional, async) for each computation ``ins`` runs."""
    if ins.opcode in ("async-done", "async-update"):
        return  # they name the computation async-start already runs
    branch = 0
    for attr, callee in ins.called_computations:
        if ins.opcode == "while":
            trips = _trip_count(ins)
            loop = Loop(ins.name, trips)
            known = trips is not None
            # The condition runs once more than the body: the test that ends the loop.
            factor = (trips if attr == "body" else trips + 1) if trips is not None else 1
            yield callee, factor, known, loop, None, False
        elif ins.opcode == "conditional":
            label = f"{ins.name}[{branch}]"
            branch += 1
            yield callee, 1, False, None, label, False
        else:
            yield callee, 1, True, None, None, ins.opcode == "async-start"


def _contexts(module: HloModule) -> dict[str, _Context]:
    """How often each computation runs per program run, by walking calls from ENTRY."""
    comps = module.computations
    callers: dict[str, int] = {name: 0 for name in comps}
    reach: set[str] = set()
    stack = [module.entry_name]
    while stack:
        name = stack.pop()
        if name in reach:
            continue
        reach.add(name)
        for ins in comps[name].instructions:
            for callee, *_ in _edges(ins):
                if callee not in comps:
                    raise HloParseError(
                        f"HLO text line {ins.line}: {ins.name} calls computation {callee!r}, "
                        f"which the module does not define"
                    )
                stack.append(callee)
    for name in reach:
        for ins in comps[name].instructions:
            for callee, *_ in _edges(ins):
                callers[callee] += 1
    ctx = {name: _Context() for name in reach}
    ctx[module.entry_name] = _Context(count=1, seen=True)
    ready = [module.entry_name]
    done = 0
    while ready:
        name = ready.pop()
        done += 1
        here = ctx[name]
        for ins in comps[name].instructions:
            for callee, factor, exact, loop, cond, is_async in _edges(ins):
                c = ctx[callee]
                c.count += here.count * factor
                if not c.seen:
                    c.loops = here.loops + ((loop,) if loop else ())
                    c.conditionals = here.conditionals + ((cond,) if cond else ())
                    c.is_async = here.is_async or is_async
                    c.exact = here.exact and exact
                    c.seen = True
                else:
                    c.exact = c.exact and here.exact and exact
                callers[callee] -= 1
                if callers[callee] == 0:
                    ready.append(callee)
    if done != len(reach):
        raise HloParseError("HLO text: the computations call each other in a cycle")
    return ctx


_SYNC_KINDS = frozenset(_comm.KINDS)
_START_KINDS = {f"{k}-start": k for k in _comm.KINDS}


def _collective_kind(opcode: str) -> tuple[str, bool] | None:
    if opcode in _SYNC_KINDS:
        return opcode, False
    if opcode in _START_KINDS:
        return _START_KINDS[opcode], True
    return None


def _operand_shapes(comp: Computation, ins: Instruction) -> list[Any]:
    out = []
    for op in ins.operands:
        src = comp.by_name.get(op)
        if src is None:
            raise HloParseError(
                f"HLO text line {ins.line}: operand %{op} of {ins.name} is not defined in "
                f"computation {comp.name}"
            )
        out.append(src.shape)
    return out


def _group_mode(ins: Instruction, kind: str) -> str:
    """XLA's CollectiveOpGroupMode, from channel_id and use_global_device_ids."""
    has_channel = "channel_id" in ins.attributes
    if kind in ("collective-permute", "collective-broadcast"):
        return "partition" if has_channel else "replica"
    if not has_channel:
        return "replica"
    if kind in ("all-to-all", "ragged-all-to-all"):
        return "partition"
    if ins.attributes.get("use_global_device_ids") == "true":
        return "flattened"
    return "replica_and_partition"


def _match_groups(
    module: HloModule, ins: Instruction, kind: str, mesh: Mapping[str, int]
) -> tuple[AxisMatch, tuple[tuple[int, ...], ...], tuple[tuple[int, int], ...], str]:
    p, r = module.num_partitions, module.replica_count
    mode = _group_mode(ins, kind)
    if kind == "collective-permute":
        raw = ins.attributes.get("source_target_pairs", "{}")
        pairs = parse_source_target_pairs(raw)
        if mode == "replica" and r == 1:
            return AxisMatch((), 1), (), pairs, "no channel_id: within one partition"
        match = axes_of_pairs(pairs, mesh)
        devices = tuple(sorted({d for pair in pairs for d in pair}))
        return match, (devices,), pairs, ""
    raw = ins.attributes.get("replica_groups", "{}")
    rg = parse_replica_groups(raw)
    if r != 1:
        groups = rg.resolve(r * p if mode == "flattened" else max(r, p))
        return (
            AxisMatch((), len(groups[0]) if groups else 0, True, f"module has {r} replicas"),
            groups,
            (),
            "",
        )
    if mode == "replica":
        # Groups of replica ids, and there is one replica: each partition on its own.
        return AxisMatch((), 1), tuple((q,) for q in range(p)), (), "no channel_id"
    if mode == "replica_and_partition":
        groups = (tuple(range(p)),)
    else:
        groups = rg.resolve(p)
    return axes_of_groups(groups, mesh), groups, (), ""


def _payload(
    kind: str, is_async: bool, ins: Instruction, operand_shapes: list[Any], n: int
) -> tuple[int, list[Any], str]:
    """(payload bytes, payload array shapes, note), ``S`` as ``shardscope.comm`` defines it."""
    leaves = [leaf for s in operand_shapes for leaf in s.leaves()]
    note = ""
    if kind == "all-gather":
        if not is_async:
            arrays = list(ins.shape.leaves())
        else:
            dims = ins.attributes.get("dimensions", "{0}").strip("{}").split(",")
            d = int(dims[0]) if dims and dims[0].strip().isdigit() else 0
            arrays = [_scaled(leaf, d, n) for leaf in leaves]
    elif kind == "collective-permute":
        arrays = leaves[:1]
    elif kind == "ragged-all-to-all":
        arrays = leaves[:1]
        note = "ragged: sizes known only at run time; the input buffer bounds the payload"
    else:
        arrays = leaves
    sizes = [a.byte_size for a in arrays]
    if any(s is None for s in sizes):
        unknown = sorted({a.dtype for a, s in zip(arrays, sizes, strict=True) if s is None})
        raise HloParseError(
            f"HLO text line {ins.line}: {ins.name} moves an element type this tool does not "
            f"know ({', '.join(unknown)})"
        )
    total = sum(sizes)  # type: ignore[arg-type]
    if kind in ("all-to-all", "ragged-all-to-all"):
        total *= n
    return total, arrays, note


def _scaled(shape: Any, dim: int, n: int) -> Any:
    from shardscope._hlo import Shape

    dims = list(shape.dims)
    if 0 <= dim < len(dims):
        dims[dim] *= n
    return Shape(dtype=shape.dtype, dims=tuple(dims), dynamic=shape.dynamic)


def _source(module: HloModule, ins: Instruction) -> str | None:
    md = ins.metadata
    stack = module.stack(md.stack_frame_id)
    if stack:
        return str(stack[0])
    if md.source_file:
        return f"{md.source_file}:{md.source_line}" if md.source_line else md.source_file
    return None


def _operand_source(module: HloModule, comp: Computation, ins: Instruction) -> str | None:
    """The line of the nearest producer with metadata (for collectives without their own)."""
    seen: set[str] = set()
    todo = list(ins.operands)
    while todo and len(seen) < 64:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        src = comp.by_name.get(name)
        if src is None:
            continue
        where = _source(module, src)
        if where:
            return where
        todo.extend(src.operands)
    return None


def analyze(
    module: HloModule, mesh: Mapping[str, int]
) -> tuple[tuple[Collective, ...], tuple[UnknownInstruction, ...]]:
    """Every collective of ``module`` (in text order), and its instructions of unknown opcode.

    ``mesh`` (``{axis: size}``, mesh order) must hold ``module.num_partitions`` devices.
    """
    contexts = _contexts(module)
    collectives: list[Collective] = []
    unknown: list[UnknownInstruction] = []
    for comp in module.computations.values():
        ctx = contexts.get(comp.name)
        if ctx is None:
            continue  # never called from ENTRY
        for ins in comp.instructions:
            if not ins.known:
                unknown.append(UnknownInstruction(ins.name, ins.opcode, comp.name, ins.raw))
                continue
            kk = _collective_kind(ins.opcode)
            if kk is None:
                continue
            kind, is_start = kk
            collectives.append(_record(module, comp, ins, kind, is_start, ctx, mesh))
    return tuple(collectives), tuple(unknown)


def _record(
    module: HloModule,
    comp: Computation,
    ins: Instruction,
    kind: str,
    is_start: bool,
    ctx: _Context,
    mesh: Mapping[str, int],
) -> Collective:
    match, groups, pairs, mode_note = _match_groups(module, ins, kind, mesh)
    n = match.group_size if not match.irregular else (len(groups[0]) if groups else 1)
    operand_shapes = _operand_shapes(comp, ins)
    payload, arrays, note = _payload(kind, is_start, ins, operand_shapes, max(n, 1))
    if kind == "collective-permute":
        moves = any(a != b for a, b in pairs)
        traffic = _comm.traffic_bytes(kind, payload, 2 if moves else 1)
    else:
        traffic = _comm.traffic_bytes(kind, payload, max(n, 1))
    reduction = None
    if kind in ("all-reduce", "reduce-scatter"):
        for attr, callee in ins.called_computations:
            if attr == "to_apply" and callee in module.computations:
                root = module.computations[callee].root
                reduction = root.opcode if root is not None else None
    dtypes = sorted({a.dtype for a in arrays if a.dtype})
    channel = ins.attributes.get("channel_id")
    source = _source(module, ins)
    md = ins.metadata
    return Collective(
        kind=kind,
        name=ins.name,
        computation=comp.name,
        axes=match.axes,
        group_size=n,
        dtype=dtypes[0] if len(dtypes) == 1 else ("mixed" if dtypes else ""),
        shape=tuple(arrays[0].dims) if arrays else (),
        shapes=tuple(tuple(a.dims) for a in arrays),
        payload_bytes=payload,
        traffic_bytes=traffic,
        count=ctx.count,
        count_exact=ctx.exact,
        irregular=match.irregular,
        reason=match.reason,
        groups=groups,
        pairs=pairs,
        loops=ctx.loops,
        conditionals=ctx.conditionals,
        op_name=md.op_name,
        source=source,
        operand_source=None if source else _operand_source(module, comp, ins),
        is_async=is_start or ctx.is_async,
        reduction=reduction,
        channel_id=int(channel) if channel is not None and channel.isdigit() else None,
        replica_groups=ins.attributes.get(
            "source_target_pairs" if kind == "collective-permute" else "replica_groups", "{}"
        ),
        unknown_attributes={
            k: v for k, v in ins.attributes.items() if k not in _KNOWN_COLLECTIVE_ATTRIBUTES
        },
        note="; ".join(x for x in (note, mode_note) if x),
    )


# --------------------------------------------------------------------------------------
# Front door: audit(target, ...)
# --------------------------------------------------------------------------------------


def _mesh_from(mesh: Any) -> dict[str, int] | None:
    if mesh is None:
        return None
    if isinstance(mesh, str | Mapping):
        return parse_mesh_spec(mesh)
    if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
        return mesh_axes(mesh)
    raise MeshSpecError(
        f"mesh must be a jax.sharding.Mesh or a description such as 'dp=2,mp=4', "
        f"got {type(mesh).__name__}"
    )


def _sharding_leaves(tree: Any) -> list[Any]:
    import jax

    return jax.tree.leaves(tree, is_leaf=lambda x: hasattr(x, "device_set"))


def _format_sharding(s: Any) -> str:
    spec = getattr(s, "spec", None)
    if spec is not None:
        return "P(" + ", ".join(repr(e) for e in tuple(spec)) + ")"
    return str(s)


def _mesh_of_shardings(shardings: list[Any]) -> dict[str, int] | None:
    for s in shardings:
        m = getattr(s, "mesh", None)
        if m is not None and hasattr(m, "axis_names"):
            return mesh_axes(m)
    return None


def _memory(compiled: Any) -> dict[str, int] | None:
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    out = {}
    for name in dir(stats):
        if name.endswith("_in_bytes") and not name.startswith("_"):
            value = getattr(stats, name)
            if isinstance(value, int):
                out[name] = value
    return out


def _flops(compiled: Any) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not isinstance(cost, Mapping):
        return None
    flops = cost.get("flops")
    return float(flops) if isinstance(flops, int | float) and math.isfinite(flops) else None


_REMAT_MARK = "Involuntary full rematerialization"
_REMAT_CACHE: dict[int, tuple[Rematerialization, ...]] = {}


@contextlib.contextmanager
def _capture_stderr() -> Iterator[list[str]]:
    """Collects what C++ writes to file descriptor 2 (XLA logs there), then passes it on."""
    out: list[str] = []
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError):
        pass
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (e.g. a daemon): nothing to capture
        yield out
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            try:
                sys.stderr.flush()
            except (AttributeError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            if data:
                os.write(2, data)
            out.append(data.decode("utf-8", errors="replace"))


def _balanced_after(text: str, marker: str) -> str | None:
    i = text.find(marker)
    if i < 0:
        return None
    i += len(marker)
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i : j + 1]
    return None


def parse_rematerializations(log: str, module: HloModule | None) -> tuple[Rematerialization, ...]:
    """The partitioner's rematerialization warnings in a compile log, with source lines."""
    out = []
    for line in log.splitlines():
        if _REMAT_MARK not in line:
            continue
        frm = _balanced_after(line, "from sharding ")
        to = None
        if frm is not None:
            rest = line[line.find(frm) + len(frm) :]
            to = _balanced_after(rest, " to ")
        name = None
        m = re.search(r"HLO operation:?\s*%?([\w.\-]+)\s*=", line)
        if m:
            name = m.group(1)
        op_name = None
        source = None
        md = _balanced_after(line, "metadata=")
        if md is not None:
            from shardscope._hlo import parse_metadata

            try:
                meta = parse_metadata(md)
            except HloParseError:
                meta = None
            if meta is not None:
                op_name = meta.op_name
                if module is not None:
                    stack = module.stack(meta.stack_frame_id)
                    source = str(stack[0]) if stack else None
        out.append(Rematerialization(name, frm, to, op_name, source, line.strip()))
    return tuple(out)


def audit(target: Any, *args: Any, mesh: Any = None, **jit_kwargs: Any) -> Audit:
    """Audits the collectives of a compiled JAX program.

    Args:
        target: a jitted function (give its example arguments: arrays or
            ``jax.ShapeDtypeStruct`` with shardings, so nothing is allocated), a plain
            function (``in_shardings`` / ``out_shardings`` go in ``jit_kwargs``), a
            ``jax.stages.Lowered``, a ``jax.stages.Compiled``, or the text of
            ``compiled.as_text()``.
        *args: example arguments when ``target`` is a function.
        mesh: a ``jax.sharding.Mesh`` or a description such as ``"dp=2,mp=4"`` (devices in
            iota order) naming the axes. Optional when the program's shardings carry a mesh;
            for HLO text without one, the axis is called ``devices``.
        **jit_kwargs: options for ``jax.jit`` when ``target`` is a function.

    Returns:
        An :class:`Audit`.

    Raises:
        HloParseError: the text is not optimized HLO.
        MeshSpecError: the mesh does not hold the program's number of partitions.
    """
    import jax

    given_axes = _mesh_from(mesh)  # a bad mesh is refused before anything is compiled
    compiled = None
    remats: tuple[Rematerialization, ...] | None = None
    log: str | None = None
    in_sh = out_sh = None
    shard_mesh: dict[str, int] | None = None
    if isinstance(target, str):
        if args or jit_kwargs:
            raise ShardscopeError(
                "audit(hlo_text, ...) takes no example arguments or jit options; pass only "
                "mesh= (e.g. audit(text, mesh='dp=2,mp=4'))"
            )
        text = target
    else:
        if isinstance(target, jax.stages.Compiled):
            compiled = target
            if args or jit_kwargs:
                raise ShardscopeError(
                    "audit(compiled) takes no example arguments or jit options: the program "
                    "is already compiled"
                )
        else:
            if isinstance(target, jax.stages.Lowered):
                if args or jit_kwargs:
                    raise ShardscopeError(
                        "audit(lowered) takes no example arguments or jit options: the "
                        "program is already lowered"
                    )
                lowered = target
            elif callable(target) or hasattr(target, "lower"):
                lowered = _lower(target, args, jit_kwargs, mesh)
            else:
                raise ShardscopeError(
                    f"audit() needs a function, a jax.stages.Lowered or Compiled, or HLO text; "
                    f"got {type(target).__name__}"
                )
            with _capture_stderr() as captured:
                compiled = lowered.compile()
            log = captured[0] if captured else None
        text = compiled.as_text()
        in_leaves = _sharding_leaves(compiled.input_shardings)
        out_leaves = _sharding_leaves(compiled.output_shardings)
        in_sh = tuple(_format_sharding(s) for s in in_leaves)
        out_sh = tuple(_format_sharding(s) for s in out_leaves)
        shard_mesh = _mesh_of_shardings(in_leaves + out_leaves)
    module = parse_hlo(text)
    axes = given_axes or shard_mesh or {_FALLBACK_AXIS: module.num_partitions}
    if math.prod(axes.values()) != module.num_partitions:
        size = math.prod(axes.values())
        shape = " x ".join(str(v) for v in axes.values()) + f" = {size}" if len(axes) > 1 else size
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} holds {shape} "
            f"devices but the program is partitioned over {module.num_partitions} "
            f"(num_partitions in the HLO module header); describe a mesh whose sizes "
            f"multiply to {module.num_partitions}, in the order the program's mesh uses"
        )
    collectives, unknown = analyze(module, axes)
    if log is not None:
        key = hash(text)
        remats = parse_rematerializations(log, module)
        if remats:
            if len(_REMAT_CACHE) >= 256:
                _REMAT_CACHE.pop(next(iter(_REMAT_CACHE)))
            _REMAT_CACHE[key] = remats
        else:
            # JAX reuses a compiled executable for an identical program, without logging.
            remats = _REMAT_CACHE.get(key, ())
    memory = flops = None
    if compiled is not None:
        memory = _memory(compiled)
        flops = _flops(compiled)
    return Audit(
        collectives=collectives,
        mesh_axes=axes,
        num_partitions=module.num_partitions,
        module_name=module.name,
        memory=memory,
        flops=flops,
        in_shardings=in_sh,
        out_shardings=out_sh,
        rematerializations=remats,
        unknown_instructions=unknown,
        module=module,
        compiled=compiled,
        hlo_text=text,
    )


def _lower(target: Any, args: tuple[Any, ...], jit_kwargs: dict[str, Any], mesh: Any) -> Any:
    import jax

    if jit_kwargs or not hasattr(target, "lower"):
        fn = jax.jit(target, **jit_kwargs)
    else:
        fn = target
    ctx: Any = contextlib.nullcontext()
    if mesh is not None and not isinstance(mesh, str | Mapping):
        ctx = jax.set_mesh(mesh)
    elif mesh is not None:
        from shardscope._mesh import make_mesh

        # A description names axes for bare PartitionSpecs in the program; one that does not
        # fit the devices is reported against the compiled program's partition count below.
        if math.prod(parse_mesh_spec(mesh).values()) == jax.device_count():
            ctx = jax.set_mesh(make_mesh(mesh))
    with ctx:
        return fn.lower(*args)
