"""The minimum communication of one sharded matmul ``C[M,N] = A[M,K] @ B[K,N]`` for any input
and output specs: the cheapest schedule, searched rather than looked up (see
:func:`best_schedule`). A schedule says, per mesh axis, how the product is split and which
collectives that costs; the cheapest schedule's collectives are the :class:`Bound`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
)
from shardscope._src.base.errors import StrategyError, is_int
from shardscope._src.base.notes import Note
from shardscope._src.base.records import Record, json_value, record_dict
from shardscope._src.base.text import format_mesh_spec, format_spec_entries
from shardscope._src.bounds.terms import Bound, BoundNote, Term, TermRole
from shardscope._src.mesh import mesh_axes, parse_mesh_spec
from shardscope._src.model.config import DTYPES, MAX_DIM

# -- one sharded matmul -----------------------------------------------------------------------

# The compute partitions of C[m,n] = A[m,k] @ B[k,n] along one axis. None: every device
# computes the whole product (duplicated flops).
PARTITIONS = ("m", "n", "k", None)
_NEEDS_A = {"m": "m", "k": "k", "n": None, None: None}
_NEEDS_B = {"k": "k", "n": "n", "m": None, None: None}
_MAKES_C = {"m": "m", "n": "n", "k": "partial", None: None}
_DIMS = {"a": ("m", "k"), "b": ("k", "n"), "c": ("m", "n")}

Spec = tuple[str | None, str | None]
#: A spec as written: ``"None,model"`` or ``(None, "model")``.
SpecText = str | Sequence[str | None]


def parse_spec(text: SpecText, *, what: str = "spec") -> Spec:
    """``"None,model"`` or ``(None, "model")`` -> ``(None, "model")``: one entry per dimension."""
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",")]
        entries: list[str | None] = [None if p in ("None", "none", "") else p for p in parts]
    else:
        entries = [None if p is None else str(p) for p in text]
    if len(entries) != 2:
        raise StrategyError(
            f"{what} {text!r} has {len(entries)} entries, but a matrix has 2 dimensions; "
            f"write one entry per dimension, comma-separated, e.g. 'None,model'"
        )
    return entries[0], entries[1]


@dataclass(frozen=True)
class MatmulProblem(Record):
    """``C[m,n] = A[m,k] @ B[k,n]`` with one spec entry (axis name or None) per dimension."""

    mesh: dict[str, int]
    m: int
    k: int
    n: int
    dtype: str
    a_spec: Spec
    b_spec: Spec
    out_spec: Spec

    def __post_init__(self) -> None:

        for name in ("m", "k", "n"):
            v = getattr(self, name)
            if not is_int(v, 1):
                raise StrategyError(f"matmul {name}={v!r}: must be a positive integer")
            if v > MAX_DIM:
                raise StrategyError(
                    f"matmul {name}={v}: sizes go up to {MAX_DIM} (2**20); choose a smaller {name}"
                )
        if self.dtype not in DTYPES:
            raise StrategyError(
                f"matmul dtype {self.dtype!r}: must be one of {', '.join(DTYPES)} (JAX computes "
                f"in 32 bits unless jax_enable_x64 is set, so a float64 bound would not describe "
                f"the program)"
            )
        sizes = {"m": self.m, "k": self.k, "n": self.n}
        for arr in ("a", "b", "c"):
            spec = self.spec(arr)
            label = {"a": "a-spec", "b": "b-spec", "c": "out-spec"}[arr]
            if len(spec) != 2:
                raise StrategyError(
                    f"{label} {spec!r} has {len(spec)} entries; a matrix has 2 dimensions"
                )
            text = repr(format_spec_entries(spec))
            seen = [a for a in spec if a is not None]
            if len(seen) != len(set(seen)):
                raise StrategyError(
                    f"{label} {text} uses axis {seen[0]!r} on both dimensions; an axis "
                    f"can shard one dimension of an array, e.g. '{seen[0]},None'"
                )
            for dim, axis in zip(_DIMS[arr], spec, strict=True):
                if axis is None:
                    continue
                if axis not in self.mesh:
                    raise StrategyError(
                        f"{label} {text} names axis {axis!r}, which the mesh "
                        f"{format_mesh_spec(self.mesh)!r} does not have; use one of "
                        f"{', '.join(self.mesh)} or None"
                    )
                if sizes[dim] % self.mesh[axis]:
                    raise StrategyError(
                        f"{label} {text} shards {dim}={sizes[dim]} over axis "
                        f"{axis}={self.mesh[axis]}, but {sizes[dim]} is not divisible by "
                        f"{self.mesh[axis]}; choose {dim} a multiple of {self.mesh[axis]} or "
                        f"leave that dimension unsharded (None)"
                    )

        try:
            jnp.dtype(self.dtype)
        except TypeError:
            raise StrategyError(
                f"matmul dtype {self.dtype!r} is not a numeric dtype; e.g. float32, bfloat16"
            ) from None

    @property
    def itemsize(self) -> int:

        return jnp.dtype(self.dtype).itemsize

    def spec(self, arr: str) -> Spec:
        return {"a": self.a_spec, "b": self.b_spec, "c": self.out_spec}[arr]

    def where(self, arr: str, axis: str) -> str | None:
        """The dimension (``m``/``k``/``n``) of ``arr`` that ``axis`` shards, or None."""
        for dim, a in zip(_DIMS[arr], self.spec(arr), strict=True):
            if a == axis:
                return dim
        return None

    def array_bytes(self, arr: str, axis: str) -> int:
        """Bytes of ``arr`` as one group of ``axis`` sees it (sharded by the other axes)."""
        sizes = {"m": self.m, "k": self.k, "n": self.n}
        total = math.prod(sizes[d] for d in _DIMS[arr]) * self.itemsize
        others = math.prod(self.mesh[a] for a in self.spec(arr) if a is not None and a != axis)
        return total // others

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class AxisSchedule:
    """How one mesh axis is used: the compute partition and the collectives it costs.

    ``a``/``b`` are the dimensions the schedule wants A and B sharded on along this axis,
    ``product`` the product's (``"partial"``: unreduced sums, when ``partition == "k"``).
    """

    axis: str
    size: int
    partition: str | None
    a: str | None
    b: str | None
    product: str | None
    terms: tuple[Term, ...]

    @property
    def traffic_bytes(self) -> int:
        return sum(t.traffic_bytes for t in self.terms)

    @property
    def duplicated_flops(self) -> bool:
        return self.partition is None and self.size > 1

    def note(self) -> Note:
        """What this axis does, as the bound's note."""
        steps = [t.what for t in self.terms]
        return Note(
            BoundNote.AXIS_SCHEDULE,
            {"axis": self.axis, "partition": self.partition, "steps": steps},
        )

    def describe(self) -> str:
        return self.note().text

    def to_dict(self) -> dict[str, Any]:
        return record_dict(
            self,
            keys={"describe": "description"},
            extra=("traffic_bytes", "duplicated_flops", "describe"),
        )


