"""A serving prefill's attention core priced as the fused causal kernel its engine runs on
that GPU (shardscope._src.cost.compute.prefill_attention): half the scores, at the kernel's
measured forward rate; the decode step's attention untouched; the kernel named in the
result."""

from dataclasses import replace

import pytest

from shardscope._src.model.presets import model_preset
from shardscope._src.serve.estimate import estimate_plan
from shardscope._src.serve.search import serve
from shardscope._src.serve.types import Layout, ServeResult
from shardscope._src.targets.hardware import hardware

#: Llama 3 8B: 32 layers of 32 query heads of 128 dimensions.
LAYERS, HEADS, HEAD_DIM = 32, 32, 128
#: A prompt long enough that one H100's or A100's prefill is bound by its matmuls.
PROMPT = 8192
#: The causal attention core of one prompt: QK^T and PV, each 2 FLOPs a multiply-add, over
#: the half of the PROMPT x PROMPT scores at or below the diagonal, in every head and layer.
CAUSAL = 2 * 2 * PROMPT * (PROMPT / 2) * HEAD_DIM * HEADS * LAYERS
#: The published causal forward rates (FLOP/s): FlashAttention-2 and -3 on an H100
#: (FlashAttention-3 paper, Figure 5), FlashAttention-2 on an A100 (FlashAttention-2 paper,
#: Figure 5(d)); head dimension 128, sequence 4k.
FA2_H100, FA3_H100, FA2_A100 = 319e12, 579e12, 198e12


def _plan(hw, engine, prompt=PROMPT, batch=4):
    config = model_preset("llama3-8b").config(batch=1)
    return estimate_plan(
        config, hw, Layout("tp", 1, 1), batch, prompt, prompt + 64, "bfloat16", "bfloat16",
        engine=engine,
    )  # fmt: skip


def test_a_prefills_attention_is_the_causal_core_at_its_engines_kernels_rate():
    h100 = hardware("h100")
    # SGLang and LMDeploy pay no host time (SGLang's overlapped, LMDeploy's none): their
    # prefills differ by their kernels alone, FlashAttention-3's and FlashAttention-2's
    sglang, lmdeploy = _plan(h100, "sglang"), _plan(h100, "lmdeploy")
    slower = CAUSAL / FA2_H100 - CAUSAL / FA3_H100
    assert lmdeploy.first_token_s - sglang.first_token_s == pytest.approx(slower, rel=1e-9)
    # a hardware's own rate runs in place of the engine's kernel: set at FlashAttention-3's,
    # LMDeploy's prefill is SGLang's
    own = hardware("h100", attention_fwd_flops=FA3_H100, attention_bwd_flops=FA3_H100)
    assert _plan(own, "lmdeploy").first_token_s == pytest.approx(sglang.first_token_s, rel=1e-12)


def test_an_a100_prefill_runs_flash_attention_2_at_its_published_rate():
    # vLLM on an A100 runs FlashAttention-2: against a hardware that names a rate of its own
    # (1.5 times it), the prefill is slower by the causal core at the one over the other
    a100 = hardware("a100")
    fast = hardware("a100", attention_fwd_flops=1.5 * FA2_A100, attention_bwd_flops=FA2_A100)
    slower = CAUSAL / FA2_A100 - CAUSAL / (1.5 * FA2_A100)
    got = _plan(a100, "vllm").first_token_s - _plan(fast, "vllm").first_token_s
    assert got == pytest.approx(slower, rel=1e-9)


def test_without_a_published_rate_the_core_stays_a_matmul_counted_whole():
    # a B200 has no published figure of a causal kernel: its prefill's attention runs at the
    # matmul rate, counted non-causal (twice the causal FLOPs), as before any kernel was
    # priced; given a rate, its causal half at that rate
    b200 = hardware("b200")
    rate = 1e15
    given = hardware("b200", attention_fwd_flops=rate, attention_bwd_flops=rate)
    slower = 2 * CAUSAL / (b200.peak_flops * b200.matmul_fraction) - CAUSAL / rate
    got = _plan(b200, "vllm").first_token_s - _plan(given, "vllm").first_token_s
    assert got == pytest.approx(slower, rel=1e-9)


