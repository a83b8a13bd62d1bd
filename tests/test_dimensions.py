"""Parallelism as orthogonal dimensions: today's names are exactly the compositions of their
dimensions, every composition is named and placed by the naming rule, the new combinations'
collectives, memory and sweep (Megatron-LM's default: tensor and sequence parallel, context
parallel, pipeline stages with virtual stages, the distributed optimizer), and their errors."""

import shardscope

shardscope.use_cpu_devices(8)

import json  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.comm import ALL_GATHER, ALL_REDUCE  # noqa: E402
from shardscope._src.base.errors import PlanError, StrategyError  # noqa: E402
from shardscope._src.bounds.transformer import transformer_bound  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.model.presets import model_preset  # noqa: E402
from shardscope._src.plan.estimates import estimate_memory  # noqa: E402
from shardscope._src.plan.request import DEFAULT_STRATEGIES, PlanRequest  # noqa: E402
from shardscope._src.sharding.parallelism import DataParallel, Parallelism, Tensor  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import (  # noqa: E402
    ALL_STRATEGIES,
    PRESETS,
    STRATEGIES,
    abstract_mesh,
    compose,
    get_strategy,
    mesh_spec_for,
)
from shardscope._src.targets.hardware import hardware  # noqa: E402
from shardscope._src.train.candidates import pinned_mesh, screen_all, to_compile  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "strategies" / "presets.json"
# The configs the fixture's placements were taken on.
DENSE = ModelConfig(d_model=64, heads=8, kv_heads=4, ff=128, layers=2, batch=8, seq=16, vocab=256)
MOE = ModelConfig(
    d_model=64, heads=8, ff=128, layers=2, batch=8, seq=16, vocab=256, mlp="swiglu",
    experts=8, top_k=2, expert_ff=32, shared_experts=1,
)  # fmt: skip
# d_model 32, 8 heads (8 key/value heads) of 4, ff 64, f32; 8 sequences of 8 tokens.
TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, prefix + k + "/"))
        else:
            out[prefix + k] = v
    return out


def _placed(s, config, mesh):
    try:
        p = s.place(config, abstract_mesh(mesh))
    except StrategyError as e:
        return {"error": str(e)}
    points = ("residual", "enter", "heads", "hidden", "keys")
    return {
        "axes": {k: list(v) for k, v in p.axes.items()},
        "params": {k: str(v) for k, v in sorted(_flat(p.param_specs()).items())},
        "grads": {k: str(v) for k, v in sorted(_flat(p.grad_specs()).items())},
        "optimizer": {k: str(v) for k, v in sorted(_flat(p.optimizer_specs()).items())},
        "activations": {k: str(p.activation_spec(k)) for k in points},
        "batch": [str(x) for x in p.batch_specs()],
        "output": str(p.output_spec()),
    }


def _snapshot(s):
    """A strategy's rules, its mesh names on four shapes and its placements on them."""
    out = {"rules": json.loads(json.dumps(s.to_dict(), default=str))}
    shapes = [(8,), (2, 4), (4, 2), (2, 2, 2)]
    out["mesh_spec_for"] = {",".join(map(str, sh)): mesh_spec_for(s, sh) for sh in shapes}
    config = MOE if s.expert_parallel else DENSE
    out["placed"] = {m: _placed(s, config, m) for m in set(out["mesh_spec_for"].values())}
    return out


# -- the presets are their dimensions' compositions ------------------------------------------


@pytest.fixture(scope="module")
def frozen():
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_the_composition_of_its_dimensions(frozen, name):
    composed = compose(Parallelism.parse(name))
    assert composed == STRATEGIES[name]
    assert _snapshot(composed) == frozen[name]["plain"]
    # (the split under sequence parallelism is newer than the fixture: test_vocab_split.py)
    if composed.splits_vocab and not composed.sequence_parallel:
        assert _snapshot(composed.with_vocab_split()) == frozen[name]["vocab_split"]


