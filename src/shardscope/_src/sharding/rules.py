"""Logical-axis rules: Flax's pairs ``(logical name, mesh axes)``, the mesh axes a name, a tuple
of names or None (not sharded), in one set or in named sets, from Python, from a JSON file or
from the ``RULES`` of a program's module.

The one home of rules for the audit and the planner: reading and checking them, choosing a
set, turning logical names into a ``PartitionSpec`` (:func:`logical_to_spec`), and the two
ways they reach a program: Flax's rules context while it is built and traced, and a second
argument of ``make_step(mesh, rules)``.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import PartitionSpec

from shardscope._src.base.errors import RulesError
from shardscope._src.base.notes import NoteValues
from shardscope._src.base.records import read_json
from shardscope._src.base.text import and_list

#: What one logical name is sharded over: a mesh axis, several, or None (not sharded).
RuleAxes = str | tuple[str, ...] | None
#: A rule set: ``((logical name, mesh axes or None), ...)``.
Rules = tuple[tuple[str, RuleAxes], ...]
#: The name of the one "rule set" of a program planned as written (no rules).
AS_WRITTEN = "as written"
#: The module attribute a program's own rule sets are read from.
MODULE_RULES = "RULES"


def _rule_axes(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise RulesError(
        f"{where}: mesh axes {value!r} must be a mesh axis name, a list of names or null"
    )


def _rule_set(name: str, value: object) -> Rules:
    where = f"rule set {name!r}"
    pairs: list[tuple[object, object]]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list | tuple):
        pairs = []
        for i, pair in enumerate(value):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise RulesError(
                    f"{where}, rule {i}: {pair!r} is not a pair (logical name, mesh axes); "
                    f"write e.g. ['batch', 'data'] or ['embed', null]"
                )
            pairs.append((pair[0], pair[1]))
    else:
        raise RulesError(
            f"{where}: {type(value).__name__} is not a list of (logical name, mesh axes) pairs"
        )
    out: list[tuple[str, RuleAxes]] = []
    seen: set[str] = set()
    for logical, axes in pairs:
        if not isinstance(logical, str) or not logical:
            raise RulesError(f"{where}: logical axis name {logical!r} must be a non-empty string")
        if logical in seen:
            raise RulesError(f"{where}: logical axis {logical!r} has two rules; keep one")
        seen.add(logical)
        names = _rule_axes(axes, f"{where}, {logical!r}")
        out.append((logical, None if not names else names[0] if isinstance(axes, str) else names))
    return tuple(out)


def _is_rule_set(value: object) -> bool:
    """Whether ``value`` reads as one rule set: a mapping, or a sequence of pairs."""
    if isinstance(value, Mapping):
        return True
    return isinstance(value, list | tuple) and all(isinstance(p, list | tuple) for p in value)


def normalize_rules(rules: object) -> dict[str, Rules]:
    """``{name: rule set}`` from one rule set (pairs or a mapping) or a mapping of named sets.

    A mapping whose every value is itself a rule set (a mapping, or a list of pairs) holds
    named sets; any other mapping is one set, ``{logical name: mesh axes}``.

    >>> normalize_rules([("batch", "data"), ("embed", None)])
    {'rules': (('batch', 'data'), ('embed', None))}
    """
    if rules is None:
        return {AS_WRITTEN: ()}
    if isinstance(rules, Mapping) and rules and all(_is_rule_set(v) for v in rules.values()):
        if not all(isinstance(k, str) and k for k in rules):
            raise RulesError("rule set names must be non-empty strings")
        return {name: _rule_set(name, value) for name, value in rules.items()}
    if isinstance(rules, list | tuple | Mapping):
        return {"rules": _rule_set("rules", rules)}
    raise RulesError(
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
    """Refuses a rule that maps a logical name to an axis not among ``axes``."""
    for name, rules in rule_sets.items():
        for logical, value in rules:
            for a in _rule_axes(value, ""):
                if a not in axes:
                    raise RulesError(
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
    data = read_json(path, "rules file", RulesError)
    if isinstance(data, Mapping) and "specs" in data and "rules" not in data:
        raise RulesError(_specs_file_words(path, data), param="rules")
    if not isinstance(data, Mapping) or "rules" not in data:
        raise RulesError(
            f'rules file {str(path)!r} must be a JSON object with "rules": {{name: [[logical, '
            f'mesh axes], ...]}} (and optionally "axes": [...])'
        )
    unknown = set(data) - {"rules", "axes"}
    if unknown:
        raise RulesError(
            f"rules file {str(path)!r}: unknown key(s) {', '.join(sorted(unknown))}; only "
            f'"rules" and "axes"'
        )
    rule_sets = normalize_rules(data["rules"])
    axes: tuple[str, ...] = ()
    if "axes" in data:
        raw = data["axes"]
        if not isinstance(raw, list) or not raw or not all(isinstance(a, str) and a for a in raw):
            raise RulesError(f'rules file {str(path)!r}: "axes" must be a list of axis names')
        axes = tuple(raw)
        check_rules_axes(rule_sets, axes)
    return rule_sets, axes


def _specs_file_words(path: str | os.PathLike[str], data: Mapping[str, Any]) -> str:
    """What a specs file given as rules is, and how to apply it: ``shard``'s file for a
    program without logical names holds ``{"mesh": {...}, "specs": {path: spec}}``."""
    mesh, specs = data.get("mesh"), data.get("specs")
    on = ""
    if isinstance(mesh, Mapping) and mesh:
        on = " on mesh " + ",".join(f"{k}={v}" for k, v in mesh.items())
    example = ""
    if isinstance(specs, Mapping) and specs:
        # the first spec that shards something says most
        shown = [(k, v) for k, v in specs.items() if isinstance(v, list)]
        if shown:
            where, spec = next(((k, v) for k, v in shown if any(v)), shown[0])
            entries = ", ".join("None" if a is None else repr(a) for a in spec)
            example = f", e.g. P({entries}) for the one at {where}"
    return (
        f"rules file {str(path)!r} is a specs file (shard's proposal for a program without "
        f"logical names: each argument's PartitionSpec by its path{on}), not rules: give each "
        f"argument of make_step's step its spec{example}, and audit or plan the program as "
        f"written, without rules"
    )


def sharded_rules(rules: Rules) -> str:
    """What ``rules`` shard (``batch->data``), the names they leave whole left out; ``"all
    replicated"`` when they shard nothing: a proposal's or a skipped candidate's label."""
    shown = tuple((n, a) for n, a in rules if a is not None)
    return format_rules(shown) if shown else "all replicated"


