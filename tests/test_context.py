"""Context parallelism: the sequence of every activation over a ``context`` mesh axis, the keys
and values gathered per layer; its specs, its bound against the compiled program, its memory,
its place in the planner, and its errors."""

import shardscope

shardscope.use_cpu_devices(8)

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from helpers import assert_one_device_step, assert_usage_error  # noqa: E402
from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER  # noqa: E402
from shardscope._src.base.errors import StrategyError  # noqa: E402
from shardscope._src.bounds.transformer import transformer_bound  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.plan.estimates import (  # noqa: E402
    Schedule,
    activation_bytes_per_layer,
    estimate_memory,
    logits_bytes,
)
from shardscope._src.plan.request import DEFAULT_STRATEGIES  # noqa: E402
from shardscope._src.sharding.numerics import (  # noqa: E402
    TOLERANCES,
    compare_numerics,
    reference_outputs,
    relative_error,
)
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy  # noqa: E402
from shardscope._src.train.candidates import candidates, pinned_mesh  # noqa: E402
from shardscope._src.train.timing import (  # noqa: E402
    CRITICAL,
    PER_MICROBATCH_FWD_BWD,
    PER_STEP_BWD,
    classify,
    step_bound,
)

# d_model 32, 8 heads of 4 (kv_dim 32), ff 64, f32; 8 sequences of 8 tokens.
TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
MESH = "data=2,context=4"
CP = ["dp_cp", "fsdp_cp"]
CTX, BOTH, DATA = ("context",), ("data", "context"), ("data",)
# One data shard's keys (or values) of the whole sequence: 8/2 sequences x 8 tokens x 32 x 4 B.
KEYS = 4 * 8 * 32 * 4
# One layer's weights: two norm gains, wqkv 32 x 96, wo 32 x 32, w_up and w_down 32 x 64; f32.
LAYER = (32 + 32 * 96 + 32 * 32 + 32 + 2 * 32 * 64) * 4


def _by_axes_kind(records):
    """(axes, kind) -> (executions, payload bytes, bytes sent per device), over ``records``
    (an audit's collectives or a bound's terms)."""
    out = {}
    for r in records:
        key = (tuple(r.axes), r.kind)
        count, payload, sent = out.get(key, (0, 0, 0))
        if hasattr(r, "totals"):  # a bound's term: its totals over every execution
            t = r.totals
            out[key] = (count + t.count, payload + t.payload_bytes, sent + t.traffic_bytes)
        else:
            out[key] = (
                count + r.count,
                payload + r.count * r.payload_bytes,
                sent + r.count * r.traffic_bytes,
            )
    return out


def _audited(program):
    return _by_axes_kind(audit(program.lower()).collectives)


def _bounded(program, mode):
    return _by_axes_kind(transformer_bound(program.placement, mode).terms)


# -- specs ---------------------------------------------------------------------------------------


def test_the_sequence_is_sharded_over_context_and_the_keys_are_whole():
    placement = get_strategy("fsdp_cp").place(TINY, MESH)
    assert placement.axes == {"data": ("data",), "context": ("context",)}
    assert placement.activation_spec("residual") == P("data", "context", None)
    assert placement.activation_spec("heads") == P("data", "context", None, None)
    assert placement.activation_spec("keys") == P("data", None, None, None)
    # FSDP over both axes: each weight in 8 shards.
    assert placement.param_specs()["layers"]["w_up"] == P(None, ("data", "context"), None)
    assert get_strategy("dp_cp").place(TINY, MESH).param_specs()["layers"]["w_up"] == P(
        None, None, None
    )


def test_the_data_role_leaves_the_context_axis_alone():
    placement = get_strategy("dp_cp").place(TINY, "pod=2,data=2,context=2")
    assert placement.axes == {"data": ("pod", "data"), "context": ("context",)}
    assert placement.batch_specs()[0] == P(("pod", "data"), "context", None)


# -- the bound against the compiled program --------------------------------------------------------


