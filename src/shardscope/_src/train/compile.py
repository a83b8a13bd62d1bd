"""Compiling one training plan: its program (:class:`~shardscope._src.train.types.StageProgram`)
lowered from abstract arguments, compiled, audited, and the facts kept as plain data; in this
process or in worker processes that simulate N devices."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax

from shardscope._src.base.errors import StrategyError
from shardscope._src.plan.compile import COMPILE_OPTIONS, Progress, compile_plan, local_devices
from shardscope._src.plan.worker import run_tasks
from shardscope._src.train.types import Candidate, CompiledFacts, StageProgram


def compile_facts(
    program: StageProgram, devices: Sequence[jax.Device] | None = None
) -> CompiledFacts:
    """Builds, lowers, compiles and audits one plan's program on concrete (simulated)
    devices: the first of ``devices`` (default: all of JAX's) that its mesh needs.

    ``compile_s`` is the time of :func:`~shardscope._src.plan.compile.compile_plan`, which
    compiles the program and audits its HLO; ``audit_s`` the time of turning that audit
    into the plan's facts."""

    t0 = time.perf_counter()
    devs = list(jax.devices() if devices is None else devices)[: program.mesh.devices]
    lowered = program.lower(program.mesh.on(devs, axis_types="auto"))
    t1 = time.perf_counter()
    compiled = compile_plan(lowered, options=COMPILE_OPTIONS)
    t2 = time.perf_counter()
    remats = compiled.rematerializations
    return CompiledFacts(
        collectives=compiled.plan_collectives(program.config.dtype),
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
    """One plan's program to compile (a :class:`~shardscope._src.plan.tasks.Task`), as the
    planner sends it to a worker process (picklable)."""

    program: StageProgram

    def run(self, devices: Sequence[jax.Device] | None = None) -> CompiledFacts:
        """:func:`compile_facts` of this plan on ``devices`` (default: this process's)."""
        return compile_facts(self.program, devices)


def compile_all(
    programs: Mapping[Candidate, StageProgram],
    devices: int,
    workers: int,
    progress: Progress | None,
) -> dict[Candidate, CompiledFacts | BaseException]:
    """The compiled facts of each candidate's program (or what its compile raised), in this
    process (``workers=0``, on its first ``devices`` CPU devices) or in ``workers`` worker
    processes that simulate ``devices`` each."""
    out: dict[Candidate, CompiledFacts | BaseException] = {}
    todo = list(programs)
    total = len(todo)
    if progress:
        progress(0, total, "")
    if not todo:
        return out

    if workers == 0:
        local = local_devices(
            devices,
            otherwise=f", or pass workers=1 (or more) to compile in worker processes that "
            f"simulate {devices} devices each",
        )
        for i, cand in enumerate(todo, start=1):
            try:
                out[cand] = CompileTask(programs[cand]).run(local)
            except (StrategyError, RuntimeError, ValueError) as e:
                out[cand] = e
            if progress:
                progress(i, total, cand.label)
        return out

    tasks = [CompileTask(programs[c]) for c in todo]
    for i, (index, got) in enumerate(run_tasks(tasks, devices, workers), start=1):
        out[todo[index]] = got
        if progress:
            progress(i, total, todo[index].label)
    return out