def test_the_decode_step_is_the_same_whatever_the_prefill_kernel():
    # a decode step's attention reads its cache, one query a sequence: no fused prefill
    # kernel prices it. SGLang and TensorRT-LLM (both overlapped, no host time) against
    # LMDeploy and gpt-fast and none (no host time), FlashAttention-3 against -2: the same
    # decode step, prefills apart
    h100 = hardware("h100")
    plans = {e: _plan(h100, e, batch=64) for e in ("sglang", "tensorrt-llm", "lmdeploy", "none")}
    steps = {(p.decode_step_s, p.decode_compute_s, p.decode_memory_s) for p in plans.values()}
    assert len(steps) == 1
    assert plans["none"].first_token_s > plans["sglang"].first_token_s


def test_the_result_names_the_kernel_its_prefills_assumed():
    kw = dict(prompt=512, output=16, batch=4, compiler="cpu")
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    named = {
        (hw, e): serve(two, 1, hardware=hw, engine=e, **kw).prefill_attention
        for hw, e in (("h100", "vllm"), ("h200", "sglang"), ("a100", "vllm"),
                      ("h100", "lmdeploy"), ("h100", "none"), ("b200", "vllm"),
                      ("tpu-v5e", "vllm"))
    }  # fmt: skip
    assert named == {
        ("h100", "vllm"): "flash-attention-3",
        ("h200", "sglang"): "flash-attention-3",
        ("a100", "vllm"): "flash-attention-2",
        ("h100", "lmdeploy"): "flash-attention-2",
        ("h100", "none"): "flash-attention-2",
        ("b200", "vllm"): None,
        ("tpu-v5e", "vllm"): None,
    }
    own = serve(two, 1, hardware="h100", hardware_overrides={"attention_fwd_flops": 5e14,
                "attention_bwd_flops": 5e14}, **kw)  # fmt: skip
    assert own.prefill_attention == "attention_fwd_flops"
    # the table's title says it, and the JSON keeps it
    from shardscope._src.render.console import mimebundle
    from shardscope._src.render.serve import render_serve

    result = serve(two, 1, hardware="h100", **kw)
    text = " ".join(mimebundle(render_serve(result), width=240)["text/plain"].split())
    assert "prefill attention flash-attention-3" in text
    assert ServeResult.from_dict(result.to_dict()).prefill_attention == "flash-attention-3"


@pytest.mark.compiler
def test_a_compiled_prefill_prices_its_attention_kernels_at_the_engines_rate():
    # two layers of Llama 3 8B prefilling 4,096 tokens, compiled by the H100's compiler:
    # its attention cores (one kernel a layer, the masked scores counted whole) at
    # FlashAttention-2's causal rate under LMDeploy, FlashAttention-3's under SGLang; both
    # pay no host time, so the prefills differ by the causal core's time at the two rates
    from shardscope._src.serve.compiled import compile_prefill

    prompt, layers = 4096, 2
    config = replace(model_preset("llama3-8b").config(batch=1), layers=layers)
    h100 = hardware("h100")
    plan = estimate_plan(
        config, h100, Layout("tp", 1, 1), 1, prompt, prompt + 1, "bfloat16", "bfloat16",
        engine="lmdeploy",
    )  # fmt: skip
    fa2 = compile_prefill(plan, config, h100, prompt)
    fa3 = compile_prefill(replace(plan, engine="sglang"), config, h100, prompt)
    # compiled, not the estimate returned as it was
    assert fa2.estimate is plan and fa2.first_token_s != plan.first_token_s
    causal = 2 * 2 * prompt * (prompt / 2) * HEAD_DIM * HEADS * layers
    slower = causal / FA2_H100 - causal / FA3_H100
    assert fa2.first_token_s - fa3.first_token_s == pytest.approx(slower, rel=1e-6)
