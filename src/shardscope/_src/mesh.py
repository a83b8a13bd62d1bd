"""Mesh descriptions ("dp=2,mp=4") parsed, validated and turned into ``jax.sharding.Mesh``."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

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

    Accepts ``"dp=2,mp=4"`` (spaces allowed) or a mapping. Names must be unique identifiers
    and sizes positive integers.

    >>> parse_mesh_spec("dp=2,mp=4")
    {'dp': 2, 'mp': 4}
    """
    if isinstance(spec, Mapping):
        items = [(k, v) for k, v in spec.items()]
        where = repr(dict(spec))
    elif isinstance(spec, str):
        where = repr(spec)
        text = spec.strip()
        if not text:
            raise MeshSpecError(
                "mesh description is empty; write axes as name=size, e.g. 'dp=2,mp=4'"
            )
        items = []
        for part in text.split(","):
            if "=" not in part:
                raise MeshSpecError(
                    f"mesh description {where}: axis {part!r} has no size; write axes as "
                    f"name=size, e.g. 'dp=2,mp=4'"
                )
            name, _, written = part.partition("=")
            name, written = name.strip(), written.strip()
            digits = written.removeprefix("-")
            if digits.isascii() and digits.isdigit():
                value: Any = int(written)
            else:
                raise MeshSpecError(
                    f"mesh description {where}: size {written!r} of axis {name!r} is not an "
                    f"integer; write e.g. '{name or 'dp'}=2'"
                ) from None
            items.append((name, value))
    else:
        raise MeshSpecError(
            f"mesh description must be a string like 'dp=2,mp=4' or a mapping, got "
            f"{type(spec).__name__}"
        )

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


def mesh_axes(mesh: jax.sharding.Mesh) -> dict[str, int]:
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
        shape = " x ".join(str(v) for v in axes.values())
        needs = f"{shape} = {need}" if len(axes) > 1 else str(need)
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
