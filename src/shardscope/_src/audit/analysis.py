"""Finding the collectives of a parsed HLO module: every one, however deeply it sits in called,
fused, async-wrapped, looped or branched computations, named by the user's mesh axes and priced."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from shardscope._src.audit.decomposed import ShardInBuffer, shard_in_zeros
from shardscope._src.audit.loops import derived_trip_count, known_trip_count
from shardscope._src.audit.provenance import (
    FORWARD,
    Origin,
    Tracer,
    origin_of,
    parse_op_name,
    user_frame,
)
from shardscope._src.audit.records import Collective, Loop, Part, UnknownInstruction
from shardscope._src.base import comm as _comm
from shardscope._src.base.comm import CollectiveKind
from shardscope._src.base.errors import HloParseError
from shardscope._src.hlo.groups import (
    MAX_GROUP_IDS_PER_MODULE,
    AxisMatch,
    GroupMode,
    axes_of_groups,
    axes_of_pairs,
    parse_replica_groups,
    parse_source_target_pairs,
)
from shardscope._src.hlo.parse import (
    INT64_MAX,
    Computation,
    HloModule,
    Instruction,
    Shape,
    parse_int,
    read_int,
)

# Attributes a collective may carry that the audit understands or may ignore.
_KNOWN_COLLECTIVE_ATTRIBUTES = frozenset(
    """channel_id replica_groups use_global_device_ids to_apply metadata dimensions
    source_target_pairs backend_config constrain_layout sharding frontend_attributes
    control-predecessors split_dimension slice_sizes statistics origin
    is_cross_program_prefetch""".split()
)

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


def _loop(module: HloModule, comp: Computation, ins: Instruction) -> Loop:
    """The loop record of a ``while``: the compiler's trip count, else one read from the loop."""
    trips = known_trip_count(ins)
    if trips is not None:
        return Loop(ins.name, trips)
    trips = derived_trip_count(module, comp, ins)
    return Loop(ins.name, trips, derived=trips is not None)


class _Edge(NamedTuple):
    """A computation an instruction runs: how many times per run of the caller (``factor``,
    ``exact`` when known), the loop or conditional branch it runs in, and whether it runs
    asynchronously."""

    callee: str
    factor: int = 1
    exact: bool = True
    loop: Loop | None = None
    conditional: str | None = None
    is_async: bool = False


def _edges(ins: Instruction, loop: Loop | None = None) -> Iterator[_Edge]:
    """An edge for each computation ``ins`` runs.

    ``loop`` is the record of ``ins`` when it is a ``while`` (its trip count; None: unknown).
    """
    if ins.opcode.endswith(("-done", "-update")):
        return  # they name the computation their -start already runs (call-start, ...)
    branch = 0
    for attr, callee in ins.called_computations:
        if ins.opcode == "while":
            trips = loop.trip_count if loop is not None else None
            known = trips is not None
            # The condition runs once more than the body: the test that ends the loop.
            factor = (trips if attr == "body" else trips + 1) if trips is not None else 1
            yield _Edge(callee, factor, known, loop)
        elif ins.opcode == "conditional":
            label = f"{ins.name}[{branch}]"
            branch += 1
            yield _Edge(callee, exact=False, conditional=label)
        else:
            yield _Edge(callee, is_async=ins.opcode.endswith("-start"))


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
            for edge in _edges(ins):
                callee = edge.callee
                if callee not in comps:
                    raise HloParseError(
                        f"HLO text line {ins.line}: {ins.name} calls computation {callee!r}, "
                        f"which the module does not define"
                    )
                stack.append(callee)
    for name in reach:
        for ins in comps[name].instructions:
            for edge in _edges(ins):
                callers[edge.callee] += 1
    ctx = {name: _Context() for name in reach}
    ctx[module.entry_name] = _Context(count=1, seen=True)
    ready = [module.entry_name]
    done = 0
    while ready:
        name = ready.pop()
        done += 1
        here = ctx[name]
        for ins in comps[name].instructions:
            record = _loop(module, comps[name], ins) if ins.opcode == "while" else None
            for edge in _edges(ins, record):
                callee = edge.callee
                c = ctx[callee]
                c.count += here.count * edge.factor
                if c.count > INT64_MAX:
                    raise HloParseError(
                        f"HLO text line {ins.line}: {ins.name} makes computation {callee!r} run "
                        f"more than {INT64_MAX:,} times per program run (loop trip counts and "
                        f"calls multiply); no compiled program runs that long"
                    )
                if not c.seen:
                    c.loops = here.loops + ((edge.loop,) if edge.loop else ())
                    c.conditionals = here.conditionals + (
                        (edge.conditional,) if edge.conditional else ()
                    )
                    c.is_async = here.is_async or edge.is_async
                    c.exact = here.exact and edge.exact
                    c.seen = True
                else:
                    c.exact = c.exact and here.exact and edge.exact
                callers[callee] -= 1
                if callers[callee] == 0:
                    ready.append(callee)
    if done != len(reach):
        raise HloParseError("HLO text: the computations call each other in a cycle")
    return ctx


