"""shardscope.suggest and shardscope shard: searched, screened and compiled rules for a
program's logical names."""

import io
import json
import math
import re
import sys
from pathlib import Path

import jax
import pytest

import shardscope
from helpers import assert_usage_error, mlp_search
from shardscope._src.audit.user_program import load_program
from shardscope._src.cli.main import build_parser, command_config, main
from shardscope._src.render.suggest import (
    ARRAYS_SHOWN,
    dataflow_names,
    render_suggest,
    suggest_markdown_report,
)
from shardscope._src.suggest.suggest import probe_program, screen, workload
from shardscope._src.targets.hardware import PRESETS

PROGRAMS = Path(__file__).parent / "programs"
MLP = f"{PROGRAMS / 'flax_mlp.py'}:make_step"
LLAMA = f"{PROGRAMS / 'nnx_llama.py'}:make_step"
AUTO = jax.sharding.AxisType.Auto


def _rules(make_step):
    return sys.modules[make_step.__module__].RULES


@pytest.fixture(scope="module")
def mlp():
    return mlp_search()


def test_the_best_proposal_fits_and_beats_the_hand_written_rules(mlp):
    make_step, result = mlp
    best = result.best
    assert best is not None and best.fits
    assert result.compiled == 4 and len(result.proposals) == 4
    hand = shardscope.plan_program(make_step, 8, rules=_rules(make_step), axis_types="auto")
    assert best.step_time_s <= hand.best.step_time_s
    assert best.ratio == best.step_time_s / hand.best.step_time_s
    # every proposal's arrays: the per-device bytes are the full bytes over the spec's shards
    for a in best.arrays:
        shards = 1
        for axis in a.spec:
            shards *= best.mesh[axis] if axis else 1
        full = 4
        for d in a.shape:
            full *= d
        assert a.bytes_per_device * shards == full
    json.dumps(result.to_dict())


def test_the_rules_file_round_trips_through_plan_program(mlp, tmp_path, monkeypatch):
    make_step, result = mlp
    monkeypatch.chdir(tmp_path)
    # the best proposal's own file: its one set, named "suggested"
    path = tmp_path / "best.json"
    path.write_text(json.dumps(result.best.rules_file(result.axes)))
    data = json.loads(path.read_text())
    assert data["axes"] == ["data", "model"] and list(data["rules"]) == ["suggested"]
    again = shardscope.plan_program(
        make_step, 8, rules=str(path), meshes=[result.best.mesh], axis_types="auto"
    )
    assert again.best.step_time_s == result.best.step_time_s
    assert again.best.memory_bytes_per_device == result.best.memory_bytes_per_device
    # the best replicates everything, as the user's dp does on data=1: the same program, so
    # the answer is to keep the user's rules, and the written file holds them
    own = result.own_best
    assert result.keep_own and result.best.step_time_s == own.step_time_s
    path = result.write_rules()  # by default under the name that says it holds rules
    assert path.name == "suggested-rules.json"
    assert json.loads(path.read_text()) == {
        "axes": ["data", "model"],
        "rules": {own.rules_name: [list(p) for p in own.rules]},
    }


def test_the_same_input_gives_the_same_ranking(mlp):
    make_step, result = mlp
    again = shardscope.suggest(make_step, 8, axis_types="auto", compiles=4, workers=0)
    assert [(p.label, p.rules, dict(p.mesh)) for p in again.proposals] == [
        (p.label, p.rules, dict(p.mesh)) for p in result.proposals
    ]


def test_the_change_turns_your_best_rules_into_the_proposal(mlp):
    _, result = mlp
    change = result.change
    own, best = result.own_best, result.best
    assert change.own_label == own.label and dict(change.mesh) == dict(best.mesh)
    # an axis of size 1 shards nothing: such a rule reads as replicated
    mine = {n: a for n, a in own.rules if a is not None and own.mesh[a] > 1}
    for name, before, after in change.moves:
        assert mine.get(name) == before
        mine[name] = after
    assert {n: a for n, a in mine.items() if a is not None} == {
        n: a for n, a in best.rules if a is not None and best.mesh[a] > 1
    }
    assert change.speedup == own.step_time_s / best.step_time_s


def test_when_no_proposal_beats_your_rules_the_answer_is_to_keep_them():
    make_step = load_program(MLP)
    # one compile: the screen's leader, data=2,model=4 with the batch on data, slower than
    # the user's best (dp, which on data=1,model=8 replicates everything)
    result = shardscope.suggest(make_step, 8, axis_types="auto", compiles=1, workers=0)
    (best,) = result.proposals
    own = result.own_best
    assert best.fits and best.step_time_s > own.step_time_s and best.ratio > 1
    assert result.keep_own and result.best is best  # best stays the best proposal
    keep = result.notes[0]
    assert keep.kind == "keep-own" and keep.values.rules_name == own.rules_name
    assert (keep.values.proposals, keep.values.fitting) == (1, 1)
    assert keep.values.mesh == own.mesh_spec and keep.values.step_s == own.step_time_s
    # said first, before the table; the proposal is never headlined as the answer
    text = _rendered(result, verbose=False)
    lines = text.splitlines()
    assert text.index(keep.text) < text.index("proposals (compiled, best first)")
    assert "keep it" in keep.text
    assert f"your {own.rules_name} on {own.mesh_spec}" in keep.text
    assert not any(line.startswith("against your best") for line in lines)
    assert any(line.startswith("the best proposal against your best") for line in lines)
    # the file holds the user's rule set, under its name, in the JSON and the report too
    assert result.rules_file() == {
        "axes": ["data", "model"],
        "rules": {own.rules_name: [list(p) for p in own.rules]},
    }
    assert result.to_dict()["keep_own"] is True
    report = suggest_markdown_report(result)
    assert f"## Rules to keep: yours, {own.rules_name} on {own.mesh_spec}" in report
    assert "## Rules of the best" not in report and result.rules_text() in report


