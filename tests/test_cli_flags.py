"""The command line names a library parameter by a flag of the command that ran, and only so.

Every parameter the library names in an error or a note (``param=`` of an error, the
``params`` of a ``Note``) is collected from the source, and each command that can show it
must have an option for it, unless it is listed in ``OMITTED`` with why.
"""

import argparse
import ast
import functools
from pathlib import Path

import pytest

from helpers import sub_parser
from shardscope._src.cli.args import DEST_OF, NO_FLAGS, Flags, UsageError
from shardscope._src.cli.main import build_parser, command_config, main

SRC = Path(__file__).resolve().parents[1] / "src" / "shardscope" / "_src"

AUDITS = [("audit", p) for p in ("program", "hlo", "matmul", "reshard", "transformer")]

#: The commands whose runs reach each module that names parameters.
COMMANDS_OF: dict[str, list[tuple[str, ...]]] = {
    "audit/compile.py": [("audit", "program")],
    "audit/diff.py": [("diff",)],
    "audit/records.py": [],  # Audit.expect's budgets: a test suite's, no command's
    "audit/stages.py": [("audit", "program"), ("plan",), ("shard",)],
    "base/distributed.py": [("lab",), *AUDITS],
    "lab/taster.py": [("lab",)],
    "launch.py": [("launch",)],
    "mesh.py": [("audit", "program"), ("plan",)],
    "model/presets.py": [("plan",)],
    "model/config.py": [("plan",)],
    "model/remat.py": [("plan",)],
    "model/serving.py": [("plan",)],
    "program/program.py": [("plan",)],
    "profile/run.py": [("profile",)],
    "train/candidates.py": [("plan",)],
    "plan/estimates.py": [("plan",)],
    "plan/request.py": [("plan",)],
    "train/sweep.py": [("plan",)],
    "serve/search.py": [("plan",), ("serve",)],
    "serve/types.py": [("plan",), ("serve",)],
    "targets/engines.py": [("plan",), ("serve",)],
    "suggest/suggest.py": [("shard",)],
    "plan/cluster.py": [("shard",)],
    "train/target.py": [("plan",)],
    "plan/types.py": [("plan",)],
    "train/types.py": [("plan",)],
    "sharding/rules.py": [("audit", "program"), ("plan",)],
    "sharding/strategies.py": [("audit", "transformer")],
    "verdict/reports.py": [("audit", "moe")],
}

#: ``param=`` values that are not written out where they are raised: what they can hold.
COMPUTED: dict[tuple[str, str], set[str]] = {
    # check_dims: the model dimensions and sizes the planner takes
    ("plan/request.py", "name"): {"batch", "seq", "d_model", "heads", "ff", "layers", "vocab"},
    # _resolve: the dimensions missing from a model given by its shape
    ("train/sweep.py", "tuple(missing)"): {"d_model", "heads", "ff", "layers"},
    # ServeRequest's counts and formats, checked in loops
    ("plan/request.py", "what"): {"devices", "prompt", "output", "weights", "cache"},
    # serve()'s refusal of what fits nowhere names what to change (_no_fit)
    ("serve/search.py", "param"): {"devices", "batch", "context", "memory_share"},
    # a serving result's notes read back from its JSON: the serving notes' parameters
    ("serve/types.py", "tuple(n.get('params', ()))"): {"devices"},
    # Vocab.parse raises with its caller's param=, collected where the caller writes it
    ("base/vocab.py", "param"): set(),
    # so do kind_named and parse_budget
    ("base/comm.py", "param"): set(),
    # Audit.expect's byte budgets, read by _byte_budget
    ("audit/records.py", "param"): {"traffic_bytes", "bytes_per_axis"},
    # no plan at all: a micro-batch count the data shards' sequences do not split into,
    # before what no_plan_note names (a memory the model state outgrew)
    ("train/types.py", "('microbatches', 'batch', *note.params)"): {
        "microbatches",
        "batch",
        "devices",
        "hardware",
        "memory_bytes",
        "bytes_per_param",
    },  # fmt: skip
    # the no-fit note: the request's choices that narrowed the search (PlanResult.
    # pinned_choices) before what it always names
    ("plan/types.py", "(*pinned, *FIT_PARAMS)"): {
        "remat",
        "microbatches",
        "stages",
        "mesh",
        "offload_optimizer",
        "flash_attention",
        "devices",
        "batch",
        "seq",
        "memory_bytes",
    },  # fmt: skip
}

