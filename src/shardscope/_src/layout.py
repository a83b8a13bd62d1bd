"""Where every piece of an array lives: plain data computed from a JAX sharding."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as tu
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from shardscope._src.base.display import View, show
from shardscope._src.base.errors import LayoutError, ShardscopeError
from shardscope._src.base.records import json_value, record_dict
from shardscope._src.base.text import format_spec
from shardscope._src.mesh import parse_mesh_spec


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
        return {**record_dict(self), "index": [[s.start, s.stop] for s in self.index]}


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
        return record_dict(
            self,
            omit=("itemsize", "sharding_repr"),
            extra=("nbytes", "replication", "max_device_bytes"),
        )

    # rich and notebooks look these up on the object; its renderer is found when shown.
    def __rich__(self) -> Any:
        return show(self, View.RICH)

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        bundle: dict[str, str] = show(self, View.NOTEBOOK)
        return bundle


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


def layout(x_or_shape: Any, sharding: Any = None, *, dtype: Any = None) -> Any:
    """Where every piece of an array lives, as plain data.

    Call it on an array (``layout(x)``) or, with no array allocated, on a shape and a sharding
    (``layout((1024, 1024), NamedSharding(mesh, P("model")), dtype="float32")``). Works for
    any rank and any mesh. The result renders as a table in rich and in notebooks.

    On a pytree (a Flax NNX model or state, an Equinox module, an optax state, a dict of
    arrays or of ``ShapeDtypeStruct``) it returns a :class:`TreeLayout` instead: one row per
    array with its path, and the totals per device (see :func:`tree_layout`).

    >>> import jax, numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("model",))
    >>> lay = layout((8, 4), NamedSharding(mesh, P()), dtype="float32")
    >>> lay.replication == jax.device_count()
    True
    """

    if sharding is None:
        if not hasattr(x_or_shape, "sharding") or not hasattr(x_or_shape, "shape"):
            if dtype is None and _holds_arrays(x_or_shape):
                return tree_layout(x_or_shape)
            raise ShardscopeError(
                f"layout() of a {type(x_or_shape).__name__} needs a sharding: pass a JAX array, "
                f"a pytree holding arrays (a model, an optimizer state), or a shape and a "
                f"sharding, e.g. layout((8, 4), NamedSharding(mesh, P('x')))"
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

        mesh = getattr(sharding, "mesh", None)
        if isinstance(mesh, jax.sharding.AbstractMesh) and hasattr(sharding, "spec"):
            # An abstract mesh has no devices, only axis sizes: devices numbered in mesh order.
            return spec_layout(shape, dict(mesh.shape), tuple(sharding.spec), dtype=dt)
    else:
        try:
            shape = tuple(int(d) for d in x_or_shape)
        except TypeError:
            raise ShardscopeError(
                f"layout(shape, sharding): shape must be a sequence of integers, got {x_or_shape!r}"
            ) from None
        _check_shape(shape)
        dt = _dtype("float32" if dtype is None else dtype)
    if not hasattr(sharding, "devices_indices_map"):
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
    # Which devices hold the same piece is read from the slices; along a dimension of size 0
    # every slice is empty, so it is read from the same sharding of a shape whose empty
    # dimensions hold one element per device instead (any split of the devices divides it).
    proxy = tuple(n or max(1, len(order)) for n in shape)
    proxy_map = index_map if proxy == shape else sharding.devices_indices_map(proxy)

    def piece_of(device: Any) -> tuple[Any, ...]:
        return tuple(
            (r.start, r.stop)
            for r in (
                slice(*s.indices(n)[:2]) for s, n in zip(proxy_map[device], proxy, strict=True)
            )
        )

    pieces = (
        (
            int(device.id),
            positions[device],
            tuple(slice(*s.indices(n)[:2]) for s, n in zip(index_map[device], shape, strict=True)),
            piece_of(device),
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

    axes = parse_mesh_spec(mesh_axes) if isinstance(mesh_axes, str) else dict(mesh_axes)
    shape = tuple(int(d) for d in shape)
    _check_shape(shape)
    spec = normalize_spec(spec, len(shape), axes)
    check_divisible(shape, spec, axes)
    dt = _dtype(dtype)
    names = list(axes)
    sizes = [axes[a] for a in names]

    def pieces() -> Any:
        for device_id, pos in enumerate(np.ndindex(*sizes) if sizes else [()]):
            coord = dict(zip(names, pos, strict=True))
            index = []
            blocks = []  # which piece: the block along each dimension, whatever its size
            for size, entry in zip(shape, spec, strict=True):
                block, parts = 0, 1
                for a in _axes_of(entry):  # major-to-minor, as JAX orders a tuple entry
                    block = block * axes[a] + coord[a]
                    parts *= axes[a]
                step = size // parts
                index.append(slice(block * step, (block + 1) * step))
                blocks.append(block)
            yield device_id, tuple(int(p) for p in pos), tuple(index), tuple(blocks)

    return _assemble(shape, dt, spec, axes, pieces(), "")


_INT64_MAX = 2**63 - 1  # XLA's shapes hold dimensions and sizes in signed 64-bit integers


def _check_shape(shape: tuple[int, ...]) -> None:
    for i, d in enumerate(shape):
        if d < 0:
            raise ShardscopeError(f"layout(): dimension {i} of the shape is negative")
        if d > _INT64_MAX:
            raise LayoutError(
                f"layout(): dimension {i} of the shape is a {d.bit_length()}-bit number, past "
                f"2**63-1, the largest dimension an XLA shape holds"
            )


def _dtype(dtype: Any) -> Any:
    """The NumPy dtype of ``dtype``; a PRNG key type (``key<fry>``) as JAX's own, whose
    ``itemsize`` is its key data's bytes (two uint32 for threefry)."""
    if not isinstance(dtype, str) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return dtype
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
    """A :class:`Layout` from ``(device id, mesh position, index, piece)`` in mesh order;
    devices with equal ``piece`` keys hold the same piece (an empty slice does not say which)."""
    shards = []
    seen: dict[Any, int] = {}
    for device_id, position, index, key in pieces:
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


