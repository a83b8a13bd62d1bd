"""Serving plans (``shardscope.serve``, ``shardscope plan --serve``): every tensor-parallel
layout and batch that fits, each device's weights and cache, the time per output token from
the roofline and the tensor-parallel all-reduces, the latency-throughput front, and one error
naming the way out where nothing fits or meets the latency."""

import json
from dataclasses import replace

import pytest

from helpers import assert_usage_error
from shardscope._src.base.errors import PlanError
from shardscope._src.cli.main import main
from shardscope._src.cost.compute import launch_seconds
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.rank import StepCost, StepSource
from shardscope._src.plan.request import ServeRequest
from shardscope._src.serve import compiled as compiled_module
from shardscope._src.serve import search as search_module
from shardscope._src.serve.compiled import compile_decode, compile_prefill
from shardscope._src.serve.estimate import decode_kernels
from shardscope._src.serve.layouts import weight_reads
from shardscope._src.serve.search import serve, serve_request
from shardscope._src.serve.types import Layout, ServeLayout, ServeNote, ServeResult
from shardscope._src.targets.hardware import PRESETS

H100 = PRESETS["h100"]


def _find(result, strategy, mesh, batch):
    return next(p for p in result.plans if (p.strategy, p.mesh, p.batch) == (strategy, mesh, batch))


def test_llama3_70b_on_8_h100s_holds_and_times_what_the_roofline_says():
    result = serve(
        "llama3-70b", 8, hardware="h100", prompt=2048, output=256, batch=64, compiler="cpu"
    )
    config = model_preset("llama3-70b").config(batch=1)
    p = _find(result, "tp", {"model": 8}, 64)
    # each device: an eighth of the bf16 weights (the norms' gains, two a layer and the
    # final one, whole on each) and of the cache of 64 sequences of 2048 + 256 tokens, 2
    # (key, value) x 8 key/value heads x 128 x 80 layers x 2 bytes each
    norms = (2 * 80 + 1) * 8192
    assert p.weight_bytes_per_device == (config.param_count() - norms) * 2 // 8 + norms * 2
    assert p.cache_bytes_per_device == 64 * 2304 * (2 * 8 * 128 * 80 * 2) // 8
    # every matrix read (but the embedding table, whose lookup takes a row a sequence), each
    # kernel at the bandwidth XLA's GPU cost model measured on an H100 for its size, in GiB/s
    # (between two measured sizes, the line through them): a layer's query, key and value
    # projection (8192 x 1280 bf16, 20 MiB: a quarter of the way from 16 MiB's 1583.95 to 32
    # MiB's 1974.72), output projection (16 MiB), MLP up with its gate (8192 x 7168, 112
    # MiB: three quarters from 64 MiB's 2343.19 to 128 MiB's 2632.96) and down (56 MiB:
    # three quarters from 32 to 64 MiB), and its cache (72 MiB: an eighth from 64 MiB to
    # 128 MiB); the unembedding's 8192 x 16032 (from 128 MiB to 256 MiB's 2766.69)
    mib = 2**20

    def at(size, lo, hi, lo_gib_s, hi_gib_s):
        return size / ((lo_gib_s + (size - lo) / (hi - lo) * (hi_gib_s - lo_gib_s)) * 2**30)

    layer = (
        at(20 * mib, 16 * mib, 32 * mib, 1583.95, 1974.72)
        + 16 * mib / (1583.95 * 2**30)
        + at(112 * mib, 64 * mib, 128 * mib, 2343.19, 2632.96)
        + at(56 * mib, 32 * mib, 64 * mib, 1974.72, 2343.19)
        + at(72 * mib, 64 * mib, 128 * mib, 2343.19, 2632.96)
    )
    assert p.cache_bytes_per_device == 80 * 72 * mib
    unembedding = at(8192 * 16032 * 2, 128 * mib, 256 * mib, 2632.96, 2766.69)
    memory_s = 80 * layer + unembedding
    assert p.decode_memory_s == pytest.approx(memory_s, rel=1e-6)
    # two all-reduces a layer and the vocabulary-parallel embedding's, of 64 tokens x 8192
    # in bf16 (1 MiB) over the 8 GPUs of the node, a ring's 2 x 7/8 of the bytes each; NCCL
    # takes the faster of its bandwidth protocol (14 steps of 5 us, 80% of NVLink's 450
    # GB/s) and its low-latency one (6.6 us and 0.6 us a step, a quarter of that bandwidth):
    # at 1 MiB, the low-latency one
    sent = 2 * 7 / 8 * 64 * 8192 * 2
    bandwidth_protocol = 14 * 5e-6 + sent / (0.8 * 450e9)
    ring = 6.6e-6 + 14 * 0.6e-6 + sent / (0.8 * 450e9 / 4)
    assert ring < bandwidth_protocol
    # vLLM (the default engine) all-reduces with its own kernel, measured on 8 H100s at 1
    # MiB in 33.8 us: faster than NCCL's ring
    assert 33.8e-6 < ring
    assert p.decode_comm_s == pytest.approx((2 * 80 + 1) * 33.8e-6, rel=1e-9)
    # without an engine, NCCL's
    nccl = serve(
        "llama3-70b", 8, hardware="h100", prompt=2048, output=256, batch=64, compiler="cpu",
        engine="none",
    )  # fmt: skip
    assert _find(nccl, "tp", {"model": 8}, 64).decode_comm_s == pytest.approx(
        (2 * 80 + 1) * ring, rel=1e-9
    )
    # the weights' matmuls and the attention, two kernels one after another, each bound by
    # its reads at 64 sequences: its reads and a twentieth of its matmuls' time (XLA's GPU
    # cost model overlaps the other 95%)
    step = memory_s + 0.05 * p.decode_compute_s + (2 * 80 + 1) * 33.8e-6
    # its kernels, one an operation as engines fuse them, each launched at 1 us: a layer's
    # query/key/value projection, attention, output projection, MLP up and down, and the
    # unembedding; its two norms, rotary embedding, cache update and activation, and the
    # embedding's lookup, the final norm and the sampling, each besides the 2 us least a
    # kernel runs (their work on 64 tokens priced at nothing else)
    matmuls, elementwise = 80 * 5 + 1, 80 * 5 + 3
    step += (matmuls + elementwise) * 1e-6 + elementwise * 2e-6
    assert p.decode_kernels == matmuls + elementwise
    # then the default engine's host (vLLM's): 126 us a step and 4 us for each of its 64
    # sequences
    step += 126e-6 + 64 * 4e-6
    assert p.decode_step_s == pytest.approx(step)
    assert p.tokens_per_s_per_chip == pytest.approx(64 / p.decode_step_s / 8)
    # two replicas of tensor parallelism over 4: twice the weights a device, half the
    # all-reduce group, each replica 32 of the sequences
    q = _find(result, "dp_tp", {"data": 2, "model": 4}, 64)
    assert q.weight_bytes_per_device == (config.param_count() - norms) * 2 // 4 + norms * 2
    assert q.cache_bytes_per_device == 32 * 2304 * (2 * 8 * 128 * 80 * 2) // 4


