"""The reference decoder's serving steps: prefill (a batch of prompts, writing the KV cache)
and decode (one token per sequence, reading the cache of the context so far).

A server holds its weights layer by layer (:func:`serving_params` unstacks the training
tree's ``layers``) and its cache as one ``{"k": ..., "v": ...}`` per layer, each ``[batch,
kv_heads, context, head_dim]``: grouped-query attention's smaller cache, one entry per
key/value head, heads before positions so that attention reads each head's keys and values
where they lie. The layers are unrolled: a loop over stacked weights would have the GPU
compiler copy each layer's slice out of the stack before its matmuls read it, three passes
of the weights through memory where a server makes one (measured on the H100 compiler).

Decode writes the new token's key and value at ``pos`` (``lax.dynamic_update_slice``) and
attends over the first ``pos + 1`` positions; a server compiles it with the cache donated,
so that the update is in place. The weights are the training model's (:func:`init_params`),
and the MLP is its own :func:`~shardscope._src.model.transformer.mlp`, so a strategy's
placement shards serving as it shards training (tensor parallelism: the heads and the MLP
split, two all-reduces a layer).

A mixture of experts runs its layers with experts after its dense ones, their MLP the
training model's :func:`~shardscope._src.model.transformer.moe_mlp` (under an expert axis,
its dispatch and combine all-to-alls), its tokens routed in ``groups`` groups (one per
device the batch is split over). Latent attention (DeepSeek-V2 and V3) caches each token's
normed latent and rotary key, ``{"latent", "rope"}`` a layer, shared by the heads; decode
attends against them with the up-projections absorbed, prefill as training does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from shardscope._src.base.errors import ModelConfigError, PlanError
from shardscope._src.base.vocab import Vocab
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.fused import fused_norm as _norm
from shardscope._src.model.transformer import (
    NO_HOOKS,
    Hooks,
    abstract_params,
    mlp,
    moe_mlp,
)


class WeightFormat(Vocab):
    """The formats a server holds its weights and its KV cache in."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    INT8 = "int8"
    FP8 = "fp8"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {"float32": 4, "bfloat16": 2, "float16": 2}.get(self.value, 1)

    @property
    def eight_bit(self) -> bool:
        """Held in 8 bits with a scale (:data:`EIGHT_BIT`)."""
        return self in EIGHT_BIT


#: Formats of weights and cache held in 8 bits, each with a scale: ``int8`` (rounded, within
#: +-127) and ``fp8`` (``float8_e4m3fn``, within +-448).
EIGHT_BIT: dict[str, tuple[Any, float]] = {
    WeightFormat.INT8: (jnp.int8, 127.0),
    WeightFormat.FP8: (jnp.float8_e4m3fn, 448.0),
}

#: Bytes per element of each format, by its name.
FORMATS = {f.value: f.itemsize for f in WeightFormat}


def cache_bytes_per_token(config: ModelConfig, cache: str = "bfloat16") -> int:
    """The KV cache of one token: ``2 x kv_heads x head_dim x layers`` elements of ``cache``
    (one of :data:`FORMATS`); under latent attention, the latent and the rotary key each
    layer, ``(kv_lora_rank + rope_head_dim) x layers``, shared by the heads.

    >>> from shardscope._src.model.presets import model_preset
    >>> cache_bytes_per_token(model_preset("llama3-70b").config(batch=1), "int8")
    163840
    >>> cache_bytes_per_token(model_preset("deepseek-v3").config(batch=1))  # 576 x 61 x 2
    70272
    """
    if cache not in FORMATS:
        raise PlanError(f"cache={cache!r}: give one of {', '.join(FORMATS)}")
    size = FORMATS[cache]
    if config.is_mla:
        return (config.kv_lora_rank + config.rope_head_dim) * config.layers * size
    assert config.kv_heads is not None and config.head_dim is not None
    return 2 * config.kv_heads * config.head_dim * config.layers * size


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Quantized:
    """A tensor held in 8 bits: ``values x scale`` is it (``scale`` a float32 scalar, one
    per weight matrix of a layer, or per layer's keys or values: the per-tensor scaling
    servers use for 8-bit weights and caches)."""

    values: Any
    scale: Any

    def dequantized(self, dtype: Any) -> Any:
        return self.values.astype(dtype) * self.scale.astype(dtype)


