"""The cost floor's prices and the planners' one ranking: properties every caller relies on."""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardscope import comm
from shardscope._src.audit.overlap import Kernel
from shardscope._src.cost.compute import (
    gemm_efficiency,
    gemm_seconds,
    kernel_seconds,
    kernels_seconds,
    matmul_seconds,
    work_seconds,
)
from shardscope._src.cost.flops import Gemm, attention_core_flops
from shardscope._src.cost.links import collective_seconds, engine_all_reduce_seconds
from shardscope._src.hlo.cost import Cost
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.rank import pareto_front, rank_key
from shardscope._src.targets.hardware import hardware

SECONDS = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@given(SECONDS, SECONDS)
def test_a_kernel_takes_at_least_its_longer_part_and_at_most_both(compute_s, memory_s):
    t = kernel_seconds(compute_s, memory_s)
    longer, both = max(compute_s, memory_s), compute_s + memory_s
    assert longer * (1 - 1e-12) <= t <= both * (1 + 1e-12)


def test_no_gpu_kernel_runs_in_less_than_the_least_a_kernel_runs():
    # ten norms of 4 tokens x 8192 in bf16 (64 KiB read, 64 KiB written: 39 ns at the H100's
    # 3.35 TB/s) and a matmul reading 1 GB at 80% of it, one after another: each norm takes
    # the 2 us least a kernel runs on an H100, the matmul its reads' time
    moved = 2 * 4 * 8192 * 2
    norm, matmul = Kernel(Cost(bytes=moved)), Kernel(Cost(bytes=10**9, matmul_bytes=10**9))
    runs = {norm: 10, matmul: 1}
    reads = 10**9 / (3.35e12 * 0.8)
    h100 = hardware("h100", hbm_fraction=0.8)
    got = kernels_seconds(h100, runs, (0.0, 0.0))
    assert got == pytest.approx(10 * 2e-6 + reads, rel=1e-12)
    # with no least time, the norms take their bytes' time
    free = hardware("h100", kernel_floor_s=0, hbm_fraction=0.8)
    assert kernels_seconds(free, runs, (0.0, 0.0)) == pytest.approx(
        10 * moved / 3.35e12 + reads, rel=1e-12
    )


def test_a_gpu_runs_its_kinds_of_kernel_one_after_another_and_a_tpu_overlaps_them():
    kernels = ((2.0, 1.0), (1.0, 2.0))  # (matmuls, reads) each
    # a GPU: each kernel its longer part and a twentieth of the shorter, one after another
    assert work_seconds(hardware("h100"), *kernels) == pytest.approx(2 * (2.0 + 0.05))
    # a TPU: the slower of all the matmuls and all the reads
    assert work_seconds(hardware("tpu-v5e"), *kernels) == 3.0


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_public_alpha_beta_time_is_the_planners_price_within_a_node(kind, n):
    hw = hardware("h100")
    payload = 256 * 2**20  # large enough that NCCL's bandwidth protocol is its choice
    public = comm.alpha_beta_time(
        kind,
        payload,
        n,
        bandwidth_bytes_per_s=hw.link_bandwidth * hw.comm_fraction,
        alpha_s=hw.latency_s,
    )
    sent = comm.traffic_bytes(kind, payload, n)
    assert public == collective_seconds(hw, {"model": n}, kind, ("model",), n, sent)


def test_a_small_all_reduce_on_gpus_is_priced_in_nccls_low_latency_protocol():
    hw = hardware("h100")
    payload = 16 * 1024  # a tensor-parallel all-reduce of a decode step's activations
    sent = comm.traffic_bytes("all-reduce", payload, 8)
    got = collective_seconds(hw, {"model": 8}, "all-reduce", ("model",), 8, 80 * sent, count=80)
    # NCCL's tuning model: LL starts in 6.6 us and takes 0.6 us a ring step over NVLink (an
    # all-reduce over 8 takes 2 x 7 steps), at a quarter of the bus bandwidth (0.8 of 450 GB/s)
    one = 6.6e-6 + 2 * 7 * 0.6e-6 + (2 * 7 * payload / 8) / (450e9 * 0.8 / 4)
    assert got == pytest.approx(80 * one)
    # not 14 steps of the bandwidth protocol's 5 us each, 70 us an all-reduce
    assert got < 80 * 2 * 7 * hw.latency_s