def test_an_estimated_step_and_prefill_launch_their_models_kernels():
    # two layers of Llama 3 8B on an H100, on no engine: each of its 2 x 5 + 1 matmul and
    # attention kernels and 2 x 5 + 3 element-wise ones launched at 1 us, and each
    # element-wise one the 2 us least a kernel runs besides, in the decode step and the
    # prefill alike; a TPU launches none of them
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    kw = dict(prompt=64, output=16, batch=4, compiler="cpu", engine="none")
    matmuls, elementwise = 2 * 5 + 1, 2 * 5 + 3
    paid = serve(two, 1, hardware="h100", **kw).best
    free_hw = dict(kernel_launch_s=0, kernel_floor_s=0)
    free = serve(two, 1, hardware="h100", hardware_overrides=free_hw, **kw).best
    assert paid.decode_kernels == free.decode_kernels == matmuls + elementwise
    kernels = (matmuls + elementwise) * 1e-6 + elementwise * 2e-6
    assert paid.decode_step_s - free.decode_step_s == pytest.approx(kernels, rel=1e-9)
    assert paid.first_token_s - free.first_token_s == pytest.approx(kernels, rel=1e-9)
    tpu = serve(two, 1, hardware="tpu-v5e", **kw).best
    tpu_free = serve(two, 1, hardware="tpu-v5e", hardware_overrides=free_hw, **kw).best
    assert tpu.decode_step_s == tpu_free.decode_step_s


def test_a_mixtures_layers_launch_their_routers_and_experts_kernels():
    # Mixtral 8x7B: 32 layers, each with experts and no shared ones; a layer's attention
    # (projections, core, output) and its router, its experts' up and down projections as
    # matmuls, its 5 element-wise kernels and the routing and the combine; DeepSeek-V3: 3
    # dense layers and 58 with experts and a shared expert (its up and down besides)
    mixtral = decode_kernels(model_preset("mixtral-8x7b").config(batch=1))
    assert mixtral == (32 * (3 + 3) + 1, 32 * (5 + 2) + 3)
    deepseek = decode_kernels(model_preset("deepseek-v3").config(batch=1))
    assert deepseek == (61 * 3 + 3 * 2 + 58 * (3 + 2) + 1, 61 * 5 + 58 * 2 + 3)


@pytest.mark.compiler
def test_the_best_of_each_layout_is_compiled_by_the_h100_compiler():
    # a decode step compiled deviceless: two all-reduces a layer (the attention's output and
    # the MLP's down projection) and the vocabulary-parallel embedding's, priced as the
    # formula's, and the compiled buffers: the weights and the cache the estimate counts,
    # and the step's temporaries beside them
    told = []
    request = ServeRequest("llama3-8b", 2, hardware="h100", prompt=512, output=128)
    result = serve_request(request, lambda *call: told.append(call))
    compiled = [p for p in result.plans if p.compiled_by == "h100"]
    assert {p.strategy for p in compiled} == {"tp", "dp_tp"}
    # the progress bar is told of each layout as it is compiled, one at a time
    assert [(done, total) for done, total, _ in told] == [(1, 2), (2, 2)]
    assert {label.split()[0] for _, _, label in told} == {"tp", "dp_tp"}
    for p in compiled:
        assert p.fits
        if p.tensor_parallel > 1:
            assert p.compiled_all_reduces == 2 * 32 + 1
            estimate = serve(
                "llama3-8b", 2, hardware="h100", prompt=512, output=128, batch=p.batch,
                compiler="cpu",
            )  # fmt: skip
            twin = _find(estimate, p.strategy, p.mesh, p.batch)
            assert p.decode_comm_s == pytest.approx(twin.decode_comm_s, rel=1e-9)
        else:
            assert p.compiled_all_reduces == 0
        assert p.temp_bytes_per_device > 0