_SYNC_KINDS = {k.value: k for k in CollectiveKind}
_START_KINDS = {f"{k}-start": k for k in CollectiveKind}


def _collective_kind(opcode: str) -> tuple[CollectiveKind, bool] | None:
    if opcode in _SYNC_KINDS:
        return _SYNC_KINDS[opcode], False
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


def _group_mode(ins: Instruction, kind: str) -> GroupMode:
    """XLA's CollectiveOpGroupMode, from channel_id and use_global_device_ids."""
    has_channel = "channel_id" in ins.attributes
    if kind in _comm.POINT_TO_POINT:
        return GroupMode.PARTITION if has_channel else GroupMode.REPLICA
    if not has_channel:
        return GroupMode.REPLICA
    if kind in _comm.EXCHANGES:
        return GroupMode.PARTITION
    if ins.attributes.get("use_global_device_ids") == "true":
        return GroupMode.FLATTENED
    return GroupMode.REPLICA_AND_PARTITION


class _Grouping(NamedTuple):
    """Who takes part in a collective: its axes, groups (or pairs) and a note on the mode."""

    match: AxisMatch
    groups: tuple[tuple[int, ...], ...]
    pairs: tuple[tuple[int, int], ...]
    note: str

    @property
    def size(self) -> int:
        if not self.match.irregular:
            return max(self.match.group_size, 1)
        return max(len(self.groups[0]) if self.groups else 1, 1)


class _GroupMemo:
    """The groups of each printed form in one module, expanded and matched once.

    Together the forms may expand to at most ``MAX_GROUP_IDS_PER_MODULE`` device ids; each new
    form is charged the module's device count before it is expanded.
    """

    def __init__(self, module: HloModule, mesh: Mapping[str, int]) -> None:
        self.module, self.mesh = module, mesh
        self.devices = module.num_partitions * module.replica_count
        self.spent = 0
        self.done: dict[tuple[str, ...], _Grouping] = {}

    def match(self, ins: Instruction, kind: str) -> _Grouping:
        permute = kind == CollectiveKind.COLLECTIVE_PERMUTE
        attr = "source_target_pairs" if permute else "replica_groups"
        key = (str(permute), _group_mode(ins, kind), ins.attributes.get(attr, "{}"))
        found = self.done.get(key)
        if found is not None:
            return found
        if self.spent + self.devices > MAX_GROUP_IDS_PER_MODULE:
            raise HloParseError(
                f"HLO text line {ins.line}: {ins.name}: the module prints more than "
                f"{len(self.done)} forms of replica groups; at {self.devices:,} devices each "
                f"they expand to more than the {MAX_GROUP_IDS_PER_MODULE:,} device ids this "
                f"tool audits in one module (a real program prints a few forms per mesh axis)"
            )
        self.spent += self.devices
        found = self.done[key] = _match_groups(self.module, ins, kind, self.mesh)
        return found