def test_the_names_round_trip_and_every_composition_is_accepted():
    # six data flavours x three tensor choices x context on or off, and with experts five
    # data flavours (none, dp, zero1, zero2, fsdp) x the three tensor choices x context on or
    # off; the ring form of each with context but HSDP's; and folded over the model axis (sp,
    # without context) each of the five
    assert len(ALL_STRATEGIES) == 6 * 3 * 2 + 5 * 3 * 2 + (5 * 3 + 5 * 3) + 5
    assert list(ALL_STRATEGIES)[: len(PRESETS)] == list(STRATEGIES) == list(PRESETS)
    for name, s in ALL_STRATEGIES.items():
        assert Parallelism.parse(name).name == name == s.name
        assert get_strategy(name) is s
    megatron = Parallelism(DataParallel.ZERO1, Tensor.SP, context=True)
    assert megatron.name == "zero1_sp_cp"
    PlanRequest("tiny", 8, strategies=["zero1_sp_cp", "hsdp_tp"])  # accepted


def test_megatron_default_places_the_optimizer_over_data_and_context():
    p = get_strategy("zero1_sp_cp").place(TINY, abstract_mesh("data=2,context=2,model=2"))
    assert p.param_specs()["layers"]["w_up"] == P(None, None, "model")
    assert p.optimizer_specs()["layers"]["w_up"] == P(None, ("data", "context"), "model")
    assert p.activation_spec("residual") == P("data", ("context", "model"), None)
    assert p.activation_spec("keys") == P("data", None, "model", None)


def test_distributed_optimizer_divides_the_optimizer_state_by_the_data_ranks():
    def optimizer(name, mesh):
        return estimate_memory(get_strategy(name).place(TINY, abstract_mesh(mesh))).optimizer

    assert optimizer("zero1_sp", "data=4,model=2") * 4 == optimizer("dp_sp", "data=4,model=2")
    mesh = "data=2,context=2,model=2"
    assert optimizer("zero1_sp_cp", mesh) * 2 * 2 == optimizer("dp_sp_cp", mesh)
    # one layer's keys and values gathered: 8/2 sequences x 8 tokens x 8/2 heads of 4, f32
    placement = get_strategy("zero1_sp_cp").place(TINY, abstract_mesh(mesh))
    assert estimate_memory(placement).gathered_kv == 2 * 4 * 8 * 4 * 4 * 4


def test_tensor_and_context_parallel_forward_collectives_equal_the_bound():
    """Under tensor and context parallelism together, each device's tensor-parallel sums hold
    its own tokens (``seq / c``) and the keys and values it gathers its own heads (``/ t``):
    what XLA:CPU compiles, exactly."""
    program = build_reference_program("dp_tp_cp", TINY, "data=2,context=2,model=2")
    compiled = {}
    for c in audit(program.lower()).collectives:
        n, payload = compiled.get((tuple(c.axes), c.kind), (0, 0))
        compiled[(tuple(c.axes), c.kind)] = (n + c.count, payload + c.count * c.payload_bytes)
    bound = {}
    for t in transformer_bound(program.placement, "forward").terms:
        n, payload = bound.get((tuple(t.axes), t.kind), (0, 0))
        bound[(tuple(t.axes), t.kind)] = (n + t.totals.count, payload + t.totals.payload_bytes)
    assert compiled == bound
    # 2 layers x 2 row-parallel sums of 8/2 sequences x 8/2 tokens x 32 x 4 B
    assert bound[(("model",), ALL_REDUCE)] == (2 * 2, 2 * 2 * 4 * 4 * 32 * 4)
    # 2 layers x keys and values of 8/2 sequences x 8 tokens x 8/2 heads x 4 x 4 B
    assert bound[(("context",), ALL_GATHER)] == (2 * 2, 2 * 2 * 4 * 8 * 4 * 4 * 4)


# -- the planner -----------------------------------------------------------------------------


def test_a_pinned_megatron_mesh_finds_its_strategy():
    mesh = "stage=4,data=2,context=2,model=4"
    assert pinned_mesh(mesh, 64, DEFAULT_STRATEGIES) == {
        "stage": 4, "data": 2, "context": 2, "model": 4
    }  # fmt: skip
    with pytest.raises(PlanError, match="the strategies that run on it: .*zero1_sp_cp"):
        pinned_mesh(mesh, 64, ["dp_tp"])


