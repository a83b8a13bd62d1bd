"""One request type for a plan of the built-in model: every knob and its default live on
:class:`PlanRequest`; ``plan()``'s keywords and the ``shardscope plan`` options map onto it."""

import dataclasses
import inspect

import pytest

import shardscope
from helpers import assert_usage_error, sub_parser
from shardscope import MeshSpecError, PlanError, PlanRequest, ShardscopeError
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.train import sweep
from shardscope._src.train.candidates import MOE_STRATEGIES

FIELDS = {f.name: f for f in dataclasses.fields(PlanRequest)}


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _cli_request(*argv: str) -> PlanRequest:
    return command_config(build_parser().parse_args(["plan", *argv])).request()


# -- every default lives once ------------------------------------------------------------------


def test_plan_takes_the_request_fields_with_their_defaults():
    params = inspect.signature(shardscope.plan).parameters
    # the model and the devices by position, with the request's defaults; every other knob
    # is a keyword that the request itself checks and defaults
    assert [params[k].default for k in ("model", "devices")] == [
        _default(FIELDS["model"]),
        _default(FIELDS["devices"]),
    ]
    assert params["knobs"].kind is inspect.Parameter.VAR_KEYWORD
    with pytest.raises(TypeError, match="token_latency"):
        shardscope.plan("tiny", 8, token_latency=0.1)
    assert PlanRequest() == PlanRequest("7b", 8)


def test_plan_hands_every_keyword_to_the_request(monkeypatch):
    # A value other than the default for every field: plan() forwards each to the request.
    given = dict(
        d_model=64, heads=4, ff=256, layers=2, vocab=512, kv_heads=2, head_dim=8, batch=16,
        seq=32, mode="forward", hardware="tpu-v5p",
        hardware_overrides={"link_bandwidth": 1e11, "fp8_peak_flops": 9e14,
                            "fp8_matmul_fraction": 0.5},
        strategies=["dp", "fsdp"], bytes_per_param=18, flash_attention=False,
        dtype="float32", remat=["none", "full"], microbatches=2, stages=1, compile_top=5,
        compiler="cpu", target_plans=2, mesh="data=8", workers=0, offload_optimizer=False,
        matmul_dtype="fp8",
        fp8_saved_inputs="fp8",
        fp8_params=1,
        vocab_split=True,
        imbalance=1.5,
        dispatch_once=True,
        weight_activations=True,
        virtual_stages=1,
        pipeline_split="embedding+loss",
        offload_layers=3,
        beside_best=True,
    )  # fmt: skip
    assert set(given) == set(FIELDS) - {"model", "devices"}
    assert all(given[k] != _default(FIELDS[k]) for k in given)
    seen = []
    monkeypatch.setattr(sweep, "plan_request", lambda r, progress=None: seen.append(r))
    shardscope.plan(None, 16, **given)
    assert seen == [PlanRequest(None, 16, **given)]


def test_the_command_line_without_options_asks_for_the_request_defaults():
    # --devices is required, and no --model is a model given by its shape: the command line
    # always names both; every other knob takes the request's default.
    assert _cli_request("--devices", "8") == PlanRequest(None, 8)
    assert _cli_request("--devices", "8", "--model", "tiny") == PlanRequest("tiny", 8)


def test_no_plan_option_carries_a_default_of_its_own():
    knobs = [a for a in sub_parser(("plan",))._actions if a.dest in FIELDS]
    assert {a.dest for a in knobs} == set(FIELDS) - {"dtype", "hardware_overrides"}
    for action in knobs:
        assert action.default is None, action.dest


def test_the_help_prints_the_request_defaults():
    helps = {a.dest: a.help for a in sub_parser(("plan",))._actions}
    assert "(default h100)" in helps["hardware"]
    assert "(default train)" in helps["mode"]
    assert "default 3)" in helps["compile_top"]
    assert "(default: 16: mixed-precision Adam)" in helps["bytes_per_param"]
    assert "(default 3)" in helps["target_plans"]
    listed = helps["strategies"].split("(default: ")[1].rstrip(")")
    dense, mixture = listed.split("; for a mixture of experts or latent attention, ")
    assert PlanRequest().strategy_names == tuple(dense.split(","))
    assert MOE_STRATEGIES == tuple(mixture.split(","))


