"""Mesh descriptions ("dp=2,mp=4") parsed, validated and turned into ``jax.sharding.Mesh``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardscope._errors import MeshSpecError

if TYPE_CHECKING:
    import jax

MeshLike = "str | Mapping[str, int] | jax.sharding.Mesh"

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
            try:
                value: Any = int(size)
            except ValueError:
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
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise MeshSpecError(
                f"mesh description {where}: axis {name!r} has size {size!r}; sizes must be "
                f"positive integers"
            )
        out[name] = size
    return out


def format_mesh_spec(axes: Mapping[str, int]) -> str:
    """The inverse of :func:`parse_mesh_spec`: ``{'dp': 2, 'mp': 4}`` -> ``'dp=2,mp=4'``."""
    return ",".join(f"{k}={v}" for k, v in axes.items())


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

    >>> mesh = make_mesh("dp=2,mp=4")  # doctest: +SKIP
    >>> dict(mesh.shape)  # doctest: +SKIP
    {'dp': 2, 'mp': 4}
    """
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    axes = parse_mesh_spec(spec)
    devs = list(jax.devices() if devices is None else devices)
    need = math.prod(axes.values())
    if need != len(devs):
        shape = " x ".join(str(v) for v in axes.values())
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} needs {shape} = {need} devices but "
            f"{len(devs)} are available; choose sizes that multiply to {len(devs)}, or "
            f"simulate {need} CPU devices with shardscope.use_cpu_devices({need}) before "
            f"JAX starts"
        )
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return Mesh(
        np.asarray(devs, dtype=object).reshape(tuple(axes.values())),
        tuple(axes),
        axis_types=(kind,) * len(axes),
    )