@pytest.mark.compiler
def test_a_tpu_decode_step_reads_its_weights_and_cache_about_once():
    # the TPU compiler slices each weight and copies it (and the cache) into on-chip memory
    # asynchronously: those moves read device memory once, and the matmuls that read them
    # on chip move nothing through it (counted whole at every slice, the step read 9 times
    # its weights and cache)
    config = ModelConfig(
        d_model=1024, heads=8, kv_heads=8, ff=4096, layers=2, vocab=8192, batch=1, seq=1024,
        dtype="bfloat16", mlp="swiglu",
    )  # fmt: skip
    estimate = serve(config, 1, hardware="tpu-v5e", prompt=512, output=512, batch=8, compiler="cpu")
    (plan,) = estimate.plans
    compiled = compile_decode(plan, config, PRESETS["tpu-v5e"])
    held = plan.weight_bytes_per_device + plan.cache_bytes_per_device
    moved = compiled.decode_memory_s * PRESETS["tpu-v5e"].hbm_bandwidth
    assert held <= moved < 1.3 * held


@pytest.mark.compiler
def test_two_shallow_compiles_give_what_the_whole_depth_compiles_to(monkeypatch):
    # the served layers are unrolled and alike: compiled at 2 and 3 layers, 6 of Llama 3
    # 70B's decode step holds the memory, moves the bytes, does the FLOPs and all-reduces
    # as often as the 6-layer program does, and the prefill takes the 6-layer one's time
    # (the 80-layer programs too: 65.0 GiB a device at batch 512, measured)
    six = replace(model_preset("llama3-70b").config(batch=1), layers=6)
    estimate = serve(six, 8, hardware="h100", prompt=2048, output=256, batch=64, compiler="cpu")
    plan = _find(estimate, "tp", {"model": 8}, 64)
    decode = compile_decode(plan, six, H100)
    shallow = compile_prefill(decode, six, H100, 2048)
    monkeypatch.setattr(
        compiled_module,
        "_compile_layers",
        lambda p, c, hw, flop_s, build: compiled_module._compile(p, hw, flop_s, *build(c.layers)),
    )
    whole = compile_decode(plan, six, H100)
    deep = compile_prefill(whole, six, H100, 2048)
    assert decode.compiled_all_reduces == whole.compiled_all_reduces == 2 * 6 + 1
    # the buffers are the same; the compiler's temporaries 1 MiB apart (of 2.28 GB)
    assert decode.memory_bytes_per_device == pytest.approx(whole.memory_bytes_per_device, rel=1e-3)
    for field in ("decode_compute_s", "decode_comm_s"):
        assert getattr(decode, field) == pytest.approx(getattr(whole, field), rel=1e-9), field
    # the compiler fuses a few of the six layers' element-wise work differently from the
    # three's: the traffic is 0.2% apart, and the step launches 80 kernels or 81
    assert decode.decode_memory_s == pytest.approx(whole.decode_memory_s, rel=0.01)
    assert abs(decode.decode_kernels - whole.decode_kernels) <= 1
    # the prefill's kernels one after another: its element-wise traffic counts, and the
    # third layer's fusions move more than the later layers' (0.29 against 0.26 ms of
    # traffic each, measured at 2 to 6 layers), so the extrapolation is over by about 1%
    assert deep.first_token_s <= shallow.first_token_s < 1.015 * deep.first_token_s


def test_tensor_parallelism_wider_than_the_key_value_heads_replicates_them():
    # Llama 3 70B's 8 key/value heads over 16 devices: each head's projection and cache on
    # 2 of them, so every device holds one whole head
    result = serve(
        "llama3-70b", 16, hardware="h100", prompt=2048, output=256, batch=16, compiler="cpu"
    )
    config = model_preset("llama3-70b").config(batch=1)
    p = _find(result, "tp", {"model": 16}, 16)
    assert p.kv_replicas == 2
    extra = 80 * (16 - 8) * 2 * 128 * 8192  # the second copy of each head's wk and wv
    norms = (2 * 80 + 1) * 8192  # whole on each device
    split = config.param_count() + extra - norms
    assert p.weight_bytes_per_device == split * 2 // 16 + norms * 2
    assert p.cache_bytes_per_device == 16 * 2304 * (2 * 1 * 128 * 80 * 2)  # one head each
    assert _find(result, "dp_tp", {"data": 2, "model": 8}, 16).kv_replicas == 1


@pytest.mark.compiler
def test_8_bit_weights_and_cache_are_compiled_and_halve_the_decode_steps_traffic():
    config = ModelConfig(
        d_model=1024, heads=8, kv_heads=8, ff=4096, layers=3, vocab=4096, mlp="swiglu",
        dtype="bfloat16", batch=1, seq=1,
    )  # fmt: skip
    steps = {}
    for fmt in ("bfloat16", "int8"):
        # at the same share of the bandwidth whatever a kernel's size
        result = serve(
            config, 1, hardware="h100", prompt=128, output=64, batch=8, weights=fmt, cache=fmt,
            hardware_overrides={"hbm_fraction": 0.8},
        )  # fmt: skip
        assert result.best.compiled_by == "h100"
        steps[fmt] = result.best.decode_memory_s
    assert steps["int8"] < 0.55 * steps["bfloat16"]