def test_every_option_maps_onto_its_field():
    argv = [
        "--model", "tiny", "--devices", "16", "--d-model", "64", "--heads", "4", "--ff", "256",
        "--layers", "2", "--vocab", "512", "--kv-heads", "2", "--head-dim", "8",
        "--batch", "16", "--seq", "32", "--mode", "forward",
        "--hardware", "tpu-v5p", "--link-bandwidth", "1e11", "--node-size", "4",
        "--strategies", "dp, fsdp", "--remat", "none,full", "--microbatches", "2",
        "--stages", "1", "--mesh", "data=16", "--compile-top", "5", "--bytes-per-param", "18",
        "--no-flash-attention", "--workers", "0", "--compiler", "cpu", "--target-plans", "2",
        "--offload-optimizer", "--matmul-dtype", "fp8", "--fp8-saved-inputs", "fp8",
        "--fp8-params", "1", "--fp8-peak-flops", "9e14",
        "--fp8-matmul-fraction", "0.5", "--no-vocab-split", "--virtual-stages", "1",
        "--imbalance", "1.5", "--dispatch-once", "--weight-activations",
        "--attention-fwd-flops", "3e14",
        "--attention-bwd-flops", "2e14", "--beside-best", "--pipeline-split", "loss",
    ]  # fmt: skip
    assert _cli_request(*argv) == PlanRequest(
        "tiny", 16, d_model=64, heads=4, ff=256, layers=2, vocab=512, kv_heads=2, head_dim=8,
        batch=16, seq=32,
        mode="forward", hardware="tpu-v5p",
        hardware_overrides={"link_bandwidth": 1e11, "node_size": 4, "fp8_peak_flops": 9e14,
                            "fp8_matmul_fraction": 0.5, "attention_fwd_flops": 3e14,
                            "attention_bwd_flops": 2e14},
        strategies=("dp", "fsdp"), remat=("none", "full"), microbatches=2, stages=1,
        mesh="data=16", compile_top=5, bytes_per_param=18, flash_attention=False, workers=0,
        compiler="cpu", target_plans=2, offload_optimizer=True, matmul_dtype="fp8",
        fp8_saved_inputs="fp8", fp8_params=1, vocab_split=False, virtual_stages=1,
        imbalance=1.5,
        dispatch_once=True, weight_activations=True, beside_best=True, pipeline_split="loss",
    )  # fmt: skip


# -- what a request holds ----------------------------------------------------------------------


