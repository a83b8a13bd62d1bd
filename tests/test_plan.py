"""The planner: enumeration, estimates, a compiled sweep on 8 devices, validation against the
formulas, bad input, and sweeps on more devices through a subprocess or a worker."""

import io
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import assert_drawn, assert_usage_error, patches, read_png
from shardscope._src.audit.compile import audit, parse_rematerializations
from shardscope._src.audit.width import Width
from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
    format_bytes,
)
from shardscope._src.base.errors import PlanError, ShardscopeError
from shardscope._src.base.notes import Note
from shardscope._src.base.stderr import capture_stderr
from shardscope._src.bounds.terms import Bound, Term, TermRole
from shardscope._src.cost.links import crosses_nodes
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.compile import (
    COMPILE_OPTIONS,
    can_compile_here,
    default_workers,
    plan_collective,
)
from shardscope._src.plan.estimates import (
    activation_bytes_per_layer,
    estimate_memory,
    model_flops,
)
from shardscope._src.plan.notes import PlanNote, WidenedValues
from shardscope._src.plan.request import PlanRequest
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.specs import TARGETS
from shardscope._src.train.candidates import candidates, crossing_axes, maxtext_mesh
from shardscope._src.train.compile import compile_facts
from shardscope._src.train.sweep import plan
from shardscope._src.train.types import StageProgram
from shardscope._src.train.validate import VALIDATED_STRATEGIES, validate

TINY = model_preset("tiny")
SWEPT = ("dp", "fsdp", "tp", "sp", "dp_tp", "fsdp_tp", "dp_sp")
#: One schedule on the command line: one micro-batch, no recomputation, no pipeline stages.
ONE_SCHEDULE = ["--stages", "1", "--microbatches", "1", "--remat", "none"]
#: A small decoder for the analytic estimates (``_placed`` changes fields).
SMALL = ModelConfig(
    d_model=256, heads=8, ff=1024, layers=4, batch=8, seq=128, dtype="bfloat16", vocab=1024
)


@pytest.fixture(scope="module")
def sweep():
    """Every strategy and mesh for the tiny preset on 8 devices, in this process, all
    compiled, with one schedule (one micro-batch, no recomputation, no pipeline stages)."""
    return plan(
        "tiny",
        8,
        workers=0,
        strategies=SWEPT,
        stages=1,
        microbatches=1,
        remat="none",
        compile_top=10,
        compiler="cpu",
    )


# -- enumeration and presets (no compiling) ----------------------------------------------------


def test_a_pinned_mesh_plans_only_that_mesh_every_schedule_of_it():
    result = plan(
        "tiny", 8, workers=0, strategies=["dp", "dp_tp", "fsdp_tp"], mesh="data=4,model=2",
        compile_top=10,
    compiler="cpu")  # fmt: skip
    # dp has no model axis; dp_tp and fsdp_tp run on it, and only there.
    assert {p.strategy for p in result.plans} == {"dp_tp", "fsdp_tp"}
    assert {p.mesh_spec for p in result.plans} == {"data=4,model=2"}
    assert result.settings["mesh"] == "data=4,model=2"
    # A pipelined mesh sets the stages.
    piped = plan("tiny", 8, workers=0, strategies=["fsdp"], mesh="stage=2,data=4", compiler="cpu")
    assert {(p.mesh_spec, p.stages) for p in piped.plans} == {("stage=2,data=4", 2)}


def test_a_pinned_mesh_in_another_order_is_read_in_the_planners_and_says_so():
    written = plan("tiny", 8, workers=0, strategies=["dp_tp"], mesh="model=2,data=4",
                   compiler="cpu", beside_best=True)  # fmt: skip
    canonical = plan("tiny", 8, workers=0, strategies=["dp_tp"], mesh="data=4,model=2",
                     compiler="cpu")  # fmt: skip
    assert [(p.strategy, p.mesh_spec, p.step_time_s) for p in written.plans] == [
        (p.strategy, p.mesh_spec, p.step_time_s) for p in canonical.plans
    ]
    (read,) = [n for n in written.notes if n.kind == "mesh-read"]
    assert (read.values.given, read.values.read) == ("model=2,data=4", "data=4,model=2")
    # beside_best: the pinned layout's fastest beside the fastest of every layout, each
    # step in parts that add up to it; on 8 H100s the tiny model is faster unsplit
    (beside,) = [n for n in written.notes if n.kind == "beside-best"]
    v = beside.values
    assert v.pinned.startswith("dp_tp data=4,model=2")
    assert not v.best.startswith("dp_tp data=4,model=2") and v.best_s < v.pinned_s
    assert sum(p for _, p, _ in v.parts) == pytest.approx(v.pinned_s, rel=1e-12)
    assert sum(b for _, _, b in v.parts) == pytest.approx(v.best_s, rel=1e-12)
    assert f"{1 - v.best_s / v.pinned_s:.0%} less than the pinned" in str(beside)
    assert not [n for n in canonical.notes if n.kind == "beside-best"]
    with pytest.raises(PlanError, match=r"beside_best=True .* nothing is pinned: give mesh="):
        PlanRequest("tiny", 8, beside_best=True)
    assert not [n for n in canonical.notes if n.kind == "mesh-read"]


def test_a_reading_that_crosses_nodes_differently_is_said():
    # Eight devices a node: written model=8,data=4, the model axis's groups (devices 0, 4,
    # 8, ... as numbered) span nodes and data's do not; read as data=4,model=8, the reverse
    assert crossing_axes(MeshShape.of("model=8,data=4"), 8) == ("model",)
    assert crossing_axes(MeshShape.of("data=4,model=8"), 8) == ("data",)
    values = {"given": "model=8,data=4", "read": "data=4,model=8", "node_size": 8,
              "given_crossing": ("model",), "read_crossing": ("data",)}  # fmt: skip
    text = Note(PlanNote.MESH_READ, values).text
    assert "crosses nodes of 8 differently: as written model, as planned data" in text
    same = Note(PlanNote.MESH_READ, {**values, "given_crossing": ("data",)}).text
    assert "differently" not in same


@pytest.mark.parametrize(
    "written, read",
    [
        ("ici_fsdp=8,dcn_fsdp=16,dcn_data=4", "replica=4,data=128"),
        ("ici_tensor_parallelism=8,dcn_fsdp_parallelism=4", "data=4,model=8"),
        (
            "dcn_pipeline=4,ici_data=2,ici_sequence=2,ici_tensor=4",
            "stage=4,data=2,context=2,model=4",
        ),
        ("ici_expert=8,dcn_data=2", "data=2,expert=8"),
    ],
)
def test_maxtexts_ici_and_dcn_parallelism_read_as_the_planners_axes(written, read):
    assert maxtext_mesh(MeshShape.of(written)).spec == read


def test_a_maxtext_mesh_plans_the_strategies_that_run_on_it():
    # MaxText's data axis beside fsdp replicates the weights over it: HSDP's replica, on
    # which no default strategy runs; unasked, those that run on it are planned
    result = plan("tiny", 8, workers=0, mesh="dcn_data=2,ici_fsdp=2,ici_tensor=2",
                  compiler="cpu")  # fmt: skip
    assert {p.mesh_spec for p in result.plans} == {"replica=2,data=2,model=2"}
    assert {p.strategy for p in result.plans} <= {"hsdp_tp", "hsdp_sp"}
    (read,) = [n for n in result.notes if n.kind == "mesh-read"]
    assert "MaxText's parallelism" in read.text
    with pytest.raises(PlanError, match="ici_autoregressive is not a parallelism") as err:
        plan("tiny", 8, workers=0, mesh="ici_autoregressive=8", compiler="cpu")
    assert err.value.params == ("mesh",)


