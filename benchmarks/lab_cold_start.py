"""Cold wall time of `shardscope lab` against a plain JAX start measured in the same run.

The baseline is a new Python process that imports JAX and runs its first operation
(``jax.numpy.zeros(1).block_until_ready()``): what any JAX program pays before its own work.
Each measurement is the best of ``--runs`` new processes, the two kinds taken in turn so that
a busy machine slows both alike. Also shown: a bare ``import shardscope``, the baseline's
``import jax`` alone, and how many of shardscope's modules the lab loads.

Target: the lab at most 4x the baseline. Run: `python benchmarks/lab_cold_start.py`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

TARGET_RATIO = 4.0

BASELINE = "import jax; jax.numpy.zeros(1).block_until_ready()"
IMPORT_JAX = "import jax"
IMPORT_SHARDSCOPE = "import shardscope"
#: The lab in this process, to count the modules it loads (not timed).
LAB_MODULES = (
    "import sys; from shardscope._src.cli.main import main; "
    "rc = main(['lab', '--devices', '{devices}', '--out', '{out}']); "
    "print(len([m for m in sys.modules if m.startswith('shardscope')]), file=sys.stderr)"
)


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return elapsed


def _lab(devices: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        return _timed(
            [sys.executable, "-m", "shardscope", "lab", "--devices", str(devices), "--out", out]
        )


def _lab_modules(devices: int) -> int:
    with tempfile.TemporaryDirectory() as out:
        code = LAB_MODULES.format(devices=devices, out=out)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the lab failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return int(r.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="processes per measurement")
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"baseline": [], "lab": [], "jax": [], "shardscope": []}
    for _ in range(args.runs):
        times["baseline"].append(_timed([sys.executable, "-c", BASELINE]))
        times["lab"].append(_lab(args.devices))
        times["jax"].append(_timed([sys.executable, "-c", IMPORT_JAX]))
        times["shardscope"].append(_timed([sys.executable, "-c", IMPORT_SHARDSCOPE]))
    best = {k: min(v) for k, v in times.items()}
    ratio = best["lab"] / best["baseline"]
    print(f"cold starts, best of {args.runs} new processes each, {args.devices} devices")
    print(f"  import jax + first op (baseline)  {best['baseline']:6.2f} s")
    print(f"  shardscope lab                    {best['lab']:6.2f} s")
    print(f"  import jax                        {best['jax']:6.2f} s")
    print(f"  import shardscope                 {best['shardscope']:6.2f} s")
    print(f"  shardscope modules the lab loads  {_lab_modules(args.devices):6d}")
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    print(f"lab / baseline: {ratio:.2f}x ({verdict} the target of {TARGET_RATIO:g}x)")


if __name__ == "__main__":
    main()
