"""The serving roofline against ../shared/CALIBRATION.md set 4: the scaling book's worked
examples (formulas: reproduced within 5%) and a measured serving row (for which the roofline
is a lower bound: no kernel efficiency, no scheduling, no communication), and the planner's
compiled programs at the row's request rate.

Run: ``python benchmarks/serving.py``.
"""

from __future__ import annotations

import time

from shardscope._src.model.presets import model_preset
from shardscope._src.plan.serve import serve
from shardscope._src.plan.serving import (
    cache_bytes_per_token,
    least_chips,
    prefill_s,
    serving_roofline,
)
from shardscope._src.targets.hardware import PRESETS


def row(what: str, got: float, given: float, unit: str) -> float:
    error = got / given - 1
    print(f"{what:58} {got:10.4g} {unit:6} given {given:8.4g}  {error:+6.1%}")
    return abs(error)


def main() -> None:
    v5e, h100 = PRESETS["tpu-v5e"], PRESETS["h100"]
    c70 = model_preset("llama3-70b").config(batch=1)
    c13 = model_preset("llama2-13b").config(batch=1)
    c8 = model_preset("llama3-8b").config(batch=1)
    errors = []
    print("analytic rows (scaling book, TPU v5e):")
    errors.append(
        row("70B KV cache per token, int8", cache_bytes_per_token(c70, "int8"), 160e3, "B")
    )
    errors.append(
        row(
            "70B KV cache of a 32k sequence, int8",
            cache_bytes_per_token(c70, "int8") * 32768 / 1e9,
            5.3,
            "GB",
        )
    )
    r = serving_roofline(c70, v5e, 8, 32, 8192, weights="int8", cache="int8")
    errors.append(row("70B batch 32 x 8192, int8: cache", r.cache_bytes / 1e9, 41.9, "GB"))
    errors.append(
        row(
            "70B batch 32 x 8192, int8: weights + cache",
            (r.cache_bytes + r.weight_bytes) / 1e9,
            112,
            "GB",
        )
    )
    chips = least_chips(c70, v5e, 32, 8192, weights="int8", cache="int8")
    errors.append(row("70B batch 32 x 8192, int8: least chips", chips, 7, "chips"))
    errors.append(row("70B decode step on 8 chips (4x2)", r.decode_step_s * 1e3, 17, "ms"))
    errors.append(row("70B tokens/s per chip on 8 chips", r.tokens_per_s_per_chip, 235, "tok/s"))
    r16 = serving_roofline(c70, v5e, 16, 32, 8192, weights="int8", cache="int8")
    errors.append(row("70B decode step on 16 chips (4x4)", r16.decode_step_s * 1e3, 8.5, "ms"))
    errors.append(
        row(
            "70B prefill of 8192 tokens, 16 chips, 40% MFU",
            prefill_s(c70, v5e, 16, 8192, 0.4),
            0.91,
            "s",
        )
    )
    for batch, given in ((1, 4.98), (8, 12.13), (16, 20.30)):
        step = serving_roofline(c13, v5e, 8, batch, 8192).decode_step_s * 1e3
        errors.append(row(f"13B bf16 decode step, 8 chips, batch {batch}", step, given, "ms"))
    print(f"{len(errors)} analytic rows: worst |error| {max(errors):.1%} (target 5%)")
    print("measured row (TensorRT-LLM 0.14, 1 H100, bf16; the roofline is a lower bound):")
    decode = serving_roofline(c8, h100, 1, 1, 467 + 256).decode_step_s * 1e3
    row("Llama 3.1 8B time per output token (roofline, batch 1)", decode, 8, "ms")
    first = prefill_s(c8, h100, 1, 467, h100.matmul_fraction) * 1e3
    row("Llama 3.1 8B time to first token (prefill at the matmul rate)", first, 23, "ms")
    # the same run through serve(): online at 2 requests/s, prefills batched in flight
    plan = serve("llama3-8b", 1, hardware="h100", prompt=467, output=256, rate=2)
    best = plan.best
    print(
        f"serve at 2 requests/s ({best.compiled_by or 'estimate'}): {best.in_flight:.2f} "
        f"sequences in flight, batch {best.batch}; decode step "
        f"{best.decode_iteration_s * 1e3:.3f} ms ({best.decode_kernels} kernels), prefill "
        f"{best.prefill_s * 1e3:.2f} ms"
    )
    row("serve: time per output token at 2 requests/s", best.decode_step_s * 1e3, 8, "ms")
    row("serve: time to first token at 2 requests/s", best.first_token_s * 1e3, 23, "ms")
    for model, devices, hardware in (
        ("llama3-70b", 8, "h100"),
        ("llama3-70b", 16, "tpu-v5e"),
        ("mixtral-8x7b", 8, "h100"),
    ):
        start = time.perf_counter()
        result = serve(model, devices, hardware=hardware, prompt=2048, output=256)
        wall = time.perf_counter() - start
        compiled = sum(p.compiled_by is not None for p in result.plans)
        print(
            f"plan --serve {model} on {devices} {hardware} (prompt 2048, output 256): "
            f"{wall:.1f} s, {len(result.plans)} plans fit, {compiled} compiled; best "
            f"{result.best.label}: {result.best.decode_step_s * 1e3:.1f} ms a token, "
            f"{result.best.first_token_s * 1e3:.0f} ms to the first, "
            f"{result.best.tokens_per_s_per_chip:,.0f} tokens/s a chip"
        )


if __name__ == "__main__":
    main()