def format_rules(rules: Rules) -> str:
    """``batch->data, embed->-``."""
    if not rules:
        return "the program's own shardings"

    def axes(v: RuleAxes) -> str:
        if v is None:
            return "-"
        return v if isinstance(v, str) else "(" + ",".join(v) + ")"

    return ", ".join(f"{k}->{axes(v)}" for k, v in rules)


def logical_to_spec(
    names: Sequence[str | None], rules: Mapping[str, RuleAxes] | Sequence[tuple[str, RuleAxes]]
) -> PartitionSpec:
    """The ``PartitionSpec`` that logical-axis ``rules`` give an array with dimension ``names``.

    Rules are Flax's: ``(logical name, mesh axes)`` pairs (or a mapping), the mesh axes a name,
    a tuple of names or None. As in Flax, a name without a rule is not sharded, and a mesh
    axis already used by an earlier dimension is not used again.

    >>> logical_to_spec(("batch", "embed"), [("batch", "data"), ("embed", None)])
    P('data', None)

    Raises:
        RulesError: a rule that is not a pair, or whose mesh axes are not a name, names or
            None (naming it).
    """

    pairs = list(rules.items() if isinstance(rules, Mapping) else rules)
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise RulesError(
                f"rule {pair!r} is not a pair (logical name, mesh axes); write e.g. "
                f"('batch', 'data') or ('embed', None)"
            )
        _rule_axes(pair[1], f"rule {pair[0]!r}")
    table = dict(pairs)
    used: set[str] = set()
    entries: list[str | tuple[str, ...] | None] = []
    for name in names:
        value = table.get(name) if name is not None else None
        axes = () if value is None else (value,) if isinstance(value, str) else tuple(value)
        if not axes or any(a in used for a in axes):
            entries.append(None)
            continue
        used.update(axes)
        entries.append(axes[0] if isinstance(value, str) or len(axes) == 1 else axes)
    return PartitionSpec(*entries)


