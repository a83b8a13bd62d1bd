"""The calibration rows planned as a user plans them: each published configuration pinned
(mesh, micro-batches, recomputation, offload, vocabulary split), compiled by its hardware's
own compiler (deviceless), and priced from the compiled program.

Per row: the compiled program's step time (what plans rank by) and the screening estimate's,
beside the measured step; the memory that decided the fit (the compiler's buffer assignment
plus the optimizer state the step does not hold) beside the analytic estimate, and their
ratio; and the measured peak where the source gives one.

Run: `python benchmarks/calibration_compiled.py [ROW-PREFIX ...]` (minutes: every row compiles
with a GPU or TPU compiler on this machine's CPUs).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from calibration import GIB, JUDGED_ROWS, MOE_ROWS, ROWS, Row  # noqa: E402

from shardscope import plan  # noqa: E402
from shardscope._src.base.text import format_mesh_spec  # noqa: E402


def _plan(row: Row):
    devices = 1
    for _, n in row.mesh:
        devices *= n
    return plan(
        row.config,
        devices,
        hardware=row.hardware,
        hardware_overrides=row.overrides,
        strategies=[row.strategy],
        mesh=format_mesh_spec(dict(row.mesh)),
        remat=row.remat,
        microbatches=row.microbatches,
        offload_optimizer=row.offload_optimizer,
        vocab_split=row.vocab_split,
        flash_attention=row.flash_attention,
        compiler=row.hardware,
        target_plans=1,
        compile_top=1,
    )


def main(prefixes: list[str]) -> None:
    every = ROWS + MOE_ROWS + JUDGED_ROWS
    rows = [r for r in every if not prefixes or any(r.name.startswith(p) for p in prefixes)]
    print(
        f"{'run':46} {'compiled':>9} {'estimate':>9} {'measured':>9} {'error':>7}  "
        f"{'fit mem':>8} {'analytic':>8} {'ratio':>6} {'fits':>4} {'peak':>8} {'s':>5}"
    )
    errors: dict[str, list[float]] = {}
    ratios = []
    for row in rows:
        t0 = time.perf_counter()
        result = _plan(row)
        on_target = [p for p in result.plans if p.compiled_by.name == row.hardware]
        p = on_target[0] if on_target else result.plans[0]
        step, est = p.step_time_s, p.estimated_time.step_s
        error = step / row.measured_s - 1
        group = "sets 1-2" if row in ROWS else "set 3" if row in MOE_ROWS else "judged"
        errors.setdefault(group, []).append(abs(error))
        fit, analytic = p.fit_memory_bytes_per_device, p.memory.total
        ratio = analytic / fit if p.target_memory is not None else float("nan")
        if p.target_memory is not None:
            ratios.append(ratio)
        peak = f"{row.peak_gib:.1f}" if row.peak_gib else "-"
        print(
            f"{row.name:46} {step:>8.3f}s {est:>8.3f}s {row.measured_s:>8.3f}s {error:>+7.1%}  "
            f"{fit / GIB:>8.1f} {analytic / GIB:>8.1f} {ratio:>6.2f} "
            f"{'yes' if p.fits else 'NO':>4} {peak:>8} {time.perf_counter() - t0:>5.0f}"
        )
        if p.target_error:
            print(f"{'':46} ({p.target_error})")
    for sets, got in errors.items():
        print(
            f"\n{sets}: {len(got)} rows, compiled step median |error| "
            f"{statistics.median(got):.1%}, worst {max(got):.1%}"
        )
    if ratios:
        print(f"analytic / compiler memory {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
