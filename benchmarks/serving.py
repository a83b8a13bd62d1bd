"""Serving estimates against ../shared/CALIBRATION.md set 4: the scaling book's worked
examples (its memory-bound decode steps, reproduced by ``serve(..., compiler="cpu")``'s
estimates within 5%) and a measured serving row, the planner's compiled programs at the
row's request rate, and the planner on published measured runs it was not calibrated on
(``serving_accuracy.HELD_OUT``, judged as ``serving_accuracy.py`` judges them).

Run: ``python benchmarks/serving.py``.
"""

from __future__ import annotations

import time

from serving_accuracy import HELD_OUT, judge

from shardscope._src.model.presets import model_preset
from shardscope._src.model.serving import cache_bytes_per_token
from shardscope._src.serve.search import serve
from shardscope._src.serve.types import ServePlan


def row(what: str, got: float, given: float, unit: str) -> float:
    error = got / given - 1
    print(f"{what:66} {got:10.4g} {unit:6} given {given:8.4g}  {error:+6.1%}")
    return abs(error)


def _estimated(model: str, devices: int, batch: int, mesh: dict[str, int], **kw: str) -> ServePlan:
    """The estimated plan of ``model`` on ``devices`` TPU v5e chips at ``batch`` sequences of
    the book's 8,192 tokens, laid out on ``mesh``: the device alone (``engine="none"``), as
    the book prices it, its whole memory for the weights and the cache."""
    result = serve(
        model, devices, hardware="tpu-v5e", prompt=4096, output=4096, batch=batch,
        compiler="cpu", engine="none", **kw,
    )  # fmt: skip
    return next(p for p in result.plans if p.mesh == mesh)


def main() -> None:
    c70 = model_preset("llama3-70b").config(batch=1)
    errors = []
    print("analytic rows (scaling book, TPU v5e; the estimates of serve(compiler='cpu')):")
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
    r = _estimated("llama3-70b", 8, 32, {"model": 8}, weights="int8", cache="int8")
    cache, weights = r.cache_bytes_per_device * 8, r.weight_bytes_per_device * 8
    errors.append(row("70B batch 32 x 8192, int8: cache", cache / 1e9, 41.9, "GB"))
    errors.append(
        row("70B batch 32 x 8192, int8: weights + cache", (cache + weights) / 1e9, 112, "GB")
    )
    errors.append(
        row("70B decode step's traffic on 8 chips (4x2)", r.decode_memory_s * 1e3, 17, "ms")
    )
    for batch, given in ((1, 4.98), (8, 12.13), (16, 20.30)):
        step = _estimated("llama2-13b", 8, batch, {"model": 8}).decode_memory_s * 1e3
        errors.append(
            row(f"13B bf16 decode step's traffic, 8 chips, batch {batch}", step, given, "ms")
        )
    print(f"{len(errors)} analytic rows: worst |error| {max(errors):.1%} (target 5%)")
    print("measured row (TensorRT-LLM 0.14, 1 H100, bf16):")
    # the row's server: TensorRT-LLM (its engine's host costs)
    trt = {"engine": "tensorrt-llm"}
    one = serve("llama3-8b", 1, hardware="h100", prompt=467, output=256, batch=1, compiler="cpu",
                **trt)  # fmt: skip
    row(
        "Llama 3.1 8B time per output token (estimated, batch 1)",
        one.best.decode_step_s * 1e3,
        8,
        "ms",
    )
    row("Llama 3.1 8B time to first token (estimated)", one.best.first_token_s * 1e3, 23, "ms")
    # the same run through serve(): online at 2 requests/s, prefills batched in flight
    plan = serve("llama3-8b", 1, hardware="h100", prompt=467, output=256, rate=2, **trt)
    best = plan.best
    print(
        f"serve at 2 requests/s ({best.compiled_by or 'estimate'}): {best.in_flight:.2f} "
        f"sequences in flight, batch {best.batch}; decode step "
        f"{best.decode_iteration_s * 1e3:.3f} ms ({best.decode_kernels} kernels), prefill "
        f"{best.prefill_s * 1e3:.2f} ms"
    )
    row("serve: time per output token at 2 requests/s", best.decode_step_s * 1e3, 8, "ms")
    row("serve: time to first token at 2 requests/s", best.first_token_s * 1e3, 23, "ms")
    judge("held-out measured runs (judged, not calibrated on):", HELD_OUT, None)
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
