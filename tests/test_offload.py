"""Activation offload to host memory, FSDP with sequence parallelism, and the logits: what
they keep where, what they cost, and what the compilers say."""

from dataclasses import replace

import pytest

import shardscope
from shardscope._src.base.errors import PlanError
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import (
    OFFLOAD_BUFFERS,
    Schedule,
    activation_bytes_per_layer,
    estimate_memory,
    logits_bytes,
    offloaded_bytes_per_layer,
)
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, remat_options
from shardscope._src.train.timing import StepWork, step_time, step_work
from shardscope._src.train.types import Candidate

#: A Llama-3-8B layer: d 4096, 32 heads and 8 key/value heads of 128, SwiGLU ff 14336.
LAYER = ModelConfig(
    d_model=4096, heads=32, kv_heads=8, ff=14336, layers=2, batch=8, seq=2048,
    vocab=None, dtype="bfloat16", mlp="swiglu",
)  # fmt: skip


def test_offload_moves_the_layer_input_and_the_query_key_and_value():
    dp = get_strategy("dp").place(LAYER, abstract_mesh("data=2"))  # 4 sequences per device
    # Per token: the input (4096) and the query, key and value projections (4096 + 2 x 1024),
    # at 2 bytes.
    assert offloaded_bytes_per_layer(dp) == 2048 * 4 * (4096 + 4096 + 2 * 1024) * 2
    # FSDP x sequence parallel over model=4: both split four ways.
    sp = get_strategy("fsdp_sp").place(LAYER, abstract_mesh("data=2,model=4"))
    assert offloaded_bytes_per_layer(sp) == 2048 * 4 * (4096 + 4096 + 2 * 1024) * 2 // 4


def test_offloaded_activations_live_in_host_memory():
    dp = get_strategy("dp").place(LAYER, abstract_mesh("data=2"))
    mem = estimate_memory(dp, schedule=Schedule(remat="offload"))
    one = offloaded_bytes_per_layer(dp)
    assert mem.host == LAYER.layers * one
    # In device memory: the layer being recomputed and the copies in flight; nothing per layer.
    working = activation_bytes_per_layer(dp)
    assert mem.activations == working + OFFLOAD_BUFFERS * one
    full = estimate_memory(dp, schedule=Schedule(remat="full"))
    assert mem.host not in (0, full.host) and full.host == 0
    assert mem.total == mem.model_state + mem.activations + mem.gathered_weights


def test_offload_recomputes_the_forward_without_its_projections():
    c = replace(LAYER, vocab=None)
    dp = get_strategy("dp").place(c, abstract_mesh("data=2"))
    hw = hardware("h100")
    full = step_work(dp, Schedule(remat="full"), c, 2, hw, flash_attention=True)
    off = step_work(dp, Schedule(remat="offload"), c, 2, hw, flash_attention=True)
    tokens = 4 * 2048
    # The QKV projection (4096 -> 4096 + 2 x 1024) is not computed again.
    kept = 2 * tokens * 4096 * (4096 + 2 * 1024)
    assert full.recompute_flops - off.recompute_flops == pytest.approx(c.layers * kept, rel=1e-12)
    assert off.host_bytes == c.layers * offloaded_bytes_per_layer(dp)
    assert full.host_bytes == 0


#: One device's step of two micro-batches, compute only.
WORK = StepWork(
    microbatches=2, stages=1, fwd_flops=1e15, recompute_flops=0.0, act_bytes=0.0,
    recompute_act_bytes=0.0, p2p_bytes=0.0, p2p_bandwidth=1e10, optimizer_params=0,
    model_flops=1e15, devices=1, host_bandwidth=1e10,
)  # fmt: skip