def test_fp8_weights_run_the_weights_matmuls_at_the_fp8_rate_where_the_device_has_one():
    # a prefill of 8192 tokens of Llama 3.1 8B on one GPU: compute-bound (4.1e14 FLOPs of
    # the weights' matmuls against 16 GB of weights)
    prompt = 8192
    config = model_preset("llama3-8b").config(batch=1)
    weights_flops = 2 * config.active_param_count() * prompt
    first = {}
    for hw in ("h100", "a100"):
        for fmt in ("bfloat16", "fp8"):
            result = serve(
                "llama3-8b", 1, hardware=hw, prompt=prompt, output=16, batch=1, weights=fmt,
                compiler="cpu",
            )  # fmt: skip
            first[hw, fmt] = result.best.first_token_s

    # each weight read in one byte, not two: a twentieth of reading a byte a parameter (the
    # embedding table's included, so at most) shows beside the compute-bound matmuls
    def read(bandwidth):
        return 0.05 * config.param_count() / (bandwidth * 0.8)

    # the A100 has no fp8 matmul units: its fp8 weights are widened to 16 bits to multiply
    a100 = first["a100", "bfloat16"] - first["a100", "fp8"]
    assert 0 < a100 <= read(2.039e12)
    # the H100 multiplies by its fp8 weights at 1979 x 0.48 TFLOP/s instead of 989 x 0.54,
    # either at the share of it the matmuls' tiles fill of their waves (the prompt's 8192
    # rows); the attention core stays 16-bit
    from shardscope._src.serve.estimate import weights_shape
    from shardscope._src.serve.types import Layout

    shape = weights_shape(PRESETS["h100"], config, Layout("tp", 1, 1), prompt)
    assert 0.9 < shape < 1
    saved = weights_flops * (1 / (989e12 * 0.54) - 1 / (1979e12 * 0.48)) / shape
    h100 = first["h100", "bfloat16"] - first["h100", "fp8"]
    assert saved < h100 <= saved + read(3.35e12)


@pytest.mark.compiler
def test_a_compiled_fp8_prefill_multiplies_by_its_weights_at_the_fp8_rate():
    # two of Llama 3.1 8B's layers prefilling 512 tokens: compute-bound at either rate (0.45
    # TFLOP of the weights' matmuls against 0.9 GB of weights and 0.07 GB of scores a pass)
    config = ModelConfig(
        d_model=4096, heads=32, kv_heads=8, ff=14336, layers=2, vocab=4096, mlp="swiglu",
        dtype="bfloat16", batch=1, seq=1,
    )  # fmt: skip
    first = {}
    for fmt in ("bfloat16", "fp8"):
        plan = _find(
            serve(config, 1, hardware="h100", prompt=512, output=16, batch=1, weights=fmt,
                  compiler="cpu"),
            "tp", {"model": 1}, 1,
        )  # fmt: skip
        first[fmt] = compile_prefill(plan, config, H100, 512, weights=fmt).first_token_s
    # nearly all of the FLOPs are the weights' (the attention's 1%): faster than at 16 bits
    # by nearly the rates' ratio, not by all of it
    ratio = (1979e12 * 0.48) / (989e12 * 0.54)
    assert first["bfloat16"] / ratio < first["fp8"] < 0.75 * first["bfloat16"]


MIXTRAL = model_preset("mixtral-8x7b").config(batch=1)
# every layer's 8 experts, SwiGLU's three matrices of 4096 x 14336 each
MIXTRAL_EXPERTS = 32 * 8 * 3 * 4096 * 14336


def test_a_mixture_on_8_h100s_splits_its_experts_over_the_replicas_or_replicates_them():
    result = serve(
        "mixtral-8x7b", 8, hardware="h100", prompt=2048, output=256, batch=64, compiler="cpu"
    )
    layouts = {(p.strategy, tuple(p.mesh.items())) for p in result.plans}
    assert ("ep_tp", (("expert", 8), ("model", 1))) in layouts
    assert ("ep_tp", (("expert", 2), ("model", 4))) in layouts
    assert ("dp_tp", (("data", 2), ("model", 4))) in layouts
    assert ("tp", (("model", 8),)) in layouts
    rest = MIXTRAL.param_count() - MIXTRAL_EXPERTS  # attention, routers, norms, embeddings
    # expert parallelism over 8: the rest on every device, one expert of each layer
    ep = _find(result, "ep_tp", {"expert": 8, "model": 1}, 64)
    assert ep.weight_bytes_per_device == rest * 2 + MIXTRAL_EXPERTS * 2 // 8
    # the 8 sequences of each device: 2304 tokens of 2 x 8 key/value heads x 128 x 32
    # layers in bf16
    assert ep.cache_bytes_per_device == 8 * 2304 * (2 * 8 * 128 * 32 * 2)
    # two replicas of tensor parallelism over 4, each holding every expert's quarter
    # (the routers, 4096 x 8 a layer, and the norms' gains whole on each device)
    dp = _find(result, "dp_tp", {"data": 2, "model": 4}, 64)
    whole = 32 * 4096 * 8 + (2 * 32 + 1) * 4096
    split = (rest - whole) * 2 // 4 + MIXTRAL_EXPERTS * 2 // 4
    assert dp.weight_bytes_per_device == split + whole * 2
    # no tensor parallelism: the dispatch and the combine alone, each layer, each of the 64
    # tokens' 2 assignments of 4096 bf16 elements, a device sending 7/8 of its eighth at
    # 80% of NVLink's 450 GB/s after 7 steps of 5 us
    one = 7 * 5e-6 + 64 * 2 * 4096 * 2 * 7 / 64 / (0.8 * 450e9)
    assert ep.decode_comm_s == pytest.approx(2 * 32 * one, rel=1e-9)


