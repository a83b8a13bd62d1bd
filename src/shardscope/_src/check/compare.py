"""The verdict's comparison, pure: an :class:`~shardscope._src.audit.records.Audit` and a
:class:`~shardscope._src.bounds.terms.Bound` in, a :class:`Verdict` out (rows per mesh axes and
kind, the ratio, and the instructions that exceed the bound with their source lines), and the
records it is made of. Bytes stand against the bound by the rule of
:mod:`~shardscope._src.check.bound`. Nothing here compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardscope._src.audit.records import Audit, Collective
from shardscope._src.audit.width import Width, widened_words
from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    Totals,
    format_bytes,
    group_totals,
    ratio,
)
from shardscope._src.base.notes import Note, NoteKind
from shardscope._src.base.records import record_dict
from shardscope._src.bounds.terms import Bound, Term
from shardscope._src.check.bound import TOLERANCE, Standing, standing, within_bound
from shardscope._src.targets.capabilities import (
    Capabilities,
    compiler_capabilities,
    reduce_scatter_words,
)

_MAX_EXCESS = 8  # instructions listed per verdict


@dataclass(frozen=True)
class Row:
    """Bound and compiled traffic of one (mesh axes, collective kind) pair."""

    axes: tuple[str, ...]
    kind: str
    bound_bytes: int
    actual_bytes: int
    bound_count: int
    actual_count: int

    @property
    def ratio(self) -> float | None:
        return ratio(self.actual_bytes, self.bound_bytes)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, extra=("ratio",))


class ExcessCause(StrEnum):
    """Why a compiled collective is beyond the bound; :attr:`Excess.reason` says it in words."""

    #: an all-gather of a weight the strategy keeps sharded (activations were not constrained)
    WEIGHT_GATHERED = "weight-gathered"
    #: an all-reduce where the bound has a reduce-scatter over the same axes
    ALL_REDUCE_FOR_REDUCE_SCATTER = "all-reduce-for-reduce-scatter"
    #: an all-reduce over some of the axes of an array the bound sums in one all-reduce over
    #: more axes (a norm gain's gradient summed over one axis, then another)
    ALL_REDUCE_SPLIT = "all-reduce-split"
    #: an all-gather of a whole operand where the bound has an all-to-all over the same axes
    ALL_GATHER_FOR_ALL_TO_ALL = "all-gather-for-all-to-all"
    #: a collective over axes and of a kind the bound does not have at all
    NOT_IN_BOUND = "not-in-bound"
    #: more of a collective than the bound's terms of that axes and kind
    BEYOND_BOUND = "beyond-bound"


@dataclass(frozen=True)
class Excess:
    """A compiled collective in a (axes, kind) pair that sends more than the bound allows.

    ``source`` is the instruction's own source line; without one, ``operand_source`` is the
    line of its input (the collective comes after it), as in the audit's
    :class:`~shardscope._src.audit.records.Collective`.
    ``cause`` says why; ``weight`` names the weight a :attr:`~ExcessCause.WEIGHT_GATHERED`
    gather moves, ``whole_axes`` the axes of the bound's one all-reduce that an
    :attr:`~ExcessCause.ALL_REDUCE_SPLIT` splits, ``row_bound_bytes`` and ``row_actual_bytes``
    are its (axes, kind) row's.
    """

    kind: str
    axes: tuple[str, ...]
    instruction: str
    source: str | None
    operand_source: str | None
    op_name: str | None
    scope: str | None
    array: str
    count: int
    traffic_bytes: int
    cause: ExcessCause
    weight: str | None = None
    whole_axes: tuple[str, ...] = ()
    row_bound_bytes: int = 0
    row_actual_bytes: int = 0
    compiler: Capabilities | None = field(default=None, repr=False)

    @property
    def reason(self) -> str:
        """The cause in words."""
        kind, where = self.kind, ",".join(self.axes) or "no axis"
        match self.cause:
            case ExcessCause.WEIGHT_GATHERED:
                return (
                    f"all-gather over {where} of {self.weight}, which the strategy keeps "
                    f"sharded: without activation constraints the partitioner gathers weights "
                    f"instead of activations"
                )
            case ExcessCause.ALL_REDUCE_FOR_REDUCE_SCATTER:
                head = f"all-reduce over {where} where a reduce-scatter suffices (2x the bytes"
                c = self.compiler
                if c is None:
                    return head + ")"
                if c.may_all_reduce_for_reduce_scatter:
                    return f"{head}; {c.reduce_scatter_words})"
                return f"{head}; {c.reduce_scatter_words}, so the program asks for this one)"
            case ExcessCause.ALL_REDUCE_SPLIT:
                return (
                    f"all-reduce over {where} of an array the minimum sums in one all-reduce "
                    f"over {','.join(self.whole_axes)}: summed one axis group at a time, it "
                    f"sends more"
                )
            case ExcessCause.ALL_GATHER_FOR_ALL_TO_ALL:
                return (
                    f"all-gather over {where} of a whole operand where an all-to-all of it suffices"
                )
            case ExcessCause.NOT_IN_BOUND:
                return f"{kind} over {where}, which the minimum does not need"
        return (
            f"{kind} over {where} beyond the minimum ({format_bytes(self.row_actual_bytes)} "
            f"sent where {format_bytes(self.row_bound_bytes)} suffice)"
        )

    def to_dict(self) -> dict[str, Any]:
        return record_dict(
            self,
            omit=("weight", "whole_axes", "row_bound_bytes", "row_actual_bytes", "compiler"),
            extra=("reason",),
        )


@dataclass(frozen=True)
class Hint:
    """A concrete change, compiled: the traffic it was measured to send."""

    change: str
    code: str
    traffic_bytes: int
    bound_bytes: int
    counts: dict[str, int] = field(default_factory=dict)
    backend_bytes: int | None = None

    @property
    def ratio(self) -> float | None:
        return ratio(self.traffic_bytes, self.bound_bytes)

    @property
    def reaches_bound(self) -> bool:
        """Whether the change's traffic does not exceed the bound (:func:`within_bound`)."""
        return within_bound(self.traffic_bytes, self.bound_bytes)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, omit=("bound_bytes",), extra=("ratio", "reaches_bound"))


