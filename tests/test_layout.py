import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardscope import Layout, LayoutError, layout, make_mesh, spec_layout
from shardscope._src.base.comm import format_bytes
from shardscope._src.render.layout import layout_table

MESHES = {
    "8": {"x": 8},
    "2x4": {"dp": 2, "mp": 4},
    "4x2": {"a": 4, "b": 2},
    "2x2x2": {"a": 2, "b": 2, "c": 2},
}


@st.composite
def sharded_shapes(draw):
    """A mesh of 8, a rank 0-4 shape and a PartitionSpec whose axes divide it."""
    axes = draw(st.sampled_from(list(MESHES.values())))
    rank = draw(st.integers(0, 4))
    names = list(axes)
    order = draw(st.permutations(names))
    # Deal each axis to a dimension or to nobody (replicated over it).
    owner = {a: draw(st.integers(-1, rank - 1)) for a in order} if rank else {a: -1 for a in names}
    spec = []
    for d in range(rank):
        mine = tuple(a for a in order if owner[a] == d)
        spec.append(
            None if not mine else mine[0] if len(mine) == 1 and draw(st.booleans()) else mine
        )
    shape = []
    for d in range(rank):
        parts = math.prod(axes[a] for a in _names(spec[d]))
        shape.append(parts * draw(st.integers(1, 3)))
    dtype = draw(st.sampled_from(["float32", "bfloat16", "int8", "float64"]))
    return axes, tuple(shape), tuple(spec), dtype


def _names(entry):
    return () if entry is None else (entry,) if isinstance(entry, str) else entry


def _coverage(lay: Layout) -> np.ndarray:
    held = np.zeros(lay.shape, dtype=np.int64)
    for s in lay.shards:
        held[s.index] += 1
    return held


@given(sharded_shapes())
def test_layout_matches_jax_and_tiles_the_array(case):
    axes, shape, spec, dtype = case
    mesh = make_mesh(axes)
    lay = layout(shape, NamedSharding(mesh, P(*spec)), dtype=dtype)
    itemsize = np.dtype(jnp.dtype(dtype)).itemsize
    used = {a for e in spec for a in _names(e)}
    unused = math.prod(v for k, v in axes.items() if k not in used)
    # every element is held `replication` times: shards tile the array exactly
    assert lay.replication == unused
    assert (_coverage(lay) == lay.replication).all()
    assert lay.total_bytes == lay.replication * math.prod(shape) * itemsize
    assert lay.nbytes == math.prod(shape) * itemsize
    assert len(lay.shards) == 8
    for s in lay.shards:
        assert s.shape == tuple(sl.stop - sl.start for sl in s.index)
        assert s.nbytes == math.prod(s.shape) * itemsize
    # the device-free computation agrees with JAX's devices_indices_map
    pure = spec_layout(shape, axes, spec, dtype=dtype)
    assert [(s.position, s.index, s.replica_id) for s in pure.shards] == [
        (s.position, s.index, s.replica_id) for s in lay.shards
    ]
    assert [s.device_id for s in lay.shards] == [d.id for d in mesh.devices.flat]


@pytest.mark.parametrize("mesh_id", ["8", "2x4", "2x2x2"])
def test_layout_of_array_equals_layout_of_shape(mesh_id):
    axes = MESHES[mesh_id]
    mesh = make_mesh(axes)
    first = next(iter(axes))
    x = jax.device_put(
        jnp.arange(16 * 8 * 3, dtype=jnp.float32).reshape(16, 8, 3), NamedSharding(mesh, P(first))
    )
    from_array = layout(x)
    from_shape = layout((16, 8, 3), NamedSharding(mesh, P(first)), dtype="float32")
    assert from_array == from_shape
    by_device = {s.device.id: s for s in x.addressable_shards}
    for s in from_array.shards:
        jax_index = by_device[s.device_id].index
        assert (
            tuple(slice(*j.indices(n)[:2]) for j, n in zip(jax_index, (16, 8, 3), strict=True))
            == s.index
        )
        assert by_device[s.device_id].replica_id == s.replica_id
        assert by_device[s.device_id].data.shape == s.shape


def test_taster_layouts_exact():
    mesh = make_mesh({"model": 8})
    lay = layout((1024, 1024), NamedSharding(mesh, P("model", None)), dtype="float32")
    assert lay.shard_shapes == ((128, 1024),) * 8
    assert [s.index[0] for s in lay.shards] == [slice(128 * i, 128 * (i + 1)) for i in range(8)]
    assert lay.device_bytes == {i: 128 * 1024 * 4 for i in range(8)}
    assert lay.replication == 1
    rep = layout((1024, 1024), NamedSharding(mesh, P()), dtype="float32")
    assert rep.replication == 8
    assert [s.replica_id for s in rep.shards] == list(range(8))
    assert rep.max_device_bytes == 4 * 2**20


def test_indivisible_names_dimension_size_and_axis():
    mesh = make_mesh("dp=2,mp=4")
    with pytest.raises(
        LayoutError, match=r"dimension 1 of shape \(8, 6\) has size 6.*mp=4 \(size 4\)"
    ):
        layout((8, 6), NamedSharding(mesh, P("dp", "mp")))
    with pytest.raises(LayoutError, match=r"size 6.*dp=2 x mp=4 \(size 8\)"):
        spec_layout((6,), {"dp": 2, "mp": 4}, (("dp", "mp"),))
    with pytest.raises(ValueError, match="not in the mesh"):
        spec_layout((8,), {"dp": 2, "mp": 4}, ("tp",))
    with pytest.raises(ValueError, match="rank 1"):
        spec_layout((8,), {"dp": 2, "mp": 4}, ("dp", "mp"))
    with pytest.raises(ValueError, match="needs a sharding"):
        layout((8, 8))


def test_non_named_sharding():
    dev = jax.devices()[3]
    lay = layout((4, 4), jax.sharding.SingleDeviceSharding(dev), dtype="int32")
    assert lay.spec is None
    assert [(s.device_id, s.shape, s.nbytes) for s in lay.shards] == [(3, (4, 4), 64)]


def test_table_renders_any_rank():
    from rich.console import Console

    mesh = make_mesh("a=2,b=2,c=2")
    lay = layout((4, 6, 2, 8), NamedSharding(mesh, P("a", None, "b", "c")), dtype="bfloat16")
    console = Console(width=120, record=True)
    console.print(layout_table(lay))
    text = console.export_text()
    assert "bfloat16[4x6x2x8] P('a', None, 'b', 'c')" in text
    assert "[2:4, :, 1:2, 4:8]" in text  # device 7 at (1, 1, 1)
    assert "replication 1" in text
    assert len([line for line in text.splitlines() if line.startswith("│")]) == 8


def test_to_dict_is_json_ready():
    import json

    mesh = make_mesh("dp=2,mp=4")
    d = layout((8, 4), NamedSharding(mesh, P(("dp", "mp")))).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["spec"] == [["dp", "mp"], None]
    assert d["shards"][5]["index"] == [[5, 6], [0, 4]]


@pytest.mark.parametrize(
    "n, text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (4 * 2**20, "4 MiB")]
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