#: (command, parameter) pairs that the command deliberately names by no flag, and why.
OMITTED: dict[tuple[tuple[str, ...], str], str] = {
    # shard searches the mesh: a mesh that does not divide an argument is a proposal it
    # skips, not a value the user gave
    (("shard",), "mesh"): "the search's own meshes",
}


def _strings(node: ast.AST, names: dict[str, set[str]]) -> set[str] | None:
    """The parameter names ``node`` holds, if it is written out (a string, a tuple of them,
    or a name assigned one of these in the same module)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return {e.value for e in node.elts}  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    return None


def _named_tuples(tree: ast.AST) -> dict[str, set[str]]:
    """Names assigned a tuple of strings anywhere in the module (``FIT_PARAMS``, ``params``)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            values = _strings(node.value, {})
            for t in targets:
                if isinstance(t, ast.Name) and values is not None and len(values) > 0:
                    out.setdefault(t.id, set()).update(values)
    return out


@functools.cache
def library_params() -> dict[str, set[str]]:
    """Module (relative to _src) -> the parameter names it raises or notes with (the source
    is parsed once for every test that reads it)."""
    found: dict[str, set[str]] = {}
    computed_seen = set()
    trees = {
        path.relative_to(SRC).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(SRC.rglob("*.py"))
    }
    # module constants (FIT_PARAMS) are imported by other modules under the same name
    constants = {
        name: values
        for tree in trees.values()
        for name, values in _named_tuples(tree).items()
        if name.isupper()
    }
    for module, tree in trees.items():
        if module.startswith("cli/"):
            continue
        names = {**constants, **_named_tuples(tree)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            exprs = [k.value for k in node.keywords if k.arg in ("param", "params")]
            if isinstance(node.func, ast.Name) and node.func.id == "Note" and len(node.args) > 2:
                exprs.append(node.args[2])
            for expr in exprs:
                values = _strings(expr, names)
                if values is None:
                    key = (module, ast.unparse(expr))
                    assert key in COMPUTED, f"{module}:{node.lineno}: list what {key[1]} holds"
                    computed_seen.add(key)
                    values = COMPUTED[key]
                if values:
                    found.setdefault(module, set()).update(values)
    assert computed_seen == set(COMPUTED), "a COMPUTED entry names no call any more"
    return found


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaves(p, (*path, name))]


def test_every_module_that_names_parameters_is_mapped_to_its_commands():
    assert set(library_params()) == set(COMMANDS_OF)
    leaves = set(_leaves(build_parser()))
    for commands in COMMANDS_OF.values():
        assert set(commands) <= leaves


@pytest.mark.parametrize(
    "module, command",
    [(m, c) for m, cs in sorted(COMMANDS_OF.items()) for c in cs],
    ids=lambda x: " ".join(x) if isinstance(x, tuple) else x,
)
def test_every_parameter_is_a_real_flag_of_the_command_or_deliberately_omitted(module, command):
    parser = sub_parser(command)
    flags = Flags.of(parser)
    for param in sorted(library_params()[module]):
        flag = flags.flag(param)
        if (command, param) in OMITTED:
            assert flag is None, f"{param} is omitted on {command} but has {flag}"
            continue
        assert flag is not None, f"{' '.join(command)} has no option for {param!r} ({module})"
        for option in flag.split("/"):
            assert parser._option_string_actions[option].dest == DEST_OF.get(param, param)


