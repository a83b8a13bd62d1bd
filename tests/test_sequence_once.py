"""Sequence parallelism with micro-batches: each model shard adds up the partial gradients of
the weights it uses on its part of the sequence (the norms' gains, the embedding and the
unembedding) and its part of the loss, summed over ``model`` once a step (Megatron-LM's
``finalize_model_grads``); the time model prices those sums as the program runs them."""

import shardscope

shardscope.use_cpu_devices(8)

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402

from helpers import assert_one_device_step  # noqa: E402
from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.comm import ALL_REDUCE  # noqa: E402
from shardscope._src.bounds.terms import TermRole  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.plan.estimates import Schedule  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import get_strategy  # noqa: E402
from shardscope._src.train.timing import step_bound  # noqa: E402

# d_model 32, 2 layers, vocabulary 64, f32; 8 sequences of 8 tokens over data=2, model=4.
L, D, V = 2, 32, 64
TINY = ModelConfig(d_model=D, heads=8, ff=64, layers=L, batch=8, seq=8, vocab=V)
MESH = "data=2,model=4"
M = 2  # micro-batches: 2 sequences each of a data shard's 4
# One micro-batch's activations of a data shard: 2 sequences x 8 tokens x 32 x 4 B.
ACT = (8 // 2 // M) * 8 * D * 4
# What each model shard adds up over the micro-batches: the 2 x layers + 1 norms' gains, the
# embedding and the unembedding (f32, as the program holds them), and the f32 loss.
ONCE = ((2 * L + 1) * D + 2 * V * D) * 4


def _over_model(program):
    """(executions, payload bytes) of the all-reduces over 'model', and those run once."""
    got = [c for c in audit(program.lower()).collectives if c.kind == ALL_REDUCE]
    got = [c for c in got if c.axes == ("model",)]
    every = (sum(c.count for c in got), sum(c.count * c.payload_bytes for c in got))
    once = [(c.count, c.payload_bytes) for c in got if c.count == 1]
    return every, once


@pytest.fixture(scope="module")
def programs():
    return {
        name: build_reference_program(name, TINY, MESH, mode="train", microbatches=M)
        for name in ("dp_sp", "fsdp_sp")
    }


@pytest.mark.parametrize(("name", "shards"), [("dp_sp", 1), ("fsdp_sp", 2)])
def test_the_model_axis_sums_the_norms_embeddings_and_loss_once_a_step(programs, name, shards):
    every, once = _over_model(programs[name])
    # Once, after the last micro-batch: every model shard's partial gradients (FSDP: of the
    # weights' data shards, the gradients reduce-scattered over data first) and the loss.
    assert once == [(1, ONCE // shards + 4)]
    # After every micro-batch only the activations: XLA:CPU all-reduces for the
    # reduce-scatters of sequence parallelism, 2 a layer forward and 2 backward.
    assert every == (4 * L * M + 1, 4 * L * M * ACT + ONCE // shards + 4)


@pytest.mark.parametrize("name", ["dp_sp", "fsdp_sp"])
def test_micro_batched_model_shards_compute_what_one_device_computes(programs, name):
    loss, grads = programs[name].fn(*programs[name].example_args())
    assert_one_device_step(loss, grads, TINY)


def test_the_step_bound_sums_over_model_once_where_the_program_does():
    def gains(config):
        placement = get_strategy("fsdp_sp").place(config, MESH)
        terms = step_bound(placement, Schedule(microbatches=4), "train").terms
        sums = [t for t in terms if t.role is TermRole.GRADIENT_SUM and "norm" in t.what]
        return {t.what.split()[0]: t.count for t in sums}

    # A dense model: each model shard adds up its gains over the 4 micro-batches, one sum a
    # layer's gain a step.
    assert gains(TINY) == {"attn_norm": L, "mlp_norm": L, "final_norm": 1}
    # A mixture of experts' train step sums them over model after every micro-batch.
    moe = replace(TINY, experts=4, top_k=2, capacity_factor=1.0)
    assert gains(moe) == {"moe_attn_norm": 4 * L, "moe_mlp_norm": 4 * L, "final_norm": 4}