def test_llama3_70b_as_nemo_runs_it_fits_without_host_memory():
    """Llama 3.1 70B at TP 4 x PP 4 x CP 2 x VP 5 with the distributed optimizer on 64 H100s
    (NeMo's recipe: 128 sequences of 8192, one per micro-batch)."""
    config = model_preset("llama3-70b").config(batch=128)
    ranked, skipped, pairs = screen_all(
        config, 64, hardware("h100"), ["zero1_sp_cp"], microbatches=64, virtual_stages=5,
        mesh={"stage": 4, "data": 2, "context": 2, "model": 4},
    )  # fmt: skip
    assert pairs == 1 and not skipped
    best = ranked[0]
    assert best.fits and not best.memory.optimizer_on_host
    assert best.candidate.virtual_stages == 5


def test_nemotron4_15b_fits_with_the_distributed_optimizer_and_not_without():
    config = model_preset("nemotron4-15b").config(batch=64)
    # The vocabulary whole on every tensor-parallel rank: split over them, dp_sp's 16 bytes
    # a parameter fit too (77 of the 80 GB).
    kw = dict(mesh={"data": 4, "model": 4}, remat="none", vocab_split=False)
    zero1 = screen_all(config, 16, hardware("h100"), ["zero1_sp"], **kw)[0][0]
    dp = screen_all(config, 16, hardware("h100"), ["dp_sp"], **kw)[0][0]
    assert zero1.fits and not zero1.memory.optimizer_on_host
    assert dp.memory.optimizer_on_host  # the whole optimizer state on every data rank
    assert zero1.step_time_s < dp.step_time_s


def test_a_default_sweep_compiles_its_compositions_only_among_the_best_pairs():
    def screened(name, mesh, step, fits=True):
        return SimpleNamespace(
            candidate=SimpleNamespace(strategy=name, mesh_spec=mesh), fits=fits, step_time_s=step
        )

    ranked = [screened("zero1_sp", "data=4,model=2", 1.0), screened("dp", "data=8", 2.0)]
    ranked += [screened("dp_sp_cp", "data=2,context=2,model=2", 3.0)]
    ranked += [screened("fsdp", "data=8", 4.0)]
    chosen = to_compile(ranked, 1, ["dp", "fsdp"])
    assert [s.candidate.strategy for s in chosen] == ["zero1_sp", "dp", "fsdp"]
    assert len(to_compile(ranked, 1)) == 4  # every strategy's best when asked for by name


# -- bad input -------------------------------------------------------------------------------


def test_a_combination_the_rules_do_not_compose_is_named_with_the_fix():
    with pytest.raises(PlanError, match=r"hsdp_ep_cp: expert .* not with HSDP; .*fsdp_ep_cp,"):
        PlanRequest("tiny", 8, strategies=["hsdp_ep_cp"])
    with pytest.raises(StrategyError, match=r"hsdp_ep_tp: .*choose e.g. fsdp_ep_tp, or hsdp_tp"):
        get_strategy("hsdp_ep_tp")
    with pytest.raises(StrategyError, match=r"unknown strategy 'sp_dp'.*'dp' does not read"):
        Parallelism.parse("sp_dp")
    with pytest.raises(StrategyError, match=r"unknown strategy 'sp_dp'; choose a preset"):
        get_strategy("sp_dp")
    with pytest.raises(
        StrategyError, match=r"hsdp_ep_sp: expert .* not with HSDP; .*fsdp_ep_sp, or"
    ):
        get_strategy("hsdp_ep_sp")


def test_context_parallel_over_a_sequence_that_does_not_divide():
    config = replace(TINY, seq=10)
    with pytest.raises(StrategyError, match=r"seq=10 .* context=4 \(4 ways\).*seq=8"):
        get_strategy("zero1_sp_cp").place(config, abstract_mesh("data=1,context=4,model=2"))
