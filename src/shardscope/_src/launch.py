"""A local launcher for multi-process JAX runs: P processes on this machine, one supervisor.

It exists to test multi-process code on one machine (a laptop, a CI runner); a real cluster
starts its processes with its own launcher (``srun``, ``mpirun``, a Kubernetes job) and JAX
detects them. The supervisor prefixes every output line with the process index, and ends the
whole run as soon as one process dies: JAX gives the survivors no error to catch, they would
block in their next collective until the heartbeat timeout (100 s) and then abort.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from shardscope._src.base.devices import MAX_CPU_DEVICES
from shardscope._src.base.errors import ShardscopeError, is_int

# Flags the launcher gives each process itself; a sub-command must not carry them.
LAUNCHER_FLAGS = ("--coordinator", "--num-processes", "--process-id", "--devices", "--distributed")
# JAX processes in a distributed run take SIGTERM as a preemption notice and go on, so the grace
# before SIGKILL is only for code that acts on that notice; keep it short.
DEFAULT_GRACE_S = 2.0
_TICK_S = 0.05  # how often the supervisor looks at the clock and at signals it noted
_SETTLE_S = 0.2  # after a failure, how long to wait for peers failing in its wake


@dataclass(frozen=True)
class ProcessOutcome:
    """How one process of a run ended: its exit status and whether the launcher ended it."""

    index: int
    pid: int
    returncode: int  # negative: killed by that signal (subprocess's convention)
    ended_by_launcher: str | None  # the last signal the launcher sent, e.g. "SIGTERM"
    elapsed_s: float

    @property
    def how(self) -> str:
        return describe_returncode(self.returncode)


@dataclass(frozen=True)
class LaunchResult:
    """The outcome of a run: ``exit_code`` 0 only when every process exited 0."""

    exit_code: int
    status: str  # "ok", "failed", "timeout" or "interrupted"
    message: str  # one line, naming the process that failed and how
    processes: tuple[ProcessOutcome, ...]
    elapsed_s: float
    first_failure: int | None = None  # index of the process whose death ended the run


def describe_returncode(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _StopSignals:
    """Notes SIGINT (Ctrl-C), SIGTERM and SIGHUP while a run lasts (main thread only).

    The handler only notes the signal, and the supervisor acts on it within ``_TICK_S``:
    an exception raised at an arbitrary point (inside ``Popen``, say) could leave a process
    running untracked.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = self.received or signal.Signals(signum).name


