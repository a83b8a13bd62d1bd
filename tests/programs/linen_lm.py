"""A Flax Linen model with logically partitioned parameters, its state built the way Flax's
lm1b example builds it: ``jax.eval_shape`` of ``init``, the boxes opened with lm1b's own helper
(``LogicallyPartitioned.unbox()``, which constrains shardings whenever a mesh is set), the
shardings from ``nn.logical_to_mesh_sharding``. Written for Auto mesh axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

RULES = {
    "dp": [("batch", "data"), ("embed", None), ("mlp", None)],
    "dp_tp": [("batch", "data"), ("embed", None), ("mlp", "model")],
}


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        up = self.param("up", nn.with_logical_partitioning(init, ("embed", "mlp")), (64, 256))
        down = self.param("down", nn.with_logical_partitioning(init, ("mlp", "embed")), (256, 64))
        return x + jax.nn.relu(x @ up) @ down


def unbox_logically_partitioned(tree):
    """lm1b's helper: the values of a tree of boxed parameters."""
    return jax.tree_util.tree_map(
        lambda x: x.unbox() if isinstance(x, nn.spmd.LogicallyPartitioned) else x,
        tree,
        is_leaf=lambda x: isinstance(x, nn.spmd.LogicallyPartitioned),
    )


def make_step(mesh, rules):
    model = Block()
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    boxed = jax.eval_shape(model.init, jax.random.key(0), x)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    params = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
        unbox_logically_partitioned(boxed),
        shardings,
    )
    batch = NamedSharding(mesh, nn.logical_to_mesh_axes(("batch", "embed"), rules))
    x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch)

    @jax.jit
    def train_step(params, x):
        grads = jax.grad(lambda p: jnp.mean(model.apply(p, x) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    return train_step, (params, x)
