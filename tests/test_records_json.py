"""Records as JSON: one generic serialization (``record_dict``) and the few shapes it cannot
know (irregular replica groups, unplaced leaves, renamed plan keys)."""

import enum
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

import shardscope
from shardscope._src.base.comm import Totals
from shardscope._src.base.records import Record, json_value, record_dict
from shardscope._src.plan.estimates import MemoryEstimate
from shardscope._src.program.program import ProgramPlan
from shardscope._src.targets.specs import TARGETS, get_target
from shardscope._src.train.types import Plan

FIXTURES = Path(__file__).parent / "fixtures" / "hlo"


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Inner(Record):
    n: int


@dataclass(frozen=True)
class Outer:
    name: str
    inners: tuple[Inner, ...]
    by_device: dict[int, int]
    colour: Colour
    hidden: str = field(default="", repr=False)

    @property
    def size(self) -> int:
        return len(self.inners)

    def total(self) -> int:
        return sum(i.n for i in self.inners)


def test_record_dict_renames_omits_and_adds_properties_and_methods():
    rec = Outer("a", (Inner(2), Inner(3)), {0: 5, 7: 1}, Colour.RED, hidden="x")
    assert record_dict(
        rec, keys={"name": "label", "total": "sum"}, omit=("hidden",), extra=("size", "total")
    ) == {
        "label": "a",
        "inners": [{"n": 2}, {"n": 3}],
        "by_device": {"0": 5, "7": 1},
        "colour": "red",
        "size": 2,
        "sum": 5,
    }
    assert json_value(rec)["hidden"] == "x"  # a record without to_dict: every field


def test_a_record_mixin_serializes_its_fields():
    assert Inner(4).to_dict() == record_dict(Inner(4)) == {"n": 4}
    assert Totals(2, 64, 112).to_dict() == {"count": 2, "payload_bytes": 64, "traffic_bytes": 112}


def test_replica_groups_are_listed_when_irregular_not_where_the_axes_name_them():
    regular = (FIXTURES / "psum_3d.hlo").read_text()
    irregular = regular.replace("{{0,2},{1,3},{4,6},{5,7}}", "{{0,3},{1,2},{4,7},{5,6}}")
    assert irregular != regular
    for text, groups in ((regular, None), (irregular, [[0, 3], [1, 2], [4, 7], [5, 6]])):
        data = json.loads(json.dumps(shardscope.audit(text, mesh="a=2,b=2,c=2").to_dict()))
        second = next(c for c in data["collectives"] if c["group_size"] == 2)
        assert second["irregular"] is (groups is not None)
        assert second["groups"] == groups
        assert all(c["pairs"] is None for c in data["collectives"])  # no permutes
        assert data["module"] and "module_name" not in data and "hlo_text" not in data


def test_an_unplaced_leaf_has_no_spec_sharding_or_mesh():
    leaf = shardscope.tree_layout({"b": np.zeros(3, np.float32)})["b"]  # on the host
    assert leaf.layout is None
    assert leaf.to_dict() == {
        "path": "b",
        "shape": [3],
        "dtype": "float32",
        "nbytes": 12,
        "max_device_bytes": 12,
        "replication": None,
        "spec": None,
        "sharding": None,
        "mesh_axes": None,
    }


def test_plans_write_their_estimates_under_the_plan_keys():
    common = dict(
        mesh={"data": 2, "model": 4},
        compiled_memory={"argument_size_in_bytes": 100, "temp_size_in_bytes": 20},
        memory_limit_bytes=1000,
        collectives=(),
        comm=(),
        comm_time_s=1.0,
        flops_per_device=8.0,
        compute_time_s=3.0,
    )
    mem = MemoryEstimate(1, 2, 3, 4, 5)
    plan = Plan(
        "dp", "data parallel", memory=mem, bound_bytes_per_device=0, bound_comm_time_s=0.0, **common
    ).to_dict()
    program = ProgramPlan("dp", (("batch", "data"),), **common, same_as="tp data=2,model=4")
    data = program.to_dict()
    for d in (plan, data):
        assert d["mesh"] == "data=2,model=4" and d["mesh_shape"] == {"data": 2, "model": 4}
        assert d["step_time_s"] == 4.0 and d["step_time_overlap_s"] == 3.0
        assert d["comm_bytes_per_device"] == 0 and "memory_limit_bytes" not in d
    assert plan["memory_bytes_per_device"] == 15 and plan["memory"]["total"] == 15
    assert plan["compiled_memory_bytes_per_device"] == 120 and plan["bound_ratio"] == 1.0
    assert data["memory_bytes_per_device"] == 120 and data["memory_source"] == "compiled"
    assert data["same_program_as"] == "tp data=2,model=4" and "same_as" not in data
    assert data["rules"] == [["batch", "data"]]


def _plan(**kw):
    """A plan of 15 bytes estimated per device (5 of them optimizer state), 1000 available."""
    return Plan(
        "dp", "data parallel", {"data": 8}, MemoryEstimate(1, 2, 5, 3, 4),
        compiled_memory={"argument_size_in_bytes": 100}, memory_limit_bytes=1000,
        collectives=(), comm=(), bound_bytes_per_device=0, bound_comm_time_s=0.0,
        comm_time_s=0.0, flops_per_device=0.0, compute_time_s=0.0, **kw,
    )  # fmt: skip


