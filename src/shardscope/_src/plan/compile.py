"""Compiling one plan: build the program from abstract arguments, compile, audit, and keep
the facts as plain data; in this process or in worker processes that simulate N devices."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from shardscope._src.audit.compile import FAST_COMPILE_OPTIONS, RECORDED_LOG_LINES, audit
from shardscope._src.audit.records import Collective
from shardscope._src.audit.width import Width
from shardscope._src.base.devices import backends_started, flag_device_count
from shardscope._src.base.errors import PlanError, StrategyError
from shardscope._src.base.stderr import capture_stderr
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.mesh import make_mesh, parse_mesh_spec
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.collectives import PlanCollective
from shardscope._src.plan.types import Candidate, CompiledFacts
from shardscope._src.plan.worker import run_tasks
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import Strategy, get_strategy

#: ``progress(done, total, label)``, called as plans finish compiling.
Progress = Callable[[int, int, str], None]

#: XLA options for the plan's compiles: it needs the partitioned program and its buffer
#: sizes, not fast CPU code (see FAST_COMPILE_OPTIONS).
COMPILE_OPTIONS: Mapping[str, Any] = FAST_COMPILE_OPTIONS


def plan_collective(c: Collective, width: Width) -> PlanCollective:
    """A compiled collective as the plan counts it: payloads at the width ``width`` gives."""
    return PlanCollective(
        kind=c.kind,
        axes=tuple(c.axes),
        group_size=c.group_size,
        count=c.count,
        count_exact=c.count_exact,
        irregular=c.irregular,
        dtype=c.dtype,
        payload_bytes=width.payload(c),
        cpu_payload_bytes=c.payload_bytes,
        traffic_bytes=width.sent(c),
        cpu_traffic_bytes=c.traffic_bytes * c.count,
        op_name=c.op_name,
        source=c.source,
    )


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

    ``compile_s`` is the time of :func:`audit`, which compiles the program and reads its HLO;
    ``audit_s`` the time of turning that audit into the plan's facts."""

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
    # the partitioner's rematerializations become the plan's note, not raw log lines
    with capture_stderr(drop=RECORDED_LOG_LINES):
        result = audit(lowered, compiler_options=COMPILE_OPTIONS)
    t2 = time.perf_counter()
    width = Width.of(result, config.dtype)
    remats = result.rematerializations or ()
    facts = CompiledFacts(
        collectives=tuple(plan_collective(c, width) for c in result.collectives),
        memory=CompiledMemory() if result.memory is None else result.memory,
        rematerializations=tuple(r.source or r.op_name or r.instruction or "?" for r in remats),
        exact=result.exact,
        lower_s=t1 - t0,
        compile_s=t2 - t1,
        audit_s=time.perf_counter() - t2,
        hlo_flops=result.hlo_flops,
    )
    return facts


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


def local_devices(n: int, *, otherwise: str = "") -> list[jax.Device]:
    """The first ``n`` CPU devices of this process, where plans compile in it; ``otherwise``
    ends the error with another way out."""

    have = jax.devices("cpu")
    if len(have) < n:
        raise PlanError(
            f"planning in this process needs {n} CPU devices but JAX has {len(have)}; call "
            f"shardscope.use_cpu_devices({n}) before JAX starts{otherwise}"
        )
    return list(have[:n])


def can_compile_here(devices: int) -> bool:
    """Whether this process has (or, not started yet, is configured for) ``devices`` CPU
    devices. Never starts JAX's backend or changes its configuration."""

    if backends_started():
        return len(jax.devices("cpu")) >= devices
    # An option JAX defines when it starts (jax._src.xla_bridge); its type stub lists none.
    configured = jax.config.jax_num_cpu_devices  # type: ignore[attr-defined]
    if configured is not None and configured > 0:
        return configured >= devices
    return (flag_device_count() or 1) >= devices


def default_workers(devices: int) -> int:
    """0 (compile in this process) when it can simulate ``devices`` devices, else 1.

    Measured on 2 shared cores (benchmarks/plan_speed.py, 7b on 64 devices): 15-20 s in one
    process, 18-19 s with two workers, which hold 680 MB against 270 MB (each worker starts
    its own JAX, and a compile already keeps more than one core busy). A pool is there for
    machines with more cores (``workers=N``).
    """
    return 0 if can_compile_here(devices) else 1


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
