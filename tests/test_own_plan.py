"""Planning, diffing and budgeting a user's own program, from Python and from the shell."""

import io
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import assert_drawn, assert_usage_error, patches, read_png
from shardscope._src.cli.main import main
from shardscope._src.plan.notes import CompiledMemoryValues
from shardscope._src.plan.rank import StepCost, StepSource
from shardscope._src.program.program import mesh_shapes
from shardscope._src.sharding.rules import load_rules_file, normalize_rules

PROGRAMS = Path(__file__).parent / "programs"
FLAX = f"{PROGRAMS / 'flax_mlp.py'}:make_step"
EQX = f"{PROGRAMS / 'eqx_mlp.py'}:make_step"


@pytest.fixture(scope="module")
def flax_plans():
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)
    rules = __import__(make_step.__module__).RULES
    return shardscope.plan_program(make_step, devices=8, rules=rules, axis_types="auto")


# -- rules and meshes -------------------------------------------------------------------------


def test_plan_program_takes_the_compiler_by_the_name_plan_gives_it(flax_plans):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)
    rules = __import__(make_step.__module__).RULES
    meshes = ["data=8,model=1"]
    kwargs = dict(devices=8, rules=rules, axis_types="auto", meshes=meshes)
    by_name = shardscope.plan_program(make_step, compiler="cpu", **kwargs)
    assert by_name.target == "cpu"
    expected = {
        p.label: p.comm_bytes_per_device
        for p in flax_plans.plans
        if p.mesh == {"data": 8, "model": 1}
    }
    assert {p.label: p.comm_bytes_per_device for p in by_name.plans} == expected
    with pytest.raises(shardscope.PlanError, match="name one choice twice"):
        shardscope.plan_program(make_step, compiler="cpu", target="h100", **kwargs)


def test_mesh_shapes_spread_the_devices_over_the_axes():
    assert [tuple(m.values()) for m in mesh_shapes(8, ("data", "model"))] == [
        (1, 8),
        (2, 4),
        (4, 2),
        (8, 1),
    ]
    assert len(mesh_shapes(64, ("a", "b", "c"))) == 28  # C(6 + 2, 2) for 2**6 over 3 axes
    assert mesh_shapes(6, ("data",)) == [{"data": 6}]


def test_rule_sets_are_normalized():
    assert normalize_rules(None) == {"as written": ()}
    one = normalize_rules([("batch", "data"), ("heads", ["model", "data"])])
    assert one == {"rules": (("batch", "data"), ("heads", ("model", "data")))}
    named = normalize_rules({"dp": {"batch": "data", "embed": None}})
    assert named == {"dp": (("batch", "data"), ("embed", None))}


@pytest.mark.parametrize(
    "rules, words",
    [
        ([("batch",)], "is not a pair"),
        ([("batch", "data"), ("batch", None)], "has two rules"),
        ([("batch", 3)], "must be a mesh axis name"),
        (42, "rules must be"),
    ],
)
def test_bad_rule_sets_are_refused(rules, words):
    with pytest.raises(shardscope.PlanError, match=words):
        normalize_rules(rules)


def test_rules_files(tmp_path):
    good = tmp_path / "rules.json"
    good.write_text(json.dumps({"axes": ["data", "model"], "rules": {"dp": [["batch", "data"]]}}))
    assert load_rules_file(good) == ({"dp": (("batch", "data"),)}, ("data", "model"))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"axes": ["data"], "rules": {"x": [["batch", "pipe"]]}}))
    with pytest.raises(shardscope.PlanError, match="mesh axis 'pipe', which is not one of"):
        load_rules_file(unknown)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(shardscope.PlanError, match="is not JSON"):
        load_rules_file(broken)
    with pytest.raises(shardscope.PlanError, match="does not exist"):
        load_rules_file(tmp_path / "missing.json")
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"rules": {}, "meshes": []}))
    with pytest.raises(shardscope.PlanError, match="unknown key"):
        load_rules_file(extra)


# -- plan_program -------------------------------------------------------------------------------


def test_plan_program_compiles_every_mesh_and_rule_set(flax_plans):
    r = flax_plans
    assert r.candidates == 12 and len(r.plans) == 12 and not r.skipped
    assert r.axes == ("data", "model")
    assert [p.rank for p in r.plans] == list(range(1, 13))
    assert r.best is r.plans[0] and all(p.fits for p in r.plans)
    steps = [(not p.fits, p.step_time_s) for p in r.plans]
    assert steps == sorted(steps)
    # each ranked by its compiled program's price, as the rank and renderers read any plan
    assert all(isinstance(p, StepCost) and p.step_source is StepSource.COMPILED for p in r.plans)
    by = {p.label: p for p in r.plans}
    # dp shards only the batch: its gradients are all-reduced over 'data', nothing else.
    dp = by["dp data=8,model=1"]
    assert {(c.kind, c.axes) for c in dp.collectives} == {("all-reduce", ("data",))}
    # tp on data=1: the MLP's activations are all-reduced over 'model', no data traffic.
    tp = by["tp data=1,model=8"]
    assert {c.axes for c in tp.collectives} == {("model",)}
    # Both weights, each a (64, 256) f32 kernel with two Adam moments, an eighth per device.
    assert tp.compiled_memory["argument_size_in_bytes"] >= 6 * 64 * 256 * 4 // 8
    assert by["dp_tp data=8,model=1"].same_as == "dp"  # hidden->model is moot on model=1
    # dp: both kernels' gradients, (64, 256) f32 each, and the f32 loss, all-reduced over
    # data=8; tp: the down projection's (32, 64) f32 output all-reduced over model=8.
    assert dp.comm_bytes_per_device == 2 * 7 * (2 * 64 * 256 * 4 + 4) // 8
    assert tp.comm_bytes_per_device == 2 * 7 * (32 * 64 * 4) // 8
    for p in r.plans:  # time to communicate exactly where there are bytes to send
        assert (p.comm_time_s > 0) == (p.comm_bytes_per_device > 0), p.label
    data = json.loads(json.dumps(r.to_dict()))
    assert data["best"] == r.best.label and len(data["plans"]) == 12


