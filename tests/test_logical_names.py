"""The logical names of a user's program against its rules: every name a set lacks is named at
once, a close name is offered as the typo only where the program does not use it, and a rule
for a name no array carries is noted (it changes nothing) without being refused."""

import io
import json
import re
from pathlib import Path

import pytest

import shardscope
from helpers import assert_usage_error
from shardscope._src.audit.user_program import load_program
from shardscope._src.cli.main import main
from shardscope._src.plan.notes import PlanNote
from shardscope._src.sharding.rules import UnusedRules

PROGRAMS = Path(__file__).parent / "programs"
NAMED = f"{PROGRAMS / 'flax_named.py'}:make_step"
MESH = "data=2,model=4"


@pytest.fixture(scope="module")
def make_step():
    return load_program(NAMED)


@pytest.fixture(scope="module")
def names(make_step):
    """The names the program's source writes on its arrays (its ``NAMES``)."""
    return __import__(make_step.__module__).NAMES


def _named_in(message: str) -> set[str]:
    """The names an error says the program uses and the rules lack."""
    found = re.search(r"uses logical names? (.*?), which", message)
    assert found, message
    return set(re.findall(r"'([^']+)'", found.group(1)))


def _rules_file(tmp_path, sets):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"axes": ["data", "model"], "rules": sets}))
    return str(path)


# -- every missing name at once ------------------------------------------------------------------


def test_every_name_the_rules_lack_is_named_in_one_error(make_step, names, tmp_path, capsys):
    mapped = ["batch", "heads", "embed", "length"]
    rules = {"mine": [[n, "data" if n == "batch" else None] for n in mapped]}
    # The program's parameters carry head_dim and norm too: both missing, named together.
    missing = set(names) - set(mapped)
    assert missing == {"head_dim", "norm"}
    with pytest.raises(shardscope.RulesError) as info:
        shardscope.audit_program(make_step, MESH, rules=rules, axis_types="auto")
    said = str(info.value)
    assert _named_in(said) == missing
    for name in missing:
        assert f"add a rule for {name!r}" in said
    assert info.value.params == ("rules",)
    # a plan of the set: each candidate is skipped naming both
    plan = shardscope.plan_program(make_step, 8, rules=rules, meshes=[MESH], axis_types="auto")
    assert plan.plans == () and len(plan.skipped) == 1
    assert _named_in(plan.skipped[0].message) == missing
    # the command line: one line, both names
    argv = ["audit", NAMED, "--axis-types", "auto", "--mesh", MESH]
    line = assert_usage_error([*argv, "--rules", _rules_file(tmp_path, rules)], "norm", capsys)
    assert _named_in(line) == missing and line.rstrip().endswith("(flag --rules)")


def test_a_close_name_is_offered_only_where_the_program_does_not_use_it(make_step):
    # 'heads' is close to 'head_dim' but the program uses it: correcting it would leave heads
    # without a rule. 'nrom' is close to 'norm' and unused: the typo it likely is.
    rules = {"mine": [["batch", "data"], ["heads", "model"], ["embed", None], ["nrom", None]]}
    with pytest.raises(shardscope.RulesError) as info:
        shardscope.audit_program(make_step, MESH, rules=rules, axis_types="auto")
    said = str(info.value)
    assert _named_in(said) == {"head_dim", "norm"}
    assert "correct 'heads'" not in said and "'heads' is close" not in said
    assert "add a rule for 'head_dim';" in said
    assert "'nrom' is close to 'norm'" in said
    assert "correct 'nrom' to 'norm', or add a rule for 'norm'" in said


def test_the_search_names_every_name_its_rules_lack(make_step, names):
    mapped = ["batch", "heads"]
    request = dict(rules={"mine": [[n, None] for n in mapped]}, axis_types="auto")
    with pytest.raises(shardscope.RulesError) as info:
        shardscope.suggest(make_step, 8, compiles=1, **request)
    # (Linen's constraint leaves a name without a rule whole, as Flax does: not refused)
    assert _named_in(str(info.value)) == set(names) - set(mapped) - {"length"}


