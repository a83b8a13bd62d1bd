"""Bad HLO never crashes or stalls: 1,000 seeded mutations of real compiler output.

One process runs the cases of ``tests/hlo_fuzz.py``; every case must end in an audit that
renders, whose text's every instruction line was parsed as one instruction, or in one line of
``ShardscopeError``, and the whole run must end (a stalled case would hold its process past
the timeout). ``benchmarks/hostile_hlo.py`` runs 10,000 cases and measures how long a case
takes and how much memory it holds: a time limit here would fail with the machine's load, not
with the code.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "hlo_fuzz.py"
CASES = 1000
#: A run that has not ended by then has stalled (it takes about ten seconds).
STALL_S = 300


def test_mutated_hlo_audits_or_fails_in_one_line():
    try:
        p = subprocess.run(
            [sys.executable, str(HARNESS), "--seed", "0", "--cases", str(CASES)],
            capture_output=True,
            text=True,
            timeout=STALL_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the fuzz run stalled: no result after {STALL_S} s")
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["cases"] == CASES
    assert r["audit"] + r["error"] + r["crash"] == CASES
    assert not r["crashes"], json.dumps(r["crashes"][:3], indent=1)[:6000]
    assert r["crash"] == 0
    # Both outcomes are common: the mutations neither break every text nor leave most intact;
    # and the audited texts' instructions, each parsed from its own line, are many.
    assert r["audit"] > CASES // 5 and r["error"] > CASES // 5
    assert r["instructions"] > 10 * r["audit"]
