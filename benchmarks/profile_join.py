"""How long reading a trace and joining it to its audit takes: the target is a trace of
100,000 instruction events within 10 s on 2 cores.

The trace is a real one: the reference decoder's FSDP train step on 8 simulated CPU devices,
run under ``jax.profiler`` for as many steps as it takes to pass ``--events`` events of the
program (each step is a few thousand). Running the steps is not timed; reading the trace
(``jax.profiler.ProfileData``) and joining it are, separately, best of ``--repeat``.

Run: ``python benchmarks/profile_join.py`` (about a minute; ``--events 20000`` for a quick look).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import shardscope

shardscope.use_cpu_devices(8)

import jax  # noqa: E402

from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.profile.join import join  # noqa: E402
from shardscope._src.profile.trace import read_trace  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402

CONFIG = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events to reach")
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats (best kept)")
    options = parser.parse_args()

    prog = build_reference_program("fsdp", CONFIG, "data=8", mode="train")
    args = prog.example_args()
    audit = shardscope.audit(prog.fn, *args)
    jax.block_until_ready(prog.fn(*args))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):  # one step, to learn how many events a step makes
            jax.block_until_ready(prog.fn(*args))
        per_step = read_trace(folder).modules()[audit.module_name]
        steps = -(-options.events // per_step)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(steps):
                jax.block_until_ready(prog.fn(*args))
        reads, joins = [], []
        for _ in range(options.repeat):
            start = time.perf_counter()
            trace = read_trace(folder)
            reads.append(time.perf_counter() - start)
            start = time.perf_counter()
            result = join(trace, audit, program="fsdp train step")
            joins.append(time.perf_counter() - start)
    total, found, whole = result.coverage
    print(
        f"trace: {len(trace.events):,} instruction events ({result.events:,} of the program), "
        f"{result.steps} steps x {result.devices} devices"
    )
    print(f"join: {found} of {total} collectives found, {whole} run as often as the audit counts")
    print(f"read  {min(reads):6.2f} s  (jax.profiler.ProfileData, best of {options.repeat})")
    print(f"join  {min(joins):6.2f} s")
    print(f"total {min(reads) + min(joins):6.2f} s  (target: 10 s for 100,000 events)")


if __name__ == "__main__":
    main()
