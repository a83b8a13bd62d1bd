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
