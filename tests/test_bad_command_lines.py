"""Bad command lines, for every sub-command: exit 2, one line on stderr naming the problem, no
traceback, nothing on stdout, no file written or left behind.

``BAD`` is the table: append a row for every new flag or rule (``{tmp}`` stands for a scratch
folder holding a file ``afile`` and a folder ``adir``). Rows for empty and malformed values
of every option are made from the parser itself, and every ``lab`` and ``audit`` row is also
tried through ``launch``, which must refuse it once, before starting any process.
"""

import pytest

from helpers import sub_parser
from shardscope._src.cli.main import main

# (command line, words the one stderr line must hold)
BAD: list[tuple[list[str], str]] = [
    # lab
    (["lab", "--out", "{tmp}/afile"], "is a file, not a folder"),
    (["lab", "--out", "{tmp}/afile/sub"], "is a file, not a folder"),
    (["lab", "--devices", "0"], "must be a positive whole number"),
    (["lab", "--process-id", "-1"], "-1 must be 0 or more"),
    (["lab", "--coordinator", "nohostport"], "--coordinator"),
    (["lab", "extra"], "unrecognized arguments: extra"),
    # audit
    (["audit"], "required: PROGRAM"),
    (["audit", "transpose"], "invalid choice: 'transpose'"),
    (["audit", "matmul", "--mesh", "model"], "has no size"),
    (["audit", "matmul", "--mesh", "model=0"], "model=0"),
    (["audit", "matmul", "--mesh", "model=\u00b2"], "model=\u00b2"),
    (["audit", "matmul", "--mesh", "a=2,a=4"], "axis name 'a' is repeated"),
    (["audit", "matmul", "--mesh", "model=3"], "not divisible by 3"),
    (["audit", "matmul", "--mesh", "model=99999999999"], "more than this tool supports"),
    (["audit", "matmul", "--mesh", "model=64", "--devices", "8"], "give --devices 64"),
    (["audit", "matmul", "--m", "0"], "must be a positive whole number"),
    (["audit", "matmul", "--mesh", "model=16", "--k", "1000", "--devices", "16"], "1000"),
    (["audit", "matmul", "--dtype", "float99"], "float99"),
    (["audit", "matmul", "--a-spec", "bogus,None"], "names axis 'bogus'"),
    (["audit", "matmul", "--b-spec", "model,model"], "model"),
    (["audit", "matmul", "--out-spec", "None"], "out-spec"),
    (["audit", "matmul", "--json", "{tmp}/adir"], "is a folder, not a file"),
    (["audit", "matmul", "--json", "{tmp}/afile/x.json"], "is a file, not a folder"),
    (["audit", "reshard", "--mesh", "model=5"], "5"),
    (["audit", "reshard", "--devices", "4"], "give --devices 8 or a smaller mesh"),
    (["audit", "transformer"], "--strategy"),
    (["audit", "transformer", "--strategy", "zz"], "unknown strategy 'zz'; choose a preset"),
    (["audit", "transformer", "--strategy", "tp", "--heads", "3"], "heads"),
    (["audit", "transformer", "--strategy", "tp", "--dtype", "int8"], "int8"),
    (["audit", "transformer", "--strategy", "tp", "--mode", "sideways"], "invalid choice"),
    (["audit", "transformer", "--strategy", "dp_tp", "--mesh", "model=8"], "data"),
    (["audit", "hlo", "--hlo", "{tmp}/missing.hlo", "--mesh", "x=8"], "does not exist"),
    (["audit", "--hlo", "{tmp}/afile"], "needs --mesh"),
    (
        ["audit", "hlo", "--hlo", "{tmp}/afile", "--mesh", "x=8", "--json", "{tmp}/afile"],
        "would overwrite the input --hlo",
    ),
    (["audit", "hlo", "--hlo", "{tmp}/adir", "--mesh", "x=8"], "0 optimized modules"),
    (["audit", "{tmp}/missing.py:make_step", "--mesh", "x=8"], "missing.py"),
    # diff
    (["diff", "{tmp}/afile"], "NEW.json"),
    (["diff", "{tmp}/afile", "{tmp}/afile", "--json", "{tmp}/afile"], "would overwrite the input"),
    (
        ["diff", "{tmp}/afile", "{tmp}/afile", "--no-new", "all-sideways"],
        "kind 'all-sideways': choose one of all-reduce",
    ),
    # plan
    (["plan"], "--devices"),
    (["plan", "--devices", "8"], "preset"),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--strategies", "dp,,tp"],
        "unknown strategy ''",
    ),
    (["plan", "--devices", "8", "--model", "tiny", "--strategies", "zz"], "unknown strategy 'zz'"),
    (["plan", "--devices", "8", "--model", "tiny", "--sms", "0"], "must be a positive whole"),
    (
        ["serve", "--devices", "1", "--model", "tiny", "--prompt", "8", "--output", "8"]
        + ["--hardware", "tpu-v5e", "--tile-m", "64", "--compiler", "cpu"],
        "tile_m=64 on tpu-v5e: it has no streaming multiprocessors",
    ),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--json", "{tmp}/x", "--png", "{tmp}/x"],
        "--json and --png both write",
    ),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--png", "{tmp}/r", "--report", "{tmp}/./r"],
        "--png and --report both write",
    ),
    # the example file name of the result's kind
    (["plan", "--devices", "8", "--model", "tiny", "--report", "{tmp}/adir"], "adir/report.md'"),
    (["plan", "--devices", "8", "--model", "tiny", "--png", "{tmp}/adir"], "adir/out.png'"),
    (["plan", "--devices", "2000000", "--model", "tiny"], "at most 1,048,576"),
    (["plan", "--devices", "8", "--model", "tiny", "--mesh", "data=16"], "has 16 devices"),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--hardware", "a100"]
        + ["--matmul-dtype", "fp8"],
        "hardware 'a100' has no fp8 matmuls",
    ),
    (["plan", "--devices", "8", "--model", "tiny", "--mesh", "data=2,foo=4"], "axis 'foo' is none"),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--mesh", "expert=8"],
        "its 'expert' axis splits a mixture's routed experts, and tiny has none",
    ),
    (["plan", "--devices", "8", "--model", "tiny", "--stages", "3"], "(flag --stages)"),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--mesh", "data=8", "--strategies", "tp"],
        "strategies that run on it: replicated, dp, fsdp",
    ),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--mesh", "data=8", "--stages", "2"],
        "disagree",
    ),
    (["plan", "--devices", "8", "--model", "huge"], "unknown model preset 'huge';"),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--rate", "3"],
        "--rate describes serving; give --serve with it",
    ),
    (
        ["plan", "--devices", "8", "--model", "tiny", "--rate", "3", "--prompt", "64"],
        "describe serving; give --serve with them",
    ),
    (
        ["plan", "--devices", "8", "--model", "qwen3-30b"],
        "unknown model preset 'qwen3-30b' (did you mean 'qwen3-30b-a3b'?)",
    ),
    (["plan", "--devices", "8", "--model", "tiny", "--hardware", "abacus"], "invalid choice"),
    (["plan", "--devices", "8", "--model", "tiny", "--memory", "-5"], "positive number"),
    (["plan", "--devices", "8", "--model", "tiny", "--memory", "nan"], "positive number"),
    (["plan", "--devices", "8", "--model", "tiny", "--latency", "inf"], "positive number"),
    (["plan", "--devices", "8", "--model", "tiny", "--seq", str(2**21)], "up to"),
    (["plan", "--devices", "8", "--model", "tiny", "--coordinator", "h:1"], "unrecognized"),
    # launch itself
    (["launch"], "-n/--num-processes"),
    (["launch", "-n", "2"], "no sub-command"),
    (["launch", "-n", "2", "--", "launch", "-n", "2", "--", "lab"], "cannot launch itself"),
    (["launch", "-n", "2", "--", "plan", "--devices", "8"], "cannot run as several processes"),
    (["launch", "-n", "2", "--", "lab", "--devices", "4"], "remove --devices"),
    (["launch", "-n", "0", "--", "lab"], "must be a positive whole number"),
    (["launch", "-n", "2", "--timeout", "0", "--", "lab"], "positive number"),
    (["launch", "-n", "2", "--", "teleport"], "invalid choice: 'teleport'"),
    (["launch", "-n", "999", "--", "lab"], "999"),
    # anywhere
    ([], "required: COMMAND"),
    (["teleport"], "invalid choice: 'teleport'"),
]

