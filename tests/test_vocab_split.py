"""The vocabulary split over ``model`` (Megatron-LM's vocabulary-parallel embedding and cross
entropy): where the tables and the logits live, what it communicates, what it saves, and the
planner's choice of it."""

import functools
from dataclasses import replace

import pytest
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.base.errors import StrategyError
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import Schedule, estimate_memory, logits_bytes
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


def test_under_sequence_parallelism_the_tokens_and_the_logits_hold_the_whole_sequence():
    # Megatron-LM with --sequence-parallel: each device of a 'model' group looks up every
    # token of its sequences (of its context shard) in its vocabulary slice, the residual
    # stream between blocks stays split along the sequence, and the output layer takes the
    # sequence gathered and gives logits over its slice.
    dp_sp = get_strategy("dp_sp").with_vocab_split()
    assert dp_sp.splits_vocab and dp_sp.sequence_parallel
    p = dp_sp.place(TINY, abstract_mesh("data=2,model=4"))
    assert p.param_specs()["embed"] == P("model", None)
    assert p.param_specs()["unembed"] == P(None, "model")
    assert p.batch_specs() == (P("data", None), P("data", None))
    assert p.activation_spec("residual") == P("data", "model", None)
    assert p.activation_spec("logits_in") == P("data", None, None)
    assert p.output_spec() == P("data", None, "model")
    # Context parallel: the sequence stays split over 'context', gathered from 'model'.
    cp = get_strategy("zero1_sp_cp").with_vocab_split()
    p = cp.place(TINY, abstract_mesh("data=2,context=2,model=2"))
    assert p.optimizer_specs()["unembed"] == P(("data", "context"), "model")
    assert p.batch_specs()[0] == P("data", "context")
    assert p.output_spec() == P("data", "context", "model")
    # Without the split nothing moves: the logits are the residual's tokens.
    assert get_strategy("dp_sp").place(TINY, abstract_mesh("data=2,model=4")).output_spec() == (
        P("data", "model", None)
    )


@pytest.mark.parametrize("name", ["fsdp", "dp_cp"])
def test_a_strategy_without_a_model_axis_cannot_split_the_vocabulary_and_says_which_can(name):
    with pytest.raises(StrategyError, match="no 'model' axis") as e:
        get_strategy(name).with_vocab_split()
    can = set(str(e.value).split("one of ")[1].split(", "))
    assert {"dp_tp", "sp", "dp_sp", "fsdp_sp"} <= can and not {"fsdp", "dp", "dp_cp"} & can


@pytest.mark.parametrize("name", ["dp_tp", "dp_sp", "zero1_sp"])
def test_the_split_keeps_a_quarter_of_the_tables_and_of_the_logits(name):
    c = replace(TINY, vocab=128256, d_model=4096, heads=32, ff=14336, seq=2048, batch=16)
    mesh = abstract_mesh("data=2,model=4")
    whole = get_strategy(name).place(c, mesh)
    split = get_strategy(name).with_vocab_split().place(c, mesh)
    # The embedding and the unembedding, 128,256 x 4096 at 4 bytes each (float32 model).
    tables = 2 * 128256 * 4096 * 4
    saved = tables - tables // 4
    kept, cut = estimate_memory(whole), estimate_memory(split)
    assert kept.params - cut.params == kept.grads - cut.grads == saved
    # Adam's 8 bytes more a float32 parameter (16 in all), over 'data' too under ZeRO-1.
    zero = 2 if name == "zero1_sp" else 1
    assert kept.optimizer - cut.optimizer == 2 * 128256 * 4096 * 8 // zero * 3 // 4
    # 8 sequences of a data shard: 8 x 2048 x 128,256 logits and their gradient, a quarter
    # on each device when split over the vocabulary (or, unsplit under sequence
    # parallelism, over the sequence).
    assert logits_bytes(split, 8) == 8 * 2048 * 128256 * 4 * 2 // 4
    assert logits_bytes(whole, 8) == 8 * 2048 * 128256 * 4 * 2 // (1 if name == "dp_tp" else 4)


