"""The collective audit: golden fixtures with hand-derived records, and live compiles."""

import inspect
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardscope
from shardscope._src.base.errors import (
    DeviceSetupError,
    HloParseError,
    MeshSpecError,
    ShardscopeError,
)

try:
    shardscope.use_cpu_devices(8)
except DeviceSetupError:
    pass  # JAX already started: the device check below decides.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardscope import audit, comm  # noqa: E402
from shardscope._src.audit.compile import parse_rematerializations  # noqa: E402
from shardscope._src.audit.records import Collective  # noqa: E402
from shardscope._src.audit.width import Width  # noqa: E402
from shardscope._src.cli.audit import run_audit_command  # noqa: E402
from shardscope._src.hlo.groups import parse_replica_groups  # noqa: E402
from shardscope._src.hlo.parse import parse_hlo  # noqa: E402
from shardscope._src.plan.compile import COMPILE_OPTIONS  # noqa: E402
from shardscope._src.render.audit import format_audit  # noqa: E402
from shardscope._src.sharding.demos import taster_matmul, taster_reshard  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "hlo"
GENERATOR = (FIXTURES / "generate.py").read_text().splitlines()

needs8 = pytest.mark.skipif(
    len(jax.devices()) < 8, reason=f"Test requires 8 devices and found {len(jax.devices())}"
)


def site(name: str) -> str:
    """``generate.py:LINE`` of the line marked ``# site: name`` in the fixture generator."""
    (line,) = [i + 1 for i, t in enumerate(GENERATOR) if t.rstrip().endswith(f"# site: {name}")]
    return f"generate.py:{line}"


def fixture_audit(name: str, mesh: str):
    return audit((FIXTURES / f"{name}.hlo").read_text(), mesh=mesh)


