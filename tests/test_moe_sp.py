"""Expert parallelism with tensor-and-sequence parallelism unfolded (``..._ep_sp``, Megatron-LM's
default expert tensor parallelism, ETP = TP): the attention tensor- and sequence-parallel over
``model``, the experts over ``expert`` with their hidden over ``model``; each device of
``model`` routes its own slice of the sequence, its slots go over ``expert`` and are
all-gathered over ``model`` for the experts, whose partial outputs are reduce-scattered back
before the combine (Megatron-Core's ``MoEAlltoAllTokenDispatcher`` with tensor parallelism)."""

from dataclasses import replace

import pytest
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import assert_one_device_step, bound_bytes, small_mixture, twin_routing_halves
from shardscope._src.base.comm import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER
from shardscope._src.base.errors import StrategyError
from shardscope._src.plan.estimates import Schedule, stored_activation_bytes_per_layer
from shardscope._src.sharding.parallelism import DataParallel, Parallelism, Tensor
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.candidates import screen_all

CONFIG = small_mixture()
MESH = "data=2,expert=2,model=2"


def test_the_names_read_round_trip_and_place_the_experts_as_ep_tp():
    for name in ("ep_sp", "dp_ep_sp", "zero1_ep_sp", "zero2_ep_sp", "fsdp_ep_sp"):
        dims = Parallelism.parse(name)
        assert (dims.expert, dims.tensor, dims.expert_fold) == (True, Tensor.SP, False)
        assert dims.name == name == get_strategy(name).name
    assert Parallelism(DataParallel.ZERO1, Tensor.SP, expert=True).name == "zero1_ep_sp"
    p = get_strategy("zero1_ep_sp").place(CONFIG, abstract_mesh(MESH))
    tp = get_strategy("zero1_ep_tp").place(CONFIG, abstract_mesh(MESH))
    assert p.param_specs() == tp.param_specs()
    assert p.optimizer_specs() == tp.optimizer_specs()
    assert p.param_specs()["moe_layers"]["expert_gate_up"] == P(None, "expert", None, None, "model")
    # the residual stream over the sequence between blocks, each model rank's slice routed
    assert p.activation_spec("residual") == P(("data", "expert"), "model", None)
    assert (p.sequence_groups, tp.sequence_groups) == (2, 1)
    # what is still not built keeps its refusal
    with pytest.raises(StrategyError, match=r"hsdp_ep_sp_cp: .* HSDP; choose e.g. fsdp_ep_sp_cp,"):
        get_strategy("hsdp_ep_sp_cp")


def test_the_twin_gathers_each_slices_slots_over_model_as_the_bound_counts():
    # at capacity 1 tokens are dropped, per slice of a sequence: one device routing each
    # sequence's halves as two groups computes the same step
    prog = twin_routing_halves("dp_ep_sp", CONFIG, MESH)
    moved = {}
    for c in shardscope.audit(prog).collectives:
        if c.kind in (ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER) or c.scope == "moe/experts":
            key = (c.kind, c.axes, c.scope)
            moved[key] = moved.get(key, 0) + c.count * c.payload_bytes
    # an all-to-all over 'expert' (at one data and model rank) moves its devices' slices:
    # 8 sequences x 16 tokens / (data 2 x model 2), top-2, d_model 64, float32, each way
    # forward and backward; a device's slots gathered over 'model' (its 8 / (2 x 2)
    # sequences' 16 tokens x top-2 at capacity 1) in the dispatch and their partial sums
    # scattered in the combine, each the other's backward; the attention's and the shared
    # expert's sequence-parallel gathers and scatters of those 2 x 16 tokens; the gradients
    # of a device's 4 experts (each's hidden 32 split over 'model') summed over 'data'
    a2a = 8 * 16 // (2 * 2) * 2 * 64 * 4
    slots = 8 // (2 * 2) * 16 * 2 * 64 * 4
    seq = 8 // (2 * 2) * 16 * 64 * 4
    want_moved = {
        **{(ALL_TO_ALL, ("expert",), s): 2 * a2a for s in ("moe/dispatch", "moe/combine")},
        **{(k, ("model",), s): slots for k in (ALL_GATHER, REDUCE_SCATTER)
           for s in ("moe/dispatch", "moe/combine")},
        **{(k, ("model",), s): 2 * seq for k in (ALL_GATHER, REDUCE_SCATTER)
           for s in ("attention", "moe/shared")},
        ("all-reduce", ("data",), "moe/experts"): 4 * (64 * 2 * 16 + 16 * 64) * 4,
    }  # fmt: skip
    assert moved == want_moved
    bound = shardscope.transformer_bound(prog.placement, "train")
    assert bound_bytes(bound, want_moved) == want_moved
    # no all-reduce of the experts' outputs over 'model': scattered instead
    assert not [t for t in bound.terms if t.scope.startswith("moe/") and t.kind == "all-reduce"
                and "model" in t.axes]  # fmt: skip


