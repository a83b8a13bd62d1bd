"""Strategies as data: role resolution, specs, bad input, and numerics against one device."""

import shardscope

shardscope.use_cpu_devices(8)

import json  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardscope._src.base.errors import ShardscopeError, StrategyError  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.sharding.numerics import compare_numerics  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import STRATEGIES, get_strategy, mesh_spec_for  # noqa: E402

TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
SHAPES = {"8": (8,), "2x4": (2, 4), "2x2x2": (2, 2, 2)}


# Per-scope numerics on the 2-D mesh, where every strategy fits; the output of every
# strategy on every mesh is checked beside its exact collectives in test_bounds.py.
# the dense decoder's strategies (those with experts: test_moe_strategies.py)
CASES = [
    pytest.param(name, "2x4", id=f"{name}-2x4")
    for name, s in STRATEGIES.items()
    if not s.expert_parallel
]
TWIN_CASES = [c for c in CASES if STRATEGIES[c.values[0]].twin]


# -- data and binding ------------------------------------------------------------------------


def test_every_strategy_is_plain_json_data():
    data = json.loads(json.dumps({k: s.to_dict() for k, s in STRATEGIES.items()}))
    assert data["tp"]["params"]["wqkv"] == [None, "model", None, None]  # by key/value head
    assert data["fsdp"]["use"]["w_up"] == [None, None]
    assert {"replicated", "dp", "fsdp", "tp", "dp_tp", "fsdp_tp", "sp", "dp_sp"} <= set(data)


def test_megatron_specs_on_a_1d_mesh():
    placement = get_strategy("tp").place(TINY, "model=8")
    specs = placement.param_specs()["layers"]
    assert specs["wqkv"] == P(None, None, "model", None, None)  # column-parallel by heads
    assert specs["wo"] == P(None, "model", None, None)  # row-parallel
    assert specs["w_up"] == P(None, None, "model")
    assert specs["w_down"] == P(None, "model", None)
    assert specs["attn_norm"] == P(None, None)
    assert placement.activation_spec("heads") == P(None, None, "model", None)


def test_data_role_takes_every_other_axis_in_mesh_order():
    placement = get_strategy("fsdp_tp").place(TINY, "pod=2,data=2,model=2")
    assert placement.axes == {"model": ("model",), "data": ("pod", "data")}
    assert placement.param_specs()["layers"]["w_up"] == P(None, ("pod", "data"), "model")
    assert placement.batch_specs()[0] == P(("pod", "data"), None, None)


def test_sequence_parallel_shards_the_residual_on_the_sequence():
    placement = get_strategy("dp_sp").place(TINY, "data=2,model=4")
    assert placement.activation_spec("residual") == P("data", "model", None)
    assert placement.activation_spec("enter") == P("data", None, None)


def test_without_constraints_there_are_no_activation_specs():
    placement = get_strategy("sp").place(TINY, "model=8", constraints=False)
    assert placement.activation_spec("residual") is None
    assert placement.batch_specs()[0] == P(None, "model", None)  # inputs keep their layout


@pytest.mark.parametrize(
    "strategy, shape, expect",
    [
        ("tp", (8,), "model=8"),
        ("dp", (8,), "data=8"),
        ("dp_tp", (2, 4), "data=2,model=4"),
        ("sp", (2, 2, 2), "pod=2,data=2,model=2"),
    ],
)
def test_mesh_spec_for(strategy, shape, expect):
    assert mesh_spec_for(strategy, shape) == expect


# -- bad input ---------------------------------------------------------------------------------


def test_heads_not_divisible_names_value_rule_and_fix():
    config = ModelConfig(d_model=48, heads=6, ff=64)
    with pytest.raises(StrategyError) as err:
        get_strategy("tp").place(config, "data=2,model=4")
    msg = str(err.value)
    assert "heads=6" in msg and "model=4" in msg and "not divisible by 4" in msg
    assert "choose heads a multiple of 4" in msg


def test_the_split_offered_for_a_dimension_is_one_a_mesh_of_the_devices_has():
    with pytest.raises(StrategyError) as err:
        get_strategy("dp").place(ModelConfig(d_model=32, heads=8, ff=64, batch=12), "data=8")
    # 12 sequences over 8: a data axis of 4 divides both (6 divides 12, but no mesh of 8)
    assert "choose batch a multiple of 8 (e.g. batch=8)" in str(err.value)
    assert "a mesh whose data axes multiply to a divisor of 12 (e.g. 4)" in str(err.value)


