"""Interleaved 1F1B (virtual pipeline stages, Narayanan et al. 2021, arXiv 2104.04473, section
2.2.2; Megatron-LM's ``--num-layers-per-virtual-pipeline-stage``): each device runs ``v``
chunks of its stage's layers. The bubble shrinks by ``v``, the point-to-point transfers grow
by ``v``, the first stage warms up with more chunks in flight (Megatron-LM's warm-up count),
and the schedule needs the chunks to divide a stage's layers and the micro-batches to be a
multiple of the stages."""

from dataclasses import replace
from fractions import Fraction

import pytest

import shardscope
from helpers import assert_usage_error
from shardscope import PlanError, PlanRequest
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import (
    Schedule,
    estimate_memory,
    stored_activation_bytes_per_layer,
)
from shardscope._src.plan.notes import PlanNote
from shardscope._src.plan.types import SkipReason
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, screen_all, stage_config
from shardscope._src.train.timing import StepWork, step_time, step_work
from shardscope._src.train.types import Candidate

#: A 16-layer model: 2 or 4 stages of 8 or 4 layers, each split in up to 4 chunks.
CONFIG = ModelConfig(d_model=64, heads=4, ff=256, layers=16, batch=64, seq=32, vocab=128)

#: One device's stage work: compute only, no activation bytes, no optimizer.
WORK = StepWork(
    microbatches=8,
    stages=4,
    fwd_flops=1e15,
    recompute_flops=0.0,
    act_bytes=0.0,
    recompute_act_bytes=0.0,
    p2p_bytes=0.0,
    p2p_bandwidth=1e10,
    optimizer_params=0,
    model_flops=3e15 * 8,
    devices=4,
)


def _times(hw):
    """The forward and backward of one micro-batch on the whole stage (the paper's t_f, t_b)."""
    rate = hw.peak_flops * hw.matmul_fraction
    return WORK.fwd_flops / rate, 2 * WORK.fwd_flops / rate


# -- the bubble ----------------------------------------------------------------------------------


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 8, 4), (2, 6, 3), (8, 16, 2)])
def test_the_bubble_is_the_papers_p_minus_1_times_tf_plus_tb_over_v(p, m, v):
    hw = replace(hardware("h100"), latency_s=0.0)  # no transfers: the bubble alone
    t_f, t_b = _times(hw)
    got = step_time(hw, replace(WORK, stages=p, microbatches=m, virtual_stages=v), [])
    # Section 2.2.2: t_pb^int = (p - 1) (t_f + t_b) / v; ideal time m (t_f + t_b); bubble
    # fraction of the ideal (1 / v) (p - 1) / m, so of the whole step f / (1 + f).
    bubble = (p - 1) * (t_f + t_b) / v
    ideal = m * (t_f + t_b)
    f = Fraction(p - 1, v * m)
    assert got.bubble_s == pytest.approx(bubble, rel=1e-12)
    assert got.compute_s == pytest.approx(ideal, rel=1e-12)
    assert got.step_s == pytest.approx(ideal + bubble, rel=1e-12)
    assert got.bubble_fraction == pytest.approx(float(f / (1 + f)), rel=1e-12)
    # v times smaller than plain 1F1B's on the same stages and micro-batches.
    plain = step_time(hw, replace(WORK, stages=p, microbatches=m), [])
    assert got.bubble_s == pytest.approx(plain.bubble_s / v, rel=1e-12)


def test_one_virtual_stage_is_plain_1f1b():
    hw = hardware("h100")
    p, m = 4, 8
    work = replace(WORK, p2p_bytes=3e6)
    t_f, t_b = _times(hw)
    p2p = 3e6 / 1e10 + hw.latency_s  # one transfer each way per micro-batch slot
    slot = t_f + t_b + 2 * p2p
    got = step_time(hw, replace(work, virtual_stages=1), [])
    # 1F1B (section 2.2.1): m + p - 1 slots, a bubble of (p - 1) / (m + p - 1).
    assert got.bubble_fraction == (p - 1) / (m + p - 1)
    assert got.step_s == pytest.approx((m + p - 1) * slot, rel=1e-12)
    assert got.p2p_s == pytest.approx(2 * m * p2p, rel=1e-12)
    assert got == step_time(hw, work, [])  # the default
    # The first stage holds min(p, m) micro-batches of the whole stage's layers.
    assert Schedule(8, stages=4, virtual_stages=1).in_flight == 4
    assert Schedule(3, stages=4, virtual_stages=1).in_flight == 3
    assert Schedule(8, stages=1).in_flight == 1
    label = Candidate("fsdp", (("stage", 4), ("data", 2)), 8, virtual_stages=1).label
    assert label == "fsdp stage=4,data=2 (8 micro-batches)"


