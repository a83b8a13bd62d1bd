"""``shardscope profile FILE.py:FUNCTION`` and ``profile --trace DIR``: the checks of its input
and its run as library calls (its options are in parsers.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from shardscope._src.audit.user_program import check_program_ref, load_program
from shardscope._src.base.errors import ProfileError, ShardscopeError, one_line
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.args import PROG, UsageError
from shardscope._src.cli.audit_program import mesh_needed, simulate_devices
from shardscope._src.cli.config import ProfileConfig
from shardscope._src.cli.paths import check_output_paths, print_written
from shardscope._src.profile.records import Profile
from shardscope._src.profile.run import profile_program, profile_program_trace, profile_trace
from shardscope._src.render.console import output_console
from shardscope._src.render.profile import profile_width, render_profile
from shardscope._src.render.profile_plot import plot_profile_timeline
from shardscope._src.sharding.rules import load_rules_file
from shardscope._src.targets.specs import Family, get_target


def check_profile(c: ProfileConfig) -> None:
    """Everything ``profile`` can refuse before JAX starts."""
    if c.trace is None:
        if c.program_ref is None:
            raise UsageError(
                f"{PROG} profile: give the program, FILE.py:FUNCTION --mesh SPEC, or a trace "
                f"taken elsewhere, --trace DIR --audit FILE"
            )
        for flag, value in (("--audit", c.audit), ("--compiler", c.compile_target)):
            if value is not None:
                raise UsageError(
                    f"{PROG} profile: {flag} is for joining a trace taken elsewhere (--trace "
                    f"DIR); a program profiled here runs on this machine's devices"
                )
    elif (c.audit is None) == (c.program_ref is None):
        raise UsageError(
            f"{PROG} profile --trace: give what the trace ran, either --audit FILE (written "
            f"by 'shardscope audit --json') or FILE.py:FUNCTION --mesh SPEC, not "
            f"{'both' if c.audit else 'neither'}"
        )
    check_output_paths(
        {"--json": c.json, "--png": c.png},
        {"--audit": c.audit, "--rules": c.rules},
    )
    if c.program_ref is not None:
        mesh_needed(c.mesh, f"profiling {c.program_ref}")
        check_program_ref(c.program_ref)
    if c.rules is not None:
        load_rules_file(c.rules)


def profile_command(c: ProfileConfig) -> int:
    result = run_profile(c)
    if c.json != STDOUT:
        console = output_console(piped_width=profile_width(result, by_scope=c.by_scope))
        render_profile(result, console=console, by_scope=c.by_scope)
    written: list[Path | None] = []
    if c.png is not None:
        written.append(plot_profile_timeline(result, c.png))
    if c.json is not None:
        written.append(write_result(c.json, result, leading=_leading(c)))
    if c.json != STDOUT:
        print_written(console, written)
    return 0


def _leading(c: ProfileConfig) -> dict[str, Any]:
    return {"program_ref": c.program_ref, "audit_file": c.audit}


def run_profile(c: ProfileConfig) -> Profile:
    """The profile the command line asks for, by library calls."""
    if c.trace is not None and c.audit is not None:
        return profile_trace(c.trace, c.audit, hardware=c.hardware)
    assert c.program_ref is not None  # check_profile refused the command line otherwise
    axes = mesh_needed(c.mesh, f"profiling {c.program_ref}")
    if c.compile_target is None or get_target(c.compile_target).family == Family.CPU:
        simulate_devices(math.prod(axes.values()))
    make_step = load_program(c.program_ref)
    options: dict[str, Any] = {
        "rules": c.rules,
        "rule_set": c.rule_set,
        "axis_types": c.axis_types,
    }
    try:
        if c.trace is not None:
            return profile_program_trace(
                c.trace,
                make_step,
                axes,
                target=c.compile_target,
                hardware=c.hardware,
                name=c.program_ref,
                **options,
            )
        return profile_program(
            make_step,
            axes,
            where=c.program_ref,
            steps=c.steps,
            warmup=c.warmup,
            hardware=c.hardware,
            trace_dir=c.trace_dir,
            **options,
        )
    except ShardscopeError:
        raise
    except Exception as e:  # the user's program failed to build: one line, --debug for more
        raise ProfileError(
            f"{c.program_ref} on mesh {c.mesh} raised {one_line(e)} (--debug shows the traceback)"
        ) from e
