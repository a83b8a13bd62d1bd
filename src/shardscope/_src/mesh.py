"""Mesh descriptions ("dp=2,mp=4") parsed, validated and turned into ``jax.sharding.Mesh``;
:class:`MeshShape`, the one canonical mesh shape a planner carries."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh

from shardscope._src.base.devices import (
    DEFAULT_CPU_DEVICES,
    backends_started,
    use_cpu_devices,
)
from shardscope._src.base.errors import AxisTypeError, MeshSpecError
from shardscope._src.base.text import format_mesh_spec as format_mesh_spec

#: The axis types shardscope builds meshes with, by the names the command line and
#: ``axis_types=`` take. (``Manual`` axes are shard_map's own, inside a mapped function.)
AXIS_TYPES: dict[str, AxisType] = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}
#: What ``jax.make_mesh`` gives when it is not told (Explicit since JAX 0.9: sharding in types).
DEFAULT_AXIS_TYPE = AxisType.Explicit

#: The largest axis a mesh description may give: far above any cluster (a plan of one has
#: more devices than one process can simulate; a mesh of real devices is bounded by them).
MAX_AXIS_SIZE = 2**20
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_mesh_spec(spec: str | Mapping[str, int]) -> dict[str, int]:
    """Parses a mesh description into an ordered ``{axis name: size}`` dict.

    Accepts ``"dp=2,mp=4"`` (spaces allowed) or a mapping (a :class:`MeshShape` too). Names
    must be unique identifiers and sizes positive integers.

    >>> parse_mesh_spec("dp=2,mp=4")
    {'dp': 2, 'mp': 4}
    """
    if isinstance(spec, MeshShape):
        return spec.sizes  # checked when it was made
    if isinstance(spec, Mapping):
        return _checked(list(spec.items()), repr(dict(spec)))
    if isinstance(spec, str):
        return _checked(_spec_items(spec), repr(spec))
    raise MeshSpecError(
        f"mesh description must be a string like 'dp=2,mp=4' or a mapping, got "
        f"{type(spec).__name__}"
    )


def _spec_items(spec: str) -> list[tuple[str, Any]]:
    """The ``(name, size)`` pairs a description ``"dp=2,mp=4"`` writes, sizes as integers."""
    where = repr(spec)
    text = spec.strip()
    if not text:
        raise MeshSpecError("mesh description is empty; write axes as name=size, e.g. 'dp=2,mp=4'")
    items: list[tuple[str, Any]] = []
    for part in text.split(","):
        if "=" not in part:
            raise MeshSpecError(
                f"mesh description {where}: axis {part!r} has no size; write axes as "
                f"name=size, e.g. 'dp=2,mp=4'"
            )
        name, _, written = part.partition("=")
        name, written = name.strip(), written.strip()
        digits = written.removeprefix("-")
        if not (digits.isascii() and digits.isdigit()):
            raise MeshSpecError(
                f"mesh description {where}: size {written!r} of axis {name!r} is not an "
                f"integer; write e.g. '{name or 'dp'}=2'"
            ) from None
        items.append((name, int(written)))
    return items


def _checked(items: Sequence[tuple[Any, Any]], where: str) -> dict[str, int]:
    """``items`` as an ordered ``{axis name: size}`` dict, once every name is a unique
    identifier and every size a positive integer (``where`` names them in errors)."""
    if not items:
        raise MeshSpecError(f"mesh description {where} names no axes; e.g. 'dp=2,mp=4'")
    out: dict[str, int] = {}
    for name, size in items:
        if not isinstance(name, str) or not name:
            raise MeshSpecError(
                f"mesh description {where}: an axis has an empty name; name every axis, "
                f"e.g. 'dp=2,mp=4'"
            )
        if not _NAME.match(name):
            raise MeshSpecError(
                f"mesh description {where}: axis name {name!r} is not an identifier; use "
                f"letters, digits and '_', starting with a letter"
            )
        if name in out:
            raise MeshSpecError(
                f"mesh description {where}: axis name {name!r} is repeated; each axis needs "
                f"its own name"
            )
        try:
            value = operator.index(size)
        except TypeError:
            value = 0
        if isinstance(size, bool) or value <= 0:
            raise MeshSpecError(
                f"mesh description {where}: axis {name!r} has size {size!r}; sizes must be "
                f"positive integers"
            )
        if value > MAX_AXIS_SIZE:
            raise MeshSpecError(
                f"mesh description {where}: axis {name!r} has size {value}, more than this "
                f"tool supports ({MAX_AXIS_SIZE})"
            )
        out[name] = value
    return out


@dataclass(frozen=True, eq=False)
class MeshShape(Mapping[str, int]):
    """A mesh's shape, the one form a planner carries a mesh in: its axes' names and sizes,
    in order. Made once from what the user gave (a description ``"data=4,model=2"``, a
    ``{name: size}`` mapping, ``(name, size)`` pairs, a ``Mesh`` or ``AbstractMesh``, or a
    MeshShape), checked as :func:`parse_mesh_spec` checks a description; everything else is
    read from it: the description (:attr:`spec`), the sizes (:attr:`sizes`), an abstract
    mesh (:meth:`abstract`) or a mesh of devices (:meth:`on`; a target's compile-only
    devices: :func:`shardscope.target_mesh` takes a MeshShape).

    It reads as a ``{name: size}`` mapping, in axis order. Like an ``OrderedDict``, two
    shapes are equal when their axes are, in the same order; a shape and another mapping
    when they hold the same sizes.

    >>> shape = MeshShape("data=4, model=2")
    >>> shape
    MeshShape('data=4,model=2')
    >>> shape == MeshShape({"data": 4, "model": 2}) == MeshShape((("data", 4), ("model", 2)))
    True
    >>> shape.spec, shape.sizes, shape.devices, shape["model"]
    ('data=4,model=2', {'data': 4, 'model': 2}, 8, 2)
    >>> MeshShape("stage=2,data=4").without("stage")
    MeshShape('data=4')

    Raises:
        MeshSpecError: a bad description, a repeated or bad name, a size that is not a
            positive integer, or something that describes no mesh.
    """

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", _shape_axes(self.axes))

    @classmethod
    def of(cls, mesh: Any) -> MeshShape:
        """``mesh`` as a MeshShape: itself when it is one, else made from it."""
        return mesh if isinstance(mesh, MeshShape) else cls(mesh)

    @property
    def names(self) -> tuple[str, ...]:
        """The axes' names, in order."""
        return tuple(name for name, _ in self.axes)

    @property
    def sizes(self) -> dict[str, int]:
        """``{axis name: size}``, in order (a new dict)."""
        return dict(self.axes)

    @property
    def spec(self) -> str:
        """The description ``"data=4,model=2"``."""
        return format_mesh_spec(self.axes)

    @property
    def devices(self) -> int:
        """How many devices the mesh holds (the sizes' product)."""
        return math.prod(size for _, size in self.axes)

    def without(self, *names: str) -> MeshShape:
        """This shape less the axes ``names`` (those it has)."""
        return MeshShape(tuple((n, v) for n, v in self.axes if n not in names))

    def abstract(self) -> jax.sharding.AbstractMesh:
        """A ``jax.sharding.AbstractMesh`` of this shape, every axis Auto: what a strategy is
        placed on to check its fit and give its specs and bounds, with no device."""
        return AbstractMesh(
            tuple(self.sizes.values()), self.names, axis_types=(AxisType.Auto,) * len(self.axes)
        )

    def on(
        self, devices: Sequence[Any] | None = None, *, axis_types: Any = None
    ) -> jax.sharding.Mesh:
        """A ``jax.sharding.Mesh`` of this shape over ``devices`` (default: all of JAX's), as
        :func:`make_mesh` builds it."""
        return make_mesh(self, devices=devices, axis_types=axis_types)

    def to_dict(self) -> dict[str, int]:
        """The JSON of a mesh's shape: ``{axis name: size}``."""
        return self.sizes

    def __getitem__(self, name: str) -> int:
        for n, size in self.axes:
            if n == name:
                return size
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.axes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MeshShape):
            return self.axes == other.axes
        if isinstance(other, Mapping):
            return self.sizes == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.axes)

    def __repr__(self) -> str:
        return f"MeshShape({self.spec!r})"

    def __str__(self) -> str:
        return self.spec