# (kind, axes, group_size, payload_bytes, traffic_bytes, count, count_exact, source site)
# Derived by hand from each program in generate.py; f32 is 4 bytes, n the group size.
GOLDEN = {
    # x[16,1024] @ w[1024,1024] split over K: all-reduce the 16x1024 result, 2*7/8 of it.
    ("matmul_1d", "model=8"): [
        ("all-reduce", ("model",), 8, 16 * 1024 * 4, 2 * 7 * 16 * 1024 * 4 // 8, 1, True, "matmul"),
    ],
    # Rows to columns: one all-to-all of the whole 4 MiB array, (n-1)/n^2 of it per device.
    ("reshard_1d", "model=8"): [
        (
            "all-to-all",
            ("model",),
            8,
            1024 * 1024 * 4,
            7 * 1024 * 1024 * 4 // 64,
            1,
            True,
            "reshard",
        ),
    ],
    # x[16,64] P(mp,dp) @ w[64,32] P(dp,None): partial sums of 4x32 all-reduced over dp, then
    # the 16x32 result gathered over mp (no metadata: the partitioner added it).
    ("mm_2d", "dp=2,mp=4"): [
        ("all-reduce", ("dp",), 2, 4 * 32 * 4, 4 * 32 * 4, 1, True, "mm2d"),
        ("all-gather", ("mp",), 4, 16 * 32 * 4, 3 * 16 * 32, 1, True, None),
    ],
    # Same program on a mesh with permuted device order: ids are partition ids.
    ("mm_2d_permuted", "dp=2,mp=4"): [
        ("all-reduce", ("dp",), 2, 4 * 32 * 4, 4 * 32 * 4, 1, True, "mm2d"),
        ("all-gather", ("mp",), 4, 16 * 32 * 4, 3 * 16 * 32, 1, True, None),
    ],
    # x[8,16] P((mp,dp)) reshaped to [2,4,16] and summed over axis 1: device (d,m) holds row
    # 2m+d, so rows with equal 2m+d // 4 = m // 2 are summed: dp and the minor half of mp.
    ("sub_axes_2d", "dp=2,mp=4"): [
        ("all-reduce", ("dp", "mp:(2)2"), 4, 16 * 4, 2 * 3 * 16 * 4 // 4, 1, True, "subaxes"),
        ("all-gather", ("mp:(1)2",), 2, 2 * 16 * 4, 16 * 4, 1, True, None),
    ],
    ("psum_3d", "a=2,b=2,c=2"): [
        ("all-reduce", ("a", "c"), 4, 2 * 4, 2 * 3 * 8 // 4, 1, True, "psum_ac"),
        ("all-reduce", ("b",), 2, 2 * 4, 8, 1, True, "psum_b"),
    ],
    # Local block 4x4 f32 = 64 bytes.
    ("shard_map_collectives", "dp=2,mp=4"): [
        ("all-gather", ("mp",), 4, 256, 192, 1, True, "sm_all_gather"),
        ("reduce-scatter", ("mp",), 4, 256, 192, 1, True, "sm_psum_scatter"),
        ("all-to-all", ("mp",), 4, 4 * 64, 3 * 4 * 64 // 16, 1, True, "sm_all_to_all"),
        ("collective-permute", ("dp",), 2, 64, 64, 1, True, "sm_ppermute"),
    ],
    # Five scanned layers: the body's all-reduce runs five times.
    ("scan_1d", "model=8"): [
        ("all-reduce", ("model",), 8, 16 * 64 * 4, 2 * 7 * 16 * 64 * 4 // 8, 5, True, "scan_layer"),
    ],
    # One all-reduce per branch; counts are per branch taken, so not exact.
    ("cond_1d", "model=8"): [
        ("all-reduce", ("model",), 8, 16 * 64 * 4, 7168, 1, False, "cond"),
        ("all-reduce", ("model",), 8, 16 * 64 * 4, 7168, 1, False, "cond"),
    ],
    # Sequence parallel under jit on CPU: all-gather the sequence, all-reduce (+ slice).
    ("seq_parallel", "model=8"): [
        ("all-gather", ("model",), 8, 2 * 64 * 64 * 4, 7 * 2 * 64 * 64 * 4 // 8, 1, True, "sp_up"),
        (
            "all-reduce",
            ("model",),
            8,
            2 * 64 * 64 * 4,
            2 * 7 * 2 * 64 * 64 * 4 // 8,
            1,
            True,
            "sp_down",
        ),
    ],
    # The replicate-then-slice fallback: gather over x, then over y.
    ("remat_2d", "x=4,y=2"): [
        ("all-gather", ("x",), 4, 8 * 16 * 16 * 4, 3 * 8 * 16 * 16, 1, True, "remat"),
        ("all-gather", ("y",), 2, 16 * 16 * 16 * 4, 16 * 16 * 16 * 2, 1, True, "remat"),
    ],
    # The iota form [2,4]<=[8] groups partitions 0-3 and 4-7: the minor 4 of i, 'i:(2)4'.
    # all-gather result f32[4,6]; all-to-all of two f32[3,1,1,1] pieces over pairs {p, p+4}
    # ('i:(1)2'); a permute of one f32[6,1,1] buffer along i (some pairs stay put).
    ("reshape_1d", "i=8"): [
        ("all-gather", ("i:(2)4",), 4, 4 * 6 * 4, 3 * 96 // 4, 1, True, "reshape"),
        ("all-to-all", ("i:(1)2",), 2, 2 * (2 * 3 * 4), 48 // 4, 1, True, "reshape"),
        ("collective-permute", ("i",), 8, 6 * 4, 6 * 4, 1, True, "reshape"),
    ],
    # A scan of 3 over a scan of 4: the inner body's all-reduce runs 12 times.
    ("nested_scan_1d", "model=8"): [
        ("all-reduce", ("model",), 8, 16 * 64 * 4, 7168, 3 * 4, True, "nested_inner"),
    ],
}


@pytest.mark.parametrize("name, mesh", list(GOLDEN), ids=[k[0] for k in GOLDEN])
def test_golden_records(name, mesh):
    a = fixture_audit(name, mesh)
    got = [
        (
            c.kind,
            c.axes,
            c.group_size,
            c.payload_bytes,
            c.traffic_bytes,
            c.count,
            c.count_exact,
            c.source,
        )
        for c in a.collectives
    ]
    want = [(*row[:7], site(row[7]) if row[7] else None) for row in GOLDEN[(name, mesh)]]
    assert got == want
    assert not any(c.irregular for c in a.collectives)
    assert a.unknown_instructions == ()
    assert a.rematerializations is None  # text: the partitioner's log was not seen
    json.dumps(a.to_dict(), allow_nan=False)


def test_golden_details():
    a = fixture_audit("scan_1d", "model=8")
    (c,) = a.collectives
    assert c.loops[0].trip_count == 5
    assert (c.dtype, c.shape, c.reduction) == ("f32", (16, 64), "add")
    a = fixture_audit("nested_scan_1d", "model=8")
    (c,) = a.collectives
    assert [lp.trip_count for lp in c.loops] == [3, 4]  # outermost first
    a = fixture_audit("reshape_1d", "i=8")
    assert [parse_replica_groups(c.replica_groups).form for c in a.collectives[:2]] == [
        "iota",
        "mesh",
    ]
    assert (0, 0) in a.collectives[2].pairs
    a = fixture_audit("cond_1d", "model=8")
    assert [c.conditionals for c in a.collectives] == [
        ("conditional.clone[0]",),
        ("conditional.clone[1]",),
    ]
    assert not a.exact
    a = fixture_audit("mm_2d", "dp=2,mp=4")
    gather = a.collectives[1]
    assert gather.op_name is None and gather.operand_source == site("mm2d")
    a = fixture_audit("reshard_1d", "model=8")
    (c,) = a.collectives
    assert c.shapes == ((128, 1, 128),) * 8
    a = fixture_audit("shard_map_collectives", "dp=2,mp=4")
    permute = a.collectives[3]
    assert permute.pairs == ((0, 4), (4, 0), (1, 5), (5, 1), (2, 6), (6, 2), (3, 7), (7, 3))


def test_counts_totals_and_expect():
    a = fixture_audit("shard_map_collectives", "dp=2,mp=4")
    assert a.counts() == {
        "all-reduce": 0,
        "all-gather": 1,
        "reduce-scatter": 1,
        "all-to-all": 1,
        "ragged-all-to-all": 0,
        "collective-permute": 1,
        "collective-broadcast": 0,
    }
    totals = a.totals()
    assert list(totals) == [
        ("dp", "collective-permute"),
        ("mp", "all-gather"),
        ("mp", "reduce-scatter"),
        ("mp", "all-to-all"),
    ]
    assert a.totals_by_axis()["mp"].traffic_bytes == 192 + 192 + 48
    assert a.axis_traffic("dp") == 64
    assert a.total().count == 4
    assert a.expect(all_gather=1, all_reduce=0, bytes_per_axis={"mp": 432}) is a
    with pytest.raises(AssertionError) as err:
        a.expect(all_gather=0, reduce_scatter=1, bytes_per_axis={"mp": 100})
    message = str(err.value)
    assert "2 of 3 checks differ" in message
    assert re.search(r"all-gather count\s+0\s+1\s+<- differs", message)
    assert re.search(r"reduce-scatter count\s+1\s+1\n", message)
    assert "bytes/device over 'mp'" in message and "432 B" in message
    assert site("sm_all_gather") in message
    with pytest.raises(TypeError, match="all_gathers"):
        a.expect(all_gathers=0)
    with pytest.raises(ShardscopeError, match="not an axis"):
        a.expect(bytes_per_axis={"tp": 1})


def test_sub_axis_traffic_counts_toward_its_axis():
    a = fixture_audit("sub_axes_2d", "dp=2,mp=4")
    assert a.axis_traffic("mp") == 96 + 64
    assert a.axis_traffic("dp") == 96


def test_rematerialization_log_is_parsed_with_source_line():
    module = parse_hlo((FIXTURES / "remat_2d.hlo").read_text())
    (r,) = parse_rematerializations((FIXTURES / "remat_2d.log").read_text(), module)
    assert r.from_sharding == "{devices=[2,1,4]<=[4,2]T(1,0)}"
    assert r.to_sharding == "{devices=[1,8,1]<=[8]}"
    assert r.instruction == "add.2"
    assert r.op_name == "jit(f)/add"
    assert r.source == site("remat")


def test_text_needs_matching_mesh():
    text = (FIXTURES / "mm_2d.hlo").read_text()
    with pytest.raises(MeshSpecError, match="partitioned over 8"):
        audit(text, mesh="dp=2,mp=2")
    with pytest.raises(MeshSpecError):
        audit(text, mesh="dp=2,mp")
    with pytest.raises(HloParseError):
        audit("not hlo", mesh="dp=2,mp=4")
    # Without a mesh the axis is called "devices"; sub-axes of it name the 2-D groups.
    a = audit(text)
    assert [c.axes for c in a.collectives] == [("devices:(1)2",), ("devices:(2)4",)]


def test_unknown_collective_attribute_is_kept_in_the_record():
    text = (
        (FIXTURES / "matmul_1d.hlo")
        .read_text()
        .replace("use_global_device_ids=true,", "use_global_device_ids=true, sparkle={1,2},")
    )
    (c,) = audit(text, mesh="model=8").collectives
    assert c.unknown_attributes == {"sparkle": "{1,2}"}


def test_async_pairs_count_once_and_async_wrappers_are_found():
    # Async forms do not appear on CPU; this module is written in the GPU/TPU printing style.
    text = (Path(__file__).parent / "fixtures" / "hlo_handwritten" / "async_pairs.hlo").read_text()
    a = audit(text, mesh="x=2,y=2")
    got = [(c.kind, c.axes, c.payload_bytes, c.count, c.is_async) for c in a.collectives]
    assert got == [
        ("all-gather", ("x", "y"), 128, 1, True),
        ("all-reduce", ("y",), 32, 1, True),
        ("all-gather", ("x",), 64, 1, True),
        ("collective-permute", ("y",), 32, 1, True),
        ("all-reduce", ("x", "y"), 32, 1, False),
        ("all-reduce", (), 32, 1, False),
    ]
    assert a.counts()["all-reduce"] == 3
    # replica_groups={} with a channel: every partition; without a channel_id the groups are
    # replica ids and there is one replica: nothing leaves a device.
    assert [c.group_size for c in a.collectives[-2:]] == [4, 1]
    assert a.collectives[-1].traffic_bytes == 0
    assert "no channel_id" in a.collectives[-1].note


def test_unknown_trip_count_is_flagged_not_guessed():
    text = (FIXTURES / "scan_1d.hlo").read_text()
    text = re.sub(r',"known_trip_count":\{"n":"5"\}', "", text)
    (c,) = audit(text, mesh="model=8").collectives
    assert (c.count, c.count_exact, c.loops[0].trip_count) == (1, False, None)


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(data=st.data())
def test_fuzz_audit_of_mutated_text_raises_only_shardscope_errors(data):
    name, mesh = data.draw(st.sampled_from(sorted(GOLDEN)))
    text = (FIXTURES / f"{name}.hlo").read_text()
    i = data.draw(st.integers(0, len(text) - 1))
    j = data.draw(st.integers(i, min(len(text), i + 30)))
    junk = data.draw(st.text(alphabet="{}()[],=%'0123456789<>T:abxy \n", max_size=6))
    try:
        audit(text[:i] + junk + text[j:], mesh=mesh)
    except ShardscopeError:
        pass


def test_render_table_lists_axes_kinds_and_sources():
    out = format_audit(fixture_audit("shard_map_collectives", "dp=2,mp=4"), width=160)
    assert "collective-permute" in out and "reduce-scatter" in out
    assert site("sm_all_to_all") in out
    assert out.index("dp ") < out.index("mp ")
    assert "rematerializations not checked" in out


# ----------------------------------------------------------------------------------------
# Live: compile small programs on 8 simulated devices.
# ----------------------------------------------------------------------------------------

_INSTR = re.compile(r"^\s*(?:ROOT )?%?\S+ = .*? ([a-z][a-z0-9\-]*)\(", re.M)
_COLLECTIVE = {
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "all-reduce-start", "all-gather-start", "collective-permute-start",
}  # fmt: skip


def opcodes_in(text: str) -> dict[str, int]:
    """An independent count: instruction lines by opcode (async starts count as the kind)."""
    out: dict[str, int] = {}
    for op in _INSTR.findall(text):
        if op in _COLLECTIVE:
            kind = op.removesuffix("-start")
            out[kind] = out.get(kind, 0) + 1
    return out


@needs8
def test_taster_matmul_is_one_all_reduce_over_model():
    a = audit(taster_matmul())
    a.expect(all_reduce=1, all_gather=0, all_to_all=0, reduce_scatter=0)
    (c,) = a.collectives
    assert (c.axes, c.payload_bytes, c.dtype, c.shape) == (
        ("model",),
        16 * 1024 * 4,
        "f32",
        (16, 1024),
    )
    # The user's line: the product in the demo's source, found in the file, not in the audit.
    demos = Path(inspect.getsourcefile(taster_matmul)).read_text().splitlines()
    (line,) = [i + 1 for i, t in enumerate(demos) if t.strip() == "return x @ w"]
    file, at = c.source.rsplit(":", 1)
    assert file.endswith("sharding/demos.py") and int(at) == line, c.source
    assert a.rematerializations == ()
    assert a.memory["argument_size_in_bytes"] == 16 * 1024 * 4 + 1024 * 1024 * 4 // 8
    assert a.flops is not None and a.flops > 0
    assert a.in_shardings == ("P()", "P('model', None)")
    assert a.out_shardings == ("P()",)
    assert opcodes_in(a.compiled.as_text()) == {"all-reduce": 1}


@needs8
@pytest.mark.parametrize(
    "make, spec",
    [
        (taster_matmul, None),
        (taster_matmul, "model=4"),
        (taster_reshard, None),
        (taster_reshard, "model=4"),
        (taster_reshard, "data=2,model=4"),
    ],
)
def test_demo_checks_hold(make, spec):
    demo = make(spec)
    demo.check(audit(demo))


@needs8
def test_matmul_on_a_2d_mesh_gathers_the_weight_instead():
    # Measured on JAX 0.10.2 CPU: with a data axis beside model, XLA all-gathers w (4 MiB)
    # over model rather than all-reducing the 64 KiB result: the taster fact is 1-D only.
    a = audit(taster_matmul("data=2,model=4"))
    (c,) = a.collectives
    assert (c.kind, c.axes, c.payload_bytes) == ("all-gather", ("model",), 1024 * 1024 * 4)


@needs8
def test_demo_check_reports_what_differed():
    with pytest.raises(AssertionError, match="all-to-all count"):
        taster_reshard().check(audit(taster_matmul()))


@needs8
def test_taster_reshard_is_one_all_to_all():
    a = audit(taster_reshard())
    assert {k: v for k, v in a.counts().items() if v} == {"all-to-all": 1}
    (c,) = a.collectives
    assert (c.axes, c.payload_bytes) == (("model",), 1024 * 1024 * 4)


MESHES = {"8": "model=8", "2x4": "data=2,model=4", "2x2x2": "pipe=2,data=2,model=2"}


def test_an_argument_the_mesh_does_not_divide_is_named_with_the_sizes_that_do():
    from shardscope._src.base.errors import LayoutError

    def one_axis(mesh):
        x = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(mesh, P("data")))
        return jax.jit(lambda x: x * 2), (x,)

    with pytest.raises(LayoutError) as err:
        shardscope.audit_program(one_axis, "data=3,model=2", axis_types="auto")
    said = str(err.value)
    assert said.startswith(one_axis.__qualname__)  # the program, then what it was given
    assert said[len(one_axis.__qualname__) :].startswith(
        " on mesh data=3,model=2: dimension 0 of argument [0] (size 64, shape "
        "(64, 16)) is split over axis 'data' (3), which does not divide 64; choose a size of "
        "'data' that divides 64 (e.g. 1, 2, 4), or split that dimension over other axes. "
        "JAX said: "
    )
    assert err.value.params == ("mesh",)

    def two_axes(mesh):
        spec = P(None, ("data", "model"))
        w = jax.ShapeDtypeStruct((16, 12), jnp.float32, sharding=NamedSharding(mesh, spec))
        return jax.jit(lambda p: p["w"] * 2), ({"w": w},)

    with pytest.raises(LayoutError) as err:
        shardscope.audit_program(two_axes, "data=2,model=4", axis_types="auto")
    said = str(err.value)
    assert said[len(two_axes.__qualname__) :].startswith(
        " on mesh data=2,model=4: dimension 1 of argument [0]['w'] (size 12, shape "
        "(16, 12)) is split over axes data=2 x model=4 (8), which does not divide 12; choose "
        "sizes of data, model whose product divides 12 (e.g. 1, 2, 3, 4, 6), or split"
    )


def test_a_path_is_read_and_a_file_name_given_as_text_is_named(tmp_path):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("model")))
    text = jax.jit(lambda x, w: x @ w).lower(x, w).compile().as_text()
    dump = tmp_path / "module_0001.jit_f.cpu_after_optimizations.txt"
    dump.write_text(text)
    from_path, from_text = audit(dump, mesh="model=8"), audit(text, mesh="model=8")
    assert from_path.to_dict() == from_text.to_dict()
    assert from_path.counts()["all-reduce"] == 1
    with pytest.raises(HloParseError) as named:
        audit(str(dump), mesh="model=8")
    assert str(named.value) == (
        f"audit({str(dump)!r}): this is a file name, not HLO text; pass "
        f"pathlib.Path({str(dump)!r}) to read the file, or its text"
    )
    missing = tmp_path / "missing.txt"
    with pytest.raises(ShardscopeError) as gone:
        audit(missing, mesh="model=8")
    assert str(gone.value).startswith(f"audit(Path({str(missing)!r})): no such file")
    # a one-line text that names no file is still read as (bad) HLO
    with pytest.raises(HloParseError, match="is not HLO"):
        audit(str(missing), mesh="model=8")


@needs8
@pytest.mark.parametrize("spec", list(MESHES.values()), ids=list(MESHES))
def test_every_target_form_audits_alike(spec):
    mesh = shardscope.make_mesh(spec, axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("model")))

    def f(x, w):
        return x @ w

    jitted = jax.jit(f)
    lowered = jitted.lower(x, w)
    compiled = lowered.compile()
    forms = [
        audit(jitted, x, w),
        audit(f, x, w, out_shardings=NamedSharding(mesh, P())),
        audit(lowered),
        audit(compiled),
        audit(compiled.as_text(), mesh=spec),
        audit(compiled.as_text(), mesh=mesh),
    ]
    records = [
        [(c.kind, c.axes, c.payload_bytes, c.count, c.source) for c in a.collectives] for a in forms
    ]
    assert all(r == records[0] for r in records)
    assert all(a.mesh_axes == shardscope.parse_mesh_spec(spec) for a in forms)
    assert {k: v for k, v in forms[0].counts().items() if v} == opcodes_in(compiled.as_text())
    # The compiler's plan depends on the mesh; on the 1-D mesh it is the taster's all-reduce.
    if spec == "model=8":
        assert records[0] == [("all-reduce", ("model",), 16 * 64 * 4, 1, records[0][0][4])]
    assert all(c.axes == ("model",) for c in forms[0].collectives)
    with pytest.raises(ShardscopeError):
        audit(compiled, x)


@needs8
def test_compiler_options_reach_the_compiler():
    # XLA:CPU combines the two all-reduces of independent matmuls into one; its option
    # xla_disable_hlo_passes keeps them apart.
    mesh = shardscope.make_mesh("x=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
    replicated = NamedSharding(mesh, P())
    fn = jax.jit(lambda a, b, c: (a @ b.T, jnp.sin(a) @ c.T), out_shardings=replicated)
    lowered = fn.lower(x, x, x)
    apart = {"xla_disable_hlo_passes": "cpu-all-reduce-combiner"}
    (combined,) = audit(lowered).collectives
    assert (combined.kind, len(combined.parts)) == ("all-reduce", 2)
    for result in (
        audit(lowered, compiler_options=apart),
        audit(fn, x, x, x, compiler_options=apart),
    ):
        assert [(c.kind, c.count) for c in result.collectives] == [("all-reduce", 1)] * 2
        assert result.compiled.as_text() == result.hlo_text
    with pytest.raises(ShardscopeError, match="compiler_options"):
        audit(lowered.compile(), compiler_options=apart)
    with pytest.raises(ShardscopeError, match="compiler_options"):
        audit(lowered.compile().as_text(), compiler_options=apart)


@needs8
def test_permuted_device_order_names_the_same_axes():
    devices = list(np.asarray(jax.devices())[[3, 1, 6, 0, 7, 2, 5, 4]])
    mesh = shardscope.make_mesh("dp=2,mp=4", devices=devices, axis_types="auto")
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P("dp", "mp")))
    a = audit(jax.jit(lambda x: x.sum(1)), x)
    (c,) = a.collectives
    assert (c.kind, c.axes) == ("all-reduce", ("mp",))


@needs8
def test_rematerialization_detected_live():
    from jax.sharding import Mesh

    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("x", "y"))
    s2 = NamedSharding(mesh, P(None, ("x", "y"), None))
    s1 = NamedSharding(mesh, P("y", None, "x"))

    def f(a, b, c):
        d = jax.lax.with_sharding_constraint(a + b, s2)  # the line to report
        return c + d

    arg = jax.ShapeDtypeStruct((16, 16, 16), jnp.float32)
    # the second compile may be served from JAX's cache, without a log; the third compiles
    # with the planner's options
    for options in (None, None, COMPILE_OPTIONS):
        a = audit(
            f, arg, arg, arg, in_shardings=(s1, s1, s2), out_shardings=s2, compiler_options=options
        )
        (r,) = a.rematerializations
        assert r.source.endswith(f":{f.__code__.co_firstlineno + 1}")


@needs8
@pytest.mark.parametrize(
    "program",
    ["scan", "shard_map", "sequence_parallel"],
)
def test_live_audit_matches_instructions_in_compiled_text(program):
    mesh = shardscope.make_mesh("dp=2,mp=4", axis_types="auto")
    if program == "scan":

        def step(h, w):
            return jnp.tanh(h @ w), None

        fn = jax.jit(lambda x, ws: jax.lax.scan(step, x, ws)[0])
        args = (
            jax.ShapeDtypeStruct((8, 32), jnp.float32, sharding=NamedSharding(mesh, P(None, "mp"))),
            jax.ShapeDtypeStruct(
                (3, 32, 32), jnp.float32, sharding=NamedSharding(mesh, P(None, "mp", None))
            ),
        )
        trips = 3
    elif program == "shard_map":

        def body(x):
            return jax.lax.psum(jax.lax.all_gather(x, "dp", tiled=True), "mp")

        fn = jax.jit(
            jax.shard_map(
                body, mesh=mesh, in_specs=P("dp", "mp"), out_specs=P(None, None), check_vma=False
            )
        )
        args = (
            jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("dp", "mp"))),
        )
        trips = 1
    else:
        seq = NamedSharding(mesh, P(None, "mp", None))
        fn = jax.jit(lambda x, w: jax.lax.with_sharding_constraint(jax.nn.relu(x @ w) @ w.T, seq))
        args = (
            jax.ShapeDtypeStruct((2, 16, 32), jnp.float32, sharding=seq),
            jax.ShapeDtypeStruct(
                (32, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "mp"))
            ),
        )
        trips = 1
    a = audit(fn, *args)
    static = opcodes_in(a.compiled.as_text())
    per_run = {k: v for k, v in a.counts().items() if v}
    assert {k: v * trips for k, v in static.items()} == per_run
    assert all(not c.irregular for c in a.collectives)
    assert all(c.source is not None or c.operand_source is not None for c in a.collectives)


