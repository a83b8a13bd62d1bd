"""``shardscope.suggest`` against hand-written shardings, and its speed.

For each program of the suite (the README's Flax NNX MLP; an Equinox decoder with no
logical names, searched array by array; a Flax NNX Llama-like decoder with logical names),
each device count and each target compiler, prints the best proposal, the best of the three
hand-written rule sets by the same cost model (each compiled on every mesh shape by
``plan_program``), their ratio, the search time and the compiles done.

The speed line: the NNX decoder on 64 devices with the H100 compiler and a budget of 24
compiles (target: at most 60 s on 2 cores); the search stops earlier when it settles.

Run: ``python benchmarks/suggest.py [--cases mlp:8:h100,llama:64:tpu-v5p,...] [--speed]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "..", "tests", "programs")
sys.path.insert(0, PROGRAMS)

import shardscope  # noqa: E402

shardscope.use_cpu_devices(8)

import eqx_transformer  # noqa: E402
import flax_mlp  # noqa: E402
import nnx_llama  # noqa: E402

DEFAULT_CASES = [
    f"{p}:{n}:{t}" for p in ("mlp", "eqx", "llama") for n in (8, 64) for t in ("h100", "tpu-v5p")
]


def hand_best(program: str, devices: int, target: str) -> tuple[str, float, int]:
    """The best hand-written plan: (label, step time, seconds to plan)."""
    t = time.perf_counter()
    if program == "eqx":
        plans = [
            shardscope.plan_program(
                eqx_transformer.make_step_with(name),
                devices,
                axes=("data", "model"),
                axis_types="auto",
                target=target,
                name=name,
            ).best
            for name in ("dp", "tp", "dp_tp")
        ]
        named = [(n, p) for n, p in zip(("dp", "tp", "dp_tp"), plans, strict=True) if p]
        name, best = min(named, key=lambda np_: np_[1].step_time_s)
        label = f"{name} {best.mesh_spec}"
    else:
        module = flax_mlp if program == "mlp" else nnx_llama
        result = shardscope.plan_program(
            module.make_step, devices, rules=module.RULES, axis_types="auto", target=target
        )
        best = result.best
        label = best.label
    return label, best.step_time_s, round(time.perf_counter() - t)


def run(program: str, devices: int, target: str, compiles: int) -> None:
    t = time.perf_counter()
    if program == "eqx":
        result = shardscope.suggest(
            eqx_transformer.train_step,
            devices,
            args=eqx_transformer.arguments(),
            axis_types="auto",
            target=target,
            compiles=compiles,
            workers=0,  # the arguments stay in this process
        )
    else:
        module = flax_mlp if program == "mlp" else nnx_llama
        result = shardscope.suggest(
            module.make_step,
            devices,
            axis_types="auto",
            target=target,
            compiles=compiles,
            compare=False,
        )
    wall = time.perf_counter() - t
    best = result.best
    hand_label, hand_s, hand_wall = hand_best(program, devices, target)
    rules = ", ".join(f"{k}->{v}" for k, v in best.rules if v) or "all replicated"
    print(
        f"{program:5} {devices:3} {target:8} best {best.plan.mesh_spec:16} "
        f"{best.step_time_s * 1e6:9.2f} us ({rules}); hand {hand_label} {hand_s * 1e6:9.2f} us; "
        f"ratio {best.step_time_s / hand_s:.2f}; {result.candidates} screened, "
        f"{result.compiled} compiled in {wall:.1f} s (hand rules: {hand_wall} s)",
        flush=True,
    )


def speed() -> None:
    t = time.perf_counter()
    result = shardscope.suggest(
        nnx_llama.make_step, 64, axis_types="auto", target="h100", compiles=24, compare=False
    )
    wall = time.perf_counter() - t
    settled = "settled" if result.settled else "budget spent"
    print(
        f"speed: the NNX decoder on 64 H100s, {result.compiled} of up to 24 compiles by the "
        f"H100 compiler ({settled}): {wall:.1f} s (target <= 60 s on 2 cores; compile "
        f"{result.timing['compile_s']:.1f} s); best {result.best.label} "
        f"{result.best.step_time_s * 1e3:.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--compiles", type=int, default=12)
    parser.add_argument("--speed", action="store_true", help="only the speed line")
    args = parser.parse_args()
    if not args.speed:
        for case in args.cases.split(","):
            program, devices, target = case.split(":")
            run(program, int(devices), target, args.compiles)
    speed()


if __name__ == "__main__":
    main()
