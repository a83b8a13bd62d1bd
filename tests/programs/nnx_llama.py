"""A small Llama-like decoder in Flax NNX with logical axis names on every weight (RMSNorm,
causal attention, SwiGLU, an untied output head) and its train step, for Auto mesh axes; the
tokens are named with ``shardscope.logical_to_spec``."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import shardscope

VOCAB, D, HEADS, HEAD_DIM, F, LAYERS = 8192, 512, 8, 64, 2048, 2
BATCH, SEQ = 32, 512

#: Three hand-written rule sets: data parallel, tensor parallel (Megatron's), both.
RULES = {
    "dp": [("batch", "data"), ("vocab", None), ("embed", None), ("heads", None), ("mlp", None)],
    "tp": [
        ("batch", None),
        ("vocab", "model"),
        ("embed", None),
        ("heads", "model"),
        ("mlp", "model"),
    ],
    "dp_tp": [
        ("batch", "data"),
        ("vocab", "model"),
        ("embed", None),
        ("heads", "model"),
        ("mlp", "model"),
    ],
}


def _linear(d_in, d_out, names, rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init, rngs=rngs)


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        ones = nnx.with_partitioning(nnx.initializers.ones_init(), ("embed",))
        self.attn_norm = nnx.RMSNorm(D, scale_init=ones, rngs=rngs)
        self.q = _linear(D, HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        self.k = _linear(D, HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        self.v = _linear(D, HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        self.o = _linear(HEADS * HEAD_DIM, D, ("heads", "embed"), rngs)
        self.mlp_norm = nnx.RMSNorm(D, scale_init=ones, rngs=rngs)
        self.gate = _linear(D, F, ("embed", "mlp"), rngs)
        self.up = _linear(D, F, ("embed", "mlp"), rngs)
        self.down = _linear(F, D, ("mlp", "embed"), rngs)

    def __call__(self, x):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (f(h).reshape(b, s, HEADS, HEAD_DIM) for f in (self.q, self.k, self.v))
        scores = jnp.einsum("bshk,bthk->bhst", q, k) / HEAD_DIM**0.5
        causal = jnp.tril(jnp.ones((s, s), bool))
        p = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + self.o(jnp.einsum("bhst,bthk->bshk", p, v).reshape(b, s, HEADS * HEAD_DIM))
        h = self.mlp_norm(x)
        return x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed"))
        self.embed = nnx.Embed(VOCAB, D, embedding_init=init, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        ones = nnx.with_partitioning(nnx.initializers.ones_init(), ("embed",))
        self.norm = nnx.RMSNorm(D, scale_init=ones, rngs=rngs)
        self.head = _linear(D, VOCAB, ("embed", "vocab"), rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


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
        model = Decoder(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    with jax.set_mesh(mesh):
        state = nnx.eval_shape(create)
    model, optimizer = shardscope.abstract(state, nnx.get_partition_spec(state), mesh=mesh)
    tokens = shardscope.abstract(
        jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),
        shardscope.logical_to_spec(("batch", None), rules),
        mesh=mesh,
    )
    return train_step, (model, optimizer, tokens, tokens)
