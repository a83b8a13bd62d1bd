"""A Flax NNX block with logical names on every parameter and one name on an activation alone:
``length``, set inside the step by Linen's logical constraint, which no argument carries.

Its names: ``embed``, ``heads``, ``head_dim`` (the projections), ``norm`` (the scale),
``batch`` and ``embed`` (the input), ``batch``, ``length``, ``heads``, ``head_dim`` (the
activation). For Auto mesh axes."""

import jax
import jax.numpy as jnp
from flax import linen, nnx

import shardscope

#: Every logical name the program's arrays carry, as written below.
NAMES = ("batch", "length", "embed", "heads", "head_dim", "norm")


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        q_names, o_names = ("embed", "heads", "head_dim"), ("heads", "head_dim", "embed")
        self.q = nnx.Param(init(rngs.params(), (32, 4, 8)), out_sharding=q_names)
        self.o = nnx.Param(init(rngs.params(), (4, 8, 32)), out_sharding=o_names)
        self.scale = nnx.Param(jnp.ones((32,)), out_sharding=("norm",))

    def __call__(self, x):
        h = jnp.einsum("bsd,dhk->bshk", x, self.q[...])
        h = linen.with_logical_constraint(h, ("batch", "length", "heads", "head_dim"))
        return jnp.einsum("bshk,hkd->bsd", h, self.o[...]) * self.scale[...]


@nnx.jit
def step(model, x):
    return nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)


def make_step(mesh, rules=()):
    """The jitted step and its abstract arguments on ``mesh`` (nothing allocated)."""
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: Block(nnx.Rngs(0)))
    (model,) = shardscope.abstract((model,), nnx.get_partition_spec((model,)), mesh=mesh)
    x = shardscope.abstract(
        jax.ShapeDtypeStruct((8, 16, 32), jnp.float32),
        shardscope.logical_to_spec(("batch", None, "embed"), rules),
        mesh=mesh,
    )
    return step, (model, x)