# -- where a program's rules come from ----------------------------------------------------------


def module_rules(make_step: Callable[..., object]) -> object | None:
    """The ``RULES`` of the module defining ``make_step``, or None."""
    module = sys.modules.get(getattr(make_step, "__module__", "") or "")
    return getattr(module, MODULE_RULES, None)


@dataclass(frozen=True)
class RuleSets:
    """Named rule sets, the words that say where they came from, and the mesh axes a rules
    file names (empty when it names none)."""

    sets: Mapping[str, Rules]
    source: str
    axes: tuple[str, ...] = ()


def find_rule_sets(rules: object, make_step: Callable[..., object]) -> RuleSets | None:
    """The rule sets ``rules`` gives, as ``shardscope audit FILE.py:FUNCTION --rules`` and
    ``plan --program --rules`` read them: a path is a rules file (:func:`load_rules_file`),
    pairs or a mapping are one set or named sets (:func:`normalize_rules`), and None is the
    ``RULES`` of ``make_step``'s module when it defines one, else None (no rules)."""
    if rules is None:
        own = module_rules(make_step)
        if own is None:
            return None
        name = getattr(make_step, "__name__", None) or "make_step"
        return RuleSets(normalize_rules(own), f"the {MODULE_RULES} of {name}'s module")
    if isinstance(rules, str | os.PathLike):
        sets, axes = load_rules_file(rules)
        return RuleSets(sets, f"rules file {os.fspath(rules)!r}", axes)
    return RuleSets(normalize_rules(rules), "rules=")


#: How JAX 0.10.2 begins its refusal of a ``PartitionSpec`` naming an axis its mesh lacks
#: (``named_sharding._check_mesh_resource_axis``: "Resource axis: NAME of P(...) is not found
#: in mesh: (...)"); the error carries no field holding the name, so it is read from there.
_NOT_IN_MESH = "Resource axis: "


def refused_axis(error: BaseException) -> str | None:
    """The axis name JAX's refusal of a sharding naming an axis its mesh lacks names; None
    for other errors.

    >>> refused_axis(ValueError("Resource axis: hidden of P(None, 'hidden') is not found in "
    ...                         "mesh: ('data',)"))
    'hidden'
    """
    text = str(error)
    if not isinstance(error, ValueError) or not text.startswith(_NOT_IN_MESH):
        return None
    return text[len(_NOT_IN_MESH) :].split(" of ", 1)[0] or None


