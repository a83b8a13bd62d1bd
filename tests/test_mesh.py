import jax
import pytest

import shardscope
from shardscope import MeshSpecError, make_mesh, parse_mesh_spec
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
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_explicit_axes():
    mesh = make_mesh("dp=2,mp=4", explicit=True)
    assert all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


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
