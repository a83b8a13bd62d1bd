"""The audit's records: one :class:`Collective` per collective instruction, inside an
:class:`Audit`, with loop, rematerialization and unknown-instruction notes. Plain data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from shardscope._src.audit.overlap import Exposure, Overlap
from shardscope._src.audit.ragged import RaggedDots
from shardscope._src.base import comm as _comm
from shardscope._src.base.comm import Totals, format_bytes, group_totals
from shardscope._src.base.display import View, show
from shardscope._src.base.errors import RecordError, ShardscopeError, is_int
from shardscope._src.base.records import Record, field_of, int_tuple, json_value, record_dict
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.hlo.groups import AxisRef, groups_of_axes
from shardscope._src.hlo.parse import HloModule
from shardscope._src.mesh import format_mesh_spec
from shardscope._src.sharding.rules import UnusedRules

if TYPE_CHECKING:
    import jax


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _str_tuple(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class Loop:
    """A ``while`` loop around a collective: its instruction and trip count (None: unknown).

    ``derived`` is True when the compiler recorded no count and the audit read it from the
    loop's condition, induction variable and initial state.
    """

    name: str
    trip_count: int | None
    derived: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Loop:
        """The loop :func:`~shardscope._src.base.records.record_dict` wrote."""
        trips = field_of(data, "trip_count", "a loop")
        return cls(
            str(field_of(data, "name", "a loop")),
            None if trips is None else int(trips),
            bool(data.get("derived", False)),
        )


@dataclass(frozen=True)
class Part(Record):
    """One array a collective moves, with where it came from.

    A combined collective (the compiler merges several into one: a tuple of operands, or one
    operand concatenated from several arrays) has one part per array; a plain one has one.

    Attributes:
        operand: the operand's position in the instruction; ``piece`` the array's position
            inside a concatenated operand (None when the operand is not one).
        dtype, shape: the array as the payload counts it (see :class:`Collective`).
        payload_bytes, traffic_bytes: this array's share of the collective's.
        op_name, source, user_source, stack, scope, phase: as on :class:`Collective`, from
            the instruction that produces (reductions, permutes) or first uses (gathers) the
            array; None or empty when no instruction near it carries metadata.
    """

    operand: int
    piece: int | None
    dtype: str
    shape: tuple[int, ...]
    payload_bytes: int
    traffic_bytes: int
    op_name: str | None = None
    source: str | None = None
    user_source: str | None = None
    stack: tuple[str, ...] = field(default=(), repr=False)
    scope: str = ""
    phase: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Part:
        """The part :meth:`to_dict` wrote."""
        piece = field_of(data, "piece", "a collective's part")
        return cls(
            operand=int(field_of(data, "operand", "a collective's part")),
            piece=None if piece is None else int(piece),
            dtype=str(field_of(data, "dtype", "a collective's part")),
            shape=int_tuple(field_of(data, "shape", "a collective's part")),
            payload_bytes=int(field_of(data, "payload_bytes", "a collective's part")),
            traffic_bytes=int(field_of(data, "traffic_bytes", "a collective's part")),
            op_name=_opt_str(data.get("op_name")),
            source=_opt_str(data.get("source")),
            user_source=_opt_str(data.get("user_source")),
            stack=_str_tuple(data.get("stack", ())),
            scope=str(data.get("scope", "")),
            phase=_opt_str(data.get("phase")),
        )


@dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled program.

    Attributes:
        kind: a :class:`~shardscope._src.base.comm.CollectiveKind`: ``all-reduce``,
            ``all-gather``, ``reduce-scatter``, ``all-to-all``, ``ragged-all-to-all``,
            ``collective-permute`` or ``collective-broadcast``.
        name: the HLO instruction (the ``-start`` one of an async pair).
        computation: the HLO computation holding it.
        axes: the user's mesh axes it runs over, in mesh order, as labels; a sub-axis reads
            ``'name:(pre)size'`` (:attr:`axis_refs` has them as
            :class:`~shardscope._src.hlo.groups.AxisRef`). Empty when each group is a single
            device or when irregular.
        group_size: devices in one replica group (for a permute: along its axes).
        irregular: the groups match no set of mesh axes; ``groups`` holds them, ``reason`` why.
        groups: the replica groups as partition ids (for a permute: the pairs' devices), in
            the compiler's order; the JSON spells them out only where the axes do not name
            them in that order (:meth:`to_dict`).
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
        stack: the Python call stack of ``source``, innermost first (``file:line``), from
            the module's StackFrames table.
        user_source: the innermost frame of that stack outside installed packages and the
            JAX ecosystem's libraries (jax, flax, equinox, optax, haiku, ...): the user's
            own line, where ``source`` may name a library layer.
        scope: the named scopes and module paths of its ``op_name`` joined by ``/``
            (``"Model/block_1/Dense_0"``); ``""`` when it has none.
        phase: ``"forward"`` or ``"backward"`` (transposed) in a differentiated program,
            None there outside differentiation (an optimizer update) or when unknown;
            ``"forward"`` throughout a program without gradients.
        carried_as: the opcode the compiler used when it differs from ``kind``: an
            all-gather carried out as an ``"all-reduce"`` of zero-padded shards. Its bytes are
            then those of what is sent (an all-reduce's).
        parts: the arrays it moves, each with its own origin (:class:`Part`). For a
            collective without metadata of its own (a combiner's), ``scope`` is the scope
            all its parts sit in, ``phase`` theirs when they share one, and ``user_source``
            and ``stack`` its first part's that has a user line (as the CPU compiler keeps
            its first part's metadata on a combined instruction).
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
    stack: tuple[str, ...] = field(default=(), repr=False)
    user_source: str | None = None
    scope: str = ""
    phase: str | None = None
    carried_as: str | None = None
    parts: tuple[Part, ...] = field(default=(), repr=False)
    overlap: Overlap | None = None

    @property
    def totals(self) -> Totals:
        """Executions, payload and bytes sent over all ``count`` executions."""
        return Totals(self.count, self.payload_bytes * self.count, self.traffic_bytes * self.count)

    @property
    def axis_refs(self) -> tuple[AxisRef, ...]:
        """:attr:`axes` as references to (sub-)axes of the mesh."""
        return tuple(AxisRef.parse(a) for a in self.axes)

    @property
    def axes_label(self) -> str:
        """``"dp,mp"``; ``"irregular"``; ``"-"`` when no data leaves a device."""
        if self.irregular:
            return "irregular"
        return ",".join(self.axes) if self.axes else "-"

    def named_groups(self, mesh_axes: Mapping[str, int] | None) -> tuple[tuple[int, ...], ...]:
        """The replica groups a regular collective's axes name over a mesh of ``mesh_axes``
        (:func:`~shardscope._src.hlo.groups.groups_of_axes`; a permute's: the devices of its
        pairs), what a JSON ``null`` reads back as; ``()`` when irregular, without a mesh or
        where the axes name none."""
        if self.irregular or mesh_axes is None:
            return ()
        if self.kind == _comm.CollectiveKind.COLLECTIVE_PERMUTE:
            return (tuple(sorted({d for pair in self.pairs for d in pair})),)
        return groups_of_axes(self.axes, mesh_axes) or ()

    def to_dict(self, mesh_axes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """JSON-ready plain data. The replica groups are spelled out where
        :meth:`from_dict`, given the same ``mesh_axes``, would not read them back from the
        axes (:meth:`named_groups`): always when irregular, and when the compiler printed a
        regular collective's groups in another order; else they are ``null``."""
        named = not self.irregular and self.groups == self.named_groups(mesh_axes)
        return {
            **record_dict(self),
            "groups": None if named else json_value(self.groups),
            "pairs": json_value(self.pairs) or None,
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], mesh_axes: Mapping[str, int] | None = None
    ) -> Collective:
        """The collective :meth:`to_dict` wrote, given the same ``mesh_axes``: replica
        groups written ``null`` read back as those its axes name over that mesh
        (:meth:`named_groups`; ``()`` without one)."""
        what = f"collective {data.get('name', '?')!r}" if isinstance(data, Mapping) else ""

        def need(key: str) -> Any:
            return field_of(data, key, what or "a collective")

        channel = data.get("channel_id")
        read = cls(
            kind=str(need("kind")),
            name=str(need("name")),
            computation=str(need("computation")),
            axes=_str_tuple(need("axes")),
            group_size=int(need("group_size")),
            dtype=str(need("dtype")),
            shape=int_tuple(need("shape")),
            payload_bytes=int(need("payload_bytes")),
            traffic_bytes=int(need("traffic_bytes")),
            count=int(need("count")),
            count_exact=bool(data.get("count_exact", True)),
            irregular=bool(data.get("irregular", False)),
            reason=str(data.get("reason", "")),
            groups=tuple(int_tuple(g) for g in data.get("groups") or ()),
            pairs=tuple((int(a), int(b)) for a, b in data.get("pairs") or ()),
            shapes=tuple(int_tuple(x) for x in data.get("shapes", ())),
            loops=tuple(Loop.from_dict(x) for x in data.get("loops", ())),
            conditionals=_str_tuple(data.get("conditionals", ())),
            op_name=_opt_str(data.get("op_name")),
            source=_opt_str(data.get("source")),
            operand_source=_opt_str(data.get("operand_source")),
            is_async=bool(data.get("is_async", False)),
            reduction=_opt_str(data.get("reduction")),
            channel_id=None if channel is None else int(channel),
            replica_groups=str(data.get("replica_groups", "")),
            unknown_attributes={
                str(k): str(v) for k, v in (data.get("unknown_attributes") or {}).items()
            },
            note=str(data.get("note", "")),
            stack=_str_tuple(data.get("stack", ())),
            user_source=_opt_str(data.get("user_source")),
            scope=str(data.get("scope", "")),
            phase=_opt_str(data.get("phase")),
            carried_as=_opt_str(data.get("carried_as")),
            parts=tuple(Part.from_dict(x) for x in data.get("parts", ())),
            overlap=None if data.get("overlap") is None else Overlap.from_dict(data["overlap"]),
        )
        if data.get("groups") is None:
            read = replace(read, groups=read.named_groups(mesh_axes))
        return read