def test_the_jit_step_matches_one_device_and_moves_the_slices_as_megatron_orders_them():
    config = replace(CONFIG, capacity_factor=8 / 2)  # nothing dropped, in slices or whole
    prog = build_reference_program("dp_ep_sp", config, MESH, mode="train")
    got_loss, got = prog.fn(*prog.example_args())
    assert_one_device_step(got_loss, got, config)
    moved = {}
    for c in shardscope.audit(prog).collectives:
        if c.scope in ("moe/dispatch", "moe/combine") and c.kind in (ALL_TO_ALL, ALL_GATHER):
            key = (c.kind, c.axes, c.scope, c.phase)
            moved[key] = moved.get(key, 0) + c.count * c.payload_bytes
    # the forward's dispatch: the all-to-all over 'expert' of each slice (32 tokens of each
    # group of 'expert', 4 x top-2 slots of 64 floats each), then the all-gather over
    # 'model' of a device's 2 sequences' slots; the backward's of the combine the same
    a2a = 8 * 16 // (2 * 2) * 4 * 2 * 64 * 4
    gathered = 8 // (2 * 2) * 16 * 4 * 2 * 64 * 4
    assert moved == {
        **{(ALL_TO_ALL, ("expert",), s, p): a2a for s in ("moe/dispatch", "moe/combine")
           for p in ("forward", "backward")},
        (ALL_GATHER, ("model",), "moe/dispatch", "forward"): gathered,
        (ALL_GATHER, ("model",), "moe/combine", "backward"): gathered,
    }  # fmt: skip


def test_the_estimate_keeps_a_slice_of_the_residual_stream():
    # full recomputation keeps each layer's input, the residual stream: a device's 2
    # sequences x 16 tokens x d_model 64 in float32, split over model=2 under sp alone
    full = Schedule(remat="full")
    kept = {
        name: stored_activation_bytes_per_layer(
            get_strategy(name).place(CONFIG, abstract_mesh(MESH)), full
        )
        for name in ("zero1_ep_sp", "zero1_ep_tp")
    }
    assert kept == {"zero1_ep_sp": 2 * 16 * 64 * 4 // 2, "zero1_ep_tp": 2 * 16 * 64 * 4}


def test_the_planner_plans_a_pinned_mesh_and_prices_the_gathers_over_model():
    config = replace(CONFIG, layers=4, batch=16, dtype="bfloat16")
    mesh = {"data": 2, "expert": 2, "model": 2}
    ranked, skipped, pairs = screen_all(
        config, 8, shardscope.hardware("h100"), ["zero1_ep_sp"], microbatches=2, mesh=mesh,
        remat="none", vocab_split=False,
    )  # fmt: skip
    assert (pairs, skipped) == (1, [])
    (s,) = ranked
    kinds = {(t.kind, t.axes, t.scope) for t in s.bound.terms if t.scope.startswith("moe/")}
    assert {(ALL_TO_ALL, ("expert",), "moe/dispatch"), (ALL_GATHER, ("model",), "moe/dispatch"),
            (REDUCE_SCATTER, ("model",), "moe/combine")} <= kinds  # fmt: skip
