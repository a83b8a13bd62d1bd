"""A pipeline's transfers beside the steady 1F1B phase's compute (``pp_overlap``: Megatron's
overlap_p2p_comm), the fill's and the flush's on the critical path."""

import pytest

from shardscope import ShardscopeError, hardware
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.compute import matmul_seconds
from shardscope._src.train.timing import StepWork, step_time

# 4 stages of 2 virtual stages each, 8 micro-batches; each transfer's bytes take a
# millisecond at the bandwidth (and one latency more), holding an eighth of the
# multiprocessors while it runs
P, V, M = 4, 2, 8
TRANSFER = 1e-3


def _work(fwd_flops: float) -> StepWork:
    return StepWork(
        microbatches=M, stages=P, virtual_stages=V, fwd_flops=fwd_flops, recompute_flops=0.0,
        act_bytes=0, recompute_act_bytes=0, p2p_bytes=TRANSFER * 1e9, p2p_bandwidth=1e9,
        optimizer_params=0, model_flops=0, devices=P, p2p_held=1 / 8,
    )  # fmt: skip


def _chunk(hw, fwd_flops: float) -> float:
    # a chunk of one micro-batch: 1/V of the stage's forward and backward (3x its FLOPs)
    return matmul_seconds(hw, 3 * fwd_flops) / V


def test_steady_transfers_hide_behind_their_chunk_and_hold_their_share_of_it():
    off = hardware("h100")
    on = hardware("h100", pp_overlap=True)
    one = off.latency_s + TRANSFER
    flops = 1e13  # a chunk of about 28 ms, far longer than its two transfers
    chunk = _chunk(off, flops)
    assert 2 * one < chunk
    # without overlap every one of the V M + P - 1 slots waits for its two transfers
    assert step_time(off, _work(flops), []).step_s == pytest.approx(
        (V * M + P - 1) * (chunk + 2 * one), rel=1e-12
    )
    # with it the V M steady chunks take the compute the transfers' multiprocessors take
    # from them (an eighth of their time), and the P - 1 slots of the fill and flush wait
    steady = V * M * (chunk + 2 * one / 8)
    assert step_time(on, _work(flops), []).step_s == pytest.approx(
        steady + (P - 1) * (chunk + 2 * one), rel=1e-12
    )


def test_transfers_longer_than_their_chunk_are_exposed_by_what_the_chunk_does_not_cover():
    on = hardware("h100", pp_overlap=True)
    one = on.latency_s + TRANSFER
    flops = 1e11  # a chunk of about 0.28 ms beside 2 ms of transfers
    chunk = _chunk(on, flops)
    assert chunk < 2 * one
    assert step_time(on, _work(flops), []).step_s == pytest.approx(
        V * M * 2 * one + (P - 1) * (chunk + 2 * one), rel=1e-12
    )


def test_one_stage_has_nothing_to_overlap():
    work = StepWork(
        microbatches=M, stages=1, fwd_flops=1e13, recompute_flops=0.0, act_bytes=0,
        recompute_act_bytes=0, p2p_bytes=1e6, p2p_bandwidth=1e9, optimizer_params=0,
        model_flops=0, devices=1, p2p_held=1 / 8,
    )  # fmt: skip
    assert (
        step_time(hardware("h100", pp_overlap=True), work, []).step_s
        == step_time(hardware("h100"), work, []).step_s
    )


def test_pp_overlap_is_true_or_false():
    with pytest.raises(ShardscopeError, match="pp_overlap='yes'.*True or False"):
        hardware("h100", pp_overlap="yes")


@pytest.mark.parametrize(("flag", "want"), [(["--pp-overlap"], {"pp_overlap": True}),
                                            (["--no-pp-overlap"], {"pp_overlap": False}),
                                            ([], {})])  # fmt: skip
def test_the_command_line_sets_pp_overlap_over_the_preset(flag, want):
    args = build_parser().parse_args(["plan", "--model", "tiny", "--devices", "8", *flag])
    assert dict(command_config(args).hardware_overrides) == want


@pytest.mark.parametrize("pp_overlap", [False, True])
def test_the_steps_parts_add_up_to_it_and_the_transfers_are_what_the_slots_wait_for(pp_overlap):
    hw = hardware("h100", pp_overlap=pp_overlap)
    flops = 1e13
    t = step_time(hw, _work(flops), [])
    assert sum(t.parts().values()) == pytest.approx(t.step_s, rel=1e-12)
    one = hw.latency_s + TRANSFER
    # without overlap each of the V M steady slots waits for its two transfers; with it,
    # a chunk far longer than they are leaves only their multiprocessors' share exposed
    steady = V * M * 2 * one * (1 / 8 if pp_overlap else 1)
    assert t.p2p_exposed_s == pytest.approx(steady, rel=1e-9)
    assert t.parts()["pipeline bubble"] == pytest.approx((P - 1) * (_chunk(hw, flops) + 2 * one))