def test_plan_program_renders_like_the_planner(flax_plans, tmp_path):
    import io

    from rich.console import Console

    from shardscope._src.render.plan_plot import plot_plans
    from shardscope._src.render.program_plan import (
        program_markdown_report,
        render_program_plan,
    )

    console = Console(width=160, file=io.StringIO())
    render_program_plan(flax_plans, console=console)
    text = console.file.getvalue()
    assert "dp_tp" in text and "data=2,model=4" in text and "rules tp: batch->-" in text
    report = program_markdown_report(flax_plans)
    assert report.startswith("# Sharding plan:") and "## Ranked plans" in report
    image = read_png(plot_plans(flax_plans, tmp_path / "plans.png"))
    assert_drawn(image, 880, 572)  # 8 x 5.2 inches at 110 dpi
    # A colour a rule set, in ranking order, in the legend and on the chart (the best
    # plan's marker under the gold star, also in the legend).
    names = list(dict.fromkeys(p.strategy for p in flax_plans.plans))
    assert sorted(names) == ["dp", "dp_tp", "tp"]
    for i, name in enumerate(names):
        assert len(patches(image, f"C{i}")) >= 2, name
    assert len(patches(image, "gold")) == 2


def test_plan_program_refuses_bad_requests():
    mesh_rules = (("batch", "data"),)

    def make_step(mesh):
        return jax.jit(lambda x: x), (jax.ShapeDtypeStruct((8,), jnp.float32),)

    with pytest.raises(shardscope.PlanError, match="no mesh axes"):
        shardscope.plan_program(make_step, 8)
    with pytest.raises(shardscope.PlanError, match="takes no rules"):
        shardscope.plan_program(make_step, 8, rules={"a": mesh_rules, "b": mesh_rules})
    with pytest.raises(
        shardscope.PlanError, match="in this process needs 16 CPU devices but JAX has 8"
    ):
        shardscope.plan_program(make_step, 16, axes=("data",))
    with pytest.raises(shardscope.ProgramError, match="returned int"):
        shardscope.plan_program(lambda mesh: 3, 8, axes=("data",))


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_a_candidate_whose_program_fails_is_skipped_with_its_error(axis_types):
    def make_step(mesh, rules):
        spec = shardscope.logical_to_spec(("batch",), rules)
        x = jax.ShapeDtypeStruct((6,), jnp.float32, sharding=NamedSharding(mesh, spec))
        return jax.jit(lambda x: x * 2), (x,)

    rules = {"dp": [("batch", "data")]}
    r = shardscope.plan_program(
        make_step, 8, rules=rules, axes=("data", "model"), axis_types=axis_types
    )
    # 6 rows divide over data=1 and data=2 only.
    assert sorted(p.mesh_spec for p in r.plans) == ["data=1,model=8", "data=2,model=4"]
    assert {s.mesh for s in r.skipped} == {"data=4,model=2", "data=8,model=1"}
    assert all(s.reason == "divisibility" for s in r.skipped)
    # JAX's own words, on either axis type: data=4 splits the 6 rows 4 ways.
    message = r.skipped[0].message
    assert "partitioned 4 times" in message and "evenly divide" in message and "6" in message

    def broken(mesh, rules):
        raise RuntimeError("no model today")

    r = shardscope.plan_program(broken, 8, rules=rules, axes=("data", "model"))
    assert not r.plans and {s.reason for s in r.skipped} == {"error"}
    assert r.empty_reason.kind == "no-plan"
    assert r.empty_reason.values.skipped == {"error": 4}
    assert "4 skipped for error; e.g. " in str(r.empty_reason)
    assert "no model today" in str(r.empty_reason)


#: A program whose rules are refused for every mesh, and one that fails as it is built.
REFUSING = """
import shardscope


def make_step(mesh, rules=()):
    raise shardscope.RulesError("rules: none fits " + ",".join(mesh.axis_names))


def broken(mesh):
    raise RuntimeError("no model today: at all")
"""


def test_a_candidate_that_fails_in_a_worker_raises_the_error_it_raises_here(tmp_path):
    from shardscope._src.mesh import axis_types_of
    from shardscope._src.plan.worker import WorkerPool
    from shardscope._src.program.program import ProgramRef, compile_program

    path = tmp_path / "refusing.py"
    path.write_text(REFUSING)
    todo = [("dp", (), {"data": 2, "model": 1})]
    kinds = axis_types_of("auto", ("data", "model"))
    hw = shardscope.hardware("h100")
    with WorkerPool(2, 1) as pool:

        def run(ref):
            label = ref.ref.rpartition(":")[2]
            return compile_program(
                None, todo, hw, None, label=label, target=None, kinds=kinds, pool=pool, ref=ref
            )

        with pytest.raises(shardscope.PlanError) as refused:
            run(ProgramRef(f"{path}:make_step"))
        with pytest.raises(shardscope.ProgramError) as failed:
            run(ProgramRef(f"{path}:broken", by_dataflow=True))
    # the program's own error, as planning in this process raises it
    assert type(refused.value) is shardscope.RulesError
    assert str(refused.value) == "rules: none fits data,model"
    # any other error of the worker's is named in the caller's words
    assert str(failed.value) == (
        "broken(mesh data=2,model=1): a compile worker failed: RuntimeError: no model today: at all"
    )


# -- diff and budgets -----------------------------------------------------------------------


def _matmul_audit(spec):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, spec))
    return shardscope.audit(jax.jit(lambda x, w: x @ w), x, w)


def test_diff_lists_what_appeared_and_checks_budgets():
    replicated = _matmul_audit(P())
    split_k = _matmul_audit(P("model", None))  # an all-reduce of the 16 x 512 output
    d = shardscope.diff_audits(replicated, split_k)
    (row,) = d.changed
    assert (row.status, row.axes, row.kind, row.old_count, row.new_count) == (
        "new",
        "model",
        "all-reduce",
        0,
        1,
    )
    assert row.new_traffic_bytes == 2 * 7 * 16 * 512 * 4 // 8 and d.ok
    assert not shardscope.diff_audits(replicated, split_k, no_new=["all_reduce"]).ok
    assert shardscope.diff_audits(replicated, split_k, max_bytes_increase="1MiB").ok
    too_much = shardscope.diff_audits(replicated, split_k, max_bytes_increase=1000)
    assert too_much.violations[0].startswith("bytes per device grew by 56 KiB")
    assert shardscope.diff_audits(split_k, replicated).changed[0].status == "gone"
    assert "new" in d.text()
    # An audit's to_dict() in memory diffs as the audit does (it is this shardscope's).
    from_dicts = shardscope.diff_audits(replicated.to_dict(), split_k.to_dict())
    assert from_dicts.rows == d.rows