def test_a_plan_writes_the_name_of_its_compiler_and_reads_it_back_as_the_target():
    screened = _plan()
    assert screened.compiled_by is TARGETS["cpu"]
    on_h100 = _plan(compiled_by=TARGETS["h100"], target_memory={"temp_size_in_bytes": 64})
    for plan, name in ((screened, "cpu"), (on_h100, "h100")):
        data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
        assert data["compiled_by"] == name
        # In its place among the fields: just before the target's memory.
        keys = list(data)
        assert keys.index("compiled_by") == keys.index("target_memory") - 1
        assert get_target(data["compiled_by"]) == plan.compiled_by
        # The name as the JSON has it gives back the same plan.
        assert replace(plan, compiled_by=data["compiled_by"]) == plan


def test_a_plan_an_accelerator_compiled_is_judged_by_that_compilers_memory():
    assert _plan().fits and _plan().fit_memory_source == "estimate"
    # The same plan, had the H100 compiler given it 2000 bytes of buffers: the estimate's 15
    # would fit, the compiler's 2000 and the optimizer state's 5 do not.
    big = {"temp_size_in_bytes": 2000}
    on_h100 = _plan(compiled_by=TARGETS["h100"], target_memory=big)
    assert on_h100.compiled_by_accelerator and not on_h100.fits
    assert on_h100.fit_memory_bytes_per_device == 2005
    assert on_h100.fit_memory_source == "h100 compiler"
    # On the CPU, a buffer assignment is the simulated devices', not a verdict on the fit.
    on_cpu = _plan(compiled_by=TARGETS["cpu"], target_memory=big)
    assert not on_cpu.compiled_by_accelerator and on_cpu.fits
    assert on_cpu.fit_memory_bytes_per_device == 15
    # An H100 compile that found no memory for the program: it does not fit.
    assert not _plan(compiled_by=TARGETS["h100"], target_error="Ran out of memory").fits


def test_each_planner_says_what_priced_the_step_it_ranks_by():
    # A training candidate's screen is the time model alone; the plan compiled from it is
    # the compiled program, its screen kept beside it; suggest's screen is an estimate. The
    # source is no field: the JSON stays as it was.
    from shardscope._src.model.presets import model_preset
    from shardscope._src.plan.rank import StepCost, StepSource
    from shardscope._src.suggest.suggest import Screen
    from shardscope._src.train.candidates import Candidate, estimate

    c = Candidate("fsdp", (("data", 64),), microbatches=2, remat="full")
    screened = estimate(c, model_preset("7b").config(batch=128))
    compiled = _plan(time=replace(screened.time, step_s=0.5), estimated_time=screened.time)
    screen = Screen(argument_bytes_per_device=1, compute_time_s=2.0, comm_time_s=3.0, fits=True)
    assert (screened.step_source, compiled.step_source, screen.step_source) == (
        StepSource.ESTIMATED,
        StepSource.COMPILED,
        StepSource.ESTIMATED,
    )
    assert all(isinstance(r, StepCost) for r in (screened, compiled, screen))
    assert screened.step_time_s == screened.time.step_s == compiled.estimated_time.step_s
    assert compiled.step_time_s == 0.5 and screen.step_time_s == 5.0
    assert "step_source" not in compiled.to_dict() and "step_source" not in screened.to_dict()