def test_a_decode_step_reads_only_the_experts_its_tokens_are_routed_to():
    # one sequence under tensor parallelism over 8: its token picks 2 of each layer's 8
    # experts, so 6 of every 8 experts' slices are not read (uniform routing's expectation
    # at one token); at 64 sequences about every expert is
    for batch, unread in ((1, 6 / 8), (64, (6 / 8) ** 64)):
        # each matrix at 80% of the bandwidth, whatever its size
        result = serve(
            "mixtral-8x7b", 8, hardware="h100", prompt=512, output=512, batch=batch,
            compiler="cpu", hardware_overrides={"hbm_fraction": 0.8},
        )  # fmt: skip
        p = _find(result, "tp", {"model": 8}, batch)
        read = p.weight_bytes_per_device - unread * MIXTRAL_EXPERTS * 2 / 8
        read -= 32000 // 8 * 4096 * 2  # the embedding table's slice, looked up a row a token
        read -= (2 * 32 + 1) * 4096 * 2  # the norms' gains, read by their element-wise kernels
        moved = (read + p.cache_bytes_per_device) / (3.35e12 * 0.8)
        assert p.decode_memory_s == pytest.approx(moved, rel=1e-9), batch


@pytest.mark.compiler
def test_a_mixtures_layouts_compile_with_the_dispatch_the_roofline_prices():
    # 8 experts, top 2, three layers, on 2 H100s: tensor parallelism over 2, two replicas,
    # and two replicas splitting the experts (the compiled all-to-alls move what the bound
    # says: each token's 2 assignments, at capacity factor 1)
    config = ModelConfig(
        d_model=512, heads=8, kv_heads=8, ff=1024, layers=3, vocab=1024, mlp="swiglu",
        dtype="bfloat16", batch=1, seq=1, experts=8, top_k=2,
    )  # fmt: skip
    compiled = serve(config, 2, hardware="h100", prompt=128, output=64, batch=16)
    estimate = serve(config, 2, hardware="h100", prompt=128, output=64, batch=16, compiler="cpu")
    assert {p.strategy for p in compiled.plans} == {"tp", "dp_tp", "ep_tp"}
    for p in compiled.plans:
        assert p.compiled_by == "h100"
        twin = _find(estimate, p.strategy, p.mesh, p.batch)
        assert p.decode_comm_s == pytest.approx(twin.decode_comm_s, rel=1e-9), p.label
        assert p.compiled_all_reduces == (2 * 3 + 1 if p.tensor_parallel > 1 else 0)
    assert _find(compiled, "ep_tp", {"expert": 2, "model": 1}, 16).decode_comm_s > 0


@pytest.mark.compiler
def test_a_dropless_mixture_is_served_at_its_routings_imbalance():
    # the busiest expert at 1.5 x its share: every device's dispatch and combine buffers
    # that large, compiled as the roofline prices them
    config = ModelConfig(
        d_model=512, heads=8, kv_heads=8, ff=1024, layers=3, vocab=1024, mlp="swiglu",
        dtype="bfloat16", batch=1, seq=1, experts=8, top_k=2, imbalance=1.5,
    )  # fmt: skip
    ep = {"expert": 2, "model": 1}
    kwargs = dict(hardware="h100", prompt=128, output=64, batch=16)
    skewed = _find(serve(config, 2, **kwargs), "ep_tp", ep, 16)
    estimate = _find(serve(config, 2, compiler="cpu", **kwargs), "ep_tp", ep, 16)
    uniform = _find(
        serve(replace(config, imbalance=1.0), 2, compiler="cpu", **kwargs), "ep_tp", ep, 16
    )
    assert skewed.compiled_by == "h100"
    assert skewed.decode_comm_s == pytest.approx(estimate.decode_comm_s, rel=1e-9)
    assert skewed.decode_comm_s > uniform.decode_comm_s


