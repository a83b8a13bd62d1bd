"""Logical axis names for a program that names none, read from its dataflow.

A program written with Flax's ``with_partitioning`` says which dimensions are the same axis
(``embed`` on the embedding, every projection's input and the norms). A plain pytree or an
Equinox module does not, but the step's jaxpr does: a matmul's contracted dimensions are one
axis, an element-wise op's operands share theirs with its result, a transpose permutes them,
a reshape that splits ``512`` into ``8 x 64`` keeps the major ``8`` with the ``512`` (a
block of rows sharded over ``n`` devices is a block of heads). Joining the dimensions the
program's operations join (union-find over ``(variable, dimension)``) gives each argument's
dimensions a class; the classes that reach the arguments are the program's logical axes.

Only what a sharding can follow is joined, so a class is never wider than the program makes
it: operations without a rule here (gathers, sorts, custom calls) join nothing, and the axes
they would have joined stay apart, each searched on its own.

:func:`by_dataflow` names those axes and builds the program over them; the arguments are
:class:`ProbedArray` records, as ``suggest``'s probe of a named program gives them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from shardscope._src.audit.stages import build_step, check_step_pair, lower
from shardscope._src.base.errors import ProgramError, one_line
from shardscope._src.mesh import axis_types_of, make_mesh

# -- the arguments ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbedArray:
    """One argument of the program: its path, shape, bytes per element and the logical names
    of each dimension (empty for a dimension the program does not name)."""

    path: str
    shape: tuple[int, ...]
    itemsize: int
    names: tuple[tuple[str, ...], ...]
    #: the path's keys as plain strings (attribute, dict key or index alike), so that a
    #: parameter's path and its optimizer moments' paths can be compared
    keys: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def key_name(key: Any) -> str:
    """A path key as a plain string: ``.q``, ``['q']`` and ``[0]`` as ``q`` and ``0``."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def lowered_flops(lowered: Any) -> float:
    """The step's FLOPs by JAX's count of its lowering (0 when it gives none)."""
    cost = lowered.cost_analysis() or {}
    return float(cost.get("flops", 0.0) or 0.0)


def weights(arrays: Sequence[ProbedArray]) -> tuple[tuple[bool, ...], tuple[int, ...]]:
    """Which of ``arrays`` are weights (one flag per array), and the weight each array
    belongs to (its own index, or for an optimizer's moment its weight's).

    A weight is an array whose path, less the argument it sits in, ends the path of another
    array of its shape: its optimizer's moments (``[0].blocks[0].q.kernel`` and
    ``[1].opt_state[0].mu['blocks'][0]['q']['kernel']``; optax, Flax NNX and Equinox states
    alike). A step without such mirrors (no optimizer state) takes the named arrays of at
    least two dimensions whose (shape, names) repeat most, as a model's layers do."""
    owners = list(range(len(arrays)))
    for i, a in enumerate(arrays):
        tail = a.keys[1:]
        if not tail or not a.shape:
            continue
        for j, b in enumerate(arrays):
            if (
                j != i
                and b.shape == a.shape
                and len(b.keys) > len(a.keys)
                and b.keys[-len(tail) :] == tail
                and (owners[j] == j or len(arrays[owners[j]].keys) > len(a.keys))
            ):
                owners[j] = i
    mirrored = {o for j, o in enumerate(owners) if o != j}
    if mirrored:
        weight = tuple(i in mirrored for i in range(len(arrays)))
    else:
        keys = [(a.shape, a.names) for a in arrays]
        copies = [
            keys.count(k) if len(a.shape) > 1 and a.names else 0
            for k, a in zip(keys, arrays, strict=True)
        ]
        most = max(copies, default=0)
        weight = tuple(c == most > 0 for c in copies)
    return weight, tuple(owners)


# -- the dataflow's classes ---------------------------------------------------------------------


class _Classes:
    """Union-find over ``(id(var), dim)``."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        root = x
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(x, x) != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def join(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _shape(v: Any) -> tuple[int, ...]:
    aval = getattr(v, "aval", None)
    return tuple(getattr(aval, "shape", ()) or ())


def _is_var(v: Any) -> bool:
    return type(v).__name__ != "Literal" and hasattr(v, "aval")


def _join_same(cls: _Classes, a: Any, b: Any) -> None:
    """Dimension by dimension, where the sizes agree (broadcast dimensions of 1 join nothing)."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) != len(sb):
        return
    for i, (x, y) in enumerate(zip(sa, sb, strict=True)):
        if x == y and x > 1:
            cls.join((id(a), i), (id(b), i))


