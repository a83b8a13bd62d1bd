"""Meshes of a target's devices: ``target_mesh("h100", "data=8,model=8")``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from shardscope._src.base.errors import MeshSpecError, TargetError
from shardscope._src.mesh import axis_types_of, format_mesh_spec, make_mesh, parse_mesh_spec
from shardscope._src.targets.devices import target_devices, target_of_device
from shardscope._src.targets.specs import Family, Target, get_target
from shardscope._src.targets.topology import TpuTopology, topology


def target_mesh(
    target: str | Target,
    spec: str | Mapping[str, int],
    *,
    axis_types: Any = None,
    memory_bytes: float | None = None,
) -> Any:
    """A ``jax.sharding.Mesh`` of a target's devices, for compiling (not running) programs.

    The devices are the target's compile-only devices, as many as the mesh holds, laid out
    as the vendor builds that many (8 GPUs per node; TPU slices per generation). GPU devices
    fill the mesh node by node, so the last axes stay inside a node; TPU devices are placed
    on the torus as ``jax.make_mesh`` places real ones (several slices: the first axis spans
    them). ``cpu`` gives a mesh of simulated CPU devices (:func:`shardscope.use_cpu_devices`).
    ``axis_types`` as in :func:`shardscope.make_mesh` (default: what ``jax.make_mesh`` gives,
    Explicit). ``memory_bytes``: how much of each GPU's memory a program compiled for the
    mesh may hold, which XLA:GPU's scheduler and rematerialization keep it under (default:
    the whole device; less when something the program does not hold lives there too, such
    as optimizer state updated outside it). GPU targets only.

    >>> mesh = target_mesh("h100", "data=8,model=8")  # doctest: +SKIP
    >>> jax.jit(f).lower(*abstract_args).compile()  # doctest: +SKIP

    Raises:
        TargetError: an unknown target, its compiler not installed (names the extra), a
            device count it cannot be built with (names those it can), or ``memory_bytes``
            for a target that takes none.
        MeshSpecError: a bad description.
        AxisTypeError: an axis type that does not exist.
    """

    t = get_target(target)
    axes = parse_mesh_spec(spec)
    kinds = axis_types_of(axis_types, tuple(axes))
    if t.family == Family.CPU:
        if memory_bytes is not None:
            raise TargetError(
                f"memory_bytes={memory_bytes!r}: the cpu target's devices are simulated and "
                "hold no memory limit; leave it None"
            )
        return make_mesh(axes, axis_types=kinds)
    n = math.prod(axes.values())
    topo = topology(t, n)
    devices = target_devices(t, n, memory_bytes=memory_bytes)
    shape = tuple(axes.values())
    grid: Any = None
    if isinstance(topo, TpuTopology):
        try:
            if topo.slices > 1:
                if shape[0] % topo.slices:
                    raise MeshSpecError(
                        f"{t.name} with {n} chips is {topo.describe()}; the first mesh axis "
                        f"spans the slices, so its size must be a multiple of {topo.slices}, "
                        f"got {format_mesh_spec(axes)!r}"
                    )
                ici = (shape[0] // topo.slices, *shape[1:])
                dcn = (topo.slices,) + (1,) * (len(shape) - 1)
                grid = mesh_utils.create_hybrid_device_mesh(
                    ici, dcn, devices, allow_split_physical_axes=True
                )
            else:
                grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        except (NotImplementedError, AssertionError, ValueError) as e:
            if isinstance(e, MeshSpecError):
                raise
            grid = None  # no torus-aware placement for this shape: devices in id order
    if grid is None:
        grid = np.array(devices, dtype=object).reshape(shape)
    return Mesh(grid, tuple(axes), axis_types=kinds)


def check_mesh_target(mesh: Any, target: str | Target) -> Target:
    """The target, once every device of ``mesh`` is one of its devices."""
    t = get_target(target)
    names = {target_of_device(d) for d in mesh.devices.flat}
    if t.family == Family.CPU:
        ok = all(getattr(d, "platform", None) == "cpu" for d in mesh.devices.flat)
    else:
        ok = names == {t.name}
    if not ok:
        kinds = sorted({str(getattr(d, "device_kind", d)) for d in mesh.devices.flat})
        raise TargetError(
            f"the mesh's devices ({', '.join(kinds)}) are not {t.name} devices; build the mesh "
            f"with shardscope.target_mesh({t.name!r}, ...) or give target= a matching name"
        )
    return t
