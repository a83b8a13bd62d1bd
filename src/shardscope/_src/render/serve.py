"""The serving plans as a rich table (each layout and batch that fits, best throughput per
chip first, the latency-throughput front marked) and as a chart of the front, drawn headless
with matplotlib's Agg canvas and written atomically."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.comm import format_bytes, format_seconds
from shardscope._src.plan.rank import StepSource
from shardscope._src.render.columns import Column, rich_table
from shardscope._src.targets.engines import ENGINES

if TYPE_CHECKING:
    from shardscope._src.serve.types import ServePlan, ServeResult

#: Rows shown when no ``top`` is given.
DEFAULT_TOP = 12


def serve_columns(
    kv_replicas: bool = False, at_rate: bool = False
) -> tuple[Column[ServePlan], ...]:
    """The table's columns; with ``kv_replicas``, how many devices hold each key/value head;
    ``at_rate``, the mean sequences in flight."""
    kv: Column[ServePlan] = Column(
        "kv heads", lambda p: f"x{p.kv_replicas}" if p.kv_replicas > 1 else "", justify="right"
    )
    flight: Column[ServePlan] = Column(
        "in flight", lambda p: f"{p.in_flight or 0:.1f}", justify="right"
    )
    return (
        Column("", lambda p: "*" if p.pareto else ""),
        Column("layout", lambda p: p.strategy),
        Column("mesh", lambda p: ",".join(f"{k}={v}" for k, v in p.mesh.items()), code=True),
        *((flight,) if at_rate else ()),
        Column("batch", lambda p: str(p.batch), justify="right"),
        Column("mem/dev", lambda p: format_bytes(p.memory_bytes_per_device), justify="right"),
        Column("by", lambda p: p.compiled_by or "estimate"),
        Column("weights", lambda p: format_bytes(p.weight_bytes_per_device), justify="right"),
        Column("cache", lambda p: format_bytes(p.cache_bytes_per_device), justify="right"),
        *((kv,) if kv_replicas else ()),
        Column("per token", lambda p: format_seconds(p.decode_step_s), justify="right"),
        Column("comm", lambda p: format_seconds(p.decode_comm_s), justify="right"),
        Column("first token", lambda p: format_seconds(p.first_token_s), justify="right"),
        Column("tok/s/chip", lambda p: f"{p.tokens_per_s_per_chip:,.0f}", justify="right"),
    )


def _memory_words(result: ServeResult, shown: list[ServePlan]) -> str:
    """What the engine lets a device hold, for the caption: its rule (at the share the
    request gave) and the bytes it came to for the plans shown (their memory_limit_bytes;
    the rule is left out for an engine that is not a preset: a result read back from a
    later shardscope's file)."""
    limits = sorted({p.memory_limit_bytes for p in shown})
    if not limits:
        return ""
    held = format_bytes(limits[0])
    if len(limits) > 1:
        held = f"{held} to {format_bytes(limits[-1])} by layout"
    known = ENGINES.get(result.engine)
    if known is None:
        return f" Mem/dev fits within {held} a device."
    if known.memory is None:
        return f" Mem/dev fits within all the memory a device's runtime reports, {held}."
    how = known.memory.about(result.memory_share)
    return f" Mem/dev fits within what {result.engine} holds of a device: {how}, {held}."


def _share_words(result: ServeResult) -> str:
    """The engine's memory share where the request gave it, for the title."""
    known = ENGINES.get(result.engine)
    if result.memory_share is None or known is None or known.memory is None:
        return ""
    return f" ({known.memory.setting} {result.memory_share:g})"


def render_serve(
    result: ServeResult, *, top: int | None = None, caption: bool = True, verbose: bool = True
) -> Any:
    """The table of ``result``'s plans (the best ``top``, and every plan of the front), with
    its caption or without (to measure the table's cells); the caption explains the columns
    where ``verbose``, else it counts the plans alone."""
    n = DEFAULT_TOP if top is None else top
    shown = [p for i, p in enumerate(result.plans) if i < n or p.pareto]
    title = (
        f"Serving {result.model} on {result.devices} x {result.hardware}: prompt "
        f"{result.prompt}, output {result.output}, context {result.context}, {result.weights} "
        f"weights, {result.cache} cache"
        + (f", {result.rate:g} requests/s" if result.rate else "")
        + (f", {result.clients} clients in a closed loop" if result.clients else "")
        + (f", prefills in chunks of {result.chunked_prefill}" if result.chunked_prefill else "")
        + (f", at most {format_seconds(result.latency)} per token" if result.latency else "")
        + (f", busiest expert {result.imbalance:g}x its share" if result.imbalance > 1 else "")
        + (", each token once to each device of its experts" if result.dispatch_once else "")
        + (
            ", each slot's router weight sent with it to its expert"
            if result.weight_activations
            else ""
        )
        + (f", on {result.engine}" if result.engine != "none" else "")
        + _share_words(result)
        + (f", prefill attention {result.prefill_attention}" if result.prefill_attention else "")
    )
    kv = any(p.kv_replicas > 1 for p in shown)
    at_rate = result.rate is not None
    loaded = at_rate or result.clients is not None
    order = "fastest per token first" if at_rate else "best throughput per chip first"
    text = (
        f"{len(result.plans)} {'plan fits' if len(result.plans) == 1 else 'plans fit'}; "
        f"{len(shown)} shown, {order}. * the "
        + (
            "front of the times per token and to the first"
            if loaded
            else "latency-throughput front"
        )
        + "."
    )
    columns = (
        " Per token: the decode step's traffic through HBM "
        "or its matmuls, whichever is slower (on a GPU kernel by kernel, the attention "
        "core one fused kernel), its collectives (comm: "
        "tensor parallelism's all-reduces, and a mixture's dispatch and combine over "
        "'expert') and, compiled for a GPU, its kernels' launches; by: the "
        "compiler whose decode step (and, on a GPU, prefill) gave the memory, the "
        "collectives and the times, or the estimate. First token: one prompt prefilled "
        "alone on a replica (on a TPU, estimated)."
        + _memory_words(result, shown)
        + (
            f" At {result.rate:g} requests/s, arriving at random: per token and first token "
            f"as requests see them, each prompt prefilled in an iteration of its own beside "
            f"the running sequences, a new one waiting for the iteration under way and the "
            f"prompts before it; in flight: the mean sequences; batch: what the cache holds, "
            f"each replica's 99th percentile of its sequences in flight."
            if at_rate
            else ""
        )
        + (
            f" Under {result.clients} clients in a closed loop, each sending its next request "
            f"when its last one ends: per token and first token as their requests see them, "
            f"a new one waiting for the iteration under way and the prompts before it, then "
            f"prefilled beside the running sequences; each cache read at its mean length "
            f"(the prompt and half the output); in flight: the sequences the cache holds "
            f"(clients beyond them wait for a place)."
            if result.clients is not None
            else ""
        )
        + (
            " kv heads: each key/value head held by that many devices (tensor parallelism "
            "wider than the heads)."
            if kv
            else ""
        )
    )
    if verbose:
        text += columns
    return rich_table(
        serve_columns(kv, loaded), shown, title=title, caption=text if caption else None
    )


def plot_serve(result: ServeResult, path: str | os.PathLike[str]) -> Path:
    """Writes the latency-throughput chart as PNG: throughput per chip against the time per
    output token, one point per plan, one colour per layout (filled where the decode step was
    compiled, hollow where estimated), the front joined and its batches written beside it; at
    a request rate (every layout delivering its tokens), the time to first token against
    it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(
        f"Serving {result.model} on {result.devices} x {result.hardware}: prompt "
        f"{result.prompt}, output {result.output}, {result.weights} weights, "
        f"{result.cache} cache" + (f", {result.rate:g} requests/s" if result.rate else ""),
        fontsize=10,
    )
    # at a rate every layout delivers the same tokens: the other axis is the first token's
    if result.rate is None:

        def other(p: ServePlan) -> float:
            return p.tokens_per_s_per_chip
    else:

        def other(p: ServePlan) -> float:
            return p.first_token_s * 1e3

    layouts: dict[str, list[ServePlan]] = {}
    for p in result.plans:
        key = p.strategy + " " + ",".join(f"{k}={v}" for k, v in p.mesh.items())
        layouts.setdefault(key, []).append(p)
    colours = [f"C{i}" for i in range(10)]
    for i, (name, plans) in enumerate(sorted(layouts.items())):
        colour = colours[i % len(colours)]
        any_compiled = any(q.step_source is StepSource.COMPILED for q in plans)
        for source in (StepSource.COMPILED, StepSource.ESTIMATED):
            group = [p for p in plans if p.step_source is source]
            if not group:
                continue
            compiled = source is StepSource.COMPILED
            ax.scatter(
                [p.step_time_s * 1e3 for p in group],
                [other(p) for p in group],
                s=36,
                facecolors=colour if compiled else "none",
                edgecolors=colour,
                label=name if compiled or not any_compiled else None,
                zorder=3,
            )
    front = sorted(result.front, key=lambda p: p.decode_step_s)
    ax.plot(
        [p.decode_step_s * 1e3 for p in front],
        [other(p) for p in front],
        color="0.4",
        linewidth=1,
        zorder=2,
        label="front",
    )
    for p in front:
        ax.annotate(
            str(p.batch),
            (p.decode_step_s * 1e3, other(p)),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=7,
            color="0.3",
        )
    ax.set_xlabel("time per output token (ms)")
    if result.rate is None:
        ax.set_ylabel("output tokens per second per chip")
        ax.set_yscale("log")
    else:
        ax.set_ylabel("time to first token (ms)")
    ax.grid(True, which="both", color="0.92", linewidth=0.6)
    # without a rate the front rises to the upper right, away from the lower right; at a
    # rate the points may lie anywhere: matplotlib puts the legend where fewest are
    title = "filled: compiled; numbers: batch"
    if result.rate is None:
        ax.legend(fontsize=8, loc="lower right", title=title)
    else:
        ax.legend(fontsize=8, loc="best", title=title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_atomic(path, lambda f: f.write(buf.getvalue()), binary=True)
