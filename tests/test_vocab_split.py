"""The vocabulary split over ``model`` (Megatron-LM's vocabulary-parallel embedding and cross
entropy): where the tables and the logits live, what it communicates, what it saves, and the
planner's choice of it."""

from dataclasses import replace

import pytest
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.base.errors import StrategyError
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import estimate_memory, logits_bytes
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import screen_all

#: 8 sequences of 8 tokens, d_model 32, a vocabulary of 64 (float32).
TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8, vocab=64)


def test_the_tables_and_the_logits_are_split_along_the_vocabulary():
    mesh = abstract_mesh("data=2,model=4")
    dp_tp = get_strategy("dp_tp").with_vocab_split().place(TINY, mesh)
    specs = dp_tp.param_specs()
    assert specs["embed"] == P("model", None) and specs["unembed"] == P(None, "model")
    assert dp_tp.output_spec() == P("data", None, "model")
    # FSDP x TP stores the tables on both axes and uses them split over the vocabulary only.
    fsdp_tp = get_strategy("fsdp_tp").with_vocab_split().place(TINY, mesh)
    assert fsdp_tp.param_specs()["unembed"] == P("data", "model")
    assert fsdp_tp.use_spec("unembed") == P(None, "model")
    assert fsdp_tp.param_specs()["embed"] == P("model", "data")
    # Splitting twice is splitting once.
    assert get_strategy("tp").with_vocab_split().with_vocab_split().vocab_split


@pytest.mark.parametrize("name, words", [("fsdp", "no 'model' axis"), ("dp_sp", "own tokens")])
def test_a_strategy_that_cannot_split_the_vocabulary_says_which_can(name, words):
    with pytest.raises(StrategyError, match=words) as e:
        get_strategy(name).with_vocab_split()
    assert "dp_tp" in str(e.value) and "dp_sp" not in str(e.value).split("one of")[1]


def test_the_split_keeps_a_quarter_of_the_tables_and_of_the_logits():
    c = replace(TINY, vocab=128256, d_model=4096, heads=32, ff=14336, seq=2048, batch=16)
    mesh = abstract_mesh("data=2,model=4")
    whole, split = (
        s.place(c, mesh) for s in (get_strategy("dp_tp"), get_strategy("dp_tp").with_vocab_split())
    )
    # The embedding and the unembedding, 128,256 x 4096 at 4 bytes each (float32 model).
    tables = 2 * 128256 * 4096 * 4
    assert estimate_memory(whole).params - estimate_memory(split).params == tables - tables // 4
    # 8 sequences of a data shard: 8 x 2048 x 128,256 logits and their gradient.
    assert logits_bytes(whole, 8) == 8 * 2048 * 128256 * 4 * 2
    assert logits_bytes(split, 8) == 8 * 2048 * 128256 * 4 * 2 // 4


def _by_axes(collectives):
    out = {}
    for c in collectives:
        count, sent = out.get((c.axes, c.kind), (0, 0))
        out[(c.axes, c.kind)] = (count + c.count, sent + c.count * c.traffic_bytes)
    return out


def test_the_forward_compiles_to_the_bound_of_the_split():
    program = build_reference_program(
        get_strategy("dp_tp").with_vocab_split(), TINY, "data=2,model=4"
    )
    got = _by_axes(shardscope.audit(program.lower()).collectives)
    bound = transformer_bound(program.placement, "forward")
    # The two all-reduces of each layer (out-projection, MLP-down) and the embeddings summed
    # over the vocabulary slices: 4 sequences x 8 tokens x 32 float32 of a data shard, each a
    # ring over 4 (2 x 3/4 of the payload sent).
    activation = 4 * 8 * 32 * 4
    assert got == {(("model",), "all-reduce"): (2 * 2 + 1, 5 * 2 * 3 * activation // 4)}
    assert sum(t.traffic_bytes for t in bound.terms) == 5 * 2 * 3 * activation // 4


def test_a_train_step_sends_what_the_bound_of_the_split_says():
    program = build_reference_program(
        get_strategy("dp_tp").with_vocab_split(), TINY, "data=2,model=4", mode="train"
    )
    got = _by_axes(shardscope.audit(program.lower()).collectives)
    bound = transformer_bound(program.placement, "train")
    model = [t for t in bound.terms if t.axes == ("model",)]
    # Per layer 4 activations (2 forward, 2 input gradients), the embeddings, the
    # unembedding's input gradient, and three float32 per token for the loss.
    activation, tokens = 4 * 8 * 32 * 4, 4 * 8
    want = (2 * 4 + 2) * activation + 3 * 4 * tokens
    assert sum(t.traffic_bytes for t in model) == want * 2 * 3 // 4
    assert got[(("model",), "all-reduce")][1] == want * 2 * 3 // 4
    # The loss numbers go together where the compiler combines two of them: one fewer.
    assert got[(("model",), "all-reduce")][0] == sum(t.count for t in model) - 1


def test_the_split_computes_the_loss_and_gradients_of_the_whole_vocabulary():
    import jax
    import numpy as np

    whole = build_reference_program("dp_tp", TINY, "data=2,model=4", mode="train")
    split = build_reference_program(
        get_strategy("dp_tp").with_vocab_split(), TINY, "data=2,model=4", mode="train"
    )
    got = (whole.fn(*whole.example_args()), split.fn(*split.example_args()))
    for a, b in zip(*(jax.tree.leaves(g) for g in got), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_the_sweep_tries_the_split_where_a_strategy_can_and_as_asked():
    c = replace(TINY, batch=8)
    hw = hardware("h100")
    kw = dict(remat="none", microbatches=1, stages=1, mesh={"data": 2, "model": 4})

    def labels(vocab_split):
        ranked, _, _ = screen_all(c, 8, hw, ["dp_tp", "dp_sp"], vocab_split=vocab_split, **kw)
        return sorted((s.candidate.strategy, s.candidate.vocab_split) for s in ranked)

    assert labels(None) == [("dp_sp", False), ("dp_tp", False), ("dp_tp", True)]
    assert labels(True) == [("dp_sp", False), ("dp_tp", True)]
    assert labels(False) == [("dp_sp", False), ("dp_tp", False)]
    (plan,) = shardscope.plan(
        c, 8, strategies=["dp_tp"], mesh="data=2,model=4", vocab_split=True, remat="none",
        microbatches=1, compiler="cpu", workers=0,
    ).plans  # fmt: skip
    assert plan.vocab_split and "vocab split" in plan.label
    assert plan.to_dict()["vocab_split"] is True