def _audit_files(tmp_path, schema_version):
    """An audit written as the command writes it, and its copy claiming ``schema_version``."""
    from shardscope._src.base.records import write_result

    old = tmp_path / "old.json"
    write_result(old, _matmul_audit(P()))
    data = json.loads(old.read_text())
    data["schema_version"] = schema_version
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    return old, other


def test_diff_refuses_files_of_another_schema(tmp_path):
    old, other = _audit_files(tmp_path, 0)
    with pytest.raises(shardscope.AuditDiffError, match="schema version 0 but this"):
        shardscope.diff_audits(old, other)
    with pytest.raises(shardscope.AuditDiffError, match="is not an audit"):
        shardscope.diff_audits(old, {"plans": []})
    # an audit's to_dict() dumped to a file has no schema_version, and reads as the audit
    dumped = tmp_path / "dumped.json"
    dumped.write_text(json.dumps(_matmul_audit(P()).to_dict()))
    assert shardscope.diff_audits(old, dumped).rows == shardscope.diff_audits(old, old).rows
    data = json.loads(dumped.read_text())
    data["totals"] = [{"kind": "all-reduce"}]  # ... unless it is not ours
    dumped.write_text(json.dumps(data))
    with pytest.raises(shardscope.AuditDiffError, match="no schema_version and is not an"):
        shardscope.diff_audits(old, dumped)
    with pytest.raises(shardscope.ShardscopeError, match="max_bytes_increase 'lots': write"):
        shardscope.diff_audits(old, old, max_bytes_increase="lots")


def test_diff_warns_when_the_audits_are_of_different_meshes(tmp_path):
    from shardscope._src.base.records import write_result

    on8 = _matmul_audit(P("model", None))
    mesh4 = shardscope.make_mesh("model=4", devices=jax.devices()[:4], axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh4, P()))
    w = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh4, P("model")))
    on4 = shardscope.audit(jax.jit(lambda x, w: x @ w), x, w)
    want = (
        "the audits are of different meshes (model=8 -> model=4): two programs, not one changed",
    )
    assert shardscope.diff_audits(on8, on4).warnings == want
    assert shardscope.diff_audits(on8, _matmul_audit(P())).warnings == ()
    # read back from the JSON the command writes, the same
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_result(old, on8)
    write_result(new, on4)
    d = shardscope.diff_audits(old, new)
    assert d.warnings == want and d.ok  # a warning, not a broken budget
    assert f"warning: {want[0]}" in d.text()
    # an audit of another target: the CPU's against one that says it is an h100's
    other = json.loads(old.read_text())
    other["target"] = "h100"
    assert shardscope.diff_audits(old, other).warnings == (
        "the audits are of different targets (cpu -> h100): two programs, not one changed",
    )


def test_diff_without_a_budget_says_it_only_reports(tmp_path, capsys):
    from shardscope._src.base.records import write_result
    from shardscope._src.cli.diff import NO_BUDGET

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_result(old, _matmul_audit(P()))
    write_result(new, _matmul_audit(P("model", None)))
    assert main(["diff", str(old), str(new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == NO_BUDGET
    assert "--max-bytes-increase" in NO_BUDGET and "--no-new" in NO_BUDGET
    assert main(["diff", str(old), str(new), "--max-bytes-increase", "1MiB"]) == 0
    assert NO_BUDGET not in capsys.readouterr().out


def test_diff_counts_one_unchanged_row_in_the_singular():
    from rich.console import Console

    from shardscope._src.render.diff import diff_table

    def totals(gathers):
        rows = [("all-reduce", 1, 1024, 1792), ("all-gather", gathers, 1024, 896 * gathers)]
        return {
            "totals": [
                {"axes": "model", "kind": k, "count": c, "payload_bytes": p, "traffic_bytes": t}
                for k, c, p, t in rows
            ]
        }

    d = shardscope.diff_audits(totals(1), totals(2))
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(diff_table(d))
    assert "; 1 row unchanged" in " ".join(out.getvalue().split())  # the caption may wrap


def test_expect_reads_a_size_as_the_diff_reads_its_budget():
    # the all-reduce of a 16 x 512 f32 output over 8 devices sends 2 x 7/8 x 32 KiB = 56 KiB
    split_k = _matmul_audit(P("model", None))
    assert split_k.total().traffic_bytes == 56 * 1024
    split_k.expect(traffic_bytes="56KiB", bytes_per_axis={"model": "56 KiB"})
    with pytest.raises(AssertionError, match="bytes/device in all"):
        split_k.expect(traffic_bytes="55KiB")
    with pytest.raises(AssertionError, match="bytes/device over 'model'"):
        split_k.expect(bytes_per_axis={"model": "1KiB"})
    with pytest.raises(shardscope.ShardscopeError) as percent:
        split_k.expect(traffic_bytes="5%")
    assert str(percent.value).startswith(
        "traffic_bytes '5%': a percentage needs an earlier total to be a share of"
    )
    assert percent.value.params == ("traffic_bytes",)
    with pytest.raises(shardscope.ShardscopeError, match=r"bytes_per_axis\['model'\] 'lots'"):
        split_k.expect(bytes_per_axis={"model": "lots"})


def test_no_new_takes_one_kind_as_a_string_and_either_spelling():
    replicated, split_k = _matmul_audit(P()), _matmul_audit(P("model", None))
    want = ("new all-reduce over model: 0 -> 1 per run, where none may be new",)
    for no_new in ("all-reduce", "all_reduce", ["all_reduce"], ("all-reduce",)):
        assert shardscope.diff_audits(replicated, split_k, no_new=no_new).violations == want
    assert shardscope.diff_audits(replicated, split_k, no_new="all-gather").ok


def test_a_read_audit_whose_totals_hold_an_unknown_kind_is_refused(tmp_path, capsys):
    from shardscope._src.base.records import write_result

    old, bad = tmp_path / "old.json", tmp_path / "bad.json"
    write_result(old, _matmul_audit(P("model", None)))
    data = json.loads(old.read_text())
    data["totals"][0]["kind"] = "all_reduce"
    bad.write_text(json.dumps(data))
    with pytest.raises(shardscope.AuditDiffError) as err:
        shardscope.diff_audits(old, bad)
    said = str(err.value)
    assert f"new '{bad}': its totals hold the kind 'all_reduce', which is not a" in said
    assert "(all-reduce, all-gather, reduce-scatter" in said
    line = assert_usage_error(["diff", str(old), str(bad)], "the kind 'all_reduce'", capsys)
    assert line.startswith("shardscope: error: new ")


def test_expect_collectives_pins_a_baseline(tmp_path, monkeypatch):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))

    def args(spec):
        return x, jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, spec))

    step = jax.jit(lambda x, w: x @ w)
    base = tmp_path / "step.json"
    shardscope.expect_collectives(step, *args(P(None, "model")), all_gather=0, baseline=base)
    assert json.loads(base.read_text())["schema_version"] >= 1  # written when missing
    shardscope.expect_collectives(step, *args(P(None, "model")), baseline=base)
    with pytest.raises(AssertionError, match="differ from the baseline") as info:
        shardscope.expect_collectives(step, *args(P("model", None)), baseline=base)
    assert "new  model  all-reduce" in str(info.value)
    with pytest.raises(AssertionError, match="new all-reduce over model: 0 -> 1"):
        shardscope.expect_collectives(
            step, *args(P("model", None)), baseline=base, no_new=["all-reduce"]
        )
    shardscope.expect_collectives(
        step, *args(P("model", None)), baseline=base, max_bytes_increase="64KiB"
    )
    with pytest.raises(AssertionError, match="all-reduce count"):
        shardscope.expect_collectives(step, *args(P("model", None)), all_reduce=0)
    monkeypatch.setenv("SHARDSCOPE_UPDATE_BASELINES", "1")
    shardscope.expect_collectives(step, *args(P("model", None)), baseline=base)
    monkeypatch.delenv("SHARDSCOPE_UPDATE_BASELINES")
    shardscope.expect_collectives(step, *args(P("model", None)), baseline=base)


