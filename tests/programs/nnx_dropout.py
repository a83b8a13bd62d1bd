"""A Flax NNX model with Dropout (its state holds PRNG keys), trained with nnx.jit, its
variables created inside ``with jax.set_mesh(mesh):`` as Flax's guide does. Written for Auto
mesh axes."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(
            32, 128, rngs=rngs, kernel_init=nnx.with_partitioning(init, (None, "model"))
        )
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.down = nnx.Linear(
            128, 32, rngs=rngs, kernel_init=nnx.with_partitioning(init, ("model", None))
        )

    def __call__(self, x):
        return self.down(self.drop(jax.nn.relu(self.up(x))))


@nnx.jit
def train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss


def create():
    model = Model(nnx.Rngs(0, dropout=1))
    return model, nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
