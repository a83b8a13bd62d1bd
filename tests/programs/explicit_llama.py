"""A Llama-like decoder written for Explicit mesh axes, as jax-llm-examples writes its models:
weights as sharded ``ShapeDtypeStruct``, every matmul's result sharding said with
``out_sharding=``, the layers scanned, the activations moved with ``jax.sharding.reshard``, and
``make_step`` on the mesh it is given (``jax.make_mesh`` gives Explicit axes)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, reshard
from jax.sharding import PartitionSpec as P

D, F, HEADS, HEAD_DIM, VOCAB, LAYERS = 64, 128, 4, 16, 256, 2
BATCH, SEQ = 8, 16

#: Each weight's shape and sharding: heads and the hidden dimension over `model`.
WEIGHTS = {
    "embed": ((VOCAB, D), P(None, "model")),
    "wq": ((LAYERS, D, HEADS, HEAD_DIM), P(None, None, "model", None)),
    "wo": ((LAYERS, HEADS, HEAD_DIM, D), P(None, "model", None, None)),
    "w1": ((LAYERS, D, F), P(None, None, "model")),
    "w2": ((LAYERS, F, D), P(None, "model", None)),
    "norm": ((LAYERS, D), P(None, None)),
}


def layer(x, w):
    h = x * w["norm"]
    q = jnp.einsum("bsd,dhk->bshk", h, w["wq"], out_sharding=P("data", None, "model", None))
    scores = jax.nn.softmax(jnp.einsum("bshk,bthk->bhst", q, q), axis=-1)
    o = jnp.einsum("bhst,bthk->bshk", scores, q)
    out = jnp.einsum("bshk,hkd->bsd", o, w["wo"], out_sharding=P("data", None, None))  # attn_out
    x = x + out
    u = jnp.einsum("bsd,df->bsf", x, w["w1"], out_sharding=P("data", None, "model"))
    down = jnp.einsum("bsf,fd->bsd", jax.nn.silu(u), w["w2"], out_sharding=P("data", None, None))
    x = x + down
    return x, None


def forward(weights, tokens):
    x = weights["embed"].at[tokens].get(out_sharding=P("data", None, None))
    x, _ = jax.lax.scan(layer, x, {k: v for k, v in weights.items() if k != "embed"})
    x = reshard(x, P("data", None, None))
    return jnp.einsum("bsd,vd->bsv", x, weights["embed"], out_sharding=P("data", None, "model"))


@jax.jit
def train_step(weights, tokens):
    def loss(w):
        return jnp.mean(jax.nn.logsumexp(forward(w, tokens), axis=-1))

    value, grads = jax.value_and_grad(loss)(weights)
    return value, jax.tree.map(lambda w, g: w - 1e-3 * g, weights, grads)


def make_step(mesh):
    weights = {
        name: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
        for name, (shape, spec) in WEIGHTS.items()
    }
    batch = NamedSharding(mesh, P("data"))
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32, sharding=batch)
    return train_step, (weights, tokens)
