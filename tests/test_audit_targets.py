"""The audit on real GPU (H100) and TPU (v5p) compiler output (tests/fixtures/hlo_targets).

The fixtures are text: these tests need neither a GPU, a TPU nor their compilers. The
expected records are derived from the shapes of generate.py's programs (in that folder).
"""

# The golden table keeps one collective a line, however long.
# ruff: noqa: E501

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardscope._src.audit.compile import audit
from shardscope._src.audit.pricing import priced
from shardscope._src.base.errors import ShardscopeError
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.render.audit import format_audit
from shardscope._src.targets.hardware import hardware

FIXTURES = Path(__file__).parent / "fixtures" / "hlo_targets"
GENERATOR = (FIXTURES / "generate.py").read_text().splitlines()
ALL = sorted(FIXTURES.glob("*/*.hlo"))
MESHES = {
    "h100x8/fsdp_step": "data=8",
    "h100x8/tp_step": "data=2,model=4",
    "h100x8/shard_map_collectives": "dp=2,mp=4",
    "h100x8/flax_step": "data=2,model=4",
    "h100x8/combined_collectives": "x=8",
    "h100x8/attention_step": "data=8",
    "v5px8/fsdp_step": "data=8",
    "v5px8/tp_step": "data=2,model=4",
    "v5px8/shard_map_collectives": "dp=2,mp=4",
    "v5px8/attention_step": "data=8",
    "v5px64/fsdp_step": "data=64",
}
# The compilers whose output the fixtures are: the text changes when any of them does.
COMPILERS = (
    "jax",
    "jaxlib",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "nvidia-cuda-nvcc-cu12",
    "libtpu",
)


def site(name: str) -> str:
    """``generate.py:LINE`` of the line marked ``# site: name`` in the fixture generator."""
    (line,) = [i + 1 for i, t in enumerate(GENERATOR) if t.rstrip().endswith(f"# site: {name}")]
    return f"generate.py:{line}"


def fixture_audit(name: str):
    return audit((FIXTURES / f"{name}.hlo").read_text(), mesh=MESHES[name])


def _pins() -> dict[str, str]:
    text = (Path(__file__).parents[1] / "constraints.txt").read_text()
    pairs = (ln.split("==", 1) for ln in text.splitlines() if "==" in ln)
    return {name.strip().lower(): version.strip() for name, version in pairs}


def test_fixtures_were_made_by_the_pinned_and_installed_compilers():
    recorded = dict(line.split(" ", 1) for line in (FIXTURES / "VERSION").read_text().splitlines())
    pins = _pins()
    for dist in COMPILERS:
        # The versions set-up and CI install (constraints.txt) made these fixtures...
        assert pins.get(dist) == recorded[dist], (
            f"fixtures made with {dist} {recorded[dist]}, constraints.txt pins "
            f"{pins.get(dist)}: regenerate them with tests/fixtures/hlo_targets/generate.py"
        )
        # ...and whatever of them is installed here is that version.
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            assert dist not in ("jax", "jaxlib")
            continue
        assert installed == recorded[dist], f"{dist} {installed} installed, {recorded[dist]} pinned"


def test_every_fixture_has_its_mesh():
    assert sorted(MESHES) == sorted(f"{p.parent.name}/{p.stem}" for p in ALL)


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_instruction_parses_and_every_opcode_is_known(path):
    text = path.read_text()
    module = parse_hlo(text)
    inside = [ln for ln in text.splitlines() if ln.startswith("  ") and " = " in ln]
    assert sum(1 for _ in module.instructions()) == len(inside)
    assert [i.opcode for i in module.instructions() if not i.known] == []
    assert fixture_audit(f"{path.parent.name}/{path.stem}").unknown_instructions == ()