def unmapped_name_error(
    error: BaseException,
    mapped: Sequence[str],
    where: str,
    *,
    program: str = "the program",
    used: Sequence[str] | None = None,
    mesh_axes: Sequence[str] = (),
) -> RulesError | None:
    """Our words for JAX's refusal of a sharding that names an axis the mesh lacks, where the
    name is one ``mapped`` (the logical names the rules in force map, described by ``where``)
    does not hold: Flax passes a logical name its rules lack through as it is, so a typo in a
    rule reaches JAX as a mesh axis. None for other errors (or when there are no rules).

    JAX names the first such name it meets; ``used``, the logical names the program's arrays
    carry (:func:`~shardscope._src.audit.names.carried_names`), gives every one the rules
    lack at once (those of the ``mesh_axes`` left out: a name that is a mesh axis passes
    through as one). Each is named with its fix: correct a close name the rules map, where
    the program does not use that name itself, or add a rule.

    >>> e = ValueError("Resource axis: hidden of P(None, 'hidden') is not found in mesh: ()")
    >>> err = unmapped_name_error(e, ["batch", "hiden"], "rule set 'mine'")
    >>> print(err)  # doctest: +NORMALIZE_WHITESPACE
    the program uses logical name 'hidden', which rule set 'mine' does not map (it maps batch,
    hiden; 'hiden' is close): correct 'hiden' to 'hidden', or add a rule for 'hidden'
    >>> err = unmapped_name_error(e, ["batch", "heads"], "rule set 'mine'",
    ...                           used=["batch", "heads", "head_dim", "hidden"])
    >>> print(err)  # doctest: +NORMALIZE_WHITESPACE
    the program uses logical names 'head_dim' and 'hidden', which rule set 'mine' does not
    map (it maps batch, heads): add a rule for 'head_dim'; add a rule for 'hidden' (a rule's
    mesh axes, or none to leave the name whole)
    """
    name = refused_axis(error)
    if not mapped or name is None or name in mapped:
        return None
    missing = [name]
    if used is not None:
        missing = [n for n in dict.fromkeys(used) if n not in mapped and n not in mesh_axes]
        if name not in missing:  # (the program used it where the probe did not see it)
            missing.insert(0, name)
    # A close name the rules map is offered as the typo only where the program does not use
    # it itself: correcting it would leave a name the program uses without a rule.
    spare = [n for n in mapped if used is None or n not in used]
    close: dict[str, str] = {}
    for n in missing:
        found = difflib.get_close_matches(n, [m for m in spare if m not in close.values()], n=1)
        if found:
            close[n] = found[0]
    maps = f"it maps {', '.join(mapped)}"
    if len(missing) == 1:
        near = f"; {close[name]!r} is close" if close else ""
        fix = (
            f"correct {close[name]!r} to {name!r}, or add a rule for {name!r}"
            if close
            else f"add a rule for {name!r} (its mesh axes, or none to leave it whole)"
        )
        return RulesError(
            f"{program} uses logical name {name!r}, which {where} does not map ({maps}"
            f"{near}): {fix}",
            param="rules",
        )
    near = "".join(f"; {c!r} is close to {n!r}" for n, c in close.items())
    fixes = "; ".join(
        f"correct {close[n]!r} to {n!r}, or add a rule for {n!r}"
        if n in close
        else f"add a rule for {n!r}"
        for n in missing
    )
    return RulesError(
        f"{program} uses logical names {and_list([repr(n) for n in missing])}, which {where} "
        f"does not map ({maps}{near}): {fixes} (a rule's mesh axes, or none to leave the name "
        f"whole)",
        param="rules",
    )


def rules_unmapped_error(
    error: BaseException,
    rules: object,
    rule_set: str | None,
    make_step: Callable[..., object],
    *,
    program: str = "the program",
    used: Sequence[str] | None = None,
    mesh_axes: Sequence[str] = (),
) -> RulesError | None:
    """:func:`unmapped_name_error` for the one rule set :func:`rules_for_mesh` chose from the
    same ``rules`` and ``rule_set``, named with where it came from (its file)."""
    found = find_rule_sets(rules, make_step)
    chosen = choose_rule_set(found, rule_set)
    if found is None or chosen is None:
        return None
    name, pairs = chosen
    where = f"rule set {name!r} of {found.source}"
    mapped = [n for n, _ in pairs]
    return unmapped_name_error(
        error, mapped, where, program=program, used=used, mesh_axes=mesh_axes
    )


@dataclass(frozen=True)
class UnusedRules(NoteValues):
    """The rules of the set ``rule_set`` that map a logical name no array of the program
    carries to mesh axes: accepted, and they change nothing in this program (a set shared
    between programs may hold rules for names another one uses). An audit's record of them,
    and the values of a plan's note of them."""

    rule_set: str
    rules: Rules

    def __post_init__(self) -> None:
        # (read back from JSON, a pair is a list and several mesh axes a list)
        object.__setattr__(self, "rules", _rule_set(self.rule_set, self.rules))

    def sentence(self) -> str:
        """The note's words.

        >>> print(UnusedRules("tp_seq", (("sequence", "model"),)).sentence())
        ... # doctest: +NORMALIZE_WHITESPACE
        rule set 'tp_seq': no array of the program carries the logical name 'sequence', so
        its rule sequence->model changes nothing here (check its spelling, or name the arrays
        it should split with it)
        """
        one = len(self.rules) == 1
        names = and_list([repr(n) for n, _ in self.rules])
        return (
            f"rule set {self.rule_set!r}: no array of the program carries the logical "
            f"name{'' if one else 's'} {names}, so its rule{'' if one else 's'} "
            f"{format_rules(self.rules)} change{'s' if one else ''} nothing here (check "
            f"{'its' if one else 'their'} spelling, or name the arrays "
            f"{'it' if one else 'they'} should split with {'it' if one else 'them'})"
        )


