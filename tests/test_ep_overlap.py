"""A mixture's expert all-to-alls beside another micro-batch's compute (``ep_overlap``:
Megatron's combined 1F1B schedule), each beside the one sub-module the schedule pairs it
with, the chunks that run alone waiting for theirs."""

from dataclasses import replace

import pytest

from shardscope import ShardscopeError, hardware
from shardscope._src.base.comm import ALL_TO_ALL
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.compute import matmul_seconds
from shardscope._src.train.timing import CRITICAL, CommItem, StepWork, step_time

M = 8
FLOPS = 1e13  # a micro-batch's forward: about 28 ms of forward and backward a chunk
#: the step's all-to-alls, holding a quarter of the multiprocessors while they run, and a
#: tensor-parallel all-reduce beside them that stays on the critical path
EXCHANGE, REDUCE = 0.08, 0.016


def _work(
    stages: int = 1, virtual: int = 1, experts: float = FLOPS / 2, share: float = 1.0
) -> StepWork:
    # half the forward is the experts' by default: each of a layer's four all-to-alls
    # then has more compute beside it than it takes
    return StepWork(
        microbatches=M, stages=stages, virtual_stages=virtual, fwd_flops=FLOPS,
        recompute_flops=0.0, act_bytes=0, recompute_act_bytes=0, p2p_bytes=0,
        p2p_bandwidth=1e9, optimizer_params=0, model_flops=0, devices=stages,
        expert_flops=experts, expert_layer_share=share,
    )  # fmt: skip


COMM = [
    CommItem("dispatch and combine", CRITICAL, EXCHANGE, 0.25, ALL_TO_ALL),
    CommItem("out-projection sums", CRITICAL, REDUCE, 0.0, "all-reduce"),
]


def test_without_a_pipeline_only_the_first_forward_and_last_backward_wait_for_theirs():
    off, on = hardware("h100"), hardware("h100", ep_overlap=True)
    compute = matmul_seconds(off, 3 * FLOPS)  # one micro-batch's forward and backward
    per = EXCHANGE / M  # one micro-batch's all-to-alls
    assert per < compute
    # off: every micro-batch waits for its all-to-alls and its all-reduce
    assert step_time(off, _work(), COMM).step_s == pytest.approx(
        M * (compute + per + REDUCE / M), rel=1e-12
    )
    # on: the all-reduce still waits; M - 1 micro-batches run theirs beside the compute
    # of the one paired with them, which goes a quarter slower while they run, and one
    # micro-batch's worth (the first forward's and the last backward's) waits
    t = step_time(on, _work(), COMM)
    assert t.step_s == pytest.approx(
        M * (compute + REDUCE / M) + (M - 1) * per * 0.25 + per, rel=1e-12
    )
    assert sum(t.parts().values()) == pytest.approx(t.step_s, rel=1e-12)


def test_an_interleaved_pipeline_waits_in_its_warm_up_cool_down_and_fill():
    # 4 stages of 2 chunks, 8 micro-batches: the first stage runs 2 (4 - 1) + (2 - 1) 4
    # warm-up forwards alone, and one more under the overlap: 11 of its 16 chunks; the
    # other 5 are paired; the 3 slots of the fill and flush wait for theirs too
    p, v = 4, 2
    on = hardware("h100", ep_overlap=True)
    chunk = (matmul_seconds(on, 3 * FLOPS) + REDUCE / M) / v
    alone = EXCHANGE / (M * v)
    unpaired = 2 * (p - 1) + (v - 1) * p + 1
    two = 2 * on.latency_s  # each slot's two transfers (of no bytes here): one latency each
    t = step_time(on, _work(p, v), COMM)
    assert t.step_s == pytest.approx(
        v * M * (chunk + two)
        + (v * M - unpaired) * alone * 0.25
        + unpaired * alone
        + (p - 1) * (chunk + alone + two),
        rel=1e-12,
    )
    assert t.bubble_s == pytest.approx((p - 1) * (chunk + alone + two), rel=1e-12)


def _rate() -> float:
    # the H100's 16-bit matmul rate: FLOPs a second
    h100 = hardware("h100")
    return h100.peak_flops * h100.matmul_fraction


def test_a_dispatch_longer_than_the_experts_backward_beside_it_pays_the_excess():
    # A tenth of the forward is the experts': per micro-batch their backward's input
    # gradients take E / R, beside the forward's dispatch; the other three all-to-alls
    # each have at least 2 E / R beside them (the delayed weight gradients and the
    # forward's experts; the attention forward with its weights' gradients; the
    # attention backward). Each all-to-all takes 1.5 E / R and holds nothing, so each of
    # the M - 1 paired micro-batches waits 0.5 E / R for its dispatch, and the unpaired
    # one for all four.
    on = hardware("h100", ep_overlap=True)
    rate = _rate()
    experts = FLOPS / 10
    q = 1.5 * experts / rate  # one all-to-all of one micro-batch
    comm = [CommItem("dispatch and combine", CRITICAL, 4 * M * q, 0.0, ALL_TO_ALL)]
    t = step_time(on, _work(experts=experts), comm)
    assert t.step_s == pytest.approx(
        M * 3 * FLOPS / rate + (M - 1) * (q - experts / rate) + 4 * q, rel=1e-12
    )


def test_a_combine_hides_behind_the_attention_backward_of_the_layers_with_experts():
    # Half the forward the experts' (E = F / 2): per micro-batch the forward's combine
    # runs beside the attention's backward without its delayed weight gradients,
    # 2 (F - E) / R - (F - E) / R = F / (2 R) over all the layers; with experts in half
    # of them, only F / (4 R), shorter than the 0.4 F / R the combine takes, which then
    # waits 0.15 F / R in each paired micro-batch; the other three pairs hide theirs
    # (F / (2 R) or more beside each) either way.
    on = hardware("h100", ep_overlap=True)
    rate = _rate()
    q = 0.4 * FLOPS / rate
    comm = [CommItem("dispatch and combine", CRITICAL, 4 * M * q, 0.0, ALL_TO_ALL)]
    compute = M * 3 * FLOPS / rate
    every = step_time(on, _work(share=1.0), comm).step_s
    assert every == pytest.approx(compute + 4 * q, rel=1e-12)
    half = step_time(on, _work(share=0.5), comm).step_s
    assert half == pytest.approx(compute + (M - 1) * 0.15 * FLOPS / rate + 4 * q, rel=1e-12)


def test_a_forward_step_and_a_dense_step_are_unchanged():
    # a forward step has no backward to pair its forwards with; a dense one no all-to-all
    forward = replace(_work(), train=False)
    for work, comm in ((forward, COMM), (_work(), [COMM[1]]), (_work(2, 2), [COMM[1]])):
        on = step_time(hardware("h100", ep_overlap=True), work, comm).step_s
        assert on == step_time(hardware("h100"), work, comm).step_s


def test_ep_overlap_is_true_or_false_and_the_command_line_sets_it():
    with pytest.raises(ShardscopeError, match="ep_overlap='yes'.*True or False"):
        hardware("h100", ep_overlap="yes")
    for flag, want in (("--ep-overlap", True), ("--no-ep-overlap", False)):
        args = build_parser().parse_args(["plan", "--model", "tiny", "--devices", "8", flag])
        assert dict(command_config(args).hardware_overrides) == {"ep_overlap": want}