def quantize(x: Any, fmt: str, scale: Any = None) -> Quantized:
    """``x`` in ``fmt`` (``int8`` or ``fp8``), scaled so that its largest magnitude is the
    format's (or by the ``scale`` given)."""
    dtype, top = EIGHT_BIT[fmt]
    if scale is None:
        scale = jnp.maximum(jnp.max(jnp.abs(x)).astype(jnp.float32), 1e-12) / top
    y = x.astype(jnp.float32) / scale
    y = jnp.clip(jnp.round(y) if fmt == "int8" else y, -top, top)
    return Quantized(y.astype(dtype), jnp.asarray(scale, jnp.float32))


def _matrix(x: Any) -> bool:
    return len(x.shape) >= 2


def quantize_weights(params: dict[str, Any], fmt: str) -> dict[str, Any]:
    """:func:`serving_params`' tree with every weight matrix (not the norms' gains) in
    ``fmt``, one scale each."""
    tree = serving_params(params)
    return jax.tree.map(lambda w: quantize(w, fmt) if _matrix(w) else w, tree)


def abstract_quantized(tree: Any, fmt: str, specs: Any = None) -> Any:
    """``tree`` (of ``jax.ShapeDtypeStruct``) with every matrix as a :class:`Quantized` of
    ``fmt``; with ``specs`` (a tree of ``PartitionSpec`` alike), the specs for it instead
    (the values split as the matrix, the scale replicated)."""
    dtype = EIGHT_BIT[fmt][0]
    if specs is not None:
        return jax.tree.map(
            lambda w, s: Quantized(s, jax.sharding.PartitionSpec()) if _matrix(w) else s,
            tree,
            specs,
            is_leaf=_is_spec,
        )
    return jax.tree.map(
        lambda w: (
            Quantized(jax.ShapeDtypeStruct(w.shape, dtype), jax.ShapeDtypeStruct((), jnp.float32))
            if _matrix(w)
            else w
        ),
        tree,
    )


#: The named scope of the attention core (its scores, softmax and weighted values): what a
#: server runs as one fused kernel (FlashAttention in a prefill, a decoding kernel over the
#: cache), so that the scores never reach device memory; the planner prices the compiled
#: program's instructions in it as that one kernel
#: (:func:`~shardscope._src.audit.overlap.kernel_costs`).
ATTENTION_CORE = "attention_core"

#: A sublayer's first matmul's weight (its input scaled) and its last's (its output).
_FIRST = {"attention": ("wqkv",), "mlp": ("w_gate_up", "w_up")}
_LAST = {"attention": "wo", "mlp": "w_down"}


class _Scaled(Hooks):
    """One layer's 8-bit matmuls: each weight read as its 8-bit values, converted where the
    matmul reads them, and its scale moved onto the activations (a per-tensor scale
    commutes with the matmul): the sublayer's normed input times its first weight's scale,
    its output times its last's. Written as ``values x scale``, the weight would be
    dequantized into memory first, twice its bytes in 16 bits and read again (measured on
    the H100 compiler)."""

    def __init__(self, base: Hooks, scales: dict[str, Any], dtype: Any) -> None:
        self.base, self.scales, self.dtype = base, scales, dtype
        self.expert_devices = base.expert_devices

    def _scale(self, name: str | None) -> Any:
        got = self.scales.get(name) if name is not None else None
        return None if got is None else got.astype(self.dtype)

    def residual(self, x: Any) -> Any:
        return self.base.residual(x)

    def enter(self, scope: str, h: Any) -> Any:
        h = self.base.enter(scope, h)
        first = next((n for n in _FIRST.get(scope, ()) if n in self.scales), None)
        scale = self._scale(first)
        return h if scale is None else h * scale

    def heads(self, x: Any) -> Any:
        return self.base.heads(x)

    def keys(self, x: Any) -> Any:
        return self.base.keys(x)

    def hidden(self, x: Any) -> Any:
        return self.base.hidden(x)

    def exit(self, scope: str, y: Any) -> Any:
        scale = self._scale(_LAST.get(scope))
        return self.base.exit(scope, y if scale is None else y * scale)

    def weight(self, name: str, w: Any) -> Any:
        return self.base.weight(name, w)

    def moe(self, point: str, x: Any) -> Any:
        return self.base.moe(point, x)