# -- the command line -----------------------------------------------------------------------


def test_cli_audits_a_program_and_diffs_two_runs(tmp_path, capsys):
    old, new = tmp_path / "dp.json", tmp_path / "tp.json"
    for rule_set, path in (("dp", old), ("tp", new)):
        assert (
            main(
                [
                    "audit",
                    FLAX,
                    "--axis-types",
                    "auto",
                    "--mesh",
                    "data=2,model=4",
                    "--rule-set",
                    rule_set,
                    "--json",
                    str(path),
                ]
            )
            == 0
        )
    out = capsys.readouterr().out
    assert "all-reduce" in out and "flax_mlp.py:make_step on data=2,model=4" in out
    assert main(["diff", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "gone" in out and "model" in out
    assert main(["diff", str(old), str(new), "--max-bytes-increase", "0"]) == 0  # it shrank
    capsys.readouterr()
    assert main(["diff", str(new), str(old), "--max-bytes-increase", "1KiB"]) == 1
    assert "budget broken: bytes per device grew" in capsys.readouterr().out
    assert main(["diff", str(new), str(old), "--no-new", "all-reduce"]) == 1
    assert "budget broken: new all-reduce over data: 0 -> 1" in capsys.readouterr().out
    # the keyword's spelling, as the library takes it
    assert main(["diff", str(new), str(old), "--no-new", "all_reduce"]) == 1
    assert "budget broken: new all-reduce over data: 0 -> 1" in capsys.readouterr().out


# -- rules: the library takes what the command line takes --------------------------------------


def _traffic(audit):
    """What an audit's JSON says the program sends: its counts and per-axis totals."""
    data = json.loads(json.dumps(audit.to_dict()))
    return data["counts"], data["totals"]


def test_audit_program_takes_the_rules_audit_file_takes(tmp_path, capsys):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)
    module_rules = __import__(make_step.__module__).RULES  # dp, tp, dp_tp
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"rules": {"only": module_rules["dp_tp"]}}))
    mesh = "data=2,model=4"

    def lib(**rules):
        return _traffic(shardscope.audit_program(make_step, mesh, axis_types="auto", **rules))

    cli_json = tmp_path / "cli.json"
    argv = ["audit", FLAX, "--axis-types", "auto", "--mesh", mesh, "--json", str(cli_json)]
    assert main([*argv, "--rule-set", "dp_tp"]) == 0
    capsys.readouterr()
    data = json.loads(cli_json.read_text())
    from_cli = (data["counts"], data["totals"])
    # A named set of the program's module, the same pairs given directly, a rules file of one
    # set: one program, the one the command line audits.
    assert lib(rule_set="dp_tp") == from_cli
    assert lib(rules=module_rules["dp_tp"]) == from_cli
    assert lib(rules=str(rules_file)) == from_cli
    assert lib(rules=module_rules, rule_set="dp_tp") == from_cli
    # ... and the rule set matters: data parallelism alone sends something else.
    assert lib(rule_set="dp") != from_cli
    assert main([*argv, "--rules", str(rules_file)]) == 0
    capsys.readouterr()
    data = json.loads(cli_json.read_text())
    assert (data["counts"], data["totals"]) == from_cli
    # the set chosen is the one checked against the mesh: data parallelism on a mesh of
    # 'data' alone, though the module's other sets name 'model'
    dp = shardscope.audit_program(make_step, "data=8", axis_types="auto", rule_set="dp")
    assert {c.axes for c in dp.collectives} == {("data",)}
    with pytest.raises(shardscope.RulesError, match="'tp' maps 'hidden' to mesh axis 'model'"):
        shardscope.audit_program(make_step, "data=8", axis_types="auto", rule_set="tp")


