"""The reference decoder's serving steps: prefill (a batch of prompts, writing the KV cache)
and decode (one token per sequence, reading the cache of the context so far).

The cache is ``{"k": ..., "v": ...}``, each ``[layers, batch, context, kv_heads, head_dim]``:
grouped-query attention's smaller cache, one entry per key/value head. Decode writes the new
token's key and value at ``pos`` (``lax.dynamic_update_slice``) and attends over the first
``pos + 1`` positions; a server compiles it with the cache donated, so that the update is in
place. The layers are scanned, the weights are the training model's (:func:`init_params`),
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
from shardscope._src.model.transformer import NO_HOOKS, Hooks, _norm, mlp


def abstract_cache(config: ModelConfig, batch: int, context: int, dtype: Any = None) -> Any:
    """The KV cache of ``batch`` sequences of ``context`` tokens as ``jax.ShapeDtypeStruct``."""
    shape = (config.layers, batch, context, config.kv_heads, config.head_dim)
    dt = jnp.dtype(dtype or config.dtype)
    return {"k": jax.ShapeDtypeStruct(shape, dt), "v": jax.ShapeDtypeStruct(shape, dt)}


def init_cache(config: ModelConfig, batch: int, context: int, dtype: Any = None) -> Any:
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
    """``q`` ``[b, s, kv, g, hd]`` over ``k``, ``v`` ``[b, t, kv, hd]`` where ``visible``
    ``[s, t]`` allows; returns ``[b, s, kv * g, hd]``."""
    scores = jnp.einsum("bskgh,btkh->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(visible, scores / math.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgst,btkh->bskgh", probs, v)
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


def prefill(
    params: dict[str, Any], tokens: Any, config: ModelConfig, context: int, hooks: Hooks = NO_HOOKS
) -> tuple[Any, Any]:
    """``(logits [batch, prompt, vocab], cache)``: the prompts' forward pass, their keys and
    values written to the first ``prompt`` positions of a cache of ``context``."""
    check_servable(config)
    batch, prompt = tokens.shape
    x = hooks.residual(jnp.take(hooks.weight("embed", params["embed"]), tokens, axis=0))
    causal = jnp.tril(jnp.ones((prompt, prompt), dtype=bool))

    def layer(x: Any, p: dict[str, Any]) -> tuple[Any, Any]:
        with jax.named_scope("attention"):
            q, k, v = _qkv(p, x, hooks)
            a = _out(p, _attend(q, k, v, causal), hooks)
        x = hooks.residual(x + a)
        x = hooks.residual(x + mlp(p, x, hooks))
        pad = ((0, 0), (0, context - prompt), (0, 0), (0, 0))
        return x, (jnp.pad(k, pad), jnp.pad(v, pad))

    x, (ks, vs) = jax.lax.scan(layer, x, params["layers"])
    return _logits(params, x, hooks), {"k": ks, "v": vs}


def decode(
    params: dict[str, Any],
    cache: Any,
    tokens: Any,
    pos: Any,
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
) -> tuple[Any, Any]:
    """``(logits [batch, vocab], cache)``: one token per sequence (``tokens`` ``[batch]``) at
    position ``pos``, its key and value written to the cache and attending over positions
    ``0 .. pos``."""
    check_servable(config)
    x = hooks.residual(jnp.take(hooks.weight("embed", params["embed"]), tokens[:, None], axis=0))
    context = cache["k"].shape[2]
    visible = (jnp.arange(context) <= pos)[None, :]

    def layer(carry: Any, p: Any) -> tuple[Any, None]:
        # The whole cache is carried and each layer writes its new key and value into it in
        # place: as the scan's output instead, the cache would be a second buffer (XLA does
        # not alias a scan's stacked outputs with its inputs), twice the cache in memory.
        x, ks, vs, i = carry
        with jax.named_scope("attention"):
            q, k, v = _qkv(p, x, hooks)
            ks = jax.lax.dynamic_update_slice(ks, k[None], (i, 0, pos, 0, 0))
            vs = jax.lax.dynamic_update_slice(vs, v[None], (i, 0, pos, 0, 0))
            k_cache = jax.lax.dynamic_index_in_dim(ks, i, keepdims=False)
            v_cache = jax.lax.dynamic_index_in_dim(vs, i, keepdims=False)
            a = _out(p, _attend(q, k_cache, v_cache, visible), hooks)
        x = hooks.residual(x + a)
        x = hooks.residual(x + mlp(p, x, hooks))
        return (x, ks, vs, i + 1), None

    start = (x, cache["k"], cache["v"], jnp.zeros((), jnp.int32))
    (x, ks, vs, _), _ = jax.lax.scan(layer, start, params["layers"])
    return _logits(params, x, hooks)[:, 0], {"k": ks, "v": vs}