def _match_groups(
    module: HloModule, ins: Instruction, kind: str, mesh: Mapping[str, int]
) -> _Grouping:
    p, r = module.num_partitions, module.replica_count
    mode = _group_mode(ins, kind)
    if kind == CollectiveKind.COLLECTIVE_PERMUTE:
        raw = ins.attributes.get("source_target_pairs", "{}")
        try:
            pairs = parse_source_target_pairs(raw)
        except HloParseError as e:
            raise HloParseError(f"HLO text line {ins.line}: {ins.name}: {e}") from None
        if mode == GroupMode.REPLICA and r == 1:
            return _Grouping(AxisMatch((), 1), (), pairs, "no channel_id: within one partition")
        match = axes_of_pairs(pairs, mesh)
        devices = tuple(sorted({d for pair in pairs for d in pair}))
        return _Grouping(match, (devices,), pairs, "")
    raw = ins.attributes.get("replica_groups", "{}")
    try:
        rg = parse_replica_groups(raw, max_ids=r * p)
    except HloParseError as e:
        raise HloParseError(f"HLO text line {ins.line}: {ins.name}: {e}") from None
    if r != 1:
        groups = rg.resolve(r * p if mode == GroupMode.FLATTENED else max(r, p))
        return _Grouping(
            AxisMatch((), len(groups[0]) if groups else 0, True, f"module has {r} replicas"),
            groups,
            (),
            "",
        )
    if mode == GroupMode.REPLICA:
        # Groups of replica ids, and there is one replica: each partition on its own.
        return _Grouping(AxisMatch((), 1), tuple((q,) for q in range(p)), (), "no channel_id")
    if mode == GroupMode.REPLICA_AND_PARTITION:
        groups = (tuple(range(p)),)
    else:
        groups = rg.resolve(p)
    return _Grouping(axes_of_groups(groups, mesh), groups, (), "")


def _scaled(shape: Any, dim: int, n: int) -> Any:

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
    """The line of the nearest producer with metadata (for collectives without their own):
    its first frame in the user's code, else its innermost frame (a library's line)."""
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
        own = user_frame(module.stack(src.metadata.stack_frame_id))
        where = str(own) if own is not None else _source(module, src)
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
    groups = _GroupMemo(module, mesh)
    collectives: list[Collective] = []
    unknown: list[UnknownInstruction] = []
    for comp in module.computations.values():
        ctx = contexts.get(comp.name)
        if ctx is None:
            continue  # never called from ENTRY
        tracer = Tracer(module, comp)
        for ins in comp.instructions:
            if not ins.known:
                unknown.append(UnknownInstruction(ins.name, ins.opcode, comp.name, ins.raw))
                continue
            kk = _collective_kind(ins.opcode)
            if kk is None:
                continue
            kind, is_start = kk
            collectives.extend(_records(module, comp, ins, kind, is_start, ctx, groups, tracer))
    if not _differentiated(module):
        collectives = [_forward(c) for c in collectives]
    return tuple(collectives), tuple(unknown)


def _differentiated(module: HloModule) -> bool:
    """Whether the program takes a gradient: some op_name holds a ``jvp(`` or ``transpose(``
    (without one every operation is the forward pass; with one, an operation outside both is
    neither pass, e.g. the optimizer's update)."""
    for comp in module.computations.values():
        for ins in comp.instructions:
            name = ins.metadata.op_name or ""
            if "jvp(" in name or "transpose(" in name:
                return True
    return False


def _forward(c: Collective) -> Collective:
    """``c`` with its phase, and its parts', the forward pass (a program without gradients)."""
    parts = tuple(replace(p, phase=p.phase or FORWARD) for p in c.parts)
    return replace(c, phase=c.phase or FORWARD, parts=parts)


def _reduction(module: HloModule, ins: Instruction, kind: str) -> str | None:
    if kind not in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
        return None
    for attr, callee in ins.called_computations:
        if attr == "to_apply" and callee in module.computations:
            root = module.computations[callee].root
            return root.opcode if root is not None else None
    return None


