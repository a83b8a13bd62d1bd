"""A fused attention kernel priced at its measured rates: causal FLOPs (half the non-causal
count), the backward 2.5 times the forward's, as FlashAttention counts them; without rates
the core stays at the matmul rate, non-causal, as the calibration priced it."""

from dataclasses import replace

import pytest

from shardscope._src.base.errors import ShardscopeError
from shardscope._src.model.config import ModelConfig
from shardscope._src.targets.hardware import h100_attention, hardware
from shardscope._src.train.candidates import estimate
from shardscope._src.train.timing import StepWork, step_time
from shardscope._src.train.types import Candidate

CUDNN = h100_attention("cudnn")

#: One device's micro-batch: 10 TFLOP of forward matmuls, 4 of them the attention core
#: (counted non-causal), the backward's recomputed scores (2), nothing else recomputed, no
#: memory traffic, no collectives.
WORK = StepWork(
    microbatches=1, stages=1, fwd_flops=10e12, recompute_flops=2e12, act_bytes=0.0,
    recompute_act_bytes=0.0, p2p_bytes=0.0, p2p_bandwidth=1.0, optimizer_params=0.0,
    model_flops=0.0, devices=1, attention_flops=4e12,
)  # fmt: skip


def test_without_rates_the_core_is_a_matmul_counted_non_causal():
    hw = hardware("h100")
    rate = hw.peak_flops * hw.matmul_fraction
    # forward 10, backward 20 and the recomputed scores 2, all at the matmul rate
    assert step_time(hw, WORK, []).compute_s == pytest.approx(32e12 / rate, rel=1e-12)


def test_a_fused_kernel_runs_the_causal_core_at_its_rates():
    hw = hardware("h100", attention_fwd_flops=500e12, attention_bwd_flops=400e12)
    rate = hw.peak_flops * hw.matmul_fraction
    # the 6 TFLOP of other matmuls forward and 12 backward at the matmul rate; the core's 2
    # causal TFLOP forward at 500 and 2.5 x 2 backward at 400 (its recomputed scores in it)
    expected = 18e12 / rate + 2e12 / 500e12 + 5e12 / 400e12
    assert step_time(hw, WORK, []).compute_s == pytest.approx(expected, rel=1e-12)
    # full recomputation runs the forward kernel once more
    again = replace(WORK, recompute_flops=2e12 + 10e12, attention_rerun_flops=4e12)
    more = 6e12 / rate + 2e12 / 500e12
    assert step_time(hw, again, []).compute_s == pytest.approx(expected + more, rel=1e-12)


CONFIG = ModelConfig(d_model=512, heads=8, ff=2048, layers=4, batch=16, seq=4096, vocab=1000)


def test_the_planner_prices_a_flash_programs_attention_at_the_kernels_rates():
    cand = Candidate("fsdp", (("data", 8),), 2, "full")
    calibrated = estimate(cand, CONFIG, hardware("h100"))
    cudnn = estimate(cand, CONFIG, hardware("h100", **CUDNN))
    assert cudnn.time.compute_s < calibrated.time.compute_s
    assert cudnn.memory.total == calibrated.memory.total
    # a program that materializes the scores runs no fused kernel: the rates change nothing
    dense = estimate(cand, CONFIG, hardware("h100"), flash_attention=False)
    dense_cudnn = estimate(cand, CONFIG, hardware("h100", **CUDNN), flash_attention=False)
    assert dense_cudnn.time.step_s == dense.time.step_s


def test_a_compiled_count_scales_the_other_matmuls_and_keeps_the_kernels():
    hw = hardware("h100", **CUDNN)
    s = estimate(Candidate("fsdp", (("data", 8),), 2, "full"), CONFIG, hw)
    work = s.pricing.work
    # the formula's own count gives the estimate's step
    same = s.pricing.step(hw, [], work.step_matmul_flops)
    assert same.compute_s == pytest.approx(s.time.compute_s, rel=1e-12)
    # 1 TFLOP more a step in the compiled program: 1 TFLOP more at the matmul rate
    more = s.pricing.step(hw, [], work.step_matmul_flops + 1e12)
    rate = hw.peak_flops * hw.matmul_fraction
    assert more.compute_s - same.compute_s == pytest.approx(1e12 / rate, rel=1e-9)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"attention_fwd_flops": 5e14}, "give both, or neither"),
        ({"attention_fwd_flops": 5e14, "attention_bwd_flops": 2e15}, "no kernel runs above"),
        ({"attention_bwd_flops": -1.0}, "must be 0 or a finite positive number"),
    ],
)
def test_rates_that_cannot_be_are_refused(overrides, words):
    with pytest.raises(ShardscopeError, match=words):
        hardware("h100", **overrides)


def test_a_kernel_without_measured_rates_is_refused_naming_those_with():
    with pytest.raises(ShardscopeError, match="choose one of flash-attention-2, cudnn, flash"):
        h100_attention("flex")


def test_a_prefills_attention_runs_at_the_kernels_forward_rate():
    # Llama 3.1 8B prefilling 16,384 tokens on one H100: compute-bound. Its attention, QK^T
    # and PV of each of 32 heads (128 + 128 dimensions) in 32 layers, is 2 x 32 x 16384^2 x
    # 32 x 256 FLOPs counted non-causal: on the preset, its causal half at the forward rate
    # of the kernel the (default, vLLM's) engine runs, FlashAttention-3's; with cuDNN's
    # rates named, at cuDNN's; the rest of the first token is the same.
    from shardscope._src.serve.search import serve

    attention = 2 * 32 * 16384**2 * 32 * 256
    plain, cudnn = hardware("h100"), hardware("h100", **CUDNN)
    first = {}
    for name, hw in (("plain", plain), ("cudnn", cudnn)):
        result = serve(
            "llama3-8b", 1, hardware=hw, prompt=16384, output=16, batch=1, compiler="cpu"
        )
        first[name] = result.best.first_token_s
    fa3 = h100_attention("flash-attention-3")["attention_fwd_flops"]
    saved = attention / 2 / fa3 - attention / 2 / cudnn.attention_fwd_flops
    assert first["plain"] - first["cudnn"] == pytest.approx(saved, rel=1e-6)


def test_a_compiled_count_below_the_kernels_share_scales_everything_alike():
    # WORK's step: forward 10 + backward 20 + recomputed scores 2 = 32 TFLOP, 14 of them the
    # core's (4 + 8 + 2). A program counted at 8 TFLOP computes less than the core alone: its
    # count scales every part by 8 / 32, the core too, so nothing goes negative.
    scaled = WORK.with_step_matmul_flops(8e12, keep_attention=True)
    assert WORK.step_attention_flops == 14e12
    assert (scaled.fwd_flops, scaled.attention_flops) == (2.5e12, 1e12)
    assert scaled.recompute_flops == scaled.attention_scores_flops == 0.5e12
    hw = hardware("h100", **CUDNN)
    assert step_time(hw, scaled, []).compute_s > 0
