"""Planning on the real compilers: compile time per plan per compiler, wall time, peak memory.

Runs ``shardscope plan`` as a user would (a fresh process each time, its process tree's peak
resident memory sampled) for the cases the targets are meant to meet:

* ``--model 7b --devices 64 --hardware h100``     (aim: 60 s on 2 cores)
* ``--model 7b --devices 64 --hardware tpu-v5p``  (aim: 180 s)
* ``--model 70b --devices 1024 --hardware tpu-v5p`` (aim: it completes)

and prints, per case, the sweep's wall time and peak memory, then each plan's compile time
on the CPU compiler (the screening) and on the target's compiler, its memory per device as
the target's buffer assignment has it (or the compiler's out-of-memory words), and the fit.
Needs the ``gpu-compile`` and ``tpu-compile`` extras (``make test`` installs them).

    python benchmarks/plan_targets.py            # all three cases
    python benchmarks/plan_targets.py h100       # only the cases whose hardware matches
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from plan_speed import run_measured  # the same sampler of a process tree's memory

CASES = [
    ("7b", 64, "h100", 60.0),
    ("7b", 64, "tpu-v5p", 180.0),
    ("70b", 1024, "tpu-v5p", None),
]


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    for model, devices, hardware, aim in CASES:
        if wanted and hardware not in wanted:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            argv = ["plan", "--model", model, "--devices", str(devices)]
            argv += ["--hardware", hardware, "--compiler", hardware, "--json", str(out)]
            code, wall, peak, err = run_measured([sys.executable, "-m", "shardscope", *argv])
            if code != 0:
                print(f"{model} on {devices} x {hardware}: failed: {err[-500:]}")
                continue
            data = json.loads(out.read_text())
        aim_text = f" (aim {aim:g} s)" if aim else ""
        print(
            f"{model} on {devices} x {hardware}: {wall:.1f} s{aim_text}, peak memory "
            f"{peak / 2**30:.2f} GiB, {len(data['plans'])} plans, compiler "
            f"{data['compiler']}, best {data['best']}"
        )
        print(
            f"  {'plan':28} {'cpu compile':>11} {'target compile':>14} {'analytic':>10} "
            f"{'target mem':>10}  fits"
        )
        for p in data["plans"]:
            timing = p["timing"]
            target_s = timing.get("target_compile_s")
            print(
                f"  {p['strategy'] + ' ' + p['mesh']:28} {timing['compile_s']:10.1f}s "
                f"{'-' if target_s is None else f'{target_s:.1f}s':>14} "
                f"{_gib(p['memory_bytes_per_device']):>10} "
                f"{_gib(p['target_memory_bytes_per_device']):>10}  "
                f"{'yes' if p['fits'] else 'no'}"
                + (f"  ({p['target_error'][:90]})" if p["target_error"] else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