def test_candidates_factor_the_device_count():
    labels = [c.label for c in candidates(["dp", "fsdp", "tp", "sp", "dp_tp"], 12)]
    assert labels == [
        "dp data=12",
        "fsdp data=12",
        "tp model=12",
        "sp model=12",
        "dp_tp data=6,model=2",
        "dp_tp data=4,model=3",
        "dp_tp data=3,model=4",
        "dp_tp data=2,model=6",
    ]
    assert [c.label for c in candidates(["fsdp_tp"], 7)] == []  # prime: no 2-D mesh
    assert all(math.prod(c.sizes.values()) == 64 for c in candidates(["dp_sp"], 64))


def test_an_expert_sweep_lists_each_program_once():
    # dp_ep replicates over 'data' what ep replicates: on data=1 it is ep's program, so a sweep
    # of both lists it once; fsdp_ep's dense weights are sharded over data x expert, another
    # program on data=1
    labels = [c.label for c in candidates(["ep", "dp_ep", "fsdp_ep"], 8)]
    assert labels == [
        "ep expert=8",
        "dp_ep data=4,expert=2",
        "dp_ep data=2,expert=4",
        "fsdp_ep data=4,expert=2",
        "fsdp_ep data=2,expert=4",
        "fsdp_ep data=1,expert=8",
    ]
    # asked alone, or pinned to it, dp_ep keeps its data=1 mesh
    assert "dp_ep data=1,expert=8" in [c.label for c in candidates(["dp_ep"], 8)]
    pinned = candidates(["ep", "dp_ep"], 8, mesh={"data": 1, "expert": 8})
    assert [c.label for c in pinned] == ["dp_ep data=1,expert=8"]


# The tiny preset's weights: 4 layers of two norm gains, wqkv (256, 768), wo (256, 256),
# w_up and w_down (256, 1024); the embedding and unembedding (1024, 256) and the final norm.
TINY_PARAMS = 4 * (256 + 256 * 768 + 256 * 256 + 256 + 2 * 256 * 1024) + 2 * 1024 * 256 + 256


# 7B and 70B: tests/test_plan_jobs.py, against the published checkpoints' counts.
@pytest.mark.parametrize(
    "name, params",
    [
        ("tiny", TINY_PARAMS),
        ("1b", 1_100_048_384),
        ("13b", 13_015_864_320),
    ],
)
def test_presets_have_the_published_parameter_counts(name, params):
    assert model_preset(name).param_count() == params


def test_unknown_preset_names_the_choices():
    with pytest.raises(PlanError, match="unknown model preset '8b'.*tiny, 1b, llama2-7b"):
        model_preset("8b")


# -- analytic estimates ------------------------------------------------------------------------


def _placed(strategy, mesh, **kw):
    return get_strategy(strategy).place(replace(SMALL, **kw), abstract_mesh(mesh))


def test_model_state_follows_the_storage_specs():
    dp = estimate_memory(_placed("dp", "data=8"))
    fsdp = estimate_memory(_placed("fsdp", "data=8"))
    params = TINY.param_count()
    assert dp.params == 2 * params and dp.grads == 2 * params
    assert dp.optimizer == 12 * params
    assert fsdp.params * 8 == dp.params  # every tiny dimension FSDP shards divides by 8
    tp = estimate_memory(_placed("tp", "model=8"))
    c = TINY.config(batch=8)
    replicated = c.layers * 2 * c.d_model + 2 * c.vocab * c.d_model + c.d_model
    assert tp.params == 2 * ((params - replicated) // 8 + replicated)
    ten = estimate_memory(_placed("dp", "data=8"), bytes_per_param=10)
    assert ten.optimizer == 6 * params
    fwd = estimate_memory(_placed("dp", "data=8"), "forward")
    assert (fwd.grads, fwd.optimizer) == (0, 0)


def test_activations_reduce_to_korthikanti_table_2():
    # ff = 4h: no parallelism sbh(34 + 5as/h); TP sbh(10 + 24/t + 5as/ht); TP+SP sbh(34/t + ..)
    s, b, h, a, t = 128, 8, 256, 8, 4
    kw = dict(ff=4 * h)
    assert activation_bytes_per_layer(_placed("dp", "data=1", **kw)) == s * b * h * 34
    assert activation_bytes_per_layer(_placed("dp", "data=1", **kw), flash_attention=False) == (
        s * b * h * 34 + 5 * a * s * s * b
    )
    assert activation_bytes_per_layer(_placed("tp", "model=4", **kw)) == s * b * h * (10 + 24 / t)
    assert activation_bytes_per_layer(_placed("sp", "model=4", **kw)) == s * b * h * 34 / t


def test_model_flops_is_korthikanti_eq_7():
    c = ModelConfig(d_model=512, heads=8, ff=2048, layers=6, batch=4, seq=256, vocab=1000)
    B, L, s, h, v = c.batch, c.layers, c.seq, c.d_model, c.vocab
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))
    assert model_flops(c, "train") == pytest.approx(eq7, rel=1e-12)
    assert model_flops(c, "train") == 3 * model_flops(c, "forward")


def test_groups_cross_nodes_by_device_numbering():
    mesh = {"data": 8, "model": 8}
    assert crosses_nodes(mesh, ["model"], 8) is False
    assert crosses_nodes(mesh, ["data"], 8) is True
    assert crosses_nodes(mesh, ["data"], 64) is False
    assert crosses_nodes({"data": 4, "model": 4}, ["model"], 8) is False
    assert crosses_nodes({"data": 4, "model": 16}, ["model"], 8) is True
    assert crosses_nodes(mesh, [], 8) is True  # irregular: assume the worst


# -- a compiled sweep on 8 devices ------------------------------------------------------------


def test_sweep_ranks_fitting_plans_by_step_time(sweep):
    keys = [(not p.fits, p.step_time_s) for p in sweep.plans]
    assert keys == sorted(keys)
    assert [p.rank for p in sweep.plans] == list(range(1, len(sweep.plans) + 1))
    assert len(sweep.plans) + len(sweep.skipped) == sweep.candidates == 10
    for p in sweep.plans:
        t = p.time
        # Overlap hides communication, never compute: the step lies between the compute
        # alone and everything in sequence (floats: a sum taken in another order).
        assert t.compute_s + t.optimizer_s <= p.step_time_s
        in_sequence = t.compute_s + t.tp_comm_s + t.data_comm_s + t.optimizer_s
        assert p.step_time_s <= in_sequence * (1 + 1e-12)
        # No plan computes faster than the matmul rate the model assumes.
        assert 0 < p.mfu <= sweep.hardware.matmul_fraction
        assert (p.microbatches, p.remat, p.stages) == (1, "none", 1)
        assert p.memory_bytes_per_device == p.memory.total > 0
        assert p.compiled_memory_bytes_per_device > 0


def test_pareto_front_is_the_undominated_plans(sweep):
    # The front trades the step time against the memory that decided the fit.
    def dominates(q, p):
        a = (q.fit_memory_bytes_per_device, q.step_time_s)
        b = (p.fit_memory_bytes_per_device, p.step_time_s)
        return a[0] <= b[0] and a[1] <= b[1] and a != b

    for p in sweep.plans:
        beaten = any(dominates(q, p) for q in sweep.plans if q is not p)
        assert p.pareto is (not beaten), p.label


def test_collectives_count_loop_trips(sweep):
    layers = TINY.layers
    tp = next(p for p in sweep.plans if p.label == "tp model=8")
    assert [(a.axes, a.kind, a.count) for a in tp.comm] == [("model", "all-reduce", 4 * layers)]
    fsdp = next(p for p in sweep.plans if p.label == "fsdp data=8")
    gathers = next(a for a in fsdp.comm if a.kind == "all-gather")
    # Each layer weight per trip, plus the 3 vocab ones; and the 6 of each layer again for
    # the backward (the 4 matrices and the 2 norm gains).
    assert gathers.count == 6 * layers + 3 + 6 * layers


