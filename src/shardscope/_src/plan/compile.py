"""What every planner's compiles share: the compile options, a compiled collective as a plan
counts it, this process's CPU devices, and whether to compile here or in workers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax

from shardscope._src.audit.compile import FAST_COMPILE_OPTIONS
from shardscope._src.audit.records import Collective
from shardscope._src.audit.width import Width
from shardscope._src.base.devices import backends_started, flag_device_count
from shardscope._src.base.errors import PlanError
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
