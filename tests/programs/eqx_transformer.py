"""A small Llama-like decoder in Equinox (RMSNorm, causal attention, SwiGLU, an untied head)
and its optax train step, with no logical names: Equinox users write a spec per array. The
three hand-written sets below are such specs, by the end of each weight's path."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

VOCAB, D, HEADS, HEAD_DIM, F, LAYERS = 4096, 256, 4, 64, 1024, 2
BATCH, SEQ = 16, 256
optim = optax.adamw(1e-3)


class Block(eqx.Module):
    attn_norm: jax.Array
    q: eqx.nn.Linear
    k: eqx.nn.Linear
    v: eqx.nn.Linear
    o: eqx.nn.Linear
    mlp_norm: jax.Array
    gate: eqx.nn.Linear
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        ks = jax.random.split(key, 7)
        self.attn_norm = jnp.ones(D)
        self.q = eqx.nn.Linear(D, HEADS * HEAD_DIM, use_bias=False, key=ks[0])
        self.k = eqx.nn.Linear(D, HEADS * HEAD_DIM, use_bias=False, key=ks[1])
        self.v = eqx.nn.Linear(D, HEADS * HEAD_DIM, use_bias=False, key=ks[2])
        self.o = eqx.nn.Linear(HEADS * HEAD_DIM, D, use_bias=False, key=ks[3])
        self.mlp_norm = jnp.ones(D)
        self.gate = eqx.nn.Linear(D, F, use_bias=False, key=ks[4])
        self.up = eqx.nn.Linear(D, F, use_bias=False, key=ks[5])
        self.down = eqx.nn.Linear(F, D, use_bias=False, key=ks[6])

    def __call__(self, x):  # x: (seq, D), one sequence
        s = x.shape[0]

        def norm(x, g):
            return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g

        h = norm(x, self.attn_norm)
        q, k, v = (jax.vmap(f)(h).reshape(s, HEADS, HEAD_DIM) for f in (self.q, self.k, self.v))
        scores = jnp.einsum("shk,thk->hst", q, k) / HEAD_DIM**0.5
        causal = jnp.tril(jnp.ones((s, s), bool))
        p = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + jax.vmap(self.o)(jnp.einsum("hst,thk->shk", p, v).reshape(s, HEADS * HEAD_DIM))
        h = norm(x, self.mlp_norm)
        return x + jax.vmap(self.down)(jax.nn.silu(jax.vmap(self.gate)(h)) * jax.vmap(self.up)(h))


class Decoder(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    norm: jax.Array
    head: eqx.nn.Linear

    def __init__(self, key):
        ks = jax.random.split(key, LAYERS + 2)
        self.embed = eqx.nn.Embedding(VOCAB, D, key=ks[0])
        self.blocks = [Block(k) for k in ks[1:-1]]
        self.norm = jnp.ones(D)
        self.head = eqx.nn.Linear(D, VOCAB, use_bias=False, key=ks[-1])

    def __call__(self, tokens):  # tokens: (seq,)
        x = jax.vmap(self.embed)(tokens)
        for block in self.blocks:
            x = block(x)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * self.norm
        return jax.vmap(self.head)(x)


@eqx.filter_jit
def train_step(model, opt_state, tokens, targets):
    def loss(model):
        logits = jax.vmap(model)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return value, eqx.apply_updates(model, updates), opt_state


def arguments():
    """The step's arguments, abstract and unsharded (nothing allocated)."""

    def create():
        model = Decoder(jax.random.key(0))
        return model, optim.init(eqx.filter(model, eqx.is_array))

    model, opt_state = eqx.filter_eval_shape(create)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)
    return model, opt_state, tokens, tokens


#: Hand-written specs by the end of a weight's path (Equinox's Linear weight is (out, in)):
#: data parallel, Megatron's tensor parallel, both. The tokens' spec is under "tokens".
SPECS = {
    "dp": {"tokens": P("data")},
    "tp": {
        "q.weight": P("model", None),
        "k.weight": P("model", None),
        "v.weight": P("model", None),
        "o.weight": P(None, "model"),
        "gate.weight": P("model", None),
        "up.weight": P("model", None),
        "down.weight": P(None, "model"),
        "embed.weight": P("model", None),
        "head.weight": P("model", None),
        "tokens": P(),
    },
}
SPECS["dp_tp"] = {**SPECS["tp"], "tokens": P("data")}


def _spec_of(path, leaf, specs):
    name = jax.tree_util.keystr(path)
    if name.startswith("[2]") or name.startswith("[3]"):
        return specs.get("tokens", P())
    for suffix, spec in specs.items():
        if name.replace("'", "").replace("[", ".").replace("]", "").endswith(suffix):
            return spec
    return P()


def make_step_with(name):
    """``make_step(mesh)`` of the hand-written set ``name`` (``"dp"``, ``"tp"``, ``"dp_tp"``)."""
    specs = SPECS[name]

    def make_step(mesh):
        def shard(path, leaf):
            if not hasattr(leaf, "shape"):
                return leaf
            sharding = NamedSharding(mesh, _spec_of(path, leaf, specs))
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

        return train_step, jax.tree_util.tree_map_with_path(shard, arguments())

    make_step.__name__ = f"make_step_{name}"
    return make_step


def make_step(mesh):
    """The step and its arguments, unsharded: ``shardscope shard`` searches them array by
    array (``make_step_with`` gives the hand-written sets)."""
    return train_step, arguments()
