import json
import os
import subprocess
import sys

import pytest

import shardscope
from helpers import assert_drawn, assert_usage_error, bars, read_png
from shardscope._src.cli.main import main


@pytest.mark.parametrize(
    "argv, words",
    [
        (["lab", "--devices", "0"], "0 must be a positive whole number"),
        (["lab", "--devices", "-3"], "-3 must be a positive whole number"),
        (["lab", "--devices", "eight"], "'eight' is not a whole number"),
        (["lab", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["teleport"], "invalid choice: 'teleport'"),
        ([], "required: COMMAND"),
        (["audit", "transpose"], "invalid choice: 'transpose'"),
        (["audit", "matmul", "--mesh", "dp=2,dp=4"], "axis name 'dp' is repeated"),
        (["audit", "matmul", "--mesh", "model=3"], "1024 is not divisible by 3"),
        (["lab", "--devices", "1_0"], "'1_0' is not a whole number"),
        (["audit", "reshard", "--devices", "4"], "give --devices 8 or a smaller mesh"),
        (["lab", "--out", ""], "argument --out: is empty"),
        (["lab", "--out", "/proc/version/x"], "'/proc/version' is a file, not a folder"),
        # the file the lab writes there, not one it never writes
        (["lab", "--out", "/proc/x"], "cannot write '/proc/x/sharding_taster.json'"),
        (["audit", "matmul", "--json", "/tmp"], "'/tmp' is a folder, not a file"),
        (["audit", "matmul", "--json", ""], "argument --json: is empty"),
        (["audit", "matmul", "--mesh", "model=99999999999"], "more than this tool supports"),
        # a value that starts with '-' is read as the next flag: the line says how to write it
        (["plan", "--model", "llama3-8b", "--devices", "8", "--memory", "-5GB"], "--memory=VALUE"),
        (["plan", "--model", "llama3-8b", "--devices", "8", "--memory=-5GB"], "-5GB must be a"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, words, capsys):
    assert_usage_error(argv, words, capsys)


def test_a_mesh_larger_than_the_running_backend_is_one_line_exit_2(capsys):
    # Before JAX starts, the command would simulate the 64 devices the mesh needs; once JAX
    # runs with the suite's 8 devices, it cannot, and says so.
    import jax

    assert len(jax.devices()) == 8
    argv = ["audit", "matmul", "--mesh", "model=64"]
    line = assert_usage_error(argv, "needs 64 devices but 8 are available", capsys)
    assert "give --devices 64, or a mesh of at most 8 devices" in line
    assert "use_cpu_devices" not in line  # the Python fix is no use in the shell


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "matmul", "--mesh", "model=4"],
        ["audit", "transformer", "--strategy", "tp", "--mesh", "model=4", "--layers", "1"],
        ["audit", "moe", "--mesh", "expert=4", "--tokens", "512", "--d-model", "64"],
    ],
    ids=["matmul", "transformer", "moe"],
)
def test_a_mesh_smaller_than_the_devices_uses_the_first_ones(argv, tmp_path, capsys):
    out = tmp_path / "audit.json"
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_partitions"] == 4


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="positive"):
        main(["audit", "matmul", "--mesh", "model=0", "--debug"])


