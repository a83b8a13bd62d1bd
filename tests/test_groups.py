"""Replica groups in every printed form, and the mesh axes they name. No devices needed."""

import numpy as np
import pytest

from shardscope._src.base.errors import HloParseError
from shardscope._src.hlo.groups import (
    AxisRef,
    axes_of_groups,
    axes_of_pairs,
    groups_of_axes,
    parse_replica_groups,
    parse_source_target_pairs,
)

DP_MP = {"dp": 2, "mp": 4}


def test_explicit_and_empty():
    rg = parse_replica_groups("{{0,1,2,3},{4,5,6,7}}")
    assert rg.form == "explicit"
    assert rg.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    rg = parse_replica_groups("{}")
    assert rg.form == "all"
    assert rg.groups is None
    assert rg.resolve(4) == ((0, 1, 2, 3),)


IOTA_GROUPS = [
    ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("[1,8]<=[8]", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    # arange(8).reshape(2,4).T.reshape(4,2)
    ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    # arange(8).reshape(2,2,2).transpose(1,0,2).reshape(2,4)
    ("[2,4]<=[2,2,2]T(1,0,2)", ((0, 1, 4, 5), (2, 3, 6, 7))),
]

MESH_GROUPS = [
    # Printed by JAX 0.10.2 (tests/fixtures/hlo/matmul_1d.hlo).
    ("mesh['axis_0'=1,'axis_1'=8] {'axis_1'}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    # Printed by JAX 0.10.2 (mm_2d.hlo): device order [2,4]T(1,0) = 0,4,1,5,2,6,3,7.
    (
        "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}",
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    # Printed by JAX 0.10.2 (sub_axes_2d.hlo).
    (
        "mesh['axis_0'=2,'axis_1'=4,'axis_2'=1], device_ids=([2,4]T(1,0)) {'axis_1'}",
        ((0, 4, 1, 5), (2, 6, 3, 7)),
    ),
    (
        "mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([2,2,2]T(1,0,2)) {'axis_0'}",
        ((0, 2), (1, 3), (4, 6), (5, 7)),
    ),
    # Grouped axes move last in the order listed.
    ("mesh['a'=2,'b'=4] {'b','a'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
    ("mesh['a'=2,'b'=4] {}", tuple((i,) for i in range(8))),
    # Sub-axes, as in XLA's replica_group.cc comments for mesh<"a"=8>.
    ("mesh['a'=8] {'a':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("mesh['a'=8] {'a':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['a'=8] {'a':(4)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['a'=8] {'a':(1)2,'a':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("mesh['a'=2,'b'=4] {'a','b':(2)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    # An explicit device order, and unquoted names.
    ("mesh[x=2,y=2], device_ids=(3,1,2,0) {y}", ((3, 1), (2, 0))),
    ("maximal_mesh[device_id=3] {}", ((3,),)),
]


@pytest.mark.parametrize(
    "form, text, groups",
    [("iota", *case) for case in IOTA_GROUPS] + [("mesh", *case) for case in MESH_GROUPS],
)
def test_iota_and_mesh_forms(form, text, groups):
    rg = parse_replica_groups(text)
    assert rg.form == form
    assert rg.groups == groups


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{{0,1},{2,x}}",
        "{{0,1}",
        "[2,4]<=[6]",
        "[2,4]<=[2,4]T(0,0)",
        "mesh['a'=2,'b'=4] {'c'}",
        "mesh['a'=2,'a'=4] {'a'}",
        "mesh['a'=8] {'a':(3)2}",
        "mesh['a'=8] {'a':(1)4,'a':(2)2}",
        "mesh['a'=2,'b'=2], device_ids=(0,1,2) {'a'}",
        "mesh['a'=2,'b'=2], device_ids=(0,1,1,2) {'a'}",
        "mesh['a'=2 {'a'}",
        "devices=[2,4]<=[8]",
    ],
)
def test_malformed_groups_raise_parse_error(text):
    with pytest.raises(HloParseError):
        parse_replica_groups(text)


def test_pairs():
    assert parse_source_target_pairs("{{0,1},{1,0},{2,2}}") == ((0, 1), (1, 0), (2, 2))
    with pytest.raises(HloParseError):
        parse_source_target_pairs("{{0,1,2}}")


@pytest.mark.parametrize(
    "groups, axes",
    [
        (((0, 4), (1, 5), (2, 6), (3, 7)), ("dp",)),
        (((0, 1, 2, 3), (4, 5, 6, 7)), ("mp",)),
        (((0, 4, 1, 5, 2, 6, 3, 7),), ("dp", "mp")),  # order inside a group is irrelevant
        (((0, 1), (2, 3), (4, 5), (6, 7)), ("mp:(2)2",)),  # minor half of mp
        (((0, 2), (1, 3), (4, 6), (5, 7)), ("mp:(1)2",)),  # major half of mp
        (((0, 4, 1, 5), (2, 6, 3, 7)), ("dp", "mp:(2)2")),
        (tuple((i,) for i in range(8)), ()),
    ],
)
def test_axes_of_groups(groups, axes):
    match = axes_of_groups(groups, DP_MP)
    assert not match.irregular, match.reason
    assert match.axes == axes
    assert match.group_size == len(groups[0])


def test_axes_of_groups_3d_and_multiple_sub_axes():
    mesh = {"a": 2, "b": 2, "c": 2}
    assert axes_of_groups(((0, 1, 4, 5), (2, 3, 6, 7)), mesh).axes == ("a", "c")
    # Two strided parts of one axis of 8: 'i:(1)2' and 'i:(4)2'.
    assert axes_of_groups(((0, 1, 4, 5), (2, 3, 6, 7)), {"i": 8}).axes == ("i:(1)2", "i:(4)2")
    # A sub-axis of an axis of 12 that is not a power of two: (3)4 = index % 4.
    groups = tuple(tuple(range(4 * k, 4 * k + 4)) for k in range(3))
    assert axes_of_groups(groups, {"i": 12}).axes == ("i:(3)4",)


@pytest.mark.parametrize(
    "groups, why",
    [
        (((0, 1, 2), (3, 4, 5, 6, 7)), "differ in size"),
        (((0, 1), (2, 3)), "hold 4 of 8"),
        (((0, 1), (1, 2), (4, 5), (6, 7)), "two groups"),
        (((0, 9), (1, 2), (3, 4), (5, 6)), "outside"),
        (((0, 3), (1, 2), (4, 7), (5, 6)), "irregular part"),
        (((0, 1), (2, 6), (3, 7), (4, 5)), "different axes"),
        (((0, 5), (1, 4), (2, 7), (3, 6)), "every combination"),
    ],
)
def test_irregular_groups_are_reported_with_reason(groups, why):
    match = axes_of_groups(groups, DP_MP)
    assert match.irregular
    assert match.axes == ()
    assert why in match.reason


def test_axes_of_pairs():
    ring = tuple((i, (i + 1) % 4) for i in range(4)) + tuple(
        (4 + i, 4 + (i + 1) % 4) for i in range(4)
    )
    m = axes_of_pairs(ring, DP_MP)
    assert (m.axes, m.group_size) == (("mp",), 4)
    m = axes_of_pairs(((0, 4), (4, 0), (1, 5), (5, 1), (2, 6), (6, 2), (3, 7), (7, 3)), DP_MP)
    assert (m.axes, m.group_size) == (("dp",), 2)
    m = axes_of_pairs(((0, 0), (1, 1)), DP_MP)
    assert (m.axes, m.group_size) == ((), 1)
    assert axes_of_pairs(((0, 8),), DP_MP).irregular


def test_ids_are_partition_coordinates_in_mesh_order():
    # Partition p has coordinate unravel_index(p, mesh shape); a group of all partitions with
    # equal 'b' coordinate varies only 'a' and 'c'.
    mesh = {"a": 2, "b": 3, "c": 2}
    coords = np.stack(np.unravel_index(np.arange(12), (2, 3, 2)), axis=-1)
    groups = tuple(tuple(int(p) for p in np.flatnonzero(coords[:, 1] == b)) for b in range(3))
    assert axes_of_groups(groups, mesh).axes == ("a", "c")


# Each sub-axis label a match writes reads back as the reference it names, and the groups
# of that reference are the ones matched: 'mp:(pre)size' is size devices along mp, after
# factors of pre (so 4 // (pre * size) apart).
@pytest.mark.parametrize(
    "groups, labels, refs",
    [
        (((0, 1), (2, 3), (4, 5), (6, 7)), ("mp:(2)2",), (AxisRef("mp", 2, 2),)),
        (((0, 2), (1, 3), (4, 6), (5, 7)), ("mp:(1)2",), (AxisRef("mp", 1, 2),)),
        (((0, 2, 4, 6), (1, 3, 5, 7)), ("dp", "mp:(1)2"), (AxisRef("dp"), AxisRef("mp", 1, 2))),
        (((0, 1, 2, 3), (4, 5, 6, 7)), ("mp",), (AxisRef("mp"),)),
    ],
    ids=["mp:(2)2", "mp:(1)2", "dp,mp:(1)2", "mp"],
)
def test_sub_axis_labels_read_back_as_references(groups, labels, refs):
    # A mesh of dp=2 (major) and mp=4: device d sits at (d // 4, d % 4).
    match = axes_of_groups(groups, {"dp": 2, "mp": 4})
    assert match.axes == labels
    assert tuple(AxisRef.parse(a) for a in match.axes) == refs
    assert tuple(r.label for r in refs) == labels
    for ref in refs:
        if ref.size is not None:
            stride = 4 // (ref.pre * ref.size)
            assert {d % 4 for d in groups[0]} == {c * stride for c in range(ref.size)}


def test_an_axis_name_like_a_sub_axis_but_not_one_stays_whole():
    assert AxisRef.parse("odd:(name") == AxisRef("odd:(name")
    assert AxisRef.parse("a:(2)") == AxisRef("a:(2)")
    assert AxisRef.parse("a:(2)4") == AxisRef("a", 2, 4)
    assert str(AxisRef("a", 2, 4)) == "a:(2)4"


MESH_3D = {"a": 2, "b": 3, "c": 2}
SUBSETS_3D = [(), ("a",), ("b",), ("c",), ("a", "b"), ("a", "c"), ("b", "c"), ("a", "b", "c")]


@pytest.mark.parametrize("axes", SUBSETS_3D, ids=lambda a: ",".join(a) or "none")
def test_groups_of_axes_hold_the_partitions_that_agree_off_those_axes(axes):
    # Derived from the coordinates: a group is every partition with the same coordinates on
    # the other axes, in increasing id (row-major over the spanned axes); the groups in
    # increasing id of their first member (row-major over the other axes).
    coords = np.stack(np.unravel_index(np.arange(12), (2, 3, 2)), axis=-1)
    other = [d for d, name in enumerate(MESH_3D) if name not in axes]
    keys = sorted({tuple(int(x) for x in row[other]) for row in coords})
    want = tuple(
        tuple(int(p) for p in range(12) if tuple(coords[p, other]) == key) for key in keys
    )
    assert groups_of_axes(axes, MESH_3D) == want
    match = axes_of_groups(want, MESH_3D)
    assert not match.irregular and match.axes == axes


@pytest.mark.parametrize(
    "axes, mesh, groups",
    [
        (("dp", "mp:(2)2"), DP_MP, ((0, 1, 4, 5), (2, 3, 6, 7))),
        (("mp:(1)2",), DP_MP, ((0, 2), (1, 3), (4, 6), (5, 7))),
        (("i:(1)2", "i:(4)2"), {"i": 8}, ((0, 1, 4, 5), (2, 3, 6, 7))),
        (("i:(3)4",), {"i": 12}, ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))),
    ],
)
def test_groups_of_sub_axes_are_the_ones_axes_of_groups_names_so(axes, mesh, groups):
    assert groups_of_axes(axes, mesh) == groups
    assert axes_of_groups(groups, mesh).axes == axes


@pytest.mark.parametrize(
    "axes",
    [("nope",), ("mp:(3)2",), ("mp:(1)4", "mp:(2)2")],
    ids=["unknown axis", "sub-axis not dividing", "overlapping sub-axes"],
)
def test_groups_of_axes_that_name_no_groups_are_none(axes):
    assert groups_of_axes(axes, DP_MP) is None