# -- point-to-point transfers ---------------------------------------------------------------------


@pytest.mark.parametrize("v", [2, 3, 4])
def test_the_point_to_point_transfers_grow_v_fold(v):
    hw = hardware("h100")
    work = replace(WORK, p2p_bytes=3e6)
    one = step_time(hw, work, [])
    got = step_time(hw, replace(work, virtual_stages=v), [])
    # "the amount of communication also increases by v": each chunk of each micro-batch
    # sends its activations on and receives their gradient back.
    assert got.p2p_s == pytest.approx(v * one.p2p_s, rel=1e-12)
    assert got.p2p_s == pytest.approx(2 * v * 8 * (3e6 / 1e10 + hw.latency_s), rel=1e-12)
    # the same work, in more chunks
    assert got.compute_s == one.compute_s


def test_a_step_of_chunks_sends_the_same_tensor_per_transfer():
    placement = get_strategy("fsdp").place(
        replace(CONFIG, layers=4), abstract_mesh("data=2")
    )  # one stage of 4 stages: 4 layers
    hw = hardware("h100")
    kw = dict(flash_attention=True)
    plain = step_work(placement, Schedule(8, stages=4), CONFIG, 8, hw, **kw)
    inter = step_work(placement, Schedule(8, stages=4, virtual_stages=2), CONFIG, 8, hw, **kw)
    assert inter.virtual_stages == 2 and plain.virtual_stages == 1
    # one micro-batch's activations of one device: b s h bytes at float32, b = 64 / 2 / 8
    assert inter.p2p_bytes == plain.p2p_bytes == 4 * 32 * 64 * 4
    assert replace(inter, virtual_stages=1) == plain


# -- activations in flight -------------------------------------------------------------------------


def _megatron_rank0_peak(p: int, m: int, v: int) -> int:
    """The most chunk forwards rank 0 holds before their backward, walking Megatron-LM's
    interleaved schedule (``forward_backward_pipelining_with_interleaving``): its warm-up
    forwards, then one forward and one backward per step, then the remaining backwards."""
    total = m * v
    if m == p:
        warmup = total  # every forward first
    else:
        warmup = min((p - 0 - 1) * 2 + (v - 1) * p, total)
    held = peak = 0
    for _ in range(warmup):
        held += 1
        peak = max(peak, held)
    for _ in range(total - warmup):
        held += 1  # forward
        peak = max(peak, held)
        held -= 1  # backward
    return peak


@pytest.mark.parametrize(
    "p, m, v", [(4, 8, 2), (4, 4, 2), (4, 16, 3), (2, 2, 4), (2, 10, 2), (8, 24, 4)]
)
def test_the_first_stage_holds_megatrons_warm_up_chunks_plus_one(p, m, v):
    sched = Schedule(m, stages=p, virtual_stages=v)
    assert sched.in_flight == _megatron_rank0_peak(p, m, v)
    if m > p:
        # p + (p - 1) / v stages' worth of layers in flight, more than 1F1B's p
        assert Fraction(sched.in_flight, v) == p + Fraction(p - 1, v)


def test_interleaving_keeps_the_activations_of_the_chunks_in_flight():
    stage = replace(CONFIG, layers=4)  # one of 4 stages
    placement = get_strategy("dp").place(stage, abstract_mesh("data=2"))
    p, m, v = 4, 8, 2
    kept = stored_activation_bytes_per_layer(placement, Schedule(m, "full", p))
    one = estimate_memory(placement, schedule=Schedule(m, "full", p))
    inter = estimate_memory(placement, schedule=Schedule(m, "full", p, virtual_stages=v))
    plain = one.activations
    # 1F1B: min(p, m) = 4 micro-batches of 4 layers; interleaved: 2 (p - 1) + (v - 1) p + 1
    # = 11 chunks of 2 layers.
    assert inter.activations - plain == kept * (11 * 2 - 4 * 4)
    # the model state is the stage's, however it is chunked
    assert inter.model_state == one.model_state


