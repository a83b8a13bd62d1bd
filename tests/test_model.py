"""The reference decoder: config validation, shapes, scan vs unrolled, causality, scopes."""

import shardscope

shardscope.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from shardscope._src.base.errors import ModelConfigError, ShardscopeError  # noqa: E402
from shardscope._src.model.config import ModelConfig, flat_params, param_shapes  # noqa: E402
from shardscope._src.model.transformer import (  # noqa: E402
    abstract_batch,
    abstract_params,
    forward,
    init_batch,
    init_params,
    train_step,
)

TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)


def test_config_rejects_heads_not_dividing_d_model():
    with pytest.raises(ModelConfigError, match=r"d_model=30 is not divisible by heads=8"):
        ModelConfig(d_model=30, heads=8)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"layers": 0}, "layers=0"),
        ({"batch": -2}, "batch=-2"),
        ({"seq": 2.5}, "seq=2.5"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"vocab": 0}, "vocab=0"),
    ],
)
def test_config_rejects_bad_values(kwargs, needle):
    with pytest.raises(ShardscopeError, match=needle.replace("(", r"\(")):
        ModelConfig(**kwargs)


def test_param_shapes_and_count():
    c = ModelConfig(d_model=64, heads=8, ff=256, layers=3, vocab=100)
    shapes = param_shapes(c)
    assert shapes["wqkv"] == (3, 64, 8, 3, 8)  # per head: its query, key and value
    assert shapes["wo"] == (3, 8, 8, 64)
    assert shapes["w_up"] == (3, 64, 256) and shapes["w_down"] == (3, 256, 64)
    per_layer = 2 * 64 + 4 * 64 * 64 + 2 * 64 * 256
    assert c.param_count() == 3 * per_layer + 2 * 100 * 64 + 64
    abstract = abstract_params(c)
    assert flat_params(abstract)["embed"].shape == (100, 64)
    assert abstract_batch(c)[0].dtype == jnp.int32


def test_scan_and_unrolled_agree():
    params = init_params(TINY, 0)
    x, _ = init_batch(TINY, 1)
    scanned = jax.jit(lambda p, x: forward(p, x, TINY))(params, x)
    unrolled_cfg = ModelConfig(**{**TINY.to_dict(), "scan": False})
    unrolled = jax.jit(lambda p, x: forward(p, x, unrolled_cfg))(params, x)
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(unrolled), rtol=1e-5, atol=1e-6)


def test_attention_is_causal():
    params = init_params(TINY, 0)
    x, _ = init_batch(TINY, 1)
    f = jax.jit(lambda p, x: forward(p, x, TINY))
    y1 = f(params, x)
    y2 = f(params, x.at[:, -1].set(100.0))  # change only the last position
    np.testing.assert_array_equal(np.asarray(y1[:, :-1]), np.asarray(y2[:, :-1]))
    assert not np.allclose(np.asarray(y1[:, -1]), np.asarray(y2[:, -1]))


def test_capture_returns_every_layers_sublayer_outputs():
    params = init_params(TINY, 0)
    x, _ = init_batch(TINY, 1)
    out, caps = jax.jit(lambda p, x: forward(p, x, TINY, capture=True))(params, x)
    assert out.shape == (8, 8, 32)
    assert set(caps) == {"attention", "mlp"}
    assert caps["attention"].shape == (2, 8, 8, 32)


def test_train_step_with_vocab_gives_grads_for_every_param():
    c = ModelConfig(d_model=32, heads=4, ff=64, layers=1, batch=2, seq=4, vocab=16)
    params = init_params(c, 0)
    batch = init_batch(c, 1)
    loss, grads = jax.jit(lambda p, b: train_step(p, b, c))(params, batch)
    assert np.isfinite(float(loss))
    # Uniform logits would give log(16); a random model is near it.
    assert abs(float(loss) - np.log(16)) < 1.0
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(np.abs(np.asarray(g)).sum() > 0 for g in jax.tree.leaves(grads))


def test_named_scopes_reach_the_compiled_metadata():
    params = abstract_params(TINY)
    x, _ = abstract_batch(TINY)
    text = jax.jit(lambda p, x: forward(p, x, TINY)).lower(params, x).compile().as_text()
    assert "/attention/" in text and "/mlp/" in text
