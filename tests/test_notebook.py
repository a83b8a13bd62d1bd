"""The taster notebook runs headless, errors disallowed, and its two paired files agree."""

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from helpers import assert_drawn, bars, read_png

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_pair_in_sync():
    text = jupytext.read(NOTEBOOKS / "sharding_taster.py")
    ipynb = jupytext.read(NOTEBOOKS / "sharding_taster.ipynb")
    assert [(c.cell_type, c.source) for c in text.cells] == [
        (c.cell_type, c.source) for c in ipynb.cells
    ]


@pytest.mark.slow
def test_notebook_executes(tmp_path):
    nb = nbformat.read(NOTEBOOKS / "sharding_taster.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    outputs = "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "8 x cpu" in outputs
    assert "[sharding_taster_notebook] 15/15 checks passed (100%)" in outputs
    assert "float32[1024x1024] P('model', None)" in outputs  # the layout table
    assert "all-reduce" in outputs and "all-to-all" in outputs  # the audit tables
    assert (tmp_path / "scores" / "sharding_taster_notebook.json").exists()
    image = read_png(tmp_path / "scores" / "sharding_taster_notebook_memory.png")
    assert_drawn(image, 858, 484)  # (0.6 x 8 devices + 3) x 4.4 inches at 110 dpi
    assert [len(bars(image, c)) for c in ("C0", "C1", "C2")] == [8, 8, 8]  # 3 layouts, 8 devices
