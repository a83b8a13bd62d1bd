"""The serving front door's request (``ServeRequest``): one record that ``shardscope.serve``'s
keywords, ``shardscope serve`` and ``plan --serve`` all build, with each knob's default once."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from helpers import assert_usage_error
from shardscope._src.base.errors import PlanError
from shardscope._src.base.knobs import knob_of
from shardscope._src.cli.main import command_config, main
from shardscope._src.cli.parsers import build_parser
from shardscope._src.plan.request import PlanRequest, ProgramRequest, ServeRequest, SuggestRequest
from shardscope._src.serve.search import serve, serve_request

BASE = ["--model", "llama3-8b", "--devices", "1", "--prompt", "512", "--output", "128"]


def _parsed(argv):
    return command_config(build_parser().parse_args(argv))


def test_the_command_line_asks_for_the_request_the_library_defaults_to():
    config = _parsed(["serve", *BASE])
    assert config.request() == ServeRequest("llama3-8b", 1, prompt=512, output=128)
    # plan --serve reads the same knobs into the same request
    assert _parsed(["plan", "--serve", *BASE]).serve_request() == config.request()
    given = _parsed(["serve", *BASE, "--weights", "int8", "--token-latency", "0.02"])
    request = given.request()
    assert (request.weights, request.latency, request.cache) == ("int8", 0.02, "bfloat16")
    # --latency is the links' (the hardware's setting), not the time per output token
    links = _parsed(["serve", *BASE, "--latency", "2e-6"]).request()
    assert links.latency is None and links.device.latency_s == 2e-6


def test_every_knob_has_one_option_whose_help_names_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    by_dest = {a.dest: a for a in sub._actions}
    knobs = [f for f in fields(ServeRequest) if knob_of(f) is not None]
    assert {f.name for f in knobs} == {
        "model", "devices", "prompt", "output", "hardware", "batch", "context", "weights",
        "cache", "latency", "compiler", "imbalance", "dispatch_once", "weight_activations",
        "rate", "clients", "engine", "chunked_prefill", "memory_share",
    }  # fmt: skip
    for f in knobs:
        assert by_dest[f.name].default is None, f.name  # not given: the request's default
    assert by_dest["weights"].help.endswith("(default bfloat16)")
    assert by_dest["hardware"].help.endswith("(default h100)")
    assert "(default: prompt + output)" in by_dest["context"].help
    assert by_dest["latency"].option_strings == ["--token-latency"]
    assert {a.dest for a in sub._actions if a.required} == {"model", "devices", "prompt", "output"}


def test_serve_and_plan_serve_write_the_same_plans(tmp_path, capsys):
    a, b = tmp_path / "serve.json", tmp_path / "plan.json"
    assert main(["serve", *BASE, "--batch", "4", "--compiler", "cpu", "--json", str(a)]) == 0
    assert "tok/s/chip" in capsys.readouterr().out
    argv = ["plan", "--serve", *BASE, "--batch", "4", "--compiler", "cpu", "--json", str(b)]
    assert main(argv) == 0
    assert json.loads(a.read_text()) == json.loads(b.read_text())
    plans = json.loads(a.read_text())["plans"]
    assert [p["batch"] for p in plans] == [4]


def test_the_keywords_build_the_request():
    request = ServeRequest("llama3-8b", 1, prompt=64, output=16, batch=2, compiler="cpu")
    by_keywords = serve("llama3-8b", 1, prompt=64, output=16, batch=2, compiler="cpu")
    assert by_keywords == serve_request(request)
    with pytest.raises(TypeError, match="token_latency"):
        serve("llama3-8b", 1, prompt=64, output=16, token_latency=0.1)


def test_bad_knobs_are_refused_when_the_request_is_made(capsys):
    with pytest.raises(PlanError, match="output=None: must be a positive whole number"):
        ServeRequest("llama3-8b", 1, prompt=64, output=None)
    with pytest.raises(PlanError, match=r"batch=4 and rate=2: .* give one of them") as info:
        ServeRequest("llama3-8b", 1, prompt=64, output=16, batch=4, rate=2)
    assert info.value.params == ("batch",)
    line = assert_usage_error(["serve", *BASE, "--cache", "int4"], "cache='int4'", capsys)
    assert "flag --cache" in line
    line = assert_usage_error(["serve", *BASE, "--rate", "2", "--batch", "4"], "rate=2", capsys)
    assert "flag --batch" in line
    assert_usage_error(["serve", "--model", "llama3-8b", "--devices", "1"], "--prompt", capsys)


def test_a_compiled_plan_keeps_the_estimate_it_replaced():
    from shardscope._src.model.presets import model_preset
    from shardscope._src.serve.compiled import compile_decode
    from shardscope._src.targets.hardware import hardware

    estimate = serve("tiny", 1, prompt=64, output=16, batch=2, compiler="cpu").best
    assert estimate.compiled_by is None and estimate.estimated is estimate
    config = model_preset("tiny").config(batch=1)
    compiled = compile_decode(estimate, config, hardware("h100"))
    assert compiled.compiled_by == "h100"
    assert compiled.estimated is estimate
    assert compiled.decode_step_s != estimate.decode_step_s
    # the JSON holds the plan's own figures, as before
    assert "estimate" not in compiled.to_dict()
    assert compiled.to_dict()["decode_step_s"] == compiled.decode_step_s


@pytest.mark.parametrize(
    "command, request_type",
    [
        ("serve", ServeRequest),
        ("plan", PlanRequest),
        ("plan", ProgramRequest),
        ("shard", SuggestRequest),
    ],
    ids=["serve", "plan", "plan-program", "shard"],
)
def test_each_request_knob_is_one_option_of_its_command(command, request_type):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    by_dest = {a.dest: a for a in sub._actions}
    knobs = [f for f in fields(request_type) if knob_of(f) is not None]
    assert knobs
    for f in knobs:
        spec, action = knob_of(f), by_dest.get(f.name)
        if action is None:  # plan's --model is its own: without it, a model given by its shape
            assert (command, f.name) == ("plan", "model")
            continue
        assert spec.option(f.name) in action.option_strings, f.name
        assert action.default is None, f.name  # not given: the request's default applies
        if spec.default_text is not None and not action.required:
            assert f"(default: {spec.default_text})" in action.help, f.name


def test_serve_writes_its_json_alone_to_standard_output(capsys):
    # --json -: standard output is the JSON, read whole; the table goes to standard error
    assert main(["serve", *BASE, "--batch", "4", "--compiler", "cpu", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert [p["batch"] for p in json.loads(out)["plans"]] == [4]
    assert "tok/s/chip" in err