def test_the_compiled_split_under_sequence_parallelism_holds_what_the_estimate_counts():
    program = build_reference_program(
        get_strategy("dp_sp").with_vocab_split(), TINY, "data=2,model=4", mode="train"
    )
    held = program.compile().memory_analysis().argument_size_in_bytes
    # float32 on each device: the norm gains whole (two a layer and the final one), the
    # layers' matrices (QKV 32 x 96, out 32 x 32, MLP 32 x 64 twice) and both tables
    # (64 x 32) a quarter each.
    params = (2 * 2 * 32 + 32 + 2 * (32 * 96 + 32 * 32 + 2 * 32 * 64) // 4 + 2 * 64 * 32 // 4) * 4
    assert estimate_memory(program.placement).params == params
    # The tokens and the targets: 4 sequences of a data shard, each whole (8 int32).
    assert held == params + 2 * 4 * 8 * 4


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_last_pipeline_stage_holds_the_output_layer_and_not_the_embedding(tied):
    # Megatron-LM: the first stage looks the tokens up, the last projects onto the
    # vocabulary; tied, the last stage keeps its own copy of the table to project with.
    c = replace(TINY, tie_embeddings=tied)
    placement = (
        get_strategy("zero1_tp").with_vocab_split().place(c, abstract_mesh("data=2,model=4"))
    )
    alone, last = (
        estimate_memory(placement, schedule=Schedule(microbatches=2, stages=p)) for p in (1, 2)
    )
    # The 64 x 32 float32 embedding, a quarter on each device; its optimizer state (8 bytes
    # an element more) an eighth, over 'data' too.
    table = 0 if tied else 64 * 32
    assert alone.params - last.params == alone.grads - last.grads == table // 4 * 4
    assert alone.optimizer - last.optimizer == table // 8 * 8


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


def test_under_sequence_parallelism_the_twin_sends_what_the_bound_of_the_split_says():
    # Megatron-LM's collectives, written out in the shard_map twin of dp_sp.
    program = build_reference_program(
        get_strategy("dp_sp").with_vocab_split(), TINY, "data=2,model=4", mode="train",
        impl="shard_map",
    )  # fmt: skip
    got = _by_axes(shardscope.audit(program.lower()).collectives)
    bound = _by_axes_of(transformer_bound(program.placement, "train"))
    # One data shard's activations (4 sequences x 8 tokens x 32 float32), gathered along the
    # sequence and reduce-scattered back, 3/4 of them sent: per layer before and after each
    # of the two sublayers, forward and backward (8), and for the embeddings and the output
    # layer, forward and backward (2 more).
    activation = 4 * 8 * 32 * 4
    for kind in ("all-gather", "reduce-scatter"):
        assert got[(("model",), kind)] == (8 + 2, (8 + 2) * 3 * activation // 4)
    # The loss: three float32 for each of the 32 tokens, in two all-reduces (two combined).
    assert got[(("model",), "all-reduce")] == (2, 3 * 4 * 32 * 2 * 3 // 4)
    # The norm gains (two a layer and the final one) see a sequence shard: summed over all 8.
    assert got[(("data", "model"), "all-reduce")][1] == (2 * 2 + 1) * 32 * 4 * 2 * 7 // 8
    assert {k: v[1] for k, v in got.items()} == {k: v[1] for k, v in bound.items()}


def _by_axes_of(bound):
    out = {}
    for t in bound.terms:
        count, sent = out.get((t.axes, t.kind), (0, 0))
        out[(t.axes, t.kind)] = (count + t.count, sent + t.traffic_bytes)
    return out


@pytest.mark.parametrize(
    "name, impl",
    [("dp_tp", "jit"), ("dp_tp", "shard_map"), ("dp_sp", "jit"), ("dp_sp", "shard_map")],
)
def test_the_split_computes_the_loss_and_gradients_of_the_whole_vocabulary(name, impl):
    import jax
    import numpy as np

    split = build_reference_program(
        get_strategy(name).with_vocab_split(), TINY, "data=2,model=4", mode="train", impl=impl
    )
    got = (_whole_train_step(name), split.fn(*split.example_args()))
    for a, b in zip(*(jax.tree.leaves(g) for g in got), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@functools.cache
def _whole_train_step(name):
    """The loss and gradients of ``name`` with the vocabulary whole (one compile a name)."""
    whole = build_reference_program(name, TINY, "data=2,model=4", mode="train")
    return whole.fn(*whole.example_args())


def test_the_sweep_tries_the_split_where_a_strategy_can_and_as_asked():
    c = replace(TINY, batch=8)
    hw = hardware("h100")
    kw = dict(remat="none", microbatches=1, stages=1, mesh={"data": 2, "model": 4})

    def labels(vocab_split):
        ranked, _, _ = screen_all(c, 8, hw, ["dp_tp", "dp_sp"], vocab_split=vocab_split, **kw)
        return sorted((s.candidate.strategy, s.candidate.vocab_split) for s in ranked)

    assert labels(None) == [("dp_sp", False), ("dp_sp", True), ("dp_tp", False), ("dp_tp", True)]
    assert labels(True) == [("dp_sp", True), ("dp_tp", True)]
    assert labels(False) == [("dp_sp", False), ("dp_tp", False)]
    # Under fsdp (no 'model' axis) the vocabulary stays whole, asked or not.
    ranked, _, _ = screen_all(c, 8, hw, ["fsdp"], vocab_split=True, **{**kw, "mesh": {"data": 8}})
    assert {s.candidate.vocab_split for s in ranked} == {False}
    (plan,) = shardscope.plan(
        c, 8, strategies=["dp_sp"], mesh="data=2,model=4", vocab_split=True, remat="none",
        microbatches=1, compiler="cpu", workers=0,
    ).plans  # fmt: skip
    assert plan.vocab_split and "vocab split" in plan.label
    assert plan.to_dict()["vocab_split"] is True
