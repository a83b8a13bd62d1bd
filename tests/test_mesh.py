import jax
import pytest

import shardscope
from shardscope import AxisTypeError, MeshSpecError, make_mesh, parse_mesh_spec
from shardscope._src.mesh import format_mesh_spec


@pytest.mark.parametrize(
    "spec, axes",
    [
        ("dp=2,mp=4", {"dp": 2, "mp": 4}),
        (" dp = 2 , mp=4 ", {"dp": 2, "mp": 4}),
        ("model=8", {"model": 8}),
        ("a=2,b=2,c=2", {"a": 2, "b": 2, "c": 2}),
        ({"x": 4, "y": 2}, {"x": 4, "y": 2}),
    ],
)
def test_parse(spec, axes):
    parsed = parse_mesh_spec(spec)
    assert parsed == axes
    assert list(parsed) == list(axes)  # order is mesh order
    assert parse_mesh_spec(format_mesh_spec(parsed)) == parsed


@pytest.mark.parametrize(
    "spec, words",
    [
        ("", "empty"),
        ("dp=2,dp=4", "repeated"),
        ("=2,mp=4", "empty name"),
        ("dp=0,mp=8", "positive"),
        ("dp=-2", "positive"),
        ("dp=two", "not an integer"),
        ("dp", "no size"),
        ("2x4", "no size"),
        ("d-p=2", "identifier"),
        ({"dp": 2.0}, "positive integers"),
        ({}, "names no axes"),
        (8, "string"),
    ],
)
def test_parse_errors_name_the_value(spec, words):
    with pytest.raises(MeshSpecError, match=words) as info:
        parse_mesh_spec(spec)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("spec", ["dp=2,mp=4", "model=8", "a=2,b=2,c=2", {"x": 4, "y": 2}])
def test_make_mesh(spec):
    mesh = make_mesh(spec)
    axes = parse_mesh_spec(spec)
    assert dict(mesh.shape) == axes
    assert tuple(mesh.axis_names) == tuple(axes)
    assert list(mesh.devices.flat) == jax.devices()
    # What jax.make_mesh gives when not told, asked of JAX itself.
    default = jax.make_mesh((8,), ("x",)).axis_types[0]
    assert mesh.axis_types == (default,) * len(axes)


@pytest.mark.parametrize(
    "given, want",
    [
        ("explicit", ("Explicit", "Explicit")),
        ("auto", ("Auto", "Auto")),
        (" AUTO ", ("Auto", "Auto")),
        (jax.sharding.AxisType.Auto, ("Auto", "Auto")),
        (("auto", "explicit"), ("Auto", "Explicit")),
    ],
)
def test_make_mesh_axis_types(given, want):
    mesh = make_mesh("dp=2,mp=4", axis_types=given)
    assert tuple(t.name for t in mesh.axis_types) == want


def test_make_mesh_explicit_is_the_older_spelling():
    assert make_mesh("dp=2,mp=4", explicit=False).axis_types == (jax.sharding.AxisType.Auto,) * 2
    assert make_mesh("dp=2,mp=4", explicit=True).axis_types == (jax.sharding.AxisType.Explicit,) * 2


@pytest.mark.parametrize(
    "given, words",
    [
        ("manual", r"axis_types='manual' is not an axis type.*'explicit'.*'auto'"),
        ("sharded", r"axis_types='sharded' is not an axis type"),
        (jax.sharding.AxisType.Manual, r"is not an axis type"),
        (("auto",), r"one per axis \(2: dp, mp\)"),
        (3, r"axis_types=3: give one axis type"),
    ],
)
def test_make_mesh_bad_axis_types(given, words):
    with pytest.raises(AxisTypeError, match=words) as info:
        make_mesh("dp=2,mp=4", axis_types=given)
    assert info.value.params == ("axis_types",)
    assert isinstance(info.value, MeshSpecError)


def test_make_mesh_refuses_two_spellings():
    with pytest.raises(AxisTypeError, match="keep axis_types= alone"):
        make_mesh("dp=2,mp=4", axis_types="auto", explicit=True)


def test_make_mesh_device_count_mismatch():
    with pytest.raises(
        MeshSpecError,
        match=r"needs 2 x 2 = 4 devices but 8 are available.*devices=jax.devices\(\)\[:4\]",
    ):
        make_mesh("dp=2,mp=2")


def test_make_mesh_subset_of_devices():
    mesh = make_mesh("dp=2,mp=2", devices=jax.devices()[:4])
    assert mesh.devices.size == 4


def test_public_names():
    for name in ["make_mesh", "layout", "bootstrap", "use_cpu_devices", "DeviceSetupError"]:
        assert hasattr(shardscope, name)


# -- MeshShape: the one canonical mesh shape ------------------------------------------------------

_SHAPE_AXES = (("data", 4), ("model", 2))