def _operand_arrays(
    kind: str, is_start: bool, ins: Instruction, operand_shapes: list[Any], i: int, n: int
) -> list[Any]:
    """The arrays operand ``i`` adds to the payload ``S`` (as ``shardscope.comm`` defines it):
    an all-gather's result (the operand scaled by the group for a ``-start``); for a ragged
    all-to-all, and a permute in its in-place form (``slice_sizes``: input, output buffer and
    offsets), the input alone; else the operand: every array of a combined collective (a
    permute of ``(s32[16,2], f32[16,2])`` moves both)."""
    leaves = list(operand_shapes[i].leaves())
    if kind == CollectiveKind.ALL_GATHER:
        if is_start:
            dims = ins.attributes.get("dimensions", "{0}").strip("{}").split(",")
            d = (read_int(dims[0]) or 0) if dims else 0
            return [_scaled(leaf, d, n) for leaf in leaves]
        result = ins.shape.tuple_shapes
        if result is None:
            return list(ins.shape.leaves())
        return list(result[i].leaves()) if i < len(result) else []
    in_place = kind == CollectiveKind.COLLECTIVE_PERMUTE and "slice_sizes" in ins.attributes
    if kind == CollectiveKind.RAGGED_ALL_TO_ALL or in_place:
        return leaves[:1] if i == 0 else []
    return leaves


def _bytes_of(arrays: list[Any], ins: Instruction) -> int:
    sizes = [a.byte_size for a in arrays]
    if any(s is None for s in sizes):
        unknown = sorted({a.dtype for a, s in zip(arrays, sizes, strict=True) if s is None})
        raise HloParseError(
            f"HLO text line {ins.line}: {ins.name} moves an element type this tool does not "
            f"know ({', '.join(unknown)})"
        )
    return sum(s for s in sizes if s is not None)


def _concatenated(module: HloModule, comp: Computation, name: str) -> list[tuple[str, Any]]:
    """``[(value, shape)]`` of the arrays concatenated into ``name`` (an all-reduce operand
    the combiner built by concatenating gradients), or ``[]`` when it is not one."""
    ins = comp.by_name.get(name)
    while ins is not None and ins.opcode in ("bitcast", "copy") and ins.operands:
        ins = comp.by_name.get(ins.operands[0])
    if ins is None:
        return []
    if ins.opcode == "concatenate":
        return [(op, comp.by_name[op].shape) for op in ins.operands if op in comp.by_name]
    if ins.opcode != "fusion":
        return []
    callee = next((c for a, c in ins.called_computations if a == "calls"), None)
    fused = module.computations.get(callee or "")
    root = fused.root if fused is not None else None
    if fused is None or root is None or root.opcode != "concatenate":
        return []
    out = []
    for op in root.operands:
        param = fused.by_name.get(op)
        index = read_int(param.literal or "") if param is not None else None
        if param is None or param.opcode != "parameter" or index is None:
            return []
        if index >= len(ins.operands):
            return []
        out.append((ins.operands[index], param.shape))
    return out


def _dtype_of(arrays: list[Any]) -> str:
    """The element type the arrays share; ``"mixed"`` when they differ, ``""`` for none."""
    dtypes = sorted({a.dtype for a in arrays if a.dtype})
    return dtypes[0] if len(dtypes) == 1 else ("mixed" if dtypes else "")


def _part(
    traffic_kind: str,
    n_traffic: int,
    operand: int,
    piece: int | None,
    arrays: list[Any],
    payload: int,
    origin: Origin | None,
) -> Part:
    info = parse_op_name(origin.op_name if origin is not None else None)
    return Part(
        operand=operand,
        piece=piece,
        dtype=_dtype_of(arrays),
        shape=tuple(arrays[0].dims) if arrays else (),
        payload_bytes=payload,
        traffic_bytes=_comm.traffic_bytes(traffic_kind, payload, n_traffic),
        op_name=origin.op_name if origin is not None else None,
        source=origin.source if origin is not None else None,
        user_source=origin.user_source if origin is not None else None,
        stack=tuple(str(loc) for loc in origin.stack) if origin is not None else (),
        scope=info.scope,
        phase=info.phase,
    )


@dataclass(frozen=True)
class _How:
    """How one record of a collective instruction moves its data: its ``kind``, whether the
    instruction is a ``-start``, and the kind it is ``carried_as`` (an all-gather carried out
    as an all-reduce of zero-padded shards), which prices its traffic."""

    kind: CollectiveKind
    is_start: bool
    carried_as: CollectiveKind | None = None

    @property
    def traffic_kind(self) -> CollectiveKind:
        return self.carried_as or self.kind