def test_the_comparisons_with_your_rules_say_slower_or_faster_in_words(mlp):
    from shardscope._src.render.suggest import change_lines
    from shardscope._src.suggest.suggest import Change

    _, result = mlp
    # each proposal's row: its time over the user's best, which no proposal beats here
    rows = {
        line.split()[0]: line
        for line in _rendered(result, verbose=False).splitlines()
        if line.split()[:1] in ([str(p.rank)] for p in result.proposals)
    }
    for p in result.proposals:
        assert p.ratio >= 1
        words = "same" if f"{p.ratio:.2f}" == "1.00" else f"{p.ratio:.2f}x slower"
        assert rows[str(p.rank)].rstrip().endswith(words), rows[str(p.rank)]
    # the summary under the table reads the same way round as the column: time over yours
    mesh = {"data": 8, "model": 1}
    for own_s, step_s, words in (
        (783e-6, 899e-6, "(1.15x slower)"),
        (1.0, 0.2119, "(4.72x faster)"),
    ):
        change = Change("dp data=8", mesh, mesh, (), own_s, step_s, 1, 1)
        assert words in change_lines(change)[-1]


def test_a_program_name_missing_from_the_rules_is_one_error_naming_it(tmp_path, capsys):
    make_step = load_program(MLP)
    rules = [("batch", "data"), ("embed", None)]  # no rule for "hidden"
    words = "uses logical name 'hidden', which rules= does not map (it maps batch, embed): add"
    with pytest.raises(shardscope.RulesError, match=re.escape(words)):
        shardscope.suggest(make_step, 8, rules=rules, axis_types="auto")
    # a typo in a rules file: the file, and the name the program uses that is close to it
    path = tmp_path / "typo.json"
    typo = [["batch", "data"], ["embed", None], ["hiden", "model"]]
    path.write_text(json.dumps({"rules": {"mine": typo}}))
    argv = ["shard", MLP, "--devices", "8", "--compiler", "cpu", "--axis-types", "auto"]
    line = assert_usage_error([*argv, "--rules", str(path)], "'hiden' is close", capsys)
    # (a long path is cut to its ends on the command line: its file name stays)
    assert "which rules file '" in line and "typo.json'" in line
    assert "does not map (it maps batch, embed, hiden;" in line
    with pytest.raises(shardscope.RulesError, match="'pipe'"):
        shardscope.suggest(make_step, 8, rules=[("batch", "pipe")], axis_types="auto")


def test_code_for_auto_axes_searched_on_explicit_ones_names_the_axis_types(capsys):
    # flax_mlp.py is written for Auto axes: on JAX's default Explicit axes its matmuls'
    # contracted dimensions are sharded and JAX cannot type the result; the rules are fine
    make_step = load_program(MLP)
    with pytest.raises(shardscope.AxisTypeError, match="axis_types='auto'") as info:
        shardscope.suggest(make_step, 8, compiler="cpu", compiles=2, workers=0)
    assert not isinstance(info.value, shardscope.RulesError)
    assert "missing from the rules" not in str(info.value)
    argv = ["shard", MLP, "--devices", "8", "--compiler", "cpu", "--compiles", "2"]
    # the command line's words: the flag, not the Python argument
    line = assert_usage_error(argv, "build the mesh with --axis-types auto", capsys)
    assert "axis_types=" not in line and "--rules" not in line


def test_the_weights_are_the_arrays_the_optimizer_state_mirrors():
    make_step = load_program(LLAMA)
    names = ("batch", "vocab", "embed", "heads", "mlp")
    arrays, flops = probe_program(make_step, names, where="llama", axis_type=AUTO)
    work = workload(arrays, flops)
    weights = [a for a, w in zip(arrays, work.weights, strict=True) if w]
    # per block: two norms, q, k, v, o, gate, up, down; then the embedding, the final norm
    # and the head; the moments, the step counters and the tokens are not weights
    assert len(weights) == 2 * 9 + 3
    assert all(a.path.startswith("[0]") for a in weights)
    assert work.weight_names == {"vocab", "embed", "heads", "mlp"}
    params = 2 * (2 * 512 + 4 * 512 * 512 + 3 * 512 * 2048) + 2 * 8192 * 512 + 512
    assert sum(math.prod(a.shape) for a in weights) == params