# -- the sweep -------------------------------------------------------------------------------------


def test_the_sweep_tries_each_virtual_stage_count_that_runs():
    ranked, _, _ = screen_all(
        CONFIG, 8, hardware("h100"), ["fsdp"], stages=2, remat="none", offload_optimizer=False
    )
    # 2 stages of 8 layers, data=4: 16 sequences per shard, micro-batches 1, 2, 4, 8, 16;
    # v = 2 and 4 divide the 8 layers (3 does not) and need an even micro-batch count.
    got = {(s.candidate.microbatches, s.candidate.virtual_stages) for s in ranked}
    micro = [1, 2, 4, 8, 16]
    want = {(m, 1) for m in micro} | {(m, v) for m in micro if m % 2 == 0 for v in (2, 4)}
    assert got == want
    labels = {s.candidate.label for s in ranked}
    assert "fsdp stage=2,data=4 (8 micro-batches, 4 virtual stages)" in labels


def test_a_fixed_count_is_the_only_one_tried_and_sets_the_stages():
    ranked, _, _ = screen_all(
        CONFIG, 8, hardware("h100"), ["fsdp"], virtual_stages=4, remat="none",
        offload_optimizer=False,
    )  # fmt: skip
    # 4 divides the 8 layers of 2 stages and the 4 of 4 stages, not the 2 of 8 or 1 of 16.
    assert {s.candidate.stages for s in ranked} == {2, 4}
    assert {s.candidate.virtual_stages for s in ranked} == {4}
    assert all(s.candidate.microbatches % s.candidate.stages == 0 for s in ranked)


def test_an_interleaved_estimate_has_a_smaller_bubble_and_more_transfers():
    c = Candidate("fsdp", (("stage", 4), ("data", 2)), 8, "full")
    plain = estimate(c, CONFIG)
    inter = estimate(replace(c, virtual_stages=2), CONFIG)
    assert plain.time.bubble_fraction == pytest.approx(3 / 11, rel=1e-12)
    assert inter.time.bubble_fraction == pytest.approx(3 / 19, rel=1e-12)
    assert inter.time.p2p_s == pytest.approx(2 * plain.time.p2p_s, rel=1e-12)
    assert inter.memory.activations > plain.memory.activations


def test_the_compiled_program_is_one_stage_of_all_its_layers():
    c = Candidate("fsdp", (("stage", 4), ("data", 2)), 8, virtual_stages=2)
    assert stage_config(CONFIG, c, flash_attention=True).layers == 16 // 4


def test_a_compiled_interleaved_plan_keeps_its_chunks_and_the_stages_collectives():
    kw = dict(workers=0, strategies=["fsdp"], mesh="stage=2,data=4", remat="none", compiler="cpu")
    kw.update(microbatches=2, offload_optimizer=False)
    inter = shardscope.plan("tiny", 8, virtual_stages=2, **kw)
    plain = shardscope.plan("tiny", 8, virtual_stages=1, **kw)
    (p,), (q,) = inter.plans, plain.plans
    assert (p.stages, p.virtual_stages, p.microbatches) == (2, 2, 2)
    assert p.label == "fsdp stage=2,data=4 (2 micro-batches, 2 virtual stages)"
    assert p.to_dict()["virtual_stages"] == 2
    # the same stage program: its collectives are the plain 1F1B plan's
    assert p.collectives == q.collectives
    note = next(n for n in p.notes if n.kind == PlanNote.PIPELINE_STAGE)
    assert "as 2 virtual stages of 1" in note.text
    assert inter.settings["virtual_stages"] == 2


