"""shardscope.suggest on a real Ray cluster, started on this machine's loopback."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import shardscope
from helpers import assert_usage_error, mlp_search
from shardscope._src.audit.user_program import load_program
from shardscope._src.plan.types import SkipReason

pytestmark = pytest.mark.slow  # a Ray cluster

PROGRAMS = Path(__file__).parent / "programs"
MLP = f"{PROGRAMS / 'flax_mlp.py'}:make_step"

#: A program that kills the process building it for a mesh of more than one device: once (a
#: marker file remembers), or every time.
DYING = """
import os, sys
sys.path.insert(0, {programs!r})
from flax_mlp import RULES, make_step as _make_step

def make_step(mesh, rules=()):
    if mesh.size > 1 and ({always} or not os.path.exists({marker!r})):
        open({marker!r}, "a").close()
        os._exit(1)
    return _make_step(mesh, rules)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray head on the loopback, started as users start one; its address.

    The head runs in the foreground (``--block``) and is stopped by ending that one process, not
    by ``ray stop``, which stops every Ray process of the machine: another worker of the suite
    may hold a cluster of its own.
    """
    ray_bin = Path(sys.executable).parent / "ray"
    port = _free_port()
    # Ray 2.52 warns that it will stop hiding accelerators from tasks that ask for none; say
    # now that it should (these tasks compile deviceless or on the CPU)
    env = {**os.environ, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    # one CPU: one Ray worker at a time (each starts its own JAX), beside the suite's others
    start = [str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=1", "--block"]
    start += ["--include-dashboard=false", "--disable-usage-stats"]
    log = tmp_path_factory.mktemp("ray") / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen(start, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # the head stops the processes it started, and only those
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def _rows(result):
    return [
        (p.label, p.rules, dict(p.mesh), p.step_time_s, p.memory_bytes_per_device)
        for p in result.proposals
    ]


def test_a_local_cluster_compiles_the_proposals_this_process_does(cluster):
    make_step, here = mlp_search()  # (the search test_suggest reads, in this process)
    there = shardscope.suggest(make_step, 8, axis_types="auto", compiles=4, ray=cluster)
    assert _rows(there) == _rows(here) and there.compiled == 4


def test_an_unreachable_address_is_one_line_within_seconds(tmp_path, capsys):
    out = tmp_path / "rules.json"
    start = time.perf_counter()
    argv = ["shard", MLP, "--devices", "8", "--ray", "127.0.0.1:1", "--out", str(out)]
    assert_usage_error(argv, "cannot reach the Ray cluster at 127.0.0.1:1", capsys)
    assert time.perf_counter() - start < 10
    assert not out.exists()
    with pytest.raises(shardscope.PlanError, match="HOST:PORT"):
        shardscope.suggest(load_program(MLP), 8, axis_types="auto", ray="nowhere")


def _dying(tmp_path, always):
    marker = tmp_path / "died"
    path = tmp_path / f"dying_{'always' if always else 'once'}.py"
    path.write_text(DYING.format(programs=str(PROGRAMS), always=always, marker=str(marker)))
    return load_program(f"{path}:make_step"), marker


@pytest.fixture(scope="module")
def connected(cluster):
    """This process connected to the cluster itself (``ray.init``), once for the tests below:
    a Ray worker lives as long as the connection it started under, so the worker a test's
    search leaves alive takes the next test's first task, where a connection of each test's
    own would start (and import JAX in) a worker again."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as RayPool connects
        ray.init(address=cluster, logging_level="ERROR", log_to_driver=False)
        try:
            yield cluster
        finally:
            ray.shutdown()


def test_a_worker_killed_mid_search_has_its_compile_run_again(connected, tmp_path):
    make_step, marker = _dying(tmp_path, always=False)
    # a cluster the program connected to itself is used without ray=
    result = shardscope.suggest(make_step, 8, axis_types="auto", compiles=2, compare=False)
    assert marker.exists()  # a worker died building its candidate
    assert len(result.proposals) == 2 and not result.skipped


def test_a_candidate_lost_on_every_try_is_skipped_not_proposed(connected, tmp_path):
    make_step, marker = _dying(tmp_path, always=True)
    result = shardscope.suggest(
        make_step, 8, axis_types="auto", compiles=1, compare=False, ray=connected
    )
    assert marker.exists() and result.proposals == () and result.best is None
    assert [s.reason for s in result.skipped] == [SkipReason.LOST]
