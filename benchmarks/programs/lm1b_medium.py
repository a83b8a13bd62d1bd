"""A Flax Linen decoder-only language model in the style of Flax's lm1b example, widened to
GPT-2-medium width: 8 pre-norm blocks of d_model 1024, 16 heads of 64, an MLP of 4096, a vocabulary
of 32,000, sequences of 1024 tokens, 32 a step.

The way lm1b builds and shards its state: parameters boxed with
``nn.with_logical_partitioning``, the residual stream constrained with
``nn.with_logical_constraint``, the abstract state made by ``jax.eval_shape`` of ``init`` and the
optimizer's, the shardings by ``nn.logical_to_mesh_sharding`` of the boxes' logical names under the
rules in force. The train step takes the parameters, the optimizer's state (AdamW) and a batch of
tokens, and returns the updated state and the loss (next-token cross-entropy). Nothing is
allocated: every argument is a ``jax.ShapeDtypeStruct`` with its sharding. Written for Auto mesh
axes (``axis_types="auto"``).

``RULES`` are the rule sets a user of lm1b would write by hand: data parallel, the weights also
split over the data axis (FSDP-like), and data with Megatron tensor parallelism.
"""

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

RULES = {
    "dp": [
        ("batch", "data"),
        ("length", None),
        ("vocab", None),
        ("embed", None),
        ("heads", None),
        ("mlp", None),
    ],
    "fsdp": [
        ("batch", "data"),
        ("length", None),
        ("vocab", None),
        ("embed", "data"),
        ("heads", None),
        ("mlp", None),
    ],
    "dp_tp": [
        ("batch", "data"),
        ("length", None),
        ("vocab", "model"),
        ("embed", None),
        ("heads", "model"),
        ("mlp", "model"),
    ],
}


@dataclass(frozen=True)
class Config:
    vocab: int = 32_000
    d_model: int = 1024
    heads: int = 16
    head_dim: int = 64
    mlp: int = 4096
    layers: int = 8
    length: int = 1024
    batch: int = 32
    #: the activations' type; the parameters and the optimizer's state stay float32
    dtype: jnp.dtype = jnp.bfloat16


CONFIG = Config()


def _init(names):
    return nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)


class Attention(nn.Module):
    """Causal multi-head self-attention; each projection's kernel is ``(d_model, heads x
    head_dim)``, its second dimension named ``heads``."""

    cfg: Config

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        b, n, _ = x.shape

        def project(name):
            y = nn.Dense(
                c.heads * c.head_dim,
                use_bias=False,
                dtype=c.dtype,
                kernel_init=_init(("embed", "heads")),
                name=name,
            )(x)
            return y.reshape(b, n, c.heads, c.head_dim)

        q, k, v = project("query"), project("key"), project("value")
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(c.head_dim).astype(c.dtype)
        causal = jnp.tril(jnp.ones((n, n), bool))
        scores = jnp.where(causal, scores, jnp.finfo(c.dtype).min)
        weights = jax.nn.softmax(scores.astype(jnp.float32)).astype(c.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, n, c.heads * c.head_dim)
        return nn.Dense(
            c.d_model,
            use_bias=False,
            dtype=c.dtype,
            kernel_init=_init(("heads", "embed")),
            name="out",
        )(out)


class Mlp(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        h = nn.Dense(c.mlp, use_bias=False, dtype=c.dtype, kernel_init=_init(("embed", "mlp")))(x)
        h = nn.gelu(h)
        return nn.Dense(
            c.d_model, use_bias=False, dtype=c.dtype, kernel_init=_init(("mlp", "embed"))
        )(h)


class Block(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        scale = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        h = nn.LayerNorm(dtype=self.cfg.dtype, use_bias=False, scale_init=scale)(x)
        x = x + Attention(self.cfg)(h)
        h = nn.LayerNorm(dtype=self.cfg.dtype, use_bias=False, scale_init=scale)(x)
        return x + Mlp(self.cfg)(h)


class Decoder(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.cfg
        embed = nn.Embed(
            c.vocab,
            c.d_model,
            embedding_init=nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("vocab", "embed")
            ),
        )
        x = embed(tokens).astype(c.dtype)
        for i in range(c.layers):
            x = Block(c, name=f"block_{i}")(x)
        scale = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
        x = nn.LayerNorm(dtype=c.dtype, use_bias=False, scale_init=scale, name="final_norm")(x)
        return nn.Dense(
            c.vocab,
            use_bias=False,
            dtype=c.dtype,
            kernel_init=_init(("embed", "vocab")),
            name="logits",
        )(x)


def unbox(tree):
    """The values of a tree of logically partitioned boxes (lm1b unboxes them the same way)."""
    return jax.tree.map(
        lambda x: x.unbox() if isinstance(x, nn.spmd.LogicallyPartitioned) else x,
        tree,
        is_leaf=lambda x: isinstance(x, nn.spmd.LogicallyPartitioned),
    )


def optimizer():
    return optax.adamw(3e-4, weight_decay=0.1)


def make_step(mesh, rules, cfg=CONFIG):
    """The jitted train step and its abstract arguments ``(params, opt_state, tokens)`` on
    ``mesh`` under ``rules``."""
    model = Decoder(cfg)
    tx = optimizer()
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.length), jnp.int32)

    def init(key):
        params = model.init(key, jnp.zeros(tokens.shape, tokens.dtype))["params"]
        return params, tx.init(params)

    boxed = jax.eval_shape(init, jax.random.key(0))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    params, opt_state = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), unbox(boxed), shardings
    )
    batch = NamedSharding(mesh, nn.logical_to_mesh_axes(("batch", "length"), rules))
    tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=batch)

    def loss_fn(params, tokens):
        # each position predicts its own token from those before it (lm1b shifts right too)
        inputs = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
        logits = model.apply({"params": params}, inputs)
        labels = jax.nn.one_hot(tokens, cfg.vocab, dtype=jnp.float32)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits.astype(jnp.float32)), -1))

    def train_step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # the state is updated in place, as lm1b's train step donates it
    return jax.jit(train_step, donate_argnums=(0, 1)), (params, opt_state, tokens)