AXIS_NAMES = ["data", "model", "x", "y", "z", "pipe"]
SHAPES = [(8,), (2, 4), (4, 2), (2, 2, 2)]


@needs8
@settings(derandomize=True, database=None, deadline=None, max_examples=15)
@given(data=st.data())
def test_property_psum_axes_inside_shard_map(data):
    shape = data.draw(st.sampled_from(SHAPES))
    names = data.draw(st.permutations(AXIS_NAMES)).__getitem__(slice(0, len(shape)))
    subset = data.draw(
        st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)
    )
    spec = ",".join(f"{n}={s}" for n, s in zip(names, shape, strict=True))
    mesh = shardscope.make_mesh(spec, axis_types="auto")
    fn = jax.jit(
        jax.shard_map(
            lambda x: jax.lax.psum(x, tuple(subset)),
            mesh=mesh,
            in_specs=P(tuple(names)),
            out_specs=P(tuple(names)),
            check_vma=False,
        )
    )
    x = jax.ShapeDtypeStruct((32,), jnp.float32, sharding=NamedSharding(mesh, P(tuple(names))))
    a = audit(fn, x)
    (c,) = a.collectives
    assert c.kind == "all-reduce"
    assert c.axes == tuple(n for n in names if n in subset)
    assert c.group_size == int(
        np.prod([s for n, s in zip(names, shape, strict=True) if n in subset])
    )
    assert c.payload_bytes == 32 // 8 * 4


