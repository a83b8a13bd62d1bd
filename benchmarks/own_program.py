"""Speed of auditing and planning a user's own program (a small Flax NNX train step).

Prints two numbers the project promises:

* audit overhead: ``shardscope.audit(step, *args)`` against lowering and compiling the same
  step alone (target: the audit adds at most 10% to the compile time);
* ``shardscope.plan_program`` of the Flax model over 8 devices and 3 rule sets (target: at
  most 30 s on 2 cores).

Run: ``python benchmarks/own_program.py`` (simulates 8 CPU devices).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "programs"))

import shardscope  # noqa: E402

shardscope.use_cpu_devices(8)

import flax_mlp  # noqa: E402
import jax  # noqa: E402
from flax import nnx  # noqa: E402

REPEATS = 5


def audit_overhead() -> None:
    mesh = shardscope.make_mesh("data=2,model=4", axis_types="auto")
    rules = flax_mlp.RULES["dp_tp"]
    compile_s, audit_s = [], []
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        step, args = flax_mlp.make_step(mesh, rules)
        for _ in range(REPEATS):
            # JAX keeps compiled programs in memory: start each measurement without them.
            jax.clear_caches()
            t = time.perf_counter()
            step.lower(*args).compile()
            compile_s.append(time.perf_counter() - t)
            jax.clear_caches()
            t = time.perf_counter()
            shardscope.audit(step, *args)
            audit_s.append(time.perf_counter() - t)
    c, a = statistics.median(compile_s), statistics.median(audit_s)
    print(
        f"audit of the Flax train step on data=2,model=4: lower+compile {c * 1e3:.0f} ms, "
        f"audit {a * 1e3:.0f} ms (median of {REPEATS}); the audit adds "
        f"{(a - c) / c * 100:+.1f}% (target <= 10%)"
    )


def plan_speed() -> None:
    jax.clear_caches()
    t = time.perf_counter()
    result = shardscope.plan_program(
        flax_mlp.make_step, devices=8, rules=flax_mlp.RULES, axis_types="auto"
    )
    wall = time.perf_counter() - t
    best = result.best.label if result.best else "none"
    print(
        f"plan_program of the Flax train step, 8 devices x {len(flax_mlp.RULES)} rule sets: "
        f"{len(result.plans)} plans, {len(result.skipped)} skipped, {wall:.1f} s on "
        f"{os.cpu_count()} cores (target <= 30 s); best {best}"
    )


if __name__ == "__main__":
    audit_overhead()
    plan_speed()