class VerdictNote(NoteKind):
    """What a verdict notes (its :class:`~shardscope._src.base.notes.Note` kinds)."""

    #: the compiler widened a 16-bit program's collectives to f32 (values: ``dtype``,
    #: ``backend_bytes``, what this backend's program sends per device, ``compiler``)
    WIDENED = "widened"
    #: some collective counts are not exact (unknown loop trip counts or branches)
    INEXACT = "inexact"
    #: no hint reached the bound because the compiler does not dependably form a
    #: reduce-scatter under jit (values: ``compiler``, ``forms``: its ``Support``)
    NO_REDUCE_SCATTER_FORMED = "no-reduce-scatter-formed"
    #: the former name (and, read back, value) of :attr:`NO_REDUCE_SCATTER_FORMED`
    NO_REDUCE_SCATTER_ON_CPU = "no-reduce-scatter-formed"
    #: the program sends less than the minimum by more than the tolerance (values:
    #: ``tolerance``)
    BELOW_BOUND = "below-bound"
    #: the byte minimum duplicates the matmul's compute (values: ``flops_per_device``,
    #: ``split_flops_per_device``, ``split_bytes`` and ``split_ratio`` of the cheapest
    #: schedule that keeps the compute split)
    DUPLICATED_COMPUTE = "duplicated-compute"
    #: the strategy's shard_map twin was not tried as a hint: it dispatches by capacity and
    #: the mixture of experts is dropless (values: ``strategy``)
    NO_TWIN_FOR_DROPLESS = "no-twin-for-dropless"

    @classmethod
    def _missing_(cls, value: object) -> VerdictNote | None:
        # Values written by earlier versions, read back.
        return cls.NO_REDUCE_SCATTER_FORMED if value == "no-reduce-scatter-on-cpu" else None

    @property
    def whole(self) -> bool:
        # The widened note says why the verdict's bytes (at the program's width) differ from
        # the audit's table above it (at the width the compiler sent): cut, it explains nothing.
        return self is VerdictNote.WIDENED

    def describe(self, values: Mapping[str, Any]) -> str:
        match self:
            case VerdictNote.WIDENED:
                dtype = values["dtype"]
                compiler = values.get("compiler") or "the compiler"
                return (
                    f"{widened_words(compiler, dtype)}; this verdict counts its collectives at "
                    f"{dtype} width, as a compiler that keeps {dtype} sends them, where the "
                    f"audit's table of collectives counts the float32 sent: this compiled "
                    f"program sends {format_bytes(values['backend_bytes'])} per device"
                )
            case VerdictNote.INEXACT:
                return "some counts are not exact (unknown loop trip counts or branches)"
            case VerdictNote.NO_REDUCE_SCATTER_FORMED:
                words = reduce_scatter_words(values["compiler"], values["forms"])
                return (
                    f"no hint verified on this backend: {words}, so only an explicit "
                    f"psum_scatter in shard_map is sure to reach the bound"
                )
            case VerdictNote.NO_TWIN_FOR_DROPLESS:
                return (
                    f"no shard_map hint: the shard_map twin of {values['strategy']!r} "
                    f"dispatches by capacity and this mixture of experts is dropless "
                    f"(capacity_factor=None); give the config a capacity_factor (1.0 drops "
                    f"nothing under balanced routing) to compile and compare the twin"
                )
            case VerdictNote.BELOW_BOUND:
                return (
                    f"the program sends less than the minimum, by more than "
                    f"{values['tolerance']:.0%}: the bound counts traffic this program does "
                    f"without (check its dtype, shardings and mode against the program's)"
                )
        ratio = values["split_ratio"]
        shown = "n/a" if ratio is None else f"{ratio:.2f}x"
        return (
            f"the minimum's schedule has every device compute all of C "
            f"({values['flops_per_device']:,} flops per device instead of "
            f"{values['split_flops_per_device']:,}); against the cheapest schedule that keeps "
            f"the compute split ({format_bytes(values['split_bytes'])}) the program is at {shown}"
        )