def _shape_axes(mesh: Any) -> tuple[tuple[str, int], ...]:
    """The checked ``(name, size)`` pairs of what :class:`MeshShape` is made from."""
    if isinstance(mesh, MeshShape):
        return mesh.axes
    if isinstance(mesh, str | Mapping):
        return tuple(parse_mesh_spec(mesh).items())
    if isinstance(mesh, jax.sharding.Mesh | jax.sharding.AbstractMesh):
        return tuple(mesh_axes(mesh).items())
    if isinstance(mesh, tuple | list):
        pairs = []
        for pair in mesh:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise MeshSpecError(
                    f"mesh {mesh!r}: {pair!r} is not an (axis name, size) pair; give pairs "
                    f"such as (('data', 4), ('model', 2)), or a description 'data=4,model=2'"
                )
            pairs.append((pair[0], pair[1]))
        return tuple(_checked(pairs, repr(mesh)).items())
    raise MeshSpecError(
        f"a mesh shape is a description such as 'data=4,model=2', a mapping of axis names to "
        f"sizes, (name, size) pairs or a jax.sharding.Mesh; got {type(mesh).__name__}"
    )


def mesh_axes(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh) -> dict[str, int]:
    """``{axis name: size}`` of a JAX mesh, in mesh order."""
    return {str(k): int(v) for k, v in mesh.shape.items()}


