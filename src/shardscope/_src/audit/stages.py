"""From whatever a user calls "my jitted step" to a ``jax.stages.Lowered`` or ``Compiled``.

``jax.jit`` functions, ``jax.stages.Lowered`` and ``jax.stages.Compiled`` are the base case.
Libraries wrap them: ``flax.nnx.jit`` and ``equinox.filter_jit`` return callables whose
``lower`` gives the library's own ``Lowered``, a dataclass holding JAX's, whose ``compile``
gives the library's ``Compiled``, holding JAX's in turn. Rather than name each library, a
wrapper is opened by looking for the one field that holds JAX's object, so a library that
wraps the same way works without changes here.

Some wrappers decide which arguments are traced by their type (``equinox.filter_jit`` traces
arrays and treats everything else, ``jax.ShapeDtypeStruct`` included, as a constant). When
lowering such a wrapper on abstract arguments fails, it is traced once more inside
``jax.jit`` with every array-like leaf (arrays and ``ShapeDtypeStruct``) as an input: the
wrapper then sees tracers, which it treats as arrays, and its own ``jit`` becomes a nested
call, which XLA inlines.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from shardscope._src.audit.scopes import module_scopes
from shardscope._src.base.errors import (
    AxisTypeError,
    LayoutError,
    MissingMeshError,
    ProgramError,
    ShardingTypeCheckError,
    ShardscopeError,
)
from shardscope._src.mesh import format_mesh_spec, mesh_axes
from shardscope._src.sharding.rules import rules_context, takes_rules

#: What JAX says when a bare ``PartitionSpec`` meets an empty mesh context (0.10.2 wording;
#: both the ``with_sharding_constraint`` and the ``shard_map``/``reshard`` forms contain it).
_NO_MESH_MARKERS = ("non-empty mesh", "requires a mesh", "empty mesh")
#: What JAX and Flax say when code that needs a mesh set runs without one (``make_step``).
_NEEDS_MESH_MARKERS = (
    *_NO_MESH_MARKERS,
    "not under a mesh context",
    "Please set a mesh via `jax.set_mesh`",
    "mesh context or metadata is required",
)


def _fields(obj: Any) -> Iterator[Any]:
    """The values of ``obj``'s dataclass fields, ``__dict__`` entries and slots."""
    seen: set[int] = set()

    def once(v: Any) -> Iterator[Any]:
        if id(v) not in seen:
            seen.add(id(v))
            yield v

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from once(getattr(obj, f.name, None))
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        for v in d.values():
            yield from once(v)
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if not name.startswith("__"):
                yield from once(getattr(obj, name, None))


def unwrap_stage(obj: Any, cls: type) -> Any | None:
    """``obj`` when it is a ``cls``, or the single field of a library wrapper holding one."""
    if isinstance(obj, cls):
        return obj
    if isinstance(obj, str | bytes | int | float | tuple | list | dict):
        return None
    found = [v for v in _fields(obj) if isinstance(v, cls)]
    return found[0] if len(found) == 1 else None


def _is_jax_own(program: Any) -> bool:
    return type(program).__module__.split(".")[0] in ("jax", "jaxlib")


def _has_abstract_leaves(args: Any) -> bool:

    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(args))


def _describe(program: Any) -> str:
    name = getattr(program, "__qualname__", None) or getattr(program, "__name__", None)
    kind = f"{type(program).__module__}.{type(program).__qualname__}"
    return f"{name} ({kind})" if isinstance(name, str) and name else kind


def missing_mesh_error(error: BaseException, args: Any) -> MissingMeshError | None:
    """Our explanation of JAX's "requires a non-empty mesh", or None for other errors."""
    text = str(error)
    if not any(m in text for m in _NO_MESH_MARKERS):
        return None

    meshes = []
    for leaf in _sharding_leaves(args):
        m = getattr(leaf, "mesh", None)
        if m is not None and hasattr(m, "axis_names") and not getattr(m, "empty", False):
            spec = format_mesh_spec(mesh_axes(m))
            if spec not in meshes:
                meshes.append(spec)
    where = (
        f"; the arguments are sharded over mesh {meshes[0]!r}, so pass that mesh"
        if len(meshes) == 1
        else ""
    )
    return MissingMeshError(
        "the program names mesh axes with a bare PartitionSpec (in with_sharding_constraint, "
        "a Flax or Equinox sharding annotation, shard_map or reshard) but no mesh was set "
        "while it was traced, so JAX cannot tell which devices the axes mean: audit it with "
        "mesh= (shardscope.audit(step, *args, mesh=mesh)) or inside "
        f"`with jax.set_mesh(mesh):`{where}. JAX said: {text.splitlines()[0]}"
    )


def _sharding_leaves(args: Any) -> list[Any]:

    out = []
    for leaf in jax.tree.leaves(args):
        s = getattr(leaf, "sharding", None)
        if s is not None:
            out.append(s)
    return out