@dataclass(frozen=True)
class MatmulSchedule:
    """A schedule for every mesh axis, with the bound it achieves and the specs that force it."""

    problem: MatmulProblem
    axes: tuple[AxisSchedule, ...]

    @property
    def traffic_bytes(self) -> int:
        return sum(p.traffic_bytes for p in self.axes)

    @property
    def flops_per_device(self) -> int:
        split = math.prod(p.size for p in self.axes if p.partition is not None)
        return self.problem.flops // split

    def bound(self) -> Bound:
        terms = tuple(t for p in self.axes for t in p.terms)
        notes = tuple(p.note() for p in self.axes)
        return Bound("matmul", terms, notes)

    def layout(self, which: str) -> tuple[Any, Any]:
        """Spec entries the schedule wants for ``"a"``, ``"b"`` or the ``"product"`` (None where
        a product dimension holds partial sums, which no spec can express)."""
        dims = _DIMS["c" if which == "product" else which]
        entries: list[list[str]] = [[], []]
        for p in self.axes:
            want = getattr(p, which)
            if want in dims:
                entries[dims.index(want)].append(p.axis)
        out = [None if not e else e[0] if len(e) == 1 else tuple(e) for e in entries]
        return out[0], out[1]

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, omit=("problem",), extra=("traffic_bytes", "flops_per_device")),
            **{f"{w}_spec": json_value(self.layout(w)) for w in ("a", "b", "product")},
        }


def _reshard(
    kind_from: str | None,
    kind_to: str | None,
    payload: int,
    n: int,
    axis: str,
    label: str,
    role: TermRole,
) -> Term | None:
    """The collective that moves an array's sharding on one axis from one dim to another."""
    if kind_from == kind_to or kind_from is None:
        return None  # same layout, or a local slice of a replicated array
    if kind_from == "partial":
        kind = ALL_REDUCE if kind_to is None else REDUCE_SCATTER
        where = "to every device" if kind_to is None else f"to {kind_to}-shards"
        what = f"{kind} {label} partial sums {where}"
        return Term(kind, (axis,), n, payload, 1, what, role=role)
    if kind_to is None:
        what = f"all-gather {label} ({kind_from}-sharded)"
        return Term(ALL_GATHER, (axis,), n, payload, 1, what, role=role)
    what = f"all-to-all {label} from {kind_from}-shards to {kind_to}-shards"
    return Term(ALL_TO_ALL, (axis,), n, payload, 1, what, role=role)


