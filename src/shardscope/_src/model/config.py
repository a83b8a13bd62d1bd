"""The reference decoder: RMSNorm, causal multi-head attention and an MLP, in plain JAX.

Parameters are a plain dict pytree with the layers stacked on a leading axis, so the same
parameters run unrolled or under ``lax.scan``. The forward pass calls a :class:`Hooks` object
at the points where a parallel strategy constrains or communicates (a sublayer's entry, its
per-head and hidden activations, its exit), so one model serves the unsharded reference, every
jit strategy (sharding constraints) and the shard_map twins (explicit collectives). Each
sublayer runs inside ``jax.named_scope("attention")`` or ``("mlp")``: the compiled program's
``op_name`` metadata then says which sublayer a collective belongs to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from shardscope._src.base.errors import ModelConfigError, is_int

DTYPES = ("float32", "bfloat16", "float16")
_EPS = 1e-6


#: The largest dimension a config takes: far beyond any model, and short of where XLA's shape
#: arithmetic overflows or a divisor search in an error message takes minutes.
MAX_DIM = 2**20


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference decoder and of one batch.

    Without ``vocab`` the model maps activations ``[batch, seq, d_model]`` to activations and
    the training loss is the mean squared error against a target of the same shape; with
    ``vocab`` it embeds int32 tokens, ends with a final norm and an unembedding, and the loss
    is next-token cross entropy against target tokens.

    >>> ModelConfig(d_model=64, heads=8, ff=256).head_dim
    8
    """

    d_model: int = 64
    heads: int = 8
    ff: int = 256
    layers: int = 2
    batch: int = 8
    seq: int = 16
    dtype: str = "float32"
    vocab: int | None = None
    scan: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "ff", "layers", "batch", "seq"):
            value = getattr(self, name)
            if not is_int(value, 1):
                raise ModelConfigError(f"model config {name}={value!r}: must be a positive integer")
        for name in ("d_model", "heads", "ff", "layers", "batch", "seq", "vocab"):
            value = getattr(self, name)
            if isinstance(value, int) and value > MAX_DIM:
                raise ModelConfigError(
                    f"model config {name}={value}: dimensions go up to {MAX_DIM} (2**20), far "
                    f"beyond any model; choose a smaller {name}"
                )
        if self.vocab is not None and (not is_int(self.vocab, 1)):
            raise ModelConfigError(
                f"model config vocab={self.vocab!r}: must be a positive integer or None "
                f"(None: the model maps activations to activations, no embedding)"
            )
        if self.d_model % self.heads:
            raise ModelConfigError(
                f"model config d_model={self.d_model} is not divisible by heads={self.heads}; "
                f"each head needs d_model / heads dimensions: choose heads dividing "
                f"{self.d_model}, e.g. heads={_divisor_near(self.d_model, self.heads)}"
            )
        if self.dtype not in DTYPES:
            raise ModelConfigError(
                f"model config dtype={self.dtype!r}: must be one of {', '.join(DTYPES)}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def itemsize(self) -> int:
        return {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype]

    def param_count(self) -> int:
        """Number of parameters (every entry of :func:`param_shapes`)."""
        return sum(math.prod(shape) for shape in param_shapes(self).values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _divisor_near(n: int, want: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), -d))


# -- parameters ----------------------------------------------------------------------------

# Per-layer weights; stacked, each gets a leading ``layers`` axis.
LAYER_PARAMS = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_up", "w_down")
# Weights outside the layer stack, present only with a vocabulary.
VOCAB_PARAMS = ("embed", "final_norm", "unembed")


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every parameter; layer weights carry the leading layers axis.

    ``wqkv`` is ``[d_model, 3, heads, head_dim]`` (queries, keys, values) and ``wo`` is
    ``[heads, head_dim, d_model]``, so sharding by heads is sharding one named dimension. The
    three projections are one weight so that their input gradient is one sum: as three
    matmuls, the partitioner all-reduces three partial gradients under tensor parallelism.
    """
    c = config
    L, d, h, k = c.layers, c.d_model, c.heads, c.head_dim
    shapes = {
        "attn_norm": (L, d),
        "wqkv": (L, d, 3, h, k),
        "wo": (L, h, k, d),
        "mlp_norm": (L, d),
        "w_up": (L, d, c.ff),
        "w_down": (L, c.ff, d),
    }
    if c.vocab is not None:
        shapes.update(embed=(c.vocab, d), final_norm=(d,), unembed=(d, c.vocab))
    return shapes


def split_params(flat: dict[str, Any]) -> dict[str, Any]:
    """``{name: leaf}`` -> the model's pytree ``{"layers": {...}, "embed": ..., ...}``."""
    tree: dict[str, Any] = {"layers": {k: flat[k] for k in LAYER_PARAMS}}
    tree.update({k: flat[k] for k in VOCAB_PARAMS if k in flat})
    return tree