# The tiny preset's weights, in bf16. The scalar loss is summed in f32 (an all-reduce of 4
# bytes over 8 devices).
TINY_WEIGHT_BYTES = TINY_PARAMS * 2
LOSS_BYTES = 2 * 7 * 4 // 8


@pytest.mark.parametrize("strategy", VALIDATED_STRATEGIES)
def test_compiled_communication_matches_the_formula(sweep, strategy):
    v = next(v for v in sweep.validations if v.strategy == strategy)
    w = TINY_WEIGHT_BYTES
    if strategy == "dp":  # the gradients all-reduced over data=8, and the loss
        formula = 2 * 7 * w // 8 + LOSS_BYTES
    elif strategy == "fsdp":
        # The weights gathered, the layers' gathered again for the backward (4 layers of two
        # norm gains, wqkv, wo, w_up and w_down, bf16), their gradients reduce-scattered.
        layers = 4 * (2 * 256 + 256 * 768 + 256 * 256 + 2 * 256 * 1024) * 2
        formula = 7 * w // 8 + 7 * layers // 8 + 7 * w // 8 + LOSS_BYTES
    else:  # tp: four all-reduces a layer of the (8, 128, 256) bf16 activations over model=8
        formula = 4 * 4 * (2 * 7 * (8 * 128 * 256 * 2) // 8)
    assert v.formula_bytes == formula
    if strategy in ("dp", "tp"):
        assert v.ok and v.explanation == ""
        assert v.compiled_bytes == v.formula_bytes  # exactly, once bf16 is counted as bf16
    else:
        # FSDP: the CPU backend all-reduces gradients where the formula reduce-scatters them.
        assert not v.ok and "XLA:CPU forms no reduce-scatter under jit" in v.explanation
        layers = 4 * (2 * 256 + 256 * 768 + 256 * 256 + 2 * 256 * 1024) * 2
        cpu = 7 * w // 8 + 7 * layers // 8 + 2 * 7 * w // 8 + LOSS_BYTES
        assert v.compiled_bytes == v.cpu_formula_bytes == cpu
        assert v.cpu_ratio == 1.0
        assert v.ratio == pytest.approx(v.compiled_bytes / v.formula_bytes, rel=1e-12)


def test_a_validation_matches_only_within_the_tolerance_either_way(sweep):
    dp = next(p for p in sweep.plans if p.label == "dp data=8")
    compiled = dp.comm_bytes_per_device

    def formula(bytes_):  # a collective-permute sends its payload: ``bytes_`` exactly
        term = Term(COLLECTIVE_PERMUTE, ("data",), 2, bytes_, 1, "w", role=TermRole.ACTIVATION)
        return Bound("permute", (term,), ())

    # The compiled bytes 4% above and below the formula match; 6% above or below do not:
    # a formula that overcounts the program fails as one that undercounts it does.
    for over, ok in [(1.04, True), (0.96, True), (1.06, False), (0.94, False)]:
        v = validate(dp, formula(round(compiled / over)))
        assert v.ok is ok, over
        assert v.compiled_bytes == compiled


def test_only_a_compiler_that_may_skip_reduce_scatters_explains_a_validation_by_it(sweep):
    v = next(v for v in sweep.validations if v.strategy == "fsdp")
    fsdp = next(p for p in sweep.plans if p.strategy == "fsdp" and p.mesh_spec == v.mesh)
    w, data = TINY_WEIGHT_BYTES, ("data",)
    # The layers' weights (bf16) are gathered a second time, for the backward.
    again = 4 * (2 * 256 + 256 * 768 + 256 * 256 + 2 * 256 * 1024) * 2
    bound = Bound(
        "fsdp",
        (
            Term(ALL_GATHER, data, 8, w, 1, "weights", role=TermRole.WEIGHT_GATHER),
            Term(ALL_GATHER, data, 8, again, 1, "again", role=TermRole.WEIGHT_GATHER),
            Term(REDUCE_SCATTER, data, 8, w, 1, "gradients", role=TermRole.GRADIENT_SCATTER),
            Term(ALL_REDUCE, data, 8, 4, 1, "loss", role=TermRole.LOSS_SUM),
        ),
        (),
    )
    formula = 7 * w // 8 + 7 * again // 8 + 7 * w // 8 + LOSS_BYTES
    assert bound.traffic_bytes == v.formula_bytes == formula
    on_cpu = validate(fsdp, bound)
    assert not on_cpu.ok and on_cpu.explanation.startswith("XLA:CPU forms no reduce-scatter")
    # The same collectives, had the H100 compiler built them, are the program's own doing.
    on_gpu = validate(replace(fsdp, compiled_by=TARGETS["h100"]), bound)
    assert not on_gpu.ok and on_gpu.explanation.startswith("compiled communication is 1.")


def test_bf16_collectives_are_counted_at_two_bytes(sweep):
    dp = next(p for p in sweep.plans if p.label == "dp data=8")
    assert dp.cpu_comm_bytes_per_device == 2 * dp.comm_bytes_per_device - 7  # f32 loss: 7 B
    (widened,) = [n for n in sweep.notes if n.kind == "widened"]
    assert widened.kind is PlanNote.CPU_WIDENED  # the former name
    assert widened.values == WidenedValues(dtype="bfloat16", itemsize=2, compiler="XLA:CPU")
    assert widened.text.startswith("XLA:CPU runs bfloat16 arithmetic in f32")


def test_plan_json_has_the_promised_fields(sweep):
    data = json.loads(json.dumps(sweep.to_dict(), allow_nan=False))
    assert data["devices"] == 8 and data["model"] == "tiny"
    for key in (
        "mesh",
        "strategy",
        "memory_bytes_per_device",
        "comm_bytes_per_device",
        "step_time_s",
        "fits",
        "memory",
        "comm",
        "bound_ratio",
        "pareto",
    ):
        assert key in data["plans"][0], key
    times = [(not p["fits"], p["step_time_s"]) for p in data["plans"]]
    assert times == sorted(times)


def test_compile_options_keep_collectives_and_buffers():
    # The planner's program (its FSDP weights gathered again for the backward).
    placement = get_strategy("fsdp_tp").place(TINY.config(batch=8), "data=4,model=2")
    lowered = build_reference_program(placement, mode="train", regather=True).lower()
    # XLA's own defaults, whatever XLA_FLAGS says (the suite's conftest sets COMPILE_OPTIONS)
    plain = audit(
        lowered,
        compiler_options={"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True},
    )
    fast = audit(lowered, compiler_options=COMPILE_OPTIONS)

    def records(a):
        return sorted((c.kind, c.axes, c.count, c.payload_bytes) for c in a.collectives)

    assert records(fast) == records(plain)
    for k in ("argument_size_in_bytes", "output_size_in_bytes"):
        assert fast.memory[k] == plain.memory[k]
    # Temporaries: within 0.01%, as COMPILE_OPTIONS promises (integers: no float rounding).
    plain_temp, fast_temp = (a.memory["temp_size_in_bytes"] for a in (plain, fast))
    assert abs(fast_temp - plain_temp) * 10_000 <= plain_temp, (fast_temp, plain_temp)


def test_the_suite_compiles_with_the_planners_options():
    # conftest.py's XLA flags are COMPILE_OPTIONS: the test above keeps what they change
    # (XLA's defaults against them), the one below what the LLVM level alone changes
    flags = os.environ["XLA_FLAGS"].split()
    for name, value in COMPILE_OPTIONS.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        assert f"--{name}={text}" in flags, name


def test_llvms_level_changes_no_hlo():
    """The suite compiles with ``--xla_backend_optimization_level=0`` (conftest.py): the same
    optimised program, collectives and buffers as XLA's default level."""
    placement = get_strategy("fsdp_tp").place(TINY.config(batch=8), "data=4,model=2")
    lowered = build_reference_program(placement, mode="train").lower()
    default = lowered.compile(compiler_options={"xla_backend_optimization_level": 3})
    suite = lowered.compile()
    assert "--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"]
    assert suite.as_text() == default.as_text()
    suite_temp, default_temp = (c.memory_analysis().temp_size_in_bytes for c in (suite, default))
    assert suite_temp == default_temp


def test_compile_facts_are_the_audit_of_the_program_compiled_with_the_options():
    config = TINY.config(batch=8)
    placement = get_strategy("fsdp_tp").place(config, "data=4,model=2")
    lowered = build_reference_program(placement, mode="train", regather=True).lower()
    with capture_stderr() as log:
        compiled = lowered.compile(compiler_options=dict(COMPILE_OPTIONS))
    by_hand = audit(compiled)
    remats = parse_rematerializations(log[0] if log else "", by_hand.module)
    width = Width.of(by_hand, config.dtype)
    facts = compile_facts(StageProgram("fsdp_tp", "data=4,model=2", config, "train"))
    assert facts.collectives == tuple(plan_collective(c, width) for c in by_hand.collectives)
    assert facts.memory == by_hand.memory
    assert facts.exact == by_hand.exact
    assert facts.rematerializations == tuple(
        r.source or r.op_name or r.instruction or "?" for r in remats
    )


def test_the_one_compile_step_reads_the_compile_log_and_keeps_its_lines_off_the_terminal(capfd):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardscope._src.plan.compile import compile_plan

    # A program the partitioner can only reshard by replicating whole arrays: its log says so.
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    s2 = NamedSharding(mesh, P(None, ("x", "y"), None))
    s1 = NamedSharding(mesh, P("y", None, "x"))

    def f(a, b, c):
        d = jax.lax.with_sharding_constraint(a + b, s2)  # the line to report
        return c + d

    arg = jax.ShapeDtypeStruct((16, 16, 16), jnp.float32)
    lowered = jax.jit(f, in_shardings=(s1, s1, s2), out_shardings=s2).lower(arg, arg, arg)
    line = f":{f.__code__.co_firstlineno + 1}"

    # Asked to drop nothing, the compiler's line reaches the terminal; the record has it too.
    shown = compile_plan(lowered, drop=())
    assert "Involuntary full rematerialization" in capfd.readouterr().err
    (r,) = shown.rematerializations
    assert r.source.endswith(line)

    # By default it is the plan's to say: read into the record, off the terminal.
    got = compile_plan(lowered, options=COMPILE_OPTIONS)
    assert "Involuntary full rematerialization" not in capfd.readouterr().err
    (r,) = got.rematerializations
    assert r.source.endswith(line) and got.memory_pressure is None
    assert got.memory == got.audit.memory and got.memory.held_bytes > 0
    assert (got.flops, got.hlo_flops) == (got.audit.flops, got.audit.hlo_flops)
    assert got.exact and got.audit.collectives
    assert got.plan_collectives() == tuple(
        plan_collective(c, Width.of(got.audit)) for c in got.audit.collectives
    )
    # A Compiled is audited as it is: no compile, so no log to read.
    done = compile_plan(got.audit.compiled)
    assert done.rematerializations == () and done.audit.collectives == got.audit.collectives


def test_a_plan_holds_its_candidate_and_the_program_a_target_compiles_again(sweep, monkeypatch):
    from shardscope._src.train import target
    from shardscope._src.train.candidates import stage_config

    for p in sweep.plans:
        cand, program = p.candidate, p.program
        assert (cand.strategy, cand.sizes, cand.label) == (p.strategy, p.mesh, p.label)
        assert (cand.microbatches, cand.remat, cand.stages) == (p.microbatches, p.remat, p.stages)
        assert program.strategy == cand.strategy_record and program.mesh == cand.stage_mesh
        assert program.config == stage_config(sweep.config, cand, flash_attention=True)
        assert (program.mode, program.microbatches) == (sweep.mode, cand.microbatches)

    # A target's compiler compiles the very program the CPU compile built, on its devices.
    seen = []

    def compiled_by_target(program, t, room):
        seen.append((program, t, room))
        return target.TargetFacts(t.name, failure="a compiler's own failure")

    monkeypatch.setattr(target, "target_facts", compiled_by_target)
    p = sweep.plans[0]
    again = target.on_target(p, sweep.hardware, TARGETS["h100"])
    ((program, t, room),) = seen
    assert program is p.program and t is TARGETS["h100"]
    assert room == p.memory_limit_bytes - p.memory.device_optimizer
    assert again.notes[0].kind == "target-compile-failed"


def test_a_plan_whose_cpu_memory_stands_far_from_its_estimate_says_which_the_fit_is_on(sweep):
    # The fit of a CPU-compiled plan is the estimate's; where the CPU compiler's buffers and
    # the optimizer state beside them stand more than 10% from it, the plan says so, with
    # both figures and why.
    said = 0
    for p in sweep.plans:
        assert p.fit_memory_source == "estimate"
        other = p.compiled_memory.buffer_bytes + p.memory.device_optimizer
        far = abs(other / p.memory.total - 1) > 0.10
        notes = [n for n in p.notes if n.kind == PlanNote.FIT_ON_ESTIMATE]
        assert len(notes) == far
        if far:
            said += 1
            text = notes[0].text
            assert text.startswith(
                f"the fit is judged on the analytic estimate, {format_bytes(p.memory.total)}, "
                f"not on the XLA:CPU compiler's {format_bytes(other)} (its buffers and "
                f"{format_bytes(p.memory.device_optimizer)} of optimizer state)"
            )
            assert "computes 16-bit arithmetic in f32" in text and "1F1B" not in text
    assert said  # the CPU's f32 buffers stand far from a bf16 estimate


def test_a_pipeline_stage_says_its_program_runs_one_micro_batch_at_a_time():
    gib = 2**30
    values = {"compiler": "XLA:CPU", "compiled_bytes": 30 * gib, "optimizer_bytes": 10 * gib,
              "estimate_bytes": 50 * gib}  # fmt: skip
    flat = Note(PlanNote.FIT_ON_ESTIMATE, values).text
    staged = Note(PlanNote.FIT_ON_ESTIMATE, {**values, "stages": 4}).text
    assert "40 GiB (its buffers and 10 GiB of optimizer state), which stands -20% from it" in flat
    assert "1F1B" not in flat and staged.startswith(flat) and "1F1B" in staged


def test_a_target_compile_takes_the_word_on_the_fit_from_the_estimate(sweep, monkeypatch):
    from shardscope._src.train import target

    (p, *_) = [p for p in sweep.plans if any(n.kind == PlanNote.FIT_ON_ESTIMATE for n in p.notes)]
    outcome = {}
    monkeypatch.setattr(target, "target_facts", lambda program, t, room: outcome["facts"])
    kinds = {}
    for case, facts in (
        ("too big", target.TargetFacts("h100", error="RESOURCE_EXHAUSTED: out of memory")),
        ("failed", target.TargetFacts("h100", failure="a compiler's own failure")),
    ):
        outcome["facts"] = facts
        kinds[case] = [n.kind for n in target.on_target(p, sweep.hardware, TARGETS["h100"]).notes]
    # judged by the target's compiler (here: it does not fit), the estimate's word goes
    assert PlanNote.FIT_ON_ESTIMATE not in kinds["too big"]
    # a compiler that failed leaves the CPU compile, and the fit, as they were
    assert PlanNote.FIT_ON_ESTIMATE in kinds["failed"]


def test_a_pipeline_plans_target_memory_says_what_its_stage_does_not_hold(sweep, monkeypatch):
    from shardscope._src.cost.memory import CompiledMemory
    from shardscope._src.train import target
    from shardscope._src.train.types import Candidate

    p = sweep.plans[0]
    layers = p.program.config.layers
    # the plan as one of 2 stages of an interleaved 1F1B (2 virtual stages, 4 micro-batches)
    staged = Candidate(p.strategy, MeshShape.of({"stage": 2, **p.mesh}), 4, "none",
                       virtual_stages=2)  # fmt: skip
    gib = 2**30
    held = CompiledMemory(argument_size_in_bytes=gib, temp_size_in_bytes=gib)
    monkeypatch.setattr(
        target, "target_facts", lambda program, t, room: target.TargetFacts("h100", held)
    )
    values = target.on_target(replace(p, candidate=staged), sweep.hardware, TARGETS["h100"])
    values = values.notes[0].values
    # Megatron's first stage runs (p - 1) x 2 + (v - 1) x p warm-up chunks and one more
    # before its first backward: 2 + 2 + 1 = 5 chunks of layers / 2
    assert (values.stage_layers, values.held_layers) == (layers, 5 * (layers // 2))
    note = PlanNote.COMPILED_BY_TARGET.describe(
        {
            "target": "h100",
            "memory_bytes": 40 * gib,
            "estimate_bytes": 60 * gib,
            "fit_bytes": 50 * gib,
            "stage_layers": 12,
            "held_layers": 103,
        }  # fmt: skip
    )
    assert note.endswith(
        "the fit is judged on the compiler's 50 GiB (its buffers and 10 GiB of optimizer state), "
        "what its program allocates with its own fusions, schedule and rematerialization, where "
        "the estimate counts by formula what each layer keeps; but the program runs one pipeline "
        "stage's micro-batches one after another, holding one micro-batch's activations through "
        "its 12 layers, where the first stage of the 1F1B schedule holds 103 layers' at once (the "
        "estimate counts them)"
    )


def test_forward_mode_needs_no_data_parallel_communication():
    result = plan("tiny", 8, mode="forward", strategies=["dp", "tp"], workers=0, compiler="cpu")
    dp = next(p for p in result.plans if p.strategy == "dp")
    assert dp.comm_bytes_per_device == dp.bound_bytes_per_device == 0
    assert dp.bound_ratio == 1.0
    tp = next(p for p in result.plans if p.strategy == "tp")
    assert [(a.kind, a.count) for a in tp.comm] == [("all-reduce", 2 * TINY.layers)]


# -- skipped candidates and bad input ---------------------------------------------------------


def test_indivisible_candidates_are_skipped_with_the_rule():
    result = plan(
        "tiny", 8, batch=4, strategies=["dp", "fsdp"], workers=0, stages=1, compiler="cpu"
    )
    assert result.plans == ()
    assert {(s.strategy, s.reason) for s in result.skipped} == {
        ("dp", "divisibility"),
        ("fsdp", "divisibility"),
    }
    assert "batch=4" in result.skipped[0].message
    assert result.empty_reason.values.skipped == {"divisibility": 2}
    assert "2 skipped for divisibility" in str(result.empty_reason)


def test_a_model_that_fits_nowhere_is_an_empty_result_saying_why():
    result = plan("70b", 8, hardware="tpu-v5e", workers=0, compiler="cpu")
    assert result.plans == ()
    assert {s.reason for s in result.skipped} <= {"memory", "divisibility"}
    why = result.empty_reason
    assert why.kind == "no-plan" and why.values.hardware == "tpu-v5e"
    assert why.values.limit == result.hardware.memory_bytes
    assert "memory_bytes" in why.params and "bytes_per_param" in why.params
    assert "memory" in why.text and "tpu-v5e" in why.text and "--" not in why.text
    # Llama 2 70B's 68,976,648,192 parameters: 4 bytes each of weights and gradients on
    # 16 GiB devices take 275.9 GB / 17.18 GB = 16.06, so 17 of them; the optimizer's 12
    # bytes each on 64 GiB of host a device take 12.04, so 13; with the optimizer on the
    # device, 16 bytes each take 64.2, so 65
    assert why.values.least_devices == 17 and "use at least 17 devices" in why.text
    kept = plan("70b", 8, hardware="tpu-v5e", workers=0, compiler="cpu", offload_optimizer=False)
    assert kept.empty_reason.values.least_devices == 65
    # on 8 devices the optimizer on the host would not do either (17 needed): not named
    assert kept.empty_reason.values.least_devices_offloaded is None
    assert "offload_optimizer" not in kept.empty_reason.params


def test_no_plan_names_the_optimizer_kept_on_the_device_where_that_is_why():
    # Llama 2 70B on 32 TPU v5e: the state in 16 bytes a parameter needs 65 of them, with
    # the optimizer's 12 on the host 17 (the test above): the pinned choice is why
    kept = plan("70b", 32, hardware="tpu-v5e", workers=0, compiler="cpu", offload_optimizer=False)
    why = kept.empty_reason
    assert kept.plans == () and (why.values.least_devices, why.values.least_devices_offloaded) == (
        65,
        17,
    )
    assert "offload_optimizer" in why.params
    assert "on the device (offload_optimizer=False); with it on the host 17 devices" in why.text
    assert "leave offload_optimizer to the planner, or use at least 65 devices" in why.text


def test_the_table_holds_the_best_plan_of_each_strategy():
    # compile_top=1 compiles the single best strategy-and-mesh pair; the best of each other
    # strategy that fits is compiled too, so the table can show each one's best.
    names = ["dp", "fsdp", "zero1", "zero2"]
    result = plan(
        "tiny", 8, workers=0, strategies=names, compile_top=1, stages=1, microbatches=1,
        remat="none", compiler="cpu",
    )  # fmt: skip
    assert sorted(p.strategy for p in result.plans) == sorted(names)


@pytest.mark.slow
def test_a_plan_beyond_2048_devices_compiles_one_pipeline_stage():
    # A 7B model on 4096 devices: without stages each program needs all 4096 simulated
    # devices (skipped, saying so); with 2 to 16 stages one stage's program needs 2048 to 256.
    result = plan(
        "7b",
        4096,
        workers=1,
        strategies=["fsdp"],
        compile_top=1,
        microbatches=1,
        remat="full",
        compiler="cpu",
    )
    too_big = [s for s in result.skipped if s.reason == "simulation"]
    assert [s.mesh for s in too_big] == ["data=4096"]
    assert "needs 4096 simulated devices" in too_big[0].message
    (p,) = result.plans
    assert p.stages > 1 and math.prod(p.mesh.values()) == 4096
    assert p.collectives and all("stage" not in c.axes for c in p.collectives)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(devices=0), "must be a positive whole number"),
        (dict(devices=2**21), "at most 1,048,576 devices"),
        # 17 x 241 devices and 4 layers: no stage count divides both, so every program would
        # need all 4097 simulated devices.
        (dict(devices=4097), "more than the 2048 simulated devices .* smallest needs 4097"),
        (dict(mode="decode"), "mode 'decode'"),
        (dict(strategies=["zero3"]), "unknown strategy 'zero3'"),
        (dict(model=None), "missing d_model, heads, ff, layers"),
        (dict(bytes_per_param=2), "bytes_per_param=2"),
        (dict(workers=-1), "workers=-1"),
        (dict(batch=10**20), "batch=100000000000000000000: .* up to 1048576"),
        (dict(d_model=10**20), "d_model=.* up to 1048576"),  # no divisor search for minutes
        (dict(batch=2**20, seq=2**20, vocab=2**20), "largest array would hold"),
    ],
)
def test_bad_requests_raise_plan_errors(kwargs, words):
    args = {"model": "tiny", "devices": 8, **kwargs}
    with pytest.raises(PlanError, match=words):
        plan(**args, compiler="cpu")