def _join_reshape(cls: _Classes, a: Any, b: Any) -> None:
    """A reshape's groups of dimensions whose products match; each group's major dimension
    of size > 1 joins the other side's."""
    sa, sb = _shape(a), _shape(b)
    i = j = 0
    while i < len(sa) and j < len(sb):
        gi, gj = [i], [j]
        pa, pb = sa[i], sb[j]
        while pa != pb:
            if pa < pb:
                i += 1
                if i >= len(sa):
                    return
                gi.append(i)
                pa *= sa[i]
            else:
                j += 1
                if j >= len(sb):
                    return
                gj.append(j)
                pb *= sb[j]
        ma = next((k for k in gi if sa[k] > 1), None)
        mb = next((k for k in gj if sb[k] > 1), None)
        if ma is not None and mb is not None:
            cls.join((id(a), ma), (id(b), mb))
        i, j = i + 1, j + 1


def _join_gather(cls: _Classes, eqn: Any, operand: Any, indices: Any, out: Any) -> None:
    """A gather (an embedding lookup, ``take_along_axis``): the operand's dimensions it takes
    whole join the output's offset dimensions, in order; the indices' batch dimensions join
    the output's others."""
    dn = eqn.params["dimension_numbers"]
    sizes = eqn.params["slice_sizes"]
    shape = _shape(operand)
    skipped = set(dn.collapsed_slice_dims) | set(getattr(dn, "operand_batching_dims", ()))
    kept = [d for d in range(len(shape)) if d not in skipped]
    for d, o in zip(kept, dn.offset_dims, strict=False):
        if sizes[d] == shape[d] and shape[d] > 1:
            cls.join((id(operand), d), (id(out), o))
    rank = len(_shape(out))
    batch_out = [o for o in range(rank) if o not in set(dn.offset_dims)]
    index_dims = [d for d in range(len(_shape(indices))) if d != len(_shape(indices)) - 1]
    for d, o in zip(index_dims, batch_out, strict=False):
        if _shape(indices)[d] == _shape(out)[o] and _shape(out)[o] > 1:
            cls.join((id(indices), d), (id(out), o))


def _sub_jaxprs(eqn: Any) -> list[Any]:
    """The jaxprs an equation runs whose inputs and outputs are the equation's own (jit,
    custom derivatives, remat, closed calls)."""
    out = []
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is not None:
            out.append(getattr(sub, "jaxpr", sub))
    return out


_SAME = {
    "add",
    "sub",
    "mul",
    "div",
    "max",
    "min",
    "pow",
    "select_n",
    "integer_pow",
    "exp",
    "log",
    "tanh",
    "logistic",
    "neg",
    "sqrt",
    "rsqrt",
    "convert_element_type",
    "copy",
    "copy_p",
    "abs",
    "sign",
    "erf",
    "square",
    "exp2",
    "log1p",
    "expm1",
    "sin",
    "cos",
    "clamp",
    "and",
    "or",
    "not",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "stop_gradient",
    "reduce_precision",
    "sharding_constraint",
    "optimization_barrier",
    "nextafter",
    "atan2",
    "rem",
    "add_any",
    "mesh_cast",
    "reshard",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "erf_inv",
    "is_finite",
}