@dataclass(frozen=True)
class Verdict:
    """Audit against bound: totals, the ratio, per-pair rows, what exceeds, verified hints."""

    label: str
    bound_bytes: int
    actual_bytes: int
    rows: tuple[Row, ...]
    excess: tuple[Excess, ...] = ()
    hints: tuple[Hint, ...] = ()
    notes: tuple[Note, ...] = ()
    bound_notes: tuple[Note, ...] = ()
    backend_bytes: int | None = None

    @property
    def ratio(self) -> float | None:
        """``actual / bound`` (1.0 when both are 0; None when only the bound is 0)."""
        return ratio(self.actual_bytes, self.bound_bytes)

    @property
    def standing(self) -> Standing:
        """Where the program's bytes stand against the bound (:func:`standing`)."""
        return standing(self.actual_bytes, self.bound_bytes)

    @property
    def optimal(self) -> bool:
        """Whether the program does not exceed the bound (it matches or undercuts it)."""
        return within_bound(self.actual_bytes, self.bound_bytes)

    def replace(self, **changes: Any) -> Verdict:
        return dataclasses.replace(self, **changes)

    def with_note(self, note: Note | None) -> Verdict:
        """This verdict with ``note`` added (itself when ``note`` is None)."""
        return self if note is None else self.replace(notes=(*self.notes, note))

    def summary(self) -> str:
        """One line: the ratio and what it means."""
        ratio = self.ratio
        if ratio is None:
            head = f"{format_bytes(self.actual_bytes)} sent per device where the minimum is none"
        else:
            head = (
                f"{ratio:.2f}x the minimum: {format_bytes(self.actual_bytes)} sent per "
                f"device, bound {format_bytes(self.bound_bytes)}"
            )
        if self.optimal:
            return f"optimal ({head})"
        best = min(self.hints, key=lambda h: h.traffic_bytes, default=None)
        if best is not None and best.traffic_bytes < self.actual_bytes:
            tail = f"; best verified hint: {best.change} -> {format_bytes(best.traffic_bytes)}"
            return f"exceeds the bound ({head}){tail}"
        return f"exceeds the bound ({head})"

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, extra=("ratio", "optimal", "summary")),
            "tolerance": TOLERANCE,
        }


def _scope(op_name: str | None) -> str | None:
    if not op_name:
        return None
    for scope in ("attention", "mlp"):
        if f"/{scope}/" in op_name or op_name.endswith(f"/{scope}"):
            return scope
    return None