def _shape_forms():
    from types import MappingProxyType

    from shardscope._src.mesh import MeshShape

    return {
        "spec": "data=4,model=2",
        "spaced-spec": " data = 4 , model=2 ",
        "dict": {"data": 4, "model": 2},
        "mapping": MappingProxyType({"data": 4, "model": 2}),
        "pairs": (("data", 4), ("model", 2)),
        "pair-list": [["data", 4], ["model", 2]],
        "shape": MeshShape("data=4,model=2"),
        "mesh": make_mesh("data=4,model=2"),
        "abstract-mesh": jax.sharding.AbstractMesh((4, 2), ("data", "model")),
    }


@pytest.mark.parametrize("form", list(_shape_forms()))
def test_every_form_of_a_mesh_gives_one_canonical_shape(form):
    from shardscope._src.mesh import MeshShape

    given = _shape_forms()[form]
    shape = MeshShape.of(given)
    assert shape.axes == _SHAPE_AXES  # names and sizes, in order, as plain ints
    assert all(type(size) is int for _, size in shape.axes)
    assert shape == MeshShape(given) == MeshShape("data=4,model=2")
    assert hash(shape) == hash(MeshShape("data=4,model=2"))
    assert shape.spec == str(shape) == "data=4,model=2"
    assert repr(shape) == "MeshShape('data=4,model=2')"
    assert shape.names == ("data", "model") and shape.devices == 8


def test_a_mesh_shape_reads_as_its_sizes_in_order():
    import pickle

    from shardscope._src.base.records import json_value
    from shardscope._src.mesh import MeshShape

    shape = MeshShape("stage=2,data=4,model=1")
    assert shape.sizes == {"stage": 2, "data": 4, "model": 1} == dict(shape)
    assert list(shape) == ["stage", "data", "model"] and len(shape) == 3
    assert shape["data"] == 4 and shape.get("context", 1) == 1 and "stage" in shape
    with pytest.raises(KeyError):
        shape["context"]
    assert shape.without("stage") == MeshShape("data=4,model=1")
    assert shape.without("pod") == shape
    assert json_value({"mesh": shape}) == {"mesh": {"stage": 2, "data": 4, "model": 1}}
    assert parse_mesh_spec(shape) == shape.sizes
    assert pickle.loads(pickle.dumps(shape)) == shape  # a worker's task carries one
    # Order is part of the shape; against a plain mapping it compares as an OrderedDict does.
    assert MeshShape("data=4,model=2") != MeshShape("model=2,data=4")
    assert MeshShape("data=4,model=2") == {"model": 2, "data": 4}
    assert MeshShape("data=4,model=2") != {"data": 4}


def test_a_mesh_shape_builds_the_meshes_of_its_shape():
    from shardscope._src.mesh import MeshShape
    from shardscope._src.sharding.strategies import abstract_mesh

    shape = MeshShape("data=4,model=2")
    abstract = shape.abstract()
    assert dict(abstract.shape) == shape.sizes and abstract.axis_names == shape.names
    assert abstract.axis_types == (jax.sharding.AxisType.Auto,) * 2
    assert abstract == abstract_mesh("data=4,model=2") == abstract_mesh(shape)
    mesh = shape.on(jax.devices()[:8], axis_types="auto")
    assert mesh == make_mesh("data=4,model=2", devices=jax.devices()[:8], axis_types="auto")
    assert MeshShape.of(mesh) == shape
    on_four = MeshShape("data=2,model=2").on(jax.devices()[:4])
    assert list(on_four.devices.flat) == jax.devices()[:4]
    assert shardscope.target_mesh("cpu", shape) == make_mesh(shape)


@pytest.mark.parametrize(
    "given, words",
    [
        ("", r"mesh description is empty; write axes as name=size"),
        ("data=4,data=2", r"'data=4,data=2': axis name 'data' is repeated"),
        ({"data": 0}, r"\{'data': 0\}: axis 'data' has size 0; sizes must be positive"),
        ((("data", True),), r"\(\('data', True\),\): axis 'data' has size True"),
        ((("d-p", 2),), r"axis name 'd-p' is not an identifier; use letters"),
        ((("data",),), r"\('data',\) is not an \(axis name, size\) pair; give pairs such as"),
        ((4, 2), r"mesh \(4, 2\): 4 is not an \(axis name, size\) pair"),
        ((), r"mesh description \(\) names no axes; e.g. 'dp=2,mp=4'"),
        (None, r"a description such as 'data=4,model=2'.*; got NoneType"),
    ],
    ids=["empty", "repeated", "zero", "bool", "name", "pair", "sizes", "no-axes", "None"],
)
def test_a_bad_mesh_shape_is_refused_naming_the_value_and_the_fix(given, words):
    from shardscope._src.mesh import MeshShape

    with pytest.raises(MeshSpecError, match=words) as info:
        MeshShape.of(given)
    assert isinstance(info.value, ValueError)
