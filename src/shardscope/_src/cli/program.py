"""``shardscope audit FILE.py:FUNCTION``, ``audit --hlo``, ``diff`` and ``plan --program``: the
CLI's work for a user's own program as library calls (argparse lives in main.py)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax

from shardscope._src.audit.compile import audit
from shardscope._src.audit.diff import diff_audits
from shardscope._src.audit.stages import build_program, load_program
from shardscope._src.base.devices import backends_started, use_cpu_devices
from shardscope._src.base.errors import MeshSpecError, PlanError, ProgramError, ShardscopeError
from shardscope._src.base.io import STDOUT, check_file_path, write_result
from shardscope._src.base.targets import get_target
from shardscope._src.cli.args import NO_FLAGS, Flags
from shardscope._src.cli.plan import (
    check_device_count,
    no_plan_error,
    print_written,
    write_plan_files,
)
from shardscope._src.mesh import make_mesh, parse_mesh_spec
from shardscope._src.plan.program import (
    check_rules_axes,
    load_rules_file,
    normalize_rules,
    plan_program,
)
from shardscope._src.render.audit import render_audit
from shardscope._src.render.console import output_console
from shardscope._src.render.diff import render_diff
from shardscope._src.render.program_plan import (
    program_markdown_report,
    render_program_plan,
)
from shardscope._src.target_mesh import target_mesh


def _mesh_needed(mesh_spec: str | None, what: str) -> dict[str, int]:

    if mesh_spec is None or not mesh_spec.strip():
        raise MeshSpecError(
            f"{what} needs --mesh naming the program's mesh axes, e.g. --mesh data=2,model=4"
        )
    return parse_mesh_spec(mesh_spec)


def _simulate(n: int) -> None:
    """Simulates ``n`` CPU devices when JAX has not started (the user's file may import JAX)."""

    if not backends_started():
        use_cpu_devices(max(n, 1))


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
) -> int:
    """Audits ``make_step(mesh)`` from ``FILE.py:FUNCTION`` on the mesh ``mesh_spec``: of
    simulated CPU devices, or of ``target``'s compile-only devices (its own compiler);
    ``by_scope`` prints the totals per scope instead of one row per collective."""

    axes = _mesh_needed(mesh_spec, f"auditing {ref}")
    sets: Any = None
    source = "the program's RULES"
    if rules_path is not None:
        sets, _ = load_rules_file(rules_path)
        source = f"rules file {rules_path!r}"
    if target is None:
        _simulate(math.prod(axes.values()))
    make_step = load_program(ref)
    if sets is None:
        own = _module_rules(make_step)
        sets = normalize_rules(own) if own is not None else None
    rules = _pick_rules(sets, rule_set, source, tuple(axes))
    if target is not None:
        mesh = target_mesh(target, axes)
    else:
        mesh = make_mesh(axes, devices=jax.devices()[: math.prod(axes.values())])
    try:
        lowered = build_program(make_step, mesh, rules, where=ref)
    except ShardscopeError:
        raise
    except Exception as e:  # the user's program failed: one line, --debug for the traceback
        raise ProgramError(
            f"{ref} on mesh {mesh_spec} raised {_one_line(e)} (--debug shows the traceback)"
        ) from e
    result = audit(lowered, mesh=mesh)
    data = {"program": ref, **result.to_dict()}
    title = f"{ref} on {mesh_spec}"
    # the backend is asked for only when there is JSON to write
    backend = (result.backend or jax.default_backend()) if json_path is not None else None
    return _show_audit(result, data, title, json_path, console, by_scope, backend)


def _module_rules(make_step: Any) -> Any:
    """The ``RULES`` of the module defining ``make_step``, or None."""
    module = sys.modules.get(getattr(make_step, "__module__", "") or "")
    return getattr(module, "RULES", None)