def _layer_weights(
    p: dict[str, Any], hooks: Hooks, dtype: Any
) -> tuple[dict[str, Any], Hooks, dict[str, Any]]:
    """A layer's weights as its matmuls read them, the hooks that scale them (8-bit
    weights' values converted to ``dtype``, see :class:`_Scaled`), and their scales in
    ``dtype`` (for the matmuls the hooks do not reach: a mixture's and latent attention's,
    which scale their own inputs or outputs, :func:`_scaled`)."""
    scales = {k: w.scale.astype(dtype) for k, w in p.items() if isinstance(w, Quantized)}
    if not scales:
        return p, hooks, scales
    read = {k: w.values.astype(dtype) if isinstance(w, Quantized) else w for k, w in p.items()}
    return read, _Scaled(hooks, scales, dtype), scales


def _scaled(y: Any, scales: dict[str, Any], name: str) -> Any:
    """``y``, a matmul's output by weight ``name``, times that weight's scale where it is
    held in 8 bits (a per-tensor scale commutes with the matmul)."""
    scale = scales.get(name)
    return y if scale is None else y * scale


#: The stacks of a parameter tree, in the order the layers run: the dense layers, then a
#: mixture of experts' layers with experts.
STACKS = ("layers", "moe_layers")


def serving_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with its stacked ``layers`` (and a mixture's ``moe_layers``) as a tuple of
    one tree per layer (a tree whose stacks are already tuples is returned as it is)."""
    out = dict(params)
    for stack in STACKS:
        layers = params.get(stack)
        if layers is None or isinstance(layers, tuple):
            continue
        leaves = jax.tree.leaves(layers)
        count = int(leaves[0].shape[0]) if leaves else 0
        out[stack] = tuple(_layer(layers, i) for i in range(count))
    return out


def _is_spec(x: Any) -> bool:
    return isinstance(x, jax.sharding.PartitionSpec)


def _layer(layers: Any, i: int) -> Any:
    def one(x: Any) -> Any:
        if _is_spec(x):
            return jax.sharding.PartitionSpec(*tuple(x)[1:])
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
        return x[i]

    return jax.tree.map(one, layers, is_leaf=_is_spec)


def _counts(config: ModelConfig) -> dict[str, int]:
    return {"layers": config.dense_layer_count, "moe_layers": config.moe_layers}


def abstract_serving_params(config: ModelConfig) -> dict[str, Any]:
    """:func:`~shardscope._src.model.transformer.abstract_params` layer by layer."""
    params = abstract_params(config)
    counts = _counts(config)
    return {
        **params,
        **{
            k: tuple(_layer(params[k], 0) for _ in range(n))
            for k, n in counts.items()
            if k in params
        },
    }


def serving_specs(specs: dict[str, Any], config: ModelConfig) -> dict[str, Any]:
    """A placement's parameter specs (stacked layers) for :func:`serving_params`' tree of
    ``config``."""
    counts = _counts(config)
    return {
        **specs,
        **{
            k: tuple(_layer(specs[k], 0) for _ in range(n)) for k, n in counts.items() if k in specs
        },
    }


def abstract_cache(
    config: ModelConfig, batch: int, context: int, dtype: Any = None
) -> tuple[dict[str, Any], ...]:
    """The KV cache of ``batch`` sequences of ``context`` tokens as ``jax.ShapeDtypeStruct``:
    one ``{"k", "v"}`` per layer, each ``[batch, kv_heads, context, head_dim]`` of
    ``dtype`` (the model's by default), or a :class:`Quantized` of it for ``"int8"`` or
    ``"fp8"``. Under latent attention, one ``{"latent", "rope"}`` per layer, ``[batch,
    context, kv_lora_rank]`` and ``[batch, context, rope_head_dim]``: each token's normed
    key-value latent and its rotary key, shared by every head (what DeepSeek-V2's servers
    cache; apart, so that attention reads each where it lies, not a slice copied out)."""
    shapes: dict[str, tuple[int, ...]]
    if config.is_mla:
        shapes = {
            "latent": (batch, context, config.kv_lora_rank),
            "rope": (batch, context, config.rope_head_dim),
        }
    else:
        assert config.kv_heads is not None and config.head_dim is not None
        shape = (batch, config.kv_heads, context, config.head_dim)
        shapes = {"k": shape, "v": shape}

    def one(shape: tuple[int, ...]) -> Any:
        if isinstance(dtype, str) and dtype in EIGHT_BIT:
            return Quantized(
                jax.ShapeDtypeStruct(shape, EIGHT_BIT[dtype][0]),
                jax.ShapeDtypeStruct((), jnp.float32),
            )
        return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype or config.dtype))

    return tuple({k: one(v) for k, v in shapes.items()} for _ in range(config.layers))


def init_cache(
    config: ModelConfig, batch: int, context: int, dtype: Any = None
) -> tuple[dict[str, Any], ...]:
    """An empty KV cache (zeros, and unit scales) of the shapes :func:`abstract_cache` gives."""
    return jax.tree.map(
        lambda s: jnp.ones(s.shape, s.dtype) if s.shape == () else jnp.zeros(s.shape, s.dtype),
        abstract_cache(config, batch, context, dtype),
    )


def _qkv(p: dict[str, Any], x: Any, hooks: Hooks) -> tuple[Any, Any, Any]:
    """The normed input's queries ``[b, s, kv, group, hd]``, keys and values ``[b, s, kv, hd]``."""
    h = hooks.enter("attention", _norm(x, hooks.weight("attn_norm", p["attn_norm"])))
    qkv = jnp.einsum("bsd,dkgh->bskgh", h, hooks.weight("wqkv", p["wqkv"]))
    group = qkv.shape[3] - 2
    return qkv[:, :, :, :group], qkv[:, :, :, group], qkv[:, :, :, group + 1]


def _attend(q: Any, k: Any, v: Any, visible: Any) -> Any:
    """``q`` ``[b, s, kv, g, hd]`` over ``k``, ``v`` ``[b, kv, t, hd]`` (or a
    :class:`Quantized` of them: the values converted where the matmuls read them, the scales
    on the scores and the output) where ``visible`` ``[s, t]`` allows; returns ``[b, s,
    kv * g, hd]``."""
    with jax.named_scope(ATTENTION_CORE):
        k_scale = v_scale = None
        if isinstance(k, Quantized):
            k, k_scale = k.values.astype(q.dtype), k.scale
        if isinstance(v, Quantized):
            v, v_scale = v.values.astype(q.dtype), v.scale
        scores = jnp.einsum("bskgh,bkth->bkgst", q, k, preferred_element_type=jnp.float32)
        if k_scale is not None:
            scores = scores * k_scale
        scores = jnp.where(visible, scores / math.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        o = jnp.einsum("bkgst,bkth->bskgh", probs, v)
        if v_scale is not None:
            o = o * v_scale.astype(o.dtype)
    b, s, kv, g, hd = o.shape
    return o.reshape(b, s, kv * g, hd)


def _out(p: dict[str, Any], o: Any, hooks: Hooks) -> Any:
    return hooks.exit("attention", jnp.einsum("bqhk,hkd->bqd", o, hooks.weight("wo", p["wo"])))


def _latent_qkv(
    p: dict[str, Any], x: Any, hooks: Hooks, scales: dict[str, Any]
) -> tuple[Any, Any, Any]:
    """Latent attention's queries ``[b, s, heads, qk]``, and the tokens' normed key-value
    latents ``[b, s, rank]`` and rotary keys ``[b, s, rope]`` (what the cache holds), as
    :func:`~shardscope._src.model.transformer.latent_attention` computes them."""
    h = hooks.enter("attention", _norm(x, hooks.weight("attn_norm", p["attn_norm"])))
    if "wq_a" in p:
        cq = jnp.einsum("bsd,dr->bsr", h, hooks.weight("wq_a", p["wq_a"]))
        cq = _norm(_scaled(cq, scales, "wq_a"), hooks.weight("q_norm", p["q_norm"]))
        q = jnp.einsum("bsr,rhk->bshk", cq, hooks.weight("wq_b", p["wq_b"]))
        q = _scaled(q, scales, "wq_b")
    else:
        q = jnp.einsum("bsd,dhk->bshk", h, hooks.weight("wq", p["wq"]))
        q = _scaled(q, scales, "wq")
    ckv = jnp.einsum("bsd,dr->bsr", h, hooks.weight("wkv_a", p["wkv_a"]))
    ckv = _scaled(ckv, scales, "wkv_a")
    rank = p["kv_norm"].shape[-1]
    latent = _norm(ckv[..., :rank], hooks.weight("kv_norm", p["kv_norm"]))
    return q, latent, ckv[..., rank:]


def _values(x: Any, dtype: Any) -> tuple[Any, Any]:
    """``x`` and its scale (None unless it is :class:`Quantized`: its values in ``dtype``)."""
    if isinstance(x, Quantized):
        return x.values.astype(dtype), x.scale
    return x, None


def _latent_attend(
    p: dict[str, Any],
    q: Any,
    latent: Any,
    rope: Any,
    visible: Any,
    hooks: Hooks,
    scales: dict[str, Any],
) -> Any:
    """``q`` ``[b, s, heads, nope + rope]`` over the cached latents ``[b, t, rank]`` and
    rotary keys ``[b, t, rope]`` (or a :class:`Quantized` of them, the scales on the scores
    and the output) where ``visible`` ``[s, t]`` allows, the up-projections absorbed
    (DeepSeek-V2, section 2.1.2):
    each head's query taken into the latent by its key up-projection, its scores against
    the latents themselves, and their weighted latent out through its value up-projection,
    so that no head's keys or values are made from the cache (a decode step's form: its
    FLOPs grow with the context by ``heads x (2 rank + rope)``, not ``heads x (nope + rope +
    v) x rank``). Returns ``[b, s, heads, v]``."""
    wkv_b = hooks.weight("wkv_b", p["wkv_b"])
    nope = q.shape[-1] - (rope.values if isinstance(rope, Quantized) else rope).shape[-1]
    w_uk, w_uv = wkv_b[..., :nope], wkv_b[..., nope:]
    q_latent = _scaled(jnp.einsum("bshn,rhn->bshr", q[..., :nope], w_uk), scales, "wkv_b")
    with jax.named_scope(ATTENTION_CORE):
        latent, latent_scale = _values(latent, q.dtype)
        rope, rope_scale = _values(rope, q.dtype)
        scores = jnp.einsum("bshr,btr->bhst", q_latent, latent, preferred_element_type=jnp.float32)
        if latent_scale is not None:
            scores = scores * latent_scale
        by_rope = jnp.einsum(
            "bshp,btp->bhst", q[..., nope:], rope, preferred_element_type=jnp.float32
        )
        scores = scores + (by_rope if rope_scale is None else by_rope * rope_scale)
        scores = jnp.where(visible, scores / math.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        o_latent = jnp.einsum("bhst,btr->bshr", probs, latent)
        if latent_scale is not None:
            o_latent = o_latent * latent_scale.astype(o_latent.dtype)
    return _scaled(jnp.einsum("bshr,rhv->bshv", o_latent, w_uv), scales, "wkv_b")


def _latent_expand(
    p: dict[str, Any], q: Any, latent: Any, rope: Any, hooks: Hooks, scales: dict[str, Any]
) -> Any:
    """A prompt's latent attention with each head's keys and values made from its latents
    ``[b, s, rank]`` and rotary keys ``[b, s, rope]``, as the training forward does
    (prefill's compute-bound form): returns ``[b, s, heads, v]``."""
    wkv_b = hooks.weight("wkv_b", p["wkv_b"])
    kv = _scaled(jnp.einsum("bsr,rhk->bshk", latent, wkv_b), scales, "wkv_b")
    b, s, heads, _ = q.shape
    nope = q.shape[-1] - rope.shape[-1]
    rope = jnp.broadcast_to(rope[:, :, None, :], (b, s, heads, rope.shape[-1]))
    k = jnp.concatenate([kv[..., :nope], rope], axis=-1).transpose(0, 2, 1, 3)
    v = kv[..., nope:].transpose(0, 2, 1, 3)  # [b, heads, s, v]: each head its own
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    return _attend(q[:, :, :, None, :], k, v, causal)


def _logits(params: dict[str, Any], x: Any, hooks: Hooks) -> Any:
    x = _norm(x, hooks.weight("final_norm", params["final_norm"]))
    name = "unembed" if "unembed" in params else "embed"
    w, scale = params[name], None
    if isinstance(w, Quantized):  # the scale on the logits (see _Scaled)
        w, scale = w.values.astype(x.dtype), w.scale.astype(x.dtype)
    w = hooks.weight(name, w)
    out = jnp.einsum("bsd,dv->bsv" if name == "unembed" else "bsd,vd->bsv", x, w)
    return out if scale is None else out * scale


def check_servable(config: ModelConfig) -> None:
    """Refuses what the serving steps do not build: a model without a vocabulary."""
    if config.vocab is None:
        raise ModelConfigError(
            "serving needs a vocabulary: give the model vocab=N", param=("model", "vocab")
        )


def _layers(params: dict[str, Any]) -> list[tuple[Any, bool]]:
    """Each layer's weights in the order they run, and whether it has experts."""
    tree = serving_params(params)
    out: list[tuple[Any, bool]] = []
    for stack in STACKS:
        layers = tree.get(stack, ())
        assert isinstance(layers, tuple)
        out.extend((layer, stack == "moe_layers") for layer in layers)
    return out


def _mlp(
    p: dict[str, Any],
    x: Any,
    config: ModelConfig,
    hooks: Hooks,
    experts: bool,
    groups: int,
    scales: dict[str, Any],
) -> Any:
    """A layer's MLP sublayer: the dense one, or a mixture's (its tokens routed in
    ``groups`` groups, :func:`~shardscope._src.model.transformer.moe_mlp`, with its 8-bit
    weights' ``scales``)."""
    if not experts:
        return mlp(p, x, hooks)
    return moe_mlp(p, x, config, hooks, groups=groups, scales=scales)


def _embed(params: dict[str, Any], tokens: Any, hooks: Hooks, dtype: Any) -> Any:
    """The tokens' rows of the embedding (an 8-bit table dequantized row by row)."""
    table = params["embed"]
    if isinstance(table, Quantized):
        return Quantized(jnp.take(table.values, tokens, axis=0), table.scale).dequantized(dtype)
    return jnp.take(hooks.weight("embed", table), tokens, axis=0)


def _format(c: Quantized) -> str:
    return next(f for f, (dt, _) in EIGHT_BIT.items() if c.values.dtype == jnp.dtype(dt))


def _store(old: Any, new: Any, at: tuple[Any, ...]) -> Any:
    """``old`` (a layer's keys or values) with ``new`` written at ``at``, in its format (an
    8-bit cache at its own scale)."""
    if isinstance(old, Quantized):
        q = quantize(new, _format(old), old.scale)
        return Quantized(jax.lax.dynamic_update_slice(old.values, q.values, at), old.scale)
    return jax.lax.dynamic_update_slice(old, new.astype(old.dtype), at)


def prefill(
    params: dict[str, Any],
    tokens: Any,
    config: ModelConfig,
    context: int,
    hooks: Hooks = NO_HOOKS,
    *,
    cache: str | None = None,
    groups: int = 1,
) -> tuple[Any, tuple[dict[str, Any], ...]]:
    """``(logits [batch, vocab], cache)``: the prompts' forward pass and the logits of
    their last token (the first token generated), their keys and values written to the
    first ``prompt`` positions of a cache of ``context`` (in the model's dtype, or
    ``cache="int8"`` / ``"fp8"``, each layer's keys and values scaled by their largest
    magnitude in the prompts). ``params`` is the training tree, :func:`serving_params`' or
    :func:`quantize_weights`' (the layers unrolled either way). A mixture of experts routes
    the tokens in ``groups`` groups (one per device the prompts are split over: each
    capacity-padded on its own)."""
    check_servable(config)
    layers = _layers(params)
    dtype = jnp.dtype(config.dtype)
    batch, prompt = tokens.shape
    x = hooks.residual(_embed(params, tokens, hooks, dtype))
    causal = jnp.tril(jnp.ones((prompt, prompt), dtype=bool))

    def kept(t: Any, positions: int) -> Any:  # padded to the context along ``positions``
        pad = [(0, 0)] * t.ndim
        pad[positions] = (0, context - prompt)
        t = jnp.pad(t, pad)
        return t if cache is None else quantize(t, cache)

    written = []
    for layer, experts in layers:
        p, h, scales = _layer_weights(layer, hooks, dtype)
        with jax.named_scope("attention"):
            if config.is_mla:
                q, latent, rope = _latent_qkv(p, x, h, scales)
                a = _out(p, _latent_expand(p, q, latent, rope, h, scales), h)
                written.append({"latent": kept(latent, 1), "rope": kept(rope, 1)})
            else:
                q, k, v = _qkv(p, x, h)
                k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kv, s, hd]
                a = _out(p, _attend(q, k, v, causal), h)
                written.append({"k": kept(k, 2), "v": kept(v, 2)})
        x = h.residual(x + a)
        x = h.residual(x + _mlp(p, x, config, h, experts, groups, scales))
    return _logits(params, x[:, -1:], hooks)[:, 0], tuple(written)


def decode(
    params: dict[str, Any],
    cache: Any,
    tokens: Any,
    pos: Any,
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
    *,
    groups: int = 1,
) -> tuple[Any, tuple[dict[str, Any], ...]]:
    """``(logits [batch, vocab], cache)``: one token per sequence (``tokens`` ``[batch]``) at
    position ``pos``, its key and value written to each layer's cache (in the cache's
    format) and attending over positions ``0 .. pos``; a mixture of experts routes the
    tokens in ``groups`` groups (as :func:`prefill`)."""
    check_servable(config)
    layers = _layers(params)
    dtype = jnp.dtype(config.dtype)
    x = hooks.residual(_embed(params, tokens[:, None], hooks, dtype))
    first = cache[0]["latent" if config.is_mla else "k"]
    context = (first.values if isinstance(first, Quantized) else first).shape[-2]
    visible = (jnp.arange(context) <= pos)[None, :]
    written = []
    for (layer, experts), kv in zip(layers, cache, strict=True):
        p, h, scales = _layer_weights(layer, hooks, dtype)
        with jax.named_scope("attention"):
            if config.is_mla:
                q, latent, rope = _latent_qkv(p, x, h, scales)
                ls = _store(kv["latent"], latent, (0, pos, 0))
                rs = _store(kv["rope"], rope, (0, pos, 0))
                a = _out(p, _latent_attend(p, q, ls, rs, visible, h, scales), h)
                written.append({"latent": ls, "rope": rs})
            else:
                q, k, v = _qkv(p, x, h)
                at = (0, 0, pos, 0)
                ks = _store(kv["k"], k.transpose(0, 2, 1, 3), at)
                vs = _store(kv["v"], v.transpose(0, 2, 1, 3), at)
                a = _out(p, _attend(q, ks, vs, visible), h)
                written.append({"k": ks, "v": vs})
        x = h.residual(x + a)
        x = h.residual(x + _mlp(p, x, config, h, experts, groups, scales))
    return _logits(params, x, hooks)[:, 0], tuple(written)
