"""A lower bound on communication as plain data: :class:`Term` records (kind, axes, group
size, payload, count), whose traffic comes from the audit's formulas
(:func:`~shardscope._src.base.comm.traffic_bytes`), so a bound and an audit are measured in
the same units."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardscope._src.base.comm import Totals, group_totals, traffic_bytes
from shardscope._src.base.notes import Note, NoteKind
from shardscope._src.base.records import record_dict


class TermRole(StrEnum):
    """What a term's collective is for. Code (the planner's schedule and its validations)
    reads the role; people read :attr:`Term.what`."""

    #: tensor or sequence parallel activations (or their gradients) of a layer, per pass
    ACTIVATION = "activation"
    #: a weight's shards gathered where it is used (FSDP), per pass
    WEIGHT_GATHER = "weight-gather"
    #: a gradient reduce-scattered to its shards as the backward produces it (FSDP, ZeRO-2)
    GRADIENT_SCATTER = "gradient-scatter"
    #: a gradient summed over the axes that shard the tokens; accumulated, once per step
    GRADIENT_SUM = "gradient-sum"
    #: the updated shards of a weight gathered after the optimizer (ZeRO), once per step
    UPDATE_GATHER = "update-gather"
    #: the scalar loss summed over the axes that shard the tokens, once per step
    LOSS_SUM = "loss-sum"
    #: a matmul operand (A or B) moved to the layout the local product needs
    OPERAND_RESHARD = "operand-reshard"
    #: a matmul product's partial sums reduced, or the product moved to its output layout
    PRODUCT_RESHARD = "product-reshard"

    @property
    def once_per_step(self) -> bool:
        """Whether a train step runs it once, however many micro-batches it has."""
        return self in (TermRole.GRADIENT_SUM, TermRole.UPDATE_GATHER, TermRole.LOSS_SUM)

    @property
    def sums_token_shards(self) -> bool:
        """Whether it sums a value over the axes that shard the tokens (gradients, loss):
        what a jit program with gradient accumulation repeats per micro-batch."""
        return self in (TermRole.GRADIENT_SUM, TermRole.LOSS_SUM)


@dataclass(frozen=True)
class Term:
    """One collective a program needs: ``count`` executions of ``kind`` over ``axes``.

    ``payload_bytes`` is the full logical array of one execution, as the audit defines it
    (all-reduce operand, all-gather result, reduce-scatter operand, all-to-all whole array).
    ``role`` says what it is for; ``what`` says it in words, for people. ``rerun`` names
    the pass a step runs it again in (``"recomputed forward"``, ``"again for the
    backward"``), ``""`` for the pass the bound counts it in. ``stack`` names the layers
    whose weight it moves (``"layers"``, ``"moe_layers"``; ``""``: a weight of no layer, or
    no weight). ``once_per_node`` is ``(experts, top_k)`` for an all-to-all that sends each
    token once to each device of its experts, which across nodes goes once to each node
    (DeepEP's; priced by :func:`~shardscope._src.cost.links.exchange_bandwidth`), with the
    routing's group limit after them where it has one (``(experts, top_k, groups,
    groups_per_token)``), ``()`` for every other collective.
    """

    kind: str
    axes: tuple[str, ...]
    group_size: int
    payload_bytes: int
    count: int
    what: str
    scope: str = ""
    role: TermRole = field(kw_only=True)
    rerun: str = field(default="", kw_only=True)
    stack: str = field(default="", kw_only=True)
    once_per_node: tuple[int, ...] = field(default=(), kw_only=True)

    @property
    def traffic_bytes(self) -> int:
        """Bytes one device sends over all ``count`` executions."""
        return self.count * traffic_bytes(self.kind, self.payload_bytes, self.group_size)

    @property
    def totals(self) -> Totals:
        """Executions, payload and bytes sent over all ``count`` executions."""
        return Totals(self.count, self.payload_bytes * self.count, self.traffic_bytes)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, extra=("traffic_bytes",))


class BoundNote(NoteKind):
    """What a bound notes (its :class:`~shardscope._src.base.notes.Note` kinds)."""

    #: the FSDP bound keeps the gathered weights for the backward pass
    FSDP_KEEPS_GATHERED = "fsdp-keeps-gathered"
    #: how one mesh axis serves a matmul (values: ``axis``, ``partition``: ``"m"``, ``"n"``,
    #: ``"k"`` or None, ``steps``: what each of its collectives does)
    AXIS_SCHEDULE = "axis-schedule"
    #: the bound is what top-k routing sends (each expert's slots its even share of the
    #: tokens), and the program pads the slots by a capacity factor above 1, sending the
    #: padding too (values: ``capacity_factor``)
    CAPACITY_PADDED = "capacity-padded"

    @property
    def whole(self) -> bool:
        # The padding note says why a ratio above 1 is the capacity factor's: cut, it does not.
        return self is BoundNote.CAPACITY_PADDED

    def describe(self, values: Mapping[str, Any]) -> str:
        if self is BoundNote.FSDP_KEEPS_GATHERED:
            return (
                "FSDP bound keeps gathered weights for the backward pass; ZeRO-3 as "
                "published gathers them again (1.5x data parallel)"
            )
        if self is BoundNote.CAPACITY_PADDED:
            cf = values["capacity_factor"]
            return (
                f"capacity factor {cf:g} pads each expert's slots to {cf:g}x its even share "
                f"of the tokens, and the all-to-alls send the padded slots too; the bound is "
                f"what top-k routing sends (capacity factor 1), so the all-to-alls' ratio "
                f"above 1 is the padding's"
            )
        what = {
            "m": "rows of C (m)",
            "n": "columns of C (n)",
            "k": "the contraction (k)",
            None: "nothing: every device computes all of C",
        }[values["partition"]]
        steps = "; ".join(values["steps"]) or "no communication"
        return f"axis {values['axis']}: split {what}; {steps}"


@dataclass(frozen=True)
class Bound:
    """The minimum communication of a program: a list of terms, with totals."""

    label: str
    terms: tuple[Term, ...]
    notes: tuple[Note, ...] = ()

    @property
    def traffic_bytes(self) -> int:
        return sum(t.traffic_bytes for t in self.terms)

    def by_axes_kind(self) -> dict[tuple[tuple[str, ...], str], int]:
        """``{(axes, kind): traffic bytes}``."""
        return {k: v.traffic_bytes for k, v in self.totals_by_axes_kind().items()}

    def totals_by_axes_kind(self) -> dict[tuple[tuple[str, ...], str], Totals]:
        """``{(axes, kind): Totals}``, in the order of the terms."""
        return group_totals(self.terms, lambda t: (t.axes, t.kind), lambda t: t.totals)

    def counts(self) -> dict[str, int]:
        """``{kind: executions per run}``."""
        out: dict[str, int] = {}
        for t in self.terms:
            out[t.kind] = out.get(t.kind, 0) + t.count
        return out

    def payload_bytes(self, kind: str | None = None) -> int:
        """Sum of payload x count, optionally of one kind."""
        return sum(t.payload_bytes * t.count for t in self.terms if kind in (None, t.kind))

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, extra=("traffic_bytes", "counts")),
            "by_axes_kind": [
                {"axes": list(axes), "kind": kind, "traffic_bytes": b}
                for (axes, kind), b in self.by_axes_kind().items()
            ],
        }
