"""Compiles on a Ray cluster: the same tasks as the worker processes
(:class:`~shardscope._src.program.program.ProgramTask`, the program by its file's path), run as Ray
tasks on the cluster's nodes.

Each task runs in a Ray worker started for it with the device set-up it needs in its
environment (``N`` simulated CPU devices, or the deviceless compilers' set-up), since JAX
reads that once, when it starts. A worker that dies mid-compile (a node lost, a process
killed) has its task run again elsewhere (Ray's ``max_retries``); a task that still fails
is reported as not compiled, never as a plan. The program's file must be readable at the same
path on every node (a shared file system, or the one machine of a local cluster).

Ray is optional (``pip install 'shardscope[ray]'``): nothing here imports it until a search
asks for a cluster.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from shardscope._src.base.devices import use_cpu_devices
from shardscope._src.base.errors import PlanError
from shardscope._src.plan.tasks import LostTask, TaskFailure, run_task
from shardscope._src.plan.worker import WorkerError

#: How many times Ray runs a task again after its worker died.
RETRIES = 2
#: Seconds allowed to reach a cluster's address before saying it cannot be reached.
CONNECT_TIMEOUT_S = 3.0


class ClusterError(PlanError):
    """The Ray cluster asked for cannot be used (not installed, not reachable)."""


def ray_requested() -> bool:
    """Whether the program has started Ray itself (``ray.init(...)`` before the search)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "a Ray cluster was asked for but Ray is not installed; pip install "
            "'shardscope[ray]' (or drop ray=/--ray to compile on this machine)",
            param="ray",
        ) from None
    return ray


def check_address(address: str) -> None:
    """Refuses, within :data:`CONNECT_TIMEOUT_S`, a ``HOST:PORT`` nothing listens on (Ray's
    own connect retries for much longer)."""
    host, sep, port = address.rpartition(":")
    if address in ("auto", "local") or address.startswith("ray://") and not sep:
        return
    host = host.removeprefix("ray://")
    if not sep or not port.isdigit() or not host:
        raise ClusterError(
            f"Ray address {address!r}: write HOST:PORT (the head's GCS port, 6379 by default), "
            f"e.g. 127.0.0.1:6379, or 'auto' for the cluster this machine belongs to",
            param="ray",
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ClusterError(
            f"cannot reach the Ray cluster at {address}: {reason}; start one with 'ray start "
            f"--head --port {port}' or give the head's address",
            param="ray",
        ) from None


def _run_remote(task: Any, devices: int, targets: bool) -> Any:
    """A Ray task's body: this worker's devices, then the task (or its failure, reported per
    candidate, as the worker processes report it)."""
    use_cpu_devices(devices)
    if targets:
        from shardscope._src.targets.plugins import prepare_targets

        prepare_targets()
    return run_task(task)


class RayPool:
    """The :class:`~shardscope._src.plan.worker.WorkerPool` interface over a Ray cluster:
    ``address`` to connect to (None: the one ``ray.init`` already started)."""

    def __init__(self, address: str | None, devices: int, *, targets: bool = False) -> None:
        ray = _import_ray()
        if address is not None:
            check_address(address)
        if not ray.is_initialized():
            if address is None:
                raise ClusterError(
                    "no Ray cluster: give ray='HOST:PORT' or call ray.init() first", param="ray"
                )
            # Ray 2.52 warns that it will stop hiding accelerators from tasks that ask for
            # none; these tasks compile deviceless or on the CPU either way
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            self.started = True
        else:
            self.started = False
        self.ray = ray
        env = {"JAX_PLATFORMS": "cpu"} if not targets else {}
        env["SHARDSCOPE_RAY_DEVICES"] = str(devices)  # a worker per device set-up
        self.remote = ray.remote(max_retries=RETRIES, retry_exceptions=False)(_run_remote)
        self.options = {"runtime_env": {"env_vars": env}}
        self.devices, self.targets = devices, targets

    def run(self, tasks: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Yields ``(index, result or error)`` as each of ``tasks`` finishes; a task whose
        worker died on every try yields a :class:`LostTask`, one that raised a
        :class:`WorkerError` with its :class:`TaskFailure`."""
        remote = self.remote.options(**self.options)
        refs = {remote.remote(t, self.devices, self.targets): i for i, t in enumerate(tasks)}
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for ref in ready:
                i = refs[ref]
                try:
                    got = self.ray.get(ref)
                except (self.ray.exceptions.WorkerCrashedError, self.ray.exceptions.NodeDiedError):
                    yield i, LostTask(f"its Ray worker died {RETRIES + 1} times")
                    continue
                except self.ray.exceptions.RayError as e:
                    yield i, LostTask(str(e).strip().splitlines()[0])
                    continue
                if isinstance(got, TaskFailure):
                    yield i, WorkerError(str(got), got)
                else:
                    yield i, got

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