def test_unknown_hardware_is_an_error():
    with pytest.raises(ShardscopeError, match="unknown hardware preset 'v100'"):
        plan("tiny", 8, hardware="v100", compiler="cpu")
    with pytest.raises(ShardscopeError, match="link_bandwidth"):
        plan("tiny", 8, hardware_overrides={"link_bandwidth": -1.0}, compiler="cpu")


def test_in_process_planning_needs_the_devices():
    assert can_compile_here(8) and not can_compile_here(16)
    assert default_workers(8) == 0 and default_workers(16) == 1
    with pytest.raises(PlanError, match="needs 16 CPU devices but JAX has 8"):
        plan("tiny", 16, strategies=["dp"], workers=0, compiler="cpu")


# -- renderers ---------------------------------------------------------------------------------


def test_renderers_show_the_best_plan(sweep, tmp_path):
    from rich.console import Console

    from shardscope._src.render.plan import markdown_report, render_plan
    from shardscope._src.render.plan_plot import plot_plans

    console = Console(record=True, width=160, file=io.StringIO())
    render_plan(sweep, console=console)
    text = console.export_text()
    best = sweep.plans[0]
    assert best.strategy in text and best.mesh_spec in text and "Skipped" not in text
    report = markdown_report(sweep)
    for heading in (
        "## Ranked plans",
        "## Memory per device",
        "## Communication per axis",
        "## Validation",
        "## Conventions and caveats",
    ):
        assert heading in report
    assert f"Best: **{best.label}**" in report
    image = read_png(plot_plans(sweep, tmp_path / "plans.png"))
    assert_drawn(image, 880, 572)  # 8 x 5.2 inches at 110 dpi
    # A colour a strategy, in ranking order, each in the legend and on the chart; the
    # best plan's marker hides under the gold star (also in the legend).
    strategies = list(dict.fromkeys(p.strategy for p in sweep.plans))
    assert len(strategies) == len(SWEPT)
    for i, strategy in enumerate(strategies):
        shown = len(patches(image, f"C{i}"))
        assert shown >= (1 if strategy == best.strategy else 2), strategy
    assert len(patches(image, "gold")) == 2
    empty = replace(sweep, plans=())
    blank = read_png(plot_plans(empty, tmp_path / "empty.png"))
    assert blank.shape == image.shape and (blank < 250).any()  # the title and the reason
    assert not any(patches(blank, c) for c in ("C0", "C1", "gold"))
    assert "**no plan for tiny" in markdown_report(empty)