def test_deepseek_v3_holds_its_latent_cache_whole_on_each_device_of_a_replica():
    # 32 H100s: 16 replicas of tensor parallelism over 2 splitting the 256 experts (16 a
    # device); each token's cache is each layer's 512-wide latent and 64-wide rotary key,
    # shared by the heads, so the 2 devices of a replica both hold all of it
    result = serve(
        "deepseek-v3", 32, hardware="h100", prompt=2048, output=256, batch=1024,
        compiler="cpu",
    )  # fmt: skip
    config = model_preset("deepseek-v3").config(batch=1)
    p = _find(result, "ep_tp", {"expert": 16, "model": 2}, 1024)
    assert p.cache_bytes_per_device == 1024 // 16 * 2304 * (512 + 64) * 61 * 2
    experts = 58 * 256 * 3 * 7168 * 2048  # the layers after the first 3 dense ones
    # whole on each device of a replica: the latent down-projections (7168 x 1536 for the
    # queries, 7168 x (512 + 64) for the keys and values), the latents' norms, the routers
    # (7168 x 256) and every norm's gains
    whole = 61 * (7168 * 1536 + 7168 * 576 + 1536 + 512 + 2 * 7168) + 58 * 7168 * 256 + 7168
    split = config.param_count() - experts - whole
    assert p.weight_bytes_per_device == (split // 2 + experts // (2 * 16) + whole) * 2


#: What the stand-in compiler of :func:`_compiler_holding_more` holds beyond the estimate.
EXTRA = 2**30
#: Llama 3.1 8B served on one H100, as the two tests below plan it.
EIGHT_B = (("llama3-8b", 1), dict(hardware="h100", prompt=512, output=128))
#: What vLLM (the default engine) lets an H100 hold as it starts: gpu_memory_utilization 0.9
#: of the 79.11 GiB the CUDA runtime reports.
VLLM_H100 = 0.9 * 79.11 * 2**30


def _compiler_holding_more(monkeypatch):
    """A compiler whose decode step holds :data:`EXTRA` more than the estimate's (and a
    prefill holding nothing more); returns ``(largest, fits)``: the largest batch of
    :data:`EIGHT_B` by the estimate, and the largest whose estimate leaves that GiB free."""

    def compile_decode(plan, config, hw, **_):
        return replace(
            plan, temp_bytes_per_device=plan.temp_bytes_per_device + EXTRA, compiled_by=hw.name
        )

    monkeypatch.setattr(search_module, "compile_decode", compile_decode)
    monkeypatch.setattr(search_module, "compile_prefill", lambda plan, *a, **k: plan)
    args, kw = EIGHT_B
    largest = max(p.batch for p in serve(*args, compiler="cpu", **kw).plans)
    fits = max(
        b
        for b in range(1, largest + 1)
        if serve(*args, batch=b, compiler="cpu", **kw).best.memory_bytes_per_device + EXTRA
        <= VLLM_H100
    )
    return largest, fits


def test_a_layout_whose_largest_batch_does_not_fit_compiled_tries_the_largest_that_would(
    monkeypatch,
):
    # the plan kept is the largest batch whose estimate leaves the compiler's extra GiB
    # free, not the next power of two below the estimate's largest
    _, fits = _compiler_holding_more(monkeypatch)
    args, kw = EIGHT_B
    # (a batch whose sequences fill whole tiles of rows, 512, may rank above it and be
    # compiled too: the largest compiled is the one tried)
    compiled = max(
        (p for p in serve(*args, **kw).plans if p.compiled_by == "h100"), key=lambda p: p.batch
    )
    assert compiled.batch == fits
    assert compiled.memory_bytes_per_device <= VLLM_H100


def test_a_batch_given_that_does_not_fit_compiled_is_refused_not_changed(monkeypatch):
    # asked for the estimate's largest batch, which the compiled program does not fit, the
    # planner names the largest its program fits and changes nothing
    largest, fits = _compiler_holding_more(monkeypatch)
    args, kw = EIGHT_B
    assert fits < largest
    with pytest.raises(PlanError, match=rf"batch={largest} fits no layout once compiled .* "
                       rf"its program fits {fits}: give batch={fits} or less"):  # fmt: skip
        serve(*args, batch=largest, **kw)
    assert serve(*args, batch=fits, **kw).best.batch == fits


def test_the_plan_ranked_first_is_a_compiled_one(monkeypatch):
    # a compiler whose decode steps take twice the roofline's time: the layout's largest
    # batch, compiled, falls below its smaller batches as estimated, so the first of those is
    # compiled in turn, until a compiled plan leads
    compiled = []

    def compile_decode(plan, config, hw, **_):
        compiled.append(plan.batch)
        slow = 2 * plan.decode_step_s
        return replace(
            plan,
            decode_step_s=slow,
            tokens_per_s_per_chip=plan.batch / slow,
            compiled_by=hw.name,
        )

    monkeypatch.setattr(search_module, "compile_decode", compile_decode)
    monkeypatch.setattr(search_module, "compile_prefill", lambda plan, *a, **k: plan)
    result = serve("llama3-8b", 1, hardware="h100", prompt=512, output=128)
    assert result.best.compiled_by == "h100"
    assert len(compiled) > 1  # the largest, then the leaders
    estimated = [p for p in result.plans if p.compiled_by is None]
    assert all(p.tokens_per_s_per_chip < result.best.tokens_per_s_per_chip for p in estimated)


def test_a_plan_says_what_priced_its_step_and_keeps_its_estimate_beside_a_compile(monkeypatch):
    # a stand-in compiler whose decode steps take twice the roofline's time and launch 100
    # kernels (keeping the estimate, as compile_decode does): the plans it compiled say so,
    # rank by the compiled figure, and keep beside it the estimate they replaced, which is
    # the roofline's plan of the same layout and batch to the digit; the layout's other
    # plans are estimated, their steps the roofline's with the compiled step's launches in
    # place of its own
    def compile_decode(plan, config, hw, **_):
        slow = 2 * plan.estimated.decode_step_s
        return replace(
            plan,
            estimate=plan.estimated,
            decode_step_s=slow,
            tokens_per_s_per_chip=plan.batch / slow,
            compiled_by=hw.name,
            decode_kernels=100,
        )

    monkeypatch.setattr(search_module, "compile_decode", compile_decode)
    monkeypatch.setattr(search_module, "compile_prefill", lambda plan, *a, **k: plan)
    args, kw = EIGHT_B
    result = serve(*args, **kw)
    roofline = {p.batch: p for p in serve(*args, compiler="cpu", **kw).plans}
    sources = [p.step_source for p in result.plans]
    assert StepSource.COMPILED in sources and StepSource.ESTIMATED in sources
    for p in result.plans:
        assert isinstance(p, StepCost) and p.step_time_s == p.decode_step_s
        assert (p.step_source is StepSource.COMPILED) == (p.compiled_by == "h100")
        assert p.estimated.step_source is StepSource.ESTIMATED
        assert p.estimated.step_time_s == roofline[p.batch].step_time_s
        if p.step_source is StepSource.COMPILED:
            assert p.step_time_s == 2 * p.estimated.step_time_s
        else:
            assert p.decode_kernels == 100
            # (the launches join the device's step before the engine's host follows it)
            own = p.estimated.decode_kernels
            assert own == 32 * 10 + 4  # Llama 3 8B's: 10 kernels a layer and 4 a step
            launched = p.estimated.step_time_s + launch_seconds(H100, 100 - own)
            assert p.step_time_s == pytest.approx(launched, rel=1e-12)
    ranks = [(-p.tokens_per_s_per_chip, p.step_time_s) for p in result.plans]
    assert ranks == sorted(ranks)


def test_the_sweep_keeps_what_fits_and_marks_the_front():
    # the roofline's plans (compiling them is the tests above)
    result = serve("llama3-70b", 8, hardware="h100", prompt=2048, output=256, compiler="cpu")
    assert result.plans and all(p.fits for p in result.plans)
    # best throughput per chip first; no plan of the front is beaten on both
    rates = [p.tokens_per_s_per_chip for p in result.plans]
    assert rates == sorted(rates, reverse=True)
    for p in result.front:
        assert not any(
            q.decode_step_s < p.decode_step_s and q.tokens_per_s_per_chip > p.tokens_per_s_per_chip
            for q in result.plans
        )
    # the model's 8 key/value heads allow tensor parallelism over 1, 2, 4 or 8
    assert {p.tensor_parallel for p in result.plans} <= {1, 2, 4, 8}


@pytest.mark.compiler
def test_a_latency_keeps_the_layouts_that_meet_it():
    # one H100: 16 GB of weights a step at the 2.68 TB/s its matmuls read them at, 6 ms at
    # least, more at the larger batches
    every = serve("llama3-8b", 1, hardware="h100", prompt=512, output=128, compiler="cpu")
    assert any(p.decode_step_s > 0.008 for p in every.plans)
    result = serve("llama3-8b", 1, hardware="h100", prompt=512, output=128, latency=0.008)
    # those that meet it as estimated, and as compiled
    assert result.plans and all(p.decode_step_s <= 0.008 for p in result.plans)
    assert any(p.compiled_by == "h100" for p in result.plans)
    with pytest.raises(PlanError, match=r"latency=1 ms per output token.*fastest is"):
        serve("llama3-8b", 1, hardware="h100", prompt=512, output=128, latency=0.001)


def test_what_cannot_be_served_names_the_largest_that_fits():
    with pytest.raises(PlanError, match=r"batch=100000 .*largest batch that fits is \d+"):
        serve("llama3-70b", 8, hardware="h100", prompt=2048, output=256, batch=100000)
    # Llama 3.1 405B's 405,853,388,800 bfloat16 weights over the 79.11 GiB an H100's runtime
    # reports: 9.56 devices' worth, so at least 10
    with pytest.raises(PlanError, match=r"weights alone .*\(at least 10 hold the weights\)"):
        serve("llama3-405b", 1, hardware="h100", prompt=128, output=128)
    # Mixtral's 87 GiB on 3 H100s: enough devices, but 3 divides neither its heads nor its
    # 8 experts, and one device a replica cannot hold it; 2 and 4 split its experts, 6 is
    # three replicas of tensor parallelism over 2 (5 splits nothing)
    with pytest.raises(PlanError, match="no layout of 3 x h100 .* serve it: 2, 4, 6$"):
        serve("mixtral-8x7b", 3, hardware="h100", prompt=128, output=128, compiler="cpu")
    with pytest.raises(PlanError, match="prompt=0"):
        serve("llama3-8b", 1, prompt=0, output=16)
    with pytest.raises(PlanError, match="context=100"):
        serve("llama3-8b", 1, prompt=128, output=16, context=100)
    with pytest.raises(PlanError, match="cache='int4'"):
        serve("llama3-8b", 1, prompt=128, output=16, cache="int4")
    with pytest.raises(PlanError, match="compiler='tpu-v5p'.*hardware h100"):
        serve("llama3-8b", 1, hardware="h100", prompt=128, output=16, compiler="tpu-v5p")


def test_plan_serve_refuses_what_it_would_not_read(tmp_path, capsys):
    argv = ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "512"]
    argv += ["--output", "128"]
    trained = [*argv, "--remat", "full", "--no-flash-attention"]
    line = assert_usage_error(trained, "plan training, not serving", capsys)
    assert "--remat" in line and "--no-flash-attention" in line
    assert "--report" in assert_usage_error([*argv, "--report", "r.md"], "training", capsys)
    line = assert_usage_error([*argv, "--compiler", "tpu-v5e"], "hardware h100", capsys)
    assert "give compiler='h100'" in line and "flag --compiler" in line
    # cpu: the roofline alone, nothing compiled
    out = tmp_path / "serve.json"
    assert main([*argv, "--compiler", "cpu", "--json", str(out)]) == 0
    plans = json.loads(out.read_text())["plans"]
    assert plans and all(p["compiled_by"] is None for p in plans)