def test_the_low_latency_protocol_pays_the_network_on_the_steps_that_cross_nodes():
    hw = hardware("h100")
    sent = comm.traffic_bytes("all-reduce", 4096, 16)
    got = collective_seconds(hw, {"model": 16}, "all-reduce", ("model",), 16, sent)
    # 16 GPUs on 2 nodes: of 2 x 15 ring steps, 2 x 2 cross the network (2.7 us each); the
    # traffic goes over the 8 network cards of each node (or NVLink, if slower), at a quarter
    one = 6.6e-6 + (2 * 15 - 4) * 0.6e-6 + 4 * 2.7e-6
    bandwidth = min(hw.link_bandwidth, 8 * hw.cross_node_bandwidth) * 0.8 / 4
    assert got == pytest.approx(one + sent / bandwidth)


def test_an_all_to_all_across_nodes_sends_each_devices_remote_share_through_its_own_card():
    hw = hardware("h100")
    sent = 2**30  # bytes a device sends: a large dispatch
    # 64 GPUs on 8 nodes (DeepEP's internode EP 64): 56 of each GPU's 63 peers are on other
    # nodes, and that share of its bytes leaves through its own 50 GB/s card (at 0.8 of it)
    got = collective_seconds(hw, {"expert": 64}, "all-to-all", ("expert",), 64, sent)
    network = sent * 56 / 63 / (50e9 * 0.8)
    assert got == pytest.approx(63 * hw.latency_s + network)
    # not over the 8 cards of a node, as a ring's traffic is: 400 GB/s, capped by NVLink
    ring = collective_seconds(hw, {"expert": 64}, "all-gather", ("expert",), 64, sent)
    assert ring == pytest.approx(63 * hw.latency_s + sent / (400e9 * 0.8))
    assert got > 6 * ring
    # on one node every peer is a link away
    inside = collective_seconds(hw, {"expert": 8}, "all-to-all", ("expert",), 8, sent)
    assert inside == pytest.approx(7 * hw.latency_s + sent / (450e9 * 0.8))


