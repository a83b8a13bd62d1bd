"""The closed vocabularies: each member is its JSON string, bad values name the choices, and
each knob's default is the documented one. No devices needed beyond the suite's CPU ones."""

import inspect
import json

import pytest

import shardscope
from shardscope._src.audit.diff import DiffRow, RowStatus
from shardscope._src.base.comm import KINDS, CollectiveKind, traffic_bytes
from shardscope._src.base.errors import PlanError, ShardscopeError, StrategyError
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.hlo.groups import GroupMode
from shardscope._src.model.config import MODES, REMATS, Mode, ModelConfig, Remat
from shardscope._src.plan.estimates import (
    Fp8SavedInputs,
    MatmulDtype,
    estimate_memory,
    model_flops,
)
from shardscope._src.plan.request import PlanRequest
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import Role, get_strategy
from shardscope._src.train.candidates import screen
from shardscope._src.train.sweep import plan
from shardscope._src.train.timing import OverlapClass, step_bound
from shardscope._src.verdict import transformer_verdict

TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=1, batch=8, seq=8)

# Each vocabulary's strings as the JSON, the HLO and the command line spell them.
SPELLED = [
    (
        CollectiveKind,
        [
            "all-reduce",
            "all-gather",
            "reduce-scatter",
            "all-to-all",
            "ragged-all-to-all",
            "collective-permute",
            "collective-broadcast",
        ],
    ),
    (Mode, ["train", "forward"]),
    (Remat, ["none", "selective", "matmuls", "full", "offload"]),
    (Role, ["data", "model", "context", "replica", "expert"]),
    (MatmulDtype, ["bfloat16", "fp8"]),
    (Fp8SavedInputs, ["high-precision", "fp8"]),
    (
        OverlapClass,
        [
            "critical",
            "per-microbatch",
            "gradients",
            "gradient-reduction",
            "parameter-gather",
            "context-ring",
        ],
    ),
    (RowStatus, ["new", "gone", "changed", "same"]),
    (GroupMode, ["replica", "partition", "replica_and_partition", "flattened"]),
]


@pytest.mark.parametrize("vocab, strings", SPELLED, ids=[v.__name__ for v, _ in SPELLED])
def test_each_member_is_its_string(vocab, strings):
    assert [m.value for m in vocab] == strings
    for member, text in zip(vocab, strings, strict=True):
        assert member == text and hash(member) == hash(text)
        assert vocab.parse(text) is member
        # Written, formatted and printed as the plain string.
        assert json.dumps({member: [member]}) == json.dumps({text: [text]})
        assert f"{member}" == text and repr(member) == repr(text)
        assert repr((member,)) == repr((text,))


def test_a_bad_value_names_itself_and_the_choices():
    choices = "none, selective, matmuls, full, offload"
    with pytest.raises(ShardscopeError, match=rf"^Remat 'some': choose one of {choices}$"):
        Remat.parse("some")
    with pytest.raises(PlanError, match=r"^mode 'eval': choose one of train, forward$") as e:
        Mode.parse("eval", what="mode", error=PlanError, param="mode")
    assert e.value.params == ("mode",)
    assert Mode.get(["train"]) is None  # unhashable values are not members either


def test_the_tuples_list_the_members_in_order():
    assert KINDS == tuple(CollectiveKind) and KINDS[0] == "all-reduce"
    assert MODES == (Mode.TRAIN, Mode.FORWARD)
    assert REMATS == (Remat.NONE, Remat.SELECTIVE, Remat.MATMULS, Remat.FULL, Remat.OFFLOAD)


def test_public_functions_take_the_plain_strings_and_the_members_alike():
    assert traffic_bytes("all-gather", 8 * 1024, 8) == traffic_bytes(
        CollectiveKind.ALL_GATHER, 8 * 1024, 8
    )
    assert traffic_bytes("all-gather", 8 * 1024, 8) == 7 * 8 * 1024 // 8
    placement = get_strategy("tp").place(TINY, "model=8")
    assert transformer_bound(placement, "train") == transformer_bound(placement, Mode.TRAIN)
    assert placement.axes == {"model": ("model",)}
    assert placement.axes[Role.MODEL] == ("model",)


def test_a_bad_mode_is_refused_by_each_front_door():
    placement = get_strategy("tp").place(TINY, "model=8")
    for call in (
        lambda: build_reference_program(placement, mode="eval"),
        lambda: transformer_bound(placement, "eval"),
    ):
        with pytest.raises(StrategyError, match=r"mode 'eval': choose one of train, forward"):
            call()
    with pytest.raises(PlanError, match=r"mode 'eval': choose one of train, forward"):
        plan(TINY, 8, hardware="h100", mode="eval")


def _default(fn, name="mode"):
    return inspect.signature(fn).parameters[name].default


def test_the_reference_programs_default_to_forward_and_the_planner_to_train():
    # As Mode's docstring documents.
    for fn in (build_reference_program, transformer_bound, transformer_verdict):
        assert _default(fn) == "forward", fn.__name__
    for fn in (screen, estimate_memory, step_bound, model_flops):
        assert _default(fn) == "train", fn.__name__
    # plan() takes its knobs as the request's fields, with the request's defaults
    assert PlanRequest().mode == "train"


def test_a_diff_row_writes_its_status_as_the_string():
    row = DiffRow("model", "all-gather", 0, 1, 0, 448, 0, 512)
    assert row.status is RowStatus.NEW
    assert json.loads(json.dumps(row.to_dict()))["status"] == "new"
    gone = DiffRow("model", "all-gather", 1, 0, 448, 0, 512, 0)
    assert gone.status is RowStatus.GONE


def test_the_old_name_of_build_reference_program_still_works():
    assert shardscope.build_program is shardscope.build_reference_program
    assert "build_reference_program" in shardscope.__all__
