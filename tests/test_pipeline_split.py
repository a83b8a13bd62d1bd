"""Megatron-LM's pipeline split with the embedding and the loss counted as a layer each
(``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``):
the counted pieces divide by the stages and each stage's share by its virtual stages; the
first stage's first chunk holds the embedding in a layer's place, the last stage's last chunk
the output layer and loss (Megatron-Core's ``get_num_layers_to_build``)."""

import pytest

from shardscope import PlanError
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import (
    PipelineStage,
    Schedule,
    estimate_memory,
    held_layers,
    split_stages,
)
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import screen_all, virtual_stage_options

#: 14 layers: with the embedding and the loss, 16 pieces, 4 a stage of 4.
CONFIG = ModelConfig(d_model=64, heads=4, ff=256, layers=14, batch=64, seq=32, vocab=128)


def test_llama_405b_over_8_stages_of_8_chunks_is_two_pieces_a_chunk():
    p, v = 8, 8
    per_chunk = (126 + 2) // (p * v)  # the embedding and the loss counted: 128 pieces
    first, middle, last = split_stages("embedding+loss", 126, p, v)
    assert first.chunk_layers == (per_chunk - 1,) + (per_chunk,) * (v - 1)
    assert middle.chunk_layers == (per_chunk,) * v
    assert last.chunk_layers == (per_chunk,) * (v - 1) + (per_chunk - 1,)
    assert (first.rank, middle.rank, last.rank) == (0, 1, p - 1)
    assert first.layers + (p - 2) * middle.layers + last.layers == 126
    ends = (first.embedding, first.output, last.embedding, last.output)
    assert ends == (True, False, False, True)


def test_counted_pieces_let_unequal_stages_interleave():
    # 126 layers over 8 stages are unequal (16 and 15); counted with the embedding and the
    # loss they are 16 pieces a stage, which 1, 2 and 4 chunks (the sweep's up to 4) split
    assert virtual_stage_options(126, 8, 16, None) == (1,)
    assert virtual_stage_options(126, 8, 16, None, "embedding+loss") == (1, 2, 4)


def test_a_stage_holds_the_embedding_or_the_output_layer_it_has():
    placement = get_strategy("dp").place(
        ModelConfig(
            d_model=64, heads=4, ff=256, layers=4, batch=64, seq=32, vocab=128, dtype="bfloat16"
        ),
        abstract_mesh("data=2"),
    )

    def params(stage):
        return estimate_memory(placement, schedule=Schedule(8, stages=4, stage=stage)).params

    table = 128 * 64 * 2  # vocab x d_model at 2 bytes, replicated by dp
    middle = params(PipelineStage(1, (4,)))
    assert params(PipelineStage(0, (4,), embedding=True)) - middle == table
    assert params(PipelineStage(3, (4,), output=True)) - middle == table


def test_a_first_stage_holds_the_layers_of_the_chunks_it_has_in_flight():
    # Megatron's rank 0 runs 2 (p - 1) + (v - 1) p warm-up forwards and one more before its
    # first backward: 11 for p = 4, v = 2; forward k runs chunk (k mod p v) // p, so chunks
    # 0, 1, 0 take 4, 4 and 3 of them. A first chunk of 1 layer (the embedding in the other's
    # place) and a second of 2:
    assert held_layers(PipelineStage(0, (1, 2), embedding=True), 4, 8) == 4 * 1 + 4 * 2 + 3 * 1


def test_a_split_the_stages_do_not_divide_is_refused_with_the_value():
    with pytest.raises(PlanError, match=r"pipeline_split=loss: .* are 15, which 4 pipeline"):
        screen_all(CONFIG, 8, hardware("h100"), ["fsdp"], stages=4, pipeline_split="loss")
    with pytest.raises(PlanError, match=r"2 a stage over 8 stages, which virtual_stages=3"):
        screen_all(
            CONFIG, 8, hardware("h100"), ["fsdp"], stages=8, virtual_stages=3,
            pipeline_split="embedding+loss",
        )  # fmt: skip