def _show_audit(
    result: Any,
    data: dict[str, Any],
    title: str,
    json_path: str | None,
    console: Any,
    by_scope: bool,
    backend: str | None,
) -> int:
    """Prints the audit and writes ``data`` as JSON; JSON on standard output alone."""
    if json_path is not None and str(json_path) == STDOUT:
        write_result(json_path, data, backend=backend)
        return 0
    render_audit(result, console=console, title=title, by_scope=by_scope)
    if json_path is not None:
        write_result(json_path, data, backend=backend)
    return 0


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _pick_rules(
    sets: Any, rule_set: str | None, source: str, axes: tuple[str, ...]
) -> tuple[tuple[str, Any], ...]:
    """The one rule set an audit runs with: the only one, or the one ``--rule-set`` names."""

    if sets is None:
        if rule_set is not None:
            raise ShardscopeError(
                f"--rule-set {rule_set!r}: give --rules FILE, or define RULES in the program"
            )
        return ()
    check_rules_axes(sets, axes)
    if rule_set is None:
        if len(sets) > 1:
            raise ShardscopeError(
                f"{source} holds {len(sets)} rule sets ({', '.join(sets)}); choose one with "
                f"--rule-set NAME"
            )
        return tuple(next(iter(sets.values())))
    if rule_set not in sets:
        raise ShardscopeError(f"--rule-set {rule_set!r} is not in {source}: {', '.join(sets)}")
    return tuple(sets[rule_set])


def _hlo_file(path: str) -> str:
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
) -> int:
    """Audits HLO text from a compiler dump (``XLA_FLAGS=--xla_dump_to=DIR``); ``by_scope``
    prints the totals per scope instead of one row per collective."""

    axes = _mesh_needed(mesh_spec, f"auditing --hlo {path}")
    file = _hlo_file(path)
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
    data = {"hlo_file": file, **result.to_dict()}
    title = f"{os.path.basename(file)} on {mesh_spec}"
    return _show_audit(result, data, title, json_path, console, by_scope, None)


def run_diff(
    old: str,
    new: str,
    *,
    max_bytes_increase: str | None = None,
    no_new: Sequence[str] = (),
    json_path: str | None = None,
    console: Any = None,
    by_scope: bool = False,
) -> int:
    """Prints how the collectives changed; 1 when a budget is broken, else 0."""

    d = diff_audits(
        old, new, max_bytes_increase=max_bytes_increase, no_new=no_new, by_scope=by_scope
    )
    if json_path != STDOUT:
        render_diff(d, console=console)
    if json_path is not None:
        write_result(json_path, d.to_dict(), backend=None)
    return 0 if d.ok else 1


def run_plan_program(
    ref: str,
    devices: int,
    *,
    rules_path: str | None = None,
    axes: Sequence[str] | None = None,
    meshes: Sequence[str] | None = None,
    hardware: str = "h100",
    hardware_overrides: Any = None,
    json_path: str | None = None,
    png_path: str | None = None,
    report_path: str | None = None,
    top: int | None = None,
    console: Any = None,
    target: str | None = None,
    flags: Flags = NO_FLAGS,
) -> int:
    """Plans ``make_step`` from ``FILE.py:FUNCTION`` on ``devices`` (simulated CPU devices, or
    ``target``'s compile-only devices and compiler); prints, writes the files.

    Rules come from ``rules_path`` (JSON, see :func:`load_rules_file`), else the module's
    ``RULES`` if it defines one, else the program is planned as written over ``axes``.
    ``flags`` names the options of the command line after the notes that suggest a change.
    """

    check_device_count(devices)
    for path in (json_path, png_path, report_path):
        if path is not None:
            check_file_path(path)
    rules: Any = None
    if rules_path is not None:
        rules, file_axes = load_rules_file(rules_path)
        if file_axes and axes:
            raise PlanError(
                f"--axes and the rules file {rules_path!r} both name the mesh axes; keep one"
            )
        axes = axes or file_axes or None
    if target is None:
        _simulate(devices)
    make_step = load_program(ref)
    if rules is None:
        rules = _module_rules(make_step)
    if console is None:
        console = output_console(piped_width=150)
    result = plan_program(
        make_step,
        devices,
        rules=rules,
        axes=axes,
        meshes=meshes,
        hardware=hardware,
        hardware_overrides=hardware_overrides,
        target=target,
        name=ref,
    )
    if json_path != STDOUT:
        render_program_plan(result, console=console, top=top, flags=flags)
    backend = "cpu" if target is None else get_target(target).family
    written = write_plan_files(
        result,
        program_markdown_report,
        backend,
        json_path=json_path,
        png_path=png_path,
        report_path=report_path,
    )
    if json_path != STDOUT:
        print_written(console, written)
    if not result.plans:
        raise no_plan_error(result.empty_reason)
    return 0
