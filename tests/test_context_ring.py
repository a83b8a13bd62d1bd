"""Context parallelism's ring form (``..._cp_ring``): its names, its program (the keys and
values passed around the context ring) against one device and its own bound, its price, and
its errors."""

import shardscope

shardscope.use_cpu_devices(8)

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from helpers import assert_one_device_step  # noqa: E402
from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.comm import ALL_GATHER, COLLECTIVE_PERMUTE  # noqa: E402
from shardscope._src.base.errors import StrategyError  # noqa: E402
from shardscope._src.cost.compute import overlap_seconds  # noqa: E402
from shardscope._src.cost.links import group_bandwidth, held_share  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.plan.estimates import Schedule, estimate_memory  # noqa: E402
from shardscope._src.sharding.numerics import TOLERANCES, relative_error  # noqa: E402
from shardscope._src.sharding.parallelism import Parallelism  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy  # noqa: E402
from shardscope._src.targets.hardware import hardware  # noqa: E402
from shardscope._src.train.timing import (  # noqa: E402
    CONTEXT_RING,
    CRITICAL,
    classify,
    comm_items,
    step_bound,
    step_time,
    step_work,
)

# d_model 32, 8 heads of 4 (kv_dim 32), ff 64, f32; 8 sequences of 8 tokens.
TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
MESH = "data=2,context=4"
CTX = ("context",)
# One data shard's keys (or values) of the whole sequence: 8/2 sequences x 8 tokens x 32 x 4 B;
# a ring passes one context shard's chunk of them, a quarter.
KEYS = 4 * 8 * 32 * 4
CHUNK = KEYS // 4


def _permutes(records):
    """(executions, payload bytes) of the collective-permutes over context in an audit."""
    hits = [r for r in records if r.kind == COLLECTIVE_PERMUTE and tuple(r.axes) == CTX]
    return sum(r.count for r in hits), sum(r.count * r.payload_bytes for r in hits)


# -- names ----------------------------------------------------------------------------------


def test_the_ring_is_a_part_after_cp_and_the_old_names_and_json_stay_the_all_gather():
    ring = Parallelism.parse("zero1_sp_cp_ring")
    assert (ring.context, ring.context_comm) == (True, "ring")
    assert ring.name == "zero1_sp_cp_ring"
    assert Parallelism.parse("zero1_sp_cp").context_comm == "all_gather"
    s = get_strategy("dp_cp_ring")
    assert s.context_ring and not get_strategy("dp_cp").context_ring
    # the same placement as the all-gather form; only the exchange differs
    assert s.activations == get_strategy("dp_cp").activations
    assert "context_comm" not in get_strategy("dp_cp").to_dict()
    assert s.to_dict()["context_comm"] == "ring"
    with pytest.raises(StrategyError, match=r"'ring' does not read there"):
        Parallelism.parse("dp_ring")
    with pytest.raises(StrategyError, match=r"context_comm='ring' .* give context=True"):
        Parallelism(context_comm="ring")
    with pytest.raises(StrategyError, match=r"hsdp_cp_ring: .* under HSDP; choose hsdp_cp"):
        get_strategy("hsdp_cp_ring")


# -- the program ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_batched():
    # two micro-batches, each context shard of each data shard mapped by one shard_map, the
    # keys and values passed around the ring again for the backward (regather)
    return build_reference_program(
        "dp_cp_ring", TINY, MESH, mode="train", microbatches=2, regather=True
    )


def test_the_forward_passes_chunks_around_the_ring_and_gathers_nothing():
    program = build_reference_program("dp_cp_ring", TINY, MESH)
    records = audit(program.lower()).collectives
    # 2 layers x (keys, values) x 3 steps round 4 shards, one shard's chunk each
    assert _permutes(records) == (2 * 2 * 3, 2 * 2 * 3 * CHUNK)
    assert not [r for r in records if r.kind == ALL_GATHER]
    from shardscope._src.sharding.numerics import reference_outputs

    args = program.example_args()
    expected, _ = reference_outputs(TINY, args, "forward")
    assert relative_error(program.compile()(*args), expected) <= TOLERANCES[TINY.dtype]


def test_the_micro_batched_ring_computes_what_one_device_computes(micro_batched):
    loss, grads = micro_batched.fn(*micro_batched.example_args())
    assert_one_device_step(loss, grads, TINY)


