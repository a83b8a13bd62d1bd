"""Worker processes for the planner: each simulates N CPU devices and compiles plans.

A worker is ``python -m shardscope._src.plan N`` (:mod:`shardscope._src.plan.__main__`, which
runs :func:`work`): it reads pickled tasks (:class:`~shardscope._src.plan.tasks.Task`) on
stdin and writes, pickled, what each one's ``run()`` returns or its :class:`TaskFailure` on
its original stdout (anything else printed there goes to stderr).
Plain subprocesses rather than ``multiprocessing`` so that the caller's ``__main__`` is never
re-imported: a script without an ``if __name__ == "__main__"`` guard can still plan.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from shardscope._src.base.devices import use_cpu_devices
from shardscope._src.plan.tasks import Task, TaskFailure, run_task


class WorkerError(RuntimeError):
    """A worker process died or answered with something other than a result; ``failure``:
    the task raised there, and this is what it raised."""

    def __init__(self, message: str, failure: TaskFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class _Worker:
    def __init__(self, devices: int, targets: bool = False) -> None:
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ)
        # The worker must import this very package, installed or not.
        root = str(Path(__file__).resolve().parents[3])  # the folder holding shardscope/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardscope._src.plan",
                str(devices),
                *(["targets"] if targets else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )

    def run(self, task: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            pickle.dump(task, self.proc.stdin)
            self.proc.stdin.flush()
            reply = pickle.load(self.proc.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError) as e:
            raise WorkerError(
                f"worker process {self.proc.pid} ended without a result "
                f"(exit status {self.proc.poll()}): {self.stderr_tail() or type(e).__name__}"
            ) from None
        if isinstance(reply, TaskFailure):
            raise WorkerError(str(reply), reply)
        return reply  # what the task's run() returned

    def stderr_tail(self, lines: int = 3) -> str:
        self.log.seek(0)
        text = self.log.read().decode("utf-8", errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


class WorkerPool:
    """Worker processes kept across batches of tasks (a search compiles in rounds): each
    simulates ``devices`` CPU devices (``targets``: with the deviceless compilers set up).
    A worker that dies is replaced for the remaining tasks; closing kills any still busy."""

    def __init__(self, devices: int, workers: int, *, targets: bool = False) -> None:
        self.devices, self.workers, self.targets = devices, workers, targets
        self.local = threading.local()
        self.started: list[_Worker] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shardscope-plan")
        self.finished = True

    def _worker(self) -> _Worker:
        w = getattr(self.local, "worker", None)
        if w is None or w.proc.poll() is not None:
            w = _Worker(self.devices, self.targets)
            self.local.worker = w
            with self.lock:
                self.started.append(w)
        return w

    def run(self, tasks: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Yields ``(index, result or WorkerError)`` as each of ``tasks`` finishes."""
        self.finished = False

        def job(task: Any) -> Any:
            return self._worker().run(task)

        futures = {self.pool.submit(job, t): i for i, t in enumerate(tasks)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                yield i, fut.result()
            except WorkerError as e:
                yield i, e
        self.finished = True

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for w in self.started:
                if not self.finished and w.proc.poll() is None:
                    w.proc.kill()  # stopped early (an error, Ctrl-C): do not wait for compiles
                w.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_tasks(tasks: Sequence[Task], devices: int, workers: int) -> Iterator[tuple[int, Any]]:
    """Runs ``tasks`` on ``workers`` processes; yields ``(index, result or error)`` as each
    finishes. A worker that dies is replaced for the remaining tasks."""
    with WorkerPool(devices, workers) as pool:
        yield from pool.run(tasks)


def work(devices: int, targets: bool = False) -> int:
    """The worker's loop: simulate ``devices`` devices (``targets``: and set up the deviceless
    compilers), then answer each task read on stdin with :func:`run_task` (what its
    ``run()`` returns, or the :class:`TaskFailure` of what it raised) until stdin ends."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the results channel
    use_cpu_devices(devices)
    if targets:
        from shardscope._src.targets.plugins import prepare_targets

        prepare_targets()
    inp = sys.stdin.buffer
    while True:
        try:
            task = pickle.load(inp)
        except EOFError:
            return 0
        pickle.dump(run_task(task), out)
        out.flush()
