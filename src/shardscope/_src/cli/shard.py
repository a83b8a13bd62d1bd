"""``shardscope shard``: the checks of its input and its run as a library call (its options are
in parsers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardscope._src.audit.user_program import load_program
from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.errors import PlanError
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.args import PROG, UsageError
from shardscope._src.cli.audit_program import simulate_devices
from shardscope._src.cli.config import ShardConfig
from shardscope._src.cli.options import given, print_more
from shardscope._src.cli.paths import check_output_paths, print_written
from shardscope._src.cli.plan import check_program_devices
from shardscope._src.plan.cluster import check_address
from shardscope._src.plan.request import DEFAULT_REQUEST, SuggestRequest
from shardscope._src.render.console import output_console
from shardscope._src.render.suggest import render_suggest, suggest_markdown_report
from shardscope._src.sharding.rules import load_rules_file
from shardscope._src.suggest.suggest import default_file, searched_by_array, suggest_request
from shardscope._src.targets.specs import TARGETS


def _target(c: ShardConfig) -> str | None:
    """The compiler that verifies: ``--compiler``, else the hardware's own where it has one
    (None: simulated CPU devices)."""
    hardware = c.hardware or str(DEFAULT_REQUEST.hardware)
    if c.compiler is None:
        return hardware if hardware in TARGETS else None
    return None if c.compiler == "cpu" else c.compiler


def check_shard(c: ShardConfig) -> None:
    """What ``shard`` can refuse before it builds the program: the devices, the files."""
    if _target(c) is None:
        check_program_devices(c.devices)
    hardware = c.hardware or str(DEFAULT_REQUEST.hardware)
    if c.compiler not in (None, "cpu") and c.compiler != hardware:
        raise UsageError(
            f"{PROG} shard: --compiler {c.compiler} compiles for {c.compiler} but the steps "
            f"are timed on --hardware {hardware}; give --hardware {c.compiler}"
        )
    _check_outputs(c, c.out)
    if c.out == STDOUT:
        raise UsageError(f"{PROG} shard: --out names the rules file to write; give a path")
    if c.rules is not None:
        load_rules_file(c.rules)
    if c.ray is not None:
        check_address(c.ray)  # within seconds, before the program is built


def _check_outputs(c: ShardConfig, out: str | None) -> None:
    check_output_paths(
        {"--out": out, "--json": c.json, "--report": c.report},
        inputs={"--rules": c.rules},
    )


def _names(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(n.isidentifier() for n in names):
        raise UsageError(f"{PROG} shard: {flag} {text!r}: write names, e.g. data,model")
    return names


def shard_command(c: ShardConfig, console: Any = None) -> int:
    hardware = c.hardware or str(DEFAULT_REQUEST.hardware)
    target = _target(c)
    if target is None and c.ray is None:
        simulate_devices(c.devices)
    make_step = load_program(c.program)
    # the file's default name says what it holds: rules, or a program's specs by array
    out = c.out or default_file(searched_by_array(make_step))
    if c.out is None:
        _check_outputs(c, out)
    knobs = given(c, SuggestRequest, skip=("devices", "axes", "logical_axes"))
    request = SuggestRequest(
        make_step,
        c.devices,
        target=target,
        hardware=hardware,
        hardware_overrides=c.hardware_overrides,
        logical_axes=_names(c.logical_axes, "--logical-axes"),
        axes=_names(c.axes, "--axes"),
        axis_types=c.axis_types,
        name=c.program,
        **knobs,
    )
    result = suggest_request(request)
    if console is None:
        console = output_console(piped_width=150, stderr=c.json == STDOUT)
    # where nothing fits, the advice is the error's one line, printed once
    render_suggest(result, console=console, top=c.top, verbose=c.verbose, advice=False)
    if not c.verbose:
        print_more(console, report=True)
    written: list[Path | None] = []
    own = result.own_best
    if result.keep_own and own is not None:
        console.print(
            f"the rules file holds your {own.rules_name} (no proposal beats it)", highlight=False
        )
    if result.best is not None or result.keep_own:
        written.append(result.write_rules(out))
    if c.json:
        written.append(write_result(c.json, result))
    if c.report:
        text = suggest_markdown_report(result)
        written.append(write_atomic(c.report, lambda f: f.write(text)))
    print_written(console, written)
    if result.best is None and not result.keep_own:
        raise PlanError(result.fit_advice or "no proposal compiled", param="devices")
    return 0