@pytest.mark.parametrize(
    "rules, rule_set, flags",
    [
        (None, None, "--rule-set"),  # the module's three sets and none chosen
        (None, "zz", "--rule-set"),
        ({"x": [["batch", "pipe"]]}, None, None),  # an axis the mesh does not have
    ],
    ids=["several", "unknown", "axis"],
)
def test_audit_program_refuses_rules_as_the_command_line_does(
    tmp_path, capsys, rules, rule_set, flags
):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)
    argv = ["audit", FLAX, "--axis-types", "auto", "--mesh", "data=2,model=4"]
    path = None
    if rules is not None:
        path = tmp_path / "rules.json"
        path.write_text(json.dumps({"rules": rules}))
        argv += ["--rules", str(path)]
    if rule_set is not None:
        argv += ["--rule-set", rule_set]
    with pytest.raises(shardscope.RulesError) as info:
        shardscope.audit_program(
            make_step,
            "data=2,model=4",
            rules=None if path is None else str(path),
            rule_set=rule_set,
            axis_types="auto",
        )
    with pytest.raises(SystemExit) as code:
        main(argv)
    assert code.value.code == 2
    suffix = f" (flag {flags})" if flags else ""
    # the shell's own words where the library's name a Python argument (rule_set=NAME)
    said = f"{info.value}{suffix}" if info.value.shell is None else info.value.shell
    assert capsys.readouterr().err == f"shardscope: error: {said}\n"
    assert "rule_set=NAME" not in said


def test_a_logical_name_the_rule_set_lacks_is_named_with_the_set_and_a_close_one(tmp_path, capsys):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)  # its kernels are named (embed, hidden)
    typo = {"mine": [["batch", "data"], ["embed", None], ["hiden", "model"]]}
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"axes": ["data", "model"], "rules": typo}))
    argv = ["audit", FLAX, "--axis-types", "auto", "--mesh", "data=2,model=4"]
    line = assert_usage_error([*argv, "--rules", str(path)], "logical name 'hidden'", capsys)
    # (a long path is cut to its ends on the command line: its file name stays)
    assert "which rule set 'mine' of rules file '" in line and "typo.json'" in line
    assert "(it maps batch, embed, hiden; 'hiden' is close)" in line
    assert line.rstrip().endswith(
        ": correct 'hiden' to 'hidden', or add a rule for 'hidden' (flag --rules)"
    ), line
    # no name close to it: the fix is a rule for it
    with pytest.raises(shardscope.RulesError) as info:
        shardscope.audit_program(
            make_step,
            "data=8",
            rules={"dp": [["batch", "data"], ["embed", None]]},
            axis_types="auto",
        )
    assert "'hidden', which rule set 'dp' of rules= does not map (it maps batch, embed): add " in (
        str(info.value)
    )
    # a plan of the set: each candidate is skipped in the same words
    r = shardscope.plan_program(make_step, 8, rules=str(path), axis_types="auto")
    assert r.plans == () and len(r.skipped) == 4
    for s in r.skipped:
        assert "uses logical name 'hidden', which rule set 'mine' does not map" in s.message


def test_one_rule_set_is_planned_on_the_meshes_of_the_whole_sweep(flax_plans):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(FLAX)

    def dp_rows(result):
        return {p.mesh_spec: p.comm_bytes_per_device for p in result.plans if p.rules_name == "dp"}

    whole = dp_rows(flax_plans)
    assert len(whole) == len(mesh_shapes(8, ("data", "model"))) == 4
    # the axes of every set of the program, not those of the one chosen (dp names data alone)
    alone = shardscope.plan_program(make_step, 8, rule_set="dp", axis_types="auto")
    assert alone.axes == ("data", "model") and dp_rows(alone) == whole
    # meshes with the program's axes, as the whole sweep ranks them
    meshes = ["data=8,model=1", "data=4,model=2"]
    given = shardscope.plan_program(make_step, 8, rule_set="dp", meshes=meshes, axis_types="auto")
    assert dp_rows(given) == {m: whole[m] for m in meshes}
    # ... or with the chosen set's axes alone: model=1 changes nothing
    data = shardscope.plan_program(
        make_step, 8, rule_set="dp", meshes=["data=8"], axis_types="auto"
    )
    assert data.axes == ("data",) and dp_rows(data) == {"data=8": whole["data=8,model=1"]}
    # a set that shards over an axis the meshes lack, and meshes that disagree, are refused
    # saying where the axes come from
    with pytest.raises(shardscope.PlanError) as info:
        shardscope.plan_program(make_step, 8, rule_set="dp_tp", meshes=["data=8"])
    assert "rule set 'dp_tp' shards over mesh axis 'model', which the meshes lack" in str(
        info.value
    )
    assert info.value.params == ("meshes", "rule_set")
    with pytest.raises(shardscope.PlanError, match=r"\(the axes of the first mesh\)"):
        shardscope.plan_program(make_step, 8, rule_set="dp", meshes=["data=8", "data=4,model=2"])


def test_plan_program_names_meshes_where_the_built_in_models_mesh_is_given(capsys):
    argv = ["plan", "--program", FLAX, "--devices", "8", "--mesh", "data=8,model=1"]
    line = assert_usage_error(argv, "--mesh describes the built-in model", capsys)
    assert line.rstrip().endswith("give --meshes data=8,model=1 instead")


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "program", FLAX, "--mesh", "data=8"],
        ["audit", "matmul"],
        ["profile", "--trace", "t", FLAX, "--mesh", "data=8"],
    ],
    ids=["audit-program", "audit-matmul", "profile"],
)
def test_audit_and_profile_take_the_compiler_by_the_name_plan_gives_it(argv):
    from shardscope._src.cli.main import build_parser, command_config

    for flag in ("--compiler", "--target"):  # one option, two spellings
        config = command_config(build_parser().parse_args([*argv, flag, "h100"]))
        assert config.compile_target == "h100", flag
    assert command_config(build_parser().parse_args(argv)).compile_target is None


def test_the_audit_help_names_the_compiler_as_plan_does(capsys):
    from helpers import sub_parser

    text = " ".join(sub_parser(("audit", "program")).format_help().split())
    assert "--compiler TARGET, --target TARGET compile for this hardware" in text
    argv = ["audit", "reshard", "--target", "h100", "--devices", "8"]
    assert_usage_error(argv, "with --compiler h100 the mesh alone sets the device count", capsys)