@needs8
def test_run_audit_command_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "audit.json"
    assert run_audit_command("matmul", None, str(out)) == 0
    data = json.loads(out.read_text())
    assert data["demo"] == "matmul"
    assert data["counts"]["all-reduce"] == 1
    assert data["collectives"][0]["payload_bytes"] == 65536
    assert data["collectives"][0]["axes"] == ["model"]
    printed = capsys.readouterr().out
    assert "all-reduce" in printed and "model" in printed
    assert run_audit_command("reshard", "data=2,model=4", None) == 0
    with pytest.raises(ShardscopeError, match="unknown demo"):
        run_audit_command("nope", None, None)
    with pytest.raises(MeshSpecError):
        run_audit_command("matmul", "model=16", None)
    with pytest.raises(MeshSpecError):
        run_audit_command("matmul", "model=3", None)


@needs8
def test_plain_function_with_partition_specs_and_a_mesh_description():
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32)
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)

    def f(x, w):
        return x @ w

    a = audit(f, x, w, mesh="model=8", in_shardings=(P(), P("model", None)))
    assert [(c.kind, c.axes, c.payload_bytes) for c in a.collectives] == [
        ("all-reduce", ("model",), 16 * 1024 * 4)
    ]
    assert a.in_shardings == ("P()", "P('model', None)")
    with pytest.raises(ShardscopeError, match="needs a jitted function"):
        audit(42)