def test_tiled_layouts_and_memory_spaces_are_read():
    m = parse_hlo((FIXTURES / "v5px64" / "fsdp_step.hlo").read_text())
    body = m.computations["wide.region_0.1_spmd.sunk"]
    param = body.by_name["wide.param.4"]
    x = param.shape.tuple_shapes[1]
    assert (x.dtype, x.dims, x.layout) == ("bf16", (2, 256), "1,0:T(2,128)(2,1)S(1)")
    assert (x.minor_to_major, x.tiles, x.memory_space) == ((1, 0), ((2, 128), (2, 1)), 1)
    counter = param.shape.tuple_shapes[0]
    assert (counter.dims, counter.tiles, counter.memory_space) == ((), ((128,),), None)
    pid = body.by_name["partition-id.13"].shape
    assert (pid.layout, pid.tiles, pid.memory_space) == (":T(128)S(6)", ((128,),), 6)
    # Padding to tiles does not change the data's size.
    assert x.byte_size == 2 * 256 * 2


# One row a collective, sorted as the audit sorts them: kind, axes, group size, payload,
# traffic, count, carried as, async, the user's line (its site in generate.py), scope, phase.
# Every size is derived from generate.py's programs: payloads are the whole logical array
# (comm.py's convention), and traffic per device is 2 (n - 1) / n of it for an all-reduce,
# (n - 1) / n for an all-gather or reduce-scatter, (n - 1) / n**2 for an all-to-all, and all of
# it for a collective-permute. All arrays are bf16 (2 bytes).
B = 2
D, FF, LAYERS = 256, 1024, 3  # fsdp_step and tp_step
W = D * FF * B  # one layer's (256, 1024) or (1024, 256) weight
SM = 32 * 128 * B  # shard_map_collectives: one device's block of the (64, 512) input on 2 x 4
GOLDEN = {
    # FSDP over data=8, batch 64: both weights of a layer gathered together for the forward;
    # the layer's input (64, 256) and w1 for the backward; both gradients reduce-scattered;
    # relu's (64, 1024) mask exchanged.
    "h100x8/fsdp_step": [
        ("all-gather", "data", 8, 2 * W, 7 * 2 * W // 8, LAYERS, None, True, "fsdp_up", "mlp", "forward"),
        ("all-gather", "data", 8, 64 * D * B + W, 7 * (64 * D * B + W) // 8, LAYERS, None, True, "fsdp_down", "mlp", "backward"),
        ("reduce-scatter", "data", 8, 2 * W, 7 * 2 * W // 8, LAYERS, None, True, "fsdp_up", "mlp", "backward"),
        ("all-to-all", "data", 8, 64 * FF * B, 7 * 64 * FF * B // 8**2, LAYERS, None, True, "fsdp_up", "mlp", "backward"),
    ],
    # Megatron on data=2 x model=4, batch 16: the two weights' gradient shards (256, 256) each
    # summed over data; the (8, 256) output of the down projection summed over model.
    "h100x8/tp_step": [
        ("all-reduce", "data", 2, 2 * D * (FF // 4) * B, 2 * 1 * 2 * D * (FF // 4) * B // 2, 1, None, True, "tp_up", "block_0", "backward"),
        ("all-reduce", "model", 4, 8 * D * B, 2 * 3 * 8 * D * B // 4, 1, None, True, "tp_down", "block_0", "forward"),
    ],
    # The (32, 128) block gathered over mp to (128, 128), scattered back, exchanged to (8, 512),
    # then sent round dp and summed over it; no gradient, so all of it is the forward pass.
    "h100x8/shard_map_collectives": [
        ("all-reduce", "dp", 2, SM, 2 * 1 * SM // 2, 1, None, True, "sm_psum", "", "forward"),
        ("collective-permute", "dp", 2, SM, SM, 1, None, True, "sm_ppermute", "", "forward"),
        ("all-gather", "mp", 4, 4 * SM, 3 * 4 * SM // 4, 1, None, True, "sm_all_gather", "", "forward"),
        ("reduce-scatter", "mp", 4, 4 * SM, 3 * 4 * SM // 4, 1, None, True, "sm_psum_scatter", "", "forward"),
        ("all-to-all", "mp", 4, 4 * SM, 3 * 4 * SM // 4**2, 1, None, True, "sm_all_to_all", "", "forward"),
    ],
    # Two blocks of Dense(512) and Dense(128) on a (32, 128) input, data=2 x model=4: the four
    # kernels' (128, 128) gradient shards summed over data; a (16, 128) output summed over
    # model after each Dense_1 and, in the backward, before block_1's Dense_0.
    "h100x8/flax_step": [
        ("all-reduce", "data", 2, 4 * 128 * 128 * B, 2 * 1 * 4 * 128 * 128 * B // 2, 1, None, True, "flax_up", "Model", "backward"),
        ("all-reduce", "model", 4, 16 * 128 * B, 2 * 3 * 16 * 128 * B // 4, 1, None, True, "flax_down", "Model/block_0/Dense_1", "forward"),
        ("all-reduce", "model", 4, 16 * 128 * B, 2 * 3 * 16 * 128 * B // 4, 1, None, True, "flax_down", "Model/block_1/Dense_1", "forward"),
        ("all-reduce", "model", 4, 16 * 128 * B, 2 * 3 * 16 * 128 * B // 4, 1, None, True, "flax_up", "Model/block_1/Dense_0", "backward"),
    ],
    # The TPU compiler: both gradients all-reduced (no reduce-scatter), each weight gathered
    # on its own (w1 twice), the layer's input (64, 256) gathered, relu's mask exchanged.
    "v5px8/fsdp_step": [
        ("all-reduce", "data", 8, 2 * W, 2 * 7 * 2 * W // 8, LAYERS, None, False, "fsdp_up", "mlp", "backward"),
        ("all-gather", "data", 8, W, 7 * W // 8, LAYERS, None, False, "fsdp_up", "mlp", "forward"),
        ("all-gather", "data", 8, W, 7 * W // 8, LAYERS, None, False, "fsdp_up", "mlp", "backward"),
        ("all-gather", "data", 8, W, 7 * W // 8, LAYERS, None, False, "fsdp_down", "mlp", "forward"),
        ("all-gather", "data", 8, 64 * D * B, 7 * 64 * D * B // 8, LAYERS, None, False, "fsdp_down", "mlp", "backward"),
        ("all-to-all", "data", 8, 64 * FF * B, 7 * 64 * FF * B // 8**2, LAYERS, None, False, "fsdp_up", "mlp", "backward"),
    ],
    "v5px8/tp_step": [
        ("all-reduce", "data", 2, 2 * D * (FF // 4) * B, 2 * 1 * 2 * D * (FF // 4) * B // 2, 1, None, False, "tp_up", "block_0", "backward"),
        ("all-reduce", "model", 4, 8 * D * B, 2 * 3 * 8 * D * B // 4, 1, None, False, "tp_down", "block_0", "forward"),
    ],
    "v5px8/shard_map_collectives": [
        ("all-reduce", "dp", 2, SM, 2 * 1 * SM // 2, 1, None, False, "sm_psum", "", "forward"),
        ("collective-permute", "dp", 2, SM, SM, 1, None, True, "sm_ppermute", "", "forward"),
        ("all-gather", "mp", 4, 4 * SM, 3 * 4 * SM // 4, 1, None, False, "sm_all_gather", "", "forward"),
        ("reduce-scatter", "mp", 4, 4 * SM, 3 * 4 * SM // 4, 1, None, False, "sm_psum_scatter", "", "forward"),
        ("all-to-all", "mp", 4, 4 * SM, 3 * 4 * SM // 4**2, 1, None, False, "sm_all_to_all", "", "forward"),
    ],
    # data=64, batch 128: the gathers are all-reduces of zero-padded shards, so they send an
    # all-reduce's bytes: both weights of a layer, its (128, 256) input, and w1 again.
    "v5px64/fsdp_step": [
        ("all-reduce", "data", 64, 2 * W, 2 * 63 * 2 * W // 64, LAYERS, None, False, "fsdp_up", "mlp", "backward"),
        ("all-gather", "data", 64, 2 * W, 2 * 63 * 2 * W // 64, LAYERS, "all-reduce", False, "fsdp_down", "mlp", "forward"),
        ("all-gather", "data", 64, 128 * D * B, 2 * 63 * 128 * D * B // 64, LAYERS, "all-reduce", False, "fsdp_down", "mlp", "backward"),
        ("all-gather", "data", 64, W, 2 * 63 * W // 64, LAYERS, "all-reduce", False, "fsdp_up", "mlp", "backward"),
        ("all-to-all", "data", 64, 128 * FF * B, 63 * 128 * FF * B // 64**2, LAYERS, None, False, "fsdp_up", "mlp", "backward"),
    ],
}  # fmt: skip


def _golden_rows(rows: list[tuple]) -> list[tuple]:
    """GOLDEN's rows with the user's sites resolved to lines of generate.py."""
    return [(*row[:8], row[8] and site(row[8]), *row[9:]) for row in rows]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_records(name):
    a = fixture_audit(name)
    got = [
        (
            c.kind,
            c.axes_label,
            c.group_size,
            c.payload_bytes,
            c.traffic_bytes,
            c.count,
            c.carried_as,
            c.is_async,
            c.user_source,
            c.scope,
            c.phase,
        )
        for c in a.sorted_collectives()
    ]
    assert got == _golden_rows(GOLDEN[name])
    assert a.exact


def test_gpu_async_reduce_scatter_of_combined_gradients_is_counted_once_per_trip():
    a = fixture_audit("h100x8/fsdp_step")
    assert a.counts()["reduce-scatter"] == 3  # one combined pair per layer, 3 layers
    (rs,) = [c for c in a.collectives if c.kind == "reduce-scatter"]
    assert rs.name == "reduce-scatter-start" and rs.is_async and rs.dtype == "bf16"
    assert [(lp.trip_count, lp.derived) for lp in rs.loops] == [(3, False)]
    # The combiner made it without metadata: each gradient names its own line.
    assert rs.op_name is None
    assert [(p.shape, p.payload_bytes, p.user_source) for p in rs.parts] == [
        ((256, 1024), 256 * 1024 * 2, site("fsdp_up")),
        ((1024, 256), 1024 * 256 * 2, site("fsdp_down")),
    ]
    assert sum(p.traffic_bytes for p in rs.parts) == rs.traffic_bytes


def test_a_gpu_audit_charges_a_hidden_collective_the_multiprocessors_it_holds():
    # At a millionth of the H100's rate the matmul in the reduce-scatter's window outlasts
    # it; over data=8, one node, its channels still hold 32 of the 132 multiprocessors while
    # it runs, and it adds that share of its time to the step.
    name = "h100x8/fsdp_step"
    a = fixture_audit(name)
    slow = hardware("h100", peak_flops=989e6)
    module = parse_hlo((FIXTURES / f"{name}.hlo").read_text())
    got = {c.name: c.overlap for c in priced(a.collectives, module, a.mesh_axes, slow)}
    rs = got["reduce-scatter-start"]
    assert rs.exposed_s == pytest.approx(rs.comm_s * 32 / 132, rel=1e-12)
    assert rs.hidden_s == pytest.approx(rs.comm_s * 100 / 132, rel=1e-12)


def test_tpu_loops_without_known_trip_count_are_counted_from_the_loop():
    text = (FIXTURES / "v5px8" / "fsdp_step.hlo").read_text()
    assert "known_trip_count" not in text
    a = fixture_audit("v5px8/fsdp_step")
    for c in a.collectives:
        assert c.count == 3 and c.count_exact  # the scan's length
        assert [(lp.trip_count, lp.derived) for lp in c.loops] == [(3, True)]
    assert a.to_dict()["collectives"][0]["loops"][0] == {
        "name": a.collectives[0].loops[0].name,
        "trip_count": 3,
        "derived": True,
    }


def test_decomposed_all_gather_is_reported_as_an_all_gather_with_what_it_sends():
    a = fixture_audit("v5px64/fsdp_step")
    assert a.counts()["all-gather"] == 9 and a.counts()["all-reduce"] == 3
    gathers = {c.name: c for c in a.collectives if c.kind == "all-gather"}
    first = gathers["all-reduce.11"]
    assert first.carried_as == "all-reduce" and first.reduction is None
    # Each layer's two weights, 1/64 per device: gathered in full, sent as an all-reduce.
    assert [p.shape for p in first.parts] == [(1, 1024, 256), (1, 256, 1024)]
    assert first.payload_bytes == 2 * 256 * 1024 * 2
    assert first.traffic_bytes == -(-2 * 63 * first.payload_bytes // 64)
    assert "zero-padded shards" in first.note
    # all-reduce.13 carries a weight gathered for the backward pass and two gradients.
    shared = [c for c in a.collectives if c.name == "all-reduce.13"]
    assert sorted((c.kind, c.payload_bytes) for c in shared) == [
        ("all-gather", 256 * 1024 * 2),
        ("all-reduce", 2 * 256 * 1024 * 2),
    ]
    (summed,) = [c for c in shared if c.kind == "all-reduce"]
    assert [p.operand for p in summed.parts] == [1, 2] and summed.reduction == "add"
    assert "all-gathers carried out as all-reduces" in format_audit(a)


def test_combined_collective_attributes_each_operand_to_its_own_line():
    a = fixture_audit("v5px8/fsdp_step")
    (ar,) = [c for c in a.collectives if c.kind == "all-reduce"]
    assert ar.source == site("fsdp_up")  # the metadata the combiner kept
    assert [(p.operand, p.shape, p.user_source, p.phase) for p in ar.parts] == [
        (0, (256, 1024), site("fsdp_up"), "backward"),
        (1, (1024, 256), site("fsdp_down"), "backward"),
    ]
    # The table names both lines, not only the one the combiner kept.
    assert f"{site('fsdp_up')}, {site('fsdp_down')}" in format_audit(a, width=200)
    # the command line's default names the first and counts the other (--verbose: both)
    brief = format_audit(a, width=200, verbose=False)
    assert f"{site('fsdp_up')} +1 more" in brief
    assert f"{site('fsdp_up')}, {site('fsdp_down')}" not in brief


def test_concatenated_gradients_are_split_into_their_layers():
    a = fixture_audit("h100x8/flax_step")
    (data,) = [c for c in a.collectives if c.axes == ("data",)]
    # The combiner dropped the metadata: the scope all four sit in, their pass, the first
    # part's line and an operand line in the user's code (not Flax's linear.py).
    assert data.shape == (65536,) and data.scope == "Model" and data.phase == "backward"
    assert data.user_source == site("flax_up") and data.operand_source == site("flax_up")
    assert [(p.piece, p.payload_bytes, p.scope, p.user_source) for p in data.parts] == [
        (0, 32768, "Model/block_0/Dense_0", site("flax_up")),
        (1, 32768, "Model/block_0/Dense_1", site("flax_down")),
        (2, 32768, "Model/block_1/Dense_0", site("flax_up")),
        (3, 32768, "Model/block_1/Dense_1", site("flax_down")),
    ]


def test_library_frames_give_way_to_the_users_line():
    a = fixture_audit("h100x8/flax_step")
    fwd = [c for c in a.sorted_collectives() if c.phase == "forward"][0]
    assert fwd.source == "/venv/lib/python3.11/site-packages/flax/linen/linear.py:287"
    assert fwd.user_source == site("flax_down")
    assert fwd.stack[0] == fwd.source and site("flax_down") in fwd.stack[1]
    shown = f"{site('flax_down')} (in flax/linen/linear.py:287)"
    assert shown in format_audit(a, width=200)
    # the command line's default: the user's line alone (--verbose: the library's too)
    brief = format_audit(a, width=200, verbose=False)
    assert site("flax_down") in brief and "linen/linear.py" not in brief


def test_by_scope_splits_combined_collectives_by_layer():
    a = fixture_audit("h100x8/flax_step")
    rows = {(r.scope, r.axes, r.kind): r for r in a.by_scope()}
    assert sorted(rows) == [
        ("Model/block_0/Dense_0", "data", "all-reduce"),
        ("Model/block_0/Dense_1", "data", "all-reduce"),
        ("Model/block_0/Dense_1", "model", "all-reduce"),
        ("Model/block_1/Dense_0", "data", "all-reduce"),
        ("Model/block_1/Dense_0", "model", "all-reduce"),
        ("Model/block_1/Dense_1", "data", "all-reduce"),
        ("Model/block_1/Dense_1", "model", "all-reduce"),
    ]
    r = rows[("Model/block_1/Dense_0", "data", "all-reduce")]
    assert (r.count, r.payload_bytes, r.traffic_bytes, r.phases) == (1, 32768, 32768, ("backward",))
    assert r.sources == (site("flax_up"),)
    # Every byte of the table is in exactly one scope row.
    assert sum(r.traffic_bytes for r in a.by_scope()) == a.total().traffic_bytes
    assert a.to_dict()["by_scope"][0]["scope"] == "Model/block_0/Dense_0"
    text = format_audit(a, by_scope=True)
    assert "Model/block_1/Dense_0" in text and "by scope" in text


def test_by_scope_of_a_scanned_step_counts_every_trip_and_both_passes():
    a = fixture_audit("v5px64/fsdp_step")
    rows = {(r.scope, r.kind): r for r in a.by_scope()}
    gather = rows[("mlp", "all-gather")]
    assert gather.count == 9 and gather.phases == ("forward", "backward")
    assert gather.payload_bytes == 3 * (2 * 524288 + 65536 + 524288)
    assert rows[("mlp", "all-reduce")].count == 3


def test_forward_and_backward_of_a_train_step():
    a = fixture_audit("v5px8/tp_step")
    phases = {c.phase: c.axes for c in a.collectives}
    # Megatron: the forward all-reduces activations over model, the backward gradients
    # of the replicated-over-data weights over data.
    assert phases == {"forward": ("model",), "backward": ("data",)}


MARKERS = re.compile(r"direction=|dynamic-update-slice\(|all-reduce\(|constant\(|concatenate\(")


@functools.cache
def _text_and_spots(name: str) -> tuple[str, list[int]]:
    text = (FIXTURES / f"{name}.hlo").read_text()
    return text, [m.start() for m in MARKERS.finditer(text)]


@settings(derandomize=True, database=None, deadline=None, max_examples=40)
@given(data=st.data())
def test_fuzz_loops_and_gathers_of_mutated_text_raise_only_shardscope_errors(data):
    name = data.draw(st.sampled_from(["v5px64/fsdp_step", "h100x8/flax_step"]))
    text, spots = _text_and_spots(name)
    i = data.draw(st.sampled_from(spots)) + data.draw(st.integers(-40, 40))
    i = max(0, min(i, len(text) - 1))
    j = data.draw(st.integers(i, min(len(text), i + 12)))
    junk = data.draw(st.text(alphabet="{}()[],=%'-0123456789²<>T:abxy \n", max_size=6))
    try:
        audit(text[:i] + junk + text[j:], mesh=MESHES[name])
    except ShardscopeError:
        pass


def test_cli_audit_hlo_by_scope_on_real_gpu_output(capsys):
    from shardscope._src.cli.main import main

    path = str(FIXTURES / "h100x8" / "flax_step.hlo")
    assert main(["audit", "--hlo", path, "--mesh", "data=2,model=4", "--by-scope"]) == 0
    out = capsys.readouterr().out
    assert "by scope" in out and "Model/block_1/Dense_0" in out and "backward" in out
