"""The one rule for compiled bytes against a bound, and the compilers' capability records that
the verdict and the planner consult (pure: nothing here compiles)."""

from types import SimpleNamespace

import pytest

from shardscope._src.audit.records import Audit, Collective
from shardscope._src.audit.width import Width
from shardscope._src.base.comm import ALL_REDUCE, COLLECTIVE_PERMUTE, REDUCE_SCATTER
from shardscope._src.bounds.terms import Bound, Term, TermRole
from shardscope._src.check import Standing, standing, within_bound
from shardscope._src.check.compare import Verdict, VerdictNote, compare
from shardscope._src.plan.notes import PlanNote, ReduceScatterValues
from shardscope._src.targets.capabilities import (
    BY_PLATFORM,
    CPU_COMPILER,
    GPU_COMPILER,
    TPU_COMPILER,
    compiler_capabilities,
)
from shardscope._src.targets.specs import TARGETS
from shardscope._src.train.validate import reduce_scatter_note


@pytest.mark.parametrize(
    "compiled, bound, expected",
    [
        (100, 100, Standing.MATCHES),
        (105, 100, Standing.MATCHES),  # 5% over: the edge still matches
        (106, 100, Standing.EXCEEDS),
        (95, 100, Standing.MATCHES),  # 5% under: the edge still matches
        (94, 100, Standing.UNDERCUTS),
        (0, 0, Standing.MATCHES),
        (1, 0, Standing.EXCEEDS),  # a bound of none is matched only by none
        (2_100_000, 2_000_000, Standing.MATCHES),
        (2_100_001, 2_000_000, Standing.EXCEEDS),
        (1_899_999, 2_000_000, Standing.UNDERCUTS),
    ],
)
def test_compiled_bytes_stand_against_a_bound_two_sided(compiled, bound, expected):
    assert standing(compiled, bound) is expected
    assert within_bound(compiled, bound) is (expected is not Standing.EXCEEDS)


@pytest.mark.parametrize(
    "actual, optimal, standing_", [(94, True, "undercuts"), (105, True, "matches")]
)
def test_a_verdict_below_or_at_its_minimum_is_optimal(actual, optimal, standing_):
    v = Verdict("x", bound_bytes=100, actual_bytes=actual, rows=())
    assert v.optimal is optimal and v.standing == standing_
    assert not Verdict("x", bound_bytes=100, actual_bytes=106, rows=()).optimal


def _permute_bound(traffic: int) -> Bound:
    # A collective-permute sends its payload: the bound's bytes are ``traffic`` exactly.
    term = Term(COLLECTIVE_PERMUTE, ("x",), 2, traffic, 1, "w", role=TermRole.ACTIVATION)
    return Bound("permute", (term,), ())


def test_a_program_below_its_minimum_is_noted():
    # One all-reduce of 1024 f32 over 8 devices sends 2 * 7 * 4096 // 8 bytes.
    c = Collective(ALL_REDUCE, "ar", "main", ("x",), 8, "f32", (1024,), 4096, 2 * 7 * 4096 // 8, 1)
    audit = Audit((c,), {"x": 8}, 8, "m", backend="gpu")
    sent = 2 * 7 * 4096 // 8
    v = compare(audit, _permute_bound(2 * sent))
    assert v.actual_bytes == sent and v.bound_bytes == 2 * sent
    assert v.optimal and [n.kind for n in v.notes] == [VerdictNote.BELOW_BOUND]
    assert "less than the minimum, by more than 5%" in v.notes[0].text
    assert compare(audit, _permute_bound(sent)).notes == ()


def test_each_target_carries_its_compilers_record():
    assert {t.name: t.capabilities.compiler for t in TARGETS.values()} == {
        "cpu": "XLA:CPU",
        "a100": "XLA:GPU",
        "h100": "XLA:GPU",
        "h200": "XLA:GPU",
        "b200": "XLA:GPU",
        "tpu-v5e": "XLA:TPU",
        "tpu-v5p": "XLA:TPU",
        "tpu-v6e": "XLA:TPU",
    }
    for t in TARGETS.values():
        assert compiler_capabilities(t.family) is t.capabilities is BY_PLATFORM[t.family]
    assert compiler_capabilities("cuda") is GPU_COMPILER
    assert compiler_capabilities(None) is None and compiler_capabilities("metal") is None


def test_only_a_widening_compiler_has_its_collectives_narrowed():
    # An all-reduce over 8 of a (64, 8) f32 array and the f32 scalar loss, combined.
    c = Collective(
        ALL_REDUCE, "ar", "main", ("data",), 8, "f32", (64, 8), 64 * 8 * 4 + 4,
        2 * 7 * (64 * 8 * 4 + 4) // 8, 1, shapes=((64, 8), ()),
    )  # fmt: skip
    narrowed = 2 * 7 * (64 * 8 * 2 + 4) // 8  # the array at 2 bytes, the scalar at 4
    for backend, traffic in [
        ("cpu", narrowed),
        (None, narrowed),  # HLO text: the compiler is not known, the program's width is
        ("gpu", c.traffic_bytes),
        ("tpu", c.traffic_bytes),
    ]:
        assert Width.of(SimpleNamespace(backend=backend), "bfloat16").traffic(c) == traffic


def _scatter_bound() -> Bound:
    term = Term(REDUCE_SCATTER, ("data",), 8, 4096, 1, "grad", role=TermRole.GRADIENT_SCATTER)
    return Bound("fsdp", (term,), ())


@pytest.mark.parametrize(
    "compiler, forms", [(CPU_COMPILER, "never"), (TPU_COMPILER, "sometimes"), (GPU_COMPILER, None)]
)
def test_a_plan_notes_a_reduce_scatter_left_out_only_where_its_compiler_may(compiler, forms):
    note = reduce_scatter_note(_scatter_bound(), (), compiler)
    if forms is None:  # XLA:GPU forms reduce-scatters: one left out is the program's doing
        assert note is None
        return
    assert note is not None and note.kind is PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER
    assert note.values == ReduceScatterValues(compiler=compiler.compiler, forms=forms)
    assert note.text.startswith(compiler.compiler + " forms ")


def test_notes_written_before_their_kinds_were_renamed_read_back():
    assert PlanNote("cpu-all-reduce-for-reduce-scatter") is PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER
    assert PlanNote("cpu-widened") is PlanNote.WIDENED
    assert PlanNote("cpu-no-reduce-scatter") is PlanNote.NO_REDUCE_SCATTER
    assert VerdictNote("no-reduce-scatter-on-cpu") is VerdictNote.NO_REDUCE_SCATTER_FORMED
    # The former names stay the same kinds.
    assert PlanNote.CPU_ALL_REDUCE_FOR_REDUCE_SCATTER is PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER
    assert PlanNote.CPU_WIDENED is PlanNote.WIDENED
    assert PlanNote.CPU_NO_REDUCE_SCATTER is PlanNote.NO_REDUCE_SCATTER
    with pytest.raises(ValueError):
        PlanNote("cpu-no-such-note")