# -- the 16-bit policy ----------------------------------------------------------------------------


def _widened(kind, dtype, shapes, payload, group_size=8, traffic=None):
    traffic = comm.traffic_bytes(kind, payload, group_size) if traffic is None else traffic
    return Collective(
        kind,
        "c",
        "main",
        ("x",),
        group_size,
        dtype,
        shapes[0],
        payload,
        traffic,
        3,
        shapes=tuple(shapes),
    )


def test_sixteen_bit_programs_count_float32_arrays_at_two_bytes_and_scalars_at_four():
    bf16 = Width("bfloat16")
    c = _widened("all-reduce", "f32", [(64, 8), ()], 64 * 8 * 4 + 4)
    assert bf16.payload(c) == 64 * 8 * 2 + 4
    assert bf16.traffic(c) == comm.traffic_bytes("all-reduce", 64 * 8 * 2 + 4, 8)
    assert bf16.sent(c) == 3 * bf16.traffic(c)
    scalar = _widened("all-reduce", "f32", [()], 4)
    assert Width("float16").payload(scalar) == 4 and Width("float16").sent(scalar) == 3 * 7
    a2a = _widened("all-to-all", "f32", [(16,)], 16 * 4 * 8)
    assert bf16.payload(a2a) == 16 * 2 * 8
    permute = _widened("collective-permute", "f32", [(16,)], 64, traffic=64)
    assert bf16.traffic(permute) == 32
    still = _widened("collective-permute", "f32", [(16,)], 64, traffic=0)
    assert bf16.traffic(still) == 0  # self pairs send nothing, at any width