# -- whole pytrees: models, optimizer states, abstract arguments -------------------------------


@dataclass(frozen=True)
class LeafLayout:
    """One array of a pytree: where it sits in the tree and how it is spread.

    Attributes:
      path: the leaf's path, keys joined by dots (``"layers.0.weight"``; a Flax variable's
        trailing ``.value`` is left out).
      shape, dtype, nbytes: the global array.
      layout: its :class:`Layout`, or None when it has no sharding (a ``ShapeDtypeStruct``
        without one, or a host NumPy array): such a leaf is "unplaced".
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    layout: Layout | None

    @property
    def spec_str(self) -> str:
        return self.layout.spec_str if self.layout is not None else "unplaced"

    @property
    def max_device_bytes(self) -> int:
        """The most bytes one device holds of it (the whole array when unplaced)."""
        return self.layout.max_device_bytes if self.layout is not None else self.nbytes

    @property
    def replication(self) -> int | None:
        return self.layout.replication if self.layout is not None else None

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout  # an unplaced leaf has no spec, sharding or mesh
        return {
            **record_dict(self, omit=("layout",), extra=("max_device_bytes", "replication")),
            "spec": None if lay is None else json_value(lay.spec),
            "sharding": None if lay is None else lay.spec_str,
            "mesh_axes": None if lay is None else json_value(lay.mesh_axes),
        }


@dataclass(frozen=True)
class TreeLayout:
    """How every array of a pytree is spread over devices, with totals per device.

    Attributes:
      leaves: one :class:`LeafLayout` per array leaf, in the tree's order.
      other_leaves: leaves that are not arrays (functions, strings, Python numbers), skipped.
    """

    leaves: tuple[LeafLayout, ...]
    other_leaves: int = 0

    @property
    def mesh_axes(self) -> dict[str, int]:
        """The mesh of the first sharded leaf with one (empty if none)."""
        for leaf in self.leaves:
            if leaf.layout is not None and leaf.layout.mesh_axes:
                return dict(leaf.layout.mesh_axes)
        return {}

    @property
    def nbytes(self) -> int:
        """Bytes of all the arrays, each counted once."""
        return sum(leaf.nbytes for leaf in self.leaves)

    @property
    def unplaced_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves if leaf.layout is None)

    @property
    def device_bytes(self) -> dict[int, int]:
        """``{device id: bytes it holds}`` over the placed leaves, devices in id order."""
        out: dict[int, int] = {}
        for leaf in self.leaves:
            if leaf.layout is not None:
                for s in leaf.layout.shards:
                    out[s.device_id] = out.get(s.device_id, 0) + s.nbytes
        return dict(sorted(out.items()))

    @property
    def max_device_bytes(self) -> int:
        """The most any one device holds, counting each unplaced leaf whole on every device."""
        return max(self.device_bytes.values(), default=0) + self.unplaced_bytes

    @property
    def min_device_bytes(self) -> int:
        return min(self.device_bytes.values(), default=0) + self.unplaced_bytes

    def __len__(self) -> int:
        return len(self.leaves)

    def __getitem__(self, path: str) -> LeafLayout:
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(path)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(
            self,
            extra=(
                "mesh_axes",
                "nbytes",
                "unplaced_bytes",
                "max_device_bytes",
                "min_device_bytes",
                "device_bytes",
            ),
        )

    # rich and notebooks look these up on the object; its renderer is found when shown.
    def __rich__(self) -> Any:
        return show(self, View.RICH)

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        bundle: dict[str, str] = show(self, View.NOTEBOOK)
        return bundle


def _holds_arrays(tree: Any) -> bool:

    return any(_is_array_like(x) for x in jax.tree.leaves(tree, is_leaf=_is_array_like))


def _is_array_like(x: Any) -> bool:
    """An array, a ``ShapeDtypeStruct`` or a NumPy array: anything with a shape and a dtype."""

    if isinstance(x, jax.Array | jax.ShapeDtypeStruct | np.ndarray | np.generic):
        return True
    # Something else with a shape and a dtype counts when it is a pytree leaf: a Flax variable
    # has both but is a node holding its value, and must stay one.
    return (
        hasattr(x, "shape")
        and hasattr(x, "dtype")
        and not isinstance(x, type)
        and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))
    )


def _path_str(path: Sequence[Any]) -> str:

    keys = list(path)
    # A Flax variable flattens to its value under the attribute "value": name the variable.
    if len(keys) > 1 and isinstance(keys[-1], tu.GetAttrKey) and keys[-1].name == "value":
        keys = keys[:-1]
    return tu.keystr(tuple(keys), simple=True, separator=".") if keys else "<root>"


def _leaf_layout(path: str, leaf: Any) -> LeafLayout:

    shape = tuple(int(d) for d in leaf.shape)
    dt = _dtype(leaf.dtype)
    nbytes = math.prod(shape) * dt.itemsize
    host = isinstance(leaf, np.ndarray | np.generic)
    sharding = None if host else getattr(leaf, "sharding", None)
    if sharding is None:
        return LeafLayout(path, shape, dt.name, nbytes, None)
    try:
        lay = layout(jax.ShapeDtypeStruct(shape, dt, sharding=sharding))
    except LayoutError as e:
        raise LayoutError(f"{path}: {e}") from None
    return LeafLayout(path, shape, dt.name, nbytes, lay)


def tree_layout(tree: Any) -> TreeLayout:
    """The layout of every array in a pytree (model, optimizer state, abstract arguments).

    Leaves are JAX arrays, ``jax.ShapeDtypeStruct`` (with or without a sharding; its mesh may
    be abstract) or NumPy arrays; other leaves (an Equinox module's functions) are counted in
    ``other_leaves`` and skipped. Flax NNX modules and states, Equinox modules and optax states
    are pytrees and work as they are.

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> tree = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32,
    ...                                   sharding=NamedSharding(mesh, P()))}
    >>> lay = tree_layout(tree)
    >>> lay["w"].max_device_bytes, lay.max_device_bytes
    (128, 128)
    """

    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_array_like)
    leaves = []
    other = 0
    for path, leaf in flat:
        if _is_array_like(leaf):
            leaves.append(_leaf_layout(_path_str(path), leaf))
        else:
            other += 1
    if not leaves:
        raise ShardscopeError(
            f"layout(): the {type(tree).__name__} holds no arrays ({other} other leaves); pass "
            f"a model, an optimizer state or a tree of arrays or jax.ShapeDtypeStruct"
        )
    return TreeLayout(tuple(leaves), other)


def _resolve_sharding(spec: Any, mesh: Any, path: str, shape: tuple[int, ...]) -> Any:

    if spec is None or hasattr(spec, "devices_indices_map") or hasattr(spec, "spec"):
        return spec
    if isinstance(spec, PartitionSpec):
        if mesh is None:
            # The mesh of `with jax.set_mesh(mesh)`, else an abstract one in force.
            for current in (jax.sharding.get_mesh(), jax.sharding.get_abstract_mesh()):
                if not current.empty:
                    mesh = current
                    break
        if mesh is None:
            raise LayoutError(
                f"abstract(): {path} has {format_spec(tuple(spec))} but no mesh is known; pass "
                f"mesh= or call it inside `with jax.set_mesh(mesh):`"
            )
        axes = {str(k): int(v) for k, v in mesh.shape.items()}
        try:
            normalize_spec(spec, len(shape), axes)  # before JAX's own, terser, refusal
        except LayoutError as e:
            raise LayoutError(f"abstract(): {path}: {e}") from None
        return NamedSharding(mesh, spec)
    raise LayoutError(
        f"abstract(): {path} got {spec!r}; give a jax.sharding.Sharding, a PartitionSpec or None"
    )


def abstract(tree: Any, shardings: Any = None, *, mesh: Any = None) -> Any:
    """The same pytree with every array replaced by a sharded ``jax.ShapeDtypeStruct``.

    For compile-only work: ``jax.jit(step).lower(*abstract(args, shardings))`` allocates
    nothing. Non-array leaves (an Equinox module's functions) are kept as they are.

    Args:
        tree: a pytree of arrays, ``ShapeDtypeStruct`` or anything with a shape and a dtype
            (Flax NNX states, Equinox modules, optax states).
        shardings: None keeps each leaf's own sharding; a ``Sharding`` or ``PartitionSpec``
            applies to every array; a pytree prefix of ``tree`` whose leaves are those (or None
            for no sharding), e.g. ``nnx.get_partition_spec(state)``; or a function
            ``(path, leaf) -> Sharding | PartitionSpec | None`` with the dotted path of
            :func:`tree_layout`.
        mesh: the mesh for ``PartitionSpec`` s (default: the one set by ``jax.set_mesh``).

    Raises:
        LayoutError: a spec that does not fit its array (rank, unknown axis, divisibility),
            a ``PartitionSpec`` with no mesh, or ``shardings`` not shaped like the tree.

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros((4,))}
    >>> a = abstract(params, P(), mesh=mesh)
    >>> a["w"].shape, a["w"].sharding.spec
    ((8, 4), P())
    """

    def is_spec(x: Any) -> bool:
        return x is None or isinstance(x, PartitionSpec) or hasattr(x, "devices_indices_map")

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_array_like)
    if shardings is None:
        specs: list[Any] = [getattr(leaf, "sharding", None) for _, leaf in flat]
    elif is_spec(shardings) and shardings is not None:
        specs = [shardings] * len(flat)
    elif callable(shardings) and not hasattr(shardings, "tree_flatten"):
        specs = [
            shardings(_path_str(p), leaf) if _is_array_like(leaf) else None for p, leaf in flat
        ]
    else:
        spec_def = jax.tree_util.tree_structure(shardings, is_leaf=is_spec)
        try:
            # PyTreeDef.flatten_up_to exists in jaxlib; its type stub does not list it.
            subtrees = spec_def.flatten_up_to(tree)  # type: ignore[attr-defined]
        except (ValueError, TypeError) as e:
            raise LayoutError(
                f"abstract(): the shardings are not shaped like the tree (a pytree prefix of "
                f"it is needed): {str(e).splitlines()[0]}"
            ) from None
        spec_leaves = jax.tree_util.tree_leaves(shardings, is_leaf=is_spec)
        specs = []
        for spec, sub in zip(spec_leaves, subtrees, strict=True):
            n = len(jax.tree_util.tree_leaves(sub, is_leaf=_is_array_like))
            specs.extend([spec] * n)
    out = []
    for (path, leaf), spec in zip(flat, specs, strict=True):
        if not _is_array_like(leaf):
            out.append(leaf)
            continue
        where = _path_str(path)
        shape = tuple(int(d) for d in leaf.shape)
        sharding = _resolve_sharding(spec, mesh, where, shape)
        if sharding is not None and hasattr(sharding, "spec") and hasattr(sharding, "mesh"):
            axes = {str(k): int(v) for k, v in sharding.mesh.shape.items()}
            try:
                full = normalize_spec(sharding.spec, len(shape), axes)
                check_divisible(shape, full, axes)
            except LayoutError as e:
                raise LayoutError(f"abstract(): {where}: {e}") from None
        out.append(jax.ShapeDtypeStruct(shape, leaf.dtype, sharding=sharding))
    return jax.tree_util.tree_unflatten(treedef, out)