def axis_schedule(problem: MatmulProblem, axis: str, partition: str | None) -> AxisSchedule | None:
    """The schedule that splits ``partition`` over ``axis``, or None if a dimension won't
    divide."""
    n = problem.mesh[axis]
    sizes = {"m": problem.m, "k": problem.k, "n": problem.n}
    if partition is not None and sizes[partition] % n:
        return None
    a, b, product = _NEEDS_A[partition], _NEEDS_B[partition], _MAKES_C[partition]
    operand, out = TermRole.OPERAND_RESHARD, TermRole.PRODUCT_RESHARD
    steps = [
        _reshard(
            problem.where("a", axis), a, problem.array_bytes("a", axis), n, axis, "A", operand
        ),
        _reshard(
            problem.where("b", axis), b, problem.array_bytes("b", axis), n, axis, "B", operand
        ),
        _reshard(
            product, problem.where("c", axis), problem.array_bytes("c", axis), n, axis, "C", out
        ),
    ]
    return AxisSchedule(axis, n, partition, a, b, product, tuple(t for t in steps if t))


def best_schedule(problem: MatmulProblem, *, duplicate_flops: bool = True) -> MatmulSchedule:
    """The cheapest schedule, in bytes sent per device, for ``problem``.

    The rule behind the reference sheet's cases a to e'': along each mesh axis the product is
    split over one of its index dimensions (``m``, ``n``, the contraction ``k``, or none, every
    device computing all of it); that choice fixes the layout each operand needs and the
    layout the product comes out in. Each array then moves at most once per axis: a
    replicated one is sliced for free; a sharded one is all-gathered (to replicated) or
    all-to-all-ed (to another dimension); the product's partial sums (``k``) are all-reduced
    (output replicated) or reduce-scattered (output sharded). The bound is the cheapest
    choice, summed over axes, each axis scheduled with the arrays as the other axes' specs
    shard them. Ties go to fewer collectives, then to split compute.

    ``duplicate_flops=False`` forbids the "none" split on axes where any array is sharded
    (every device then does ``1/devices`` of the flops).
    """
    chosen = []
    for axis in problem.mesh:
        used = any(problem.where(arr, axis) for arr in ("a", "b", "c"))
        options = [
            p
            for part in PARTITIONS
            if (duplicate_flops or part is not None or not used)
            and (p := axis_schedule(problem, axis, part)) is not None
        ]
        chosen.append(
            min(
                options,
                key=lambda p: (
                    p.traffic_bytes,
                    len(p.terms),
                    p.partition is None,
                    PARTITIONS.index(p.partition),
                ),
            )
        )
    return MatmulSchedule(problem, tuple(chosen))


def matmul_schedules(problem: MatmulProblem) -> list[MatmulSchedule]:
    """Every combination of per-axis partitions, cheapest first (for reports and tests)."""
    per_axis = [
        [p for part in PARTITIONS if (p := axis_schedule(problem, axis, part)) is not None]
        for axis in problem.mesh
    ]
    combos = [MatmulSchedule(problem, tuple(c)) for c in itertools.product(*per_axis)]
    return sorted(combos, key=lambda p: (p.traffic_bytes, sum(len(a.terms) for a in p.axes)))


def matmul_schedule(
    mesh: Any,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: SpecText,
    b_spec: SpecText,
    out_spec: SpecText,
) -> MatmulSchedule:
    """The cheapest schedule for ``C = A @ B`` with the given specs (:func:`best_schedule`).

    ``mesh`` is a ``Mesh``, a description ``"x=8"`` or a ``{name: size}`` mapping; specs are
    ``"None,x"`` strings or pairs.

    >>> s = matmul_schedule("x=8", 4096, 1024, 1024, "float32", "None,x", "None,None",
    ...                     "None,x")
    >>> [a.partition for a in s.axes], s.layout("a")
    (['m'], ('x', None))
    """
    problem = matmul_problem(mesh, m, k, n, dtype, a_spec, b_spec, out_spec)
    return best_schedule(problem)


def matmul_bound(
    mesh: Any,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: SpecText,
    b_spec: SpecText,
    out_spec: SpecText,
) -> Bound:
    """The minimum communication of ``C = A @ B`` with the given specs: the collectives of
    the cheapest schedule (:func:`matmul_schedule`; its ``notes`` describe the schedule).

    >>> b = matmul_bound("x=8", 4096, 1024, 1024, "float32", "None,x", "None,None", "None,x")
    >>> b.traffic_bytes  # all-to-all A to rows, compute, all-to-all C to columns
    3670016
    """
    return matmul_schedule(mesh, m, k, n, dtype, a_spec, b_spec, out_spec).bound()


def matmul_problem(
    mesh: Any,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: SpecText,
    b_spec: SpecText,
    out_spec: SpecText,
) -> MatmulProblem:

    if isinstance(mesh, str | Mapping):
        sizes = parse_mesh_spec(mesh)
    else:
        sizes = mesh_axes(mesh)
    return MatmulProblem(
        sizes,
        m,
        k,
        n,
        str(dtype),
        parse_spec(a_spec, what="a-spec"),
        parse_spec(b_spec, what="b-spec"),
        parse_spec(out_spec, what="out-spec"),
    )