def _walk(jaxpr: Any, cls: _Classes) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [v for v in eqn.invars if _is_var(v)]
        outs = list(eqn.outvars)
        subs = _sub_jaxprs(eqn)
        if subs:
            for sub in subs:
                inner = [v for v in sub.invars]
                for a, b in zip(eqn.invars, inner, strict=False):
                    if _is_var(a):
                        _join_same(cls, a, b)
                for a, b in zip(outs, sub.outvars, strict=False):
                    if _is_var(b):
                        _join_same(cls, a, b)
                _walk(sub, cls)
            continue
        if name in _SAME or name == "pjit":
            for v in ins:
                for o in outs:
                    _join_same(cls, v, o)
        elif name == "dot_general":
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars[0], eqn.invars[1]
            out = outs[0]
            for x, y in zip(lc, rc, strict=True):
                if _is_var(lhs) and _is_var(rhs):
                    cls.join((id(lhs), x), (id(rhs), y))
            k = 0
            for x, y in zip(lb, rb, strict=True):
                if _is_var(lhs):
                    cls.join((id(lhs), x), (id(out), k))
                if _is_var(rhs):
                    cls.join((id(rhs), y), (id(out), k))
                k += 1
            for side, used in ((lhs, set(lc) | set(lb)), (rhs, set(rc) | set(rb))):
                for d in range(len(_shape(side))):
                    if d not in used:
                        if _is_var(side):
                            cls.join((id(side), d), (id(out), k))
                        k += 1
        elif name == "transpose":
            perm = eqn.params["permutation"]
            if ins:
                for k, d in enumerate(perm):
                    cls.join((id(ins[0]), d), (id(outs[0]), k))
        elif name == "broadcast_in_dim":
            dims = eqn.params["broadcast_dimensions"]
            if ins:
                for k, d in enumerate(dims):
                    if _shape(ins[0])[k] > 1:
                        cls.join((id(ins[0]), k), (id(outs[0]), d))
        elif name in ("reshape", "squeeze", "expand_dims"):
            if ins:
                _join_reshape(cls, ins[0], outs[0])
        elif name.startswith("reduce_") or name in ("argmax", "argmin"):
            axes = set(eqn.params.get("axes", ()))
            if ins:
                k = 0
                for d in range(len(_shape(ins[0]))):
                    if d not in axes:
                        cls.join((id(ins[0]), d), (id(outs[0]), k))
                        k += 1
        elif name == "gather" and len(ins) == 2 and len(eqn.invars) == 2:
            _join_gather(cls, eqn, ins[0], ins[1], outs[0])
        elif name == "concatenate":
            dim = eqn.params["dimension"]
            for v in ins:
                for d in range(len(_shape(v))):
                    if d != dim:
                        cls.join((id(v), d), (id(outs[0]), d))
        elif name in ("dynamic_slice", "slice", "pad", "dynamic_update_slice"):
            if ins:
                src, out = ins[0], outs[0]
                for d, (x, y) in enumerate(zip(_shape(src), _shape(out), strict=False)):
                    if x == y and x > 1:
                        cls.join((id(src), d), (id(out), d))
                if name == "dynamic_update_slice" and len(ins) > 1:
                    _join_same(cls, ins[1], out)


def argument_axes(step: Any, args: Sequence[Any]) -> list[tuple[int, ...]]:
    """Each array leaf of ``args`` (in ``jax.tree.leaves`` order, array-likes only): one class
    id per dimension, equal where the step's dataflow joins them (0 for a dimension of size
    1, which no sharding splits).

    Raises whatever tracing ``step`` raises.
    """
    leaves, treedef = jax.tree.flatten(tuple(args))
    dynamic = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array | np.ndarray | jax.ShapeDtypeStruct)
    ]

    def run(*values: Any) -> Any:
        full = list(leaves)
        for i, v in zip(dynamic, values, strict=True):
            full[i] = v
        out = step(*jax.tree.unflatten(treedef, full))
        return [leaf for leaf in jax.tree.leaves(out) if isinstance(leaf, jax.Array)]

    shaped = [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in dynamic]
    closed = jax.make_jaxpr(run)(*shaped)
    jaxpr = closed.jaxpr
    cls = _Classes()
    _walk(jaxpr, cls)
    numbering: dict[tuple[int, int], int] = {}
    out = []
    for v in jaxpr.invars:
        dims = []
        for d, size in enumerate(_shape(v)):
            if size <= 1:
                dims.append(0)
                continue
            root = cls.find((id(v), d))
            dims.append(numbering.setdefault(root, len(numbering) + 1))
        out.append(tuple(dims))
    return out


# -- programs without logical names -------------------------------------------------------------


