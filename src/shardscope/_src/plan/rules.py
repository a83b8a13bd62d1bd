"""Logical-axis rules, as a user's program is planned with them: Flax's pairs ``(logical name,
mesh axes)``, the mesh axes a name, a tuple of names or None (not sharded), in one set or in
named sets, from Python or from a JSON file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardscope._src.base.errors import PlanError
from shardscope._src.base.records import read_json

#: A rule set: ``((logical name, mesh axes or None), ...)``.
Rules = tuple[tuple[str, Any], ...]
AS_WRITTEN = "as written"


def _rule_axes(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise PlanError(
        f"{where}: mesh axes {value!r} must be a mesh axis name, a list of names or null"
    )


def _rule_set(name: str, value: Any) -> Rules:
    where = f"rule set {name!r}"
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list | tuple):
        pairs = []
        for i, pair in enumerate(value):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise PlanError(
                    f"{where}, rule {i}: {pair!r} is not a pair (logical name, mesh axes); "
                    f"write e.g. ['batch', 'data'] or ['embed', null]"
                )
            pairs.append(tuple(pair))
    else:
        raise PlanError(
            f"{where}: {type(value).__name__} is not a list of (logical name, mesh axes) pairs"
        )
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for logical, axes in pairs:
        if not isinstance(logical, str) or not logical:
            raise PlanError(f"{where}: logical axis name {logical!r} must be a non-empty string")
        if logical in seen:
            raise PlanError(f"{where}: logical axis {logical!r} has two rules; keep one")
        seen.add(logical)
        names = _rule_axes(axes, f"{where}, {logical!r}")
        out.append((logical, None if not names else names[0] if isinstance(axes, str) else names))
    return tuple(out)


def normalize_rules(rules: Any) -> dict[str, Rules]:
    """``{name: rule set}`` from one rule set (pairs or a mapping) or a mapping of named sets.

    >>> normalize_rules([("batch", "data"), ("embed", None)])
    {'rules': (('batch', 'data'), ('embed', None))}
    """
    if rules is None:
        return {AS_WRITTEN: ()}
    if (
        isinstance(rules, Mapping)
        and rules
        and all(isinstance(v, Mapping | list | tuple) for v in rules.values())
    ):
        if not all(isinstance(k, str) and k for k in rules):
            raise PlanError("rule set names must be non-empty strings")
        return {name: _rule_set(name, value) for name, value in rules.items()}
    if isinstance(rules, list | tuple | Mapping):
        return {"rules": _rule_set("rules", rules)}
    raise PlanError(
        f"rules must be (logical name, mesh axes) pairs or a mapping of named rule sets, got "
        f"{type(rules).__name__}"
    )


def rules_axes(rule_sets: Mapping[str, Rules]) -> tuple[str, ...]:
    """The mesh axes the rule sets name, in order of first appearance."""
    out: dict[str, None] = {}
    for rules in rule_sets.values():
        for _, axes in rules:
            for a in _rule_axes(axes, ""):
                out.setdefault(a, None)
    return tuple(out)


def check_rules_axes(rule_sets: Mapping[str, Rules], axes: Sequence[str]) -> None:
    for name, rules in rule_sets.items():
        for logical, value in rules:
            for a in _rule_axes(value, ""):
                if a not in axes:
                    raise PlanError(
                        f"rule set {name!r} maps {logical!r} to mesh axis {a!r}, which is not "
                        f"one of the mesh axes ({', '.join(axes)}); use one of them or add "
                        f"{a!r} to the axes"
                    )


def load_rules_file(path: str | os.PathLike[str]) -> tuple[dict[str, Rules], tuple[str, ...]]:
    """Rule sets and mesh axes from a JSON file.

    The file holds ``{"axes": ["data", "model"], "rules": {"dp": [["batch", "data"], ...],
    ...}}``; ``axes`` is optional (default: the axes the rules name) and a rule set may be a
    ``{logical: mesh axes}`` object. Mesh axes are a name, a list of names or null.
    """
    data = read_json(path, "rules file", PlanError)
    if not isinstance(data, Mapping) or "rules" not in data:
        raise PlanError(
            f'rules file {str(path)!r} must be a JSON object with "rules": {{name: [[logical, '
            f'mesh axes], ...]}} (and optionally "axes": [...])'
        )
    unknown = set(data) - {"rules", "axes"}
    if unknown:
        raise PlanError(
            f"rules file {str(path)!r}: unknown key(s) {', '.join(sorted(unknown))}; only "
            f'"rules" and "axes"'
        )
    rule_sets = normalize_rules(data["rules"])
    axes: tuple[str, ...] = ()
    if "axes" in data:
        raw = data["axes"]
        if not isinstance(raw, list) or not raw or not all(isinstance(a, str) and a for a in raw):
            raise PlanError(f'rules file {str(path)!r}: "axes" must be a list of axis names')
        axes = tuple(raw)
        check_rules_axes(rule_sets, axes)
    return rule_sets, axes


def format_rules(rules: Rules) -> str:
    """``batch->data, embed->-``."""
    if not rules:
        return "the program's own shardings"

    def axes(v: Any) -> str:
        if v is None:
            return "-"
        return v if isinstance(v, str) else "(" + ",".join(v) + ")"

    return ", ".join(f"{k}->{axes(v)}" for k, v in rules)