def unused_rules(
    rule_sets: Mapping[str, Rules], carried: Collection[str]
) -> tuple[UnusedRules, ...]:
    """The rules of each set that shard a logical name none of ``carried`` (the names the
    program's arrays carry) is, one record per set that has any. A rule that leaves a name
    whole changes nothing for a program without it either, and is not listed.

    >>> unused_rules({"tp_seq": (("batch", "data"), ("sequence", "model"), ("x", None))},
    ...              ["batch", "embed"])
    (UnusedRules(rule_set='tp_seq', rules=(('sequence', 'model'),)),)
    """
    out = []
    for name, rules in rule_sets.items():
        unused = tuple((n, a) for n, a in rules if a is not None and n not in carried)
        if unused:
            out.append(UnusedRules(name, unused))
    return tuple(out)


def choose_rule_set(found: RuleSets | None, rule_set: str | None) -> tuple[str, Rules] | None:
    """The one set of ``found`` that ``rule_set`` names, or its only one when ``rule_set`` is
    None; None when there are no rules.

    Raises:
        RulesError: ``rule_set`` named with no rules, a name ``found`` does not hold, or
            several sets and no name.
    """
    if found is None:
        if rule_set is not None:
            raise RulesError(
                f"rule_set={rule_set!r} names a rule set but there are no rules: give rules "
                f"(pairs, named sets or a rules file), or define {MODULE_RULES} in the "
                f"program's module",
                param=("rule_set", "rules"),
            )
        return None
    if rule_set is None:
        if len(found.sets) > 1:
            held = f"{found.source} holds {len(found.sets)} rule sets ({', '.join(found.sets)})"
            raise RulesError(
                f"{held}; choose one with rule_set=NAME",
                param="rule_set",
                shell=f"{held}; choose one with --rule-set NAME",
            )
        return next(iter(found.sets.items()))
    if rule_set not in found.sets:
        raise RulesError(
            f"rule_set={rule_set!r} is not in {found.source}: {', '.join(found.sets)}",
            param="rule_set",
        )
    return rule_set, found.sets[rule_set]


def rules_for_mesh(
    rules: object,
    rule_set: str | None,
    make_step: Callable[..., object],
    axes: Sequence[str],
) -> Rules:
    """The one rule set a program is built with on a mesh of ``axes``: what :func:`find_rule_sets`
    finds, chosen by :func:`choose_rule_set` and checked against the axes (the other sets may
    name axes of other meshes); ``()`` when there are no rules."""
    chosen = choose_rule_set(find_rule_sets(rules, make_step), rule_set)
    if chosen is None:
        return ()
    check_rules_axes({chosen[0]: chosen[1]}, axes)
    return chosen[1]


# -- how rules reach a program -----------------------------------------------------------------


@contextlib.contextmanager
def rules_context(rules: Sequence[tuple[str, RuleAxes]]) -> Iterator[None]:
    """Flax's logical-axis rules set for the block, when there are rules and the program has
    imported Flax.

    Flax reads them when a variable's sharding is asked for (``nnx.get_partition_spec``) and
    when a logical constraint is traced, so they must hold while ``make_step`` runs and while
    the step is lowered.
    """
    spmd = sys.modules.get("flax.core.spmd")
    if spmd is None or not rules:
        yield
        return
    with spmd.logical_axis_rules(tuple(rules)):
        yield


def takes_rules(make_step: Callable[..., Any]) -> bool:
    """Whether ``make_step`` accepts a second positional argument (the rules)."""
    try:
        sig = inspect.signature(make_step)
    except (TypeError, ValueError):
        return False
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def uses_flax(make_step: Callable[..., Any]) -> bool:
    """Whether Flax is imported and ``make_step``'s module refers to it (so that Flax's rules
    context reaches the program)."""
    if "flax.core.spmd" not in sys.modules:
        return False
    names = []
    for value in getattr(make_step, "__globals__", {}).values():
        names.append(getattr(value, "__name__", None) or "")
        names.append(getattr(value, "__module__", None) or "")
    return any(isinstance(n, str) and (n == "flax" or n.startswith("flax.")) for n in names)