@pytest.mark.parametrize(
    "experts, top_k, ep, crossing",
    [(256, 8, 64, 0.69), (384, 8, 32, 0.50), (128, 4, 64, 0.85)],
    ids=["deepseek-v3-ep64", "kimi-k2-ep32", "gpt-oss-120b-ep64"],
)
def test_deepep_sends_a_token_across_the_network_once_to_each_node(experts, top_k, ep, crossing):
    hw = hardware("h100")
    sent = 2**30
    nodes, m = ep // 8, 8

    def reached(holders):  # chance that one of ``holders`` holds one of a token's experts
        return 1 - math.comb(experts - experts // holders, top_k) / math.comb(experts, top_k)

    # a token's rows for other nodes: one a device of its experts there, one a node once
    per_device, per_node = (ep - m) * reached(ep), (nodes - 1) * reached(nodes)
    assert per_node / per_device == pytest.approx(crossing, abs=0.005)
    remote, local = sent * (ep - m) / (ep - 1), sent * (m - 1) / (ep - 1)
    network = remote * per_node / per_device / (50e9 * 0.8)
    nvlink = (local + remote * (1 - per_node / per_device)) / (450e9 * 0.8)
    got = collective_seconds(
        hw, {"expert": ep}, "all-to-all", ("expert",), ep, sent, once_per_node=(experts, top_k)
    )
    assert got == pytest.approx((ep - 1) * hw.latency_s + max(network, nvlink))
    # inside one node nothing crosses the network either way
    inside = collective_seconds(hw, {"expert": 8}, "all-to-all", ("expert",), 8, sent)
    once = collective_seconds(
        hw, {"expert": 8}, "all-to-all", ("expert",), 8, sent, once_per_node=(experts, top_k)
    )
    assert once == inside


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
def test_large_collectives_on_gpus_keep_the_bandwidth_protocols_price(kind):
    hw = hardware("h100")
    sent = comm.traffic_bytes(kind, 2**30, 8)
    alpha_beta = 8 * comm.latency_steps(kind, 8) * hw.latency_s + 8 * sent / (
        hw.link_bandwidth * hw.comm_fraction
    )
    got = collective_seconds(hw, {"model": 8}, kind, ("model",), 8, 8 * sent, count=8)
    assert got == pytest.approx(alpha_beta)


@pytest.mark.parametrize(("kind", "hops"), [("all-gather", 8), ("reduce-scatter", 8),
                                            ("all-reduce", 16)])  # fmt: skip
def test_a_tpu_ring_takes_half_its_chips_in_hops_each_its_latency_or_its_transfer(kind, hops):
    hw = hardware("tpu-v5e")  # 1 us a hop, 2 x 45 GB/s of ICI at 0.8
    bandwidth = 2 * 4.5e10 * 0.8
    # a few kilobytes: 16 chips both ways round a ring, 8 hops (16 for an all-reduce) of 1 us
    small = comm.traffic_bytes(kind, 4096, 16)
    got = collective_seconds(hw, {"model": 16}, kind, ("model",), 16, 3 * small, count=3)
    assert got == pytest.approx(3 * hops * 1e-6)
    # a gigabyte: its traffic alone, the hops' latency hidden under it rather than added
    large = comm.traffic_bytes(kind, 2**30, 16)
    got = collective_seconds(hw, {"model": 16}, kind, ("model",), 16, large)
    assert got == pytest.approx(large / bandwidth)


def test_a_tpu_all_to_all_and_a_ring_across_slices_keep_the_alpha_beta_sum():
    hw = hardware("tpu-v5e")  # 256 chips a slice
    sent = comm.traffic_bytes("all-to-all", 4096, 8)
    got = collective_seconds(hw, {"model": 8}, "all-to-all", ("model",), 8, sent)
    assert got == pytest.approx(7 * 1e-6 + sent / (2 * 4.5e10 * 0.8))
    # two slices (the data axis outermost): each pair over data has one chip on each slice,
    # so its 2 steps cross the data-center network, at 6.25 GB/s a chip
    sent = comm.traffic_bytes("all-reduce", 4096, 2)
    sizes = {"data": 2, "model": 256}
    got = collective_seconds(hw, sizes, "all-reduce", ("data",), 2, sent)
    assert got == pytest.approx(2 * 1e-6 + sent / (6.25e9 * 0.8))


@given(st.integers(min_value=1, max_value=2**34), st.sampled_from([2, 4, 8]))
def test_choosing_a_protocol_never_prices_a_collective_above_the_bandwidth_protocol(size, n):
    hw = hardware("h100")
    sent = comm.traffic_bytes("all-reduce", size, n)
    alpha_beta = comm.latency_steps("all-reduce", n) * hw.latency_s + sent / (
        hw.link_bandwidth * hw.comm_fraction
    )
    got = collective_seconds(hw, {"model": n}, "all-reduce", ("model",), n, sent)
    assert 0 < got <= alpha_beta * (1 + 1e-12)


def test_decode_attends_to_a_latent_cache_with_the_up_projections_absorbed():
    mla = model_preset("deepseek-v3").config(batch=1)
    dense = model_preset("llama3-8b").config(batch=1)
    # DeepSeek-V3: 128 heads, a latent of 512 and a rotary key of 64: a score of 576
    # dimensions and a value of 512 against each cached token
    assert attention_core_flops(mla, 1, 10, absorbed=True) == 2 * 128 * (576 + 512) * 10
    # expanded (prefill's form): queries and keys of 192, values of 128
    assert attention_core_flops(mla, 1, 10) == 2 * 128 * (192 + 128) * 10
    # without latent attention there is nothing to absorb
    assert attention_core_flops(dense, 3, 10, absorbed=True) == attention_core_flops(dense, 3, 10)


MERITS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=12)


def _beats(a, b):
    return a[0] <= b[0] and a[1] <= b[1] and a != b


@given(MERITS)
def test_the_front_is_every_plan_no_other_beats(plans):
    front = pareto_front(plans, lambda p: p[0], lambda p: p[1])
    for i, p in enumerate(plans):
        assert (i in front) is not any(_beats(q, p) for q in plans)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 9)), max_size=12))
