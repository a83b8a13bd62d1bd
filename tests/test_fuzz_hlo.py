"""Bad HLO never crashes, stalls or balloons: 10,000 seeded mutations of real compiler output.

Two processes (the suite's two cores) each run half of the cases of ``tests/hlo_fuzz.py`` and
report per-case time and memory; every case must end in an audit that renders, or in one line
of ``ShardscopeError``.
"""

import json
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parent / "hlo_fuzz.py"
CASES_PER_PROCESS = 5000
MAX_CASE_S = 2.0
MAX_CASE_BYTES = 500 * 2**20


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
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    cases = sum(r["cases"] for r in results)
    assert cases >= 10_000
    assert sum(r["audit"] + r["error"] + r["crash"] for r in results) == cases
    crashes = [c for r in results for c in r["crashes"]]
    assert not crashes, json.dumps(crashes[:3], indent=1)[:6000]
    # Both outcomes are common: the mutations neither break every text nor leave most intact.
    assert all(r["audit"] > r["cases"] // 5 and r["error"] > r["cases"] // 5 for r in results)
    # CPU seconds per case (wall-clock time also counts whatever else the machine runs).
    assert max(r["cpu_s"] for r in results) < MAX_CASE_S, results
    assert max(r["largest_bytes"] for r in results) < MAX_CASE_BYTES, results