def _whole_all_reduce(c: Collective, width: Width, terms: tuple[Term, ...]) -> tuple[str, ...]:
    """The axes of the bound's one all-reduce, over more axes than ``c``'s, of each array
    ``c`` sums (``()`` unless the bound has one for every operand of ``c``)."""
    if c.kind != ALL_REDUCE or not c.payload_bytes:
        return ()
    payload = width.payload(c)
    pieces = [p.payload_bytes * payload // c.payload_bytes for p in c.parts] or [payload]
    axes = set(c.axes)
    whole: tuple[str, ...] = ()
    for piece in pieces:
        over = next(
            (
                t.axes
                for t in terms
                if t.kind == ALL_REDUCE and t.payload_bytes == piece and axes < set(t.axes)
            ),
            None,
        )
        if over is None:
            return ()
        whole = whole or tuple(over)
    return whole


def _cause(
    c: Collective,
    bound_kinds: set[str],
    row: Row,
    known: dict[tuple[int, ...], str],
    whole_axes: tuple[str, ...],
) -> ExcessCause:
    if c.kind == ALL_GATHER and tuple(c.shape) in known:
        return ExcessCause.WEIGHT_GATHERED
    if whole_axes:
        return ExcessCause.ALL_REDUCE_SPLIT
    if c.kind == ALL_REDUCE and REDUCE_SCATTER in bound_kinds:
        return ExcessCause.ALL_REDUCE_FOR_REDUCE_SCATTER
    if c.kind == ALL_GATHER and ALL_TO_ALL in bound_kinds:
        return ExcessCause.ALL_GATHER_FOR_ALL_TO_ALL
    if row.bound_bytes == 0:
        return ExcessCause.NOT_IN_BOUND
    return ExcessCause.BEYOND_BOUND


def compare(
    audit: Audit,
    bound: Bound,
    *,
    program_dtype: str | None = None,
    label: str | None = None,
    known_arrays: dict[tuple[int, ...], str] | None = None,
) -> Verdict:
    """The verdict of ``audit`` against ``bound``, without hints (pure, no compiling).

    In every (axes, kind) pair that exceeds the bound, each bound term claims compiled
    collectives of its payload (up to its count); what no term claims is listed as excess.
    ``known_arrays`` maps shapes to names (the model's weights) for the reasons.
    ``program_dtype`` lets the verdict see through a compiler that widens a 16-bit program's
    collectives to float32 (``Capabilities.widens_16bit``; XLA:CPU does): every byte count,
    ratio and claim is then taken at the program's width, as a compiler that keeps 16 bits
    sends them, and a note gives what this backend's program sends (``backend_bytes``).
    What the compiler does is read from the record of the one that compiled ``audit``
    (``audit.backend``).
    """
    width = Width.of(audit, program_dtype)
    caps = compiler_capabilities(audit.backend)
    actual = group_totals(
        audit.collectives,
        lambda c: (tuple(c.axes), c.kind),
        lambda c: Totals(c.count, width.payload(c) * c.count, width.sent(c)),
    )
    rows = _rows(bound.totals_by_axes_kind(), actual)
    excess = _excess(audit, bound, width, rows, known_arrays or {}, caps)
    actual_total = sum(v.traffic_bytes for v in actual.values())
    backend = audit.total().traffic_bytes
    notes = []
    if backend != actual_total:
        values = {"dtype": program_dtype, "backend_bytes": backend}
        compiler = caps.compiler if caps is not None else None
        notes.append(Note(VerdictNote.WIDENED, {**values, "compiler": compiler}))
    if not audit.exact:
        notes.append(Note(VerdictNote.INEXACT))
    if standing(actual_total, bound.traffic_bytes) is Standing.UNDERCUTS:
        notes.append(Note(VerdictNote.BELOW_BOUND, {"tolerance": TOLERANCE}))
    return Verdict(
        label=label or bound.label,
        bound_bytes=bound.traffic_bytes,
        actual_bytes=actual_total,
        rows=rows,
        excess=tuple(excess[:_MAX_EXCESS]),
        notes=tuple(notes),
        bound_notes=tuple(bound.notes),
        backend_bytes=backend,
    )


def _excess(
    audit: Audit,
    bound: Bound,
    width: Width,
    rows: tuple[Row, ...],
    known: dict[tuple[int, ...], str],
    compiler: Capabilities | None,
) -> list[Excess]:
    """The compiled collectives no bound term claims in the rows beyond their bound, largest
    first."""
    by_key = {(r.axes, r.kind): r for r in rows}
    bound_kinds: dict[tuple[str, ...], set[str]] = {}
    for t in bound.terms:
        bound_kinds.setdefault(t.axes, set()).add(t.kind)
    over = {(r.axes, r.kind) for r in rows if not within_bound(r.actual_bytes, r.bound_bytes)}
    extra_count = _unclaimed_counts(audit, bound, width, known)
    excess = []
    # Blame the largest unclaimed collectives first, and only until they account for the
    # bytes a row sends beyond its bound: a small one the bound covers (a norm gain's
    # gradient, the scalar loss) is not named beside the big one that is the excess.
    # Nor is one under 1% of its row's excess: it changes nothing the verdict says.
    left = {(r.axes, r.kind): r.actual_bytes - r.bound_bytes for r in rows}
    floor = {key: 0.01 * over_by for key, over_by in left.items()}
    for i, c in sorted(enumerate(audit.collectives), key=lambda ic: -width.sent(ic[1])):
        key = (tuple(c.axes), c.kind)
        extra = extra_count[i]
        if key not in over or c.traffic_bytes == 0 or extra == 0 or left[key] <= 0:
            continue
        if width.sent(c) < floor[key]:
            continue
        left[key] -= width.traffic(c) * extra
        whole = _whole_all_reduce(c, width, bound.terms)
        excess.append(
            Excess(
                kind=c.kind,
                axes=tuple(c.axes),
                instruction=c.name,
                source=c.source,
                operand_source=c.operand_source,
                op_name=c.op_name,
                scope=_scope(c.op_name),
                array=f"{c.dtype}[{','.join(str(d) for d in c.shape)}]",
                count=extra,
                traffic_bytes=width.traffic(c) * extra,
                cause=_cause(c, bound_kinds.get(tuple(c.axes), set()), by_key[key], known, whole),
                weight=known.get(tuple(c.shape)) if c.kind == ALL_GATHER else None,
                whole_axes=whole,
                row_bound_bytes=by_key[key].bound_bytes,
                row_actual_bytes=by_key[key].actual_bytes,
                compiler=compiler,
            )
        )
    return excess


def _rows(
    wanted: dict[tuple[tuple[str, ...], str], Totals],
    actual: dict[tuple[tuple[str, ...], str], Totals],
) -> tuple[Row, ...]:
    """One row per (axes, kind): the bound's pairs in its order, then the program's others."""
    keys = list(wanted) + [k for k in actual if k not in wanted]
    none = Totals()
    return tuple(
        Row(
            axes,
            kind,
            wanted.get((axes, kind), none).traffic_bytes,
            actual.get((axes, kind), none).traffic_bytes,
            wanted.get((axes, kind), none).count,
            actual.get((axes, kind), none).count,
        )
        for axes, kind in keys
    )


def _unclaimed_counts(
    audit: Audit, bound: Bound, width: Width, known: dict[tuple[int, ...], str]
) -> dict[int, int]:
    """How many of each compiled collective's runs (by index) no bound term claims: a term
    claims collectives of its axes, kind and payload, up to its count."""
    unclaimed: dict[tuple[tuple[str, ...], str, int], int] = {}
    for t in bound.terms:
        key3 = (t.axes, t.kind, t.payload_bytes)
        unclaimed[key3] = unclaimed.get(key3, 0) + t.count
    # Claim bound terms for collectives of known weights last: a weight gather the bound
    # does not expect may have the same size as an activation gather it does.
    extra_count: dict[int, int] = {}
    for i, c in sorted(
        enumerate(audit.collectives),
        key=lambda ic: (tuple(ic[1].shape) in known, -ic[1].traffic_bytes),
    ):
        key3 = (tuple(c.axes), c.kind, width.payload(c))
        claimed = min(unclaimed.get(key3, 0), c.count)
        unclaimed[key3] = unclaimed.get(key3, 0) - claimed
        extra_count[i] = c.count - claimed
    return extra_count


def narrowed_bytes(audit: Audit, program_dtype: str | None) -> int:
    """Bytes per device at the program's width (see :mod:`shardscope._src.audit.width`)."""
    return Width.of(audit, program_dtype).total(audit.collectives)