def axis_types_of(
    axis_types: Any, names: Sequence[str], *, explicit: bool | None = None
) -> tuple[AxisType, ...]:
    """One ``AxisType`` per axis of ``names`` from what a user gives: None (what
    ``jax.make_mesh`` gives), ``"explicit"``, ``"auto"``, an ``AxisType``, or one of those per
    axis. ``explicit`` is the older spelling (True: Explicit, False: Auto).

    >>> axis_types_of("auto", ("data", "model"))
    (Auto, Auto)
    """
    if explicit is not None:
        if axis_types is not None:
            raise AxisTypeError(
                f"explicit={explicit!r} and axis_types={axis_types!r} both set the axis types; "
                f"keep axis_types= alone",
                param="axis_types",
            )
        axis_types = "explicit" if explicit else "auto"
    if axis_types is None:
        return (DEFAULT_AXIS_TYPE,) * len(names)
    if isinstance(axis_types, str | AxisType):
        return (_axis_type(axis_types),) * len(names)
    if isinstance(axis_types, Sequence) and len(axis_types) == len(names):
        return tuple(_axis_type(a) for a in axis_types)
    raise AxisTypeError(
        f"axis_types={axis_types!r}: give one axis type for every axis, or one per axis "
        f"({len(names)}: {', '.join(names)}), each 'explicit' or 'auto'",
        param="axis_types",
    )


def _axis_type(value: Any) -> AxisType:
    if isinstance(value, AxisType) and value in AXIS_TYPES.values():
        return value
    if isinstance(value, str) and value.strip().lower() in AXIS_TYPES:
        return AXIS_TYPES[value.strip().lower()]
    raise AxisTypeError(
        f"axis_types={value!r} is not an axis type a mesh is built with; use 'explicit' "
        f"(JAX's default: shardings are part of the arrays' types, jax.sharding.reshard moves "
        f"them) or 'auto' (the compiler propagates shardings, with_sharding_constraint steers "
        f"it)",
        param="axis_types",
    )


def axis_types_name(mesh: Any) -> str:
    """``"explicit"``, ``"auto"`` or ``"explicit,auto"`` (one per axis when they differ)."""
    names = [_type_name(t) for t in getattr(mesh, "axis_types", ())]
    return names[0] if len(set(names)) == 1 else ",".join(names)


def _type_name(t: Any) -> str:
    for name, value in AXIS_TYPES.items():
        if t == value:
            return name
    return str(getattr(t, "name", t)).lower()


