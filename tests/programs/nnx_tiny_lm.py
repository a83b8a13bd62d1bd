"""A tiny decoder-shaped train step in Flax NNX (an embedding, an RMSNorm, a ReLU MLP and an
untied head, Adam), every parameter with logical names, for Auto mesh axes: the RMSNorm's
scale has a name of its own, ``norm``, as a decoder's often has, and holds 0.1% of the
arguments' bytes."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import shardscope

VOCAB, D, F = 256, 64, 256
BATCH, SEQ = 16, 8

#: Data parallel, and data parallel with the MLP and the vocabulary over ``model``.
RULES = {
    "dp": [("batch", "data"), ("vocab", None), ("embed", None), ("mlp", None), ("norm", None)],
    "dp_tp": [
        ("batch", "data"),
        ("vocab", "model"),
        ("embed", None),
        ("mlp", "model"),
        ("norm", None),
    ],
}


def _param(rngs, shape, names):
    init = nnx.initializers.normal(shape[0] ** -0.5)
    return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=names)


class TinyLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = _param(rngs, (VOCAB, D), ("vocab", "embed"))
        self.scale = nnx.Param(jnp.ones((D,), jnp.float32), out_sharding=("norm",))
        self.up = _param(rngs, (D, F), ("embed", "mlp"))
        self.down = _param(rngs, (F, D), ("mlp", "embed"))
        self.head = _param(rngs, (D, VOCAB), ("embed", "vocab"))

    def __call__(self, tokens):
        x = jnp.take(self.embed[...], tokens, axis=0)
        h = x * jax.lax.rsqrt(jnp.mean(x**2, axis=-1, keepdims=True) + 1e-6) * self.scale[...]
        x = x + jax.nn.relu(h @ self.up[...]) @ self.down[...]
        return x @ self.head[...]


@nnx.jit
def train_step(model, optimizer, tokens, targets):
    def loss(model):
        logits = model(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    value, grads = nnx.value_and_grad(loss)(model)
    optimizer.update(model, grads)
    return value


def make_step(mesh, rules=()):
    """The jitted step and its abstract arguments on ``mesh`` (nothing allocated)."""

    def create():
        model = TinyLM(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    with jax.set_mesh(mesh):
        state = nnx.eval_shape(create)
    model, optimizer = shardscope.abstract(state, nnx.get_partition_spec(state), mesh=mesh)
    tokens = shardscope.abstract(
        jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
        shardscope.logical_to_spec(("batch", None), rules),
        mesh=mesh,
    )
    return train_step, (model, optimizer, tokens, tokens)
