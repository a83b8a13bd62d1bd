"""A small Flax NNX train step with logical axis names (the Flax sharding guide's pattern), for
Auto mesh axes (the compiler propagates the variables' shardings)."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import shardscope

#: Candidate logical-axis rules: data parallel, tensor parallel, both.
RULES = {
    "dp": [("batch", "data"), ("embed", None), ("hidden", None)],
    "tp": [("batch", None), ("embed", None), ("hidden", "model")],
    "dp_tp": [("batch", "data"), ("embed", None), ("hidden", "model")],
}


class MLP(nnx.Module):
    def __init__(self, d: int, f: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(
            d,
            f,
            use_bias=False,
            rngs=rngs,
            kernel_init=nnx.with_partitioning(init, ("embed", "hidden")),
        )
        self.down = nnx.Linear(
            f,
            d,
            use_bias=False,
            rngs=rngs,
            kernel_init=nnx.with_partitioning(init, ("hidden", "embed")),
        )

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss(model):
        return jnp.mean((model(x) - y) ** 2)

    value, grads = nnx.value_and_grad(loss)(model)
    optimizer.update(model, grads)
    return value


def make_step(mesh, rules=()):
    """The jitted step and its abstract arguments on ``mesh`` (nothing allocated)."""

    def create():
        model = MLP(64, 256, nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    with jax.set_mesh(mesh):  # as Flax's guide creates sharded variables
        state = nnx.eval_shape(create)
    model, optimizer = shardscope.abstract(state, nnx.get_partition_spec(state), mesh=mesh)
    batch = shardscope.abstract(
        jax.ShapeDtypeStruct((32, 64), jnp.float32),
        shardscope.logical_to_spec(("batch", None), rules),
        mesh=mesh,
    )
    return train_step, (model, optimizer, batch, batch)