def test_ff_not_divisible():
    with pytest.raises(StrategyError, match=r"ff=60 .* not divisible by 8"):
        get_strategy("tp").place(ModelConfig(d_model=32, heads=8, ff=60), "model=8")


def test_sequence_not_divisible_for_sequence_parallel():
    with pytest.raises(StrategyError, match=r"seq=12 .* not divisible by 8"):
        get_strategy("sp").place(ModelConfig(d_model=32, heads=8, ff=64, seq=12), "model=8")


def test_batch_not_divisible_for_data_parallel():
    with pytest.raises(StrategyError, match=r"batch=4 .* data=8"):
        get_strategy("dp").place(ModelConfig(d_model=32, heads=8, ff=64, batch=4), "data=8")


def test_missing_model_axis():
    with pytest.raises(StrategyError, match=r"axis named 'model', but mesh 'data=8' has none"):
        get_strategy("tp").place(TINY, "data=8")


def test_missing_data_axis():
    with pytest.raises(StrategyError, match=r"needs a mesh axis for role 'data'"):
        get_strategy("dp_tp").place(TINY, "model=8")


def test_role_bound_to_an_axis_the_mesh_lacks():
    with pytest.raises(StrategyError, match=r"axis 'mp', which mesh 'data=2,model=4'"):
        get_strategy("tp").place(TINY, "data=2,model=4", axes={"model": ("mp",)})


def test_unknown_strategy_lists_the_presets_and_the_naming_rule():
    with pytest.raises(ShardscopeError, match=r"unknown strategy 'megatron'; choose a preset") as e:
        get_strategy("megatron")
    assert "fsdp_sp" in str(e.value) and "zero1_sp_cp_ring" in str(e.value)
    # the presets, not every composition: a line a reader takes in
    assert "zero2_tp_cp_ring" not in str(e.value) and len(str(e.value)) < 600


def test_shard_map_only_for_strategies_with_a_twin():
    with pytest.raises(StrategyError, match=r"'fsdp' has no shard_map version"):
        build_reference_program("fsdp", TINY, "data=8", impl="shard_map")


# -- numerics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, mesh_id", CASES)
def test_jit_forward_matches_one_device(name, mesh_id):
    report = compare_numerics(name, TINY, mesh_spec_for(name, SHAPES[mesh_id]))
    assert set(report.errors) == {"attention", "mlp", "output"}
    assert report.ok, report.errors


@pytest.mark.parametrize("name, mesh_id", TWIN_CASES)
def test_shard_map_forward_matches_one_device(name, mesh_id):
    report = compare_numerics(name, TINY, mesh_spec_for(name, SHAPES[mesh_id]), impl="shard_map")
    assert report.ok, report.errors


# Train steps compile slowly; these two cover data-parallel gradient sums, FSDP gathers and
# scatters, Megatron's backward all-reduces, and the sequence-parallel twin's gathers.
@pytest.mark.parametrize("name, impl", [("fsdp_tp", "jit"), ("dp_sp", "shard_map")])
def test_train_step_matches_one_device(name, impl):
    report = compare_numerics(name, TINY, "data=2,model=4", impl=impl, mode="train")
    assert set(report.errors) == {"loss", "attention", "mlp"}
    assert report.ok, report.errors


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_tolerance_is_per_dtype(dtype):
    config = ModelConfig(**{**TINY.to_dict(), "dtype": dtype})
    report = compare_numerics("tp", config, "model=8")
    # Four rounding units of the storage type (ml_dtypes' finfo, not shardscope's table).
    assert report.tolerance == 4 * float(jnp.finfo(dtype).eps)
    assert report.ok, report.errors
    # Nonzero: the sharded sums really are ordered differently from the reference's.
    assert report.worst > 0


def test_vocab_model_under_sequence_parallel_shard_map():
    config = ModelConfig(**{**TINY.to_dict(), "vocab": 32})
    report = compare_numerics("sp", config, "model=8", impl="shard_map")
    assert report.ok, report.errors