def _records(
    module: HloModule,
    comp: Computation,
    ins: Instruction,
    kind: CollectiveKind,
    is_start: bool,
    ctx: _Context,
    groups: _GroupMemo,
    tracer: Tracer,
) -> list[Collective]:
    """The records of one collective instruction: one, or two for an all-reduce that carries
    both all-gathers (zero-padded shards, :mod:`~shardscope._src.audit.decomposed`) and sums."""
    grouping = groups.match(ins, kind)
    reduction = _reduction(module, ins, kind)
    shards: list[ShardInBuffer | None] = [None] * len(ins.operands)
    if (
        kind == CollectiveKind.ALL_REDUCE
        and reduction in ("add", "or")
        and not grouping.match.irregular
    ):
        shards = [shard_in_zeros(module, comp, op, grouping.size) for op in ins.operands]
    gathered = [i for i, sh in enumerate(shards) if sh is not None]
    summed = [i for i, sh in enumerate(shards) if sh is None]

    def record(
        kind: CollectiveKind, operands: list[int], carried_as: CollectiveKind | None, note: str
    ) -> Collective:
        return _record(
            module, comp, ins, _How(kind, is_start, carried_as), ctx, grouping,
            reduction if carried_as is None else None, operands, note, tracer,
        )  # fmt: skip

    if not gathered:
        return [record(kind, summed, None, "")]
    out = [
        record(
            CollectiveKind.ALL_GATHER,
            gathered,
            CollectiveKind.ALL_REDUCE,
            "carried out as an all-reduce (sum) of zero-padded shards: the result of an "
            "all-gather, sending an all-reduce's bytes (twice an all-gather's)",
        )
    ]
    if summed:
        note = f"shares all-reduce {ins.name} with {len(gathered)} gathered array(s)"
        out.append(record(kind, summed, None, note))
    return out


def _origin(
    tracer: Tracer, ins: Instruction, i: int, own: Origin | None, gathers: bool
) -> Origin | None:
    """Where operand ``i`` of collective ``ins`` comes from: its producer for a reduction, its
    first user for a gather (the weight is named where it is used), else the other way. A
    combined permute's part is named by its own result (the element the compiler kept the
    permute's metadata on), or failing that by an origin with a Python line (a program
    argument is named, not placed). An all-to-all's operands are the pieces of the arrays
    one exchange sends (XLA splits an array's all-to-all into one operand per peer, and
    combines no two of them): each is named by the instruction's own metadata, where the
    exchange was called, not where its buffer was built."""
    if own is not None and (len(ins.operands) == 1 or ins.opcode == CollectiveKind.ALL_TO_ALL):
        return own
    index = i if ins.shape.is_tuple else None
    produced = tracer.producer_origin(ins.operands[i])
    if gathers:
        return tracer.user_origin(ins.name, index) or produced or own
    if ins.opcode.startswith(CollectiveKind.COLLECTIVE_PERMUTE):
        used = tracer.user_origin(ins.name, index, own_elements=True)
        found = [o for o in (used, produced) if o is not None]
        return next((o for o in found if o.stack), found[0] if found else own)
    return produced or tracer.user_origin(ins.name, index) or own


def _record(
    module: HloModule,
    comp: Computation,
    ins: Instruction,
    how: _How,
    ctx: _Context,
    grouping: _Grouping,
    reduction: str | None,
    operands: list[int],
    extra_note: str,
    tracer: Tracer,
) -> Collective:
    """One record of ``ins`` over ``operands``, moved as ``how`` says."""
    kind = how.kind
    match, groups, pairs, mode_note = grouping
    n = grouping.size
    note = ""
    if kind == CollectiveKind.RAGGED_ALL_TO_ALL:
        note = "ragged: sizes known only at run time; the input buffer bounds the payload"
    own = origin_of(module, ins)
    arrays, parts = _arrays_and_parts(module, comp, ins, how, grouping, operands, tracer, own)
    payload = _bytes_of(arrays, ins) * _scale(kind, n)
    traffic = _comm.traffic_bytes(how.traffic_kind, payload, _traffic_size(kind, grouping))
    channel = ins.attributes.get("channel_id")
    source = _source(module, ins)
    md = ins.metadata
    if own is not None:
        info = parse_op_name(own.op_name)
        scope, phase, user = info.scope, info.phase, own.user_source
        stack = tuple(str(loc) for loc in own.stack)
    else:
        scope, phase, user, stack = _agreed(parts)
    return Collective(
        kind=kind,
        name=ins.name,
        computation=comp.name,
        axes=match.axes,
        group_size=n,
        dtype=_dtype_of(arrays),
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
        is_async=how.is_start or ctx.is_async,
        reduction=reduction,
        channel_id=None if channel is None else parse_int(channel, "channel_id", ins.line, ins.raw),
        replica_groups=ins.attributes.get(
            "source_target_pairs"
            if kind == CollectiveKind.COLLECTIVE_PERMUTE
            else "replica_groups",
            "{}",
        ),
        unknown_attributes={
            k: v for k, v in ins.attributes.items() if k not in _KNOWN_COLLECTIVE_ATTRIBUTES
        },
        note="; ".join(x for x in (note, extra_note, mode_note) if x),
        stack=stack,
        user_source=user,
        scope=scope,
        phase=phase,
        carried_as=how.carried_as,
        parts=tuple(parts),
    )