# A valid start for each sub-command, to which one bad option is added.
BASE: dict[tuple[str, ...], list[str]] = {
    ("lab",): [],
    ("audit", "matmul"): [],
    ("audit", "reshard"): [],
    ("audit", "transformer"): ["--strategy", "tp"],
    ("audit", "program"): ["{tmp}/x.py:f", "--mesh", "x=8"],
    ("audit", "hlo"): ["--hlo", "{tmp}/afile", "--mesh", "x=8"],
    ("plan",): ["--devices", "8", "--model", "tiny"],
    ("diff",): ["{tmp}/afile", "{tmp}/afile"],
    ("launch",): ["-n", "2"],
}
_LAUNCH_TAIL = ["--", "lab"]


def _generated() -> list[tuple[list[str], str]]:
    """Every option that takes a value, given an empty one, a blank one and (for numbers) a
    word, a huge number and a digit of another script."""
    rows = []
    for path, base in BASE.items():
        tail = _LAUNCH_TAIL if path == ("launch",) else []
        for action in sub_parser(path)._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            flag = action.option_strings[-1]
            values = [("", "is empty"), (" ", "is empty")]
            if action.type is not None and action.choices is None:
                values += [("x", "'x'"), ("\u00b2", "\u00b2"), ("9" * 5000, flag)]
            for value, words in values:
                rows.append(([*path, *base, flag, value, *tail], words))
    return rows


def _launched() -> list[tuple[list[str], str]]:
    """The lab and audit rows again, as the sub-command of a two-process launch."""
    rows = []
    for argv, words in BAD:
        launcher_flags = {"--devices", "--process-id", "--num-processes", "--coordinator"}
        if argv[:1] in (["lab"], ["audit"]) and not launcher_flags & set(argv):
            rows.append((["launch", "-n", "2", "--", *argv], words))
    return rows


ROWS = BAD + _generated() + _launched()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_table_covers_every_sub_command():
    commands = {tuple(argv[:2]) if argv[:1] == ["audit"] else tuple(argv[:1]) for argv, _ in ROWS}
    assert set(BASE) <= commands


@pytest.mark.parametrize(
    "argv, words", ROWS, ids=[" ".join(a)[:60] or "(nothing)" for a, _ in ROWS]
)
def test_bad_command_line(argv, words, scratch, capsys):
    argv = [a.replace("{tmp}", str(scratch)) for a in argv]
    before = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    assert words in err, err
    assert len(err) < 1000, err  # a value is named, not echoed whole
    assert sorted(p.relative_to(scratch) for p in scratch.rglob("*")) == before
    assert (scratch / "afile").read_text() == "keep"