def test_every_renamed_parameter_names_an_option_some_command_has():
    dests = {
        a.dest
        for leaf in _leaves(build_parser())
        for a in sub_parser(leaf)._actions
        if a.option_strings
    }
    assert set(DEST_OF.values()) <= dests


def test_flags_come_from_the_command_that_ran():
    parse = build_parser().parse_args
    plan = command_config(parse(["plan", "--devices", "8", "--model", "tiny"])).flags
    assert plan(["make_step"]) == " (flag --program)"
    assert plan(["memory_bytes", "devices", "hlo"]) == " (flags --memory, --devices)"
    launch = command_config(parse(["launch", "-n", "2", "--", "lab"])).flags
    assert launch(["num_processes", "devices_per_process"]) == (
        " (flags -n/--num-processes, --devices-per-process)"
    )
    lab = command_config(parse(["lab"])).flags
    assert lab(["num_processes", "detect", "out_dir"]) == (
        " (flags --num-processes, --distributed, --out)"
    )
    assert lab(["make_step"]) == ""  # lab takes no program: no flag named, none invented
    assert NO_FLAGS(["devices"]) == ""


def test_a_bad_make_step_names_the_program_flag(tmp_path, monkeypatch, capsys):
    (tmp_path / "step.py").write_text("def make_step(mesh):\n    return None\n")
    (tmp_path / "rules.json").write_text('{"axes": ["data"], "rules": {"a": [["b", "data"]]}}')
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--program", "step.py:make_step", "--devices", "8", "--rules", "rules.json"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "takes no rules" in err and err.rstrip().endswith("(flag --program)"), err
    assert "--make-step" not in err


def test_an_error_with_shell_words_is_printed_in_them_alone():
    from shardscope._src.base.errors import AxisTypeError
    from shardscope._src.cli.main import in_shell_words

    flags = command_config(build_parser().parse_args(["audit", "program", "f.py:g"])).flags
    python = AxisTypeError("build it with axis_types='auto'", param="axis_types")
    assert in_shell_words(python, flags) == "build it with axis_types='auto' (flag --axis-types)"
    both = AxisTypeError(
        "build it with axis_types='auto'",
        param="axis_types",
        shell="build it with --axis-types auto",
    )
    assert str(both) == "build it with axis_types='auto'"  # Python callers keep the library's
    assert in_shell_words(both, flags) == "build it with --axis-types auto"


def test_an_auto_axes_program_is_told_the_flag_in_the_shell(tmp_path, monkeypatch, capsys):
    from helpers import assert_usage_error

    (tmp_path / "step.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "def make_step(mesh):\n"
        "    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P()))\n"
        "    step = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P('data')))\n"
        "    return step, (x,)\n"
    )
    monkeypatch.chdir(tmp_path)
    line = assert_usage_error(
        ["audit", "step.py:make_step", "--mesh", "data=8"], "--axis-types auto", capsys
    )
    assert "axis_types=" not in line and "(flag" not in line


def test_the_launcher_names_its_own_flag_for_the_devices_of_each_process(capsys):
    from helpers import assert_usage_error

    line = assert_usage_error(
        ["launch", "-n", "2", "--", "lab", "--devices", "4"],
        "give the devices of each process as --devices-per-process N (before the --)",
        capsys,
    )
    assert "devices_per_process" not in line


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "tiny", "--devices", "8"],
        ["serve", "--model", "tiny", "--devices", "8", "--prompt", "8", "--output", "8"],
        ["profile", "prog.py:step", "--mesh", "data=8"],
    ],
    ids=["plan", "serve", "profile"],
)
def test_a_hardware_preset_is_named_in_any_case_as_a_model_preset_is(argv):
    parser = build_parser()
    assert parser.parse_args([*argv, "--hardware", "H100"]).hardware == "h100"
    assert parser.parse_args([*argv, "--hardware", "TPU-v5p"]).hardware == "tpu-v5p"
    with pytest.raises(UsageError, match="invalid choice: 'h10'"):
        parser.parse_args([*argv, "--hardware", "H10"])
