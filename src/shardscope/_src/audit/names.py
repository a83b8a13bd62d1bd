"""The logical names a user's program carries: what its arrays' shardings name when every
logical name is its own mesh axis.

Flax passes a logical name through its rules as it is where they lack it, so a rule set that
misses one fails at the first array naming it, and JAX's refusal names that one alone; and a
rule for a name no array carries is accepted and changes nothing. Both are told from one
build of the program on a mesh of one device with an axis of size 1 per logical name, and
rules mapping each name to itself: its arguments' shardings, and the shardings its trace
sets (constraints, ``out_sharding=``), then name the logical axes themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardscope._src.audit.ragged import equations
from shardscope._src.audit.stages import build_step, check_step_pair, lower_traced, program_stage
from shardscope._src.mesh import make_mesh
from shardscope._src.sharding.rules import refused_axis, rules_context

#: The most names a probe adds to its mesh, one build each, beyond those it is given.
MAX_FOUND = 64


def carried_names(
    make_step: Callable[..., Any],
    names: Sequence[str],
    *,
    axis_type: Any = None,
    where: str = "make_step",
) -> tuple[str, ...] | None:
    """The logical names the arrays of the program ``make_step`` builds carry, in the order
    they first appear: its arguments' and those its step's trace shards (a sharding
    constraint on an activation), every name of ``names`` it uses and those it uses beyond
    them (a mesh axis it names itself among them).

    The program is built and traced on one device, each name a mesh axis of size 1 (of
    ``axis_type``, as in :func:`~shardscope._src.mesh.make_mesh`), with rules mapping every
    name to itself; a name JAX refuses as missing from that mesh is added to it and the
    program built again.

    Returns None where the names cannot be told: ``make_step`` returned a lowered or compiled
    step, or the build failed for another reason (the program's own errors are the real
    build's to report).
    """
    axes = list(dict.fromkeys(names))
    for _ in range(MAX_FOUND + 1):
        identity = tuple((n, n) for n in axes)
        try:
            mesh = make_mesh({n: 1 for n in axes}, devices=jax.devices()[:1], axis_types=axis_type)
            got = build_step(make_step, mesh, identity, where=where)
            if program_stage(got) is not None:
                return None
            step, args = check_step_pair(got, where)
            with jax.set_mesh(mesh), rules_context(identity):
                _, jaxpr = lower_traced(step, args, {})
        except Exception as e:  # (a probe: the real build reports the program's errors)
            name = refused_axis(e)
            if name is None or name in axes:
                return None
            axes.append(name)
            continue
        found: dict[str, None] = {}
        for leaf in jax.tree.leaves(args):
            for n in _spec_names(getattr(leaf, "sharding", None)):
                found.setdefault(n, None)
        for eqn in equations(jaxpr) if jaxpr is not None else ():
            for value in eqn.params.values():
                for n in _spec_names(value):
                    found.setdefault(n, None)
        return tuple(found)
    return None


def _spec_names(value: Any) -> Iterator[str]:
    """The mesh axis names a sharding, a ``PartitionSpec`` or a tuple of them names."""
    spec = value.spec if isinstance(value, NamedSharding) else value
    if not isinstance(spec, PartitionSpec):
        if isinstance(value, tuple | list):
            for item in value:
                yield from _spec_names(item)
        return
    for entry in spec:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, tuple):
            yield from (a for a in entry if isinstance(a, str))
