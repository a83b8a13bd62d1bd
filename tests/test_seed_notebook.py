"""The seed notebook's own code, run as its users ran it: cell by cell in a fresh kernel, with
shardscope's ``bootstrap`` in place of the cookbook's. It must print its summary line and
write its JSON, as it did with the harness it was written for."""

import json
import os
import re
from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # a notebook kernel

SEED = Path(__file__).resolve().parent / "fixtures" / "seed" / "jax_sharding_taster.md"
LAB_ID = "07_gpu_08_jax_sharding_pipeline"
#: The checks the notebook makes, in its order.
CHECKS = [
    "mesh_has_multiple_devices",
    "shard_row_count_matches_mesh",
    "shard_col_count_is_full",
    "sharded_matmul_matches_single_device",
    "shard_batch_equals_global_over_dp",
    "shard_features_equal_global_over_mp",
]


def _text(cell) -> str:
    """What a cell showed, as plain text (rich's colours taken out)."""
    shown = "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", [])
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", shown)


def test_seed_notebook_prints_its_summary_and_writes_its_json(tmp_path):
    nb = jupytext.read(SEED)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.splitlines()[0] == "from shardscope import bootstrap"
    assert code[-1].source == "s.summary()\ns.save()"
    # The notebook's own os.environ line sets the 8 devices; nothing inherited may.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    client = NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)

    assert "devices = 8" in _text(code[1])
    everything = "".join(_text(c) for c in code)
    passes = [line.split()[1] for line in everything.splitlines() if line.startswith("PASS ")]
    assert passes == CHECKS
    last = _text(code[-1])
    assert f"[{LAB_ID}] 6/6 checks passed (100%); skipped=0\n" in last
    assert f"PosixPath('scores/{LAB_ID}.json')" in last  # the value of s.save(), displayed

    saved = json.loads((tmp_path / "scores" / f"{LAB_ID}.json").read_text())
    assert (saved["lab_id"], saved["passed"], saved["total"], saved["skipped"]) == (
        LAB_ID,
        6,
        6,
        0,
    )
    assert [r["name"] for r in saved["results"]] == CHECKS
    assert all(r["passed"] for r in saved["results"])
    assert saved["hardware"]["device_count"] == 8
    assert sorted(p.name for p in (tmp_path / "scores").iterdir()) == [f"{LAB_ID}.json"]