def flat_params(tree: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split_params`."""
    out = dict(tree["layers"])
    out.update({k: v for k, v in tree.items() if k != "layers"})
    return out


def abstract_params(config: ModelConfig) -> dict[str, Any]:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves: nothing is allocated."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(config.dtype)
    return split_params(
        {k: jax.ShapeDtypeStruct(s, dtype) for k, s in param_shapes(config).items()}
    )


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random parameters: weights ~ N(0, 1/fan_in), norm gains ~ 1 + N(0, 0.1^2).

    Drawn with NumPy's generator (seeded, on the host): no compile, unlike ``jax.random``.
    """
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(config.dtype)
    fan_in = {
        "wqkv": config.d_model,
        "wo": config.d_model,
        "w_up": config.d_model,
        "w_down": config.ff,
        "embed": 1,
        "unembed": config.d_model,
    }
    flat = {}
    for name, shape in param_shapes(config).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm"):
            value = 1.0 + 0.1 * noise
        else:
            value = noise / np.float32(math.sqrt(fan_in[name]))
        flat[name] = jnp.asarray(value, dtype=dtype)
    return split_params(flat)


def abstract_batch(config: ModelConfig) -> tuple[Any, Any]:
    """``(inputs, targets)`` as ``jax.ShapeDtypeStruct``: tokens with a vocab, else activations."""
    import jax
    import jax.numpy as jnp

    if config.vocab is None:
        act = jax.ShapeDtypeStruct((config.batch, config.seq, config.d_model), config.dtype)
        return act, act
    tok = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    return tok, tok


def init_batch(config: ModelConfig, seed: int = 1) -> tuple[Any, Any]:
    """A random ``(inputs, targets)`` pair of the shapes :func:`abstract_batch` gives."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    if config.vocab is None:
        shape = (config.batch, config.seq, config.d_model)
        return tuple(  # type: ignore[return-value]
            jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=config.dtype)
            for _ in range(2)
        )
    shape = (config.batch, config.seq)
    return tuple(  # type: ignore[return-value]
        jnp.asarray(rng.integers(0, config.vocab, shape), dtype=jnp.int32) for _ in range(2)
    )


# -- hooks -----------------------------------------------------------------------------------


class Hooks:
    """Where a parallel strategy acts on the forward pass. The base class changes nothing.

    ``scope`` is ``"attention"`` or ``"mlp"``. Shapes are global under jit and per-device
    inside shard_map.
    """

    def residual(self, x: Any) -> Any:
        """The residual stream ``[batch, seq, d_model]`` between sublayers."""
        return x

    def enter(self, scope: str, h: Any) -> Any:
        """The normed input of a sublayer, just before its first matmul."""
        return h

    def heads(self, x: Any) -> Any:
        """Queries, keys and values ``[batch, seq, heads, head_dim]``."""
        return x

    def hidden(self, x: Any) -> Any:
        """The MLP hidden activation ``[batch, seq, ff]``."""
        return x

    def exit(self, scope: str, y: Any) -> Any:
        """A sublayer's output ``[batch, seq, d_model]``, before the residual add."""
        return y

    def weight(self, name: str, w: Any) -> Any:
        """A weight (one layer's slice for layer weights) at its use."""
        return w


NO_HOOKS = Hooks()


# -- forward pass --------------------------------------------------------------------------


def rms_norm(x: Any, gain: Any) -> Any:
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    scale = jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _EPS))
    return (x32 * scale).astype(x.dtype) * gain


def attention(p: dict[str, Any], x: Any, hooks: Hooks) -> Any:
    """Causal multi-head self-attention sublayer (pre-norm); returns its output only."""
    import jax
    import jax.numpy as jnp

    with jax.named_scope("attention"):
        h = hooks.enter("attention", rms_norm(x, hooks.weight("attn_norm", p["attn_norm"])))
        qkv = jnp.einsum("bsd,dthk->bsthk", h, hooks.weight("wqkv", p["wqkv"]))
        q, k, v = (hooks.heads(qkv[:, :, i]) for i in range(3))
        seq = q.shape[1]
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32)
        scores = scores / math.sqrt(q.shape[-1])
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        o = hooks.heads(jnp.einsum("bhqs,bshk->bqhk", probs, v))
        out = jnp.einsum("bqhk,hkd->bqd", o, hooks.weight("wo", p["wo"]))
        return hooks.exit("attention", out)


def mlp(p: dict[str, Any], x: Any, hooks: Hooks) -> Any:
    """GELU MLP sublayer (pre-norm); returns its output only."""
    import jax
    import jax.numpy as jnp

    with jax.named_scope("mlp"):
        h = hooks.enter("mlp", rms_norm(x, hooks.weight("mlp_norm", p["mlp_norm"])))
        u = hooks.hidden(jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, hooks.weight("w_up", p["w_up"]))))
        out = jnp.einsum("bsf,fd->bsd", u, hooks.weight("w_down", p["w_down"]))
        return hooks.exit("mlp", out)


def decoder_layer(p: dict[str, Any], x: Any, hooks: Hooks = NO_HOOKS) -> tuple[Any, dict[str, Any]]:
    """One layer: ``x + attention(x)``, then ``+ mlp(.)``. Returns the new residual and the
    two sublayer outputs (for per-scope numerics)."""
    a = attention(p, x, hooks)
    x = hooks.residual(x + a)
    m = mlp(p, x, hooks)
    x = hooks.residual(x + m)
    return x, {"attention": a, "mlp": m}


def forward(
    params: dict[str, Any],
    inputs: Any,
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
    *,
    capture: bool = False,
) -> Any:
    """The model's output: activations ``[batch, seq, d_model]``, or logits with a vocab.

    With ``capture=True`` returns ``(output, {"attention": [layers, ...], "mlp": [...]})``,
    the sublayer outputs of every layer.
    """
    import jax
    import jax.numpy as jnp

    if config.vocab is None:
        x = inputs
    else:
        x = jnp.take(hooks.weight("embed", params["embed"]), inputs, axis=0)
    x = hooks.residual(x)

    def body(x: Any, layer: dict[str, Any]) -> tuple[Any, Any]:
        x, sub = decoder_layer(layer, x, hooks)
        return x, (sub if capture else None)

    layers = params["layers"]
    if config.scan:
        x, captured = jax.lax.scan(body, x, layers, length=config.layers)
    else:
        subs = []
        for i in range(config.layers):
            x, sub = body(x, jax.tree.map(lambda w, i=i: w[i], layers))
            subs.append(sub)
        captured = jax.tree.map(lambda *xs: jnp.stack(xs), *subs) if capture else None

    if config.vocab is not None:
        x = rms_norm(x, hooks.weight("final_norm", params["final_norm"]))
        x = jnp.einsum("bsd,dv->bsv", x, hooks.weight("unembed", params["unembed"]))
    return (x, captured) if capture else x


def loss(
    params: dict[str, Any],
    batch: tuple[Any, Any],
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
) -> Any:
    """Scalar float32 training loss: MSE against the target activations, or cross entropy."""
    inputs, targets = batch
    return loss_from_output(forward(params, inputs, config, hooks), targets, config)


def loss_from_output(out: Any, targets: Any, config: ModelConfig) -> Any:
    """The loss of a forward output against its targets (see :func:`loss`)."""
    import jax
    import jax.numpy as jnp

    out = out.astype(jnp.float32)
    if config.vocab is None:
        return jnp.mean(jnp.square(out - targets.astype(jnp.float32)))
    logp = jax.nn.log_softmax(out, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return -jnp.mean(picked)


def train_step(
    params: dict[str, Any],
    batch: tuple[Any, Any],
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
) -> tuple[Any, Any]:
    """``(loss, grads)``: one step's communication without the optimizer's update, which is
    local to each device for every strategy here."""
    import jax

    return jax.value_and_grad(loss)(params, batch, config, hooks)