def _traffic_size(kind: str, grouping: _Grouping) -> int:
    """The group size that prices a collective's traffic: a permute that moves data is a
    pair of devices."""
    if kind == CollectiveKind.COLLECTIVE_PERMUTE:
        return 2 if any(a != b for a, b in grouping.pairs) else 1
    return grouping.size


def _scale(kind: str, n: int) -> int:
    """An all-to-all's operand is one of the ``n`` pieces its payload counts."""
    return n if kind in _comm.EXCHANGES else 1


def _arrays_and_parts(
    module: HloModule,
    comp: Computation,
    ins: Instruction,
    how: _How,
    grouping: _Grouping,
    operands: list[int],
    tracer: Tracer,
    own: Origin | None,
) -> tuple[list[Any], list[Part]]:
    """The arrays ``ins`` moves for ``operands``, and a part for each operand (for each piece
    of an operand concatenated from several arrays, one)."""
    kind, is_start, carried_as = how.kind, how.is_start, how.carried_as
    n = grouping.size
    traffic_kind = how.traffic_kind
    n_traffic = _traffic_size(kind, grouping)
    scale = _scale(kind, n)
    operand_shapes = _operand_shapes(comp, ins)
    arrays: list[Any] = []
    parts: list[Part] = []
    for i in operands:
        if carried_as is not None:
            op_arrays = list(operand_shapes[i].leaves())  # the zero-padded buffer
        else:
            op_arrays = _operand_arrays(kind, is_start, ins, operand_shapes, i, n)
        if not op_arrays:
            continue
        arrays.extend(op_arrays)
        pieces = (
            _concatenated(module, comp, ins.operands[i])
            if len(ins.operands) == 1
            and kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
            else []
        )
        if len(pieces) > 1:
            for j, (value, shape) in enumerate(pieces):
                origin = tracer.producer_origin(value) or own
                payload = _bytes_of([shape], ins) * scale
                parts.append(_part(traffic_kind, n_traffic, i, j, [shape], payload, origin))
            continue
        origin = _origin(tracer, ins, i, own, gathers=kind == CollectiveKind.ALL_GATHER)
        payload = _bytes_of(op_arrays, ins) * scale
        parts.append(_part(traffic_kind, n_traffic, i, None, op_arrays, payload, origin))
    return arrays, parts


def _agreed(parts: list[Part]) -> tuple[str, str | None, str | None, tuple[str, ...]]:
    """(scope, phase, user source, stack) of a collective without metadata of its own (a
    combiner's), from its parts: the scope they all sit in (the common prefix of their scope
    paths), their phase when they share one, and the user's line and stack of the first part
    that has one (what the CPU compiler keeps on a combined instruction: its first part's)."""
    if not parts:
        return "", None, None, ()
    paths = [p.scope.split("/") if p.scope else [] for p in parts]
    common: list[str] = []
    for names in zip(*paths, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    phases = {p.phase for p in parts}
    named = next((p for p in parts if p.user_source), parts[0])
    return (
        "/".join(common),
        next(iter(phases)) if len(phases) == 1 else None,
        named.user_source,
        named.stack,
    )
