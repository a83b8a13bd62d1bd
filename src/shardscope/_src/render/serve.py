"""The serving plans as a rich table: each layout and batch that fits, best throughput per
chip first, the latency-throughput front marked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardscope._src.base.comm import format_bytes, format_seconds
from shardscope._src.render.columns import Column, rich_table

if TYPE_CHECKING:
    from shardscope._src.plan.serve import ServePlan, ServeResult

#: Rows shown when no ``top`` is given.
DEFAULT_TOP = 12


def serve_columns() -> tuple[Column[ServePlan], ...]:
    return (
        Column("", lambda p: "*" if p.pareto else ""),
        Column("layout", lambda p: p.strategy),
        Column("mesh", lambda p: ",".join(f"{k}={v}" for k, v in p.mesh.items()), code=True),
        Column("batch", lambda p: str(p.batch), justify="right"),
        Column("mem/dev", lambda p: format_bytes(p.memory_bytes_per_device), justify="right"),
        Column("by", lambda p: p.compiled_by or "estimate"),
        Column("weights", lambda p: format_bytes(p.weight_bytes_per_device), justify="right"),
        Column("cache", lambda p: format_bytes(p.cache_bytes_per_device), justify="right"),
        Column("per token", lambda p: format_seconds(p.decode_step_s), justify="right"),
        Column("all-reduce", lambda p: format_seconds(p.decode_comm_s), justify="right"),
        Column("first token", lambda p: format_seconds(p.first_token_s), justify="right"),
        Column("tok/s/chip", lambda p: f"{p.tokens_per_s_per_chip:,.0f}", justify="right"),
    )


def render_serve(result: ServeResult, *, top: int | None = None) -> Any:
    """The table of ``result``'s plans (the best ``top``, and every plan of the front)."""
    n = DEFAULT_TOP if top is None else top
    shown = [p for i, p in enumerate(result.plans) if i < n or p.pareto]
    title = (
        f"Serving {result.model} on {result.devices} x {result.hardware}: prompt "
        f"{result.prompt}, output {result.output}, context {result.context}, {result.weights} "
        f"weights, {result.cache} cache"
        + (f", at most {format_seconds(result.latency)} per token" if result.latency else "")
    )
    caption = (
        f"{len(result.plans)} plans fit; {len(shown)} shown, best throughput per chip first. "
        f"* the latency-throughput front. Per token: the roofline (weights and cache through "
        f"HBM or the matmuls, whichever is slower) and the tensor-parallel all-reduces; by: "
        f"the compiler whose decode step gave the memory and the all-reduces, or the "
        f"estimate. First token: one prompt prefilled alone on a replica, estimated."
    )
    return rich_table(serve_columns(), shown, title=title, caption=caption)