def test_plan_program_takes_a_rules_file_and_one_rule_set(tmp_path, capsys):
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(EQX)
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "axes": ["data", "model"],
                "rules": {"dp": {"batch": "data"}, "dp_tp": {"batch": "data", "hidden": "model"}},
            }
        )
    )
    meshes = ["data=2,model=4", "data=8,model=1"]
    r = shardscope.plan_program(
        make_step, 8, rules=str(rules), rule_set="dp_tp", meshes=meshes, axis_types="auto"
    )
    assert r.axes == ("data", "model")  # the file's
    assert {p.rules_name for p in r.plans} == {"dp_tp"}
    assert sorted(p.mesh_spec for p in r.plans) == sorted(meshes)
    out = tmp_path / "plan.json"
    argv = ["plan", "--program", EQX, "--axis-types", "auto", "--devices", "8"]
    argv += ["--rules", str(rules), "--rule-set", "dp_tp", "--meshes", ";".join(meshes)]
    assert main([*argv, "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert [(p["rules_name"], p["mesh"]) for p in data["plans"]] == [
        (p.rules_name, p.mesh_spec) for p in r.plans
    ]
    with pytest.raises(shardscope.PlanError, match="both name the mesh axes") as info:
        shardscope.plan_program(make_step, 8, rules=str(rules), axes=("data", "model"))
    assert info.value.params == ("axes", "rules")


def test_cli_audits_a_compiler_dump(tmp_path, capsys):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, P("model")))
    text = jax.jit(lambda x, w: x @ w).lower(x, w).compile().as_text()
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "module_0001.jit_f.cpu_after_optimizations.txt").write_text(text)
    (dump / "module_0001.jit_f.before_optimizations.txt").write_text("HloModule x")
    assert main(["audit", "--hlo", str(dump), "--mesh", "model=8", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["all-reduce"] == 1 and data["mesh_axes"] == {"model": 8}
    assert_usage_error(
        [
            "audit",
            "--hlo",
            str(dump / "module_0001.jit_f.before_optimizations.txt"),
            "--mesh",
            "model=8",
        ],
        "after_optimizations.txt",
        capsys,
    )
    assert_usage_error(["audit", "--hlo", str(dump)], "needs --mesh", capsys)
    assert_usage_error(
        ["audit", "--hlo", str(tmp_path / "none.txt"), "--mesh", "model=8"],
        "does not exist",
        capsys,
    )


def test_cli_plans_a_program(tmp_path, capsys):
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {"rules": {"dp": {"batch": "data"}, "dp_tp": {"batch": "data", "hidden": "model"}}}
        )
    )
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--program",
            EQX,
            "--axis-types",
            "auto",
            "--devices",
            "8",
            "--rules",
            str(rules),
            "--meshes",
            "data=2,model=4;data=8,model=1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert len(data["plans"]) == 4 and data["axes"] == ["data", "model"]
    assert "dp_tp" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["plan", "--program", "nowhere.py:make_step", "--devices", "8"], "does not exist"),
        (
            ["plan", "--program", EQX.replace("make_step", "nope"), "--devices", "8"],
            "defines no 'nope'",
        ),
        (["plan", "--program", "eqx_mlp", "--devices", "8"], "write FILE.py:FUNCTION"),
        (["plan", "--program", EQX, "--devices", "8", "--model", "tiny"], "(drop it)"),
        (["plan", "--model", "tiny", "--devices", "8", "--rules", "r.json"], "give --program"),
        (["plan", "--model", "tiny", "--devices", "8", "--rule-set", "dp"], "give --program"),
        (
            ["audit", FLAX, "--mesh", "data=2,model=4"],
            "choose one with --rule-set NAME",
        ),
        (["audit", FLAX, "--mesh", "data=2,model=4", "--rule-set", "zz"], "is not in"),
        (["audit", FLAX], "needs --mesh"),
        (["diff", "a.json"], "the following arguments are required"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert_usage_error(argv, words, capsys)


def test_cli_a_program_that_returns_no_pair(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def make_step(mesh):\n    return 3\n")
    assert_usage_error(
        ["audit", f"{bad}:make_step", "--mesh", "data=8"], "must return a pair", capsys
    )
    broken = tmp_path / "broken.py"
    broken.write_text("import jax\ndef make_step(mesh):\n    raise ValueError('no model')\n")
    assert_usage_error(
        ["audit", f"{broken}:make_step", "--mesh", "data=8"], "raised ValueError: no model", capsys
    )


def test_cli_diff_of_files_of_another_schema(tmp_path, capsys):
    old, new = _audit_files(tmp_path, 99)
    assert_usage_error(["diff", str(old), str(new)], "schema version 99", capsys)


def _scoped_audit(gather: bool, scope: str = "block1"):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, P("model")))

    def f(x, w):
        with jax.named_scope("block0"):
            y = x @ w  # an all-reduce over 'model'
        with jax.named_scope(scope):
            v = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P())) if gather else w
            return y + jnp.sum(v)

    return shardscope.audit(jax.jit(f), x, w)


def test_diff_by_scope_names_the_block_that_changed(tmp_path, capsys):
    from shardscope._src.base.records import write_result

    before, after = _scoped_audit(False), _scoped_audit(True)
    d = shardscope.diff_audits(before, after, by_scope=True, no_new=["all-gather"])
    (row,) = [r for r in d.changed if r.kind == "all-gather"]
    assert (row.scope, row.status, row.new_count) == ("block1", "new", 1)
    assert not d.ok and "in block1" in d.violations[0]
    assert "block1" in d.text() and "scope" in d.text()
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_result(old, before)
    write_result(new, after)
    assert main(["diff", str(old), str(new), "--by-scope", "--no-new", "all-gather"]) == 1
    assert "block1" in capsys.readouterr().out


def test_a_diff_captured_as_a_ci_log_keeps_every_cell_whole(tmp_path, capsys):
    from shardscope._src.base.records import write_result

    scope = "transformer/decoder/layer_11/self_attention"  # a module path as Flax names it
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_result(old, _scoped_audit(False, scope))
    write_result(new, _scoped_audit(True, scope))
    assert main(["diff", str(old), str(new), "--by-scope"]) == 0
    out = capsys.readouterr().out  # not a terminal: no width to follow
    assert "…" not in out
    assert re.search(rf"\+ new\s+{scope}\s+model\s+all-gather\s+0 -> 1\s", out), out