def test_the_train_steps_permutes_are_the_step_bounds(micro_batched):
    records = audit(micro_batched.lower()).collectives
    # 2 micro-batches x 2 layers x (keys, values) x 3 steps, three times: the forward, again
    # for the backward, and the gradients back; a micro-batch's chunk is half a data shard's
    chunk = CHUNK // 2
    assert _permutes(records) == (2 * 2 * 2 * 3 * 3, 2 * 2 * 2 * 3 * 3 * chunk)
    bound = step_bound(micro_batched.placement, Schedule(microbatches=2), "train")
    ring = [t for t in bound.terms if t.kind == COLLECTIVE_PERMUTE]
    assert (sum(t.totals.count for t in ring), sum(t.totals.payload_bytes for t in ring)) == (
        _permutes(records)
    )


# -- the price ------------------------------------------------------------------------------

BIG = ModelConfig(
    d_model=4096, heads=32, kv_heads=8, ff=14336, layers=4, vocab=32000, batch=16, seq=8192,
    dtype="bfloat16", attention="blocked",
)  # fmt: skip


def test_the_rings_transfers_hide_behind_three_quarters_of_the_attention():
    h100 = hardware("h100")
    mesh = abstract_mesh("data=4,context=4")
    placement = get_strategy("zero1_cp_ring").place(BIG, mesh)
    assert classify(COLLECTIVE_PERMUTE, CTX, placement) == CONTEXT_RING
    schedule = Schedule(microbatches=4)
    terms = step_bound(placement, schedule, "train").terms
    items = comm_items(h100, placement, terms)
    ring = [i for i in items if i.cls == CONTEXT_RING]
    # per micro-batch of one sequence a data shard: 4 layers x (keys, values) x 3 steps x
    # (forward, again, gradients), each one shard's chunk: 8192/4 tokens x 8 heads x 128 x 2 B
    chunk = 8192 // 4 * 8 * 128 * 2
    steps = 4 * 4 * 2 * 3 * 3
    bandwidth = group_bandwidth(h100, {"data": 4, "context": 4}, CTX)
    transfers = steps * (h100.latency_s + chunk / bandwidth)
    assert sum(i.seconds for i in ring) == pytest.approx(transfers, rel=1e-12)
    work = step_work(placement, schedule, BIG, 16, h100, flash_attention=True)
    # the attention core of a micro-batch on one device: its queries (2048 tokens) over the
    # whole sequence, QK^T and PV, 2 FLOPs a multiply-add, counted non-causal, 4 layers
    core = 4 * 2 * 2 * 2048 * 8192 * 32 * 128
    assert work.ring_shards == 4 and work.ring_core_flops == core
    others = [i for i in items if i.cls != CONTEXT_RING]
    without = step_time(h100, work, others).step_s
    with_ring = step_time(h100, work, items).step_s
    # no fused rates: the core at the matmul rate, forward and the backward's two matmuls
    attention = 3 * core / (h100.peak_flops * h100.matmul_fraction)
    held = transfers * held_share(h100, {"data": 4, "context": 4}, CTX)
    added = overlap_seconds(3 / 4 * attention, transfers / 4, held / 4)
    assert with_ring - without == pytest.approx(4 * added, rel=1e-9)
    assert not [i for i in items if i.cls == CRITICAL]


def test_the_ring_holds_two_chunks_where_the_gather_holds_the_sequence():
    mesh = abstract_mesh("data=4,context=4")
    ring = estimate_memory(get_strategy("fsdp_cp_ring").place(BIG, mesh)).gathered_kv
    whole = estimate_memory(get_strategy("fsdp_cp").place(BIG, mesh)).gathered_kv
    assert whole == 2 * 8192 * 8 * 128 * 4 * 2
    assert ring == 2 * 2 * 8192 // 4 * 8 * 128 * 4 * 2


# -- bad input ------------------------------------------------------------------------------


def test_a_ring_of_one_shard_names_the_axis_and_the_fix():
    with pytest.raises(StrategyError, match=r"'dp_cp_ring' .* context=1, a ring of one shard"):
        get_strategy("dp_cp_ring").place(TINY, abstract_mesh("data=8,context=1"))


def test_a_ring_over_a_sequence_that_does_not_divide_names_the_value_and_the_fix():
    config = replace(TINY, seq=10)
    with pytest.raises(StrategyError, match=r"seq=10 .* context=4 \(4 ways\).*seq=8"):
        get_strategy("dp_cp_ring").place(config, abstract_mesh("data=2,context=4"))
