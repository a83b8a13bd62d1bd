"""A mixture's routed expert matmuls are priced at the throughput an H100 was measured at for
their shape (XLA's table of batched matmuls), by the tokens each expert takes under the
placement: the table is read exactly at its shapes and monotonically between them, the
per-expert batch follows the layout, a layout that gives each expert fewer tokens runs its
experts slower a FLOP, and a dense model's step does not move."""

import itertools
import math
from dataclasses import replace

import pytest

from shardscope._src.cost.compute import (
    H100_LARGE_MATMUL_TFLOPS,
    H100_MATMUL_TFLOPS,
    MATMUL_BATCHES,
    MATMUL_SIZES,
    measured_efficiency,
    measured_tflops,
)
from shardscope._src.cost.flops import Gemm
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import expert_batch, expert_gemms, routed_expert_work
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate
from shardscope._src.train.types import Candidate

# 64 experts of 2 of 8 a token, 4 sequences of 256 tokens a device on 8 devices
MOE = ModelConfig(
    d_model=512,
    heads=8,
    kv_heads=4,
    ff=1024,
    layers=2,
    batch=32,
    seq=256,
    vocab=None,
    mlp="swiglu",
    experts=64,
    top_k=2,
    expert_ff=768,
    dtype="bfloat16",
)
DENSE = replace(MOE, experts=0, top_k=0, expert_ff=None)


def test_the_table_is_read_exactly_at_its_measured_shapes():
    for b, m, n in H100_MATMUL_TFLOPS:
        for k, rate in zip(MATMUL_SIZES, H100_MATMUL_TFLOPS[b, m, n], strict=True):
            assert measured_tflops(b, m, n, k) == rate, (b, m, n, k)
    # every shape of the grid is measured once, 3 batches by 5 sizes cubed
    assert len(H100_MATMUL_TFLOPS) * len(MATMUL_SIZES) == 3 * 5**3
    # the largest shape is 1; every share is in (0, 1]
    h = hardware("h100")
    assert measured_efficiency(h, Gemm(4096, 4096, 4096, times=4)) == 1.0
    shares = [
        measured_efficiency(h, Gemm(m, n, k, times=b))
        for b, m, n, k in itertools.product(MATMUL_BATCHES, *[MATMUL_SIZES] * 3)
    ]
    assert 0 < min(shares) and max(shares) == 1.0
    assert min(shares) == pytest.approx(6.45 / H100_LARGE_MATMUL_TFLOPS)


GRIDS = (MATMUL_BATCHES, MATMUL_SIZES, MATMUL_SIZES, MATMUL_SIZES)


def _measured(point: list[int]) -> float:
    b, m, n, k = point
    return H100_MATMUL_TFLOPS[b, m, n][MATMUL_SIZES.index(k)]


@pytest.mark.parametrize("axis", [0, 1, 2, 3], ids=["b", "m", "n", "k"])
def test_between_its_shapes_the_table_is_read_monotonically_where_it_is(axis):
    others = [a for a in range(4) if a != axis]
    checked = 0
    for i in range(len(GRIDS[axis]) - 1):
        lo, hi = GRIDS[axis][i], GRIDS[axis][i + 1]
        # each cell of the other three sizes, at a point a third of the way through it
        for cell in itertools.product(*(range(len(GRIDS[a]) - 1) for a in others)):
            around = [(GRIDS[a][j], GRIDS[a][j + 1]) for a, j in zip(others, cell, strict=True)]
            rest = [x * (y / x) ** (1 / 3) for x, y in around]
            # how the table moves from lo to hi at each of the cell's eight corners
            moves = []
            for corner in itertools.product(*around):
                point = list(corner)
                ends = [_measured(point[:axis] + [at] + point[axis:]) for at in (lo, hi)]
                moves.append(ends[1] - ends[0])
            if all(d >= 0 for d in moves):
                sign = 1
            elif all(d <= 0 for d in moves):
                sign = -1
            else:
                continue  # the table itself is not monotone here
            values = [
                measured_tflops(*(rest[:axis] + [lo * (hi / lo) ** (s / 8)] + rest[axis:]))
                for s in range(9)
            ]
            assert all(sign * (b - a) >= 0 for a, b in itertools.pairwise(values)), values
            checked += 1
    # nearly every cell: the table falls a little only about its largest shapes
    assert checked >= 0.9 * (len(GRIDS[axis]) - 1) * math.prod(len(GRIDS[a]) - 1 for a in others)


