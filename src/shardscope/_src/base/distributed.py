"""Multi-process start-up on JAX's own distributed runtime, from explicit values or the cluster.

A multi-controller JAX run has one process per host (or, for local testing, several on one
machine: see :mod:`shardscope._src.launch`). Every process calls :func:`initialize_distributed`
before JAX's first computation; afterwards ``jax.devices()`` lists the devices of all processes
and a mesh over them spans the whole run.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

import jax

from shardscope._src.base.devices import backends_started
from shardscope._src.base.errors import DeviceSetupError, ShardscopeError, is_int

_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def parse_coordinator(address: str) -> tuple[str, int]:
    """Splits ``"host:port"`` (``"[::1]:port"`` for IPv6) and checks the port."""
    host, sep, port_text = str(address).rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ShardscopeError(
            f"coordinator address {address!r} must be HOST:PORT with a port from 1 to 65535, "
            f"e.g. '127.0.0.1:12345' or 'node001:12345' (the host of process 0)"
        )
    return host.strip("[]"), int(port_text)


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    detect: bool = False,
    init_timeout_s: int = 300,
) -> bool:
    """Joins this process to a multi-process JAX run; returns whether it did.

    Call it before JAX's first computation, in every process of the run, with the same
    ``coordinator`` (``HOST:PORT`` of process 0) and ``num_processes`` and this process's own
    ``process_id``. With ``detect=True``, JAX's own cluster detection (SLURM, Open MPI,
    Kubernetes, Cloud TPU) fills in whatever is not given: this is
    ``jax.distributed.initialize()`` with no arguments. With no values and ``detect=False``
    nothing happens and the run stays single-process (returns ``False``).

    A coordinator on a loopback address (``127.0.0.1``, ``localhost``, ``::1``) is also bound
    there, so a local test run opens no port to the network; otherwise JAX binds all
    interfaces, as other hosts must reach it.

    Raises :class:`ShardscopeError` for bad or incomplete values and
    :class:`DeviceSetupError` when JAX's backend has already started, when this process is
    already in a different run, or when the run cannot be joined.

    Not run as a doctest (it waits for the other process of the run):

    >>> import shardscope
    >>> shardscope.initialize_distributed("127.0.0.1:12345", 2, 0)  # doctest: +SKIP
    True
    """
    given = {
        "coordinator": coordinator,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    if not detect and all(v is None for v in given.values()):
        return False
    missing = [k for k, v in given.items() if v is None]
    if missing and not detect:
        raise ShardscopeError(
            f"a multi-process run needs coordinator, num_processes and process_id; "
            f"{', '.join(missing)} not given. Give all three, or ask JAX to detect the "
            f"cluster (detect=True) under SLURM, Open MPI or Kubernetes",
            param=("coordinator", "num_processes", "process_id", "detect"),
        )
    for name in ("num_processes", "process_id"):
        value = given[name]
        if value is not None and not is_int(value):
            raise ShardscopeError(f"{name} must be a whole number, got {value!r}")
    if num_processes is not None and num_processes <= 0:
        raise ShardscopeError(f"num_processes must be positive, got {num_processes}")
    if process_id is not None and (
        process_id < 0 or (num_processes is not None and process_id >= num_processes)
    ):
        raise ShardscopeError(
            f"process_id {process_id} is out of range: with {num_processes} processes the ids "
            f"are 0 to {num_processes - 1 if num_processes else '?'}"
        )
    bind = None
    if coordinator is not None:
        host, port = parse_coordinator(coordinator)
        if is_loopback(host):
            bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    if jax.distributed.is_initialized():
        return _check_same_run(given)
    if backends_started():
        raise DeviceSetupError(
            "JAX's backend is already running, so this process can no longer join a "
            "multi-process run. Call shardscope.initialize_distributed(...) (or "
            "jax.distributed.initialize) before the first JAX computation: restart the process "
            "and make it the first thing you run."
        )
    kwargs: dict[str, Any] = {
        "coordinator_address": coordinator,
        "num_processes": num_processes,
        "process_id": process_id,
        "initialization_timeout": init_timeout_s,
        "coordinator_bind_address": bind,
    }
    if not missing:
        # Values given in full are the whole truth: a SLURM or MPI environment around a local
        # test run must not override them (JAX would otherwise still ask it for device ids).
        kwargs["cluster_detection_method"] = "deactivate"
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError) as e:
        if missing:
            raise DeviceSetupError(
                f"JAX's cluster detection found no value for {', '.join(missing)} ({e}). It "
                f"knows SLURM (inside srun), Open MPI (inside mpirun) and Kubernetes; elsewhere "
                f"give coordinator (HOST:PORT), num_processes and process_id",
                param=("coordinator", "num_processes", "process_id"),
            ) from e
        raise DeviceSetupError(f"jax.distributed.initialize refused the values: {e}") from e
    except RuntimeError as e:
        raise DeviceSetupError(
            f"could not join the multi-process run at {coordinator or 'the detected coordinator'}"
            f" within {init_timeout_s} s: {e}. Check that every process uses the same "
            f"coordinator address and process count, that each process id is used once, and "
            f"that process 0 is running"
        ) from e
    return True


def _check_same_run(given: dict[str, Any]) -> bool:

    have = {"num_processes": jax.process_count(), "process_id": jax.process_index()}
    clash = {k: (given[k], have[k]) for k in have if given[k] is not None and given[k] != have[k]}
    if clash:
        detail = ", ".join(f"{k} {g} (running: {h})" for k, (g, h) in clash.items())
        raise DeviceSetupError(
            f"this process already runs in a multi-process run and cannot join another: "
            f"{detail}. Restart the process to change it"
        )
    return True


def in_multiprocess_run() -> bool:
    """Whether this process has joined a multi-process JAX run (imports nothing new)."""
    jax = sys.modules.get("jax")
    return jax is not None and bool(jax.distributed.is_initialized())


@contextlib.contextmanager
def leave_run_on_failure() -> Iterator[None]:
    """In a multi-process run, a failing process exits at once instead of waiting for peers.

    A JAX process that ends normally first waits, at exit, until every process of the run ends
    too. After an error in one process the others are usually blocked in a collective that
    waits for it, so both would wait until JAX's timeouts (minutes). Leaving with ``os._exit``
    makes the failure visible at once to the launcher (``shardscope launch``, ``srun``), which
    ends the run. Single-process runs, and successful or check-failing returns, are untouched.
    """
    try:
        yield
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code and in_multiprocess_run():
            _exit_now(code)
        raise
    except BaseException:
        if in_multiprocess_run():
            traceback.print_exc()
            _exit_now(1)
        raise


def _exit_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