def by_dataflow(
    program: Callable[..., Any],
    args: Sequence[Any] | None,
    *,
    where: str,
    axes: Sequence[str],
    axis_types: Any = None,
    probe: bool = False,
) -> Any:
    """A ``make_step(mesh, rules)`` over the axes ``program``'s dataflow joins, and their
    names (with ``probe``, also the arguments with those names and the step's FLOPs, what
    ``suggest``'s :func:`~shardscope._src.suggest.suggest.probe_program` gives a named
    program): ``program`` is the step (with ``args``) or a ``make_step(mesh)`` (called on
    each mesh, its arguments' shardings replaced). Each axis is named after the first array
    dimension it holds (``q_weight_0``; an argument that is an array itself as ``arg2_0``).

    Raises:
        ProgramError: the step could not be traced with its arguments.
    """
    mesh = None
    if args is not None:
        step, template = program, tuple(args)
    else:  # built once on one device, with the mesh axes it is searched over
        kinds = axis_types_of(axis_types, tuple(axes))
        mesh = make_mesh({a: 1 for a in axes}, devices=jax.devices()[:1], axis_types=kinds)
        step, template = check_step_pair(build_step(program, mesh, where=where), where)
    try:
        if mesh is None:
            classes = argument_axes(step, template)
        else:
            with jax.set_mesh(mesh):
                classes = argument_axes(step, template)
    except Exception as e:
        raise ProgramError(f"{where} could not be traced with its arguments: {one_line(e)}") from e
    flat = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tuple(template))[0]
        if isinstance(leaf, jax.Array | np.ndarray | jax.ShapeDtypeStruct)
    ]
    # The weights' axes are searched; of the other arrays' (the batch's), the leading one
    # alone: splitting a sequence needs an attention written for it (context parallelism),
    # which the arithmetic screen cannot price.
    probed = [
        ProbedArray(
            jax.tree_util.keystr(path),
            tuple(leaf.shape),
            jnp.dtype(leaf.dtype).itemsize,
            (),
            tuple(key_name(k) for k in path),
        )
        for path, leaf in flat
    ]
    weight, owners = weights(probed)
    searched: set[int] = set()
    for dims, owner in zip(classes, owners, strict=True):
        if weight[owner]:
            searched.update(c for c in dims if c)
        elif dims and dims[0]:
            searched.add(dims[0])
    label: dict[int, str] = {}
    for (path, _), dims in zip(flat, classes, strict=True):
        short = _short_path(path)
        for d, c in enumerate(dims):
            if c in searched:
                label.setdefault(c, f"{short}_{d}")
    dim_names = [tuple(label.get(c) for c in dims) for dims in classes]
    names = tuple(dict.fromkeys(n for dims in dim_names for n in dims if n))

    def make_step(mesh: Any, rules: Sequence[tuple[str, Any]] = ()) -> Any:
        given = dict(rules)
        if args is not None:
            run, base = step, template
        else:
            run, base = check_step_pair(program(mesh), where)
        leaves, treedef = jax.tree.flatten(tuple(base))
        k = 0
        out = []
        for leaf in leaves:
            if isinstance(leaf, jax.Array | np.ndarray | jax.ShapeDtypeStruct):
                spec = PartitionSpec(*(given.get(n) if n else None for n in dim_names[k]))
                k += 1
                leaf = jax.ShapeDtypeStruct(
                    leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec)
                )
            out.append(leaf)
        return run, tuple(jax.tree.unflatten(treedef, out))

    make_step.__name__ = getattr(program, "__name__", "step")
    if not probe:
        return make_step, names
    # the probe of a named program, from what is known already: the arrays with their axes'
    # names, and the step's FLOPs from one lowering on the one-device mesh
    arrays = tuple(
        replace(a, names=tuple((n,) if n else () for n in dims))
        for a, dims in zip(probed, dim_names, strict=True)
    )
    try:
        if mesh is None:
            lowered = lower(step, template, {})
        else:
            with jax.set_mesh(mesh):
                lowered = lower(step, template, {})
        flops = lowered_flops(lowered)
    except Exception as e:
        raise ProgramError(f"{where} could not be lowered with its arguments: {one_line(e)}") from e
    return make_step, names, arrays, flops


def _short_path(path: Sequence[Any]) -> str:
    """The last two keys of a leaf's path that are not indices, joined by ``_`` and made an
    identifier (``q_weight``); ``argN`` for an argument that is a leaf itself."""
    keys = [key_name(k) for k in path]
    tail = [k for k in keys[1:] if not k.isdigit()][-2:]
    text = "_".join(tail) if tail else f"arg{keys[0]}"
    text = re.sub(r"\W", "_", text)
    return text if text[:1].isalpha() else f"a{text}"
