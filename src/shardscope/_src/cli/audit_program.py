"""``shardscope audit FILE.py:FUNCTION`` and ``audit --hlo FILE``: a user's own program, or a
compiler's dump of one, audited by library calls."""

from __future__ import annotations

import math
import os
from typing import Any

import jax

from shardscope._src.audit.compile import audit, audit_program
from shardscope._src.audit.user_program import load_program
from shardscope._src.base.devices import backends_started, use_cpu_devices
from shardscope._src.base.errors import MeshSpecError, ProgramError, ShardscopeError, one_line
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.options import print_more
from shardscope._src.mesh import format_mesh_spec, parse_mesh_spec
from shardscope._src.render.audit import render_audit
from shardscope._src.render.console import output_console
from shardscope._src.sharding.rules import load_rules_file


def mesh_needed(mesh_spec: str | None, what: str) -> dict[str, int]:

    if mesh_spec is None or not mesh_spec.strip():
        raise MeshSpecError(
            f"{what} needs --mesh naming the program's mesh axes, e.g. --mesh data=2,model=4"
        )
    return parse_mesh_spec(mesh_spec)


def simulate_devices(n: int) -> None:
    """Simulates ``n`` CPU devices when JAX has not started (the user's file may import JAX)."""

    if not backends_started():
        use_cpu_devices(max(n, 1))


def check_devices_for(mesh_spec: str) -> None:
    """Refuses, in the shell's words, a mesh of more devices than JAX runs with (a mesh of
    fewer is built of the first devices)."""
    axes = parse_mesh_spec(mesh_spec)
    need, have = math.prod(axes.values()), jax.device_count()
    if need > have:
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} needs {need} devices but {have} are available; "
            f"give --devices {need}, or a mesh of at most {have} devices"
        )


def run_audit_program(
    ref: str,
    mesh_spec: str | None,
    json_path: str | None = None,
    *,
    rules_path: str | None = None,
    rule_set: str | None = None,
    console: Any = None,
    by_scope: bool = False,
    target: str | None = None,
    axis_types: str | None = None,
    verbose: bool = False,
) -> int:
    """Audits ``make_step(mesh)`` from ``FILE.py:FUNCTION`` on the mesh ``mesh_spec``: of
    simulated CPU devices, or of ``target``'s compile-only devices (its own compiler);
    ``by_scope`` prints the totals per scope instead of one row per collective; ``verbose``
    everything (else the answer on one screen and a line saying where the rest is)."""

    axes = mesh_needed(mesh_spec, f"auditing {ref}")
    if rules_path is not None:
        load_rules_file(rules_path)  # refused before the program runs, when it cannot be read
    if target is None:
        simulate_devices(math.prod(axes.values()))
        check_devices_for(format_mesh_spec(axes))
    make_step = load_program(ref)
    try:
        result = audit_program(
            make_step,
            axes,
            rules=rules_path,
            rule_set=rule_set,
            axis_types=axis_types,
            target=target,
            where=ref,
        )
    except ShardscopeError:
        raise
    except Exception as e:  # the user's program failed: one line, --debug for the traceback
        raise ProgramError(
            f"{ref} on mesh {mesh_spec} raised {one_line(e)} (--debug shows the traceback)"
        ) from e
    title = f"{ref} on {mesh_spec}"
    return _show_audit(result, {"program": ref}, title, json_path, console, by_scope, verbose)


def _show_audit(
    result: Any,
    leading: dict[str, Any],
    title: str,
    json_path: str | None,
    console: Any,
    by_scope: bool,
    verbose: bool,
) -> int:
    """Prints the audit (everything where ``verbose``) and writes it as JSON after
    ``leading``; JSON on standard output alone."""
    if json_path is not None and str(json_path) == STDOUT:
        write_result(json_path, result, leading=leading)
        return 0
    console = console or output_console()
    render_audit(result, console=console, title=title, by_scope=by_scope, verbose=verbose)
    if not verbose:
        print_more(console, report=False)
    if json_path is not None:
        write_result(json_path, result, leading=leading)
    return 0


def hlo_file(path: str) -> str:
    """The optimized-HLO file to read: ``path`` itself, or the one ``*after_optimizations.txt``
    in a dump folder (``XLA_FLAGS=--xla_dump_to=DIR``)."""
    if os.path.isdir(path):
        found = sorted(f for f in os.listdir(path) if f.endswith("after_optimizations.txt"))
        if len(found) != 1:
            listing = ", ".join(found[:6]) + (" ..." if len(found) > 6 else "")
            raise ShardscopeError(
                f"--hlo {path!r} is a folder with {len(found)} optimized modules "
                f"(*after_optimizations.txt){': ' + listing if found else ''}; name one file"
            )
        return os.path.join(path, found[0])
    if not os.path.exists(path):
        raise ShardscopeError(f"--hlo file {path!r} does not exist")
    return path


def run_audit_hlo(
    path: str,
    mesh_spec: str | None,
    json_path: str | None = None,
    *,
    console: Any = None,
    by_scope: bool = False,
    verbose: bool = False,
) -> int:
    """Audits HLO text from a compiler dump (``XLA_FLAGS=--xla_dump_to=DIR``); ``by_scope``
    and ``verbose`` as in :func:`run_audit_program`."""

    axes = mesh_needed(mesh_spec, f"auditing --hlo {path}")
    file = hlo_file(path)
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ShardscopeError(f"--hlo file {file!r} cannot be read: {e}") from None
    if "before_optimizations" in os.path.basename(file):
        raise ShardscopeError(
            f"--hlo {file!r} is the program before XLA's passes, without the collectives the "
            f"partitioner inserts; give the matching *after_optimizations.txt file"
        )
    result = audit(text, mesh=axes)
    title = f"{os.path.basename(file)} on {mesh_spec}"
    leading = {"hlo_file": file}
    return _show_audit(result, leading, title, json_path, console, by_scope, verbose)