@pytest.mark.parametrize("attention", ["dense", "blocked"])
@pytest.mark.parametrize("name", CP)
def test_forward_collectives_equal_the_bound(name, attention):
    config = replace(TINY, attention=attention, attention_block=2)
    program = build_reference_program(name, config, MESH)
    actual = _audited(program)
    assert actual == _bounded(program, "forward")
    # Two layers, each gathering its keys and its values over context=4 (3/4 sent).
    assert actual[(CTX, ALL_GATHER)] == (2 * 2, 2 * 2 * KEYS, 2 * 2 * 3 * KEYS // 4)
    if name == "fsdp_cp":
        # Every layer weight gathered over all 8 devices (7/8 of it sent), once.
        assert actual[(BOTH, ALL_GATHER)][1:] == (2 * LAYER, 7 * 2 * LAYER // 8)
    else:
        assert set(actual) == {(CTX, ALL_GATHER)}
    args = program.example_args()
    expected, _ = reference_outputs(config, args, "forward")
    assert relative_error(program.compile()(*args), expected) <= TOLERANCES[config.dtype]


@pytest.mark.parametrize("name", CP)
def test_train_bound_sums_gradients_and_the_loss_over_both_token_axes(name):
    bound = _bounded(build_reference_program(name, TINY, MESH, mode="train"), "train")
    # Keys and values: gathered forward, their gradients reduce-scattered backward.
    assert bound[(CTX, ALL_GATHER)] == (4, 4 * KEYS, 4 * 3 * KEYS // 4)
    assert bound[(CTX, REDUCE_SCATTER)] == (4, 4 * KEYS, 4 * 3 * KEYS // 4)
    loss = 2 * 7 * 4 // 8  # the f32 loss all-reduced over all 8 devices
    if name == "dp_cp":
        # Six weights a layer, each gradient one all-reduce over data and context together.
        assert bound[(BOTH, ALL_REDUCE)] == (
            6 * 2 + 1,
            2 * LAYER + 4,
            2 * 7 * 2 * LAYER // 8 + loss,
        )
        assert set(bound) == {(CTX, ALL_GATHER), (CTX, REDUCE_SCATTER), (BOTH, ALL_REDUCE)}
    else:
        assert bound[(BOTH, ALL_GATHER)][1] == 2 * LAYER
        assert bound[(BOTH, REDUCE_SCATTER)][1] == 2 * LAYER
        assert bound[(BOTH, ALL_REDUCE)] == (1, 4, loss)


@pytest.mark.parametrize("attention", ["dense", "blocked"])
@pytest.mark.parametrize("name", CP)
def test_train_collectives_on_xla_cpu(name, attention):
    """XLA:CPU gathers exactly what the bound gathers. It forms no reduce-scatter: the
    gradients of the keys and values are all-reduced over context (the same payload, twice the
    bytes), and it reduces the weights' gradients and the loss one axis at a time, over
    context and then over data, where the bound has one reduction over both."""
    config = replace(TINY, attention=attention, attention_block=2)
    program = build_reference_program(name, config, MESH, mode="train")
    actual, bound = _audited(program), _bounded(program, "train")
    gathers = {k for k in bound if k[1] == ALL_GATHER}
    assert {k: actual[k] for k in gathers} == {k: bound[k] for k in gathers}
    assert set(actual) == gathers | {(CTX, ALL_REDUCE), (DATA, ALL_REDUCE)}
    # Over context: the keys' and values' gradients, every layer's weight gradients, the loss.
    assert actual[(CTX, ALL_REDUCE)][1] == 2 * 2 * KEYS + 2 * LAYER + 4
    assert actual[(DATA, ALL_REDUCE)][1] == 2 * LAYER + 4
    assert bound[(CTX, REDUCE_SCATTER)][1] == 2 * 2 * KEYS


@pytest.mark.parametrize("name", CP)
def test_the_planners_train_step_gathers_the_keys_and_values_again_for_the_backward(name):
    # As FSDP's weights: each layer's whole-sequence keys and values are not kept for the
    # backward, which gathers them again; the step's bound counts the second gathers.
    config = replace(TINY, attention="blocked", attention_block=2)
    program = build_reference_program(name, config, MESH, mode="train", regather=True)
    actual = _audited(program)
    bound = _by_axes_kind(step_bound(program.placement, Schedule(), "train").terms)
    # 2 layers x (keys, values) x (forward, backward), one data shard's whole sequence each.
    assert actual[(CTX, ALL_GATHER)][:2] == (2 * 2 * 2, 2 * 2 * 2 * KEYS)
    assert bound[(CTX, ALL_GATHER)] == actual[(CTX, ALL_GATHER)]


@pytest.mark.parametrize("name", CP)
def test_train_step_computes_what_one_device_computes(name):
    # Blocked attention over key blocks of 2: the causal mask uses global positions, so a
    # context shard's queries see exactly the keys before them.
    config = replace(TINY, attention="blocked", attention_block=2)
    assert compare_numerics(name, config, MESH, mode="train").ok


# -- micro-batches --------------------------------------------------------------------------------

M = 4  # micro-batches: TINY's 8 sequences over data=2, one sequence a micro-batch


@pytest.mark.parametrize("name", ["dp_cp", "zero1_cp"])
def test_micro_batches_sum_the_weight_gradients_over_context_once(name):
    # Each context shard adds up the partial gradients of its part of the sequences over the
    # micro-batches; they cross context once a step (as Megatron-LM's distributed optimizer
    # reduces them over data x context), where a micro-batch's keys and values do every time.
    program = build_reference_program(name, TINY, MESH, mode="train", microbatches=M)
    actual = _audited(program)
    # XLA:CPU all-reduces over context each micro-batch's keys' and values' gradients (2
    # layers, a quarter of a data shard's sequences each), and the weights' and the f32 loss
    # (each shard's added up over the micro-batches too) once.
    assert actual[(CTX, ALL_REDUCE)][1] == M * 2 * 2 * (KEYS // M) + 2 * LAYER + 4
    assert actual[(DATA, ALL_REDUCE)][1] == 2 * LAYER + 4


@pytest.mark.parametrize(("attention", "regather"), [("dense", False), ("blocked", True)])
def test_micro_batched_context_shards_compute_what_one_device_computes(attention, regather):
    # Each context shard's queries are masked at their positions in the whole sequence, and
    # the keys and values it gathers (again for the backward: regather) pass their gradients
    # back to the shards they came from.
    config = replace(TINY, attention=attention, attention_block=2)
    program = build_reference_program(
        "dp_cp", config, MESH, mode="train", microbatches=M, regather=regather
    )
    loss, grads = program.fn(*program.example_args())
    assert_one_device_step(loss, grads, config)


def test_the_step_bound_reduces_over_context_once_where_the_program_does():
    def scattered(name):
        placement = get_strategy(name).place(TINY, MESH)
        terms = step_bound(placement, Schedule(microbatches=M), "train").terms
        return _by_axes_kind(terms)[(BOTH, REDUCE_SCATTER)][:2]

    # ZeRO-1: six weights a layer (two layers), each gradient replicated over both axes and
    # reduce-scattered to the optimizer state's shards once a step.
    assert scattered("zero1_cp") == (6 * 2, 2 * LAYER)
    # FSDP: the gradients are stored sharded over both axes, reduce-scattered as each
    # micro-batch's backward makes them.
    assert scattered("fsdp_cp") == (M * 6 * 2, M * 2 * LAYER)


# -- memory ----------------------------------------------------------------------------------------

BIG = ModelConfig(
    d_model=4096, heads=32, kv_heads=8, ff=14336, layers=4, vocab=32000, batch=16, seq=8192,
    dtype="bfloat16",
)  # fmt: skip


def test_activations_and_logits_are_divided_by_the_context_axis():
    cp = get_strategy("fsdp_cp").place(BIG, abstract_mesh("data=4,context=4"))
    fsdp = get_strategy("fsdp").place(BIG, abstract_mesh("data=4"))
    assert activation_bytes_per_layer(cp) * 4 == activation_bytes_per_layer(fsdp)
    # 4 sequences a data shard; logits and their gradient, bf16, a quarter of the tokens.
    assert logits_bytes(cp, 4) == 4 * 8192 * 32000 * 2 * 2 // 4
    mem = estimate_memory(cp)
    # One layer's keys and values of the whole sequence: 2 x 8192 x (8 x 128) x 4 x 2 B.
    assert mem.gathered_kv == 2 * 8192 * 8 * 128 * 4 * 2
    assert mem.total == mem.model_state + mem.activations + mem.gathered_weights + mem.gathered_kv
    # The weights in 16 shards, as FSDP over 16 devices holds them.
    fsdp16 = get_strategy("fsdp").place(BIG, abstract_mesh("data=16"))
    assert mem.model_state == estimate_memory(fsdp16).model_state


def test_other_strategies_gather_no_keys():
    assert (
        estimate_memory(get_strategy("fsdp").place(BIG, abstract_mesh("data=4"))).gathered_kv == 0
    )


# -- the planner -----------------------------------------------------------------------------------


def test_candidates_are_data_by_context_meshes():
    labels = [c.label for c in candidates(CP, 8)]
    assert labels == [
        "dp_cp data=4,context=2",
        "dp_cp data=2,context=4",
        "fsdp_cp data=4,context=2",
        "fsdp_cp data=2,context=4",
    ]
    assert pinned_mesh("data=8,context=4", 32, DEFAULT_STRATEGIES) == {"data": 8, "context": 4}


def test_the_default_sweep_tries_fsdp_cp():
    assert "fsdp_cp" in DEFAULT_STRATEGIES


def test_keys_and_values_are_on_the_critical_path():
    placement = get_strategy("fsdp_cp").place(BIG, abstract_mesh("data=4,context=4"))
    assert classify(ALL_GATHER, CTX, placement) == CRITICAL
    assert classify(REDUCE_SCATTER, CTX, placement) == CRITICAL
    assert classify(ALL_GATHER, BOTH, placement) == PER_MICROBATCH_FWD_BWD
    # A gradient summed over context alone (a compiler reducing one axis at a time).
    assert classify(ALL_REDUCE, CTX, placement) == PER_STEP_BWD
    dp = get_strategy("dp_cp").place(BIG, abstract_mesh("data=4,context=4"))
    assert classify(ALL_REDUCE, BOTH, dp) == PER_STEP_BWD


# -- bad input -------------------------------------------------------------------------------------


def test_a_sequence_that_does_not_divide_names_the_value_and_the_fix():
    config = replace(TINY, seq=8192, batch=4)
    with pytest.raises(StrategyError, match=r"seq=8192 .* context=3 .*not divisible by 3") as e:
        get_strategy("fsdp_cp").place(config, abstract_mesh("data=4,context=3"))
    assert "seq=8190" in str(e.value) and "(e.g. 2)" in str(e.value)


def test_a_mesh_without_a_context_axis():
    with pytest.raises(StrategyError, match=r"named 'context', but mesh 'data=8' has none"):
        get_strategy("dp_cp").place(TINY, abstract_mesh("data=8"))


def test_the_command_line_names_the_sequence(capsys):
    argv = ["audit", "transformer", "--strategy", "fsdp_cp", "--mesh", "data=4,context=3",
            "--seq", "8192", "--batch", "4"]  # fmt: skip
    line = assert_usage_error(argv, "seq=8192", capsys)
    assert "context=3" in line
    argv = ["plan", "--model", "7b", "--devices", "24", "--seq", "8192", "--mesh",
            "data=8,context=3"]  # fmt: skip
    # The plan prints its table of skipped candidates, then the one line.
    line = assert_usage_error(argv, "seq=8192", capsys, quiet=False)
    assert "mesh='data=8,context=3': strategy 'fsdp_cp'" in line
    assert "context=3 (3 ways)" in line
