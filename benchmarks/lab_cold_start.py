"""Cold wall time of `shardscope lab`: a new Python process each run, median of several.

Target: at most 10 s on a 2-core machine. Run: `python benchmarks/lab_cold_start.py`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    times = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "shardscope",
                    "lab",
                    "--devices",
                    str(args.devices),
                    "--out",
                    out,
                ],
                capture_output=True,
                text=True,
            )
            times.append(time.perf_counter() - start)
            if r.returncode != 0:
                sys.exit(f"shardscope lab failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    print(f"shardscope lab, {args.devices} devices, {args.runs} cold runs")
    print(
        f"  median {statistics.median(times):.2f} s  min {min(times):.2f} s  "
        f"max {max(times):.2f} s  (target <= 10 s)"
    )


if __name__ == "__main__":
    main()
