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
from shardscope._src.base.errors import MeshSpecError
from shardscope._src.base.text import format_mesh_spec as format_mesh_spec

MAX_AXIS_SIZE = 2048  # as many devices as JAX's CPU backend compiles for in one process
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
            name, _, size = part.partition("=")
            name, size = name.strip(), size.strip()
            digits = size.removeprefix("-")
            if digits.isascii() and digits.isdigit():
                value: Any = int(size)
            else:
                raise MeshSpecError(
                    f"mesh description {where}: size {size!r} of axis {name!r} is not an "
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


def make_mesh(
    spec: str | Mapping[str, int],
    *,
    devices: Sequence[Any] | None = None,
    explicit: bool = False,
) -> jax.sharding.Mesh:
    """Builds a ``jax.sharding.Mesh`` from a description such as ``"dp=2,mp=4"``.

    The sizes must multiply to the number of devices (all of ``jax.devices()`` unless
    ``devices`` is given). Axes are ``Auto`` by default: the compiler propagates shardings and
    inserts collectives, which is what shardscope shows; ``explicit=True`` gives JAX's
    sharding-in-types axes instead.

    >>> mesh = make_mesh("dp=2,mp=4")  # on 8 devices
    >>> dict(mesh.shape)
    {'dp': 2, 'mp': 4}
    """

    axes = parse_mesh_spec(spec)
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
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return Mesh(
        np.asarray(devs, dtype=object).reshape(tuple(axes.values())),
        tuple(axes),
        axis_types=(kind,) * len(axes),
    )


def ensure_devices_for(mesh_spec: str | None, devices: int | None = None) -> None:
    """Simulates ``devices`` CPU devices, or enough for ``mesh_spec`` (at least 8), unless
    JAX has started (then a mesh that does not fit is reported where it is built)."""
    need = math.prod(parse_mesh_spec(mesh_spec).values()) if mesh_spec else DEFAULT_CPU_DEVICES
    if devices is not None:
        use_cpu_devices(devices)
    elif not backends_started():
        use_cpu_devices(max(need, DEFAULT_CPU_DEVICES))
