"""A small Equinox train step with optax (the Equinox parallelism example's pattern), for Auto
mesh axes (`eqx.filter_shard` is a sharding constraint)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

import shardscope

RULES = {
    "dp": [("batch", "data"), ("hidden", None)],
    "dp_tp": [("batch", "data"), ("hidden", "model")],
}
#: Logical names of each weight's dimensions, by the end of its path.
NAMES = {
    "layers.0.weight": ("hidden", None),
    "layers.0.bias": ("hidden",),
    "layers.1.weight": (None, "hidden"),
    "layers.1.bias": (None,),
}
optim = optax.adam(1e-3)


@eqx.filter_jit
def train_step(model, opt_state, x, y):
    def loss(model):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return value, eqx.apply_updates(model, updates), opt_state


def make_step(mesh, rules=()):
    def spec(path, leaf):
        for suffix, names in NAMES.items():
            if path.endswith(suffix):
                return shardscope.logical_to_spec(names, rules)
        return shardscope.logical_to_spec((None,) * len(leaf.shape), rules)

    def create():
        model = eqx.nn.MLP(64, 64, 256, 1, key=jax.random.key(0))
        return model, optim.init(eqx.filter(model, eqx.is_array))

    model, opt_state = eqx.filter_eval_shape(create)
    model, opt_state = shardscope.abstract((model, opt_state), spec, mesh=mesh)
    batch_sharding = NamedSharding(mesh, shardscope.logical_to_spec(("batch", None), rules))
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=batch_sharding)
    return train_step, (model, opt_state, x, x)
