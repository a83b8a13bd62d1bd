"""Where every piece of an array lives: plain data computed from a JAX sharding."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardscope._src.base.errors import LayoutError, ShardscopeError
from shardscope._src.base.text import format_spec


@dataclass(frozen=True)
class DeviceShard:
    """One device's piece of an array.

    Attributes:
      device_id: ``device.id`` of the device holding the piece.
      position: the device's coordinate in the mesh (empty when the sharding has no mesh).
      index: per-dimension ``slice(start, stop)`` into the global array, never open-ended.
      shape: the piece's shape.
      nbytes: the piece's size in bytes.
      replica_id: 0 for the first device holding this piece, 1 for the next, and so on.
    """

    device_id: int
    position: tuple[int, ...]
    index: tuple[slice, ...]
    shape: tuple[int, ...]
    nbytes: int
    replica_id: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "position": list(self.position),
            "index": [[s.start, s.stop] for s in self.index],
            "shape": list(self.shape),
            "nbytes": self.nbytes,
            "replica_id": self.replica_id,
        }


@dataclass(frozen=True)
class Layout:
    """How an array of ``shape`` and ``dtype`` is spread over devices.

    Attributes:
      shape: the global shape.
      dtype: the element type's name (``"float32"``).
      itemsize: bytes per element.
      spec: the PartitionSpec as a tuple (``None`` entries for unsharded dimensions), or
        ``None`` when the sharding is not a ``NamedSharding``.
      mesh_axes: ``{axis name: size}`` of the sharding's mesh, in mesh order (empty if none).
      shards: one :class:`DeviceShard` per device, in mesh order.
    """

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    spec: tuple[Any, ...] | None
    mesh_axes: dict[str, int]
    shards: tuple[DeviceShard, ...]
    sharding_repr: str = field(default="", compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole logical array."""
        return math.prod(self.shape) * self.itemsize

    @property
    def device_bytes(self) -> dict[int, int]:
        """``{device id: bytes held}``."""
        return {s.device_id: s.nbytes for s in self.shards}

    @property
    def max_device_bytes(self) -> int:
        return max((s.nbytes for s in self.shards), default=0)

    @property
    def total_bytes(self) -> int:
        """Bytes held over all devices together (``replication * nbytes``)."""
        return sum(s.nbytes for s in self.shards)

    @property
    def replication(self) -> int:
        """How many devices hold each element."""
        return 1 + max((s.replica_id for s in self.shards), default=0)

    @property
    def shard_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s.shape for s in self.shards)

    @property
    def spec_str(self) -> str:
        return format_spec(self.spec) if self.spec is not None else self.sharding_repr

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "spec": None if self.spec is None else [_spec_entry_json(e) for e in self.spec],
            "mesh_axes": dict(self.mesh_axes),
            "nbytes": self.nbytes,
            "replication": self.replication,
            "max_device_bytes": self.max_device_bytes,
            "shards": [s.to_dict() for s in self.shards],
        }

    def __rich__(self) -> Any:
        from shardscope._src.render.console import layout_table

        return layout_table(self)

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        from shardscope._src.render.console import mimebundle

        return mimebundle(self)


def _spec_entry_json(entry: Any) -> Any:
    if entry is None or isinstance(entry, str):
        return entry
    return list(entry)


def _axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def normalize_spec(spec: Any, rank: int, mesh_axes: Mapping[str, int]) -> tuple[Any, ...]:
    """Checks a PartitionSpec against a rank and a mesh; pads it with ``None`` to the rank."""
    entries = tuple(spec)
    if len(entries) > rank:
        raise LayoutError(
            f"PartitionSpec {format_spec(entries)} has {len(entries)} entries but the array "
            f"has rank {rank}; give at most one entry per dimension"
        )
    seen: set[str] = set()
    for entry in entries:
        for axis in _axes_of(entry):
            if axis not in mesh_axes:
                raise LayoutError(
                    f"PartitionSpec {format_spec(entries)} names axis {axis!r}, which is not in "
                    f"the mesh (axes: {', '.join(mesh_axes) or 'none'})"
                )
            if axis in seen:
                raise LayoutError(
                    f"PartitionSpec {format_spec(entries)} uses mesh axis {axis!r} twice; an "
                    f"axis can shard at most one dimension"
                )
            seen.add(axis)
    return entries + (None,) * (rank - len(entries))


def check_divisible(
    shape: Sequence[int], spec: Sequence[Any], mesh_axes: Mapping[str, int]
) -> None:
    """Raises :class:`LayoutError` naming the first dimension the mesh does not divide."""
    for dim, (size, entry) in enumerate(zip(shape, spec, strict=False)):
        axes = _axes_of(entry)
        parts = math.prod(mesh_axes[a] for a in axes)
        if parts > 1 and size % parts:
            names = " x ".join(f"{a}={mesh_axes[a]}" for a in axes)
            raise LayoutError(
                f"dimension {dim} of shape {tuple(shape)} has size {size}, which mesh axis "
                f"{names} (size {parts}) does not divide; pad it to a multiple of {parts} or "
                f"shard another dimension"
            )