def test_a_request_keeps_what_it_was_given_whatever_the_caller_changes_later():
    strategies, overrides, mesh = ["dp", "tp", "dp"], {"memory_bytes": 9e6}, {"data": 8}
    r = PlanRequest("tiny", 8, strategies=strategies, hardware_overrides=overrides, mesh=mesh)
    strategies.append("fsdp")
    overrides["memory_bytes"] = 1.0
    mesh["data"] = 4
    assert r.strategies == ("dp", "tp", "dp") and r.strategy_names == ("dp", "tp")
    assert dict(r.hardware_overrides) == {"memory_bytes": 9e6} and dict(r.mesh) == {"data": 8}
    with pytest.raises(TypeError):
        r.hardware_overrides["memory_bytes"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.devices = 16  # type: ignore[misc]
    assert r.dims == dict.fromkeys(
        ("d_model", "heads", "ff", "layers", "vocab", "kv_heads", "head_dim")
    )


def test_a_request_holds_its_mesh_as_one_shape_whatever_form_it_came_in():
    from shardscope._src.mesh import MeshShape

    shape = MeshShape("data=4,model=2")
    forms = ["data=4,model=2", {"data": 4, "model": 2}, (("data", 4), ("model", 2)), shape]
    for given in forms:
        mesh = PlanRequest("tiny", 8, mesh=given).mesh
        assert type(mesh) is MeshShape and mesh == shape
    assert PlanRequest("tiny", 8, mesh="data=8") == PlanRequest("tiny", 8, mesh={"data": 8})
    assert PlanRequest("tiny", 8).mesh is None
    with pytest.raises(MeshSpecError, match=r"'data=8,data=1': axis name 'data' is repeated"):
        PlanRequest("tiny", 8, mesh="data=8,data=1")


@pytest.mark.parametrize(
    "kwargs, words, params",
    [
        (dict(devices=0), "devices=0: must be a positive whole number", ("devices",)),
        (dict(devices=2.0), "devices=2.0: must be a positive whole number", ("devices",)),
        (dict(devices=2**21), "devices=2097152: the planner plans at most 1,048,576", ("devices",)),
        (dict(mode="infer"), "mode 'infer': choose one of train, forward", ("mode",)),
        (dict(workers=-1), "workers=-1: must be 0 (this process) or a positive", ("workers",)),
        (dict(compile_top=-2), "compile_top=-2: must be 0 or a positive", ("compile_top",)),
        (
            dict(strategies=["dp", "zero3"]),
            "unknown strategy 'zero3'; choose from replicated, dp, fsdp",
            ("strategies",),
        ),
        (dict(seq=2**21), "seq=2097152: the planner takes dimensions up to 1048576", ("seq",)),
        (dict(d_model=2**21), "choose a smaller d_model", ("d_model",)),
    ],
    ids=["zero", "float", "too-many", "mode", "workers", "compile-top", "strategy", "seq", "dim"],
)
def test_a_bad_value_is_refused_when_the_request_is_made(kwargs, words, params):
    with pytest.raises(PlanError) as info:
        PlanRequest("tiny", **{"devices": 8, **kwargs})
    assert words in str(info.value)
    assert info.value.params == params


def test_bad_hardware_is_refused_when_the_request_is_made():
    with pytest.raises(ShardscopeError, match="unknown hardware preset 'v100'; choose one of"):
        PlanRequest("tiny", 8, hardware="v100")
    bad = "link_bandwidth=-1.0 must be a finite positive number"
    with pytest.raises(ShardscopeError, match=bad):
        PlanRequest("tiny", 8, hardware_overrides={"link_bandwidth": -1.0})


def test_the_command_line_names_the_flag_of_a_refused_field(capsys):
    argv = ["plan", "--model", "tiny", "--devices", "8", "--workers", "-1"]
    assert_usage_error(argv, "argument --workers: -1 must be 0 or more", capsys)
    # what only the request can refuse is named by its flag too
    argv = ["plan", "--model", "tiny", "--devices", "8", "--stages", "2", "--virtual-stages"]
    line = assert_usage_error([*argv, "2", "--microbatches", "3"], "virtual_stages=2", capsys)
    assert line.rstrip().endswith("(flag --virtual-stages)")


def test_a_target_compile_count_is_refused_before_any_compile():
    request = PlanRequest("tiny", 8, compiler="h100", target_plans=0, workers=0)
    with pytest.raises(PlanError, match="target_plans=0: must be a positive whole number") as e:
        shardscope.plan_request(request)
    assert e.value.params == ("target_plans",)


def test_the_key_value_heads_and_head_width_given_shape_the_model():
    from shardscope._src.train.sweep import resolve_config

    # Llama 3 8B with 4 key/value heads of its 8: each of 32 layers loses the key and value
    # projections of 4 heads of 128, each d_model 4096 wide
    llama = resolve_config(PlanRequest("llama3-8b", 8))[1]
    fewer = resolve_config(PlanRequest("llama3-8b", 8, kv_heads=4))[1]
    assert (fewer.kv_heads, fewer.head_dim) == (4, 128)
    assert llama.param_count() - fewer.param_count() == 32 * 2 * 4096 * 4 * 128
    # a shape whose width the heads do not divide, with its head width given
    odd = resolve_config(PlanRequest(None, 8, d_model=96, heads=5, head_dim=16, ff=256, layers=2))
    assert (odd[1].heads, odd[1].kv_heads, odd[1].head_dim) == (5, 5, 16)


def test_a_width_the_heads_do_not_divide_names_the_flags_that_fix_it(capsys):
    from helpers import assert_usage_error

    line = assert_usage_error(
        ["plan", "--model", "llama3-8b", "--devices", "8", "--d-model", "4097"], "heads=17", capsys
    )
    assert line.rstrip().endswith("(flags --d-model, --heads, --head-dim)")
    line = assert_usage_error(
        ["plan", "--model", "llama3-8b", "--devices", "8", "--kv-heads", "5"], "kv_heads=", capsys
    )
    assert line.rstrip().endswith("(flags --heads, --kv-heads)")