def test_output_checked_before_any_work(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as info:
        main(["lab", "--out", str(afile / "sub")])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "is a file, not a folder" in err


DOCUMENTED_CHECKS = [
    "mesh_1d",
    "param_row_shards",
    "matmul_matches_single_device",
    "matmul_one_all_reduce",
    "reshard_to_columns",
    "reshard_to_replicated",
    "reshard_in_jit_one_all_to_all",
    "mesh_2d_shards",
    "per_device_bytes",
    "memory_plot_png",
    "tp_block_matches_single_device",
    "tp_forward_minimum_collectives",
    "tp_shard_map_matches_single_device",
    "tp_shard_map_same_collectives",
    "sp_verdict",
]


def test_lab_in_process(tmp_path, capsys):
    assert main(["lab", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[sharding_taster]" in out and "checks passed (100%)" in out
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    assert data["passed"] == data["total"] > 0
    assert [r["name"] for r in data["results"]] == DOCUMENTED_CHECKS
    assert data["hardware"]["device_count"] == 8
    image = read_png(tmp_path / "sharding_taster_memory.png")
    assert_drawn(image, 858, 484)  # (0.6 x 8 devices + 3) x 4.4 inches at 110 dpi
    # A bar a device for each layout of the (1024, 1024) f32 array: replicated holds all of
    # it, 1-D P('model', None) and 2-D P('dp', 'mp') an eighth (heights within a pixel).
    whole, rows, blocks = (bars(image, c) for c in ("C0", "C1", "C2"))
    assert len(whole) == len(rows) == len(blocks) == 8
    assert len(set(whole)) == 1 and rows == blocks and len(set(rows)) == 1
    assert abs(whole[0] / 8 - rows[0]) <= 1.5, (whole, rows)


def test_lab_cold_process_with_4_devices(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, "-m", "shardscope", "lab", "--devices", "4", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    by_name = {x["name"]: x for x in data["results"]}
    assert by_name["param_row_shards"]["details"]["shard_shape"] == [256, 1024]
    assert "dp=2 x mp=2: shards 4 x 512" in by_name["mesh_2d_shards"]["message"]


def test_lab_exit_1_when_a_check_fails(tmp_path, monkeypatch, capsys):
    # a claim that does not hold (the matmul's all-reduce said to move 1 byte): the lab says
    # so as a failed check, runs the others and exits 1
    from shardscope._src.base.comm import CollectiveKind
    from shardscope._src.sharding import demos

    monkeypatch.setitem(demos.DEMO_FACTS, "matmul", (CollectiveKind.ALL_REDUCE, 1))
    assert main(["lab", "--out", str(tmp_path)]) == 1
    assert "Traceback" not in capsys.readouterr().out
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    # every documented check is recorded: run, failed or skipped with a reason
    assert [x["name"] for x in data["results"]] == DOCUMENTED_CHECKS
    failed = [x["name"] for x in data["results"] if not x["passed"] and not x["skipped"]]
    assert failed == ["matmul_one_all_reduce"]


def test_lab_refuses_a_device_count_its_arrays_do_not_split_over(tmp_path, capsys):
    from shardscope._src.lab import taster

    # 1024 rows and columns, and a tensor-parallel block of 8 heads: the divisors of 8
    assert taster.lab_device_counts() == (1, 2, 4, 8)
    for n in (3, 6, 16):
        line = assert_usage_error(["lab", "--devices", str(n), "--out", str(tmp_path)], "", capsys)
        assert line == (
            f"shardscope: error: devices={n}: the lab splits a 1024 x 1024 parameter and a "
            f"tensor-parallel decoder block of 8 heads evenly over every device, and {n} "
            f"devices do not divide them; give 1, 2, 4 or 8 (flag --devices)\n"
        )
    assert list(tmp_path.iterdir()) == []  # refused before anything ran
    with pytest.raises(shardscope.LayoutError) as info:
        taster.run(devices=3, out_dir=tmp_path, verbose=False)
    assert info.value.params == ("devices",)


def test_on_one_device_the_lab_skips_what_counts_collectives(tmp_path):
    # one device communicates nothing: the checks of collectives are skipped, not failed
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, "-m", "shardscope", "lab", "--devices", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "sharding_taster.json").read_text())
    assert [x["name"] for x in data["results"]] == DOCUMENTED_CHECKS
    skipped = {x["name"]: x["message"] for x in data["results"] if x["skipped"]}
    nothing = "one device: nothing to communicate"
    assert {k: v for k, v in skipped.items() if v == nothing} == {
        name: nothing
        for name in (
            "matmul_one_all_reduce",
            "reshard_in_jit_one_all_to_all",
            "tp_forward_minimum_collectives",
            "tp_shard_map_same_collectives",
        )
    }
    assert data["passed"] == data["total"] > 0


def test_bad_devices_no_traceback_in_a_real_process():
    r = subprocess.run(
        [sys.executable, "-m", "shardscope", "lab", "--devices", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_audit_command_writes_json(tmp_path, capsys):
    path = tmp_path / "matmul.json"
    assert main(["audit", "matmul", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "all-reduce" in out and "model" in out
    data = json.loads(path.read_text())
    assert data["counts"]["all-reduce"] == 1
    assert sum(data["counts"].values()) == 1
    (c,) = data["collectives"]
    assert (c["axes"], c["payload_bytes"], c["count"]) == (["model"], 16 * 1024 * 4, 1)


def test_the_strategies_help_names_what_a_sweep_of_a_mixture_screens(capsys):
    from shardscope._src.cli.main import main
    from shardscope._src.train.candidates import DEFAULT_STRATEGIES, MOE_STRATEGIES

    with pytest.raises(SystemExit) as stop:
        main(["plan", "--help"])
    assert stop.value.code == 0
    # argparse wraps the list anywhere, within a name too
    said = "".join(capsys.readouterr().out.split())
    assert f"(default:{','.join(DEFAULT_STRATEGIES)};" in said
    assert f"foramixtureofexpertsorlatentattention,{','.join(MOE_STRATEGIES)})" in said