def test_the_screen_counts_every_argument_once_per_device():
    make_step = load_program(MLP)
    arrays, flops = probe_program(
        make_step, ("batch", "embed", "hidden"), where="mlp", axis_type=AUTO
    )
    work = workload(arrays, flops)
    weights = 2 * 64 * 256 * 4  # up and down, float32
    tokens = 2 * 32 * 64 * 4  # x and y
    scalars = sum(a.nbytes for a in arrays if a.shape == ())
    hw = PRESETS["h100"]
    data = {"data": 8, "model": 1}
    dp = screen(arrays, {"batch": "data", "embed": None, "hidden": None}, data, work, hw)
    # the weights and both adam moments replicated, the batch split
    assert dp.argument_bytes_per_device == 3 * weights + tokens // 8 + scalars
    both = {"data": 4, "model": 2}
    tp = screen(arrays, {"batch": "data", "embed": None, "hidden": "model"}, both, work, hw)
    assert tp.argument_bytes_per_device == 3 * weights // 2 + tokens // 4 + scalars
    # an axis twice in one array, or a dimension its axis does not divide: no candidate
    assert (
        screen(arrays, {"batch": "data", "embed": "data", "hidden": "data"}, data, work, hw) is None
    )
    odd = {"data": 1, "model": 8}
    assert screen(arrays, {"batch": None, "embed": None, "hidden": "model"}, odd, work, hw)
    assert work.tokens > 0 and dp.compute_time_s > 0 and dp.comm_time_s > 0


def test_the_decoder_best_proposal_beats_the_hand_written_rules():
    make_step = load_program(LLAMA)
    result = shardscope.suggest(make_step, 8, axis_types="auto", compiles=6, workers=0)
    hand = result.own_best
    assert result.best is not None and result.best.fits
    assert result.best.step_time_s <= hand.step_time_s
    assert result.compiled == 6 and result.candidates > 100
    # the command line's default lists the best's first arrays and counts them all;
    # --verbose (and the report) every one
    arrays = [a.path for a in result.best.arrays]
    brief, every = _rendered(result, verbose=False), _rendered(result, verbose=True)
    assert f"the first {ARRAYS_SHOWN} of its {len(arrays)} arrays" in brief
    assert [a for a in arrays if a in brief] == arrays[:ARRAYS_SHOWN] < arrays
    assert [a for a in arrays if a in every] == arrays and "every array" in every


def _rendered(result, *, verbose):
    from rich.console import Console

    console = Console(record=True, width=200, file=io.StringIO())
    render_suggest(result, console=console, verbose=verbose)
    return console.export_text()


def test_a_best_that_replicates_everything_says_what_the_fastest_split_costs(mlp):
    _, result = mlp
    # a 64 x 256 MLP on 8 devices: the collectives of any split outweigh what it saves
    best = result.best
    assert best.replicated and all(a is None for _, a in best.rules)
    split = next(p for p in result.proposals if p.fits and not p.replicated)
    assert split.step_time_s > best.step_time_s
    keep, note = result.notes  # the answer first: the user's rules tie the best
    assert keep.kind == "keep-own" and note.kind == "all-replicated"
    assert note.values.devices == 8
    # what the note claims holds of the two compiled programs
    assert note.values.comm_s == split.plan.comm_time_s > 0
    assert note.values.saved_s == best.plan.compute_time_s - split.plan.compute_time_s
    assert note.values.comm_s > note.values.saved_s
    assert f"the fastest split, {_rules_of(split)} on " in note.text
    assert f"note: {note.text[:100]}" in _rendered(result, verbose=False)
    assert f"\nnote: {note.text}\n" in suggest_markdown_report(result)
    assert result.to_dict()["notes"] == [keep.to_dict(), note.to_dict()]


def _rules_of(p):
    from shardscope._src.sharding.rules import sharded_rules

    return sharded_rules(p.rules)


def test_the_yardstick_compiles_only_the_plans_that_could_be_your_best():
    make_step = load_program(MLP)
    # a slow chip: compute decides, so a plan that leaves devices repeating others' work
    # cannot be the best
    slow = {"peak_flops": 1e9}
    result = shardscope.suggest(
        make_step, 8, axis_types="auto", compiles=4, workers=0, hardware_overrides=slow
    )
    every = shardscope.plan_program(
        make_step, 8, rules=_rules(make_step), axis_types="auto", hardware_overrides=slow
    )
    compiled = {(p.rules_name, p.mesh_spec): p for p in every.plans}
    own = result.own
    slower = [s for s in own.skipped if s.reason == "slower"]
    assert slower and len(own.plans) + len(slower) == len(compiled) == 12
    # the best of every plan compiled, so the same ratio
    assert own.best.label == every.best.label
    assert own.best.step_time_s == every.best.step_time_s
    assert result.best.ratio == result.best.step_time_s / every.best.step_time_s
    for s in slower:  # each left out is slower than the best
        assert compiled[(s.strategy, s.mesh)].step_time_s > own.best.step_time_s
    # compute decides: the best splits the work, and there is nothing to note about that
    assert not result.best.replicated
    assert "all-replicated" not in [n.kind for n in result.notes]
    # a plan taken from another compile of its layout is what its own compile gives
    assert result.own_shared > 0 and result.own_compiled + result.own_shared == len(own.plans)
    for p in own.plans:
        q = compiled[(p.rules_name, p.mesh_spec)]
        assert (p.rules, p.step_time_s, p.memory_bytes_per_device, p.same_as) == (
            q.rules,
            q.step_time_s,
            q.memory_bytes_per_device,
            q.same_as,
        )


