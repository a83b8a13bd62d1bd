"""Lower bounds: the matmul schedule search, transformer formulas, and exact agreement with the
collectives XLA inserts (via the audit) wherever the compiler reaches the minimum."""

from dataclasses import replace

import shardscope

shardscope.use_cpu_devices(8)

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.comm import traffic_bytes  # noqa: E402
from shardscope._src.base.errors import StrategyError  # noqa: E402
from shardscope._src.bounds.matmul import (  # noqa: E402
    best_schedule,
    matmul_bound,
    matmul_problem,
    matmul_schedule,
    matmul_schedules,
)
from shardscope._src.bounds.transformer import transformer_bound  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.sharding.numerics import TOLERANCES, reference_outputs, relative_error  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import (  # noqa: E402
    STRATEGIES,
    abstract_mesh,
    get_strategy,
    mesh_spec_for,
)

MiB = 2**20
TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
SHAPES = {"8": (8,), "2x4": (2, 4), "2x2x2": (2, 2, 2)}
DETERMINISTIC = settings(derandomize=True, database=None, deadline=None, max_examples=60)

# The reference cases (scaling book part 3): n=8, M=4096, K=N=1024, bf16.
# (A spec, B spec, C spec) -> best schedule in MiB sent per device.
MATMUL_CASES = {
    "b": (("x,None", "None,None", "x,None"), 0.0),
    "c": (("None,None", "None,x", "None,x"), 0.0),
    "d": (("None,x", "None,None", "None,None"), 7.0),
    "d'": (("None,x", "None,None", "x,None"), 0.875),
    "d''": (("None,x", "None,None", "None,x"), 1.75),
    "e": (("x,None", "None,x", "x,None"), 1.75),
    "e'": (("x,None", "None,x", "None,x"), 2.625),
    # The sheet lists all-reduce (14 MiB) and reduce-scatter (7 MiB) of C for a and a'. For
    # this tall A, moving the operands is cheaper: a gathers A and B (7 + 1.75 MiB, every
    # device computing all of C); a' all-to-alls A to rows and gathers B (0.875 + 1.75).
    "a": (("None,x", "x,None", "None,None"), 8.75),
    "a'": (("None,x", "x,None", "x,None"), 2.625),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_cases_of_the_reference_sheet(case):
    specs, mib = MATMUL_CASES[case]
    bound = matmul_bound("x=8", 4096, 1024, 1024, "bfloat16", *specs)
    assert bound.traffic_bytes == int(mib * MiB)


def test_contraction_schedule_is_the_bound_when_the_output_is_square():
    # With M = K = N the all-reduce of C (case a) is the cheapest schedule.
    schedule = matmul_schedule("x=8", 1024, 1024, 1024, "float32", "None,x", "x,None", "None,None")
    (axis,) = schedule.axes
    assert axis.partition == "k"
    assert [t.kind for t in axis.terms] == ["all-reduce"]
    assert schedule.traffic_bytes == traffic_bytes("all-reduce", 1024 * 1024 * 4, 8)


def test_reduce_scatter_when_contraction_is_cheapest_and_output_sharded():
    bound = matmul_bound("x=8", 1024, 4096, 1024, "float32", "None,x", "x,None", "x,None")
    assert [t.kind for t in bound.terms] == ["reduce-scatter"]


def test_no_duplicated_flops_option():
    problem = matmul_problem(
        "x=8", 4096, 1024, 1024, "bfloat16", "None,x", "None,None", "None,None"
    )
    free = best_schedule(problem)
    split = best_schedule(problem, duplicate_flops=False)
    assert free.axes[0].duplicated_flops and free.traffic_bytes == 7 * MiB
    assert split.axes[0].partition == "m"  # all-to-all A, then all-gather C
    assert split.traffic_bytes == int(7.875 * MiB)
    assert split.flops_per_device * 8 == free.flops_per_device


def test_two_axes_are_scheduled_with_the_other_axis_sharding():
    # Megatron's MLP-down on a 2-D mesh: rows of A on data, contraction on model.
    schedule = matmul_schedule(
        "data=2,model=4", 64, 256, 32, "float32", "data,model", "model,None", "data,None"
    )
    by_axis = {p.axis: p for p in schedule.axes}
    assert by_axis["data"].terms == ()
    (term,) = by_axis["model"].terms
    assert term.kind == "all-reduce" and term.payload_bytes == 32 * 32 * 4  # half the rows
    assert schedule.layout("a") == ("data", "model")


_AXIS = st.sampled_from([None, "x", "y"])


@st.composite
def _specs(draw):
    def spec():
        first = draw(_AXIS)
        second = draw(_AXIS.filter(lambda a: a is None or a != first))
        return (first, second)

    return spec(), spec(), spec()


@DETERMINISTIC
@given(_specs(), st.sampled_from([(64, 32, 16), (16, 64, 32), (32, 32, 32)]))
def test_the_bound_is_the_cheapest_of_every_schedule(specs, mnk):
    m, k, n = mnk
    problem = matmul_problem({"x": 2, "y": 4}, m, k, n, "float32", *specs)
    best = best_schedule(problem)
    every = matmul_schedules(problem)
    assert best.traffic_bytes == min(p.traffic_bytes for p in every)
    # Each array moves at most once per axis.
    for p in best.axes:
        assert len(p.terms) <= 3


@pytest.mark.parametrize(
    "specs, needle",
    [
        (("None,x,None", "None,None", "None,None"), r"a-spec .* has 3 entries.*'None,model'"),
        (("None,y", "None,None", "None,None"), r"axis 'y', which the mesh 'x=8' does not"),
        (("x,x", "None,None", "None,None"), r"uses axis 'x' on both dimensions"),
        (("None,None", "None,None", "x,None"), r"m=12 over axis x=8, but 12 is not divisible"),
    ],
)
def test_bad_matmul_specs(specs, needle):
    with pytest.raises(StrategyError, match=needle):
        matmul_bound("x=8", 12, 16, 16, "float32", *specs)


def test_bad_matmul_dtype():
    with pytest.raises(StrategyError, match="dtype 'floaty'"):
        matmul_bound("x=8", 16, 16, 16, "floaty", "None,None", "None,None", "None,None")


# -- transformer formulas ----------------------------------------------------------------------


def test_megatron_forward_is_two_all_reduces_per_layer():
    config = ModelConfig(d_model=64, heads=8, ff=256, layers=3, batch=4, seq=16)
    bound = transformer_bound(get_strategy("tp").place(config, "model=8"), "forward")
    assert bound.counts() == {"all-reduce": 6}
    payload = 4 * 16 * 64 * 4
    assert {t.payload_bytes for t in bound.terms} == {payload}
    assert bound.traffic_bytes == 6 * (2 * 7 * payload // 8)
    assert {t.scope for t in bound.terms} == {"attention", "mlp"}


def test_sequence_parallel_turns_each_all_reduce_into_gather_and_scatter():
    config = ModelConfig(d_model=64, heads=8, ff=256, layers=3, batch=4, seq=16)
    tp = transformer_bound(get_strategy("tp").place(config, "model=8"))
    sp = transformer_bound(get_strategy("sp").place(config, "model=8"))
    assert sp.counts() == {"all-gather": 6, "reduce-scatter": 6}
    assert sp.traffic_bytes == tp.traffic_bytes  # same volume (arXiv 2205.05198)


def test_train_bounds_follow_the_published_formulas():
    config = ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=8, seq=16)
    # Per layer: two norm gains, wqkv (64, 3 * 64), wo (64, 64), w_up and w_down (64, 256); f32.
    params = 2 * (64 + 64 * 3 * 64 + 64 * 64 + 64 + 2 * 64 * 256) * 4
    assert config.param_count() * 4 == params
    dp = transformer_bound(get_strategy("dp").place(config, "data=8"), "train")
    grads = [t for t in dp.terms if t.scope != "loss"]
    assert sum(t.payload_bytes * t.count for t in grads) == params
    fsdp = transformer_bound(get_strategy("fsdp").place(config, "data=8"), "train")
    assert fsdp.payload_bytes("all-gather") == params
    assert fsdp.payload_bytes("reduce-scatter") == params
    # Both sum the f32 scalar loss once: an all-reduce of 4 bytes over 8 devices.
    loss = 2 * 7 * 4 // 8
    assert dp.traffic_bytes == 2 * 7 * params // 8 + loss
    # Gather once + scatter = one all-reduce's volume (ZeRO section 7.2.2, weights kept).
    assert fsdp.traffic_bytes == 7 * params // 8 + 7 * params // 8 + loss
    tp = transformer_bound(get_strategy("tp").place(config, "model=8"), "train")
    assert tp.counts() == {"all-reduce": 4 * 2}
    # ZeRO-1 and ZeRO-2 move what data parallelism does (ZeRO section 7.2.1): each device
    # updates its shard of the optimizer state, so the gradients are reduce-scattered to the
    # shards and the updated weights gathered, 2 x 7/8 of them, not all-reduced first
    for name in ("zero1", "zero2"):
        zero = transformer_bound(get_strategy(name).place(config, "data=8"), "train")
        assert zero.payload_bytes("reduce-scatter") == params, name
        assert zero.payload_bytes("all-gather") == params, name
        assert zero.traffic_bytes == 7 * params // 8 + 7 * params // 8 + loss, name


def test_bounds_for_meshes_larger_than_the_devices_at_hand():
    # The planner's case: an abstract mesh needs no devices.
    config = ModelConfig(d_model=4096, heads=32, ff=16384, layers=32, batch=64, seq=2048)
    bound = transformer_bound(
        get_strategy("dp_tp").place(config, abstract_mesh("data=64,model=16")), "train"
    )
    act = (64 // 64) * 2048 * 4096 * 4
    tp_terms = [t for t in bound.terms if t.axes == ("model",)]
    assert sum(t.count for t in tp_terms) == 4 * 32
    assert {t.payload_bytes for t in tp_terms} == {act}


def test_replicated_needs_nothing():
    assert transformer_bound(get_strategy("replicated").place(TINY, "model=8"), "train").terms == ()


# -- the compiled programs reach these bounds exactly ---------------------------------------------


def _audited(program):
    result = audit(program if isinstance(program, jax.stages.Compiled) else program.lower())
    out = {}
    for c in result.collectives:
        key = (c.axes, c.kind)
        count, sent = out.get(key, (0, 0))
        out[key] = (count + c.count, sent + c.count * c.traffic_bytes)
    return out


def _bounded(bound):
    out = {}
    for t in bound.terms:
        key = (t.axes, t.kind)
        count, sent = out.get(key, (0, 0))
        out[key] = (count + t.count, sent + t.traffic_bytes)
    return out


EXACT_FORWARD = [
    pytest.param(name, mesh_id, impl, id=f"{name}-{impl}-{mesh_id}")
    for name, s in STRATEGIES.items()
    if not s.expert_parallel  # a mixture of experts' bound: test_moe_layer.py
    for mesh_id, shape in SHAPES.items()
    for impl in (("jit", "shard_map") if s.twin else ("jit",))
    if len(shape) >= len(s.roles)
    # Under jit the CPU backend emulates reduce-scatter with all-reduce + slice: the
    # verdict's tests cover those programs.
    and not (s.sequence_parallel and impl == "jit")
]


@pytest.mark.parametrize("name, mesh_id, impl", EXACT_FORWARD)
def test_forward_collectives_equal_the_bound(name, mesh_id, impl):
    program = build_reference_program(name, TINY, mesh_spec_for(name, SHAPES[mesh_id]), impl=impl)
    compiled = program.compile()
    assert _audited(compiled) == _bounded(transformer_bound(program.placement, "forward"))
    # The same executable computes what one device computes (per-scope errors: see
    # test_strategies.py).
    args = program.example_args()
    expected, _ = reference_outputs(TINY, args, "forward")
    assert relative_error(compiled(*args), expected) <= TOLERANCES[TINY.dtype]


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
@pytest.mark.parametrize("impl", ["jit", "shard_map"])
def test_megatron_train_step_collectives_equal_the_bound(impl, mlp):
    # SwiGLU's gate and up are two matmuls whose input's gradient is reduced once, summed
    config = replace(TINY, mlp=mlp)
    program = build_reference_program("tp", config, "data=2,model=4", mode="train", impl=impl)
    assert _audited(program) == _bounded(transformer_bound(program.placement, "train"))


def test_data_parallel_gradient_bytes_equal_the_bound():
    # XLA combines the per-weight gradient all-reduces into one per layer: fewer
    # instructions, the same bytes.
    program = build_reference_program("dp_tp", TINY, "pod=2,data=2,model=2", mode="train")
    actual, bound = _audited(program), _bounded(transformer_bound(program.placement, "train"))
    assert actual.keys() == bound.keys()
    assert {k: v[1] for k, v in actual.items()} == {k: v[1] for k, v in bound.items()}
    assert actual[(("model",), "all-reduce")] == bound[(("model",), "all-reduce")]
