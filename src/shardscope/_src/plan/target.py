"""Compiling a plan with the target's own compiler (deviceless GPU or TPU), for its memory.

The sweep screens every candidate on the CPU compiler (fast, and what the estimates were
built on); the leading plans are then compiled again for the target's compile-only devices.
What comes back is the target's own buffer assignment (memory per device), its collectives
(its reduce-scatters, its 16-bit payloads), and on TPU its FLOP count and time estimate. A
TPU program that does not fit fails to compile; its words are kept as the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import jax

from shardscope._src.audit.compile import audit, compile_lowered
from shardscope._src.audit.width import Width
from shardscope._src.base.errors import DeviceMemoryError
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.compile import plan_collective
from shardscope._src.plan.types import Candidate, PlanCollective, device_bytes
from shardscope._src.sharding.programs import build_program
from shardscope._src.sharding.strategies import get_strategy
from shardscope._src.target_mesh import target_mesh


@dataclass(frozen=True)
class TargetFacts:
    """One plan as the target's compiler built it. ``error`` holds the compiler's words when
    it found the program does not fit (then ``memory`` is empty)."""

    target: str
    memory: Mapping[str, int] = field(default_factory=dict)
    collectives: tuple[PlanCollective, ...] = ()
    flops: float | None = None
    optimal_seconds: float | None = None
    error: str | None = None
    exact: bool = True
    compile_s: float = 0.0

    @property
    def memory_bytes_per_device(self) -> int:
        """Arguments + outputs + temporaries - aliased, as the target's buffer assignment has
        them."""
        m = self.memory
        return device_bytes(m)


def _optimal_seconds(compiled: jax.stages.Compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not isinstance(cost, Mapping):
        return None
    value = cost.get("optimal_seconds")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def target_facts(cand: Candidate, config: ModelConfig, mode: str, target: str) -> TargetFacts:
    """Builds ``cand``'s program on ``target``'s compile-only devices, compiles it with the
    target's compiler and audits it."""

    mesh = target_mesh(target, cand.stage_mesh_spec)
    placement = get_strategy(cand.strategy).place(config, mesh)
    lowered = build_program(placement, mode=mode, microbatches=cand.microbatches).lower()
    t0 = time.perf_counter()
    try:
        compiled = compile_lowered(lowered)
    except DeviceMemoryError as e:
        return TargetFacts(target, error=str(e), compile_s=time.perf_counter() - t0)
    compile_s = time.perf_counter() - t0
    result = audit(compiled)
    return TargetFacts(
        target=target,
        memory=dict(result.memory or {}),
        # Payloads as the target sends them: it keeps 16-bit collectives 16-bit.
        collectives=tuple(plan_collective(c, Width.of(result)) for c in result.collectives),
        flops=result.flops,
        optimal_seconds=_optimal_seconds(compiled),
        exact=result.exact,
        compile_s=compile_s,
    )