def test_the_terminal_shows_a_plans_schedule_and_what_its_compiler_said_of_its_memory(sweep):
    from rich.console import Console

    from shardscope._src.base.notes import Note
    from shardscope._src.plan.notes import PlanNote
    from shardscope._src.render.plan import render_plan

    best, second, *rest = sweep.plans
    pressure = {
        "compiler": "XLA:GPU",
        "limit_bytes": 3 * 2**30,
        "reached_bytes": 5 * 2**30,
        "original_bytes": 6 * 2**30,
    }
    squeezed = replace(second, notes=(*second.notes, Note(PlanNote.MEMORY_PRESSURE, pressure)))
    offloaded = replace(best, offload_optimizer=True)
    console = Console(record=True, width=200, file=io.StringIO())
    render_plan(replace(sweep, plans=(offloaded, squeezed, *rest)), console=console)
    text = console.export_text()
    # the optimizer on the host is in the schedule, where its step's time comes from
    assert "m=1, none, opt. on host" in text
    # the compiler's word on the second plan's memory reaches the terminal, named by plan
    assert (
        f"note: plan {second.rank} ({second.label}): the XLA:GPU compiler could not bring the "
        "program under 3 GiB per device by rematerialization: it needs 5 GiB" in text
    )


def test_the_terminal_says_which_memory_a_fit_is_judged_on_where_the_other_would_differ(sweep):
    from rich.console import Console

    from shardscope._src.render.plan import render_plan

    (p, *_) = [p for p in sweep.plans if any(n.kind == PlanNote.FIT_ON_ESTIMATE for n in p.notes)]
    other = p.compiled_memory.buffer_bytes + p.memory.device_optimizer
    low, high = sorted((p.memory.total, other))
    line = f"note: plan {p.rank} ({p.label}): the fit is judged on the analytic estimate"

    def shown(limit, verbose):
        plan = replace(p, memory_limit_bytes=limit)
        console = Console(record=True, width=400, file=io.StringIO())
        render_plan(replace(sweep, plans=(plan,)), console=console, verbose=verbose)
        return line in console.export_text()

    # between the two figures the choice decides the fit: said even in brief
    assert shown((low + high) // 2, verbose=False)
    # above both it decides nothing: said only when verbose
    assert not shown(2 * high, verbose=False)
    assert shown(2 * high, verbose=True)


def test_in_brief_one_plan_s_fit_note_keeps_the_other_figure_on_a_narrow_terminal(sweep):
    """The note is shown because the other figure would judge the fit otherwise: that figure,
    which comes late in the note, is printed even where the note is wider than the console."""
    from rich.console import Console

    from shardscope._src.base.comm import format_bytes
    from shardscope._src.render.plan import render_plan

    (p, *_) = [p for p in sweep.plans if any(n.kind == PlanNote.FIT_ON_ESTIMATE for n in p.notes)]
    other = p.compiled_memory.buffer_bytes + p.memory.device_optimizer
    plan = replace(p, memory_limit_bytes=(p.memory.total + other) // 2)
    console = Console(record=True, width=100, file=io.StringIO())
    render_plan(replace(sweep, plans=(plan,)), console=console, verbose=False)
    brief = " ".join(console.export_text().split())
    start = f"note: plan {p.rank} ({p.label}): the fit is judged on the analytic estimate"
    assert start in brief
    note = brief[brief.index(start) :]
    assert f"compiler's {format_bytes(other)}" in note
    assert "no device's" in note and "…" not in note


def test_in_brief_the_plans_whose_fit_the_other_figure_would_decide_share_one_line(sweep):
    from rich.console import Console

    from shardscope._src.base.comm import format_bytes
    from shardscope._src.render.plan import render_plan

    noted = [p for p in sweep.plans if any(n.kind == PlanNote.FIT_ON_ESTIMATE for n in p.notes)]
    assert len(noted) >= 2

    def limit(p):  # between the two figures: the choice decides the fit
        other = p.compiled_memory.buffer_bytes + p.memory.device_optimizer
        return (p.memory.total + other) // 2

    plans = tuple(replace(p, memory_limit_bytes=limit(p)) for p in noted[:2])

    def text(verbose):
        console = Console(record=True, width=800, file=io.StringIO())
        render_plan(replace(sweep, plans=plans), console=console, verbose=verbose)
        return console.export_text()

    brief = text(verbose=False)
    (line,) = [x for x in brief.splitlines() if x.startswith("note: plans ")]
    assert line.startswith(f"note: plans {plans[0].rank} and {plans[1].rank}: each fit is judged")
    low = min(p.memory.total for p in plans)
    assert format_bytes(low) in line and "no device's" in line
    assert "note: plan " not in brief.replace("note: plans ", "")
    # in full, a line a plan, as before
    full = text(verbose=True)
    assert all(f"note: plan {p.rank} ({p.label}): the fit is judged" in full for p in plans)
    assert "note: plans " not in full


# -- the command -------------------------------------------------------------------------------


def test_plan_command_writes_json_png_and_report(tmp_path, capsys):
    from shardscope._src.cli.main import main

    out = tmp_path / "out"
    code = main(
        [
            "plan",
            "--model",
            "tiny",
            "--devices",
            "8",
            "--strategies",
            "dp,tp",
            "--hardware",
            "tpu-v5e",
            "--compiler",
            "cpu",
            "--link-bandwidth",
            "1e11",
            *ONE_SCHEDULE,
            "--json",
            str(out / "p.json"),
            "--png",
            str(out / "p.png"),
            "--report",
            str(out / "p.md"),
        ]
    )
    assert code == 0
    data = json.loads((out / "p.json").read_text())
    # Both plans, ranked: those that fit first, then by step time.
    assert sorted(p["strategy"] for p in data["plans"]) == ["dp", "tp"]
    assert [p["rank"] for p in data["plans"]] == [1, 2]
    keys = [(not p["fits"], p["step_time_s"]) for p in data["plans"]]
    assert keys == sorted(keys)
    assert data["hardware"]["name"] == "tpu-v5e"
    assert data["hardware"]["link_bandwidth"] == 1e11
    image = read_png(out / "p.png")
    assert_drawn(image, 880, 572)
    assert len(patches(image, "C0")) >= 1 and len(patches(image, "C1")) >= 1
    assert len(patches(image, "gold")) == 2  # the best plan's star, and the legend's
    assert (out / "p.md").read_text().startswith("# Sharding plan: tiny on 8 x tpu-v5e")
    printed = capsys.readouterr().out
    # piped, the plan table is as wide as its cells: none is cut short ('...')
    header = next(line for line in printed.splitlines() if "strategy" in line)
    assert header.split() == ["#", "strategy", "mesh", "schedule", "mem/dev", "memory",
                              "by", "fits", "comm/dev", "x", "bound", "comm", "compute",
                              "rest", "step", "MFU"]  # fmt: skip
    for p in data["plans"]:
        ranks = ([str(p["rank"])], [f"{p['rank']}*"])
        (row,) = [
            line
            for line in printed.splitlines()
            if line.split()[:1] in ranks and f" {p['mesh']} " in line
        ]
        assert "\u2026" not in row and row.split()[1:3] == [p["strategy"], p["mesh"]]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["plan", "--model", "8b", "--devices", "8"], "unknown model preset '8b'"),
        (["plan", "--model", "tiny"], "required: --devices"),
        (["plan", "--model", "tiny", "--devices", "0"], "0 must be a positive whole number"),
        (
            ["plan", "--model", "tiny", "--devices", "4097", "--compiler", "cpu"],
            "more than the 2048 simulated",
        ),
        (
            ["plan", "--devices", "8", "--heads", "8"],
            "missing d_model, ff, layers (flags --d-model, --ff, --layers)",
        ),
        (
            ["plan", "--model", "tiny", "--devices", "8", "--hardware", "v100"],
            "invalid choice: 'v100'",
        ),
        (
            ["plan", "--model", "tiny", "--devices", "8", "--memory", "-5"],
            "must be a positive number",
        ),
        (
            ["plan", "--model", "tiny", "--devices", "8", "--memory", "lots"],
            "not a number of bytes (e.g. 80e9, 80GB or 79.1GiB)",
        ),
        (
            # a size with its unit reads as the bytes it names: 1 KiB, then too little
            ["plan", "--model", "tiny", "--devices", "8", "--memory", "1KiB"],
            "needs more than the 1 KiB of one h100",
        ),
        (
            ["plan", "--model", "tiny", "--devices", "8", "--memory", "1000"],
            # the library names no flag; the command line adds the flags of its parameters
            "more memory per device, or fewer bytes per parameter "
            "(flags --devices, --hardware, --memory, --bytes-per-param)",
        ),
        (
            [
                "plan",
                "--model",
                "tiny",
                "--devices",
                "8",
                "--batch",
                "3",
                "--strategies",
                "dp,fsdp",
            ],
            "skipped for divisibility",
        ),
        (
            ["plan", "--model", "tiny", "--devices", "8", "--strategies", "dp,zero3"],
            "unknown strategy 'zero3'",
        ),
    ],
)
def test_plan_command_bad_input_is_one_line_exit_2(argv, words, capsys):
    # with no plan at all, the table of what was skipped, and why, still goes to stdout
    assert_usage_error(argv, words, capsys, quiet=False)