def layout(x_or_shape: Any, sharding: Any = None, *, dtype: Any = None) -> Layout:
    """Where every piece of an array lives, as plain data.

    Call it on an array (``layout(x)``) or, with no array allocated, on a shape and a sharding
    (``layout((1024, 1024), NamedSharding(mesh, P("model")), dtype="float32")``). Works for
    any rank and any mesh. The result renders as a table in rich and in notebooks.

    >>> import jax, numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("model",))
    >>> lay = layout((8, 4), NamedSharding(mesh, P()), dtype="float32")
    >>> lay.replication == jax.device_count()
    True
    """
    import numpy as np

    if sharding is None:
        if not hasattr(x_or_shape, "sharding") or not hasattr(x_or_shape, "shape"):
            raise ShardscopeError(
                f"layout() of a {type(x_or_shape).__name__} needs a sharding: pass a JAX array, "
                f"or a shape and a sharding, e.g. layout((8, 4), NamedSharding(mesh, P('x')))"
            )
        shape = tuple(int(d) for d in x_or_shape.shape)
        sharding = x_or_shape.sharding
        if sharding is None:
            raise ShardscopeError(
                f"layout() of a {type(x_or_shape).__name__} with no sharding: give it one "
                f"(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))) "
                f"or call layout(shape, sharding)"
            )
        dt = _dtype(x_or_shape.dtype if dtype is None else dtype)
    else:
        try:
            shape = tuple(int(d) for d in x_or_shape)
        except TypeError:
            raise ShardscopeError(
                f"layout(shape, sharding): shape must be a sequence of integers, got {x_or_shape!r}"
            ) from None
        if any(d < 0 for d in shape):
            raise ShardscopeError(f"layout(): shape {shape} has a negative dimension")
        dt = _dtype("float32" if dtype is None else dtype)
    if not hasattr(sharding, "devices_indices_map"):
        from jax.sharding import PartitionSpec

        hint = (
            "a PartitionSpec needs its mesh: pass NamedSharding(mesh, spec)"
            if isinstance(sharding, PartitionSpec)
            else "pass e.g. NamedSharding(mesh, P('x'))"
        )
        raise ShardscopeError(f"layout(): {sharding!r} is not a jax.sharding.Sharding; {hint}")

    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    axes: dict[str, int] = {}
    if mesh is not None and spec is not None and hasattr(mesh, "devices"):
        axes = {str(k): int(v) for k, v in mesh.shape.items()}
        spec = normalize_spec(spec, len(shape), axes)
        check_divisible(shape, spec, axes)
        order = list(mesh.devices.flat)
        positions = {d: tuple(int(i) for i in p) for p, d in np.ndenumerate(mesh.devices)}
    else:
        spec = None
        order = sorted(sharding.device_set, key=lambda d: d.id)
        positions = {d: () for d in order}

    index_map = sharding.devices_indices_map(shape)
    pieces = (
        (
            int(device.id),
            positions[device],
            tuple(slice(*s.indices(n)[:2]) for s, n in zip(index_map[device], shape, strict=True)),
        )
        for device in order
    )
    return _assemble(shape, dt, spec, axes, pieces, repr(sharding))


def spec_layout(
    shape: Sequence[int],
    mesh_axes: Mapping[str, int] | str,
    spec: Sequence[Any],
    *,
    dtype: Any = "float32",
) -> Layout:
    """The layout a ``NamedSharding`` would give, computed without any device.

    Devices are numbered 0..N-1 in mesh order, as ``jax.make_mesh`` lays them out. Used to plan
    meshes larger than the machine has.
    """
    import numpy as np

    from shardscope._src.mesh import parse_mesh_spec

    axes = parse_mesh_spec(mesh_axes) if isinstance(mesh_axes, str) else dict(mesh_axes)
    shape = tuple(int(d) for d in shape)
    spec = normalize_spec(spec, len(shape), axes)
    check_divisible(shape, spec, axes)
    dt = _dtype(dtype)
    names = list(axes)
    sizes = [axes[a] for a in names]

    def pieces() -> Any:
        for device_id, pos in enumerate(np.ndindex(*sizes) if sizes else [()]):
            coord = dict(zip(names, pos, strict=True))
            index = []
            for size, entry in zip(shape, spec, strict=True):
                block, parts = 0, 1
                for a in _axes_of(entry):  # major-to-minor, as JAX orders a tuple entry
                    block = block * axes[a] + coord[a]
                    parts *= axes[a]
                step = size // parts
                index.append(slice(block * step, (block + 1) * step))
            yield device_id, tuple(int(p) for p in pos), tuple(index)

    return _assemble(shape, dt, spec, axes, pieces(), "")


def _dtype(dtype: Any) -> Any:
    import jax.numpy as jnp  # knows bfloat16 and the other ml_dtypes by name
    import numpy as np

    try:
        return np.dtype(jnp.dtype(dtype))
    except TypeError:
        raise ShardscopeError(
            f"dtype {dtype!r} is not a data type; use e.g. 'float32', 'bfloat16' or 'int8'"
        ) from None


def _assemble(
    shape: tuple[int, ...],
    dt: Any,
    spec: tuple[Any, ...] | None,
    axes: dict[str, int],
    pieces: Any,
    sharding_repr: str,
) -> Layout:
    """A :class:`Layout` from ``(device id, mesh position, index)`` triples in mesh order."""
    shards = []
    seen: dict[tuple[tuple[int, int], ...], int] = {}
    for device_id, position, index in pieces:
        key = tuple((s.start, s.stop) for s in index)
        replica = seen.get(key, 0)  # the n-th device holding the same piece
        seen[key] = replica + 1
        piece = tuple(s.stop - s.start for s in index)
        shards.append(
            DeviceShard(
                device_id=device_id,
                position=position,
                index=index,
                shape=piece,
                nbytes=math.prod(piece) * dt.itemsize,
                replica_id=replica,
            )
        )
    return Layout(
        shape=shape,
        dtype=dt.name,
        itemsize=dt.itemsize,
        spec=spec,
        mesh_axes=axes,
        shards=tuple(shards),
        sharding_repr=sharding_repr,
    )