def test_copies_to_host_hide_behind_the_compute_as_far_as_it_lasts():
    hw = hardware("tpu-v6e")
    rate = hw.peak_flops * hw.matmul_fraction
    fwd, bwd = 1e15 / rate, 2e15 / rate
    bare = step_time(hw, WORK, [])
    # Copies shorter than the forward: hidden.
    short = step_time(hw, replace(WORK, host_bytes=0.5 * fwd * 1e10), [])
    assert short.step_s == pytest.approx(bare.step_s, rel=1e-12)
    assert short.offload_s == pytest.approx(2 * 2 * 0.5 * fwd, rel=1e-12)
    # Copies longer than the backward: each pass lasts as long as its copies.
    slow = 3 * bwd
    long = step_time(hw, replace(WORK, host_bytes=slow * 1e10), [])
    assert long.step_s == pytest.approx(2 * (slow + slow), rel=1e-12)
    assert bare.step_s == pytest.approx(2 * (fwd + bwd), rel=1e-12)


def test_offload_needs_host_memory():
    bare = replace(hardware("h100"), host_memory_bytes=0.0)
    assert "offload" not in remat_options("train", None, True, bare)
    assert "offload" in remat_options("train", None, True, hardware("h100"))
    with pytest.raises(PlanError, match="host_memory_bytes=0") as e:
        remat_options("train", "offload", True, bare)
    assert e.value.params == ("remat",)


def test_a_plan_whose_offloaded_activations_overflow_the_host_does_not_fit():
    cand = Candidate("dp", (("data", 2),), 1, "offload")
    roomy = estimate(cand, LAYER, hardware("h100"))
    assert roomy.fits
    small = hardware("h100", host_memory_bytes=roomy.memory.host - 1)
    assert not estimate(cand, LAYER, small).fits


def test_fsdp_sp_shards_weights_like_fsdp_tp_and_activations_like_dp_sp():
    mesh = abstract_mesh("data=2,model=4")
    c = replace(LAYER, vocab=128256)
    fsdp_sp, fsdp_tp, dp_sp = (
        get_strategy(s).place(c, mesh) for s in ("fsdp_sp", "fsdp_tp", "dp_sp")
    )
    assert fsdp_sp.param_specs() == fsdp_tp.param_specs()
    assert fsdp_sp.activation_spec("residual") == dp_sp.activation_spec("residual")
    m_sp, m_tp = (estimate_memory(p) for p in (fsdp_sp, fsdp_tp))
    assert m_sp.model_state == m_tp.model_state
    # Sequence parallelism projects each device's own quarter of the tokens: a quarter of the
    # logits (4 sequences of 2048 per data shard, 128,256 entries, and their gradient, bf16).
    assert logits_bytes(fsdp_tp, 4) == 4 * 2048 * 128256 * 2 * 2
    assert logits_bytes(fsdp_sp, 4) == 4 * 2048 * 128256 * 2 * 2 // 4
    assert logits_bytes(fsdp_tp, 4, train=False) == 4 * 2048 * 128256 * 2


@pytest.mark.compiler
def test_the_tpu_compiler_offloads_what_the_estimate_moves_to_the_host(monkeypatch):
    """Deviceless TPU v6e: the buffers the compiler puts in host memory are each layer's input
    and its fused query, key and value projection, at the shapes the estimate counts."""
    import re

    from shardscope._src.train import target

    # the text of the plan's own TPU compile (compiling the program once more would double
    # the test's time)
    texts = []

    def compile_plan(lowered, *args, **kwargs):
        compiled = real(lowered, *args, **kwargs)
        texts.append(compiled.audit.compiled.as_text())
        return compiled

    real = target.compile_plan
    monkeypatch.setattr(target, "compile_plan", compile_plan)
    config = ModelConfig(
        d_model=512, heads=4, kv_heads=2, head_dim=128, ff=1024, layers=2, batch=8,
        seq=256, vocab=None, dtype="bfloat16", mlp="swiglu",
    )  # fmt: skip
    result = shardscope.plan(
        config, 8, hardware="tpu-v6e", strategies=["fsdp"], mesh="data=8", remat="offload",
        microbatches=1, compiler="tpu-v6e", target_plans=1, compile_top=1,
    )  # fmt: skip
    (p,) = [p for p in result.plans if p.compiled_by.name == "tpu-v6e"]
    assert p.target_memory["host_temp_size_in_bytes"] > 0
    # One sequence per device and layer: the input (256 x 512) and the QKV projection (2
    # key/value groups of 2 queries, a key and a value, 128 wide), in host memory (S(5)).
    (text,) = texts
    on_host = set(re.findall(r"bf16\[([0-9,]+)\]\{[^}]*S\(5\)", text))
    assert on_host == {"2,1,256,512", "2,1,256,2,4,128"}
    assert p.memory.host == 2 * 256 * (512 + 2 * (2 + 2) * 128) * 2
    # The fit adds the optimizer state, which the compiled step does not hold.
    assert p.fit_memory_bytes_per_device == p.target_memory_bytes_per_device + p.memory.optimizer


