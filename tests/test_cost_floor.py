"""The cost floor's prices and the planners' one ranking: properties every caller relies on."""

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardscope import comm
from shardscope._src.cost.compute import kernel_seconds, work_seconds
from shardscope._src.cost.flops import attention_core_flops
from shardscope._src.cost.links import collective_seconds
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.rank import pareto_front, rank_key
from shardscope._src.targets.hardware import hardware

SECONDS = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@given(SECONDS, SECONDS)
def test_a_kernel_takes_at_least_its_longer_part_and_at_most_both(compute_s, memory_s):
    t = kernel_seconds(compute_s, memory_s)
    longer, both = max(compute_s, memory_s), compute_s + memory_s
    assert longer * (1 - 1e-12) <= t <= both * (1 + 1e-12)


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
    payload = 3 * 2**20
    public = comm.alpha_beta_time(
        kind,
        payload,
        n,
        bandwidth_bytes_per_s=hw.link_bandwidth * hw.comm_fraction,
        alpha_s=hw.latency_s,
    )
    sent = comm.traffic_bytes(kind, payload, n)
    assert public == collective_seconds(hw, {"model": n}, kind, ("model",), n, sent)


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