@pytest.mark.compiler
def test_plan_serve_prints_the_plans_and_writes_them(tmp_path, capsys):
    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    argv = ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "512"]
    assert main([*argv, "--output", "128", "--json", str(out), "--png", str(png)]) == 0
    assert "tok/s/chip" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["prompt"] == 512 and data["plans"][0]["batch"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    line = assert_usage_error(argv, "give --output", capsys)
    assert "--serve" in line
    assert_usage_error(
        ["plan", "--model", "llama3-8b", "--devices", "2", "--prompt", "512"],
        "give --serve",
        capsys,
    )
    line = assert_usage_error(
        [*argv, "--output", "16", "--token-latency", "0.0001"], "no layout meets", capsys
    )
    assert "--token-latency" in line


def test_plan_serve_serves_a_mixture_at_the_routing_it_is_given(tmp_path, capsys):
    argv = ["plan", "--serve", "--model", "qwen3-30b-a3b", "--devices", "8", "--prompt", "512"]
    argv += ["--output", "128", "--batch", "64", "--compiler", "cpu"]
    uniform, skewed = tmp_path / "uniform.json", tmp_path / "skewed.json"
    assert main([*argv, "--json", str(uniform)]) == 0
    capsys.readouterr()
    assert main([*argv, "--imbalance", "1.5", "--dispatch-once", "--json", str(skewed)]) == 0
    title = capsys.readouterr().out
    assert "busiest expert 1.5x its share" in title and "once to each device" in title
    u, s = json.loads(uniform.read_text()), json.loads(skewed.read_text())
    assert (u["imbalance"], u["dispatch_once"]) == (1.0, False)
    assert (s["imbalance"], s["dispatch_once"]) == (1.5, True)
    line = assert_usage_error(
        ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "512"]
        + ["--output", "128", "--imbalance", "1.5"],
        "imbalance=1.5",
        capsys,
    )
    assert "a dense model; leave it 1" in line and "--imbalance" in line