def test_diff_by_scope_of_audits_without_scopes_names_the_parameter(tmp_path, capsys):
    audit = _scoped_audit(False).to_dict()
    del audit["by_scope"]  # as an older shardscope wrote it
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 2, **audit}))
    with pytest.raises(shardscope.AuditDiffError, match="by_scope=False") as info:
        shardscope.diff_audits(path, path, by_scope=True)
    assert info.value.params == ("by_scope",) and "--" not in str(info.value)
    with pytest.raises(SystemExit):
        main(["diff", str(path), str(path), "--by-scope"])
    assert capsys.readouterr().err.rstrip().endswith("(flag --by-scope)")


def _bf16_step(mesh, rules):
    spec_w = shardscope.logical_to_spec(("embed", "hidden"), rules)
    spec_x = shardscope.logical_to_spec(("batch", "embed"), rules)
    w = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, spec_w))
    x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, spec_x))

    def step(w, x):
        return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w).astype(jnp.float32) ** 2))(w)

    return jax.jit(step), (w, x)


def test_plan_program_on_a_target_compiler():
    rules = {"fsdp": [("batch", "data"), ("embed", "data")]}
    r = shardscope.plan_program(
        _bf16_step, 8, rules=rules, axes=("data",), target="h100", axis_types="auto"
    )
    assert r.target == "h100" and r.hardware.name == "h100"
    (p,) = r.plans
    # The H100 compiler gathers the weight and sums the gradient in bf16 (the CPU: in f32).
    assert {(c.kind, c.dtype) for c in p.collectives} == {
        ("all-gather", "bf16"),
        ("all-reduce", "bf16"),
    }
    assert p.compiled_memory["argument_size_in_bytes"] == (1024 * 512 + 64 * 1024) * 2 // 8
    # The GPU compiler counts no FLOPs; the HLO does: per device 64 / 8 rows times the
    # gathered weight, forward and the weight's gradient (x is not differentiated).
    assert p.flops_per_device == 2 * 2 * (64 // 8) * 1024 * 512
    # Its matmuls at the H100 time model's rate (0.54 of its 989 TFLOP/s) take 63 ns; the
    # H100 compiler's program runs them as kernels, the forward's and the weight gradient's
    # at least, each no shorter than the least a kernel runs and each launched: the step's
    # compute is microseconds, not nanoseconds.
    flat = p.flops_per_device / (989e12 * 0.54)
    h100 = r.hardware
    assert p.compute_time_s >= 2 * (h100.kernel_floor_s + h100.kernel_launch_s) > 50 * flat
    assert all(n.kind != "no-flop-count" for n in r.notes)
    assert r.notes[0].kind == "compiled-memory"
    assert r.notes[0].values == CompiledMemoryValues(target="h100")
    assert "h100 compiler's own buffer assignment" in r.notes[0].text
    with pytest.raises(shardscope.ShardscopeError, match="cannot|count"):
        shardscope.plan_program(
            _bf16_step, 12, rules=rules, axes=("data",), target="h100", axis_types="auto"
        )


def _scanned_fsdp_step(mesh, rules):
    # four bf16 layers scanned, their weights split over the data axis: the H100 compiler
    # gathers each layer's weight and reduces its gradient inside the loop, beside the
    # matmuls of the loop's body
    spec_w = shardscope.logical_to_spec(("layers", "embed", "hidden"), rules)
    spec_x = shardscope.logical_to_spec(("batch", "embed"), rules)
    w = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, spec_w))
    x = jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, spec_x))

    def loss(w, x):
        x, _ = jax.lax.scan(lambda x, layer: (jnp.tanh(x @ layer), None), x, w)
        return jnp.mean(x.astype(jnp.float32) ** 2)

    return jax.jit(jax.grad(loss)), (w, x)


@pytest.mark.compiler
def test_a_target_compiled_plans_step_is_its_compute_and_the_audits_exposed_communication():
    rules = {"fsdp": [("batch", "data"), ("embed", "data")]}
    kwargs = dict(rules=rules, axes=("data",), axis_types="auto")
    (p,) = shardscope.plan_program(_scanned_fsdp_step, 8, target="h100", **kwargs).plans
    # the audit of the same program on the same hardware: what its schedule hides
    audit = shardscope.audit_program(
        _scanned_fsdp_step, "data=8", rules=rules["fsdp"], axis_types="auto", target="h100"
    )
    exposure = audit.exposure()
    assert exposure.hidden_s > 0
    assert exposure.comm_s == pytest.approx(p.comm_time_s, rel=1e-9)
    assert p.exposed_time_s == pytest.approx(exposure.exposed_s, rel=1e-9)
    # the step pays the exposed part alone: less than compute and communication end to end
    assert p.step_time_s == pytest.approx(p.compute_time_s + exposure.exposed_s, rel=1e-9)
    assert p.step_time_s < p.compute_time_s + p.comm_time_s
    # the CPU's compiler runs each collective on its own: nothing hidden
    (cpu,) = shardscope.plan_program(_scanned_fsdp_step, 8, hardware="h100", **kwargs).plans
    assert cpu.exposed_time_s is None
    assert cpu.step_time_s == pytest.approx(cpu.compute_time_s + cpu.comm_time_s, rel=1e-9)


def test_a_program_compiled_for_the_cpu_pays_its_matmuls_kernels_on_a_gpu():
    # XLA:CPU's fusions are no GPU's, but each matmul is a kernel of its own on a GPU too:
    # the forward's x @ w and the weight's gradient, two kernels each far below the least a
    # kernel runs, each launched; a TPU runs the program as one, its matmuls at the flat rate.
    rules = {"fsdp": [("batch", "data"), ("embed", "data")]}
    h100 = shardscope.plan_program(_bf16_step, 8, rules=rules, axes=("data",), hardware="h100")
    (p,) = h100.plans
    hw = h100.hardware
    assert p.flops_per_device / (989e12 * 0.54) < 1e-7
    assert p.compute_time_s == pytest.approx(2 * (hw.kernel_floor_s + hw.kernel_launch_s))
    tpu = shardscope.plan_program(
        _bf16_step, 8, rules=rules, axes=("data",), hardware="tpu-v5e"
    ).plans[0]
    assert tpu.compute_time_s == pytest.approx(tpu.flops_per_device / (197e12 * 0.75))


