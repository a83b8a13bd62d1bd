"""Layout invariants on random meshes, specs and shapes, zero-size arrays included: the shards
tile the array, every element is held ``replication`` times, replication is what the spec
implies, and the device-free layout agrees with JAX's."""

import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardscope import layout
from shardscope._src.layout import spec_layout

MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2), (1, 8), (2,), (4,), (1,)]


@st.composite
def cases(draw):
    sizes = draw(st.sampled_from(MESHES))
    names = [f"a{i}" for i in range(len(sizes))]
    axes = dict(zip(names, sizes, strict=True))
    rank = draw(st.integers(0, 3))
    free = list(names)
    spec = []
    shape = []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(free))))
        chosen = draw(st.permutations(free))[:k] if k else []
        for a in chosen:
            free.remove(a)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
        parts = math.prod(axes[a] for a in chosen)
        shape.append(parts * draw(st.sampled_from([0, 0, 1, 2, 3])))
    dtype = draw(st.sampled_from(["int8", "float32", "bfloat16"]))
    return axes, tuple(shape), tuple(spec), dtype


def implied_replication(axes, spec):
    used = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
    return math.prod(v for k, v in axes.items() if k not in used)


@settings(max_examples=150)
@given(cases())
def test_layout_invariants(case):
    axes, shape, spec, dtype = case
    lay = spec_layout(shape, axes, spec, dtype=dtype)
    n = math.prod(axes.values())
    r = implied_replication(axes, spec)
    assert len(lay.shards) == n
    assert lay.replication == r
    assert lay.total_bytes == r * lay.nbytes
    # Each piece is held by exactly r devices, numbered 0..r-1.
    by_piece = {}
    for s in lay.shards:
        by_piece.setdefault(tuple((i.start, i.stop) for i in s.index), []).append(s.replica_id)
    if math.prod(shape) > 0:
        assert all(sorted(ids) == list(range(r)) for ids in by_piece.values())
        # The pieces tile the array: every element is covered exactly r times.
        cover = np.zeros(shape, dtype=np.int64)
        for s in lay.shards:
            cover[tuple(s.index)] += 1
        assert (cover == r).all()
    else:
        assert lay.nbytes == 0 and lay.max_device_bytes == 0
        assert sorted(s.replica_id for s in lay.shards) == sorted(list(range(r)) * (n // r))
    # Shard shapes are the shape divided by the parts of each dimension.
    for s in lay.shards:
        for d, (size, entry) in enumerate(zip(shape, spec, strict=True)):
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            assert s.shape[d] == size // math.prod(axes[a] for a in names)


@settings(max_examples=60)
@given(cases())
def test_jax_and_device_free_layouts_agree(case):
    axes, shape, spec, dtype = case
    devices = jax.devices()[: math.prod(axes.values())]
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices)
    lay = layout(shape, NamedSharding(mesh, P(*spec)), dtype=dtype)
    free = spec_layout(shape, axes, spec, dtype=dtype)
    assert lay.replication == free.replication == implied_replication(axes, spec)
    key = lambda s: s.position  # noqa: E731
    for a, b in zip(sorted(lay.shards, key=key), sorted(free.shards, key=key), strict=True):
        assert (a.index, a.shape, a.nbytes) == (b.index, b.shape, b.nbytes)
        assert a.replica_id == b.replica_id


def test_a_zero_size_array_reports_the_replication_its_spec_implies():
    mesh = jax.make_mesh((2,), ("c",), devices=jax.devices()[:2])
    lay = layout((0,), NamedSharding(mesh, P("c")), dtype="int8")
    assert lay.replication == 1
    assert [s.replica_id for s in lay.shards] == [0, 0]
    assert layout((0,), NamedSharding(mesh, P()), dtype="int8").replication == 2


def test_dimensions_past_what_xla_holds_are_refused_without_printing_them():
    import pytest

    from shardscope._src.base.errors import LayoutError, ShardscopeError

    for shape in [(10**5000,), (2**63, 2)]:
        with pytest.raises(LayoutError, match="past 2\\*\\*63-1"):
            spec_layout(shape, {"a": 2}, ("a",))
    with pytest.raises(ShardscopeError, match="dimension 1 of the shape is negative"):
        spec_layout((2, -(10**5000)), {"a": 2}, ())