def supervise(
    commands: Sequence[Sequence[str]],
    *,
    timeout_s: float | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    env: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> LaunchResult:
    """Runs ``commands[i]`` as process ``i``, all at once, until all end, one fails, or time's up.

    Each process runs in its own session (process group), with its stdout and stderr lines
    copied to ``stdout``/``stderr`` (default: this process's) prefixed with ``[i] ``. When a
    process exits non-zero or is killed, or ``timeout_s`` passes, or this process gets Ctrl-C
    (SIGINT), SIGTERM or SIGHUP, every remaining process group gets SIGTERM, and SIGKILL after
    ``grace_s`` seconds. It returns once every process is gone.

    Exit code: 0 when all exit 0; else the failed process's exit code, 128 + its signal number
    when killed, 124 on timeout, 130 when interrupted.
    """
    if not commands or any(not c for c in commands):
        raise ShardscopeError("supervise needs at least one command, and no empty command")
    if timeout_s is not None and not timeout_s > 0:
        raise ShardscopeError(f"timeout must be a positive number of seconds, got {timeout_s}")
    n = len(commands)
    envs: list[Mapping[str, str] | None]
    if env is None or isinstance(env, Mapping):
        envs = [env] * n
    else:
        envs = list(env)
        if len(envs) != n:
            raise ShardscopeError(f"{len(envs)} environments for {n} commands")
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    run = _Run(time.monotonic())
    status = "ok"
    first: int | None = None
    with _StopSignals() as stops:
        try:
            for i, cmd in enumerate(commands):
                run.start(i, cmd, envs[i], out, err)
            deadline = None if timeout_s is None else run.t0 + timeout_s
            while len(run.ended_at) < n:
                if stops.received:
                    status = "interrupted"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    status = "timeout"
                    break
                wait = _TICK_S if deadline is None else min(_TICK_S, deadline - time.monotonic())
                try:
                    run.events.get(timeout=max(0.0, wait))
                except queue.Empty:
                    continue
                if any(run.procs[i].returncode != 0 for i in run.ended_at):
                    # Peers of a dead process often fail a moment later (a collective breaks):
                    # let those exits arrive so they are reported as theirs, not as ended by
                    # the launcher. The waiters time-stamp each exit; the earliest failure is
                    # named first (best effort: exits a few ms apart may be seen out of order).
                    run.settle(_SETTLE_S)
                    failed = [i for i in run.ended_at if run.procs[i].returncode != 0]
                    first = min(failed, key=run.ended_at.__getitem__)
                    status = "failed"
                    break
            run.end_all(grace_s)
        finally:
            # Whatever happened (even an error starting process k), no process stays behind.
            run.end_all(0.0)
            run.join_readers()

    outcomes = tuple(
        ProcessOutcome(
            i, p.pid, int(p.returncode), run.sent.get(i), round(run.ended_at[i] - run.t0, 3)
        )
        for i, p in enumerate(run.procs)
    )
    elapsed = time.monotonic() - run.t0
    code, message = _verdict(status, outcomes, first, timeout_s, elapsed, stops.received)
    return LaunchResult(code, status, message, outcomes, round(elapsed, 3), first)


class _Run:
    """The processes of one run, a waiter thread each that time-stamps its exit, and readers."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ended_at: dict[int, float] = {}  # monotonic time each process was seen to end
        self.sent: dict[int, str] = {}  # the last signal the launcher sent each process
        self.events: queue.Queue[int] = queue.Queue()
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._waiters: list[threading.Thread] = []

    def start(
        self, i: int, cmd: Sequence[str], env: Mapping[str, str] | None, out: IO[str], err: IO[str]
    ) -> None:
        p = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else dict(env),
            start_new_session=True,  # its own process group, so it is ended as a whole
        )
        self.procs.append(p)
        for pipe, target in ((p.stdout, out), (p.stderr, err)):
            self._thread(self._readers, _copy_lines, pipe, target, f"[{i}] ", self._lock)
        self._thread(self._waiters, self._wait, i, p)

    @staticmethod
    def _thread(into: list[threading.Thread], target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        into.append(t)

    def _wait(self, i: int, p: subprocess.Popen[bytes]) -> None:
        p.wait()
        self.ended_at[i] = time.monotonic()
        self.events.put(i)

    def settle(self, seconds: float) -> None:
        """Waits up to ``seconds`` for more processes to end (all of them, at most)."""
        stop = time.monotonic() + seconds
        while len(self.ended_at) < len(self.procs) and time.monotonic() < stop:
            try:
                self.events.get(timeout=max(0.0, stop - time.monotonic()))
            except queue.Empty:
                break

    def end_all(self, grace_s: float) -> None:
        """SIGTERM to every live process group, SIGKILL after ``grace_s``; sweeps the groups."""
        for i in range(len(self._waiters), len(self.procs)):  # interrupted inside start()
            self._thread(self._waiters, self._wait, i, self.procs[i])
        live = [i for i in range(len(self.procs)) if i not in self.ended_at]
        for i in live:
            if _signal_group(self.procs[i], signal.SIGTERM):
                self.sent[i] = "SIGTERM"
                # A stopped process acts on SIGTERM only once woken.
                _signal_group(self.procs[i], signal.SIGCONT)
        stop = time.monotonic() + grace_s
        for i in live:
            self._waiters[i].join(timeout=max(0.0, stop - time.monotonic()))
        for i in live:
            if i not in self.ended_at and _signal_group(self.procs[i], signal.SIGKILL):
                self.sent[i] = "SIGKILL"
        for t in self._waiters:
            t.join()
        # A process's children (its group) can outlive it; none may outlive the run.
        for p in self.procs:
            _signal_group(p, signal.SIGKILL)

    def join_readers(self) -> None:
        for t in self._readers:
            t.join(timeout=5)


def _copy_lines(pipe: Any, target: IO[str], prefix: str, lock: threading.Lock) -> None:
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with lock:
                target.write(f"{prefix}{line}\n")
                target.flush()


def _signal_group(p: subprocess.Popen[bytes], sig: signal.Signals) -> bool:
    try:
        os.killpg(p.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _verdict(
    status: str,
    outcomes: tuple[ProcessOutcome, ...],
    first: int | None,
    timeout_s: float | None,
    elapsed: float,
    received: str | None = None,
) -> tuple[int, str]:
    n = len(outcomes)
    ended = [o for o in outcomes if o.ended_by_launcher]
    ended_text = (
        "; ended " + ", ".join(f"process {o.index} ({o.ended_by_launcher})" for o in ended)
        if ended
        else ""
    )
    others = [
        o for o in outcomes if o.index != first and not o.ended_by_launcher and o.returncode != 0
    ]
    others_text = "".join(f"; process {o.index} {o.how}" for o in others)
    if status == "ok":
        return 0, f"all {n} processes exited 0 in {elapsed:.1f} s"
    if status == "failed":
        assert first is not None
        o = outcomes[first]
        code = o.returncode if o.returncode > 0 else 128 - o.returncode
        return code, (
            f"process {first} of {n} {o.how} after {o.elapsed_s:.1f} s{others_text}{ended_text}"
        )
    if status == "timeout":
        return 124, (
            f"timed out after {timeout_s:g} s with {len(ended)} of {n} processes still running"
            f"{others_text}{ended_text}"
        )
    by = f" by {received}" if received else ""
    return 130, f"interrupted{by} after {elapsed:.1f} s{others_text}{ended_text}"


def shardscope_commands(
    command: Sequence[str],
    num_processes: int,
    *,
    devices_per_process: int | None = None,
    coordinator: str,
    python: str | None = None,
) -> list[list[str]]:
    """``python -m shardscope COMMAND ... --coordinator C --num-processes P --process-id i``."""
    base = [python or sys.executable, "-m", "shardscope", *command]
    base += ["--coordinator", coordinator, "--num-processes", str(num_processes)]
    if devices_per_process is not None:
        base += ["--devices", str(devices_per_process)]
    return [base + ["--process-id", str(i)] for i in range(num_processes)]


#: The sub-commands that join a multi-process run, and those that do not (``plan``, ``serve``
#: and ``shard`` simulate the devices they plan for in one process; their ``--devices`` is
#: that count, not the launcher's flag, so they are refused for what they are first).
MULTIPROCESS_COMMANDS = ("lab", "audit")
SINGLE_PROCESS_COMMANDS = ("diff", "plan", "profile", "serve", "shard", "suggest")
#: At most this many local processes: each is a whole JAX runtime (about 150 MB and a second
#: of start-up), so far more than the cores only thrashes the machine.
MAX_PROCESSES = 64


def check_launch_size(num_processes: int, devices_per_process: int | None) -> None:
    """Refuses a run this machine cannot hold, before any process starts."""

    if num_processes > MAX_PROCESSES:
        raise ShardscopeError(
            f"num_processes={num_processes}: the launcher starts at most {MAX_PROCESSES} local "
            f"processes (each is a whole JAX runtime); use fewer processes and give each more "
            f"devices_per_process",
            param=("num_processes", "devices_per_process"),
        )
    total = num_processes * (devices_per_process or 1)
    if total > MAX_CPU_DEVICES:
        raise ShardscopeError(
            f"num_processes={num_processes} x devices_per_process={devices_per_process} = "
            f"{total} devices, more than JAX's CPU backend runs in one program "
            f"({MAX_CPU_DEVICES})",
            param=("num_processes", "devices_per_process"),
        )


#: Set in each launched process's environment: the launcher's pid, which it must not outlive.
LAUNCHER_PID_ENV = "SHARDSCOPE_LAUNCHER_PID"


def die_with_launcher() -> None:
    """In a launched process: have Linux kill it when the launcher dies, so a launcher killed
    by SIGKILL or the OOM killer leaves no process behind. A no-op elsewhere."""
    want = os.environ.get(LAUNCHER_PID_ENV, "")
    if not want.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # the launcher's own clean-up still ends its children
    if os.getppid() != int(want):  # the launcher died before the request took effect
        os._exit(128 + int(signal.SIGKILL))


def check_launch_command(command: Sequence[str]) -> None:
    """Refuses a sub-command the launcher cannot run, with why (before any process starts)."""
    if not command:
        raise ShardscopeError(
            "no sub-command to run: put it after '--', e.g. 'shardscope launch -n 2 -- lab'"
        )
    if command[0] == "launch":
        raise ShardscopeError("'launch' cannot launch itself; give the sub-command to run")
    if command[0] in SINGLE_PROCESS_COMMANDS:
        raise ShardscopeError(
            f"'{command[0]}' cannot run as several processes; the launcher runs "
            f"{' and '.join(MULTIPROCESS_COMMANDS)}"
        )
    clash = [a for a in command if a.split("=", 1)[0] in LAUNCHER_FLAGS]
    if clash:
        sets = (
            f"the launcher sets {', '.join(LAUNCHER_FLAGS)} for each process itself; remove "
            f"{' '.join(clash)} from the sub-command, and give the devices of each process as"
        )
        raise ShardscopeError(
            f"{sets} devices_per_process",
            param="devices_per_process",
            shell=f"{sets} --devices-per-process N (before the --)",
        )


def launch(
    command: Sequence[str],
    num_processes: int,
    *,
    devices_per_process: int | None = 4,
    timeout_s: float | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> LaunchResult:
    """Runs ``shardscope COMMAND ...`` as ``num_processes`` local processes of one JAX run.

    Every process gets ``--coordinator 127.0.0.1:PORT`` (a free loopback port),
    ``--num-processes``, its ``--process-id`` and ``--devices devices_per_process`` (simulated
    CPU devices each, so the mesh has ``num_processes * devices_per_process`` devices;
    ``None`` leaves each process its default). ``JAX_PLATFORMS=cpu`` is set unless the
    environment already sets ``JAX_PLATFORMS``, so several processes on one host never contend
    for its accelerators. See :func:`supervise` for output, failures and exit codes.

    Not run as a doctest (it starts two processes and writes ``scores/``):

    >>> result = launch(["lab", "--out", "scores"], 2)  # doctest: +SKIP
    >>> result.exit_code  # doctest: +SKIP
    0
    """
    if not is_int(num_processes, 1):
        raise ShardscopeError(
            f"num_processes={num_processes!r}: the number of processes must be a positive whole "
            f"number",
            param="num_processes",
        )
    if devices_per_process is not None and not is_int(devices_per_process, 1):
        raise ShardscopeError(
            f"devices_per_process={devices_per_process!r}: the devices per process must be a "
            f"positive whole number (or None: each process's default)",
            param="devices_per_process",
        )
    command = list(command)
    check_launch_command(command)
    check_launch_size(num_processes, devices_per_process)
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as printed, not at exit
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    coordinator = f"127.0.0.1:{free_port()}"
    commands = shardscope_commands(
        command, num_processes, devices_per_process=devices_per_process, coordinator=coordinator
    )
    return supervise(
        commands, timeout_s=timeout_s, grace_s=grace_s, env=env, stdout=stdout, stderr=stderr
    )
