"""The local launcher: real 2-process JAX runs, a worker killed or stopped, Ctrl-C, bad input."""

import argparse
import importlib.metadata
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardscope
from helpers import assert_usage_error, sub_parser
from shardscope._src.launch import free_port, supervise

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="finding left-over processes needs /proc"
)

SHARDSCOPE = [sys.executable, "-m", "shardscope"]
WORKER = str(Path(__file__).with_name("mp_worker.py"))


def _env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _processes_with(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose command line contains ``marker``: pid -> cmdline."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            found[int(d.name)] = cmd
    return found


def _wait_for_worker(marker: str, index: int, timeout_s: float = 30) -> int:
    """The pid of worker ``index`` of a launched run, as soon as it exists."""
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        for pid, cmd in _processes_with(marker).items():
            if cmd.rstrip().endswith(f"--process-id {index}"):
                return pid
        time.sleep(0.01)
    raise AssertionError(f"worker {index} of the run with {marker!r} never appeared")


def _assert_no_result(out: Path) -> None:
    """No scorecard and no half-written file (a finished PNG from before the failure may stay)."""
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in left if n.endswith((".json", ".tmp")) or n.startswith(".")], left


def _launch_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*SHARDSCOPE, "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


@pytest.mark.slow
def test_lab_two_processes_of_four_devices(tmp_path):
    r = subprocess.run(
        [*SHARDSCOPE, "launch", "-n", "2", "--devices-per-process", "4", "--timeout", "120"]
        + ["--", "lab", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert all(line.startswith(("[0] ", "[1] ")) for line in lines), r.stdout
    jax_version = importlib.metadata.version("jax")
    assert f"[0] sharding_taster: JAX {jax_version}, backend cpu, 8 x cpu, 2 processes" in lines
    # Only process 0 reports and writes, once.
    assert [x for x in lines if "checks passed" in x] == [
        "[0] [sharding_taster] 16/16 checks passed (100%); skipped=0"
    ]
    assert [x[:10] for x in lines if x[4:].startswith("wrote ")] == ["[0] wrote "]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "sharding_taster.json",
        "sharding_taster_memory.png",
    ]
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    assert (data["passed"], data["total"], data["skipped"], data["score"]) == (16, 16, 0, 1.0)
    by_name = {x["name"]: x for x in data["results"]}
    assert by_name["param_row_shards"]["details"] == {"shard_shape": [128, 1024], "devices": 8}
    assert by_name["all_processes_passed"]["details"] == {"failed_by_process": [0, 0]}
    assert "dp=2 x mp=4: shards 4 x 256" in by_name["mesh_2d_shards"]["message"]
    assert not _processes_with(str(tmp_path))


@pytest.mark.slow
def test_a_killed_worker_ends_the_run(tmp_path):
    out = tmp_path / "out"
    launcher = _launch_cli("-n", "2", "--", "lab", "--out", str(out))
    # Killed as soon as it exists, process 1 never joins; process 0 waits for it (300 s by
    # default). Deaths inside a collective: test_a_worker_dying_in_a_collective.
    os.kill(_wait_for_worker(str(out), 1), signal.SIGKILL)
    killed = time.monotonic()
    stdout, stderr = launcher.communicate(timeout=30)
    assert time.monotonic() - killed < 30
    assert launcher.returncode == 128 + signal.SIGKILL, stdout + stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("shardscope launch: process 1 of 2 was killed by SIGKILL after "), last
    assert "ended process 0" in last
    _assert_no_result(out)
    assert not _processes_with(str(out))


@pytest.mark.slow
def test_a_hung_run_ends_at_the_timeout(tmp_path):
    out = tmp_path / "out"
    launcher = _launch_cli("-n", "2", "--timeout", "2", "--", "lab", "--out", str(out))
    os.kill(_wait_for_worker(str(out), 1), signal.SIGSTOP)  # it hangs; process 0 waits for it
    stdout, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 124, stdout + stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("shardscope launch: timed out after 2 s with 2 of 2 processes"), last
    assert "process 0 (SIG" in last and "process 1 (SIG" in last
    _assert_no_result(out)
    assert not _processes_with(str(out))


@pytest.mark.slow
def test_ctrl_c_ends_the_run(tmp_path):
    out = tmp_path / "out"
    launcher = _launch_cli("-n", "2", "--", "lab", "--out", str(out))
    _wait_for_worker(str(out), 1)
    launcher.send_signal(signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, stdout + stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("shardscope launch: interrupted by SIGINT after "), last
    assert "Traceback" not in stderr
    assert not _processes_with(str(out))


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, code, how",
    [
        ("kill", 128 + signal.SIGKILL, "was killed by SIGKILL"),
        ("raise", 1, "exited with code 1"),
    ],
)
def test_a_worker_dying_in_a_collective(mode, code, how):
    # Process 1 fails after the run formed; process 0 then waits in a collective for it, which
    # JAX would only give up after its heartbeat timeout (100 s).
    coordinator = f"127.0.0.1:{free_port()}"
    commands = [[sys.executable, WORKER, coordinator, "2", str(i), "1", mode] for i in range(2)]
    out, err = io.StringIO(), io.StringIO()
    r = supervise(commands, timeout_s=60, env=_env(), stdout=out, stderr=err)
    assert r.status == "failed", r.message
    assert r.processes[1].how == how and r.processes[1].ended_by_launcher is None
    # Process 0 may fail too, a few ms later, when its collective breaks; exits that close
    # cannot always be ordered, so both are named and the exit code is the first one's.
    first = r.processes[r.first_failure].returncode
    assert r.exit_code == (first if first > 0 else 128 - first)
    if r.first_failure == 1:
        assert r.message.startswith(f"process 1 of 2 {how} after "), r.message
        assert r.exit_code == code
    else:
        assert r.first_failure == 0 and r.processes[0].ended_by_launcher is None
        assert r.message.startswith("process 0 of 2 "), r.message
        assert f"; process 1 {how}" in r.message, r.message
    assert "formed 2 processes, gathered [0, 1]" in out.getvalue()
    assert r.elapsed_s < 30
    assert not _processes_with(coordinator)


def test_prefixes_every_line_and_keeps_streams_apart():
    out, err = io.StringIO(), io.StringIO()
    say = "import sys; print('hello'); print('oops', file=sys.stderr); print('a', end='')"
    r = supervise(
        [[sys.executable, "-c", say], [sys.executable, "-c", "print('x\\ny')"]],
        stdout=out,
        stderr=err,
    )
    assert (r.status, r.exit_code, r.message) == ("ok", 0, r.message)
    assert r.message.startswith("all 2 processes exited 0 in ")
    assert sorted(out.getvalue().splitlines()) == ["[0] a", "[0] hello", "[1] x", "[1] y"]
    assert err.getvalue() == "[0] oops\n"


def test_exit_code_of_the_failed_process_and_the_others_ended():
    r = supervise(
        [
            [sys.executable, "-c", "import time; time.sleep(60)"],
            [sys.executable, "-c", "raise SystemExit(5)"],
        ],
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert (r.status, r.exit_code, r.first_failure) == ("failed", 5, 1)
    assert r.message.startswith("process 1 of 2 exited with code 5 after ")
    assert r.message.endswith("; ended process 0 (SIGTERM)")
    assert r.processes[0].returncode == -signal.SIGTERM
    assert r.elapsed_s < 30


def test_timeout_ends_whole_process_groups():
    marker = f"600.{os.getpid()}"  # a sleep only this test starts, in a grandchild
    r = supervise(
        [["sh", "-c", f"sleep {marker} & sleep {marker}"]] * 2,
        timeout_s=1,
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert (r.status, r.exit_code) == ("timeout", 124)
    assert r.message.startswith("timed out after 1 s with 2 of 2 processes still running")
    assert r.elapsed_s < 10
    assert not _processes_with(f"sleep {marker}")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["launch", "-n", "0", "--", "lab"], "0 must be a positive whole number"),
        (["launch", "-n", "two", "--", "lab"], "'two' is not a whole number"),
        (["launch", "--", "lab"], "required: -n/--num-processes"),
        (["launch", "-n", "2"], "no sub-command to run: put it after '--'"),
        (["launch", "-n", "2", "--"], "no sub-command to run: put it after '--'"),
        (["launch", "-n", "2", "--", "teleport"], "invalid choice: 'teleport'"),
        (["launch", "-n", "2", "--", "lab", "--frob"], "unrecognized arguments: --frob"),
        (["launch", "-n", "2", "--", "lab", "--devices", "4"], "remove --devices"),
        (["launch", "-n", "2", "--", "lab", "--process-id=1"], "remove --process-id=1"),
        (["launch", "-n", "2", "--", "launch", "-n", "2"], "cannot launch itself"),
        (["launch", "-n", "2", "--timeout", "0", "--", "lab"], "positive number of seconds"),
        # their --devices is the count they plan for: the reason is that they run in one process
        (
            ["launch", "-n", "2", "--", "serve", "--model", "tiny", "--devices", "8"],
            "'serve' cannot run as several processes; the launcher runs lab and audit",
        ),
        (
            ["launch", "-n", "2", "--", "shard", "x.py:f", "--devices", "8"],
            "'shard' cannot run as several processes",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    line = assert_usage_error(argv, words, capsys)
    if "cannot run as several" in words:
        assert "remove --devices" not in line, line


def _takes_launcher_options(parser: argparse.ArgumentParser) -> bool:
    """Whether ``parser`` (or, for one with programs, every program's parser) takes the options
    that join a multi-process run."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        return all(_takes_launcher_options(p) for p in subs[0].choices.values())
    return any("--coordinator" in a.option_strings for a in parser._actions)


def test_every_sub_command_is_known_to_the_launcher_as_what_its_parser_says():
    """The launcher's two lists are the parser's sub-commands split by whether they take
    --coordinator, so a sub-command is refused for the right reason before its flags are read."""
    from shardscope._src.launch import MULTIPROCESS_COMMANDS, SINGLE_PROCESS_COMMANDS

    top = sub_parser(())
    commands = dict(
        next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    )
    commands.pop("launch")
    joins = {name for name, p in commands.items() if _takes_launcher_options(p)}
    assert set(MULTIPROCESS_COMMANDS) == joins
    assert set(SINGLE_PROCESS_COMMANDS) == set(commands) - joins


def test_bad_input_in_a_real_process_starts_nothing():
    r = subprocess.run(
        [*SHARDSCOPE, "launch", "-n", "0", "--", "lab"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_audit_two_processes_reports_once(tmp_path):
    path = tmp_path / "matmul.json"
    r = subprocess.run(
        [*SHARDSCOPE, "launch", "-n", "2", "--devices-per-process", "4", "--timeout", "120"]
        + ["--", "audit", "matmul", "--json", str(path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    reported = [x[:3] for x in r.stdout.splitlines() if "all-reduce" in x]
    assert reported and set(reported) == {"[0]"}  # process 0 alone prints
    data = json.loads(path.read_text())
    (c,) = data["collectives"]
    assert (c["kind"], c["axes"], c["group_size"], c["payload_bytes"]) == (
        "all-reduce",
        ["model"],
        8,
        16 * 1024 * 4,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matmul.json"]


@pytest.mark.slow
def test_workers_die_with_a_killed_launcher(tmp_path):
    out = tmp_path / "out"
    launcher = _launch_cli("-n", "2", "--timeout", "60", "--", "lab", "--out", str(out))
    workers = [_wait_for_worker(str(out), i) for i in (0, 1)]
    for line in launcher.stdout:  # both have joined the run: process 0 reports its devices
        if "sharding_taster: JAX" in line:
            break
    for pid in workers:  # frozen, they would outlive a closed pipe: only the kernel ends them
        os.kill(pid, signal.SIGSTOP)
    launcher.kill()  # SIGKILL: the launcher cannot clean up
    launcher.communicate(timeout=30)
    stop = time.monotonic() + 20
    while time.monotonic() < stop and _processes_with(str(out)):
        time.sleep(0.05)
    left = _processes_with(str(out))
    for pid in left:  # whatever the outcome, leave nothing behind
        os.kill(pid, signal.SIGKILL)
    assert not left, workers


@pytest.mark.parametrize(
    "args, words",
    [
        (["-n", "100000", "--", "lab"], "at most 64 local processes"),
        (["-n", "100000", "--", "lab"], "(flags -n/--num-processes, --devices-per-process)"),
        (["-n", "64", "--devices-per-process", "64", "--", "lab"], "= 4096 devices"),
        (["-n", "2", "--", "lab", "--devices", "2"], "as --devices-per-process N (before"),
        (["-n", "2", "--", "plan", "--model", "tiny", "--devices", "8"], "'plan' cannot run"),
        # the lab's arrays over 3 x 1 devices, named by the launcher's flags
        (["-n", "3", "--devices-per-process", "1", "--", "lab"], "3 processes x 1 = 3 devices"),
        (["-n", "3", "--", "lab"], "3 processes x 4 = 12 devices"),
        (["-n", "3", "--", "lab"], "8 in all (flags --devices-per-process, -n/--num-processes)"),
    ],
)
def test_runs_it_cannot_hold_are_refused_before_starting(args, words, capsys):
    assert_usage_error(["launch", *args], words, capsys)


@pytest.mark.parametrize(
    "kwargs, words, params",
    [
        ({"num_processes": 100}, "num_processes=100", ("num_processes", "devices_per_process")),
        (
            {"num_processes": 64, "devices_per_process": 64},
            "num_processes=64 x devices_per_process=64 = 4096 devices",
            ("num_processes", "devices_per_process"),
        ),
        ({"num_processes": 0}, "num_processes=0", ("num_processes",)),
        ({"num_processes": True}, "num_processes=True", ("num_processes",)),
        ({"num_processes": 2, "devices_per_process": 2.0}, "=2.0", ("devices_per_process",)),
    ],
)
def test_the_library_names_its_parameters_not_flags(kwargs, words, params):
    with pytest.raises(shardscope.ShardscopeError) as info:
        shardscope.launch(["lab"], **kwargs)
    assert words in str(info.value) and info.value.params == params
    assert "-n " not in str(info.value) and "--devices" not in str(info.value)
