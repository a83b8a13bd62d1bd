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
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from shardscope._src.base.errors import ModelConfigError
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.transformer import NO_HOOKS, Hooks, _norm, abstract_params, mlp


def serving_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with its stacked ``layers`` (arrays) as a tuple of one tree per layer (a
    tree whose layers are already a tuple is returned as it is)."""
    layers = params["layers"]
    if isinstance(layers, tuple):
        return params
    count = int(jax.tree.leaves(layers)[0].shape[0])
    return {**params, "layers": tuple(_layer(layers, i) for i in range(count))}


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


def abstract_serving_params(config: ModelConfig) -> dict[str, Any]:
    """:func:`~shardscope._src.model.transformer.abstract_params` layer by layer."""
    params = abstract_params(config)
    layers = params["layers"]
    return {**params, "layers": tuple(_layer(layers, 0) for _ in range(config.layers))}


def serving_specs(specs: dict[str, Any], layers: int) -> dict[str, Any]:
    """A placement's parameter specs (stacked layers) for :func:`serving_params`' tree."""
    one = _layer(specs["layers"], 0)
    return {**specs, "layers": tuple(one for _ in range(layers))}


def abstract_cache(
    config: ModelConfig, batch: int, context: int, dtype: Any = None
) -> tuple[dict[str, Any], ...]:
    """The KV cache of ``batch`` sequences of ``context`` tokens as ``jax.ShapeDtypeStruct``:
    one ``{"k", "v"}`` per layer, each ``[batch, kv_heads, context, head_dim]``."""
    shape = (batch, config.kv_heads, context, config.head_dim)
    dt = jnp.dtype(dtype or config.dtype)
    one = {"k": jax.ShapeDtypeStruct(shape, dt), "v": jax.ShapeDtypeStruct(shape, dt)}
    return tuple(dict(one) for _ in range(config.layers))


def init_cache(
    config: ModelConfig, batch: int, context: int, dtype: Any = None
) -> tuple[dict[str, Any], ...]:
    """An empty KV cache (zeros) of the shapes :func:`abstract_cache` gives."""
    return jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), abstract_cache(config, batch, context, dtype)
    )


def _qkv(p: dict[str, Any], x: Any, hooks: Hooks) -> tuple[Any, Any, Any]:
    """The normed input's queries ``[b, s, kv, group, hd]``, keys and values ``[b, s, kv, hd]``."""
    h = hooks.enter("attention", _norm(x, hooks.weight("attn_norm", p["attn_norm"])))
    qkv = jnp.einsum("bsd,dkgh->bskgh", h, hooks.weight("wqkv", p["wqkv"]))
    group = qkv.shape[3] - 2
    return qkv[:, :, :, :group], qkv[:, :, :, group], qkv[:, :, :, group + 1]


def _attend(q: Any, k: Any, v: Any, visible: Any) -> Any:
    """``q`` ``[b, s, kv, g, hd]`` over ``k``, ``v`` ``[b, kv, t, hd]`` where ``visible``
    ``[s, t]`` allows; returns ``[b, s, kv * g, hd]``."""
    scores = jnp.einsum("bskgh,bkth->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(visible, scores / math.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgst,bkth->bskgh", probs, v)
    b, s, kv, g, hd = o.shape
    return o.reshape(b, s, kv * g, hd)


def _out(p: dict[str, Any], o: Any, hooks: Hooks) -> Any:
    return hooks.exit("attention", jnp.einsum("bqhk,hkd->bqd", o, hooks.weight("wo", p["wo"])))


def _logits(params: dict[str, Any], x: Any, hooks: Hooks) -> Any:
    x = _norm(x, hooks.weight("final_norm", params["final_norm"]))
    if "unembed" in params:
        return jnp.einsum("bsd,dv->bsv", x, hooks.weight("unembed", params["unembed"]))
    return jnp.einsum("bsd,vd->bsv", x, hooks.weight("embed", params["embed"]))


def check_servable(config: ModelConfig) -> None:
    """Refuses what the serving steps do not build: a mixture of experts, latent attention
    (its cache is the latent), a model without a vocabulary."""
    config.require_dense("the reference decoder's serving steps")
    if config.is_mla:
        raise ModelConfigError(
            f"the reference decoder's serving steps cache grouped-query attention's keys and "
            f"values, and this model has latent attention (kv_lora_rank={config.kv_lora_rank}): "
            f"its cache (the latent) is not modelled yet",
            param="model",
        )
    if config.vocab is None:
        raise ModelConfigError(
            "serving needs a vocabulary: give the model vocab=N", param=("model", "vocab")
        )


def _layers(params: dict[str, Any]) -> tuple[Any, ...]:
    layers = serving_params(params)["layers"]
    assert isinstance(layers, tuple)
    return layers


def prefill(
    params: dict[str, Any], tokens: Any, config: ModelConfig, context: int, hooks: Hooks = NO_HOOKS
) -> tuple[Any, tuple[dict[str, Any], ...]]:
    """``(logits [batch, vocab], cache)``: the prompts' forward pass and the logits of
    their last token (the first token generated), their keys and values written to the
    first ``prompt`` positions of a cache of ``context``. ``params`` is the training tree or
    :func:`serving_params`' (the layers unrolled either way)."""
    check_servable(config)
    batch, prompt = tokens.shape
    x = hooks.residual(jnp.take(hooks.weight("embed", params["embed"]), tokens, axis=0))
    causal = jnp.tril(jnp.ones((prompt, prompt), dtype=bool))
    pad = ((0, 0), (0, 0), (0, context - prompt), (0, 0))
    cache = []
    for p in _layers(params):
        with jax.named_scope("attention"):
            q, k, v = _qkv(p, x, hooks)
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kv, s, hd]
            a = _out(p, _attend(q, k, v, causal), hooks)
        x = hooks.residual(x + a)
        x = hooks.residual(x + mlp(p, x, hooks))
        cache.append({"k": jnp.pad(k, pad), "v": jnp.pad(v, pad)})
    return _logits(params, x[:, -1:], hooks)[:, 0], tuple(cache)


def decode(
    params: dict[str, Any],
    cache: Any,
    tokens: Any,
    pos: Any,
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
) -> tuple[Any, tuple[dict[str, Any], ...]]:
    """``(logits [batch, vocab], cache)``: one token per sequence (``tokens`` ``[batch]``) at
    position ``pos``, its key and value written to each layer's cache and attending over
    positions ``0 .. pos``."""
    check_servable(config)
    x = hooks.residual(jnp.take(hooks.weight("embed", params["embed"]), tokens[:, None], axis=0))
    context = cache[0]["k"].shape[2]
    visible = (jnp.arange(context) <= pos)[None, :]
    written = []
    for p, kv in zip(_layers(params), cache, strict=True):
        with jax.named_scope("attention"):
            q, k, v = _qkv(p, x, hooks)
            at = (0, 0, pos, 0)
            ks = jax.lax.dynamic_update_slice(kv["k"], k.transpose(0, 2, 1, 3), at)
            vs = jax.lax.dynamic_update_slice(kv["v"], v.transpose(0, 2, 1, 3), at)
            a = _out(p, _attend(q, ks, vs, visible), hooks)
        x = hooks.residual(x + a)
        x = hooks.residual(x + mlp(p, x, hooks))
        written.append({"k": ks, "v": vs})
    return _logits(params, x, hooks)[:, 0], tuple(written)
