"""MoE parallel folding (``..._ep_fold_sp``, Megatron-LM's ``--expert-tensor-parallel-size 1``):
the attention tensor- and sequence-parallel over ``model``, the experts whole over ``expert``
x ``model``, the same devices; each device's slice of the sequence routed as its own group,
the dispatch and combine all-to-alls over both axes, nothing of the experts summed over
``model``."""

from dataclasses import replace

import jax
import pytest
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import bound_bytes, max_error, one_device_step, small_mixture, twin_routing_halves
from shardscope._src.base.comm import ALL_TO_ALL
from shardscope._src.base.errors import StrategyError
from shardscope._src.plan.estimates import elements_per_device, estimate_memory
from shardscope._src.sharding.programs import UPDATE_STEP, build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.candidates import screen_all

CONFIG = small_mixture()
MESH = "data=2,expert=2,model=2"


def test_folding_is_named_and_refused_without_its_parts():
    s = get_strategy("zero1_ep_fold_sp")
    assert (s.expert_fold, s.sequence_parallel) == (True, True)
    assert s.roles == ("data", "expert", "model")
    # the old names keep their meaning, and their JSON has no new key
    assert not get_strategy("zero1_ep_tp").expert_fold
    assert "expert_fold" not in get_strategy("ep_tp").to_dict()
    assert s.to_dict()["expert_fold"] is True
    with pytest.raises(StrategyError, match=r"zero1_ep_fold_tp: .*sequence .*zero1_ep_fold_sp"):
        get_strategy("zero1_ep_fold_tp")
    # unfolded under sp is its own strategy (ETP = TP: test_moe_sp.py)
    assert not get_strategy("zero1_ep_sp").expert_fold
    # an expert group (expert x model) that does not divide the experts
    with pytest.raises(StrategyError, match=r"experts=6 .*expert=2, model=2 \(4 ways\)"):
        s.place(replace(CONFIG, experts=6), abstract_mesh(MESH))


def test_each_expert_is_whole_on_one_device_of_expert_x_model():
    p = get_strategy("zero1_ep_fold_sp").place(CONFIG, abstract_mesh(MESH))
    moe = p.param_specs()["moe_layers"]
    assert moe["expert_gate_up"] == P(None, ("expert", "model"), None, None, None)
    assert moe["wqkv"] == P(None, None, "model", None, None)  # the attention's Megatron split
    opt = p.optimizer_specs()["moe_layers"]
    # the distributed optimizer: the experts' state over their replicas (EDP, 'data'), the
    # dense weights' over the attention's data ranks (data x expert)
    assert opt["expert_gate_up"] == P(None, ("expert", "model"), "data", None, None)
    assert opt["wqkv"] == P(None, ("data", "expert"), "model", None, None)
    # 8 experts of 64 x 2 x 32 + 32 x 64 over 4 devices, their state over 2 more
    experts = 8 * (64 * 2 * 32 + 32 * 64)
    assert elements_per_device(p, p.strategy.param_rules(), "expert_") == experts // 4
    assert elements_per_device(p, p.strategy.optimizer_rules(), "expert_") == experts // 8
    assert (
        estimate_memory(p).params
        == estimate_memory(get_strategy("zero1_ep_tp").place(CONFIG, abstract_mesh(MESH))).params
    )  # the same bytes a device: 1/4 of the experts, whole or in quarters


def test_the_twin_routes_each_slice_and_all_to_alls_over_expert_x_model():
    # at capacity 1 tokens are dropped, per slice of a sequence: one device routing each
    # sequence's halves as two groups computes the same step
    prog = twin_routing_halves("dp_ep_fold_sp", CONFIG, MESH)
    moved = {}
    for c in shardscope.audit(prog).collectives:
        if c.kind in ("all-to-all", "all-gather", "reduce-scatter") or c.scope == "moe/experts":
            key = (c.kind, c.axes, c.scope)
            moved[key] = moved.get(key, 0) + c.count * c.payload_bytes
    # a replica (data shard) sends its 4 sequences x 16 tokens x top-2 x d_model 64 in
    # float32 each way, forward and backward; the sequence-parallel gathers and scatters of
    # a device's 2 sequences (the batch over data x expert) x 16 x 64 floats, forward and
    # backward, of the attention and of the shared expert; the experts' gradients
    # (2 x 64 x 32 + 32 x 64 an expert, 2 a device) summed over 'data'
    a2a, seq = 4 * 16 * 2 * 64 * 4, 2 * 16 * 64 * 4
    want_moved = {
        ("all-to-all", ("expert", "model"), "moe/dispatch"): 2 * a2a,
        ("all-to-all", ("expert", "model"), "moe/combine"): 2 * a2a,
        **{(k, ("model",), s): 2 * seq for k in ("all-gather", "reduce-scatter")
           for s in ("attention", "moe/shared")},
        ("all-reduce", ("data",), "moe/experts"): 2 * (2 * 64 * 32 + 32 * 64) * 4,
    }  # fmt: skip
    assert moved == want_moved
    # the bound says the same
    bound = shardscope.transformer_bound(prog.placement, "train")
    assert bound_bytes(bound, want_moved) == want_moved
    assert not [t for t in bound.terms if t.scope == "moe/experts" and "model" in t.axes]


def test_the_jit_step_with_the_distributed_optimizer_updates_as_one_device():
    config = replace(CONFIG, capacity_factor=8 / 2)  # nothing dropped
    _, want_grads = one_device_step(config)
    prog = build_reference_program("zero1_ep_fold_sp", config, MESH, mode="train", microbatches=2)
    params = prog.example_args()[0]
    _, new = prog.fn(*prog.example_args())
    want = jax.tree.map(lambda p, g: p - UPDATE_STEP * g, params, want_grads)
    assert max_error(new, want) < 1e-6
    audit = shardscope.audit(prog)
    a2a = {c.axes for c in audit.collectives if c.scope in ("moe/dispatch", "moe/combine")
           and c.kind == ALL_TO_ALL}  # fmt: skip
    assert a2a == {("expert", "model")}
    # each expert whole: nothing of theirs reduced over 'model'
    assert not [c for c in audit.collectives if c.scope == "moe/experts" and "model" in c.axes]


def test_the_planner_plans_a_pinned_fold_with_stages_and_virtual_stages():
    config = replace(CONFIG, layers=8, batch=16, dtype="bfloat16")
    for data in (1, 2):  # EDP 1 (the experts over every device of a stage) and 2
        mesh = {"stage": 2, "data": data, "expert": 2, "model": 2}
        ranked, skipped, pairs = screen_all(
            config, 8 * data, shardscope.hardware("h100"), ["zero1_ep_fold_sp"],
            microbatches=4, virtual_stages=2, mesh=mesh, remat="none", vocab_split=False,
        )  # fmt: skip
        assert (pairs, skipped) == (1, [])
        (s,) = ranked
        assert (s.candidate.strategy, s.candidate.virtual_stages) == ("zero1_ep_fold_sp", 2)
        # the step's all-to-alls over the fold's group of 4
        assert {t.axes for t in s.bound.terms if t.kind == ALL_TO_ALL} == {("expert", "model")}
