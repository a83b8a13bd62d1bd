"""Serving estimates against ../shared/CALIBRATION.md set 4: the scaling book's worked
examples (its memory-bound decode steps, reproduced by ``serve(..., compiler="cpu")``'s
estimates within 5%) and a measured serving row, the planner's compiled programs at the
row's request rate, and the planner on published measured runs it was not calibrated on
(:data:`HELD_OUT`).

Run: ``python benchmarks/serving.py``.
"""

from __future__ import annotations

import time

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
    the book's 8,192 tokens, laid out on ``mesh``."""
    result = serve(
        model, devices, hardware="tpu-v5e", prompt=4096, output=4096, batch=batch,
        compiler="cpu", **kw,
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
    one = serve("llama3-8b", 1, hardware="h100", prompt=467, output=256, batch=1, compiler="cpu")
    row(
        "Llama 3.1 8B time per output token (estimated, batch 1)",
        one.best.decode_step_s * 1e3,
        8,
        "ms",
    )
    row("Llama 3.1 8B time to first token (estimated)", one.best.first_token_s * 1e3, 23, "ms")
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
    held_out()
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


#: Measured serving runs the serving model was not calibrated on, each with its source:
#: ``(what, model, devices, layout mesh, hardware, weights, prompt, output, batch, measure,
#: given)``; ``measure`` "token": a decode step (time per output token); "first": one
#: prompt's prefill at batch 1 (time to the first token); "run": the run's end-to-end
#: latency, the batch's prefill and ``output - 1`` decode steps.
HELD_OUT = (
    # torchao README (pytorch/ao, torchao/quantization), the H100 table: Llama-3.1-8B in
    # bfloat16, batch 1, generate.py --compile, a 5-token prompt: 126.90 tokens/s
    ("torchao, H100, batch 1", "llama3-8b", 1, {}, "h100", "bfloat16", 5, 200, 1,
     "token", 1e3 / 126.90),
    # its A100-80GB table: Llama-3-8B 95.64 tokens/s, Llama-2-7B 107.38 tokens/s
    ("torchao, A100, batch 1", "llama3-8b", 1, {}, "a100", "bfloat16", 5, 200, 1,
     "token", 1e3 / 95.64),
    ("torchao, A100, batch 1", "llama2-7b", 1, {}, "a100", "bfloat16", 5, 200, 1,
     "token", 1e3 / 107.38),
    # vLLM's nightly latency benchmark (buildkite vllm/performance-benchmark build 9515):
    # batch 8, 32 tokens in and 128 out, H200, mean end-to-end 833.4 ms (8B, TP 1) and
    # 2,077.5 ms (70B, TP 4)
    ("vLLM nightly, H200, batch 8, 32 + 128", "llama3-8b", 1, {}, "h200", "bfloat16", 32,
     128, 8, "run", 833.4),
    ("vLLM nightly, H200, batch 8, 32 + 128", "llama3-70b", 4, {"model": 4}, "h200",
     "bfloat16", 32, 128, 8, "run", 2077.5),
    # TensorRT-LLM v0.5's docs/source/performance.md, low latency: the first token at batch
    # 1 (one output token), LLaMA 2 7B on 1 GPU and 70B on 4 (TP 4); A100 in fp16 (planned
    # in bfloat16: the same bytes and rate), H100 in fp8
    ("TensorRT-LLM v0.5, A100, fp16", "llama2-7b", 1, {}, "a100", "bfloat16", 128, 1, 1,
     "first", 16),
    ("TensorRT-LLM v0.5, A100, fp16", "llama2-7b", 1, {}, "a100", "bfloat16", 2048, 1, 1,
     "first", 133),
    ("TensorRT-LLM v0.5, A100, fp16", "llama2-70b", 4, {"model": 4}, "a100", "bfloat16", 128,
     1, 1, "first", 47),
    ("TensorRT-LLM v0.5, A100, fp16", "llama2-70b", 4, {"model": 4}, "a100", "bfloat16",
     2048, 1, 1, "first", 377),
    ("TensorRT-LLM v0.5, H100, fp8", "llama2-7b", 1, {}, "h100", "fp8", 128, 1, 1,
     "first", 7),
    ("TensorRT-LLM v0.5, H100, fp8", "llama2-7b", 1, {}, "h100", "fp8", 2048, 1, 1,
     "first", 36),
    ("TensorRT-LLM v0.5, H100, fp8", "llama2-70b", 4, {"model": 4}, "h100", "fp8", 128, 1,
     1, "first", 26),
    ("TensorRT-LLM v0.5, H100, fp8", "llama2-70b", 4, {"model": 4}, "h100", "fp8", 2048, 1,
     1, "first", 109),
)  # fmt: skip


def held_out() -> None:
    """The planner's plans of the :data:`HELD_OUT` runs against their measurements."""
    print("held-out measured runs (judged, not calibrated on):")
    errors = []
    for what, model, devices, mesh, hw, weights, prompt, output, batch, measure, given in HELD_OUT:
        result = serve(model, devices, hardware=hw, prompt=prompt, output=output,
                       batch=batch, weights=weights)  # fmt: skip
        plan = result.best if not mesh else next(p for p in result.plans if p.mesh == mesh)
        if measure == "token":
            got = plan.decode_step_s
        elif measure == "first":
            got = plan.first_token_s
        else:  # one prompt's prefill stands in for the batch's, about 1% of the run
            got = plan.first_token_s + (output - 1) * plan.decode_step_s
        label = f"{what}: {model} {measure} ({plan.compiled_by or 'estimate'})"
        errors.append(row(label, got * 1e3, given, "ms"))
    errors.sort()
    print(
        f"{len(errors)} held-out rows: median |error| {errors[len(errors) // 2]:.1%}, "
        f"worst {errors[-1]:.1%}, {sum(e <= 0.25 for e in errors)} within 25%"
    )


if __name__ == "__main__":
    main()
