"""Joining a multi-process run: validation, the CLI option group, JAX's cluster detection."""

import io
import json
import os
import subprocess
import sys

import jax
import pytest

import shardscope
from helpers import assert_usage_error
from shardscope._src.base.distributed import is_loopback, parse_coordinator
from shardscope._src.launch import free_port, supervise

SHARDSCOPE = [sys.executable, "-m", "shardscope"]
# Variables by which JAX detects a cluster: none may leak into a test that expects none.
_CLUSTER_VARS = ("SLURM_", "OMPI_", "PMI_", "KUBERNETES_", "JAX_COORDINATOR")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLUSTER_VARS)}
    return {**env, "JAX_PLATFORMS": "cpu"}


def test_no_values_is_a_single_process_run():
    assert shardscope.initialize_distributed() is False
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"num_processes": 2}, "coordinator, process_id not given"),
        ({"coordinator": "127.0.0.1:1234", "process_id": 0}, "num_processes not given"),
        ({"coordinator": "127.0.0.1:1", "num_processes": 0, "process_id": 0}, "must be positive"),
        ({"coordinator": "127.0.0.1:1", "num_processes": 2, "process_id": 2}, "0 to 1"),
        ({"coordinator": "127.0.0.1:1", "num_processes": 2, "process_id": -1}, "out of range"),
        ({"coordinator": "127.0.0.1:1", "num_processes": True, "process_id": 0}, "whole number"),
        ({"coordinator": "127.0.0.1", "num_processes": 2, "process_id": 0}, "HOST:PORT"),
    ],
)
def test_bad_values_raise_before_touching_jax(kwargs, words):
    with pytest.raises(shardscope.ShardscopeError, match=words):
        shardscope.initialize_distributed(**kwargs)
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("address", ["localhost", "host:", ":123", "h:0", "h:70000", "h:port"])
def test_bad_coordinator_addresses(address):
    with pytest.raises(shardscope.ShardscopeError, match="HOST:PORT"):
        parse_coordinator(address)


def test_coordinator_addresses():
    assert parse_coordinator("127.0.0.1:1234") == ("127.0.0.1", 1234)
    assert parse_coordinator("[::1]:80") == ("::1", 80)
    assert parse_coordinator("node001:65535") == ("node001", 65535)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("10.0.0.1", "node001", "0.0.0.0")] == [False] * 3


def test_too_late_once_the_backend_runs():
    jax.devices()  # the suite's backend is running from here on, whatever ran before
    with pytest.raises(shardscope.DeviceSetupError, match="before the first JAX computation"):
        shardscope.initialize_distributed("127.0.0.1:1234", 2, 0)
    assert isinstance(shardscope.DeviceSetupError("x"), RuntimeError)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["lab", "--coordinator", "nowhere"], "'nowhere' must be HOST:PORT"),
        (["lab", "--num-processes", "0"], "0 must be a positive whole number"),
        (["lab", "--process-id", "-1"], "-1 must be 0 or more"),
        (["lab", "--num-processes", "2"], "coordinator, process_id not given"),
        (
            ["lab", "--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"],
            "process_id 2 is out of range",
        ),
    ],
)
def test_bad_flags_are_one_line_exit_2(argv, words, capsys):
    assert_usage_error(argv, words, capsys)


def test_distributed_flag_without_a_cluster_says_how_to_fix():
    r = subprocess.run(
        [*SHARDSCOPE, "lab", "--distributed", "--devices", "2"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "cluster detection found no value for coordinator" in r.stderr
    assert "(flags --coordinator, --num-processes, --process-id)" in r.stderr


@pytest.mark.slow
def test_lab_under_slurm_is_detected_by_jax(tmp_path):
    # What srun gives each task; JAX's SlurmCluster reads these (coordinator = first node).
    port = free_port()
    envs = [
        {
            **_clean_env(),
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(i),
            "SLURM_LOCALID": str(i),
            "JAX_COORDINATOR_PORT": str(port),
        }
        for i in range(2)
    ]
    cmd = [*SHARDSCOPE, "lab", "--distributed", "--devices", "2", "--out", str(tmp_path)]
    out = io.StringIO()
    r = supervise([cmd, cmd], env=envs, timeout_s=120, stdout=out, stderr=io.StringIO())
    assert r.exit_code == 0, r.message + out.getvalue()
    head = f"[0] sharding_taster: JAX {jax.__version__}, backend cpu, 4 x cpu, 2 processes"
    assert head in out.getvalue()
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    assert data["passed"] == data["total"] == 16
    by_name = {x["name"]: x for x in data["results"]}
    assert by_name["param_row_shards"]["details"] == {"shard_shape": [256, 1024], "devices": 4}
