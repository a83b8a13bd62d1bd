"""The reference decoder with experts: one expert routed to every token is the dense model,
and the layers before the first with experts are dense."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardscope._src.model.config import ModelConfig, flat_params, param_shapes
from shardscope._src.model.transformer import forward, init_batch, init_params, loss

DENSE = ModelConfig(d_model=32, heads=4, ff=64, layers=2, vocab=128, mlp="swiglu", batch=2, seq=8)


def _one_expert(capacity_factor=None):
    return ModelConfig(
        **{**DENSE.to_dict(), "experts": 1, "top_k": 1, "capacity_factor": capacity_factor}
    )


def _as_one_expert(params):
    layers = params["layers"]
    moe = {k: layers[k] for k in ("attn_norm", "wqkv", "wo", "mlp_norm")}
    moe["router"] = jnp.zeros((2, 32, 1))  # one expert: its softmax weight is 1
    moe["expert_gate_up"] = layers["w_gate_up"][:, None]
    moe["expert_down"] = layers["w_down"][:, None]
    return {"layers": {}, "moe_layers": moe, **{k: v for k, v in params.items() if k != "layers"}}


@pytest.mark.parametrize("capacity_factor", [None, 1.0], ids=["dropless", "capacity"])
def test_one_expert_for_every_token_is_the_dense_model(capacity_factor):
    params = init_params(DENSE)
    tokens, _ = init_batch(DENSE)
    want = forward(params, tokens, DENSE)
    config = _one_expert(capacity_factor)
    got = jax.jit(lambda p, t: forward(p, t, config))(_as_one_expert(params), tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_the_dense_layers_come_first_and_every_weight_is_in_the_tree():
    config = ModelConfig(
        d_model=32,
        heads=4,
        ff=64,
        layers=3,
        vocab=128,
        mlp="swiglu",
        batch=2,
        seq=8,
        experts=4,
        top_k=2,
        expert_ff=48,
        shared_experts=1,
        dense_layers=1,
    )
    params = init_params(config)
    assert params["layers"]["wqkv"].shape[0] == 1 and params["moe_layers"]["router"].shape == (
        2,
        32,
        4,
    )
    flat = flat_params(params)
    assert set(flat) == set(param_shapes(config))
    assert sum(math.prod(v.shape) for v in flat.values()) == config.param_count()
    batch = init_batch(config)
    value, grads = jax.jit(jax.value_and_grad(lambda p: loss(p, batch, config)))(params)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    # the router learns: its gradient is not zero
    assert float(jnp.abs(grads["moe_layers"]["router"]).sum()) > 0
