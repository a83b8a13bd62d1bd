"""Simulated CPU devices and a summary of the hardware JAX sees."""

from __future__ import annotations

import operator
import os
import re
from typing import Any

import jax
import numpy as np
from jax._src import xla_bridge  # private: JAX has no public query for started backends
from jax.experimental import multihost_utils

from shardscope._src.base.errors import DeviceSetupError, ShardscopeError
from shardscope._src.base.startup import accelerator_present, start_jax

DEFAULT_CPU_DEVICES = 8
#: JAX 0.10.2's CPU backend compiles for at most 2048 devices in one process ("Multiprocess
#: computations aren't implemented": it numbers a second process's devices from 2048).
MAX_CPU_DEVICES = 2048
_FORCE_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def flag_device_count() -> int | None:
    """The count a user set in ``XLA_FLAGS`` or ``JAX_NUM_CPU_DEVICES``, if any."""
    env = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    if env.lstrip("-").isdigit() and int(env) > 0:
        return int(env)
    found = _FORCE_FLAG.findall(os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def use_cpu_devices(n: int | None = None) -> int:
    """Makes ``n`` CPU devices available to JAX, simulated on this one machine.

    Call it before JAX's first computation (right after import is fine). It sets JAX's
    ``jax_num_cpu_devices`` option and never touches ``XLA_FLAGS``. With ``n=None`` it honours a
    count the user already gave in ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` or
    ``JAX_NUM_CPU_DEVICES=N``, and otherwise asks for 8. On a host with accelerators JAX's
    default devices stay the real ones; only the CPU platform is affected. On a host without
    them (unless the user chose JAX's platforms) JAX is limited to its CPU platform, so that
    the GPU and TPU plugins of the compile extras neither print their start-up errors nor
    start libtpu; deviceless GPU and TPU targets compile as before.

    Returns the number of CPU devices requested. Raises :class:`DeviceSetupError` if JAX's
    backend is already running with a different number.

    >>> import shardscope
    >>> shardscope.use_cpu_devices(8)  # the count JAX already runs with: a no-op
    8
    """
    if n is not None:
        n = _count(n)

    flagged = flag_device_count()
    requested = n if n is not None else (flagged or DEFAULT_CPU_DEVICES)
    if backends_started():
        have = len(jax.devices("cpu"))
        if have == requested:
            return requested
        raise DeviceSetupError(
            f"JAX's backend is already running with {have} CPU device(s), so {requested} "
            f"cannot be simulated any more. Call shardscope.use_cpu_devices({requested}) (or "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={requested}) before the "
            f"first JAX computation: restart the Python process or notebook kernel and make it "
            f"the first thing you run."
        )
    _cpu_platform_only()
    if n is None and flagged is not None:
        return flagged  # The user's own flag decides; JAX reads it when the backend starts.
    jax.config.update("jax_num_cpu_devices", requested)  # type: ignore[no-untyped-call]
    return requested


def _cpu_platform_only() -> None:
    """Limits JAX to its CPU platform where this host has no accelerator and the user chose
    no platforms (``JAX_PLATFORMS`` or ``jax_platforms``), and registers JAX's plugins now,
    with their start-up lines dropped.

    Without it, the first computation asks every installed plugin for a backend: the CUDA
    plugin prints a traceback for want of a driver and libtpu searches for chips. Limited to
    the CPU, the CUDA plugin registers without its driver check and libtpu's backend is never
    started; the compile-only topologies of both stay available.
    """
    # JAX reads an option that has a context manager as an attribute (config.read refuses
    # it), which its type stubs do not declare.
    if jax.config.jax_platforms or accelerator_present():  # type: ignore[attr-defined]
        return
    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    start_jax()


def _count(n: object) -> int:
    try:
        value = operator.index(n)  # type: ignore[arg-type]
    except TypeError:
        value = 0
    if isinstance(n, bool) or value <= 0:
        raise ShardscopeError(f"device count must be a positive integer, got {n!r}")
    if value > MAX_CPU_DEVICES:
        raise ShardscopeError(
            f"{value} simulated devices is more than JAX's CPU backend compiles for in one "
            f"process ({MAX_CPU_DEVICES}); ask for at most {MAX_CPU_DEVICES}"
        )
    return value


def backends_started() -> bool:
    # JAX has no public query for this; it is the same check jax_num_cpu_devices' own
    # validator makes, and asking through jax.devices() would start the backends.

    return bool(xla_bridge.backends_are_initialized())


def host_value(tree: Any) -> Any:
    """NumPy copies of a pytree's arrays, gathered from the other processes of a
    multi-process run where this one does not hold every shard (every process must call it,
    in the same order: the gather is a collective)."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def hardware_summary() -> dict[str, Any]:
    """JAX version, default backend, device count and kind, processes: plain data."""

    devices = jax.devices()
    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_count": len(devices),
        "local_device_count": jax.local_device_count(),
        "device_kind": devices[0].device_kind if devices else "none",
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
    }