#: A note of every plan kind as its values' mapping (the JSON's "values", key order too),
#: the optional keys of some left out and None values of others kept.
NOTE_VALUES = {
    "all-replicated": {
        "devices": 8,
        "split": "batch->data on data=8",
        "saved_s": 0.0,
        "comm_s": 1e-5,
    },
    "keep-own": {
        "proposals": 4,
        "fitting": 4,
        "rules_name": "dp_tp",
        "mesh": "data=4,model=2",
        "step_s": 2.23e-3,
        "memory_bytes": 369_205_248,
        "settled": False,
    },
    "negligible-names": {
        "names": ["norm", "bias"],
        "bytes": 55_296,
        "arguments_bytes": 245_465_088,
        "share": 0.01,
    },
    "repeated-work": {
        "label": "dp data=8,model=4",
        "what": "the best",
        "devices": 32,
        "working": 8.0,
        "copies": 4.0,
    },
    "all-reduce-for-reduce-scatter": {"compiler": "XLA:CPU", "forms": "never"},
    "rematerialization": {"sites": ["a.py:1", "b.py:2"]},
    "inexact": {},
    "per-microbatch-reduction": {},
    "pipeline-stage": {"stages": 4, "layers": 2, "of_layers": 7, "devices": 16},
    "compiled-by-target": {
        "target": "h100",
        "error": "out of memory",
        "room_bytes": 5,
        "optimizer_bytes": 3,
    },  # fmt: skip
    "fit-on-estimate": {
        "compiler": "XLA:CPU",
        "compiled_bytes": 6,
        "optimizer_bytes": 2,
        "estimate_bytes": 5,
        "stages": 1,
    },  # fmt: skip
    "target-compile-failed": {"target": "h100", "error": "it broke"},
    "memory-pressure": {
        "compiler": "XLA:GPU",
        "limit_bytes": 1,
        "reached_bytes": 3,
        "original_bytes": 4,
    },  # fmt: skip
    "compiled-flops": {"compiler": "XLA:GPU", "formula": 2.5e12, "compiled": None},
    "ragged-dot-dense": {"compiler": "XLA:CPU", "count": 3, "groups": [8, 16]},
    "unused-rules": {"rule_set": "tp_seq", "rules": [["sequence", "model"], ["x", ["a", "b"]]]},
    "analytic-memory": {},
    "compiled-memory": {"target": None},
    "communication": {},
    "time-model": "h100",
    "program-time-model": "tpu-v5e",
    "fp8-matmuls": {
        "name": "h100",
        "fp8_peak_flops": 1.9e15,
        "fp8_matmul_fraction": 0.5,
        "dtype": "bfloat16",
    },  # fmt: skip
    "widened": {"dtype": "bfloat16", "itemsize": 2, "compiler": "XLA:CPU"},
    "no-reduce-scatter": {"compiler": "XLA:TPU", "forms": "sometimes"},
    "target-compiler-missing": {"target": "h100", "extra": "gpu-compile"},
    "recompiled-by-target": {"target": "h100", "ranks": [1, 3]},
    "no-flop-count": {},
    "identical-programs": {"same": [["fsdp data=8", "dp", "data=8"]]},
    "experts-unsplit": {"labels": ["fsdp data=8", "dp data=8"]},
    "not-compiled": {
        "strategies": ["zero1_sp"],
        "labels": ["zero1_sp data=4,model=2"],
        "estimates": [1.04],
    },  # fmt: skip
    "mixture-step": {
        "runs": 53,
        "signed_median": -0.178,
        "within_25": 28,
        "fastest": -0.626,
        "slowest": 0.368,
        "best_signed_median": -0.381,
    },
    "mixture-fp8": {},
    "no-fit": {
        "label": "dp data=8",
        "need": 9,
        "have": 8,
        "hardware": "h100",
        "searched": False,
        "pinned": ["remat none"],
        "pinned_params": ["remat"],
    },  # fmt: skip
    "target-out-of-memory": {"target": "h100", "count": 2, "label": "dp data=8", "error": None},
    "no-target-fit": {
        "target": "h100",
        "label": "dp data=8",
        "have": 8,
        "need": 9,
        "hardware": "h100",
    },  # fmt: skip
    "no-plan": {
        "what": "tiny",
        "devices": 8,
        "skipped": {"memory": 3},
        "limit": 8,
        "hardware": "h100",
        "least_devices": 9,
        "least_devices_offloaded": 3,
    },  # fmt: skip
}


@pytest.mark.parametrize("kind", sorted(NOTE_VALUES))
def test_a_plan_notes_values_are_a_record_whose_json_is_the_mapping_it_was(kind):
    from shardscope._src.base.notes import Note, NoteValues
    from shardscope._src.plan.notes import PlanNote
    from shardscope._src.targets.hardware import hardware

    given = NOTE_VALUES[kind]
    mapping = hardware(given).to_dict() if isinstance(given, str) else given
    note = Note(PlanNote(kind), mapping)
    record = note.values
    assert isinstance(record, NoteValues)
    # the JSON is the mapping's, key for key and in its order; the words are the same
    data = json.loads(json.dumps(note.to_dict(), allow_nan=False))
    assert data["values"] == mapping and list(data["values"]) == list(mapping)
    assert Note(PlanNote(kind), record) == note and str(Note(PlanNote(kind), record)) == str(note)
    assert PlanNote(kind).describe(mapping) == note.text
    # read by key as the mapping was (code written against the dicts), by attribute in ours
    assert all(record[k] == v for k, v in mapping.items())


def test_a_plan_notes_values_are_read_by_attribute_and_refuse_what_their_kind_lacks():
    from shardscope._src.base.notes import Note
    from shardscope._src.plan.notes import NoFitValues, PlanNote, WidenedValues
    from shardscope._src.plan.types import no_fit_note

    note = no_fit_note("dp data=8", 9, 8, "h100")
    assert note.values == NoFitValues(label="dp data=8", need=9, have=8, hardware="h100",
                                      searched=True)  # fmt: skip
    assert (note.values.need, note.values.have, note.values.searched) == (9, 8, True)
    with pytest.raises(TypeError, match="NoFitValues has no field 'needs'"):
        Note(PlanNote.NO_FIT, {"label": "x", "needs": 9, "have": 8, "hardware": "h100",
                               "searched": True})  # fmt: skip
    with pytest.raises(TypeError, match="'no-fit' note's values are a NoFitValues"):
        Note(PlanNote.NO_FIT, WidenedValues(dtype="bfloat16", itemsize=2, compiler="XLA:CPU"))