def test_a_servers_grouped_kernel_reads_a_layers_experts_on_a_device_at_once():
    # Mixtral 8x7B: 32 layers of 8 experts, each a 4096 x 2 x 14336 up projection (with its
    # gate) and a 14336 x 4096 down; tensor parallel over 8 splits each expert's hidden, so a
    # layer's kernel of each weight reads its 8 experts' eighths; with the experts over 2
    # devices besides (expert x model = 2 x 4), 4 experts' quarters
    config = model_preset("mixtral-8x7b").config(batch=1)
    for layout, experts, t in ((Layout("tp", 8, 1), 8, 8), (Layout(ServeLayout.EP_TP, 4, 2), 4, 4)):
        grouped = [(r.elements, r.kernels) for r in weight_reads(config, layout) if r.experts]
        assert grouped == [
            (experts * 4096 * 2 * 14336 // t, 32),
            (experts * 14336 // t * 4096, 32),
        ]


def test_a_mixture_whose_layouts_cannot_split_its_experts_says_why():
    # Qwen3-30B-A3B on 6 H100s: tensor parallelism divides the 6 devices and the 32 heads and
    # divides or is a multiple of the 4 key/value heads (1 or 2: replicas of 6 or 3), and an
    # expert axis spans the replicas: neither 6 nor 3 divides the 128 experts. 2, 4 and 8
    # devices have replicas of 2, 4 or 8 (up to 12, 6, 10 and 12 have none)
    kw = dict(hardware="h100", prompt=2048, output=256, compiler="cpu")
    result = serve("qwen3-30b-a3b", 6, **kw)
    assert {p.strategy for p in result.plans} == {"dp_tp"}
    (note,) = result.notes
    assert note.kind is ServeNote.EXPERTS_NOT_SPLIT
    assert (note.values.experts, note.values.replicas, note.values.counts) == (
        128,
        (3, 6),
        (2, 4, 8),
    )
    assert note.params == ("devices",)
    assert "128 routed experts (2, 4 or 8 devices do)" in note.text
    assert "22 or 21 a rank of 6" in note.text  # 128 = 2 x 22 + 4 x 21
    assert ServeResult.from_dict(result.to_dict()).notes == result.notes
    # on 8 devices the experts are split; a dense model has none to split
    assert serve("qwen3-30b-a3b", 8, **kw).notes == ()
    assert serve("llama3-8b", 6, **kw).notes == ()
