"""Comparing two audits: which collectives appeared, disappeared or changed, per axes and kind.

For code review and CI: audit a program on the main branch and on a change, write both as JSON
(``Audit.to_dict()``, what ``shardscope audit --json`` writes), and diff them. Budgets turn the
difference into a pass or a fail: a cap on the growth of the bytes each device sends, and kinds
that must not appear where they were not before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardscope._src.audit.records import Audit, AuditTotals, KindTotals, ScopeTotals
from shardscope._src.base.comm import CollectiveKind, format_bytes, kind_named, parse_budget
from shardscope._src.base.display import View, show
from shardscope._src.base.errors import AuditDiffError, RecordError
from shardscope._src.base.records import SCHEMA_VERSION, read_json, record_dict
from shardscope._src.base.vocab import Vocab

#: The schema versions whose audits have today's shape (version 2 changed the notes of plans
#: and verdicts, and the keys of a verdict's excess and of the matmul's schedule; 3 a plan's
#: step keys; 4 a serving result's backend: none of which a diff reads), so a baseline written
#: before still diffs.
AUDIT_SCHEMAS = (1, 2, 3, 4)


class RowStatus(Vocab):
    """How one row of a diff moved between the two audits."""

    #: none before
    NEW = "new"
    #: none after
    GONE = "gone"
    #: count or bytes differ
    CHANGED = "changed"
    #: the same count and bytes
    SAME = "same"


@dataclass(frozen=True)
class DiffRow:
    """The collectives of one kind over one set of axes (in one scope, when the diff is by
    scope), before and after.

    ``status`` is a :class:`RowStatus`: ``"new"`` (none before), ``"gone"`` (none after),
    ``"changed"`` (count or bytes differ) or ``"same"``. Counts are executions per run; bytes
    are per device.
    """

    axes: str
    kind: str
    old_count: int
    new_count: int
    old_traffic_bytes: int
    new_traffic_bytes: int
    old_payload_bytes: int
    new_payload_bytes: int
    scope: str | None = None

    @property
    def status(self) -> RowStatus:
        if self.old_count == 0 and self.new_count > 0:
            return RowStatus.NEW
        if self.new_count == 0 and self.old_count > 0:
            return RowStatus.GONE
        if (self.old_count, self.old_traffic_bytes, self.old_payload_bytes) != (
            self.new_count,
            self.new_traffic_bytes,
            self.new_payload_bytes,
        ):
            return RowStatus.CHANGED
        return RowStatus.SAME

    @property
    def traffic_change(self) -> int:
        return self.new_traffic_bytes - self.old_traffic_bytes

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, extra=("status",))


@dataclass(frozen=True)
class AuditDiff:
    """Two audits compared. ``violations`` lists the budgets broken (empty: within budget);
    ``warnings`` what makes the comparison doubtful though no budget is broken: audits of
    different meshes or targets (two programs, not one before and after a change)."""

    old_name: str
    new_name: str
    rows: tuple[DiffRow, ...]
    violations: tuple[str, ...] = ()
    by_scope: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def changed(self) -> tuple[DiffRow, ...]:
        return tuple(r for r in self.rows if r.status != RowStatus.SAME)

    @property
    def old_traffic_bytes(self) -> int:
        return sum(r.old_traffic_bytes for r in self.rows)

    @property
    def new_traffic_bytes(self) -> int:
        return sum(r.new_traffic_bytes for r in self.rows)

    @property
    def ok(self) -> bool:
        return not self.violations

    #: A diff compares two audits and compiles nothing: its JSON names no backend.
    backend = None

    def to_dict(self) -> dict[str, Any]:
        return record_dict(
            self,
            keys={"old_name": "old", "new_name": "new"},
            extra=("old_traffic_bytes", "new_traffic_bytes", "ok"),
        )

    def text(self, *, all_rows: bool = False) -> str:
        """The changed rows (``all_rows``: every row) as a plain-text table."""
        text: str = show(self, View.TEXT, all_rows=all_rows)
        return text

    # rich looks this up on the object; the diff's renderer is found when it is shown.
    def __rich__(self) -> Any:
        return show(self, View.RICH)


#: How to give an audit to diff: the record itself, or the JSON the command line writes.
_WRITE_ONE = (
    "pass the Audit itself (shardscope.audit(...)), or write its JSON with "
    "`shardscope audit ... --json FILE`"
)


_SAME_SHARDSCOPE = (
    "audit both with the same shardscope: pass the Audits themselves (shardscope.audit(...)), "
    "or write both with `shardscope audit ... --json FILE`"
)


def _load(source: Any, what: str) -> AuditTotals:
    """The sums of an :class:`Audit`, of its ``to_dict()`` or of the JSON file at a path."""
    if isinstance(source, Audit):
        return AuditTotals.of(source)
    in_memory = isinstance(source, Mapping)
    if in_memory:
        data, name = source, str(source.get("module", what))
    elif isinstance(source, str | os.PathLike):
        name = str(source)
        data = read_json(source, f"{what} audit file", AuditDiffError, hint=_WRITE_ONE)
    else:
        raise AuditDiffError(
            f"{what}: give an Audit, its to_dict() or the path of its JSON, not "
            f"{type(source).__name__}"
        )
    if not isinstance(data, Mapping) or not isinstance(data.get("totals"), list):
        raise AuditDiffError(f'{what} {name!r} is not an audit (no "totals" list); {_WRITE_ONE}')
    # An audit's to_dict() in memory is this shardscope's; a file says which wrote it, or,
    # written from to_dict() (json.dump(audit.to_dict(), f)), is read if its fields are ours.
    version = data.get("schema_version", SCHEMA_VERSION if in_memory else None)
    readable = " or ".join(str(v) for v in AUDIT_SCHEMAS)
    if version is not None and version not in AUDIT_SCHEMAS:
        raise AuditDiffError(
            f"{what} {name!r} has schema version {version!r} but this shardscope reads audits "
            f"of version {readable}; {_SAME_SHARDSCOPE}"
        )
    try:
        sums = AuditTotals.from_dict(data)
    except (RecordError, TypeError, ValueError, AttributeError) as e:
        if version is None:
            raise AuditDiffError(
                f"{what} {name!r} has no schema_version and is not an audit this shardscope "
                f"(version {readable}) reads ({e}); {_SAME_SHARDSCOPE}"
            ) from None
        raise AuditDiffError(
            f"{what} {name!r} is not an audit this shardscope reads: {e}"
        ) from None
    read: tuple[KindTotals | ScopeTotals, ...] = (*sums.totals, *(sums.by_scope or ()))
    for row in read:
        if CollectiveKind.get(row.kind) is None:
            # a kind this shardscope does not report would read as one that came or went
            where = "by_scope" if isinstance(row, ScopeTotals) else "totals"
            raise AuditDiffError(
                f"{what} {name!r}: its {where} hold the kind {row.kind!r}, which is not a "
                f"collective kind this shardscope reports ({CollectiveKind.choices()}); "
                f"{_SAME_SHARDSCOPE}"
            )
    # A file is named by its path, a dict by its module.
    return replace(sums, module_name=name)


def _totals(
    sums: AuditTotals, by_scope: bool
) -> dict[tuple[str | None, str, str], tuple[int, int, int]]:
    """``{(scope or None, axes, kind): (count, traffic bytes, payload bytes)}``."""
    out: dict[tuple[str | None, str, str], tuple[int, int, int]] = {}
    rows: tuple[KindTotals, ...] | tuple[ScopeTotals, ...]
    if by_scope:
        if sums.by_scope is None:
            raise AuditDiffError(
                f'{sums.module_name!r} has no per-scope totals ("by_scope"); audit it again '
                f"with this shardscope, or diff it with by_scope=False",
                param="by_scope",
            )
        rows = sums.by_scope
    else:
        rows = sums.totals
    for row in rows:
        key = (row.scope if isinstance(row, ScopeTotals) else None, row.axes, row.kind)
        c, t, p = out.get(key, (0, 0, 0))
        out[key] = (c + row.count, t + row.traffic_bytes, p + row.payload_bytes)
    return out


def diff_audits(
    old: Any,
    new: Any,
    *,
    max_bytes_increase: str | int | None = None,
    no_new: Sequence[str] | str = (),
    by_scope: bool = False,
) -> AuditDiff:
    """Compares two audits per (axes, kind) and checks budgets.

    Args:
        old, new: :class:`Audit` objects, their ``to_dict()``, or paths of their JSON.
        max_bytes_increase: the most the bytes each device sends may grow, in all: bytes,
            a size (``"64MiB"``) or a percentage of the old total (``"5%"``).
        no_new: kinds (``"all-gather"`` or ``"all_gather"``, one or a sequence) whose count
            must not grow over any set of axes.
        by_scope: one row per scope (named scope or module path), axes and kind, from the
            audits' ``by_scope`` totals, so that "block 3's MLP gained an all-gather" is a row.

    Raises:
        AuditDiffError: unreadable files, not audits, or different schema versions.
    """
    named = (no_new,) if isinstance(no_new, str) else no_new
    kinds = [kind_named(k, what="no_new kind", param="no_new") for k in named]
    budget = None
    if max_bytes_increase is not None:
        budget = parse_budget(
            max_bytes_increase, what="max_bytes_increase", param="max_bytes_increase"
        )
    old_sums, new_sums = _load(old, "old"), _load(new, "new")
    a, b = _totals(old_sums, by_scope), _totals(new_sums, by_scope)
    rows = []
    order = list(a) + [k for k in b if k not in a]
    for key in order:
        oc, ot, op = a.get(key, (0, 0, 0))
        nc, nt, np_ = b.get(key, (0, 0, 0))
        rows.append(DiffRow(key[1], key[2], oc, nc, ot, nt, op, np_, scope=key[0]))
    violations = []
    old_total = sum(r.old_traffic_bytes for r in rows)
    new_total = sum(r.new_traffic_bytes for r in rows)
    if budget is not None:
        amount, percent = budget
        allowed = old_total * amount / 100 if percent else amount
        if new_total - old_total > allowed:
            shown = (
                f"{amount:g}% of {format_bytes(old_total)}"
                if percent
                else format_bytes(int(amount))
            )
            violations.append(
                f"bytes per device grew by {format_bytes(new_total - old_total)} "
                f"({format_bytes(old_total)} -> {format_bytes(new_total)}), more than the "
                f"{shown} allowed"
            )
    for kind in kinds:
        for r in rows:
            if r.kind == kind and r.new_count > r.old_count:
                where = f" in {r.scope}" if r.scope is not None else ""
                violations.append(
                    f"new {kind} over {r.axes}{where}: {r.old_count} -> {r.new_count} per run, "
                    f"where none may be new"
                )
    return AuditDiff(
        old_sums.module_name,
        new_sums.module_name,
        tuple(rows),
        tuple(violations),
        by_scope,
        _mismatches(old_sums, new_sums),
    )


def _mismatches(old: AuditTotals, new: AuditTotals) -> tuple[str, ...]:
    """What the two audits were compiled for that differs (where both say): each a line."""
    out = []
    for what, a, b in (("meshes", old.mesh, new.mesh), ("targets", old.target, new.target)):
        if a is not None and b is not None and a != b:
            out.append(
                f"the audits are of different {what} ({a} -> {b}): two programs, not one changed"
            )
    return tuple(out)
