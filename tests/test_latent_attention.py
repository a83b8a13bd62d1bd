"""Multi-head latent attention (DeepSeek-V2 and V3) in the reference decoder: the blocked
kernel equals the dense one, every strategy's train step equals one device's, tensor
parallelism all-reduces once per sublayer, and a layer keeps what the estimate counts on the
H100 compiler."""

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest

import shardscope
from shardscope._src.audit.compile import audit
from shardscope._src.base.errors import ModelConfigError
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.transformer import init_batch, init_params, loss
from shardscope._src.plan.estimates import activation_bytes_per_layer
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import get_strategy

LATENT = dict(kv_lora_rank=32, q_lora_rank=24, rope_head_dim=8, v_head_dim=12)


def _config(**kw):
    base = dict(
        d_model=64, heads=4, head_dim=16, ff=128, layers=2, batch=8, seq=16, vocab=256,
        mlp="swiglu", **LATENT,
    )  # fmt: skip
    return ModelConfig(**{**base, **kw})


@functools.cache
def _one_device(config):
    params, batch = init_params(config), init_batch(config)
    return jax.jit(jax.value_and_grad(loss), static_argnums=2)(params, batch, config)


def _max_error(a, b):
    return max(
        float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("q_lora_rank", [24, 0], ids=["query-latent", "direct-queries"])
def test_blocked_latent_attention_equals_the_dense_one(q_lora_rank):
    dense = _config(q_lora_rank=q_lora_rank)
    blocked = replace(dense, attention="blocked", attention_block=4)
    want_loss, want = _one_device(dense)
    got_loss, got = _one_device(blocked)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert _max_error(got, want) < 1e-6


@pytest.mark.parametrize(
    "strategy, mesh, experts",
    [("dp_tp", "data=2,model=4", 0), ("fsdp", "data=8", 0), ("fsdp_ep", "data=2,expert=4", 8)],
)
def test_a_latent_attention_train_step_equals_one_device(strategy, mesh, experts):
    moe = dict(experts=8, top_k=2, expert_ff=32, dense_layers=1, capacity_factor=4.0)
    config = _config(**(moe if experts else {}))
    want_loss, want = _one_device(config)
    prog = build_reference_program(strategy, config, mesh, mode="train")
    got_loss, got = prog.fn(*prog.example_args())
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert _max_error(got, want) < 1e-6


def test_tensor_parallel_latent_attention_sums_once_per_sublayer():
    config = _config(vocab=None)
    audit_ = shardscope.audit(build_reference_program("dp_tp", config, "data=2,model=4"))
    # each head's queries, keys and values from the replicated latents, the output
    # projection's partial sums all-reduced, as the MLP's down projection's
    assert audit_.counts()["all-reduce"] == 2 * config.layers


def test_a_latent_attention_layer_keeps_what_the_estimate_counts():
    mesh = shardscope.target_mesh("h100", "data=8", axis_types="auto")
    temp, per_layer = {}, {}
    for layers in (2, 4):
        config = ModelConfig(
            layers=layers, d_model=128, heads=2, head_dim=64, ff=512, mlp="swiglu", seq=2048,
            batch=8, dtype="bfloat16", attention="blocked", attention_block=256,
            kv_lora_rank=64, q_lora_rank=96, rope_head_dim=32, v_head_dim=64,
        )  # fmt: skip
        placement = get_strategy("fsdp").place(config, mesh)
        program = build_reference_program(placement, mode="train", regather=True)
        temp[layers] = audit(program.lower()).memory["temp_size_in_bytes"]
        per_layer[layers] = activation_bytes_per_layer(placement)
    # one sequence of 2048 tokens a device, bf16: the residual stream's and norms' (10 h);
    # the latents and their norms' inputs (2 (64 + 32) + 2 x 64 + 4 x 96); each head's query
    # and key (2 x 96 each), value and output (2 x 64 each); the MLP's (6 ff)
    latents = 2 * (64 + 32) + 2 * 64 + 4 * 96
    heads = 2 * (2 * 2 * 96 + 2 * 2 * 64)
    assert per_layer[2] == per_layer[4] == 2048 * (10 * 128 + latents + heads + 6 * 512)
    assert (temp[4] - temp[2]) / 2 == pytest.approx(per_layer[2], rel=0.03)


def test_latent_attention_settings_name_what_is_wrong():
    with pytest.raises(ModelConfigError, match="q_lora_rank=8 describe multi-head latent"):
        ModelConfig(q_lora_rank=8)
    with pytest.raises(ModelConfigError, match="kv_heads=2 with kv_lora_rank=16"):
        ModelConfig(heads=8, kv_heads=2, kv_lora_rank=16)
