"""What every planner's compiles share: the one compile step (:func:`compile_plan`, which
the training sweep, a target's recompile, a program's candidates and a served step all
compile through), the compile options, a compiled collective as a plan counts it, this
process's CPU devices, and whether to compile here or in workers."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax

from shardscope._src.audit.compile import FAST_COMPILE_OPTIONS, RECORDED_LOG_LINES, audit
from shardscope._src.audit.ragged import RaggedDots, dense_ragged_dots
from shardscope._src.audit.records import Audit, Collective, MemoryPressure, Rematerialization
from shardscope._src.audit.width import Width
from shardscope._src.base.devices import backends_started, flag_device_count
from shardscope._src.base.errors import PlanError
from shardscope._src.base.stderr import capture_stderr
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.plan.collectives import PlanCollective

#: ``progress(done, total, label)``, called as plans finish compiling.
Progress = Callable[[int, int, str], None]


#: XLA options for the plan's compiles: it needs the partitioned program and its buffer
#: sizes, not fast CPU code (see FAST_COMPILE_OPTIONS).
COMPILE_OPTIONS: Mapping[str, Any] = FAST_COMPILE_OPTIONS

#: Past this size the kernel cache starts afresh (it is read whole by every compile).
KERNEL_CACHE_BYTES = 64 << 20

#: This process's kernel cache's folder, made when first asked for, removed at exit.
_kernels: tempfile.TemporaryDirectory[str] | None = None


def gpu_kernel_cache() -> dict[str, str]:
    """The XLA option that keeps the kernels XLA:GPU emits in a file of this process's and
    takes them from it again (``xla_gpu_kernel_cache_file``).

    A program's candidates share most of their kernels (the same fusions of the same shapes
    per device: every candidate on one mesh holds the same activations), and emitting
    kernels is most of a GPU compile: the lm1b-sized decoder of benchmarks/suggest_lm1b.py
    compiled again in 3.2-4.2 s instead of 6.2-7.5 s. The kernels are never run, and what a
    plan reads of its compile comes before they are emitted: its optimized HLO (the same
    text, with the file and without) and its buffer assignment."""
    global _kernels
    if _kernels is None:
        _kernels = tempfile.TemporaryDirectory(prefix="shardscope-kernels-")
    path = os.path.join(_kernels.name, "kernels.bin")
    if os.path.exists(path) and os.path.getsize(path) > KERNEL_CACHE_BYTES:
        os.remove(path)
    return {"xla_gpu_kernel_cache_file": path}


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


@dataclass(frozen=True)
class CompiledProgram:
    """One planned program as its compiler built it: the audit of its optimized HLO (what it
    was read from beside it, ``audit.program``), the compiler's buffer assignment, its FLOP
    counts, what its compile log said, the seconds the compile and the audit took, and the
    ragged dots it computes densely."""

    audit: Audit
    #: the compiler's buffer assignment per device (empty where it gives none)
    memory: CompiledMemory
    #: the compiler's own FLOP count (its cost analysis; None where it gives none)
    flops: float | None
    #: the program's matmul FLOPs per device counted from its HLO (None: not counted)
    hlo_flops: int | None
    #: where the partitioner replicated whole arrays (the compile log's warnings)
    rematerializations: tuple[Rematerialization, ...]
    #: the compiler's rematerialization could not bring the program under its memory
    memory_pressure: MemoryPressure | None
    #: seconds of the compile and the audit of its HLO
    compile_s: float
    #: the program's ragged dots (``jax.lax.ragged_dot``) that it computes as dense matmuls
    #: over every group (:mod:`~shardscope._src.audit.ragged`; None: none, or no jaxpr given)
    ragged_dots: RaggedDots | None = None

    @property
    def exact(self) -> bool:
        """Whether every collective's count is exact (:attr:`Audit.exact`)."""
        return self.audit.exact

    @property
    def optimal_seconds(self) -> float | None:
        """The compiler's own estimate of one run's seconds (XLA:TPU's cost analysis gives
        one; None elsewhere, or without the compiled program)."""
        compiled = self.audit.compiled
        if compiled is None:
            return None
        cost = compiled.cost_analysis()
        if isinstance(cost, list | tuple):
            cost = cost[0] if cost else None
        if not isinstance(cost, Mapping):
            return None
        value = cost.get("optimal_seconds")
        return float(value) if isinstance(value, int | float) and value > 0 else None

    def plan_collectives(
        self, program_dtype: str | None = None, *, itemsize: int | None = None
    ) -> tuple[PlanCollective, ...]:
        """The program's collectives as a plan counts them, at the width
        :meth:`Width.of <shardscope._src.audit.width.Width.of>` gives for the program's
        element type ``program_dtype`` (or ``itemsize``)."""
        width = Width.of(self.audit, program_dtype, itemsize=itemsize)
        return tuple(plan_collective(c, width) for c in self.audit.collectives)


def compile_plan(
    program: Any,
    /,
    *args: Any,
    mesh: Any = None,
    options: Mapping[str, Any] | None = None,
    drop: tuple[str, ...] = RECORDED_LOG_LINES,
    jaxpr: Any = None,
) -> CompiledProgram:
    """Compiles a planned program and audits it: the one compile step of every planner.

    ``program`` is a ``jax.stages.Lowered`` (compiled with the XLA ``options``), a
    ``jax.stages.Compiled`` (audited as it is), or a jitted function with its abstract
    ``args`` (lowered, then compiled); ``mesh`` names the axes when the program's shardings
    do not (see :func:`~shardscope._src.audit.compile.audit`). The compiler's log is read
    for its rematerializations and memory pressure; its lines containing any of ``drop``
    stay off the terminal (by default the ones read: the plan's notes say them). With the
    program's ``jaxpr`` (:func:`~shardscope._src.audit.stages.lower_step_traced`), its ragged
    dots that the compiled program computes densely are counted (a function lowered here
    has them from its own trace).

    Raises what :func:`~shardscope._src.audit.compile.audit` raises: a compiler that finds
    the program does not fit raises :class:`~shardscope._src.base.errors.DeviceMemoryError`,
    a compiler's own failure ``jax.errors.JaxRuntimeError``.
    """
    start = time.perf_counter()
    with capture_stderr(drop=drop):
        result = audit(program, *args, mesh=mesh, compiler_options=options)
    return CompiledProgram(
        audit=result,
        memory=CompiledMemory() if result.memory is None else result.memory,
        flops=result.flops,
        hlo_flops=result.hlo_flops,
        rematerializations=result.rematerializations or (),
        memory_pressure=result.memory_pressure,
        compile_s=time.perf_counter() - start,
        # a function the audit lowered itself: its audit read them from its trace
        ragged_dots=(
            result.ragged_dots
            if jaxpr is None
            else dense_ragged_dots(jaxpr, result.backend, result.module)
        ),
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
    configured: int | None = jax.config.jax_num_cpu_devices  # type: ignore[attr-defined]
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