# -- what is refused -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(virtual_stages=0), "virtual_stages=0: must be a positive whole number"),
        (dict(virtual_stages=2.0), "virtual_stages=2.0: must be a positive whole number"),
        (dict(virtual_stages=2, stages=1), "there is none (stages=1); give stages= more than 1"),
        (
            dict(virtual_stages=2, stages=4, microbatches=6),
            "needs the micro-batches a multiple of the 4 stages, and there are 6; give "
            "microbatches=4, 8, ... or virtual_stages=1",
        ),
        (dict(virtual_stages=2, mode="forward"), "a forward pass runs one micro-batch"),
    ],
    ids=["zero", "float", "no-stages", "micro-batches", "forward"],
)
def test_a_count_that_cannot_run_is_refused_when_the_request_is_made(kwargs, words):
    with pytest.raises(PlanError) as info:
        PlanRequest("tiny", 8, **kwargs)
    assert words in str(info.value)
    assert info.value.params == ("virtual_stages",)


def test_a_count_that_does_not_divide_a_stages_layers_names_those_that_do():
    request = PlanRequest(
        None, 8, d_model=64, heads=4, ff=256, layers=160, vocab=128, stages=4,
        virtual_stages=3, workers=0,
    )  # fmt: skip
    with pytest.raises(PlanError) as info:
        shardscope.plan_request(request)
    assert str(info.value) == (
        "virtual_stages=3: must divide the 40 layers of each of the 4 stages; choose 1, 2, "
        "4, 5, 8, 10, 20 or 40"
    )
    assert info.value.params == ("virtual_stages",)


def test_no_stage_count_for_a_fixed_count_is_refused():
    # 16 layers on 8 devices: 2, 4 or 8 stages of 8, 4 or 2 layers; 3 divides none.
    with pytest.raises(PlanError, match="virtual_stages=3: no pipeline stage count the sweep"):
        screen_all(CONFIG, 8, hardware("h100"), ["fsdp"], virtual_stages=3)


def test_a_pinned_mesh_without_stages_cannot_interleave():
    with pytest.raises(PlanError, match="mesh='data=8' has no stage axis") as info:
        shardscope.plan("tiny", 8, workers=0, mesh="data=8", virtual_stages=2, compiler="cpu")
    assert info.value.params == ("virtual_stages", "mesh")


def test_a_schedule_that_cannot_run_is_refused_when_it_is_made():
    with pytest.raises(PlanError, match="multiple of the 4 stages, and there are 6"):
        Schedule(6, stages=4, virtual_stages=2)
    with pytest.raises(PlanError, match=r"there is none \(stages=1\)"):
        Schedule(8, virtual_stages=2)
    placement = get_strategy("dp").place(replace(CONFIG, layers=3), abstract_mesh("data=2"))
    with pytest.raises(PlanError, match="must divide the 3 layers of each of the 4 stages"):
        estimate_memory(placement, schedule=Schedule(8, stages=4, virtual_stages=2))


def test_shards_whose_micro_batches_cannot_be_a_multiple_of_the_stages_are_skipped():
    config = replace(CONFIG, batch=24)  # data=2: 12 sequences a shard, split 1, 2, 3, 4, 6, 12
    ranked, skipped, _ = screen_all(
        config, 16, hardware("h100"), ["fsdp"], stages=8, virtual_stages=2, remat="none"
    )
    assert ranked == []
    (s,) = skipped
    assert s.reason == SkipReason.DIVISIBILITY
    assert "needs the micro-batches a multiple of the 8 stages" in s.message
    assert "split into 1, 2, 3, 4, 6 or 12" in s.message


# -- the command line ------------------------------------------------------------------------------


def test_the_flag_maps_onto_the_field():
    argv = ["plan", "--devices", "8", "--stages", "2", "--virtual-stages", "4"]
    request = command_config(build_parser().parse_args(argv)).request()
    assert request == PlanRequest(None, 8, stages=2, virtual_stages=4)
    assert command_config(build_parser().parse_args(argv[:3])).request().virtual_stages is None


def test_the_command_line_names_the_flag_of_a_refused_count(capsys):
    argv = ["plan", "--model", "tiny", "--devices", "8", "--stages", "1", "--virtual-stages", "2"]
    line = assert_usage_error(argv, "virtual_stages=2: interleaving splits", capsys)
    assert line.rstrip().endswith("(flag --virtual-stages)")