@dataclass(frozen=True)
class ScopeTotals(Record):
    """What the collectives of one scope send over one set of axes with one kind.

    ``count`` is executions per run (a combined collective counts once for each scope it
    carries arrays of); the bytes are the scope's own arrays' share. ``phases`` lists the
    passes they run in (``forward``, ``backward``) and ``sources`` the user's lines.
    """

    scope: str
    kind: str
    axes: str
    count: int
    payload_bytes: int
    traffic_bytes: int
    phases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def totals(self) -> Totals:
        return Totals(self.count, self.payload_bytes, self.traffic_bytes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScopeTotals:
        """The row :meth:`to_dict` wrote."""

        def need(key: str) -> Any:
            return field_of(data, key, "a per-scope totals entry")

        return cls(
            str(need("scope")),
            str(need("kind")),
            str(need("axes")),
            int(need("count")),
            int(need("payload_bytes")),
            int(need("traffic_bytes")),
            _str_tuple(data.get("phases", ())),
            _str_tuple(data.get("sources", ())),
        )


@dataclass(frozen=True)
class KindTotals(Record):
    """What the collectives of one kind over one set of axes send, over a run."""

    axes: str
    kind: str
    count: int
    payload_bytes: int
    traffic_bytes: int

    @property
    def totals(self) -> Totals:
        return Totals(self.count, self.payload_bytes, self.traffic_bytes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KindTotals:
        """The row :meth:`to_dict` wrote."""

        def need(key: str) -> Any:
            return field_of(data, key, "a totals entry")

        return cls(
            str(need("axes")),
            str(need("kind")),
            int(need("count")),
            int(need("payload_bytes")),
            int(need("traffic_bytes")),
        )


@dataclass(frozen=True)
class AuditTotals:
    """An audit's sums, the part of its JSON a diff reads: per (axes, kind) and, when the
    audit wrote them (``None`` otherwise), per (scope, axes, kind); and what they were
    compiled for, where the audit says: its mesh (``mesh``, ``"data=2,model=4"``) and its
    target (``target``: the compile target, else the backend), so that a diff can tell two
    programs from one program changed."""

    module_name: str
    totals: tuple[KindTotals, ...]
    by_scope: tuple[ScopeTotals, ...] | None
    mesh: str | None = None
    target: str | None = None

    @classmethod
    def of(cls, audit: Audit) -> AuditTotals:
        return cls(
            audit.module_name,
            audit.kind_totals(),
            tuple(audit.by_scope()),
            format_mesh_spec(audit.mesh_axes),
            audit.target or audit.backend,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AuditTotals:
        """The sums in an audit's JSON (:meth:`Audit.to_dict`)."""
        rows = field_of(data, "totals", "an audit")
        scoped = data.get("by_scope")
        axes = data.get("mesh_axes")
        target = data.get("target") or data.get("backend")
        return cls(
            str(data.get("module", "")),
            tuple(KindTotals.from_dict(r) for r in rows),
            None if scoped is None else tuple(ScopeTotals.from_dict(r) for r in scoped),
            format_mesh_spec(axes) if isinstance(axes, Mapping) and axes else None,
            target if isinstance(target, str) else None,
        )


@dataclass(frozen=True)
class Rematerialization:
    """The SPMD partitioner's "Involuntary full rematerialization": replicate, then slice.

    ``message`` is the log line it was read from, for display: neither written to JSON nor
    compared.
    """

    instruction: str | None
    from_sharding: str | None
    to_sharding: str | None
    op_name: str | None
    source: str | None
    message: str = field(repr=False, default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, omit=("message",))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rematerialization:
        """The rematerialization :meth:`to_dict` wrote (without its log line)."""
        what = "a rematerialization"

        def read(key: str) -> str | None:
            return _opt_str(field_of(data, key, what))

        return cls(
            instruction=read("instruction"),
            from_sharding=read("from_sharding"),
            to_sharding=read("to_sharding"),
            op_name=read("op_name"),
            source=read("source"),
        )


@dataclass(frozen=True)
class MemoryPressure(Record):
    """The compiler's rematerialization pass could not bring the program under the memory
    it had: ``limit_bytes`` it aimed for, ``reached_bytes`` it got to, from
    ``original_bytes`` (XLA's "Can't reduce memory use below ..." log line)."""

    limit_bytes: int
    reached_bytes: int
    original_bytes: int

    def sentence(self, compiler: str = "the") -> str:
        """The compiler's word in a sentence (``compiler`` names it: ``"the XLA:GPU"``)."""
        return (
            f"{compiler} compiler could not bring the program under "
            f"{format_bytes(self.limit_bytes)} per device by rematerialization: it needs "
            f"{format_bytes(self.reached_bytes)} (from {format_bytes(self.original_bytes)})"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryPressure:
        what = "a memory pressure record"
        return cls(
            int(field_of(data, "limit_bytes", what)),
            int(field_of(data, "reached_bytes", what)),
            int(field_of(data, "original_bytes", what)),
        )


@dataclass(frozen=True)
class UnknownInstruction(Record):
    """An instruction whose opcode this tool does not know, kept with its raw text."""

    name: str
    opcode: str
    computation: str
    raw: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnknownInstruction:
        """The instruction :meth:`to_dict` wrote."""
        what = "an unknown instruction"
        return cls(
            *(str(field_of(data, k, what)) for k in ("name", "opcode", "computation", "raw"))
        )


@dataclass(frozen=True)
class AuditedProgram:
    """The live objects an audit was read from: the optimized HLO text, its parsed module
    and, when the audit compiled or was given one, the ``jax.stages.Compiled``.

    They travel beside the :class:`Audit` (``audit.program``), not inside its data: they are
    not compared, written to JSON or pickled.
    """

    hlo_text: str
    module: HloModule = field(repr=False)
    compiled: jax.stages.Compiled | None = field(default=None, repr=False)


class ExpectCheck(NamedTuple):
    """One check of :meth:`Audit.expect`: what it checks, the expected and the actual value
    as text, whether it holds; ``kind`` for a count's check."""

    check: str
    expected: str
    actual: str
    ok: bool
    kind: str | None = None


@dataclass(frozen=True)
class Audit:
    """What one compiled program communicates. Plain data; renderers live elsewhere.

    ``memory`` is per device (``compiled.memory_analysis()``, bytes), ``flops`` per device
    (``compiled.cost_analysis()``); both None for HLO text. ``rematerializations`` is None
    when the audit did not compile the program itself and so could not see the
    partitioner's log. ``execution_threads`` names the threads other than the main one that
    some of its computations run on (the TPU's ``sparsecore``): they are read like the
    others, and their collectives counted. ``backend`` is the platform of the devices the
    program was compiled for: ``"cpu"``, ``"gpu"`` (a CUDA or ROCm GPU, or a GPU target's
    compile-only devices) or ``"tpu"``; ``target`` is the compile target's name (``"h100"``,
    ``"cpu"``) when shardscope knows its devices. Both are None for HLO text.

    ``hlo_flops`` and ``hlo_bytes`` are what one run of the program computes and moves per
    device, counted from its HLO (:mod:`~shardscope._src.hlo.cost`: the FLOPs of its matrix
    products, the bytes its instructions read and write in device memory): every compiler
    alike, the GPU's too, which reports no ``flops``. Each collective's ``overlap`` prices one
    execution on the hardware of ``priced_on`` (the compile target's preset) and says how
    much of it the compute the compiler scheduled beside it hides
    (:mod:`~shardscope._src.audit.overlap`); None where the audit has no hardware to price on
    (the CPU backend, HLO text). ``memory_pressure`` is the compiler's word, when it logged it,
    that rematerialization could not bring the program under the memory it had.
    ``ragged_dots`` are the program's ``jax.lax.ragged_dot`` calls that its compiler computes
    as dense matmuls over every group (:mod:`~shardscope._src.audit.ragged`), read from the
    function's trace: None where there are none, and for a program the audit did not lower
    itself (a ``Lowered`` or ``Compiled``, HLO text, a function without ``trace``).
    ``unused_rules`` are the rules in force that shard a logical name no array of the program
    carries (:func:`~shardscope._src.audit.compile.audit_program` of a program with rules):
    they change nothing; None where there are none or no rules.
    ``widened_dtype`` is the 16-bit type of a program whose compiler moved its collectives
    as float32 (XLA:CPU runs 16-bit arithmetic in float32): the collectives' bytes are the
    float32 it sends, twice what a compiler that keeps 16 bits sends
    (:func:`~shardscope._src.audit.width.widened_dtype`); None where none were widened.

    The fields are plain data (compared, written by :meth:`to_dict`, read back by
    :meth:`from_dict`). What the audit was read from, the HLO text, its parsed module and
    the ``jax.stages.Compiled``, is :attr:`program` (also :attr:`hlo_text`, :attr:`module`
    and :attr:`compiled`), kept beside the fields: an audit read from JSON, unpickled or
    copied with ``dataclasses.replace`` has none.
    """

    collectives: tuple[Collective, ...]
    mesh_axes: Mapping[str, int]
    num_partitions: int
    module_name: str
    memory: CompiledMemory | None = None
    flops: float | None = None
    in_shardings: tuple[str, ...] | None = None
    out_shardings: tuple[str, ...] | None = None
    rematerializations: tuple[Rematerialization, ...] | None = None
    unknown_instructions: tuple[UnknownInstruction, ...] = ()
    execution_threads: tuple[str, ...] = ()
    backend: str | None = None
    target: str | None = None
    hlo_flops: int | None = None
    hlo_bytes: int | None = None
    priced_on: str | None = None
    memory_pressure: MemoryPressure | None = None
    ragged_dots: RaggedDots | None = None
    unused_rules: UnusedRules | None = None
    widened_dtype: str | None = None

    def __post_init__(self) -> None:
        # A memory dict by XLA's field names (what earlier versions held) stands for the record.
        if self.memory is not None:
            object.__setattr__(self, "memory", CompiledMemory.from_dict(self.memory))

    def with_program(self, program: AuditedProgram) -> Audit:
        """This audit, holding ``program`` as what it was read from (returns ``self``)."""
        object.__setattr__(self, "_program", program)
        return self

    @property
    def program(self) -> AuditedProgram | None:
        """What the audit was read from (None for an audit read from JSON or unpickled)."""
        program: AuditedProgram | None = self.__dict__.get("_program")
        return program

    @property
    def compiled(self) -> jax.stages.Compiled | None:
        """The ``jax.stages.Compiled`` audited (None for HLO text)."""
        return None if self.program is None else self.program.compiled

    @property
    def module(self) -> HloModule | None:
        """The parsed optimized HLO module."""
        return None if self.program is None else self.program.module

    @property
    def hlo_text(self) -> str:
        """The optimized HLO text (``""`` when the audit has no :attr:`program`)."""
        return "" if self.program is None else self.program.hlo_text

    def __getstate__(self) -> dict[str, Any]:
        # A Compiled cannot be pickled, and the record is its fields.
        return {k: v for k, v in self.__dict__.items() if k != "_program"}

    def counts(self) -> dict[str, int]:
        """``{kind: executions per run}`` for every collective kind (zeros included)."""
        out: dict[str, int] = dict.fromkeys(_comm.KINDS, 0)
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.count
        return out

    def totals(self) -> dict[tuple[str, str], Totals]:
        """``{(axes label, kind): Totals}`` in table order (mesh axes, then kinds)."""
        return group_totals(
            self.sorted_collectives(), lambda c: (c.axes_label, c.kind), lambda c: c.totals
        )

    def kind_totals(self) -> tuple[KindTotals, ...]:
        """:meth:`totals` as rows."""
        return tuple(
            KindTotals(axes, kind, t.count, t.payload_bytes, t.traffic_bytes)
            for (axes, kind), t in self.totals().items()
        )

    def totals_by_axis(self) -> dict[str, Totals]:
        """``{axes label: Totals}``; a collective over ``dp,mp`` is its own label."""
        return group_totals(self.totals().items(), lambda kt: kt[0][0], lambda kt: kt[1])

    def exposure(self) -> Exposure | None:
        """The program's communication seconds per run on :attr:`priced_on`'s hardware, and
        how much of them the compute scheduled beside them hides (None: not priced)."""
        if self.priced_on is None:
            return None
        out = Exposure(0.0, 0.0, 0.0)
        for c in self.collectives:
            if c.overlap is not None:
                out += Exposure.of(c.overlap, c.count)
        return out

    def exposure_by_scope(self) -> dict[str, Exposure]:
        """:meth:`exposure` per scope (``""``: outside any), the most exposed first (empty:
        not priced). As :meth:`by_scope` counts each array of a combined collective toward its
        own scope, a combined collective's time goes to its arrays' scopes by their share of
        its bytes (its time is its bytes' time, and the latency they share)."""
        out: dict[str, Exposure] = {}
        for c in self.collectives:
            if c.overlap is None:
                continue
            here = Exposure.of(c.overlap, c.count)
            sent = sum(p.traffic_bytes for p in c.parts)
            shares: dict[str, float] = {}
            for p in c.parts if sent else ():
                shares[p.scope] = shares.get(p.scope, 0.0) + p.traffic_bytes / sent
            for scope, share in (shares or {c.scope: 1.0}).items():
                out[scope] = out.get(scope, Exposure(0.0, 0.0, 0.0)) + here.scaled(share)
        return dict(sorted(out.items(), key=lambda kv: -kv[1].exposed_s))

    def by_scope(self) -> list[ScopeTotals]:
        """Totals per scope (named scope or module path), axes and kind.

        Each array of a combined collective counts toward its own scope, so two layers'
        gradients reduced in one all-reduce appear under both layers. Rows are in scope
        order, then mesh axes, then kind; ``""`` is the scope of operations outside any.
        """
        acc: dict[tuple[str, str, str], list[Any]] = {}
        order: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        for c in self.sorted_collectives():
            parts = c.parts or (
                Part(
                    0,
                    None,
                    c.dtype,
                    c.shape,
                    c.payload_bytes,
                    c.traffic_bytes,
                    c.op_name,
                    c.source,
                    c.user_source,
                    c.stack,
                    c.scope,
                    c.phase,
                ),
            )
            counted: set[tuple[str, str, str]] = set()
            for p in parts:
                key = (p.scope, c.axes_label, c.kind)
                row = acc.setdefault(key, [0, 0, 0, [], []])
                order.setdefault(key, (p.scope, self._order(c)[:5]))
                if key not in counted:
                    row[0] += c.count
                    counted.add(key)
                row[1] += p.payload_bytes * c.count
                row[2] += p.traffic_bytes * c.count
                if p.phase and p.phase not in row[3]:
                    row[3].append(p.phase)
                where = p.user_source or p.source
                if where and where not in row[4]:
                    row[4].append(where)
        passes = ("forward", "backward")
        return [
            ScopeTotals(
                key[0],
                key[2],
                key[1],
                r[0],
                r[1],
                r[2],
                tuple(sorted(r[3], key=lambda p: passes.index(p) if p in passes else 2)),
                tuple(r[4]),
            )  # fmt: skip
            for key, r in sorted(acc.items(), key=lambda kv: order[kv[0]])
        ]

    def total(self) -> Totals:
        return sum((c.totals for c in self.collectives), Totals())

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
            if any(ref.name == axis for ref in c.axis_refs)
        )

    @property
    def exact(self) -> bool:
        """True when every count is exact (no unknown trip counts, no conditional branches)."""
        return all(c.count_exact for c in self.collectives)

    def _order(self, c: Collective) -> tuple[Any, ...]:
        names = list(self.mesh_axes)

        def axis_rank(ref: AxisRef) -> int:
            return names.index(ref.name) if ref.name in names else len(names)

        return (
            c.irregular,
            not c.axes,
            tuple(axis_rank(ref) for ref in c.axis_refs),
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
        bytes_per_axis: Mapping[str, int | str] | None = None,
        traffic_bytes: int | str | None = None,
        **counts: int,
    ) -> Audit:
        """Checks budgets; raises ``AssertionError`` with a table of what differed.

        Args:
            **counts: exact executions per run of a kind, named with underscores:
                ``all_gather=0, all_reduce=2``. Kinds not named are not checked.
            bytes_per_axis: ``{axis: budget}``: the bytes each device sends over collectives
                that run over that axis (alone or with others) must not exceed the budget.
            traffic_bytes: budget for the bytes each device sends in all.

        A budget is bytes (``1048576``) or a size with its unit (``"1MiB"``, ``"500KB"``), as
        :func:`shardscope.diff_audits` reads ``max_bytes_increase``.

        Returns ``self``, so checks chain.

        >>> from shardscope import audit
        >>> from shardscope._src.sharding.demos import taster_matmul
        >>> result = audit(taster_matmul("model=8"))
        >>> result.expect(all_gather=0, all_reduce=1, bytes_per_axis={"model": 2**20}).exact
        True
        """
        rows = [
            *self._count_rows(counts),
            *self._budget_rows(bytes_per_axis or {}, traffic_bytes),
        ]
        if all(r.ok for r in rows):
            return self
        raise AssertionError(self._differences(rows))

    def _count_rows(self, counts: Mapping[str, int]) -> list[ExpectCheck]:
        """The check of each kind's count :meth:`expect` is given."""
        rows = []
        actual = self.counts()
        for key, want in counts.items():
            kind = key.replace("_", "-")
            if kind not in _comm.KINDS:
                valid = ", ".join(k.replace("-", "_") for k in _comm.KINDS)
                raise TypeError(f"expect() got an unexpected keyword {key!r}; kinds are {valid}")
            if not is_int(want, 0):
                raise ShardscopeError(f"expect({key}=...) needs a count >= 0, got {want!r}")
            ok = actual[kind] == want
            rows.append(ExpectCheck(f"{kind} count", str(want), str(actual[kind]), ok, kind))
        return rows

    def _budget_rows(
        self, bytes_per_axis: Mapping[str, int | str], traffic_bytes: int | str | None
    ) -> list[ExpectCheck]:
        """The check of each byte budget :meth:`expect` is given."""
        rows = []
        for axis, given in bytes_per_axis.items():
            budget = _byte_budget(given, f"bytes_per_axis[{axis!r}]", "bytes_per_axis")
            got = self.axis_traffic(axis)
            rows.append(
                ExpectCheck(
                    f"bytes/device over {axis!r}",
                    f"<= {format_bytes(budget)}",
                    format_bytes(got),
                    got <= budget,
                )
            )
        if traffic_bytes is not None:
            budget = _byte_budget(traffic_bytes, "traffic_bytes", "traffic_bytes")
            got = self.total().traffic_bytes
            rows.append(
                ExpectCheck(
                    "bytes/device in all",
                    f"<= {format_bytes(budget)}",
                    format_bytes(got),
                    got <= budget,
                )
            )
        return rows

    def _differences(self, rows: list[ExpectCheck]) -> str:
        """The table of :meth:`expect`'s checks, and the collectives of the kinds that differ
        (drawn by the audit's renderer, found only when a check fails)."""
        text: str = show(self, View.EXPECTATIONS, rows)
        return text

    # rich and notebooks look these up on the object itself; the renderers are found when
    # the audit is shown, so that the audit floor never loads rich.
    def __rich__(self) -> Any:
        return show(self, View.RICH)

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        bundle: dict[str, str] = show(self, View.NOTEBOOK)
        return bundle

    def __str__(self) -> str:
        """The audit's table as plain text, what ``print(audit)`` shows (``repr`` keeps the
        fields)."""
        text: str = show(self, View.TEXT)
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data (:meth:`from_dict` reads it back as an equal audit)."""
        return {
            **record_dict(
                self,
                keys={"module_name": "module"},
                omit=("collectives",),
                extra=("counts", "exact", "total", "by_scope", "exposure"),
            ),
            "totals": json_value(self.kind_totals()),
            # The long list last, so that a reader of the file sees the summary first; in the
            # audit's own order, which from_dict keeps (the tables sort it).
            "collectives": [c.to_dict(self.mesh_axes) for c in self.collectives],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Audit:
        """The audit :meth:`to_dict` wrote (what ``shardscope audit --json`` writes, whose
        header and other keys it ignores), equal to the one that wrote it. The sums
        (``counts``, ``totals``, ...) are computed again from the collectives; it has no
        :attr:`program`. A file of an earlier version, which wrote no regular collective's
        replica groups, reads them back as its axes name them.

        Raises:
            RecordError: ``data`` lacks a field of an audit or holds one of another type.
        """

        def need(key: str) -> Any:
            return field_of(data, key, "an audit")

        def read(key: str, convert: Callable[[Any], Any], *, required: bool = False) -> Any:
            """``data[key]`` converted (None where an optional field is absent or null)."""
            value = need(key) if required else data.get(key)
            if value is None and not required:
                return None
            try:
                return convert(value)
            except (TypeError, ValueError, AttributeError, KeyError) as e:
                shown = repr(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise RecordError(
                    f"an audit's {key!r} field holds {shown}, which does not read as one "
                    f"({type(e).__name__}: {e}); write it again with this shardscope"
                ) from None

        mesh_axes = read(
            "mesh_axes", lambda v: {str(k): int(n) for k, n in v.items()}, required=True
        )
        return cls(
            collectives=read(
                "collectives",
                lambda v: tuple(Collective.from_dict(c, mesh_axes) for c in v),
                required=True,
            ),
            mesh_axes=mesh_axes,
            num_partitions=read("num_partitions", int, required=True),
            module_name=read("module", str, required=True),
            memory=read("memory", CompiledMemory.from_dict),
            flops=read("flops", float),
            in_shardings=read("in_shardings", _str_tuple),
            out_shardings=read("out_shardings", _str_tuple),
            rematerializations=read(
                "rematerializations", lambda v: tuple(Rematerialization.from_dict(r) for r in v)
            ),
            unknown_instructions=read(
                "unknown_instructions", lambda v: tuple(UnknownInstruction.from_dict(u) for u in v)
            )
            or (),
            execution_threads=read("execution_threads", _str_tuple) or (),
            backend=read("backend", _opt_str),
            target=read("target", _opt_str),
            hlo_flops=read("hlo_flops", _opt_int),
            hlo_bytes=read("hlo_bytes", _opt_int),
            priced_on=read("priced_on", _opt_str),
            memory_pressure=read("memory_pressure", MemoryPressure.from_dict),
            ragged_dots=read("ragged_dots", RaggedDots.from_dict),
            unused_rules=read("unused_rules", UnusedRules.from_dict),
            widened_dtype=read("widened_dtype", _opt_str),
        )


def _byte_budget(value: int | str, what: str, param: str) -> float:
    """The bytes a budget :meth:`Audit.expect` is given allows: bytes or a size, read as
    :func:`~shardscope._src.base.comm.parse_budget` reads a diff's; a percentage is refused
    (there is no earlier total to take it of)."""
    amount, percent = _comm.parse_budget(value, what=what, param=param)
    if percent:
        raise ShardscopeError(
            f"{what} {value!r}: a percentage needs an earlier total to be a share of; give "
            f"bytes or a size such as 1MiB, or compare with a baseline "
            f"(expect_collectives(..., baseline=..., max_bytes_increase={value!r}))",
            param=param,
        )
    return amount


def _kind_rank(kind: str) -> int:
    return _comm.KINDS.index(kind) if kind in _comm.KINDS else len(_comm.KINDS)
