"""Pipeline stages that do not divide the layers (DeepSeek-V3's 61 layers in 16 stages are
stages of 4 and 3), and the screen's latency of FSDP's gathers: one collective a layer and a
pass, not one a weight."""

from dataclasses import replace

import pytest

import shardscope
from shardscope import PlanError
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.notes import PlanNote
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, stage_options
from shardscope._src.train.types import Candidate

#: Seven layers: in 2 stages, stages of 4 and 3; in 4, of 2 and 1.
SEVEN = ModelConfig(d_model=64, heads=4, ff=256, layers=7, batch=16, seq=32, vocab=128)


def test_stage_counts_need_not_divide_the_layers():
    deepseek = model_preset("deepseek-v3").config(batch=1024)
    assert stage_options(deepseek, 1024, "train", None) == (1, 2, 4, 8, 16)
    assert stage_options(SEVEN, 8, "train", None) == (1, 2, 4)  # 8 stages: more than 7 layers
    assert stage_options(SEVEN, 8, "train", 4) == (4,)


@pytest.mark.parametrize("stages, even", [(2, 8), (4, 8)])
def test_an_uneven_pipeline_goes_at_the_pace_of_its_largest_stage(stages, even):
    # 7 layers in 2 stages run at the pace of a stage of 4 layers: the same stage as 8 layers
    # in 2 stages; in 4 stages, of a stage of 2: as 8 layers in 4.
    hw = hardware("h100")
    mesh = (("stage", stages), ("data", 8 // stages))
    cand = Candidate("fsdp", mesh, microbatches=4, remat="full")
    uneven = estimate(cand, SEVEN, hw)
    equal = estimate(cand, replace(SEVEN, layers=even), hw)
    assert uneven.time.step_s == equal.time.step_s
    assert uneven.memory.total == equal.memory.total
    # the same step does less of the model's work: 7 of the 8 layers' (less the embedding,
    # the unembedding and the loss, which both do)
    assert uneven.time.mfu < equal.time.mfu


def test_an_uneven_pipeline_is_compiled_by_its_largest_stage_and_says_so():
    result = shardscope.plan(
        SEVEN, 8, hardware="h100", compiler="cpu", strategies=["fsdp"],
        mesh="stage=2,data=4", microbatches=2, remat="none", compile_top=1,
    )  # fmt: skip
    (p,) = result.plans
    (note,) = [n for n in p.notes if n.kind == PlanNote.PIPELINE_STAGE]
    assert (note.values.layers, note.values.of_layers) == (4, 7)
    assert "stages of 4 and 3" in note.text
    four = shardscope.plan(
        replace(SEVEN, layers=4), 4, hardware="h100", compiler="cpu", strategies=["fsdp"],
        mesh="data=4", microbatches=2, remat="none", compile_top=1,
    )  # fmt: skip
    (q,) = four.plans
    # the stage compiled is a model of 4 layers on the stage's 4 devices
    assert p.matmul_flops_per_device == q.matmul_flops_per_device
    assert p.comm_bytes_per_device == q.comm_bytes_per_device


def test_uneven_stages_are_not_interleaved():
    with pytest.raises(PlanError, match=r"are unequal \(stages of 4 and 3 of the 7 layers\)"):
        shardscope.plan(
            SEVEN, 8, hardware="h100", compiler="cpu", compile_top=0, stages=2, virtual_stages=2
        )
    with pytest.raises(PlanError, match="must divide the 8 devices and be no more than the 7"):
        shardscope.plan(SEVEN, 8, hardware="h100", compiler="cpu", compile_top=0, stages=8)


@pytest.mark.parametrize("layers", [4, 1])
def test_fsdp_gathers_a_layers_weights_in_one_collective_a_pass(layers):
    # With links too fast to matter every collective is latency-bound, and with a latency of
    # 1 s a step in the bandwidth protocol each runs in NCCL's low-latency one: 6.6 us to
    # start and 0.6 us a ring step, so the data-parallel seconds count the collectives the
    # step issues and their steps. FSDP over 8 devices, no recomputation, one micro-batch:
    # each layer gathers its weights once in the forward and again for the backward and
    # reduce-scatters their gradients (3 collectives a layer); the embedding, the final norm
    # and the unembedding are gathered and their gradients reduce-scattered once (2), apart
    # from the layers' even where there is one layer; each of those 7 ring steps; and the
    # loss is all-reduced once, 2 x 7 steps. A collective a weight would count 6 of them a
    # layer.
    hw = hardware("h100", latency_s=1.0, link_bandwidth=1e30, cross_node_bandwidth=1e30)
    tiny = replace(model_preset("tiny").config(batch=8), layers=layers)
    s = estimate(Candidate("fsdp", (("data", 8),), 1, "none"), tiny, hw)
    collectives, steps = (3 * layers + 2) + 1, (3 * layers + 2) * 7 + 2 * 7
    assert s.time.data_comm_s == pytest.approx(collectives * 6.6e-6 + steps * 0.6e-6, rel=1e-9)


def test_unequal_stages_are_named_when_no_stage_count_interleaves():
    with pytest.raises(PlanError) as info:
        shardscope.plan(SEVEN, 8, hardware="h100", compiler="cpu", compile_top=0, virtual_stages=2)
    text = str(info.value)
    assert "stages 2 of 4 and 3 layers (unequal), 4 of 2 and 1 layers (unequal)" in text
    assert "interleaving needs stages of equal layers" in text
