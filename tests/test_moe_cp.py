"""Expert parallelism with context parallelism (``..._ep_cp``, ``..._ep_cp_ring``,
``..._ep_tp_cp``, ``..._ep_sp_cp``: Megatron-Core's EP with CP): the sequence of every
activation over ``context`` (the keys and values all-gathered, or passed around the ring), each
context shard's chunk of a sequence routed as its own group and its slots all-to-all'd over
``expert``; the dense weights' data-parallel group ``data x expert x context``, the experts'
``data x context``."""

import shardscope

shardscope.use_cpu_devices(8)

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from helpers import assert_one_device_step, bound_bytes, small_mixture  # noqa: E402
from shardscope._src.base.comm import (  # noqa: E402
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
)
from shardscope._src.base.errors import StrategyError  # noqa: E402
from shardscope._src.plan.estimates import Schedule, stored_activation_bytes_per_layer  # noqa: E402
from shardscope._src.sharding.parallelism import DataParallel, Parallelism, Tensor  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy  # noqa: E402
from shardscope._src.train.candidates import screen_all  # noqa: E402

# one layer with experts: 8 sequences of 16 tokens, 8 experts of 32 (top 2) and a shared one;
# at capacity 4 (experts / top_k) nothing is dropped, in chunks or whole
CONFIG = small_mixture(capacity_factor=4.0)
MESH = "data=2,expert=2,context=2"


def test_the_names_read_round_trip_and_route_each_context_chunk_as_its_own_group():
    for name in ("ep_cp", "zero1_ep_cp", "fsdp_ep_cp_ring", "zero1_ep_tp_cp", "dp_ep_sp_cp_ring"):
        dims = Parallelism.parse(name)
        assert (dims.expert, dims.context, dims.expert_fold) == (True, True, False)
        assert dims.name == name == get_strategy(name).name
    ring = Parallelism(
        DataParallel.ZERO1, Tensor.SP, context=True, expert=True, context_comm="ring"
    )
    assert ring.name == "zero1_ep_sp_cp_ring"
    p = get_strategy("zero1_ep_cp").place(CONFIG, abstract_mesh(MESH))
    # the batch over data and expert, the sequence over context
    assert p.activation_spec("residual") == P(("data", "expert"), "context", None)
    # the dense weights' state over data x expert x context, the experts' over data x context
    state = p.optimizer_specs()["moe_layers"]
    assert state["wqkv"] == P(None, ("data", "expert", "context"), None, None, None)
    assert state["expert_down"] == P(None, "expert", None, ("data", "context"))
    # each context shard's chunk its own group: chunk-major, 'expert' the innermost
    assert p.sequence_groups == 2
    assert p.moe_spec("tokens") == P(("context", "data", "expert"), None, None)
    assert p.moe_spec("experts") == P("expert", ("context", "data"), None, None)
    # what is still not built keeps its refusal
    with pytest.raises(
        StrategyError, match=r"hsdp_ep_cp: .* not with HSDP; choose e.g. fsdp_ep_cp,"
    ):
        get_strategy("hsdp_ep_cp")
    with pytest.raises(StrategyError, match=r"zero1_ep_fold_sp_cp: .* not built with context"):
        get_strategy("zero1_ep_fold_sp_cp")


def _moved(records, keys):
    out = {}
    for r in records:
        key = (r.kind, tuple(r.axes), r.scope)
        if key in keys:
            out[key] = out.get(key, 0) + r.count * r.payload_bytes
    return out


@pytest.mark.parametrize("name", ["dp_ep_cp", "dp_ep_cp_ring"])
def test_the_jit_step_matches_one_device_and_moves_what_the_bound_counts(name):
    prog = build_reference_program(name, CONFIG, MESH, mode="train")
    got_loss, got = prog.fn(*prog.example_args())
    assert_one_device_step(got_loss, got, CONFIG)
    # each all-to-all over 'expert' (at one data and context rank) moves its 2 devices'
    # chunks: 8 sequences x 16 tokens / (data 2 x context 2), top-2 at capacity 4, d_model
    # 64, float32, each way forward and backward; the keys and values of a device's 2
    # sequences x 16 tokens x 64 gathered over 'context' (and their gradients' scatter,
    # an all-reduce on CPU), or passed once around the ring of 2 and back (their chunks of
    # 8 tokens); a device's 4 experts' gradients (gate, up and down of 64 x 32) summed over
    # their data-parallel group, data x context
    a2a = 8 * 16 // (2 * 2) * 4 * 2 * 64 * 4
    keys = 2 * 16 * 64 * 4
    want = {
        (ALL_TO_ALL, ("expert",), "moe/dispatch"): 2 * a2a,
        (ALL_TO_ALL, ("expert",), "moe/combine"): 2 * a2a,
        (ALL_REDUCE, ("data", "context"), "moe/experts"): 4 * (64 * 2 * 32 + 32 * 64) * 4,
    }
    if name.endswith("ring"):
        want[(COLLECTIVE_PERMUTE, ("context",), "attention")] = 2 * 2 * keys // 2
    else:
        want[(ALL_GATHER, ("context",), "attention")] = 2 * keys
    assert _moved(shardscope.audit(prog).collectives, want) == want
    bound = shardscope.transformer_bound(prog.placement, "train")
    # the bound counts the gathers' gradients as reduce-scatters (the CPU compiler
    # all-reduces them), and the ring's passes again for the backward (regathered)
    assert bound_bytes(bound, want) == want
    if not name.endswith("ring"):
        scattered = [t for t in bound.terms if (t.kind, t.axes) == (REDUCE_SCATTER, ("context",))]
        assert sum(t.count * t.payload_bytes for t in scattered) == 2 * keys


def test_the_estimate_keeps_a_context_chunk_of_the_residual_stream():
    # full recomputation keeps each layer's input, the residual stream: a device's 2
    # sequences x 16 tokens x d_model 64 in float32, split over context=2
    full = Schedule(remat="full")
    kept = {
        name: stored_activation_bytes_per_layer(
            get_strategy(name).place(CONFIG, abstract_mesh(m)), full
        )
        for name, m in (("zero1_ep_cp", MESH), ("zero1_ep", "data=2,expert=2"))
    }
    assert kept == {"zero1_ep_cp": 2 * 16 * 64 * 4 // 2, "zero1_ep": 2 * 16 * 64 * 4}


def test_the_planner_plans_a_pinned_mesh_and_prices_the_chunks_all_to_alls():
    config = replace(CONFIG, layers=4, batch=16, dtype="bfloat16", capacity_factor=1.0)
    mesh = {"data": 2, "expert": 2, "context": 2}
    ranked, skipped, pairs = screen_all(
        config, 8, shardscope.hardware("h100"), ["zero1_ep_cp_ring"], microbatches=2, mesh=mesh,
        remat="none", vocab_split=False,
    )  # fmt: skip
    assert (pairs, skipped) == (1, [])
    (s,) = ranked
    moved = {(t.kind, t.axes): t.payload_bytes for t in s.bound.terms if t.scope == "moe/dispatch"}
    # a micro-batch's 16 / 2 sequences x 16 tokens over data 2 x context 2, its expert
    # group's 2 chunks, top-2 at capacity 1, d_model 64 in bfloat16
    assert moved == {(ALL_TO_ALL, ("expert",)): 16 // 2 * 16 // (2 * 2) * 2 * 64 * 2}
    assert s.time.step_s > 0 and s.memory.activations > 0