def test_plan_command_refuses_a_bad_output_path_before_compiling(tmp_path, capsys):
    argv = ["plan", "--model", "tiny", "--devices", "8", "--json", str(tmp_path)]
    assert_usage_error(argv, "is a folder, not a file", capsys)


# -- more devices than this process has ------------------------------------------------------


def test_plan_for_16_devices_in_a_subprocess(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    out = tmp_path / "plan.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardscope",
            "plan",
            "--model",
            "tiny",
            "--devices",
            "16",
            "--strategies",
            "dp,tp,dp_tp",
            *ONE_SCHEDULE,
            "--compile-top",
            "4",
            "--compiler",
            "cpu",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["workers"] == 0  # the command simulated 16 devices in its own process
    labels = sorted(f"{p['strategy']} {p['mesh']}" for p in data["plans"])
    assert labels == sorted(
        [
            "dp data=16",
            "dp_tp data=8,model=2",
            "dp_tp data=4,model=4",
            "dp_tp data=2,model=8",
        ]
    )
    assert [(s["strategy"], s["mesh"], s["reason"]) for s in data["skipped"]] == [
        ("tp", "model=16", "divisibility")  # 8 heads
    ]
    keys = [(not p["fits"], p["step_time_s"]) for p in data["plans"]]
    assert keys == sorted(keys)
    row = next(p for p in data["plans"] if p["mesh"] == "data=2,model=8")
    assert row["comm_bytes_per_device"] == row["bound_bytes_per_device"]


@pytest.mark.slow
def test_plan_for_more_devices_through_a_worker():
    # this process has 8: one worker simulates 16
    result = plan(
        "tiny", 16, strategies=["dp"], stages=1, microbatches=1, remat="none", compiler="cpu"
    )
    assert result.workers == 1
    assert [p.label for p in result.plans] == ["dp data=16"]
    dp = result.plans[0]
    assert dp.comm_bytes_per_device == dp.bound_bytes_per_device


@pytest.mark.slow
def test_worker_pool_reports_a_failing_task_and_finishes_the_rest():
    from shardscope._src.plan.worker import WorkerError, run_tasks
    from shardscope._src.train.compile import CompileTask
    from shardscope._src.train.types import CompiledFacts

    config = TINY.config(batch=16)
    tasks = [CompileTask(StageProgram(s, "data=16", config, "forward")) for s in ("dp", "zero3")]
    got = dict(run_tasks(tasks, devices=16, workers=2))
    assert isinstance(got[0], CompiledFacts) and got[0].collectives == ()
    assert isinstance(got[1], WorkerError)
    assert "StrategyError: unknown strategy 'zero3'" in str(got[1])


def test_no_best_plan_when_none_fits():
    from shardscope import plan

    # 7.5 MB of device memory, and no host memory to offload to (sp with the vocabulary split
    # over 'model' fits 8 MB, the least of any strategy): searched over dp, whose model state
    # alone is over it (skipped, not compiled), and sp, the closest (its two leading plans
    # compiled, not the seven of six strategies a search of every strategy compiles)
    small = {"memory_bytes": 7.5e6, "host_memory_bytes": 0}
    result = plan("tiny", 8, hardware_overrides=small, compiler="cpu", strategies=["dp", "sp"])
    assert result.plans and not any(p.fits for p in result.plans)
    assert result.best is None
    note = result.fit_note
    assert note.kind == "no-fit" and note.values.searched
    assert note.values.need > note.values.have == 7_500_000
    assert note.text.startswith("no plan fits, even with full recomputation")
    assert "over" in note.text and "--" not in note.text
    assert note.params == ("devices", "batch", "seq", "memory_bytes")
    data = result.to_dict()
    assert data["best"] is None and data["fit_note"] == note.to_dict()
    # a plan a device cannot hold is on no memory-time front
    assert not any(p.pareto for p in result.plans)


def test_no_fit_names_what_the_request_pinned_not_a_search_it_did_not_make():
    from shardscope import plan

    small = {"memory_bytes": 7.5e6, "host_memory_bytes": 0}
    result = plan(
        "tiny", 8, hardware_overrides=small, compiler="cpu", strategies=["sp"], mesh="model=8",
        remat="none",
    )  # fmt: skip
    assert result.plans and result.best is None
    note = result.fit_note
    assert note.values.pinned == ("remat none", "mesh model=8")
    assert note.text.startswith("no plan fits with what the request pinned (remat none, mesh")
    assert "even with full recomputation" not in note.text
    assert "leave remat and mesh to the planner, or use more devices" in note.text
    assert note.params == ("remat", "mesh", "devices", "batch", "seq", "memory_bytes")
    assert not any(p.pareto for p in result.plans)


def test_the_communication_table_wraps_the_plan_and_keeps_every_figure_whole(sweep):
    import io

    from rich.console import Console

    from shardscope._src.base.comm import format_bytes, format_seconds
    from shardscope._src.render.plan import comm_table

    # a terminal narrower than the plan's name and its figures side by side
    console = Console(record=True, width=96, file=io.StringIO())
    console.print(comm_table(sweep, top=len(sweep.plans)))
    text = console.export_text()
    assert "…" not in text
    for p in sweep.plans:
        for a in p.comm:
            for figure in (str(a.count), format_bytes(a.traffic_bytes), format_seconds(a.time_s)):
                assert figure in text


def test_the_communication_table_says_what_a_sub_axis_is(sweep):
    from shardscope._src.render.plan import comm_sections, comm_table

    # XLA splits data=4 into two factors of 2 for some collectives and names each as Shardy
    # does: the table's note reads the label back
    p = sweep.plans[0]
    split = replace(p, comm=(replace(p.comm[0], axes="data:(1)2,model"),))
    caption = comm_table(replace(sweep, plans=(split,)), top=1).caption
    assert caption.startswith("data:(1)2: a part of the mesh axis data the compiler split")
    assert any(line.startswith("- data:(1)2: a part") for line in comm_sections([split], []))
    assert all(":(" not in a.axes for a in p.comm)
    assert comm_table(replace(sweep, plans=(p,)), top=1).caption is None


def test_the_comm_column_is_the_communication_the_step_prices():
    import io

    from rich.console import Console

    from shardscope import plan
    from shardscope._src.base.comm import format_seconds
    from shardscope._src.render.plan import plan_table

    # XLA:CPU forms no reduce-scatter: FSDP's gradients leave as all-reduces of twice the
    # bytes, which the step prices as the reduce-scatters the H100's compiler forms
    result = plan("tiny", 8, strategies=["fsdp"], mesh="data=8", compiler="cpu", workers=0)
    p = result.plans[0]
    t = p.time
    assert t.comm_s == t.tp_comm_s + t.data_comm_s + t.p2p_s
    assert t.comm_s < p.comm_time_s
    console = Console(record=True, width=250, file=io.StringIO())
    console.print(plan_table(result))
    row = next(line for line in console.export_text().splitlines() if " fsdp " in line)
    assert f" {format_seconds(t.comm_s)} " in row
    assert f" {format_seconds(p.comm_time_s)} " not in row
    # and what the step takes beyond its compute, so the columns account for the step
    assert f" {format_seconds(t.step_s - t.compute_s)} " in row


def test_a_micro_batch_count_no_data_shard_splits_into_names_the_counts_that_do():
    from shardscope import plan

    # tiny's 8 sequences over 8 data shards: one a shard, which 3 micro-batches cannot split;
    # every layout of 8 devices shards the data 8, 4, 2 or 1 ways (1, 2, 4 or 8 a shard)
    result = plan("tiny", 8, microbatches=3, compiler="cpu", workers=0)
    assert not result.plans
    reason = result.empty_reason
    assert "microbatches=3 does not divide the 1 sequence of a data shard (batch 8 over 8)" in (
        reason.text
    )
    assert "give microbatches dividing 1, or a batch of a multiple of 24" in reason.text
    assert reason.params[:2] == ("microbatches", "batch")


def test_model_flops_count_what_their_convention_says_of_a_gated_grouped_query_model():
    from shardscope._src.model.presets import model_preset
    from shardscope._src.plan.estimates import FLOPS_CONVENTION, model_flops

    # Llama 3 8B: 32 layers of d_model 4096, 32 query heads and 8 key/value heads of 128, a
    # gated MLP of 14,336 (three matrices), vocabulary 128,256; 8 sequences of 8,192
    h, layers, ff, vocab, seq, batch = 4096, 32, 14336, 128256, 8192, 8
    kv = 8 * 128
    layer = h * h + 2 * h * kv + h * h + 3 * h * ff  # q, k and v, out, gate, up and down
    core = 4 * seq * 32 * 128  # QK^T and PV a token a layer, against the whole sequence
    tokens = batch * seq
    forward = 2 * tokens * (layers * layer + h * vocab) + tokens * layers * core
    config = model_preset("llama3-8b").config(batch=batch, seq=seq)
    assert model_flops(config) == 3 * forward
    assert model_flops(config, "forward") == forward
    # and the convention written into every result says so
    assert "three where the MLP is gated" in FLOPS_CONVENTION
    assert "key and value projections at their heads" in FLOPS_CONVENTION


def test_a_strategy_screened_and_not_compiled_is_named_with_its_best_plan():
    from shardscope._src.targets.hardware import hardware
    from shardscope._src.train.candidates import estimate
    from shardscope._src.train.sweep import not_compiled
    from shardscope._src.train.types import Candidate

    # a default sweep compiles a composed strategy (zero1_sp, ...) only among its best pairs:
    # screened plans of two strategies, in rank order, of which one strategy's is compiled
    h100, config = hardware("h100"), TINY.config(batch=8)
    zero1_sp = [estimate(Candidate("zero1_sp", m, 1, "none"), config, h100)
                for m in ("data=4,model=2", "data=2,model=4")]  # fmt: skip
    fsdp = estimate(Candidate("fsdp", "data=8", 1, "none"), config, h100)
    ranked = sorted([*zero1_sp, fsdp], key=lambda s: s.step_time_s)
    note = not_compiled(ranked, [fsdp])
    best = min(zero1_sp, key=lambda s: s.step_time_s)
    assert note.values.strategies == ("zero1_sp",)
    assert note.values.labels == (best.candidate.label,)
    assert note.values.estimates == (best.step_time_s,)
    assert note.params == ("compile_top", "strategies")
    assert note.text.startswith("not compiled, so not in the table: zero1_sp (")
    # one that does not fit is not named; every strategy compiled, nothing is
    tight = hardware("h100", memory_bytes=1e3)
    misfit = estimate(Candidate("zero1_sp", "data=4,model=2", 1, "none"), config, tight)
    assert not misfit.fits and not_compiled([misfit, fsdp], [fsdp]) is None
    assert not_compiled(ranked, [fsdp, best]) is None


def test_the_headline_says_the_overlaps_a_request_sets_other_than_its_hardwares(sweep):
    from shardscope._src.render.plan import headline
    from shardscope._src.targets.hardware import hardware

    assert "overlapped" not in headline(replace(sweep, hardware=hardware("h100")))
    off = replace(sweep, hardware=hardware("h100", fsdp_overlap=False, ep_overlap=True))
    assert headline(off).endswith(
        "989 TFLOP/s each; expert all-to-alls overlapped; FSDP collectives not overlapped"
    )
