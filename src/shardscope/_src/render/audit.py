"""Terminal rendering of an :class:`~shardscope._src.audit.records.Audit`: a rich table.

Rows are grouped by the mesh axes a collective runs over (mesh order), then by kind, with a
subtotal per group and a grand total; every row names the Python line that emitted it.
``rich`` is imported only here, when a table is drawn.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from shardscope._src.audit.records import Audit
from shardscope._src.audit.width import Width, widened_words
from shardscope._src.base.comm import CollectiveKind, format_bytes, format_seconds
from shardscope._src.base.display import View, register
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.render.brief import print_line
from shardscope._src.render.columns import Alarm, Column, rich_table, text_table
from shardscope._src.render.console import mimebundle, mimebundle_text, output_console
from shardscope._src.targets.capabilities import compiler_capabilities
from shardscope._src.targets.specs import CPU_TARGET, TARGETS

if TYPE_CHECKING:
    from shardscope._src.audit.records import Collective, ExpectCheck


def _short(where: str, *, library: bool = False) -> str:
    """``/a/b/c/d.py:12`` -> ``d.py:12``; a library file keeps its package path."""
    path, _, line = where.rpartition(":")
    if not path:
        return where
    parts = path.replace("\\", "/").split("/")
    if library:
        for i, p in enumerate(parts):
            if p in ("site-packages", "dist-packages"):
                return "/".join(parts[i + 1 :]) + f":{line}"
        return "/".join(parts[-3:]) + f":{line}"
    return f"{os.path.basename(path)}:{line}"


def _where(c: Collective, *, every: bool = True) -> str:
    """The Python line that emitted ``c`` (and the library's line it called); not
    ``every``, the user's line alone, and of a combined collective the first array's line
    and how many more."""
    lines: list[str] = []
    for p in c.parts:
        where = p.user_source or p.source
        if where and _short(where) not in lines:
            lines.append(_short(where))
    if len(lines) > 1:  # a combined collective: each array's own line
        return ", ".join(lines) if every else f"{lines[0]} +{len(lines) - 1} more"
    if c.user_source and c.source and c.user_source != c.source:
        library = f" (in {_short(c.source, library=True)})" if every else ""
        return f"{_short(c.user_source)}{library}"
    if c.source:
        return _short(c.source)
    if lines:
        return lines[0]
    if c.operand_source:
        path, _, line = c.operand_source.rpartition(":")
        return f"(after {os.path.basename(path)}:{line})"
    return "(inserted by the partitioner)"


def _array(c: Collective) -> str:
    text = f"{c.dtype}[{','.join(str(d) for d in c.shape)}]"
    return text + (f" +{len(c.shapes) - 1} more" if len(c.shapes) > 1 else "")


def _count(c: Collective) -> str:
    text = str(c.count)
    if c.loops:
        trips = " x ".join("?" if lp.trip_count is None else str(lp.trip_count) for lp in c.loops)
        text += f" (loop {trips})"
    if c.conditionals:
        text += " (in a branch)"
    return text


def _groups_text(c: Collective, limit: int = 200) -> str:
    """The first ``limit`` characters of ``{{0,1},{2,3},...}``, without printing them all."""
    parts = ["{"]
    used = 1
    for g in c.groups:
        piece = ("," if len(parts) > 1 else "") + "{" + ",".join(map(str, g[:limit])) + "}"
        parts.append(piece)
        used += len(piece)
        if used > limit:
            break
    else:
        parts.append("}")
    return "".join(parts)[:limit]


def widened_line(audit: Audit) -> str | None:
    """What the tables' bytes are where the compiler moved a 16-bit program's collectives as
    float32 (:attr:`Audit.widened_dtype`), and what a compiler that keeps 16 bits sends;
    None where it did not."""
    dtype = audit.widened_dtype
    if dtype is None:
        return None
    caps = compiler_capabilities(audit.backend)
    compiler = caps.compiler if caps is not None else "the compiler"
    narrow = format_bytes(Width(dtype).total(audit.collectives))
    return (
        f"{widened_words(compiler, dtype)}; this table counts the float32 it sends, where a "
        f"compiler that keeps {dtype} sends {narrow} per device"
    )


def _caption(*lines: str | None) -> str | None:
    return "\n".join(line for line in lines if line) or None


def audit_table(audit: Audit, *, title: str | None = None, verbose: bool = True) -> Any:
    """A ``rich.table.Table`` of the audit's collectives; not ``verbose``, a collective the
    compiler combined from several arrays names the first's source line and counts the
    rest."""
    from rich.table import Table
    from rich.text import Text

    mesh = format_mesh_spec(audit.mesh_axes)
    table = Table(
        title=title or f"Collectives of {audit.module_name} on mesh {mesh}",
        show_footer=False,
        header_style="bold",
        caption=widened_line(audit),
        caption_justify="left",
    )
    # The facts never wrap; in a narrow terminal the source and HLO name give way first.
    table.add_column("axes", no_wrap=True)
    table.add_column("kind", no_wrap=True, min_width=10)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("array", no_wrap=True)
    table.add_column("payload\n(each)", justify="right", no_wrap=True)
    table.add_column("sent per\ndevice", justify="right", no_wrap=True)
    table.add_column("source", overflow="fold", ratio=1)
    table.add_column("HLO", style="dim", overflow="fold", ratio=1)
    collectives = audit.sorted_collectives()
    if not collectives:
        table.add_row("-", "none", "0", "", "", "0 B", "", "")
    totals = audit.totals()
    previous_axes: str | None = None
    for i, c in enumerate(collectives):
        if previous_axes is not None and c.axes_label != previous_axes:
            table.add_section()
        previous_axes = c.axes_label
        axes: str | Text = c.axes_label
        if c.irregular:
            axes = Text("irregular", style="red")
        table.add_row(
            axes,
            c.kind
            + (f" (as {c.carried_as})" if c.carried_as else "")
            + (" (async)" if c.is_async else ""),
            _count(c),
            _array(c),
            format_bytes(c.payload_bytes),
            format_bytes(c.traffic_bytes * c.count),
            _where(c, every=verbose),
            c.name,
        )
        nxt = collectives[i + 1] if i + 1 < len(collectives) else None
        key = (c.axes_label, c.kind)
        group = [d for d in collectives if (d.axes_label, d.kind) == key]
        if len(group) > 1 and (nxt is None or (nxt.axes_label, nxt.kind) != key):
            t = totals[key]
            table.add_row(
                "",
                Text(f"{c.kind} total", style="italic"),
                str(t.count),
                "",
                "",
                format_bytes(t.traffic_bytes),
                "",
                "",
            )
    total = audit.total()
    table.add_section()
    table.add_row(
        Text("all", style="bold"),
        "",
        Text(str(total.count), style="bold"),
        "",
        "",
        Text(format_bytes(total.traffic_bytes), style="bold"),
        "",
        "",
    )
    return table


def scope_table(audit: Audit, *, title: str | None = None) -> Any:
    """A ``rich.table.Table`` of the audit's totals per scope (:meth:`Audit.by_scope`)."""
    from rich.table import Table

    mesh = ",".join(f"{k}={v}" for k, v in audit.mesh_axes.items())
    table = Table(
        title=f"{title}, by scope"
        if title
        else f"Collectives of {audit.module_name} on mesh {mesh}, by scope",
        header_style="bold",
        caption_justify="left",
    )
    table.add_column("scope", overflow="fold", ratio=1)
    table.add_column("axes", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("payload\n(all runs)", justify="right", no_wrap=True)
    table.add_column("sent per\ndevice", justify="right", no_wrap=True)
    table.add_column("pass", no_wrap=True)
    table.add_column("source", overflow="fold", ratio=1)
    rows = audit.by_scope()
    if not rows:
        table.add_row("-", "-", "none", "0", "", "0 B", "", "")
    previous: str | None = None
    for r in rows:
        if previous is not None and r.scope != previous:
            table.add_section()
        previous = r.scope
        table.add_row(
            r.scope or "(no scope)",
            r.axes,
            r.kind,
            str(r.count),
            format_bytes(r.payload_bytes),
            format_bytes(r.traffic_bytes),
            "+".join(r.phases) or "-",
            ", ".join(_short(s) for s in r.sources),
        )
    combined = None
    if any(c.parts and len({p.scope for p in c.parts}) > 1 for c in audit.collectives):
        combined = (
            "a collective the compiler combined from several scopes' arrays counts once in "
            "each of them, with their own bytes (audit.counts() counts it once)"
        )
    table.caption = _caption(widened_line(audit), combined)
    return table


def _window(c: Collective) -> str:
    o = c.overlap
    if o is None or not o.is_async:
        return "synchronous: nothing overlaps it"
    w = o.window
    if w is None:
        return "no window found"
    if not w.instructions:
        return Alarm("empty: nothing scheduled between start and done")
    flops = f", {_flops(w.compute.flops)}" if w.compute.flops else ""
    others = f", {w.collectives} other collectives in flight" if w.collectives else ""
    ops = f"{w.instructions} instruction{'s' if w.instructions > 1 else ''}"
    return f"{ops}{flops}, {format_bytes(w.compute.bytes)} through memory{others}"


def _flops(n: int) -> str:
    """``4194304`` -> ``'4.19 MFLOP'``."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} FLOP"


def _seconds(c: Collective, part: str) -> str:
    o = c.overlap
    return "-" if o is None else format_seconds(getattr(o, part) * c.count)


def _exposed(c: Collective) -> str:
    o = c.overlap
    text = _seconds(c, "exposed_s")
    return Alarm(text) if o is not None and o.comm_s and o.exposed_s >= 0.5 * o.comm_s else text


def _figure(header: str, value: Any) -> Column[Collective]:
    return Column(header, value, justify="right", no_wrap=True)


#: The priced collectives: their time per program run (all executions), how much of it the
#: compute the compiler scheduled beside it hides, and what that compute is.
OVERLAP_COLUMNS: tuple[Column[Collective], ...] = (
    Column("axes", lambda c: c.axes_label, no_wrap=True),
    Column("kind", lambda c: c.kind, no_wrap=True),
    _figure("count", lambda c: str(c.count)),
    _figure("time", lambda c: _seconds(c, "comm_s")),
    _figure("hidden", lambda c: _seconds(c, "hidden_s")),
    _figure("exposed", _exposed),
    Column("scheduled beside it", _window, fold=True),
    Column("HLO", lambda c: c.name, fold=True),
)


def overlap_table(audit: Audit) -> Any:
    """A rich table of the priced collectives, the most exposed first (None: not priced)."""
    exposure = audit.exposure()
    if exposure is None:
        return None
    rows = sorted(
        (c for c in audit.collectives if c.overlap is not None),
        key=lambda c: -(c.overlap.exposed_s * c.count if c.overlap else 0.0),
    )
    return rich_table(
        OVERLAP_COLUMNS,
        rows,
        title=f"Communication time on {audit.priced_on}, and what the schedule hides",
        caption=_exposure_line(audit),
    )


def _exposure_line(audit: Audit) -> str:
    e = audit.exposure()
    if e is None:
        return ""
    return (
        f"per run on {audit.priced_on}: {format_seconds(e.comm_s)} of communication, "
        f"{format_seconds(e.hidden_s)} hidden behind the compute the compiler scheduled "
        f"beside it, {format_seconds(e.exposed_s)} exposed"
    )


def audit_notes(audit: Audit) -> list[str]:
    """Lines to print under the table: rematerializations, inexact counts, unknowns."""
    notes = []
    for r in audit.rematerializations or ():
        where = r.source or "unknown line"
        notes.append(
            f"Involuntary full rematerialization at {where} ({r.op_name}): the partitioner "
            f"replicated {r.instruction} to go from {r.from_sharding} to {r.to_sharding}"
        )
    carried = [
        c.name for c in audit.sorted_collectives() if c.carried_as == CollectiveKind.ALL_REDUCE
    ]
    if carried:
        notes.append(
            f"all-gathers carried out as all-reduces of zero-padded shards ({', '.join(carried)}):"
            " each gives an all-gather's result and sends an all-reduce's bytes (twice an "
            "all-gather's); the table counts what is sent"
        )
    for c in audit.sorted_collectives():
        if c.irregular:
            notes.append(f"irregular groups of {c.name}: {c.reason}; groups {_groups_text(c)}")
    if audit.rematerializations is None:
        notes.append(
            "rematerializations not checked: the audit did not compile this program itself"
        )
    if not audit.exact:
        notes.append(
            "some counts are not exact: a loop with an unknown trip count (counted once) or a "
            "conditional branch (counted as if taken)"
        )
    for thread in audit.execution_threads:
        notes.append(
            f"computations on the {thread!r} execution thread were read with the rest "
            f"(their collectives are counted)"
        )
    for u in audit.unknown_instructions:
        notes.append(f"unknown instruction {u.opcode} ({u.name}): {u.raw[:120]}")
    if audit.memory_pressure is not None:
        notes.append(audit.memory_pressure.sentence())
    if audit.unused_rules is not None:
        notes.append(audit.unused_rules.sentence())
    # An audit of simulated devices names the CPU's target, or none.
    compiler = CPU_TARGET if audit.target is None else TARGETS.get(audit.target)
    if audit.ragged_dots is not None:
        notes.append(
            audit.ragged_dots.sentence(
                "XLA:GPU" if compiler is None else compiler.capabilities.compiler,
                cpu=audit.backend == "cpu",
                priced="the audit counts them so: its FLOPs, and the compute it sets beside "
                "each collective",
            )
        )
    m = audit.memory
    if m is not None and compiler is CPU_TARGET and m.temp_size_in_bytes is not None:
        notes.append(
            f"memory per device (the CPU compiler's buffers: arguments + outputs + "
            f"temporaries - aliased; no GPU/TPU prediction): "
            f"{format_bytes(m.held_by(compiler))}"
        )
    elif m is not None and m.peak_memory_in_bytes is not None:
        peak = m.peak_memory_in_bytes
        notes.append(f"peak memory per device (this backend's estimate): {format_bytes(peak)}")
    return notes


def render_audit(
    audit: Audit,
    *,
    console: Any = None,
    title: str | None = None,
    by_scope: bool = False,
    verbose: bool = True,
) -> None:
    """Prints the audit table and its notes to ``console`` (a new rich Console by default).

    ``by_scope`` prints the totals per scope (:func:`scope_table`) instead of one row per
    collective. Not ``verbose`` (the command line's default), a combined collective names
    one source line, the priced collectives' table is its one-line total and each note is
    one line.
    """

    console = console or output_console()
    table = (
        scope_table(audit, title=title)
        if by_scope
        else audit_table(audit, title=title, verbose=verbose)
    )
    console.print(table)
    if by_scope and audit.exposure() is not None:
        for scope, e in audit.exposure_by_scope().items():
            console.print(
                f"{scope or '(no scope)'}: {format_seconds(e.comm_s)} of communication on "
                f"{audit.priced_on}, {format_seconds(e.exposed_s)} exposed",
                highlight=False,
                markup=False,
            )
    elif not verbose and audit.exposure() is not None:
        console.print(_exposure_line(audit), highlight=False, markup=False)
    elif (overlap := overlap_table(audit)) is not None:
        console.print(overlap)
    for note in audit_notes(audit):
        if verbose:
            console.print(note, highlight=False, markup=False)
        else:
            print_line(console, note)


def format_audit(
    audit: Audit,
    *,
    width: int = 140,
    title: str | None = None,
    by_scope: bool = False,
    verbose: bool = True,
) -> str:
    """The rendered table and notes as plain text (no colour), e.g. for logs and tests
    (``verbose`` as in :func:`render_audit`)."""

    from rich.console import Console

    buf = io.StringIO()
    render_audit(
        audit,
        console=Console(file=buf, width=width, color_system=None, force_terminal=False),
        title=title,
        by_scope=by_scope,
        verbose=verbose,
    )
    return buf.getvalue()


def audit_mimebundle(audit: Audit) -> dict[str, str]:
    """The audit table as plain text and HTML, for a notebook's display."""
    return mimebundle(audit_table(audit), width=140)


#: The columns of the table an :meth:`Audit.expect` that fails raises with.
EXPECT_COLUMNS: tuple[Column[ExpectCheck], ...] = (
    Column("check", lambda r: r.check),
    Column("expected", lambda r: r.expected, justify="right"),
    Column("actual", lambda r: r.actual, justify="right"),
    Column("", lambda r: "" if r.ok else "<- differs"),
)


def expect_differences(audit: Audit, checks: list[ExpectCheck]) -> str:
    """The message of a failing :meth:`Audit.expect`: its checks as a table, then the
    collectives of the kinds whose count differs."""
    bad = [r for r in checks if not r.ok]
    failing_kinds = {r.kind for r in bad if r.kind}
    lines = [f"audit of {audit.module_name}: {len(bad)} of {len(checks)} checks differ"]
    lines += text_table(EXPECT_COLUMNS, checks)
    shown = [c for c in audit.sorted_collectives() if c.kind in failing_kinds]
    if shown:
        lines.append("collectives of the kinds that differ:")
        for c in shown:
            where = c.source or (f"after {c.operand_source}" if c.operand_source else "?")
            lines.append(
                f"  {c.kind} x{c.count} over {c.axes_label} ({c.dtype}{list(c.shape)}, "
                f"{format_bytes(c.payload_bytes)}) at {where} [{c.name}]"
            )
    if not audit.exact:
        lines.append("note: some counts are not exact (unknown trip counts or branches)")
    return "\n".join(lines)


def audit_text(audit: Audit) -> str:
    """The audit table as plain text (``print(audit)``)."""
    return mimebundle_text(audit_table(audit), width=140)


register(Audit, View.RICH, audit_table)
register(Audit, View.NOTEBOOK, audit_mimebundle)
register(Audit, View.TEXT, audit_text)
register(Audit, View.EXPECTATIONS, expect_differences)
