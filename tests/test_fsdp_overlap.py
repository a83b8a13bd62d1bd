"""FSDP's weight gathers and gradient reduce-scatters beside compute (``fsdp_overlap``, on by
default) or alone on the critical path (unset: a JAX program's scanned layers under XLA's
default GPU flags)."""

import pytest

from shardscope import ShardscopeError, hardware
from shardscope._src.base.comm import ALL_GATHER
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.compute import matmul_seconds
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.collectives import PlanCollective
from shardscope._src.plan.estimates import Schedule
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.timing import (
    PER_MICROBATCH_FWD_BWD,
    PER_STEP_BWD,
    CommItem,
    StepWork,
    comm_items,
    compiled_comm_items,
    step_bound,
    step_time,
)

M = 4
FLOPS = 1e13  # a micro-batch's forward: about 28 ms of forward and backward on an H100
#: the step's FSDP gathers and reduce-scatters (shorter than the compute they hide behind,
#: holding no multiprocessors), and a once-a-step gradient reduction behind the last backward
GATHERS, REDUCTION = 0.04, 0.002


def _work() -> StepWork:
    return StepWork(
        microbatches=M, stages=1, fwd_flops=FLOPS, recompute_flops=0.0, act_bytes=0,
        recompute_act_bytes=0, p2p_bytes=0, p2p_bandwidth=1e9, optimizer_params=0,
        model_flops=0, devices=1,
    )  # fmt: skip


COMM = [
    CommItem("gathers and reduce-scatters", PER_MICROBATCH_FWD_BWD, GATHERS, 0.0, "all-gather"),
    CommItem("gradient reduction", PER_STEP_BWD, REDUCTION, 0.0, "all-reduce"),
]


def test_unset_the_step_pays_fsdps_collectives_in_full_and_hides_the_others_as_before():
    on, off = hardware("h100"), hardware("h100", fsdp_overlap=False)
    compute = matmul_seconds(on, 3 * FLOPS)  # one micro-batch's forward and backward
    assert GATHERS / M < compute and REDUCTION < 2 * compute / 3
    # by default both hide behind the compute they run beside
    assert step_time(on, _work(), COMM).step_s == pytest.approx(M * compute, rel=1e-12)
    # unset, each micro-batch waits for its gathers and reduce-scatters; the step's gradient
    # reduction still hides behind the last backward
    t = step_time(off, _work(), COMM)
    assert t.step_s == pytest.approx(M * compute + GATHERS, rel=1e-12)
    assert t.data_exposed_s == pytest.approx(GATHERS, rel=1e-12)
    assert sum(t.parts().values()) == pytest.approx(t.step_s, rel=1e-12)


def test_fsdp_overlap_is_true_or_false_and_the_command_line_sets_it():
    assert hardware("h100").fsdp_overlap is True
    with pytest.raises(ShardscopeError, match="fsdp_overlap='no'.*True or False"):
        hardware("h100", fsdp_overlap="no")
    for flag, want in (("--fsdp-overlap", True), ("--no-fsdp-overlap", False)):
        args = build_parser().parse_args(["plan", "--model", "tiny", "--devices", "8", flag])
        assert dict(command_config(args).hardware_overrides) == {"fsdp_overlap": want}


def test_the_forwards_gathers_hide_behind_the_forward_alone_and_the_rest_behind_the_backward():
    hw = hardware("h100")
    fwd = matmul_seconds(hw, FLOPS)  # one micro-batch's forward; its backward twice that
    # Per micro-batch: the forward's gathers take 1.5 forwards, the backward's gathers and
    # reduce-scatters half a forward. Together (2 forwards) they fit the micro-batch's 3.
    ahead, behind = 1.5 * fwd, 0.5 * fwd
    gathers = CommItem(
        "gathers and reduce-scatters", PER_MICROBATCH_FWD_BWD, M * (ahead + behind), 0.0,
        "all-gather", forward_s=M * ahead,
    )  # fmt: skip
    t = step_time(hw, _work(), [gathers])
    # The forward waits for its weights: what its gathers take beyond it is exposed each
    # micro-batch, whatever room the backward has.
    assert t.data_exposed_s == pytest.approx(M * (ahead - fwd), rel=1e-12)
    assert t.step_s == pytest.approx(M * (3 * fwd + ahead - fwd), rel=1e-12)
    # The same seconds all in the backward hide behind it.
    later = CommItem("gathers", PER_MICROBATCH_FWD_BWD, M * (ahead + behind), 0.0, "all-gather")
    assert step_time(hw, _work(), [later]).step_s == pytest.approx(M * 3 * fwd, rel=1e-12)
    # Unset, both run alone as before.
    off = step_time(hardware("h100", fsdp_overlap=False), _work(), [gathers])
    assert off.step_s == pytest.approx(M * (3 * fwd + ahead + behind), rel=1e-12)


def test_a_compiled_programs_fsdp_gathers_are_the_forwards_up_to_the_formulas_bytes():
    config = ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=8, seq=16)
    # Per layer: two norm gains, wqkv (64, 3 * 64), wo (64, 64), w_up and w_down (64, 256); f32.
    params = 2 * (64 + 64 * 3 * 64 + 64 * 64 + 64 + 2 * 64 * 256) * 4
    placement = get_strategy("fsdp").place(config, abstract_mesh("data=8"))
    bound = step_bound(placement, Schedule(microbatches=1, remat="none"))
    # Each device receives the 7 shards of every weight it lacks, in the forward, and again
    # for the backward (no recomputation keeps them).
    first = again = params * 7 // 8
    hw = hardware("h100")

    def gather(traffic: int) -> PlanCollective:
        return PlanCollective(
            ALL_GATHER, ("data",), 8, 1, True, False, "f32", traffic * 8 // 7, traffic * 8 // 7,
            traffic, traffic, "all-gather", None,
        )  # fmt: skip

    # A program that gathers once and keeps the weights: all its gathers are the forward's.
    (kept,) = compiled_comm_items(hw, placement, [gather(first)], bound)
    assert kept.forward_s == kept.seconds > 0
    # One that gathers again for the backward: the forward's up to the formula's bytes.
    (both,) = compiled_comm_items(hw, placement, [gather(first + again)], bound)
    assert both.forward_s == pytest.approx(both.seconds / 2, rel=1e-12)
    # Split over two collectives, the second is the backward's.
    one, two = compiled_comm_items(hw, placement, [gather(first), gather(again)], bound)
    assert (one.forward_s, two.forward_s) == (one.seconds, 0.0)
    # The formula's own: the forward's gathers and those again, the same bytes over the same
    # devices, so the same seconds.
    items = comm_items(hw, placement, bound.terms)
    ahead = sum(i.forward_s for i in items)
    gathered = sum(i.seconds for i in items if i.kind == ALL_GATHER)
    assert ahead == pytest.approx(gathered / 2, rel=1e-12) and ahead > 0
