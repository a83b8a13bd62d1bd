"""Forms of compiled text the CPU backend never prints: a permute the GPU compiler combined
from several arrays, and computations the TPU compiler runs on its sparsecore thread."""

from pathlib import Path

import pytest

from shardscope import audit
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.render.audit import format_audit

FIXTURES = Path(__file__).parent / "fixtures"
GENERATOR = (FIXTURES / "hlo_targets" / "generate.py").read_text().splitlines()


def site(name: str) -> str:
    (line,) = [i + 1 for i, t in enumerate(GENERATOR) if t.rstrip().endswith(f"# site: {name}")]
    return f"generate.py:{line}"


def test_a_combined_permute_moves_every_operand():
    text = (FIXTURES / "hlo_targets" / "h100x8" / "combined_collectives.hlo").read_text()
    a = audit(text, mesh="x=8")
    (permute,) = [c for c in a.collectives if c.kind == "collective-permute"]
    # Each device holds 128 / 8 = 16 rows of s32[., 2], f32[., 2] and bf16[., 64].
    rows = 128 // 8
    sizes = [rows * 2 * 4, rows * 2 * 4, rows * 64 * 2]
    assert permute.shapes == ((rows, 2), (rows, 2), (rows, 64))
    assert permute.payload_bytes == sum(sizes)
    assert permute.traffic_bytes == sum(sizes)  # a ring permute sends its whole buffer
    assert [p.payload_bytes for p in permute.parts] == sizes
    assert [p.user_source for p in permute.parts] == [
        site("cc_permute_a"),
        site("cc_permute_b"),
        site("cc_permute_c"),
    ]
    assert permute.is_async and permute.phase == "forward"


def test_sparsecore_computations_are_read_with_the_rest():
    text = (FIXTURES / "hlo_handwritten" / "sparsecore.hlo").read_text()
    module = parse_hlo(text)
    threads = {name: c.execution_thread for name, c in module.computations.items()}
    assert threads["sc_gather"] == threads["sc_reduce_scatter"] == "sparsecore"
    assert threads["main"] == threads["add"] == "main"
    a = audit(text, mesh="x=4")
    assert a.execution_threads == ("sparsecore",) and a.unknown_instructions == ()
    kinds = {c.kind: c for c in a.collectives}
    assert sorted(kinds) == ["all-gather", "all-reduce", "reduce-scatter"]
    rs = kinds["reduce-scatter"]
    assert (rs.computation, rs.count, rs.is_async) == ("sc_reduce_scatter", 1, True)
    assert rs.payload_bytes == 32 * 16 * 4  # the operand, f32[32,16]
    assert "'sparsecore' execution thread" in format_audit(a, width=160)
    assert a.to_dict()["execution_threads"] == ["sparsecore"]


@pytest.mark.parametrize("closing", ["}, execution_thread=", "} execution_thread"])
def test_a_computation_closed_with_words_it_cannot_read_is_refused(closing):
    from shardscope import HloParseError

    text = (FIXTURES / "hlo_handwritten" / "sparsecore.hlo").read_text()
    broken = text.replace('}, execution_thread="sparsecore"', closing, 1)
    with pytest.raises(HloParseError):
        parse_hlo(broken)