@pytest.mark.parametrize(
    "strategy, mesh, experts, rows",
    [
        # FSDP gathers every expert; a device's 4 x 256 tokens, 2 slots each, over 64 experts
        ("fsdp", "data=8", 64, 4 * 256 * 2 // 64),
        # expert parallel over 8: 8 experts a device, each the slots of the 8 devices' tokens
        ("ep", "expert=8", 64 // 8, 8 * 4 * 256 * 2 // 64),
        ("fsdp_ep", "data=2,expert=4", 64 // 4, 4 * 4 * 256 * 2 // 64),
        # with tensor parallelism over 2 a device's tokens are its model group's (the batch
        # over data x expert, 4 ways): each of its 32 experts takes its 2 expert devices'
        ("zero1_ep_tp", "data=2,expert=2,model=2", 64 // 2, 2 * (32 // 4) * 256 * 2 // 64),
        # folded over expert x model: each device routes its own half of its 8 sequences,
        # each expert whole on one of the 8 devices of the group
        ("ep_fold_sp", "expert=4,model=2", 64 // 8, 8 * (32 // 4) * 256 // 2 * 2 // 64),
    ],
    ids=["fsdp", "ep", "fsdp_ep", "zero1_ep_tp", "ep_fold_sp"],
)
def test_each_expert_takes_the_slots_of_the_devices_that_send_to_it(strategy, mesh, experts, rows):
    placement = get_strategy(strategy).place(MOE, abstract_mesh(mesh))
    assert expert_batch(placement) == (experts, rows)
    # two micro-batches: half the rows an expert
    assert expert_batch(placement, 2) == (experts, rows // 2)
    # the experts' matmuls are the routed FLOPs the step counts, forward and twice backward
    fwd, bwd = expert_gemms(placement)
    flops, _ = routed_expert_work(placement)
    assert sum(g.flops for g in fwd) * MOE.moe_layers == flops
    assert sum(g.flops for g in bwd) == 2 * sum(g.flops for g in fwd)


def test_a_capacity_factor_and_a_dropless_imbalance_size_each_experts_rows():
    ep = get_strategy("ep")
    # padded to 1.25 x the even share: 8 devices' 1,024 tokens x 2 slots over 64, x 5 / 4
    padded = ep.place(replace(MOE, capacity_factor=1.25), abstract_mesh("expert=8"))
    assert expert_batch(padded) == (8, 8 * 1024 * 2 // 64 * 5 // 4)
    # dropless at the busiest expert's imbalance 1.5: its tokens, 3 / 2 of the even share
    busiest = ep.place(replace(MOE, imbalance=1.5), abstract_mesh("expert=8"))
    assert expert_batch(busiest) == (8, 8 * 1024 * 2 // 64 * 3 // 2)


# 8 experts: FSDP's 256 slots an expert, enough that its matmuls outlast reading its weights
FEW = replace(MOE, experts=8)


def _expert_slowdown(strategy: str, mesh: tuple[tuple[str, int], ...]) -> float:
    """What pricing the experts' matmuls by their measured shapes adds to a step's compute,
    a routed expert FLOP of the whole step: the same step on an H100 whose matmuls are priced
    by shape and on one whose are not differ in nothing else."""
    c = Candidate(strategy, mesh)
    by_shape = estimate(c, FEW, "h100").time.compute_s
    flat = estimate(c, FEW, hardware("h100", matmul_by_shape=False)).time.compute_s
    placement = get_strategy(strategy).place(FEW, abstract_mesh(c.mesh.spec))
    flops, _ = routed_expert_work(placement)
    return (by_shape - flat) / (3 * flops)


def test_fsdp_runs_its_experts_slower_a_flop_than_expert_parallelism():
    fsdp = get_strategy("fsdp").place(FEW, abstract_mesh("data=8"))
    ep = get_strategy("ep").place(FEW, abstract_mesh("expert=8"))
    # FSDP runs all 8 experts on a device's own 256 slots each, EP one on its 8 devices' 2,048
    assert expert_batch(fsdp) == (8, 1024 * 2 // 8)
    assert expert_batch(ep) == (1, 8 * 1024 * 2 // 8)
    slow_fsdp = _expert_slowdown("fsdp", (("data", 8),))
    slow_ep = _expert_slowdown("ep", (("expert", 8),))
    assert slow_fsdp > slow_ep > 0
    # at the table's shares: a FLOP at the flat rate stretched by 1 / share - 1, at least
    # (reading the weights may already have taken part of it)
    h = hardware("h100")
    flat = 1 / (h.peak_flops * h.matmul_fraction)
    fwd, bwd = expert_gemms(fsdp)
    share = sum(g.flops for g in fwd + bwd) / sum(
        g.flops / measured_efficiency(h, g) for g in fwd + bwd
    )
    assert slow_fsdp <= flat * (1 / share - 1) * (1 + 1e-9)


def test_a_dense_step_and_a_gpu_without_the_table_are_priced_as_before():
    c = Candidate("fsdp", (("data", 8),))
    flat = hardware("h100", matmul_by_shape=False)
    assert estimate(c, DENSE, "h100").time == estimate(c, DENSE, flat).time
    # an A100 has no table: its mixture's step is what the flat rate gives
    a100 = hardware("a100")
    assert not a100.matmul_by_shape
    off = replace(a100, matmul_by_shape=False)
    assert estimate(c, MOE, a100).time == estimate(c, MOE, off).time
    on = estimate(c, FEW, replace(a100, matmul_by_shape=True)).time
    assert on.compute_s > estimate(c, FEW, a100).time.compute_s


def test_the_sources_figures_for_the_published_grouped_kernels_are_the_tables():
    # The source holds the table's price of Qwen3-30B-A3B's up-projection, 128 experts of
    # 512 rows (K 2,048, N 1,536), beside grouped kernels measured at that shape: its forward
    # and its two gradients' matmuls (the input's, 512 x 2,048 over 1,536; the weights',
    # 2,048 x 1,536 over 512), each a share of the flat rate, in TFLOP/s
    from shardscope._src.targets.hardware import TIME_MODEL_SOURCES

    h = hardware("h100")
    flat = h.peak_flops * h.matmul_fraction / 1e12
    passes = [Gemm(512, 1536, 2048, 128), Gemm(512, 2048, 1536, 128), Gemm(2048, 1536, 512, 128)]
    rates = [measured_efficiency(h, g) * flat for g in passes]
    together = len(rates) / sum(1 / r for r in rates)  # the same FLOPs in each
    text = TIME_MODEL_SOURCES["a mixture's grouped expert matmuls at a batched matmul's rate"]
    shown = f"at about {round(together, -1):.0f} ({rates[0]:.0f} forward, {rates[1]:.0f} and "
    assert shown + f"{rates[2]:.0f} for the" in text