@pytest.mark.parametrize("program", ["flax_mlp", "linen_lm"])
def test_the_plans_of_one_layout_compile_to_one_program(program):
    from shardscope._src.mesh import axis_types_of
    from shardscope._src.program.program import layout_key

    make_step = load_program(f"{PROGRAMS / program}.py:make_step")
    rules = dict(_rules(make_step))
    first = next(iter(rules.values()))
    rules["reversed"] = list(reversed(first))  # the same layout, the pairs in another order
    swap = {"data": "model", "model": "data"}
    rules["swapped"] = [(n, swap.get(a, a)) for n, a in first]  # another layout on 2 axes
    result = shardscope.plan_program(make_step, 8, rules=rules, axis_types="auto")
    kinds = axis_types_of("auto", result.axes)
    programs: dict[tuple, set[str]] = {}
    for p in result.plans:
        key = layout_key(p.mesh, p.rules, kinds)
        # plans compiled to one program are marked the same as the first of them
        programs.setdefault(key, set()).add(p.same_as or p.rules_name)
    assert len(programs) < len(result.plans)  # some layouts are met more than once
    assert all(len(v) == 1 for v in programs.values()), programs


def test_no_fit_names_the_arrays_and_the_smallest_device_count():
    make_step = load_program(MLP)
    # the MLP's arguments: two weights and their two adam moments, x and y, two counters;
    # 8 devices hold at least all of it over 8 (51,200 bytes and the counters), 16 half that
    limit = 40_000
    assert (3 * 2 * 64 * 256 * 4 + 2 * 32 * 64 * 4) // 8 > limit
    result = shardscope.suggest(
        make_step, 8, axis_types="auto", compiles=2, hardware_overrides={"memory_bytes": limit}
    )
    assert result.best is None
    advice = result.fit_advice
    assert "the smallest device count whose arguments fit is 16" in advice
    assert "up.kernel" in advice or "down.kernel" in advice
    with pytest.raises(shardscope.PlanError, match="16"):
        result.rules_file()


def test_no_fit_where_the_arguments_fit_says_what_does_not_and_to_donate():
    from shardscope._src.base.comm import format_bytes

    make_step = load_program(MLP)
    # 100,000 bytes: the MLP's arguments fit on 8 devices (its state over 8 is ~50 KB), the
    # arguments, outputs and temporaries of every compiled layout do not
    limit = 100_000
    result = shardscope.suggest(
        make_step,
        8,
        axis_types="auto",
        compiles=2,
        workers=0,
        compare=False,
        hardware_overrides={"memory_bytes": limit},
    )
    assert result.best is None
    small = min((p.plan for p in result.proposals), key=lambda p: p.memory_bytes_per_device)
    m = small.compiled_memory
    assert m.argument_size_in_bytes <= limit < small.memory_bytes_per_device
    assert m.alias_size_in_bytes == 0 and 2 * m.output_size_in_bytes >= m.argument_size_in_bytes
    advice = result.fit_advice
    # the devices asked for are checked first: no doubling where the arguments fit
    assert "the arguments fit on 8 devices" in advice and "device count" not in advice
    assert (
        f"arguments {format_bytes(m.argument_size_in_bytes)}, outputs "
        f"{format_bytes(m.output_size_in_bytes)}, temporaries {format_bytes(m.temp_size_in_bytes)}"
        ", none aliased: the arguments fit, the outputs and temporaries do not" in advice
    )
    assert "donate the model and optimizer state (donate_argnums)" in advice
    assert "a smaller batch in make_step" in advice


def test_the_memory_words_name_the_part_over_and_donation_only_where_it_helps():
    from shardscope._src.plan.notes import compiled_memory_words

    mib = 2**20
    # the review's decoder: 117.1 MiB of arguments, as much output, nothing aliased
    words = compiled_memory_words(117 * mib, 117 * mib, 164 * mib, 0, 300 * mib)
    assert "the arguments fit, the outputs and temporaries do not" in words
    assert "donate the model and optimizer state (donate_argnums)" in words
    assert "up to 117 MiB of the arguments' memory" in words
    # donated already (aliased), or outputs a small part of the arguments: no donation
    assert "donate" not in compiled_memory_words(
        117 * mib, 117 * mib, 164 * mib, 117 * mib, 300 * mib
    )
    assert "donate" not in compiled_memory_words(117 * mib, 40 * mib, 400 * mib, 0, 300 * mib)
    # the arguments alone over: said so, and donation cannot help
    over = compiled_memory_words(400 * mib, 400 * mib, 0, 0, 300 * mib)
    assert over.endswith("the arguments alone do not fit") and "donate" not in over