#: A step of one matmul and its weight's gradient, each 2 x 512 x 2,048 x 2,048 FLOPs a
#: device (the batch over 8): 8 us at the H100's bf16 rate, above the least a kernel runs.
ROWS, WIDTH = 4096, 2048


def _matmul_step(dtype, precision=None):
    def make_step(mesh, rules):
        spec_x = shardscope.logical_to_spec(("batch", "embed"), rules)
        w = jax.ShapeDtypeStruct((WIDTH, WIDTH), dtype, sharding=NamedSharding(mesh, P()))
        x = jax.ShapeDtypeStruct((ROWS, WIDTH), dtype, sharding=NamedSharding(mesh, spec_x))

        def loss(w, x):
            return jnp.mean(jnp.tanh(jnp.dot(x, w, precision=precision)).astype(jnp.float32))

        return jax.jit(jax.grad(loss)), (w, x)

    return make_step


#: Each program's matmuls' arithmetic and its rate on an H100 (989 TFLOP/s bf16, 494.5 TF32,
#: 67 fp32, dense) and a TPU v5e (197 TFLOP/s bf16, an f32 product at highest six passes),
#: each at its time model's fraction (0.54, 0.75).
ARITHMETIC = {
    "bf16": (jnp.bfloat16, None, 989e12 * 0.54, 197e12 * 0.75),
    "f32": (jnp.float32, None, 494.5e12 * 0.54, 197e12 * 0.75),
    "f32-highest": (jnp.float32, "highest", 67e12 * 0.54, 197e12 * 0.75 / 6),
}


@pytest.mark.parametrize("kind", list(ARITHMETIC))
def test_a_programs_matmuls_cost_their_flops_at_their_dtypes_rate(kind):
    # compiled for the CPU (which widens bf16 products to f32, its converts read back) and
    # priced on an H100: the compiler's FLOP count at the rate of the program's arithmetic
    # (an f32 program's as TF32, JAX's default on a GPU: twice the bf16 time; at precision
    # highest as fp32), beside the two kernels' launches; on a TPU f32 is one bf16 pass at
    # default, six at highest
    dtype, precision, gpu_rate, tpu_rate = ARITHMETIC[kind]
    rules = {"dp": [("batch", "data")]}
    step = _matmul_step(dtype, precision)
    (p,) = shardscope.plan_program(step, 8, rules=rules, axes=("data",), hardware="h100").plans
    matmuls = 2 * 2 * (ROWS // 8) * WIDTH * WIDTH
    assert matmuls <= p.flops_per_device < 1.01 * matmuls  # the CPU's count: and a tanh
    launches = 2 * shardscope.hardware("h100").kernel_launch_s
    assert p.compute_time_s == pytest.approx(p.flops_per_device / gpu_rate + launches, rel=1e-9)
    r = shardscope.plan_program(step, 8, rules=rules, axes=("data",), hardware="tpu-v5e")
    assert r.plans[0].compute_time_s == pytest.approx(p.flops_per_device / tpu_rate, rel=1e-9)


def test_a_program_compiled_for_an_h100_prices_its_f32_matmuls_as_tf32():
    # the H100 compiler's own program (its FLOPs counted from the HLO: 2 m n k each), its
    # matmuls' traffic, least time and launches set to nothing: their FLOPs at TF32's rate,
    # at fp32's at precision highest, at bf16's for a bf16 program
    rules = {"dp": [("batch", "data")]}
    free = {"hbm_fraction": 1.0, "hbm_bandwidth": 1e30, "kernel_floor_s": 0, "kernel_launch_s": 0}
    matmuls = 2 * 2 * (ROWS // 8) * WIDTH * WIDTH
    for kind, (dtype, precision, rate, _) in ARITHMETIC.items():
        (p,) = shardscope.plan_program(
            _matmul_step(dtype, precision),
            8,
            rules=rules,
            axes=("data",),
            target="h100",
            axis_types="auto",
            hardware_overrides=free,
        ).plans
        assert p.flops_per_device == matmuls, kind
        assert p.compute_time_s == pytest.approx(matmuls / rate, rel=1e-9), kind


def test_the_gpu_kernel_cache_changes_nothing_a_plan_reads(monkeypatch):
    import os

    from shardscope._src.mesh import axis_types_of
    from shardscope._src.plan.compile import gpu_kernel_cache
    from shardscope._src.program import program

    def compile_once():
        compiled = program.compile_candidate(
            _bf16_step,
            (("batch", "data"), ("embed", "data")),
            {"data": 8},
            None,
            where="bf16",
            target="h100",
            axis_types=axis_types_of("auto", ("data",)),
        )[0]
        return compiled.audit.hlo_text, compiled.memory

    got = []
    for cached in (False, True, True):  # the second cached takes its kernels from the file
        with monkeypatch.context() as m:
            if not cached:
                m.setattr(program, "gpu_kernel_cache", lambda: {})
            got.append(compile_once())  # (one line: the HLO names its callers' lines)
    assert got[1] == got[0] and got[2] == got[0]
    assert os.path.getsize(gpu_kernel_cache()["xla_gpu_kernel_cache_file"]) > 0


def test_cli_audits_a_program_on_a_target(capsys):
    code = main(
        [
            "audit",
            EQX,
            "--axis-types",
            "auto",
            "--mesh",
            "data=8,model=1",
            "--rule-set",
            "dp",
            "--target",
            "h100",
            "--json",
            "-",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "gpu" and data["target"] == "h100"
    assert_usage_error(
        ["audit", "--hlo", "x.txt", "--mesh", "data=8", "--target", "h100"],
        "unrecognized arguments: --target",
        capsys,
    )
    assert_usage_error(
        ["plan", "--program", EQX, "--devices", "8", "--compiler", "tpu-v5p"],
        "give --hardware tpu-v5p",
        capsys,
    )