def lower(program: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``jax.stages.Lowered`` of ``program`` on ``args`` (jit-like callable, or a plain one).

    ``kwargs`` are options for ``jax.jit`` (for a plain function, or to re-jit).
    """
    return _lower(program, args, kwargs, with_jaxpr=False)[0]


def lower_traced(
    program: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any | None]:
    """:func:`lower`'s ``Lowered`` and the program's jaxpr (a ``ClosedJaxpr``): that of the
    ``Traced`` its ``trace(*args)`` gives (JAX's, or one a library's holds: Flax NNX's), None
    where it has no ``trace`` (Equinox's ``filter_jit``) or was lowered inside ``jax.jit``
    (:func:`_lower_in_jit`).

    The trace follows the lowering in its context, so JAX finds the one the lowering made
    and traces nothing again (measured on JAX 0.10.2: 1 ms against 107 ms for the first
    trace of a 200-layer step; under 1 ms for an ``nnx.jit`` step).
    """
    return _lower(program, args, kwargs, with_jaxpr=True)


def _lower(
    program: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, with_jaxpr: bool
) -> tuple[Any, Any | None]:
    if kwargs or not hasattr(program, "lower"):
        if not callable(program):
            raise ShardscopeError(
                f"audit() needs a jitted function (jax.jit, flax.nnx.jit, equinox.filter_jit "
                f"or another library's), a plain function, a Lowered or Compiled, or HLO "
                f"text; got {_describe(program)}"
            )
        fn = jax.jit(program, **kwargs)
    else:
        fn = program
    try:
        with module_scopes():  # NNX and Equinox modules' ops named by their paths
            got = fn.lower(*args)
    except Exception as e:
        explained = missing_mesh_error(e, args)
        if explained is not None:
            raise explained from e
        if _is_jax_own(fn) or not _has_abstract_leaves(args):
            raise
        try:
            with module_scopes():
                return _lower_in_jit(fn, args), None
        except Exception as traced:
            # Traced with array inputs, the program got further: when it stopped at its
            # shardings, that says more than the wrapper's refusal of abstract arguments.
            if axis_type_error(traced, jax.sharding.get_abstract_mesh(), "") is not None:
                raise traced from None
            raise e from None
    lowered = unwrap_stage(got, jax.stages.Lowered)
    if lowered is None:
        raise ShardscopeError(
            f"{_describe(program)}.lower(...) returned {_describe(got)}, which is neither a "
            f"jax.stages.Lowered nor a wrapper holding one; pass the jax.jit function, its "
            f"Lowered or its Compiled instead"
        )
    if not with_jaxpr:
        return lowered, None
    with module_scopes():  # as it was lowered, so that JAX finds the trace it made
        return lowered, _jaxpr_of(fn, args)


def _jaxpr_of(fn: Any, args: tuple[Any, ...]) -> Any | None:
    """The jaxpr of the ``Traced`` (JAX's, or the one a library's holds) that
    ``fn.trace(*args)`` gives; None where ``fn`` has no ``trace`` or it gives no such
    stage."""
    trace = getattr(fn, "trace", None)
    if not callable(trace):
        return None
    stage = unwrap_stage(trace(*args), jax.stages.Traced)
    return None if stage is None else stage.jaxpr


def _lower_in_jit(fn: Any, args: tuple[Any, ...]) -> Any:
    """Lowers ``fn(*args)`` traced inside ``jax.jit``, every array-like leaf an input."""

    leaves, treedef = jax.tree.flatten(args)
    dynamic = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array | np.ndarray | jax.ShapeDtypeStruct)
    ]

    def run(*values: Any) -> list[Any]:
        full = list(leaves)
        for i, v in zip(dynamic, values, strict=True):
            full[i] = v
        out = fn(*jax.tree.unflatten(treedef, full))
        return [leaf for leaf in jax.tree.leaves(out) if isinstance(leaf, jax.Array)]

    run.__name__ = getattr(fn, "__name__", None) or "step"
    return jax.jit(run).lower(*(leaves[i] for i in dynamic))


# -- a user's program: make_step(mesh) -> (step, args) --------------------------------------


def check_step_pair(got: Any, where: str) -> tuple[Any, tuple[Any, ...]]:
    """``(step, args)`` from what ``make_step`` returned, or a :class:`ProgramError`."""
    if not isinstance(got, tuple | list) or len(got) != 2:
        size = f" of {len(got)} items" if isinstance(got, tuple | list) else ""
        raise ProgramError(
            f"{where} returned {type(got).__name__}{size}; it must return a pair (jitted "
            f"step, its arguments), e.g. `return jax.jit(step), (params, batch)`, or the "
            f"step's jax.stages.Lowered or Compiled"
        )
    step, args = got
    if not callable(step) and not hasattr(step, "lower"):
        raise ProgramError(
            f"{where} returned {type(step).__name__} as the step; the first item must be the "
            f"jitted function (jax.jit, flax.nnx.jit, equinox.filter_jit)"
        )
    if not isinstance(args, tuple | list):
        raise ProgramError(
            f"{where} returned {type(args).__name__} as the arguments; the second item must "
            f"be a tuple of the step's arguments, e.g. (params, batch)"
        )
    return step, tuple(args)


def program_stage(got: Any) -> Any | None:
    """The ``jax.stages.Compiled`` or ``Lowered`` (JAX's, or held by a library's) that
    ``make_step`` returned instead of ``(step, args)``; None otherwise."""
    return unwrap_stage(got, jax.stages.Compiled) or unwrap_stage(got, jax.stages.Lowered)


def build_step(
    make_step: Callable[..., Any],
    mesh: Any,
    rules: Sequence[tuple[str, Any]] = (),
    *,
    where: str = "make_step",
) -> Any:
    """What ``make_step`` returns for ``mesh`` and ``rules``, called as :func:`lower_step`
    calls it (no mesh set, Flax's rules in force), its context errors in our words."""
    with rules_context(rules):
        try:
            return make_step(mesh, tuple(rules)) if takes_rules(make_step) else make_step(mesh)
        except Exception as e:
            explained = _context_error(e, mesh, where)
            if explained is not None:
                raise explained from e
            raise


def lower_step(
    make_step: Callable[..., Any],
    mesh: Any,
    rules: Sequence[tuple[str, Any]] = (),
    *,
    where: str = "make_step",
) -> Any:
    """The ``jax.stages.Lowered`` (or ``Compiled``) of the step ``make_step`` gives for ``mesh``.

    The context, as a user would write it by hand:

    * ``make_step(mesh)`` (or ``make_step(mesh, rules)``) runs with no mesh set: it is given
      the mesh, and a library that acts on an ambient mesh (Linen's
      ``LogicallyPartitioned.unbox`` constrains shardings when one is set) sees none;
    * the step it returns is lowered inside ``with jax.set_mesh(mesh):``, so that bare
      ``PartitionSpec`` s in it (``out_sharding=``, ``reshard``, ``with_sharding_constraint``)
      name the mesh's axes;
    * Flax's logical-axis rules context holds ``rules`` through both, when there are rules
      and the program imported Flax (how rules reach ``nnx.get_partition_spec``).

    ``make_step`` may also return the step's ``Lowered`` or ``Compiled`` itself.

    Raises:
        ProgramError: ``make_step`` returned something else.
        MissingMeshError: ``make_step`` needed a mesh set (names the fix).
        AxisTypeError: the program's shardings do not fit the mesh's axis types.
    """
    return lower_step_traced(make_step, mesh, rules, where=where)[0]


def lower_step_traced(
    make_step: Callable[..., Any],
    mesh: Any,
    rules: Sequence[tuple[str, Any]] = (),
    *,
    where: str = "make_step",
) -> tuple[Any, Any | None]:
    """:func:`lower_step`'s stage and the step's jaxpr (:func:`lower_traced`'s; None where
    ``make_step`` returned a stage)."""
    got = build_step(make_step, mesh, rules, where=where)
    stage = program_stage(got)
    if stage is not None:
        return stage, None
    step, args = check_step_pair(got, where)
    with jax.set_mesh(mesh), rules_context(rules):
        try:
            return lower_traced(step, args, {})
        except Exception as e:
            explained = axis_type_error(e, mesh, where) or indivisible_error(e, args, where)
            if explained is not None:
                raise explained from e
            raise


def indivisible_error(error: BaseException, args: Any, where: str) -> LayoutError | None:
    """Our words, with the fix, for JAX's refusal of an argument whose dimension the mesh
    axes it is split over do not divide (its ``IndivisibleError``, not public API, so known
    by its name), found among ``args``; None for other errors, or where no argument's
    sharding is the one refused."""
    if type(error).__name__ != "IndivisibleError":
        return None
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    for path, leaf in leaves:
        sharding, shape = getattr(leaf, "sharding", None), getattr(leaf, "shape", None)
        if not isinstance(sharding, jax.sharding.NamedSharding) or shape is None:
            continue
        sizes = mesh_axes(sharding.mesh)
        for dim, (size, entry) in enumerate(zip(shape, sharding.spec, strict=False)):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            ways = math.prod(sizes[a] for a in axes)
            if size % ways == 0:
                continue
            # the sizes a mesh of at most this many devices could split the dimension into
            fits = [d for d in range(1, math.prod(sizes.values()) + 1) if size % d == 0]
            over = (
                f"axis {axes[0]!r} ({ways})"
                if len(axes) == 1
                else f"axes {' x '.join(f'{a}={sizes[a]}' for a in axes)} ({ways})"
            )
            choose = (
                f"a size of {axes[0]!r} that divides {size}"
                if len(axes) == 1
                else f"sizes of {', '.join(axes)} whose product divides {size}"
            )
            return LayoutError(
                f"{where} on mesh {format_mesh_spec(sizes)}: dimension {dim} of argument "
                f"{jax.tree_util.keystr(path)} (size {size}, shape {tuple(shape)}) is split over "
                f"{over}, which does not divide {size}; choose {choose} (e.g. "
                f"{', '.join(map(str, fits))}), or split that dimension over other axes. "
                f"JAX said: {first}",
                param="mesh",
            )
    return None


def _context_error(error: BaseException, mesh: Any, where: str) -> ShardscopeError | None:
    """Our words for what ``make_step`` raised because of its context, or None."""
    explained = axis_type_error(error, mesh, where)
    if explained is not None:
        return explained
    if any(m in str(error) for m in _NEEDS_MESH_MARKERS):
        return MissingMeshError(
            f"{where} used a bare PartitionSpec while no mesh was set: make_step runs without "
            f"one (it is given the mesh as its argument); write NamedSharding(mesh, spec), or "
            f"put its body inside `with jax.set_mesh(mesh):`. JAX said: "
            f"{str(error).strip().splitlines()[0]}"
        )
    return None


def axis_type_error(
    error: BaseException, mesh: Any, where: str, *, mesh_words: str | None = None
) -> AxisTypeError | None:
    """Our words for JAX's refusal of shardings that do not fit the mesh's axis types (code
    for Explicit axes on an Auto mesh, or the reverse), or None for other errors.
    ``mesh_words`` names the mesh (default: ``mesh 'data=2,model=4'``).

    JAX 0.10.2 says so in a ``ValueError`` and an ``AssertionError`` whose wording is matched
    below, and in its ``ShardingTypeError`` (not public API, so known by its name).
    """
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    kinds = set(mesh_axis_types(mesh))
    spec = f"mesh {format_mesh_spec(mesh_axes(mesh))!r}" if kinds else "mesh '?'"
    spec = spec if mesh_words is None else mesh_words

    def both(words: Callable[[Callable[[str], str]], str]) -> dict[str, Any]:
        # The message with the fix in Python's words (axis_types='auto'), and in the shell's
        # (--axis-types auto, the flag that sets it), for an AxisTypeError's arguments.
        return {
            "message": words(lambda kind: f"axis_types={kind!r}"),
            "shell": words(lambda kind: f"--axis-types {kind}"),
        }

    if "names that are of type Auto" in text and "auto" in kinds:
        return AxisTypeError(
            **both(
                lambda fix: (
                    f"{where}: the program is written for Explicit axes (sharding in "
                    f"types: out_sharding=, jax.sharding.reshard), but {spec} has Auto "
                    f"axes; build it with {fix('explicit')}, JAX's default. JAX said: {first}"
                )
            ),
            param="axis_types",
        )
    if "explicit" not in kinds:
        return None
    if "can only refer to Auto axes" in text:
        return AxisTypeError(
            **both(
                lambda fix: (
                    f"{where}: the program constrains shardings with "
                    f"with_sharding_constraint, which takes only Auto axes, but {spec} has "
                    f"Explicit axes; build it with {fix('auto')} (or move arrays with "
                    f"jax.sharding.reshard). JAX said: {first}"
                )
            ),
            param="axis_types",
        )
    if "acts as an assert when all axes of mesh are of type `Explicit`" in text:
        return AxisTypeError(
            **both(
                lambda fix: (
                    f"{where}: with_sharding_constraint only checks shardings on "
                    f"Explicit axes, and on {spec} one does not hold: the program is "
                    f"written for Auto axes, so build the mesh with {fix('auto')} (or move the "
                    f"array with jax.sharding.reshard). JAX said: {first}"
                )
            ),
            param="axis_types",
        )
    if type(error).__name__ == "ShardingTypeError":
        e = ShardingTypeCheckError(
            **both(
                lambda fix: (
                    f"{where}: the program's shardings do not type-check on the "
                    f"Explicit axes of {spec}: JAX cannot tell a result's sharding under "
                    f"this layout; say it with out_sharding= or jax.sharding.reshard, choose "
                    f"another layout, or, for code written for Auto axes, build the mesh with "
                    f"{fix('auto')}. JAX said: {first}"
                )
            ),
            param="axis_types",
        )
        e.jax_said = first
        return e
    return None


def mesh_axis_types(mesh: Any) -> tuple[str, ...]:
    """``("explicit", "auto", ...)``: each axis's type, lower case."""
    return tuple(str(getattr(t, "name", t)).lower() for t in getattr(mesh, "axis_types", ()))