def test_the_optimizer_state_on_the_host_leaves_the_device_and_costs_its_copies():
    c = replace(LAYER, vocab=None)
    hw = hardware("tpu-v6e")
    on_device = estimate(Candidate("fsdp", (("data", 8),), 1, "full"), c, hw)
    on_host = estimate(Candidate("fsdp", (("data", 8),), 1, "full", True), c, hw)
    # Adam's fp32 master copy, m and v: 12 bytes of every parameter an eighth of them each.
    state = 12 * c.param_count() // 8
    assert on_host.memory.optimizer == on_device.memory.optimizer == state
    assert on_host.memory.host == state and on_device.memory.host == 0
    assert on_device.memory.total - on_host.memory.total == state
    # In before the update and out after it, over the host link.
    extra = on_host.time.optimizer_s - on_device.time.optimizer_s
    assert extra == pytest.approx(2 * state / hw.host_bandwidth, rel=1e-12)
    assert "optimizer on host" in on_host.candidate.label


def test_the_sweep_moves_the_optimizer_state_to_the_host_only_where_the_device_is_full():
    from shardscope._src.train.candidates import screen_all

    c = replace(LAYER, layers=8, batch=8, vocab=None)
    roomy, _, _ = screen_all(
        c, 8, hardware("h100"), ["fsdp"], remat="full", microbatches=1, stages=1
    )
    assert [s.candidate.offload_optimizer for s in roomy] == [False]
    tight = hardware("h100", memory_bytes=roomy[0].memory.total - 1)
    ranked, _, _ = screen_all(c, 8, tight, ["fsdp"], remat="full", microbatches=1, stages=1)
    assert [(s.candidate.offload_optimizer, s.fits) for s in ranked] == [
        (True, True),
        (False, False),
    ]


def test_the_optimizer_state_goes_to_the_host_when_asked_and_only_where_there_is_one():
    from shardscope._src.train.candidates import screen_all

    c = replace(LAYER, layers=8, vocab=None)
    always, _, _ = screen_all(
        c,
        8,
        hardware("h100"),
        ["fsdp"],
        remat="full",
        microbatches=1,
        stages=1,
        offload_optimizer=True,
    )
    assert [s.candidate.offload_optimizer for s in always] == [True]
    never, _, _ = screen_all(
        c, 8, hardware("h100", memory_bytes=1e9), ["fsdp"], remat="full", microbatches=1, stages=1,
        offload_optimizer=False,
    )  # fmt: skip
    assert [(s.candidate.offload_optimizer, s.fits) for s in never] == [(False, False)]
    bare = replace(hardware("h100"), host_memory_bytes=0.0)
    with pytest.raises(PlanError, match="no host memory") as e:
        screen_all(c, 8, bare, ["fsdp"], offload_optimizer=True)
    assert e.value.params == ("offload_optimizer",)
    with pytest.raises(PlanError, match="True, False or None"):
        shardscope.PlanRequest("tiny", 8, offload_optimizer="yes")