def test_plan_program_no_fit_names_no_flag_it_refuses(capsys):
    argv = ["plan", "--program", MLP, "--devices", "8", "--axis-types", "auto"]
    argv += ["--meshes", "data=8", "--rule-set", "dp", "--memory", "100000"]
    assert main(argv) == 0  # (no plan fits: said under the table)
    out = " ".join(capsys.readouterr().out.split())
    said = out[out.index("no plan fits") :].split("rules dp:")[0]
    assert "a smaller batch in make_step" in said and "arguments alone do not fit" in said
    assert "--batch" not in said and "--seq" not in said and "sequence" not in said
    assert said.rstrip().endswith("(flags --devices, --memory)")


def test_the_command_line_prints_the_arrays_and_writes_the_rules(tmp_path, capsys):
    out, report, js = tmp_path / "rules.json", tmp_path / "r.md", tmp_path / "s.json"
    argv = ["shard", MLP, "--devices", "8", "--compiler", "cpu", "--axis-types", "auto"]
    argv += ["--compiles", "3", "--out", str(out), "--report", str(report), "--json", str(js)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "every array" in text and "up.kernel" in text and "P(" in text
    data = json.loads(js.read_text())
    assert data["compiled"] == 3 and data["best"] == data["proposals"][0]["label"]
    assert "## Every array of the best" in report.read_text()
    # the rules file is one that plan --program and audit take as they are
    rules = json.loads(out.read_text())
    mesh = ",".join(f"{k}={v}" for k, v in data["proposals"][0]["mesh"].items())
    assert (
        main(
            [
                "plan",
                "--program",
                MLP,
                "--devices",
                "8",
                "--rules",
                str(out),
                "--meshes",
                mesh,
                "--axis-types",
                "auto",
            ]
        )
        == 0
    )
    assert main(["audit", MLP, "--mesh", mesh, "--rules", str(out), "--axis-types", "auto"]) == 0
    # no proposal beats the user's dp (the best is its program): the file holds dp, and the
    # answer is said right after the headline
    assert data["keep_own"] and list(rules["rules"]) == [data["own_best"]["rules_name"]]
    said = text.index("none of the 3 compiled proposals beats your ")
    assert said < text.index("proposals (compiled, best first)")
    assert "the rules file holds your " in text
    # the command answers to the library's name too: the same request, which main runs by
    # its type (searched again, it would compile the same candidates again)
    parse = build_parser().parse_args
    assert command_config(parse(["suggest", *argv[1:]])) == command_config(parse(argv))
    capsys.readouterr()


def test_the_command_line_refuses_bad_input_in_one_line(tmp_path, capsys):
    base = ["shard", MLP, "--devices", "8", "--axis-types", "auto", "--compiler", "cpu"]
    assert_usage_error([*base, "--rules", str(tmp_path / "none.json")], "none.json", capsys)
    assert_usage_error(
        ["shard", MLP, "--devices", "8", "--compiler", "h100", "--hardware", "a100"],
        "--hardware h100",
        capsys,
    )
    # (compiled in this process: the search's worker processes are test_worker_processes_...)
    argv = [*base, "--memory", "40000", "--workers", "0", "--out", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit) as info:
        main(argv)
    printed = capsys.readouterr()
    assert info.value.code == 2 and printed.err.count("\n") == 1
    assert "the smallest device count whose arguments fit is 16" in printed.err
    # the advice is the error's one line, not printed under the table too
    assert "smallest device count" not in printed.out and "no proposal fits" not in printed.out
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_worker_processes_compile_the_same_proposals(mlp):
    make_step, here = mlp
    there = shardscope.suggest(make_step, 8, axis_types="auto", compiles=4, workers=2)
    assert [
        (p.label, p.rules, dict(p.mesh), p.step_time_s, p.memory_bytes_per_device)
        for p in there.proposals
    ] == [
        (p.label, p.rules, dict(p.mesh), p.step_time_s, p.memory_bytes_per_device)
        for p in here.proposals
    ]
    with pytest.raises(shardscope.PlanError, match="workers=0"):
        shardscope.suggest(lambda mesh, rules: None, 8, logical_axes=("batch",), workers=2)


EQX = PROGRAMS / "eqx_transformer.py"


@pytest.fixture(scope="module")
def eqx_program():
    sys.path.insert(0, str(PROGRAMS))
    try:
        import eqx_transformer
    finally:
        sys.path.remove(str(PROGRAMS))
    return eqx_transformer


def test_the_dataflow_joins_the_axes_a_transformer_shares(eqx_program):
    from shardscope._src.program.dataflow import argument_axes

    m = eqx_program
    args = m.arguments()
    classes = argument_axes(m.train_step, args)
    leaves = [
        (jax.tree_util.keystr(p), leaf)
        for p, leaf in jax.tree_util.tree_flatten_with_path(args)[0]
        if hasattr(leaf, "shape")
    ]
    axes = {path: c for (path, _), c in zip(leaves, classes, strict=True)}
    block = "[0].blocks[0]"
    embed = axes["[0].embed.weight"][1]
    # d_model: the embedding's width, every projection's input, the outputs' and the norms
    for w in ("q", "k", "v", "gate", "up"):
        assert axes[f"{block}.{w}.weight"][1] == embed  # Equinox's Linear is (out, in)
    assert axes[f"{block}.o.weight"][0] == axes[f"{block}.down.weight"][0] == embed
    assert axes[f"{block}.attn_norm"] == axes["[0].norm"] == (embed,)
    # the heads: q, k and v's outputs are the output projection's input (Megatron's pair)
    heads = axes[f"{block}.q.weight"][0]
    assert axes[f"{block}.k.weight"][0] == axes[f"{block}.o.weight"][1] == heads != embed
    mlp = axes[f"{block}.gate.weight"][0]
    assert axes[f"{block}.up.weight"][0] == axes[f"{block}.down.weight"][1] == mlp
    assert len({embed, heads, mlp}) == 3
    # the moments share their weight's axes; the tokens and targets share the batch's
    assert axes["[1][0].mu.blocks[1].q.weight"] == axes["[0].blocks[1].q.weight"]
    assert axes["[2]"] == axes["[3]"] and axes["[2]"][0] not in (embed, heads, mlp)


def test_a_program_without_names_gets_a_spec_per_array(eqx_program):
    m = eqx_program
    result = shardscope.suggest(
        m.train_step, 8, args=m.arguments(), axis_types="auto", compiles=6, workers=0
    )
    best = result.best
    assert best is not None and best.fits and result.compiled == 6
    hand = [
        shardscope.plan_program(
            m.make_step_with(name), 8, axes=("data", "model"), axis_types="auto"
        ).best.step_time_s
        for name in ("dp", "tp", "dp_tp")
    ]
    assert best.step_time_s <= min(hand)
    specs = {a.path: a.spec for a in best.arrays}
    # every array has a spec, and each optimizer moment has its weight's
    assert len(specs) == len(jax.tree.leaves(m.arguments()))
    for path, spec in specs.items():
        if ".mu." in path or ".nu." in path:
            weight = "[0]." + path.split(".mu." if ".mu." in path else ".nu.", 1)[1]
            assert spec == specs[weight], path
    with pytest.raises(shardscope.RulesError, match="array by array"):
        shardscope.suggest(m.train_step, 8, args=m.arguments(), rules=[("batch", "data")])


def test_the_command_line_writes_a_spec_per_array_for_a_program_without_names(tmp_path, capsys):
    out = tmp_path / "specs.json"
    argv = ["shard", f"{EQX}:make_step", "--devices", "8", "--compiler", "cpu"]
    # in worker processes, each reading the program's axes from its dataflow again
    argv += ["--workers", "2", "--compiles", "4"]
    assert main([*argv, "--axis-types", "auto", "--out", str(out)]) == 0
    assert "axes its dataflow joins" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert math.prod(data["mesh"].values()) == 8
    # one spec per array, each of its array's rank
    sys.path.insert(0, str(PROGRAMS))
    try:
        import eqx_transformer
    finally:
        sys.path.remove(str(PROGRAMS))
    leaves = [
        (jax.tree_util.keystr(p), leaf)
        for p, leaf in jax.tree_util.tree_flatten_with_path(eqx_transformer.arguments())[0]
    ]
    assert {p: len(leaf.shape) for p, leaf in leaves} == {
        p: len(spec) for p, spec in data["specs"].items()
    }


def test_candidates_that_do_not_type_check_are_one_line_with_the_fix(tmp_path, capsys):
    # the Equinox step gives no out_sharding: on JAX's default Explicit axes no split of
    # its batch type-checks, and every candidate compiled is skipped for that
    js = tmp_path / "s.json"
    argv = ["shard", f"{EQX}:make_step", "--devices", "8", "--compiler", "cpu"]
    argv += ["--compiles", "2", "--workers", "0", "--json", str(js)]
    with pytest.raises(SystemExit) as info:
        main(argv)
    printed = capsys.readouterr()
    skipped = json.loads(js.read_text())["skipped"]
    assert info.value.code == 2 and len(skipped) == 2
    assert {s["reason"] for s in skipped} == {"type-check"}
    # one line for the reason, with its fix, and each candidate set apart by ";"
    out = " ".join(printed.out.split())
    shown = "; ".join(f"{s['strategy']} on {s['mesh']}" for s in skipped)
    fix = "--axis-types auto (axis_types='auto') lets the compiler choose their shardings"
    assert "2 candidates do not type-check on Explicit axes" in out
    assert f"{fix} ({shown})" in out
    # the error says why nothing compiled, not that nothing fits the memory
    assert (
        printed.err.count("\n") == 1 and "no proposal compiled: 2 do not type-check" in printed.err
    )
    assert "fits" not in printed.err and "--axis-types auto" in printed.err


def test_a_specs_file_is_written_as_one_and_refused_as_rules_with_how_to_apply_it(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = ["shard", f"{EQX}:make_step", "--devices", "8", "--compiler", "cpu"]
    assert main([*argv, "--axis-types", "auto", "--compiles", "2", "--workers", "0"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suggested-specs.json"]
    data = json.loads((tmp_path / "suggested-specs.json").read_text())
    path, spec = next((k, v) for k, v in data["specs"].items() if any(v))
    shown = ", ".join("None" if a is None else repr(a) for a in spec)
    mesh = ",".join(f"{k}={v}" for k, v in data["mesh"].items())
    # each reader of rules says what the file is and how to apply it, in one line
    for command in (
        ["audit", f"{EQX}:make_step", "--mesh", mesh],
        ["plan", "--program", f"{EQX}:make_step", "--devices", "8"],
        ["shard", f"{EQX}:make_step", "--devices", "8"],
    ):
        line = assert_usage_error(
            [*command, "--rules", "suggested-specs.json"], "is a specs file", capsys
        )
        assert line.startswith("shardscope: error: rules file 'suggested-specs.json' is a ")
        assert f"by its path on mesh {mesh}), not rules" in line
        assert f"e.g. P({shown}) for the one at {path}" in line
        assert line.rstrip().endswith("without rules (flag --rules)"), line
    with pytest.raises(shardscope.RulesError, match="is a specs file"):
        shardscope.audit_program(
            load_program(f"{EQX}:make_step"), mesh, rules="suggested-specs.json"
        )


def test_a_settled_search_compiled_every_neighbour_of_the_best():
    make_step = load_program(MLP)
    result = shardscope.suggest(make_step, 8, axis_types="auto", compiles=40, workers=0)
    assert result.settled and result.compiled < 40
    best = result.best
    names = ("batch", "embed", "hidden")
    arrays, flops = probe_program(make_step, names, where="mlp", axis_type=AUTO)
    work = workload(arrays, flops)
    compiled = {(tuple(p.mesh.values()), tuple(p.rules)): p for p in result.proposals}
    mine = dict(best.rules)
    live = [a for a, n in best.mesh.items() if n > 1]
    for name in names:
        for axis in (None, *live):
            moved = {**mine, name: axis}
            if moved == mine or screen(arrays, moved, best.mesh, work, PRESETS["h100"]) is None:
                continue  # not a move, or a sharding the arrays cannot take
            key = (tuple(best.mesh.values()), tuple(moved.items()))
            twin = next(
                (p for p in result.proposals if (tuple(p.mesh.values()), tuple(p.rules)) == key),
                None,
            )
            assert key in compiled or twin is not None, moved
            if twin is not None:
                assert twin.step_time_s >= best.step_time_s


def test_an_explicit_sharding_program_that_names_its_mesh_axes_is_searched_by_array():
    # its step writes out_sharding=P("data", ..., "model"): the search keeps those axes
    make_step = load_program(f"{PROGRAMS / 'explicit_llama.py'}:make_step")
    result = shardscope.suggest(make_step, 8, compiles=3, workers=0)
    assert result.by_dataflow and result.best is not None and result.best.fits
    assert result.axes == ("data", "model") and result.compiled == 3
    # the axis of the tokens' batch is named after the step's second argument's first
    # dimension, of the program's BATCH = 8 sequences: the output says so
    legend = dataflow_names(result)
    assert "arg1_0 = [1] dim 0 (8)" in legend
    assert len(legend.split("; ")) == len(result.names)


def test_other_mesh_axes_are_searched_with_only_the_names_of_the_modules_rules(capsys):
    # RULES map to data and model; compared with the proposals, they are planned on the
    # searched axes, so other axes are refused with the way out
    base = ["shard", MLP, "--devices", "8", "--axis-types", "auto", "--compiler", "cpu"]
    line = assert_usage_error([*base, "--axes", "fsdp,tensor"], "'data'", capsys)
    assert "which is not one of the mesh axes (fsdp, tensor)" in line
    assert "pass compare=False" in line and line.rstrip().endswith(
        "(flags --compare/--no-compare, --rules)"
    )
    # without the comparison the rules give their logical names alone: any axes are searched
    make_step = load_program(MLP)
    result = shardscope.suggest(
        make_step, 8, axes=("fsdp", "tensor"), compare=False, compiles=1, workers=0,
        axis_types="auto",
    )  # fmt: skip
    assert result.axes == ("fsdp", "tensor") and result.own is None
    assert dataflow_names(result) is None  # its names are the program's own
    assert result.names == tuple(n for n, _ in _rules(make_step)["dp"])
    (best,) = result.proposals
    assert tuple(best.mesh) == ("fsdp", "tensor") and math.prod(best.mesh.values()) == 8
    assert {a for _, a in best.rules} <= {"fsdp", "tensor", None}


TINY = f"{PROGRAMS / 'nnx_tiny_lm.py'}:make_step"


@pytest.fixture(scope="module")
def tiny():
    make_step = load_program(TINY)
    return make_step, shardscope.suggest(make_step, 8, axis_types="auto", compiles=6, workers=0)


def _mirror_free(mesh, rules):
    """A layout up to the names of the mesh axes: each axis that holds a name, as its size
    and the names on it."""
    on = {}
    for name, axis in rules:
        if axis is not None and mesh[axis] > 1:
            on.setdefault(axis, []).append(name)
    return sorted((mesh[a], sorted(names)) for a, names in on.items())


def test_mirror_images_and_negligible_names_get_no_compiles_of_their_own(tiny):
    make_step, result = tiny
    m = sys.modules[make_step.__module__]
    # the norm's scale and its two Adam moments: D floats each
    assert result.negligible == (("norm", 3 * m.D * 4),)
    params = 2 * m.VOCAB * m.D + 2 * m.D * m.F + m.D
    tokens = 2 * m.BATCH * m.SEQ * 4
    # (and two counters of 4 bytes: the optimizer's step and Adam's count)
    assert sum(a.nbytes for a in result.arrays) == 3 * params * 4 + tokens + 2 * 4
    note = next(n for n in result.notes if n.kind == "negligible-names")
    assert note.values.names == ("norm",) and note.values.bytes == 768
    assert note.values.bytes < 0.01 * note.values.arguments_bytes
    assert "norm not searched" in note.text and f"note: {note.text[:60]}" in _rendered(
        result, verbose=False
    )
    # every compile a layout of its own: the norm replicated, no two the same up to the
    # names of the axes (8 devices sit in one H100 node), the batch on the first axis
    assert result.compiled == len(result.proposals) == 6
    layouts = [_mirror_free(p.mesh, p.rules) for p in result.proposals]
    assert all(len([x for x in layouts if x == y]) == 1 for y in layouts), layouts
    for p in result.proposals:
        rules = dict(p.rules)
        assert rules["norm"] is None
        if rules["batch"] is not None and p.mesh[rules["batch"]] > 1:
            assert rules["batch"] == "data", p.label
    assert result.layouts < result.candidates
    # across two nodes the order of the axes decides which groups cross one: kept apart
    two = shardscope.suggest(
        make_step, 8, axis_types="auto", compiles=1, workers=0, compare=False,
        hardware_overrides={"node_size": 4},
    )  # fmt: skip
    assert two.candidates == result.candidates and two.layouts > result.layouts


def test_the_devices_doing_distinct_work_are_read_from_the_compiled_products(tiny):
    make_step, result = tiny
    m = sys.modules[make_step.__module__]
    # three products of equal size a token (up, down, head), each forward and twice backward
    unit = 2 * m.BATCH * m.SEQ * m.D * m.F
    assert m.D * m.F == m.F * m.D == m.D * m.VOCAB
    checked = 0
    for p in result.proposals:
        assert p.plan.step_matmul_flops == 9 * unit
        rules = dict(p.rules)
        used = [a for a in rules.values() if a is not None]
        if len(used) != len(set(used)):
            continue  # two names on one axis: no share of the products to read off
        kb, km, kv = (p.mesh[rules[n]] if rules[n] else 1 for n in ("batch", "mlp", "vocab"))
        # a device's products: up and down split by the batch's and the mlp's axes, the
        # head by the batch's and the vocabulary's
        assert p.plan.matmul_flops_per_device * kb * km * kv == unit * (6 * kv + 3 * km)
        assert p.working_devices == pytest.approx(9 * kb * km * kv / (6 * kv + 3 * km), rel=1e-12)
        checked += 1
    assert checked >= 4
    text = _rendered(result, verbose=False)
    assert "distinct work" in text
    for p in result.proposals:
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{p.rank} "))
        assert f" {p.working_devices:.3g} of 8 " in line.replace(".0 of", " of"), line
    # the best replicates everything: the all-replicated note says so, and no second note
    assert result.best.working_devices == 1
    kinds = [n.kind for n in result.notes]
    assert "all-replicated" in kinds and "repeated-work" not in kinds


def test_plan_program_says_how_many_devices_do_distinct_work():
    from rich.console import Console

    from shardscope._src.program.program import repeated_work_note
    from shardscope._src.render.program_plan import render_program_plan

    make_step = load_program(TINY)
    result = shardscope.plan_program(
        make_step, 8, rules=_rules(make_step), meshes=["data=4,model=2"], axis_types="auto"
    )
    plans = {p.rules_name: p for p in result.plans}
    # dp names no rule for model: each batch share is computed twice; dp_tp splits every
    # product over model too
    assert (plans["dp"].work_copies, plans["dp"].working_devices) == (2.0, 4.0)
    assert (plans["dp_tp"].work_copies, plans["dp_tp"].working_devices) == (1.0, 8.0)
    data = plans["dp"].to_dict()
    assert data["work_copies"] == 2.0 and data["working_devices"] == 4.0
    assert data["matmul_flops_per_device"] * 8 == 2 * data["step_matmul_flops"]
    note = repeated_work_note(plans["dp"])
    assert (note.values.working, note.values.copies, note.values.whole) == (4.0, 2.0, 4)
    assert note.values.label == "dp data=4,model=2"
    assert "does distinct work on 4 of 8 devices (2 copies of each share" in note.text
    assert "the other 4 repeat their work" in note.text and "use 4, or grow the batch" in note.text
    assert repeated_work_note(plans["dp_tp"]) is None
    # the sweep notes its best's
    expected = [note] if result.best.rules_name == "dp" else []
    assert [n for n in result.notes if n.kind == "repeated-work"] == expected
    console = Console(record=True, width=150, file=io.StringIO())
    render_program_plan(result, console=console, verbose=False)
    text = console.export_text()
    assert "distinct work" in text
    for n in expected:  # whole, not cut to a line: it says what the mesh's size hides
        assert " ".join(f"note: {n.text}".split()) in " ".join(text.split())
    for p in result.plans:
        line = next(x for x in text.splitlines() if p.rules_name in x and "data=4" in x)
        assert f" {p.working_devices:.0f} of 8 " in line, line
