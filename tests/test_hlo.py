"""The HLO text parser, on golden compiler output of JAX 0.10.2 (tests/fixtures/hlo)."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardscope._src.base.errors import HloParseError
from shardscope._src.hlo.parse import parse_hlo, parse_shape, split_top_level

FIXTURES = Path(__file__).parent / "fixtures" / "hlo"
ALL = sorted(FIXTURES.glob("*.hlo"))


def read(name: str) -> str:
    return (FIXTURES / f"{name}.hlo").read_text()


def test_fixtures_were_printed_by_the_installed_jax():
    # Golden text is only golden for the compiler that printed it: a JAX upgrade must
    # regenerate the fixtures (and their VERSION file) before these tests mean anything.
    import jax
    import jaxlib

    recorded = dict(line.split(" ", 1) for line in (FIXTURES / "VERSION").read_text().splitlines())
    assert (recorded["jax"], recorded["jaxlib"]) == (jax.__version__, jaxlib.__version__)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_every_fixture_parses_every_instruction_line(path):
    text = path.read_text()
    module = parse_hlo(text)
    assert module.num_partitions == 8
    # Every line with " = " inside a computation is one instruction record.
    inside = [ln for ln in text.splitlines() if ln.startswith("  ") and " = " in ln]
    assert sum(1 for _ in module.instructions()) == len(inside)
    assert module.entry.is_entry
    assert all(ins.known for ins in module.instructions())


def test_matmul_module_records():
    m = parse_hlo(read("matmul_1d"))
    assert m.name == "jit__lambda"
    assert m.entry_name == "main.0_spmd"
    assert m.attributes["is_scheduled"] == "true"
    assert m.attributes["allow_spmd_sharding_propagation_to_parameters"] == "{false,false}"
    assert m.file_names == {1: "generate.py"}
    assert m.function_names == {
        1: "<module>",
        2: "main",
        3: "matmul_1d",
        4: "matmul_1d.<locals>.<lambda>",
    }
    ar = m.entry.root
    assert ar.opcode == "all-reduce"
    assert ar.name == "all-reduce"
    assert ar.operands == ("ynn_fusion",)
    assert str(ar.shape) == "f32[16,1024]"
    assert ar.shape.layout == "1,0"
    assert ar.shape.byte_size == 16 * 1024 * 4
    assert ar.attributes["replica_groups"] == "mesh['axis_0'=1,'axis_1'=8] {'axis_1'}"
    assert ar.attributes["use_global_device_ids"] == "true"
    assert ar.metadata.op_name == "jit(<lambda>)/dot_general"
    assert ar.called_computations == (("to_apply", "add.clone"),)
    loc = m.stack(ar.metadata.stack_frame_id)[0]
    assert (loc.file, loc.function) == ("generate.py", "matmul_1d.<locals>.<lambda>")
    assert str(loc) == f"generate.py:{loc.line}"
    param = m.entry.by_name["param.1"]
    assert param.literal == "1"
    assert param.attributes["sharding"] == "{devices=[8,1]<=[8]}"
    fusion = m.entry.by_name["ynn_fusion"]
    assert fusion.backend_config == {
        "fusion_config": {"kind": "__ynn_fusion"},
        "outer_dimension_partitions": [],
    }


def test_tuple_shapes_comments_and_mesh_device_ids():
    m = parse_hlo(read("reshard_1d"))
    a2a = next(i for i in m.instructions() if i.opcode == "all-to-all")
    # Eight operands, the sixth printed after a /*index=5*/ comment.
    assert len(a2a.operands) == 8
    assert a2a.shape.is_tuple and len(a2a.shape.tuple_shapes) == 8
    assert all(str(s) == "f32[128,1,128]" for s in a2a.shape.tuple_shapes)
    assert a2a.shape.byte_size == 8 * 128 * 128 * 4
    m = parse_hlo(read("mm_2d"))
    ag = next(i for i in m.instructions() if i.opcode == "all-gather")
    # The mesh form's ", device_ids=(...)" belongs to replica_groups, not a new attribute.
    assert ag.attributes["replica_groups"] == (
        "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}"
    )
    assert "device_ids" not in ag.attributes
    assert ag.attributes["dimensions"] == "{0}"


def test_while_backend_config_and_call_graph():
    m = parse_hlo(read("scan_1d"))
    (loop,) = [i for i in m.instructions() if i.opcode == "while"]
    assert loop.backend_config["known_trip_count"] == {"n": "5"}
    assert {a for a, _ in loop.called_computations} == {"body", "condition"}
    assert str(loop.shape) == "(s32[], f32[16,8], f32[5,8,64], s32[])"
    m = parse_hlo(read("cond_1d"))
    (cond,) = [i for i in m.instructions() if i.opcode == "conditional"]
    assert [a for a, _ in cond.called_computations] == ["branch_computations"] * 2


def test_stack_follows_parent_frames_innermost_first():
    m = parse_hlo(read("scan_1d"))
    ar = next(i for i in m.instructions() if i.opcode == "all-reduce")
    funcs = [loc.function for loc in m.stack(ar.metadata.stack_frame_id)]
    assert funcs == [
        "scan_1d.<locals>.layer",
        "scan_1d.<locals>.model",
        "scan_1d",
        "main",
        "<module>",
    ]


@pytest.mark.parametrize(
    "text, shape, size",
    [
        ("f32[]", "f32[]", 4),
        ("bf16[2,3]{1,0}", "bf16[2,3]", 12),
        ("pred[7]{0}", "pred[7]", 7),
        ("s4[3]{0}", "s4[3]", 2),
        ("(s32[], (f32[2]{0}, token[]))", "(s32[], (f32[2], token[]))", 12),
        ("f32[<=8,4]{1,0}", "f32[<=8,4]", 128),
        ("f32[8]{0:T(256)S(1)}", "f32[8]", 32),
        ("()", "()", 0),
    ],
)
def test_shapes(text, shape, size):
    s = parse_shape(text)
    assert str(s) == shape
    assert s.byte_size == size


def test_split_top_level_respects_nesting_strings_and_comments():
    assert split_top_level('a={1,2}, b="x, y", c=(3,4), /*index=5*/d') == [
        "a={1,2}",
        'b="x, y"',
        "c=(3,4)",
        "/*index=5*/d",
    ]


def test_unknown_opcodes_and_attributes_are_kept_raw():
    text = (
        "HloModule m, num_partitions=2\n\n"
        "ENTRY %main (p: f32[4]) -> f32[4] {\n"
        "  %p = f32[4]{0} parameter(0)\n"
        "  %x = f32[4]{0} frobnicate(%p), shiny=yes, fancy\n"
        "  ROOT %y = f32[4]{0} negate(%x)\n"
        "}\n"
    )
    m = parse_hlo(text)
    x = m.entry.by_name["x"]
    assert not x.known
    assert x.opcode == "frobnicate"
    assert x.attributes["shiny"] == "yes"
    assert "fancy" in x.attributes.values()
    assert m.entry.root.name == "y"


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("hello world", "is not HLO"),
        ("module @jit_f {\n  func.func public @main() {\n  }\n}", "StableHLO"),
        (
            "HloModule m\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n",
            "never closed",
        ),
        ("HloModule m\n\n%f () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n", "no ENTRY"),
        ("HloModule m\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[ constant(1)\n}\n", "line 4"),
        ("HloModule m\n\nENTRY %main () -> f32[] {\n  garbage\n}\n", "line 4"),
        ("HloModule m\nstray text here\n", "line 2"),
    ],
)
def test_text_that_is_not_hlo_fails_loudly(text, words):
    with pytest.raises(HloParseError, match=words):
        parse_hlo(text)


def _mutate(text: str, data: st.DataObject) -> str:
    if not text:
        return text
    kind = data.draw(
        st.sampled_from(
            ["delete", "insert", "replace", "drop_line", "dup_line", "truncate", "swap_lines"]
        )
    )
    n = len(text)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(i, min(n, i + 40)))
    lines = text.splitlines(keepends=True)
    k = data.draw(st.integers(0, len(lines) - 1))
    junk = data.draw(st.text(alphabet='{}()[],="%/* \n0123456789abcxyz<=->:T', max_size=8))
    if kind == "delete":
        return text[:i] + text[j:]
    if kind == "insert":
        return text[:i] + junk + text[i:]
    if kind == "replace":
        return text[:i] + junk + text[j:]
    if kind == "drop_line":
        return "".join(lines[:k] + lines[k + 1 :])
    if kind == "dup_line":
        return "".join(lines[: k + 1] + lines[k:])
    if kind == "truncate":
        return text[:i]
    m = data.draw(st.integers(0, len(lines) - 1))
    lines[k], lines[m] = lines[m], lines[k]
    return "".join(lines)


FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
SOURCES = [p.read_text() for p in ALL]


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_hlo_never_raises_anything_but_parse_error(data):
    text = SOURCES[data.draw(st.integers(0, len(SOURCES) - 1))]
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data)
    try:
        module = parse_hlo(text)
    except HloParseError:
        return
    # Whatever parsed must also be readable record by record.
    for ins in module.instructions():
        try:
            _ = (ins.metadata, ins.backend_config, ins.called_computations)
        except HloParseError:
            pass
