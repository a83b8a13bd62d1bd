"""Compiling one training plan: build the reference program from abstract arguments, compile,
audit, and keep the facts as plain data; in this process or in worker processes that simulate N
devices."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax

from shardscope._src.base.errors import StrategyError
from shardscope._src.mesh import make_mesh, parse_mesh_spec
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.compile import COMPILE_OPTIONS, Progress, compile_plan, local_devices
from shardscope._src.plan.worker import run_tasks
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import Strategy, get_strategy
from shardscope._src.train.types import Candidate, CompiledFacts


def compile_facts(
    strategy: str | Strategy,
    mesh_spec: str,
    config: ModelConfig,
    mode: str,
    devices: Sequence[jax.Device] | None = None,
    microbatches: int = 1,
) -> CompiledFacts:
    """Builds, lowers, compiles and audits one plan on concrete (simulated) devices: the
    first of ``devices`` (default: all of JAX's) that the mesh needs.

    ``compile_s`` is the time of :func:`~shardscope._src.plan.compile.compile_plan`, which
    compiles the program and audits its HLO; ``audit_s`` the time of turning that audit
    into the plan's facts."""

    t0 = time.perf_counter()
    need = math.prod(parse_mesh_spec(mesh_spec).values())
    devs = list(jax.devices() if devices is None else devices)[:need]
    mesh = make_mesh(mesh_spec, devices=devs, axis_types="auto")
    placement = get_strategy(strategy).place(config, mesh)
    # The planner's programs gather FSDP's weights again for the backward, as PyTorch FSDP
    # and ZeRO-3 do: every layer's gathered weights never live at once.
    program = build_reference_program(
        placement, mode=mode, microbatches=microbatches, regather=True
    )
    lowered = program.lower()
    t1 = time.perf_counter()
    compiled = compile_plan(lowered, options=COMPILE_OPTIONS)
    t2 = time.perf_counter()
    remats = compiled.rematerializations
    return CompiledFacts(
        collectives=compiled.plan_collectives(config.dtype),
        memory=compiled.memory,
        rematerializations=tuple(r.source or r.op_name or r.instruction or "?" for r in remats),
        exact=compiled.exact,
        lower_s=t1 - t0,
        compile_s=compiled.compile_s,
        audit_s=time.perf_counter() - t2,
        hlo_flops=compiled.hlo_flops,
    )


@dataclass(frozen=True)
class CompileTask:
    """One plan to compile (a :class:`~shardscope._src.plan.tasks.Task`), as the planner sends
    it to a worker process (picklable)."""

    strategy: str | Strategy
    mesh_spec: str
    config: ModelConfig
    mode: str
    microbatches: int = 1

    def run(self, devices: Sequence[jax.Device] | None = None) -> CompiledFacts:
        """:func:`compile_facts` of this plan on ``devices`` (default: this process's)."""
        return compile_facts(
            self.strategy, self.mesh_spec, self.config, self.mode, devices, self.microbatches
        )


def compile_all(
    todo: Sequence[Candidate],
    config: ModelConfig | Mapping[Candidate, ModelConfig],
    mode: str,
    devices: int,
    workers: int,
    progress: Progress | None,
) -> dict[Candidate, CompiledFacts | BaseException]:
    out: dict[Candidate, CompiledFacts | BaseException] = {}
    total = len(todo)
    if progress:
        progress(0, total, "")
    if not todo:
        return out

    def task_of(c: Candidate) -> CompileTask:
        model = config if isinstance(config, ModelConfig) else config[c]
        return CompileTask(c.strategy_record, c.stage_mesh_spec, model, mode, c.microbatches)

    if workers == 0:
        local = local_devices(
            devices,
            otherwise=f", or pass workers=1 (or more) to compile in worker processes that "
            f"simulate {devices} devices each",
        )
        for i, cand in enumerate(todo, start=1):
            try:
                out[cand] = task_of(cand).run(local)
            except (StrategyError, RuntimeError, ValueError) as e:
                out[cand] = e
            if progress:
                progress(i, total, cand.label)
        return out

    tasks = [task_of(c) for c in todo]
    for i, (index, got) in enumerate(run_tasks(tasks, devices, workers), start=1):
        out[todo[index]] = got
        if progress:
            progress(i, total, todo[index].label)
    return out
