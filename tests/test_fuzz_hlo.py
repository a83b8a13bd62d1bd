"""Bad HLO never crashes or stalls: 10,000 seeded mutations of real compiler output.

Two processes (the suite's two cores) each run half of the cases of ``tests/hlo_fuzz.py``;
every case must end in an audit that renders, or in one line of ``ShardscopeError``, and the
whole run must end (a stalled case would hold its process past the timeout). How long a case
takes and how much memory it holds is measured by ``benchmarks/hostile_hlo.py``, which prints
the figures: a time limit here would fail with the machine's load, not with the code.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent / "hlo_fuzz.py"
CASES_PER_PROCESS = 5000
#: A run that has not ended by then has stalled (it takes about a minute on two cores).
STALL_S = 900


def test_mutated_hlo_audits_or_fails_in_one_line():
    runs = [
        subprocess.Popen(
            [sys.executable, str(HARNESS), "--seed", str(seed), "--cases", str(CASES_PER_PROCESS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    results = []
    for p in runs:
        try:
            out, err = p.communicate(timeout=STALL_S)
        except subprocess.TimeoutExpired:
            for q in runs:
                q.kill()
                q.communicate()
            pytest.fail(f"the fuzz run stalled: no result after {STALL_S} s")
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    cases = sum(r["cases"] for r in results)
    assert cases >= 10_000
    assert sum(r["audit"] + r["error"] + r["crash"] for r in results) == cases
    crashes = [c for r in results for c in r["crashes"]]
    assert not crashes, json.dumps(crashes[:3], indent=1)[:6000]
    # Both outcomes are common: the mutations neither break every text nor leave most intact.
    assert all(r["audit"] > r["cases"] // 5 and r["error"] > r["cases"] // 5 for r in results)