# -- rules no array carries ----------------------------------------------------------------------

#: A sequence-parallel set: 'length' is carried by the activation alone (a constraint in the
#: step), 'sequence' and 'vocab' by nothing.
SP = [
    ["batch", "data"],
    ["embed", None],
    ["heads", None],
    ["head_dim", None],
    ["norm", None],
    ["length", "model"],
    ["sequence", "model"],
    ["vocab", ["data", "model"]],
    ["unused_whole", None],
]


def _unused(names):
    """The rules of SP that shard a name the program's source does not write."""
    return UnusedRules("sp", tuple((n, a) for n, a in SP if a is not None and n not in names))


def test_the_audit_notes_the_rules_no_array_carries(make_step, names, tmp_path, capsys):
    expected = _unused(names)
    assert [n for n, _ in expected.rules] == ["sequence", "vocab"]
    audit = shardscope.audit_program(make_step, MESH, rules={"sp": SP}, axis_types="auto")
    assert audit.unused_rules == expected  # 'length', on an activation alone, is in force
    data = json.loads(json.dumps(audit.to_dict()))
    assert data["unused_rules"] == {
        "rule_set": "sp",
        "rules": [["sequence", "model"], ["vocab", ["data", "model"]]],
    }
    assert shardscope.Audit.from_dict(data).unused_rules == expected
    # every rule used: nothing noted
    used = [[n, a] for n, a in SP if n in names]
    quiet = shardscope.audit_program(make_step, MESH, rules={"sp": used}, axis_types="auto")
    assert quiet.unused_rules is None
    # the command line says it under the table, and exits 0 (a note, not an error)
    argv = ["audit", NAMED, "--axis-types", "auto", "--mesh", MESH, "--verbose"]
    assert main([*argv, "--rules", _rules_file(tmp_path, {"sp": SP})]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "rule set 'sp': no array of the program carries the logical names 'sequence' and "
        "'vocab', so its rules sequence->model, vocab->(data,model) change nothing here"
    ) in out


def test_the_plan_notes_them_beside_the_rules(make_step, names, tmp_path, capsys):
    from rich.console import Console

    from shardscope._src.render.program_plan import (
        program_markdown_report,
        render_program_plan,
    )

    sets = {"sp": SP, "dp": [["batch", "data"], *([n, None] for n in names if n != "batch")]}
    plan = shardscope.plan_program(make_step, 8, rules=sets, meshes=[MESH], axis_types="auto")
    assert len(plan.plans) == 2  # noted, not refused
    noted = [n.values for n in plan.notes if n.kind == PlanNote.UNUSED_RULES]
    assert noted == [_unused(names)]  # dp's rules all carried: no note of it
    console = Console(width=300, file=io.StringIO())
    render_program_plan(plan, console=console, verbose=False)
    lines = console.file.getvalue().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("rules dp:"))
    assert lines[at + 1].startswith("note: rule set 'sp': no array of the program carries")
    report = program_markdown_report(plan)
    rule_sets = report.split("## Rule sets")[1].split("##")[0]
    assert "Note: rule set 'sp': no array of the program carries the logical names" in rule_sets
    # the command line, in one line each
    argv = ["plan", "--program", NAMED, "--devices", "8", "--axis-types", "auto"]
    argv += ["--meshes", MESH, "--rules", _rules_file(tmp_path, sets)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "note: rule set 'sp': no array of the program carries the logical names" in out


def test_the_search_notes_them_with_the_users_rules(tmp_path, capsys):
    argv = ["shard", NAMED, "--devices", "8", "--compiler", "cpu", "--axis-types", "auto"]
    argv += ["--compiles", "1", "--rules", _rules_file(tmp_path, {"sp": SP})]
    argv += ["--out", str(tmp_path / "s.json")]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "note: rule set 'sp': no array of the program carries the logical names 'sequence' and "
        "'vocab'"
    ) in out