def make_mesh(
    spec: str | Mapping[str, int],
    *,
    devices: Sequence[Any] | None = None,
    axis_types: Any = None,
    explicit: bool | None = None,
) -> jax.sharding.Mesh:
    """Builds a ``jax.sharding.Mesh`` from a description such as ``"dp=2,mp=4"``.

    The sizes must multiply to the number of devices (all of ``jax.devices()`` unless
    ``devices`` is given), taken in order. Axes are what ``jax.make_mesh`` gives unless
    ``axis_types`` says otherwise: ``"explicit"`` (JAX's default, sharding in types: the
    arrays' shardings are part of their types and ``jax.sharding.reshard`` moves them) or
    ``"auto"`` (the compiler propagates shardings and ``with_sharding_constraint`` steers it),
    for every axis or one per axis. ``explicit=True``/``False`` is the older spelling.

    >>> mesh = make_mesh("dp=2,mp=4")  # on 8 devices
    >>> dict(mesh.shape), mesh.axis_types
    ({'dp': 2, 'mp': 4}, (Explicit, Explicit))
    >>> make_mesh("dp=2,mp=4", axis_types="auto").axis_types
    (Auto, Auto)

    Raises:
        MeshSpecError: a bad description, or sizes that do not multiply to the devices.
        AxisTypeError: an axis type that does not exist.
    """

    axes = parse_mesh_spec(spec)
    kinds = axis_types_of(axis_types, tuple(axes), explicit=explicit)
    devs = list(jax.devices() if devices is None else devices)
    need = math.prod(axes.values())
    if len(set(devs)) != len(devs):
        raise MeshSpecError("the devices given to make_mesh repeat a device; list each once")
    if need != len(devs):
        needs = _product(axes)
        if need < len(devs):
            fix = f"or pass devices=jax.devices()[:{need}] to use the first {need}"
        else:
            fix = (
                f"or simulate {need} CPU devices with shardscope.use_cpu_devices({need}) "
                f"before JAX's first computation"
            )
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} needs {needs} devices but {len(devs)} are "
            f"available; choose sizes that multiply to {len(devs)}, {fix}"
        )
    return Mesh(
        np.asarray(devs, dtype=object).reshape(tuple(axes.values())),
        tuple(axes),
        axis_types=kinds,
    )


def first_devices_mesh(
    spec: str | Mapping[str, int], *, axis_types: Any = None
) -> jax.sharding.Mesh:
    """A mesh of the description ``spec`` over the first of JAX's devices, as many as it
    holds: ``"model=4"`` on 8 devices uses devices 0 to 3. What a description given in place
    of a mesh builds (:func:`shardscope.audit_program`, the verdicts); :func:`make_mesh`
    itself takes every device unless it is given some.

    >>> first_devices_mesh("model=4").devices.size  # on 8 devices
    4

    Raises:
        MeshSpecError: a bad description, or one that needs more devices than JAX has
            (names the count and how to simulate it).
        AxisTypeError: an axis type that does not exist.
    """
    axes = parse_mesh_spec(spec)
    need = math.prod(axes.values())
    have = jax.devices()
    if need > len(have):
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} needs {_product(axes)} devices but {len(have)} "
            f"are available; choose sizes that multiply to at most {len(have)}, or simulate "
            f"{need} CPU devices with shardscope.use_cpu_devices({need}) before JAX's first "
            f"computation"
        )
    return make_mesh(axes, devices=have[:need], axis_types=axis_types)


def _product(axes: Mapping[str, int]) -> str:
    """``"2 x 4 = 8"`` for a mesh of several axes, ``"8"`` for one."""
    need = math.prod(axes.values())
    shape = " x ".join(str(v) for v in axes.values())
    return f"{shape} = {need}" if len(axes) > 1 else str(need)


def auto_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """``mesh`` with every axis Auto (the same devices and names): the mesh shardscope's own
    programs are written for, whose collectives the compiler chooses."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def ensure_devices_for(mesh_spec: str | None, devices: int | None = None) -> None:
    """Simulates ``devices`` CPU devices, or enough for ``mesh_spec`` (at least 8), unless
    JAX has started (then a mesh that does not fit is reported where it is built)."""
    need = math.prod(parse_mesh_spec(mesh_spec).values()) if mesh_spec else DEFAULT_CPU_DEVICES
    if devices is not None:
        use_cpu_devices(devices)
    elif not backends_started():
        use_cpu_devices(max(need, DEFAULT_CPU_DEVICES))