def test_the_rank_puts_what_fits_first_then_orders_by_each_merit_in_turn(rows):
    plans = [SimpleNamespace(fits=f, time=t, memory=m) for f, t, m in rows]
    ranked = sorted(plans, key=rank_key(lambda p: p.time, lambda p: p.memory))
    got = [(not p.fits, p.time, p.memory) for p in ranked]
    assert got == sorted(got)
    assert [p.fits for p in ranked] == sorted((p.fits for p in plans), reverse=True)


def test_a_gemm_runs_at_the_share_of_its_waves_its_tiles_fill():
    h = hardware("h100")  # 132 SMs, tiles of 128 x 128
    one_wave = Gemm(12 * 128, 11 * 128, 4096)  # 12 x 11 = 132 whole tiles
    assert gemm_efficiency(h, one_wave.m, one_wave.n, one_wave.k) == 1.0
    assert gemm_seconds(h, one_wave) == matmul_seconds(h, one_wave.flops)
    # one token: a row of each 16-row tile (the fewest rows a tile has) of a whole wave
    assert gemm_efficiency(h, 1, 132 * 128, 4096) == pytest.approx(1 / 16, rel=1e-12)
    # a wave and one tile: 133 tiles take two waves of 132
    assert gemm_efficiency(h, 128, 133 * 128, 4096) == pytest.approx(133 / (2 * 132), rel=1e-12)
    # 33 tiles: k split over the idle SMs, 4 parts each (132), or as deep as k allows: 2
    # parts of a k of 128 (tiles step 64 deep)
    assert gemm_efficiency(h, 128, 33 * 128, 4096) == 1.0
    assert gemm_efficiency(h, 128, 33 * 128, 128) == pytest.approx(66 / 132, rel=1e-12)
    # a TPU's matmuls at the flat rate whatever their shape
    assert gemm_efficiency(hardware("tpu-v6e"), 1, 128, 128) == 1.0


def test_a_short_prompts_prefill_is_slower_by_the_rows_its_tiles_leave_empty():
    from shardscope._src.serve.estimate import estimate_plan, prefill_flops
    from shardscope._src.serve.types import Layout

    config = model_preset("llama3-8b").config(batch=1)
    # weights read in no time (the prefill's matmuls its time), tiles of one column on one
    # SM (no wave left part empty): only the prompt's rows quantized, 80 of a 128-row tile
    shaped = hardware("h100", hbm_bandwidth=1e18, sms=1, tile_n=1)
    flat = hardware(shaped, tile_m=1)  # a tile a row: the flat rate
    prompt = 80

    def first_token_s(hw):
        return estimate_plan(
            config, hw, Layout("tp", 1, 1), 1, prompt, prompt + 1, "bfloat16", "bfloat16"
        ).first_token_s

    weights_s = matmul_seconds(flat, prefill_flops(config, prompt)[0])
    slower = first_token_s(shaped) - first_token_s(flat)
    assert slower == pytest.approx((128 / 80 - 1) * weights_s, rel=1e-9)


def test_a_serving_engines_all_reduce_inside_an_h100_node_is_priced_as_its_kernel_measures():
    # 8 H100s: 32 KiB measured in 7.8 us, 256 KiB in 16.7 us; 96 KiB a third of the way
    h100, model = hardware("h100"), {"model": 8}
    third = 7.8e-6 + (96 - 32) / (256 - 32) * (16.7e-6 - 7.8e-6)
    assert engine_all_reduce_seconds(h100, model, ("model",), 96 * 1024, 1.0) == pytest.approx(
        third, rel=1e-12
    )
    # below the least size measured, its time; NCCL's where that is faster
    assert engine_all_reduce_seconds(h100, {"model": 2}, ("model",), 64, 1.0) == 3.7e-6
    assert engine_all_reduce_seconds(h100, model, ("model",), 32768, 5e-6) == 5e-6
    # beyond 1 MiB, across two nodes (of 2 GPUs each), over 6 or on an A100: NCCL's
    assert engine_all_reduce_seconds(h100, model, ("model",), 2**20 + 1, 1.0) == 1.0
    pairs = hardware("h100", node_size=2)
    assert engine_all_reduce_seconds(pairs, {"model": 4}, ("model",), 4096, 1.0) == 1.0
    assert engine_all_reduce_seconds(h100, {"model": 6}, ("model",), 4096, 1.0) == 1.0
    assert engine_all_reduce_seconds(hardware("a100"), model, ("model",), 4096, 1.0) == 1.0
