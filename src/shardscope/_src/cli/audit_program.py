"""``shardscope audit FILE.py:FUNCTION`` and ``audit --hlo FILE``: a user's own program, or a
compiler's dump of one, audited by library calls."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from shardscope._src.audit.compile import audit, audit_program
from shardscope._src.audit.stages import load_program
from shardscope._src.base.devices import backends_started, use_cpu_devices
from shardscope._src.base.errors import MeshSpecError, ProgramError, ShardscopeError, one_line
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.mesh import parse_mesh_spec
from shardscope._src.plan.rules import check_rules_axes, load_rules_file, normalize_rules
from shardscope._src.render.audit import render_audit


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
) -> int:
    """Audits ``make_step(mesh)`` from ``FILE.py:FUNCTION`` on the mesh ``mesh_spec``: of
    simulated CPU devices, or of ``target``'s compile-only devices (its own compiler);
    ``by_scope`` prints the totals per scope instead of one row per collective."""

    axes = mesh_needed(mesh_spec, f"auditing {ref}")
    sets: Any = None
    source = "the program's RULES"
    if rules_path is not None:
        sets, _ = load_rules_file(rules_path)
        source = f"rules file {rules_path!r}"
    if target is None:
        simulate_devices(math.prod(axes.values()))
    make_step = load_program(ref)
    if sets is None:
        own = module_rules(make_step)
        sets = normalize_rules(own) if own is not None else None
    rules = _pick_rules(sets, rule_set, source, tuple(axes))
    try:
        result = audit_program(
            make_step, axes, rules=rules, axis_types=axis_types, target=target, where=ref
        )
    except ShardscopeError:
        raise
    except Exception as e:  # the user's program failed: one line, --debug for the traceback
        raise ProgramError(
            f"{ref} on mesh {mesh_spec} raised {one_line(e)} (--debug shows the traceback)"
        ) from e
    title = f"{ref} on {mesh_spec}"
    return _show_audit(result, {"program": ref}, title, json_path, console, by_scope)


def module_rules(make_step: Any) -> Any:
    """The ``RULES`` of the module defining ``make_step``, or None."""
    module = sys.modules.get(getattr(make_step, "__module__", "") or "")
    return getattr(module, "RULES", None)


def _show_audit(
    result: Any,
    leading: dict[str, Any],
    title: str,
    json_path: str | None,
    console: Any,
    by_scope: bool,
) -> int:
    """Prints the audit and writes it as JSON after ``leading``; JSON on standard output
    alone."""
    if json_path is not None and str(json_path) == STDOUT:
        write_result(json_path, result, leading=leading)
        return 0
    render_audit(result, console=console, title=title, by_scope=by_scope)
    if json_path is not None:
        write_result(json_path, result, leading=leading)
    return 0


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
) -> int:
    """Audits HLO text from a compiler dump (``XLA_FLAGS=--xla_dump_to=DIR``); ``by_scope``
    prints the totals per scope instead of one row per collective."""

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
    return _show_audit(result, {"hlo_file": file}, title, json_path, console, by_scope)
