"""The README's examples run as written: every ``python`` block, each in a fresh interpreter
with warnings as errors, and the pages it links to exist."""

import re
from pathlib import Path

import pytest

from helpers import run_example

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def _heading(code: str) -> str:
    """The README heading above ``code``, as the test's id."""
    before = README[: README.index(code)]
    return re.findall(r"^## (.+)$", before, re.M)[-1].lower().replace(" ", "-")


def test_the_readme_is_short_and_has_its_three_examples():
    assert len(README.splitlines()) <= 200
    assert [_heading(b) for b in BLOCKS] == [
        "lay-out-an-array",
        "audit-a-program",
        "plan-training-and-serving",
    ]


@pytest.mark.parametrize("code", BLOCKS, ids=[_heading(b) for b in BLOCKS])
def test_every_python_block_runs_as_written(code, tmp_path):
    out = run_example(code, tmp_path)
    lines = out.splitlines()
    heading = _heading(code)
    if heading == "lay-out-an-array":
        # (4, 256, 6) float32 shards: 24 KiB a device, each element held once
        assert lines[0] == f"{4 * 256 * 6 * 4} 1"
    elif heading == "audit-a-program":
        # one all-reduce of the (16, 1024) float32 partial products over 'model'
        payload = 16 * 1024 * 4
        assert f"all-reduce ('model',) 1 {payload} {2 * 7 * payload // 8}" in lines
    else:
        trained, served = lines[-2:]
        assert trained.endswith("fits: True") and " a step, " in trained
        assert " ms a token, " in served and served.endswith(" tokens/s a chip")


def test_every_link_of_the_readme_is_a_file():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