def test_width_leaves_other_collectives_as_compiled():
    bf16 = Width("bfloat16")
    native = _widened("all-gather", "bf16", [(16,)], 32)
    assert (bf16.payload(native), bf16.traffic(native)) == (32, native.traffic_bytes)
    f32 = _widened("all-gather", "f32", [(16,)], 64)
    assert Width("float32").payload(f32) == 64 and Width(None).traffic(f32) == f32.traffic_bytes
    odd = _widened("all-gather", "f32", [(16,)], 999)  # not the arrays it names
    assert bf16.payload(odd) == 999 and bf16.traffic(odd) == odd.traffic_bytes


@needs8
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_audit_on_cpu_says_its_16_bit_collectives_went_as_float32(dtype):
    from shardscope._src.audit.records import Audit
    from shardscope._src.audit.width import widened_dtype

    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    a = jax.ShapeDtypeStruct((64, 128), dtype, sharding=NamedSharding(mesh, P(None, "model")))
    b = jax.ShapeDtypeStruct((128, 32), dtype, sharding=NamedSharding(mesh, P("model", None)))
    out = NamedSharding(mesh, P())
    result = audit(jax.jit(lambda x, y: x @ y, out_shardings=out), a, b)
    # the partial products all-reduced over 8 devices: XLA:CPU sends f32[64,32] either way
    (c,) = result.collectives
    assert (c.kind, c.dtype, c.payload_bytes) == ("all-reduce", "f32", 64 * 32 * 4)
    assert c.traffic_bytes == 2 * 7 * 64 * 32 * 4 // 8  # 14 KiB
    text = " ".join(format_audit(result, width=200).split())  # the caption wraps at the table
    read_back = Audit.from_dict(json.loads(json.dumps(result.to_dict())))
    if dtype == "float32":
        assert result.widened_dtype is None and "float32 it sends" not in text
        return
    assert result.widened_dtype == "bfloat16" == read_back.widened_dtype
    # at bfloat16 width, as a compiler that keeps 16 bits sends it: 2 * 7 * 64 * 32 * 2 / 8
    assert "XLA:CPU runs bfloat16 arithmetic in f32 and moves f32" in text
    assert "this table counts the float32 it sends, where a compiler that keeps bfloat16 " in text
    assert f"sends {comm.format_bytes(2 * 7 * 64 * 32 * 2 // 8)} per device" in text
    # the same program compiled by a compiler that keeps 16 bits has nothing widened
    assert widened_dtype(result.module, "gpu", result.collectives) is None
