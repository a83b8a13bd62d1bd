"""The reference decoder: RMSNorm, causal attention (multi-head or grouped-query) and an MLP
(GELU or SwiGLU), in plain JAX.

Parameters are a plain dict pytree with the layers stacked on a leading axis, so the same
parameters run unrolled or under ``lax.scan``. The forward pass calls a :class:`Hooks` object
at the points where a parallel strategy constrains or communicates (a sublayer's entry, its
per-head and hidden activations, its exit), so one model serves the unsharded reference, every
jit strategy (sharding constraints) and the shard_map twins (explicit collectives). Each
sublayer runs inside ``jax.named_scope("attention")`` or ``("mlp")``: the compiled program's
``op_name`` metadata then says which sublayer a collective belongs to.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from shardscope._src.model.config import ModelConfig, param_shapes, split_params
from shardscope._src.model.fused import fused_gelu as _gelu
from shardscope._src.model.fused import fused_norm as _norm
from shardscope._src.model.fused import fused_swiglu as _swiglu
from shardscope._src.model.fused import gate_and_up
from shardscope._src.model.moe import moe_capacity, moe_dropless
from shardscope._src.model.remat import CompiledAs, Place
from shardscope._src.model.remat import remat_policy as named_policy

# -- parameters and batches ------------------------------------------------------------------


def abstract_params(config: ModelConfig) -> dict[str, Any]:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves: nothing is allocated."""

    dtype = jnp.dtype(config.dtype)
    return split_params(
        {k: jax.ShapeDtypeStruct(s, dtype) for k, s in param_shapes(config).items()}
    )


def init_params(config: ModelConfig, seed: int = 0) -> dict[str, Any]:
    """Random parameters: weights ~ N(0, 1/fan_in), norm gains ~ 1 + N(0, 0.1^2).

    Drawn with NumPy's generator (seeded, on the host): no compile, unlike ``jax.random``.
    """

    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(config.dtype)
    fan_in = {
        "wqkv": config.d_model,
        "wq": config.d_model,
        "wq_a": config.d_model,
        "wq_b": max(config.q_lora_rank, 1),
        "wkv_a": config.d_model,
        "wkv_b": max(config.kv_lora_rank, 1),
        "wo": config.heads * config.value_head_dim,
        "w_up": config.d_model,
        "w_gate_up": config.d_model,
        "w_down": config.ff,
        "embed": 1,
        "unembed": config.d_model,
        # a mixture of experts' layers with experts
        "moe_wqkv": config.d_model,
        "moe_wq": config.d_model,
        "moe_wq_a": config.d_model,
        "moe_wq_b": max(config.q_lora_rank, 1),
        "moe_wkv_a": config.d_model,
        "moe_wkv_b": max(config.kv_lora_rank, 1),
        "moe_wo": config.heads * config.value_head_dim,
        "router": config.d_model,
        "expert_gate_up": config.d_model,
        "expert_up": config.d_model,
        "expert_down": config.expert_ff or config.ff,
        "shared_gate_up": config.d_model,
        "shared_up": config.d_model,
        "shared_down": (config.expert_ff or config.ff) * max(config.shared_experts, 1),
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

    if config.vocab is None:
        act = jax.ShapeDtypeStruct((config.batch, config.seq, config.d_model), config.dtype)
        return act, act
    tok = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    return tok, tok


def init_batch(config: ModelConfig, seed: int = 1) -> tuple[Any, Any]:
    """A random ``(inputs, targets)`` pair of the shapes :func:`abstract_batch` gives."""

    rng = np.random.default_rng(seed)
    if config.vocab is None:
        shape: tuple[int, ...] = (config.batch, config.seq, config.d_model)
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

    def keys(self, x: Any) -> Any:
        """The keys or the values ``[batch, seq, kv_heads, head_dim]`` as attention uses them,
        after :meth:`heads`: every query attends to the whole sequence's, so under context
        parallelism (the sequence sharded) this is where they are gathered."""
        return x

    def positions(self, seq: int) -> Any:
        """The positions in the whole sequence of the ``seq`` queries this program holds,
        for the causal mask: ``None`` for ``0 .. seq - 1`` (the keys' own); a context shard's
        program mapped over the shards holds one part of every sequence, and attends to the
        keys gathered from all of them (:meth:`keys`)."""
        return None

    def attend(self, q: Any, k: Any, v: Any, positions: Any, core: Any) -> Any:
        """The attention core's output (the shape of ``q``, see :func:`dense_attention`) of
        the queries ``q`` over the keys ``k`` and values ``v`` of this program's part of the
        sequence, after :meth:`heads`: ``core(q, k, v, positions)`` runs the model's own
        (dense or blocked, the keys and values made whole by :meth:`keys`). Context
        parallelism's ring form runs :func:`ring_attention` instead."""
        return core(q, k, v, positions)

    def hidden(self, x: Any) -> Any:
        """The MLP hidden activation ``[batch, seq, ff]``."""
        return x

    def exit(self, scope: str, y: Any) -> Any:
        """A sublayer's output ``[batch, seq, d_model]``, before the residual add."""
        return y

    def weight(self, name: str, w: Any) -> Any:
        """A weight (one layer's slice for layer weights) at its use."""
        return w

    def norm(self, name: str, x: Any, gain: Any) -> Any:
        """The RMS norm ``name`` of the residual stream ``x`` ``[batch, seq, d_model]``, by
        its ``gain`` as :meth:`weight` gives it."""
        return _norm(x, self.weight(name, gain))

    def embed(self, table: Any, tokens: Any) -> Any:
        """The embeddings ``[batch, seq, d_model]`` of ``tokens`` looked up in ``table``
        (the embedding as :meth:`weight` gives it), before :meth:`residual`."""
        return jnp.take(table, tokens, axis=0)

    def logits_input(self, x: Any) -> Any:
        """The final norm's output ``[batch, seq, d_model]`` as the output layer takes it
        (under sequence parallelism with the vocabulary split, gathered along the
        sequence)."""
        return x

    def logits(self, name: str, x: Any, w: Any) -> Any:
        """The logits ``[batch, seq, vocab]`` of the output layer's input ``x`` (after
        :meth:`logits_input`) by ``w`` as :meth:`weight` gives it: the unembedding
        ``[d_model, vocab]`` (``name`` ``"unembed"``) or, tied, the embedding ``[vocab,
        d_model]`` (``"embed"``)."""
        return jnp.einsum("bsd,dv->bsv" if name == "unembed" else "bsd,vd->bsv", x, w)

    def moe(self, point: str, x: Any) -> Any:
        """A layer with experts' ``"tokens"``, ``"slots"`` and ``"experts"`` (see
        :func:`~shardscope._src.model.moe.moe_capacity`'s ``place``)."""
        return x

    def routed_experts(
        self, tokens: Any, router: Any, w_in: Any, w_down: Any, config: ModelConfig, groups: int
    ) -> Any:
        """The routed experts' output for ``tokens`` ``[tokens, d_model]`` in ``groups``
        groups (one per sequence): dropless, or capacity-padded with :meth:`moe` placing its
        tokens and slots."""
        if config.capacity_factor is None:
            return moe_dropless(
                tokens, router, w_in, w_down, config.top_k,
                weight_activations=config.weights_activations, group_limit=config.group_limit,
            )  # fmt: skip
        y, _ = moe_capacity(
            tokens,
            router,
            w_in,
            w_down,
            config.top_k,
            config.capacity_factor,
            groups=groups,
            place=self.moe,
            devices=self.expert_devices if config.dispatch_once else None,
            slices=self.expert_slices,
            chunks=self.context_chunks,
            weight_activations=config.weights_activations,
            group_limit=config.group_limit,
        )
        return y

    #: the devices of the expert axis (each holds ``experts / expert_devices`` experts)
    expert_devices: int = 1
    #: the groups each sequence's tokens are routed in by a layer with experts: one, or a
    #: slice of the sequence each (each device of the model axis under expert and sequence
    #: parallelism, of the context axis under expert and context parallelism, routes its
    #: own slice, as Megatron-Core routes each rank's tokens)
    sequence_groups: int = 1
    #: the slices of a sequence whose slots are gathered over the model axis for the
    #: experts' split hidden once they arrive (expert parallelism under sequence parallelism
    #: unfolded, :func:`~shardscope._src.model.moe.moe_capacity`'s ``slices``), or 1
    expert_slices: int = 1
    #: the chunks of a sequence routed apart, one on each device of the context axis
    #: (expert with context parallelism), :func:`~shardscope._src.model.moe.moe_capacity`'s
    #: ``chunks``, or 1
    context_chunks: int = 1

    def gathers(self, prim: Any, params: dict[str, Any]) -> bool:
        """Whether ``prim`` (with ``params``) gathers a weight for its use (FSDP) or the keys
        and values over the sequence (context parallelism): a train step gathers them again
        for the backward instead of keeping every layer's (PyTorch FSDP's
        ``reshard_after_forward``, DeepSpeed ZeRO-3; context parallelism's all-gather of the
        keys and values again in the backward). None here."""
        return False

    #: some weight, or the keys and values, are gathered at use (:meth:`gathers`)
    gathers_weights: bool = False


NO_HOOKS = Hooks()


# -- forward pass --------------------------------------------------------------------------


def attention(
    p: dict[str, Any], x: Any, hooks: Hooks, *, impl: str = "dense", block: int = 512
) -> Any:
    """Causal self-attention sublayer (pre-norm), multi-head or grouped-query; returns its
    output only. ``impl`` ``"dense"`` materialises the scores, ``"blocked"`` runs
    :func:`blocked_attention`."""

    if "wkv_a" in p:
        return latent_attention(p, x, hooks, impl=impl, block=block)
    with jax.named_scope("attention"):
        normed = checkpoint_name(
            hooks.norm("attn_norm", x, p["attn_norm"]), "pre_self_attention_norm"
        )
        h = hooks.enter("attention", normed)
        qkv = jnp.einsum("bsd,dkgh->bskgh", h, hooks.weight("wqkv", p["wqkv"]))
        # one matmul, named as a whole (MaxText's fused_qkv) and by part, so that a policy
        # may keep the three together or each its own way
        qkv = checkpoint_name(qkv, "qkv_proj")
        batch, seq, kv, slots, hd = qkv.shape
        group = slots - 2
        q = checkpoint_name(qkv[:, :, :, :group], "query_proj")
        q = hooks.heads(q.reshape(batch, seq, kv * group, hd))
        q = q.reshape(batch, seq, kv, group, hd)
        k = hooks.heads(checkpoint_name(qkv[:, :, :, group], "key_proj"))
        v = hooks.heads(checkpoint_name(qkv[:, :, :, group + 1], "value_proj"))

        def core(q: Any, k: Any, v: Any, pos: Any) -> Any:
            if impl == "blocked" and hooks.gathers_weights:
                # Keys and values gathered inside (context parallelism's), so that the
                # backward keeps its shard of them and gathers them again.
                return blocked_attention(
                    q, k, v, block, gather=hooks.keys, keep=hooks.heads, positions=pos
                )
            if impl == "blocked":
                return blocked_attention(q, hooks.keys(k), hooks.keys(v), block, positions=pos)
            return dense_attention(q, hooks.keys(k), hooks.keys(v), pos)

        o = hooks.attend(q, k, v, hooks.positions(seq), core)
        o = checkpoint_name(hooks.heads(o.reshape(batch, seq, kv * group, hd)), "context")
        out = jnp.einsum("bqhk,hkd->bqd", o, hooks.weight("wo", p["wo"]))
        return hooks.exit("attention", checkpoint_name(out, "out_proj"))


def latent_attention(
    p: dict[str, Any], x: Any, hooks: Hooks, *, impl: str = "dense", block: int = 512
) -> Any:
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1): the queries
    through a low-rank latent (``wq_a``, normed, ``wq_b``; or ``wq`` directly), the keys and
    values decompressed per head from one normed latent (``wkv_a`` -> ``kv_norm`` ->
    ``wkv_b``), and a rotary part of ``rope_head_dim`` query dimensions per head and key
    dimensions shared by the heads (``wkv_a``'s last ones), concatenated to the keys. The
    rotation itself (element-wise, positions) is not modelled: its dimensions, its matmuls
    and its bytes are."""
    with jax.named_scope("attention"):
        normed = checkpoint_name(
            hooks.norm("attn_norm", x, p["attn_norm"]), "pre_self_attention_norm"
        )
        h = hooks.enter("attention", normed)
        if "wq_a" in p:
            cq = jnp.einsum("bsd,dr->bsr", h, hooks.weight("wq_a", p["wq_a"]))
            cq = _norm(cq, hooks.weight("q_norm", p["q_norm"]))
            q = jnp.einsum("bsr,rhk->bshk", cq, hooks.weight("wq_b", p["wq_b"]))
        else:
            q = jnp.einsum("bsd,dhk->bshk", h, hooks.weight("wq", p["wq"]))
        q = checkpoint_name(q, "qkv_proj")
        ckv = jnp.einsum("bsd,dr->bsr", h, hooks.weight("wkv_a", p["wkv_a"]))
        rank = p["kv_norm"].shape[-1]
        latent = _norm(ckv[..., :rank], hooks.weight("kv_norm", p["kv_norm"]))
        kv = jnp.einsum("bsr,rhk->bshk", latent, hooks.weight("wkv_b", p["wkv_b"]))
        batch, seq, heads, _ = q.shape
        nope = kv.shape[-1] - p["wo"].shape[-2]
        rope = jnp.broadcast_to(ckv[:, :, None, rank:], (batch, seq, heads, ckv.shape[-1] - rank))
        q = hooks.heads(q)
        k = hooks.heads(jnp.concatenate([kv[..., :nope], rope], axis=-1))
        v = hooks.heads(kv[..., nope:])
        # every head its own key and value: one query per key/value head
        q = q[:, :, :, None, :]

        def core(q: Any, k: Any, v: Any, pos: Any) -> Any:
            if impl == "blocked":
                return blocked_attention(q, hooks.keys(k), hooks.keys(v), block, positions=pos)
            return dense_attention(q, hooks.keys(k), hooks.keys(v), pos)

        o = hooks.attend(q, k, v, hooks.positions(seq), core)
        o = checkpoint_name(hooks.heads(o.reshape(batch, seq, heads, v.shape[-1])), "context")
        out = jnp.einsum("bqhk,hkd->bqd", o, hooks.weight("wo", p["wo"]))
        return hooks.exit("attention", checkpoint_name(out, "out_proj"))


def dense_attention(q: Any, k: Any, v: Any, positions: Any = None) -> Any:
    """Causal attention with the whole ``[seq, seq]`` score matrix per head.

    ``q`` is ``[batch, seq, kv_heads, q_per_kv, head_dim]``, ``k`` and ``v`` are
    ``[batch, seq, kv_heads, head_dim]`` (or the whole sequence's, with ``positions`` the
    queries' among them: :meth:`Hooks.positions`); returns the shape of ``q``. The scores and
    probabilities are named ``attention_scores`` and ``attention_probs`` for
    ``jax.checkpoint`` policies (selective recomputation drops them).
    """

    seq = q.shape[1]
    scores = jnp.einsum("bqkgh,bskh->bkgqs", q, k, preferred_element_type=jnp.float32)
    scores = checkpoint_name(scores / math.sqrt(q.shape[-1]), "attention_scores")
    if positions is None:
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    else:
        causal = positions[:, None] >= jnp.arange(k.shape[1])[None, :]
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = checkpoint_name(jax.nn.softmax(scores, axis=-1).astype(v.dtype), "attention_probs")
    return jnp.einsum("bkgqs,bskh->bqkgh", probs, v)


def attention_block_size(seq: int, block: int) -> int:
    """The key block :func:`blocked_attention` uses: the largest divisor of ``seq`` up to
    ``block``."""
    return max(d for d in range(1, min(seq, block) + 1) if seq % d == 0)


_MASKED = -1e30  # a masked score: exp() of it minus any real maximum is exactly 0


def _block_scores(q: Any, kj: Any, j: Any, blk: int, pos: Any) -> Any:

    s = jnp.einsum("bqkgh,bskh->bkgqs", q, kj, preferred_element_type=jnp.float32)
    s = s / math.sqrt(q.shape[-1])
    rows = jnp.arange(q.shape[1]) if pos is None else pos
    visible = rows[:, None] >= (j * blk + jnp.arange(blk))[None, :]
    return jnp.where(visible, s, _MASKED)


def _by_block(x: Any, blk: int) -> Any:
    """``[batch, seq, ...]`` -> ``[seq / blk, batch, blk, ...]`` (the scanned axis first)."""

    b, s = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, s // blk, blk, *x.shape[2:]), 1, 0)


def _from_blocks(x: Any) -> Any:

    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _blocked_forward(q: Any, k: Any, v: Any, pos: Any, blk: int) -> tuple[Any, Any]:

    b, seq, kv, g, _ = q.shape
    m0 = jnp.full((b, kv, g, seq), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((b, kv, g, seq), jnp.float32)
    acc0 = jnp.zeros((b, seq, kv, g, v.shape[-1]), jnp.float32)
    blocks = (jnp.arange(k.shape[1] // blk), _by_block(k, blk), _by_block(v, blk))

    def step(carry: Any, xs: Any) -> Any:
        m, total, acc = carry
        j, kj, vj = xs
        s = _block_scores(q, kj, j, blk, pos)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        scale = jnp.exp(m - m_new)
        total = total * scale + p.sum(axis=-1)
        pv = jnp.einsum(
            "bkgqs,bskh->bqkgh", p.astype(v.dtype), vj, preferred_element_type=jnp.float32
        )
        acc = acc * jnp.moveaxis(scale, 3, 1)[..., None] + pv
        return (m_new, total, acc), None

    (m, total, acc), _ = jax.lax.scan(step, (m0, l0, acc0), blocks)
    o = (acc / jnp.moveaxis(total, 3, 1)[..., None]).astype(q.dtype)
    return o, m + jnp.log(total)


def _blocked_backward(
    blk: int, gather: Any, keep: Any, res: Any, do: Any
) -> tuple[Any, Any, Any, None]:

    q, kept_k, kept_v, pos, o, lse = res
    k, v = gather(kept_k), gather(kept_v)
    delta = jnp.moveaxis(
        jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1), 1, 3
    )  # [b, kv, g, seq]
    blocks = (jnp.arange(k.shape[1] // blk), _by_block(k, blk), _by_block(v, blk))

    def step(dq: Any, xs: Any) -> Any:
        j, kj, vj = xs
        p = jnp.exp(_block_scores(q, kj, j, blk, pos) - lse[..., None])
        dv = jnp.einsum(
            "bkgqs,bqkgh->bskh", p.astype(do.dtype), do, preferred_element_type=jnp.float32
        )
        dp = jnp.einsum("bqkgh,bskh->bkgqs", do, vj, preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[..., None]) / math.sqrt(q.shape[-1])).astype(q.dtype)
        dq = dq + jnp.einsum("bkgqs,bskh->bqkgh", ds, kj, preferred_element_type=jnp.float32)
        dk = jnp.einsum("bkgqs,bqkgh->bskh", ds, q, preferred_element_type=jnp.float32)
        return dq, (dk.astype(k.dtype), dv.astype(v.dtype))

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32), blocks)
    dk, dv = _from_blocks(dk), _from_blocks(dv)
    if dk.shape != kept_k.shape:
        # gathered from other devices' shards (an all_gather over the context shards): the
        # gather's transpose sums the gradients and scatters them back to their shards
        (dk,) = jax.linear_transpose(gather, kept_k)(dk)
        (dv,) = jax.linear_transpose(gather, kept_v)(dv)
    # the positions are integers (or None): no cotangent
    return dq.astype(q.dtype), dk, dv, None


def _make_blocked() -> Any:

    @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
    def run(q: Any, k: Any, v: Any, pos: Any, blk: int, gather: Any, keep: Any) -> Any:
        return _blocked_forward(q, gather(k), gather(v), pos, blk)[0]

    def fwd(q: Any, k: Any, v: Any, pos: Any, blk: int, gather: Any, keep: Any) -> Any:
        o, lse = _blocked_forward(q, gather(k), gather(v), pos, blk)
        # The output and its log-sum-exp are what the backward needs beyond the query, key
        # and value: both named "context" (as Transformer Engine's fused attention names its
        # output and softmax statistics), so that a policy keeping the context keeps them and
        # the backward does not run the forward again.
        o, lse = checkpoint_name(o, "context"), checkpoint_name(lse, "context")
        return o, (q, keep(k), keep(v), pos, o, lse)

    run.defvjp(fwd, _blocked_backward)
    return run


_BLOCKED: list[Any] = []


def _whole(x: Any) -> Any:
    return x


def blocked_attention(
    q: Any,
    k: Any,
    v: Any,
    block: int = 512,
    gather: Any = None,
    keep: Any = None,
    positions: Any = None,
) -> Any:
    """Causal attention over key blocks with a running softmax: memory-efficient attention
    (Rabe and Staats, arXiv 2112.05682; the FlashAttention recurrence, arXiv 2205.14135).

    Same arguments and result as :func:`dense_attention`. Only ``[seq, block]`` scores exist
    at a time; the backward pass keeps ``q``, ``k``, ``v``, the output and the per-query
    log-sum-exp, and recomputes each block's scores. ``gather`` (a function of the keys or
    the values) makes them whole along the sequence before use, in the forward and again in
    the backward, which keeps them as ``keep`` (a function of them too) places them: context
    parallelism's keys and values gathered at use, each device keeping its own shard.
    ``positions``: the queries' positions among the keys' (``None``: the same).
    """
    if not _BLOCKED:
        _BLOCKED.append(_make_blocked())
    blk = attention_block_size(q.shape[1], block)
    return _BLOCKED[0](q, k, v, positions, blk, gather or _whole, keep or _whole)


def ring_attention(q: Any, k: Any, v: Any, axis_name: Any, shards: int) -> Any:
    """Causal attention of one context shard's queries over the whole sequence, its keys and
    values passed around a ring: ring attention (Liu et al., arXiv 2310.01889), as
    Megatron-LM's and Transformer Engine's context parallelism runs it (``p2p``).

    Run per shard (inside a ``shard_map`` or a ``vmap`` with ``axis_name``) of ``shards``,
    shard ``i`` holding the ``i``-th contiguous part of every sequence: ``q`` ``[batch, seq,
    kv_heads, q_per_kv, head_dim]``, ``k`` and ``v`` ``[batch, seq, kv_heads, head_dim]``, the
    shape of ``q`` returned. Each of ``shards`` steps attends to the chunk in hand (its own
    first) and, but for the last, passes the keys and the values on to the next shard (a
    ``jax.lax.ppermute`` of each, side by side: ``shards - 1`` steps a layer), so the chunk
    from shard ``i - j`` is in hand at step ``j``; the partial results combine by the
    running softmax (the log-sum-exp rescaling of :func:`blocked_attention`), masked causally
    by the global positions of queries and keys. The shard's own chunk holds its diagonal,
    so every query sees a key at the first step and a wholly masked chunk later adds
    nothing. Autodiff
    transposes each permute into one the other way round: the keys' and values' gradients
    travel back around the ring. Each chunk is a permute's own output as the attention uses
    it (not a slice of one buffer of both), so that a ``jax.checkpoint`` policy that keeps no
    permuted chunk (:meth:`Hooks.gathers`) passes them around again for the backward.
    """
    b, seq, kv, g, _ = q.shape
    chunk = k.shape[1]
    here = jax.lax.axis_index(axis_name)
    rows = here * seq + jnp.arange(seq)
    m = jnp.full((b, kv, g, seq), -jnp.inf, jnp.float32)
    total = jnp.zeros((b, kv, g, seq), jnp.float32)
    acc = jnp.zeros((b, seq, kv, g, v.shape[-1]), jnp.float32)
    kj, vj = k, v
    onward = [(i, (i + 1) % shards) for i in range(shards)]
    for step in range(shards):
        s = jnp.einsum("bqkgh,bskh->bkgqs", q, kj, preferred_element_type=jnp.float32)
        s = checkpoint_name(s / math.sqrt(q.shape[-1]), "attention_scores")
        held = (here - step) % shards  # the shard whose chunk is in hand
        visible = rows[:, None] >= (held * chunk + jnp.arange(chunk))[None, :]
        s = jnp.where(visible, s, _MASKED)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = checkpoint_name(jnp.exp(s - m_new[..., None]), "attention_probs")
        scale = jnp.exp(m - m_new)
        total = total * scale + p.sum(axis=-1)
        pv = jnp.einsum(
            "bkgqs,bskh->bqkgh", p.astype(v.dtype), vj, preferred_element_type=jnp.float32
        )
        acc = acc * jnp.moveaxis(scale, 3, 1)[..., None] + pv
        m = m_new
        if step < shards - 1:
            kj = jax.lax.ppermute(kj, axis_name, onward)
            vj = jax.lax.ppermute(vj, axis_name, onward)
    return (acc / jnp.moveaxis(total, 3, 1)[..., None]).astype(q.dtype)


def up_projections(h: Any, w: Any) -> Any:
    """The MLP's activation of its normed input ``h`` ``[batch, seq, d_model]`` by its first
    weight ``w`` as :meth:`Hooks.weight` gives it: SwiGLU's gate and up (``w`` ``[d_model, 2,
    ff]``) as two matmuls, named ``mlpwi_0`` and ``mlpwi_1`` (MaxText's names of its
    separate ``wi_0`` and ``wi_1``), or GELU's one (``w`` ``[d_model, ff]``), ``mlpwi_0``.

    The two matmuls take the two halves of the one weight, sliced after it is gathered (the
    weight stays one parameter, gathered once under FSDP), and are differentiated as the
    one matmul of the stacked weight (:func:`~shardscope._src.model.fused.gate_and_up`): the
    backward's collectives are the fused matmul's. A policy can keep one and recompute the
    other: each runs again only for its own output."""
    if w.ndim == 2:
        return _gelu(checkpoint_name(jnp.einsum("bsd,df->bsf", h, w), "mlpwi_0"))
    gate, up = gate_and_up("bsd,dtf->bstf", h, w)
    return _swiglu(checkpoint_name(gate, "mlpwi_0"), checkpoint_name(up, "mlpwi_1"))


def mlp(p: dict[str, Any], x: Any, hooks: Hooks) -> Any:
    """MLP sublayer (pre-norm): GELU with ``w_up``, or SwiGLU with ``w_gate_up``
    (:func:`up_projections`); returns its output only."""

    with jax.named_scope("mlp"):
        normed = checkpoint_name(
            hooks.norm("mlp_norm", x, p["mlp_norm"]), "post_self_attention_norm"
        )
        h = hooks.enter("mlp", normed)
        first = "w_gate_up" if "w_gate_up" in p else "w_up"
        u = up_projections(h, hooks.weight(first, p[first]))
        u = hooks.hidden(checkpoint_name(u, "mlp_act"))
        out = jnp.einsum("bsf,fd->bsd", u, hooks.weight("w_down", p["w_down"]))
        return hooks.exit("mlp", checkpoint_name(out, "mlpwo"))


def moe_layer(p: dict[str, Any], x: Any, config: ModelConfig, hooks: Hooks = NO_HOOKS) -> Any:
    """One layer with experts: ``x + attention(x)``, then ``+`` :func:`moe_mlp`, its tokens
    routed in groups of one sequence (capacity-padded, MaxText's groups: which tokens are
    dropped does not depend on how the batch is split), or of ``hooks.sequence_groups``
    slices of one (MoE parallel folding's: which are dropped depends on the slices)."""
    x = checkpoint_name(x, "decoder_layer_input")
    a = attention(p, x, hooks, impl=config.attention, block=config.attention_block)
    x = hooks.residual(x + a)
    groups = x.shape[0] * hooks.sequence_groups
    return hooks.residual(x + moe_mlp(p, x, config, hooks, groups=groups))


def moe_mlp(
    p: dict[str, Any],
    x: Any,
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
    *,
    groups: int,
    scales: dict[str, Any] | None = None,
) -> Any:
    """A layer with experts' MLP sublayer (pre-norm), its output ``[batch, seq, d_model]``:
    the routed experts' (:mod:`shardscope._src.model.moe`: dropless, or capacity-padded at
    the config's ``capacity_factor`` in ``groups`` groups of the tokens) and the shared
    experts'.

    ``scales`` holds the per-tensor scales of weights given as 8-bit values (a server's):
    each moves onto the activations, where it commutes with its matmul: the routed experts'
    tokens enter times their first weight's scale (and the router, read whole, divided by
    it, so that it routes them as before), their output leaves times their last's; the
    shared experts' likewise."""
    s_ = {} if scales is None else scales
    with jax.named_scope("moe"):
        h = _norm(x, hooks.weight("moe_mlp_norm", p["mlp_norm"]))
        h = checkpoint_name(h, "post_self_attention_norm")
    b, s, d = h.shape
    tokens = h.reshape(b * s, d)
    name = "expert_gate_up" if "expert_gate_up" in p else "expert_up"
    w_in = hooks.weight(name, p[name])
    w_down = hooks.weight("expert_down", p["expert_down"])
    router = hooks.weight("router", p["router"])
    if "router" in s_:
        router = router * s_["router"]
    if name in s_:
        tokens, router = tokens * s_[name], router / s_[name]
    # the routed experts' scopes are moe/router, moe/dispatch, moe/experts and moe/combine
    y = hooks.routed_experts(tokens, router, w_in, w_down, config, groups).reshape(b, s, d)
    if "expert_down" in s_:
        y = y * s_["expert_down"]
    if "shared_down" in p:
        with jax.named_scope("moe/shared"):
            first = "shared_gate_up" if "shared_gate_up" in p else "shared_up"
            # a tensor-parallel MLP: its input gathered along the sequence under sequence
            # parallelism, as the dense MLP's (its output leaves by hooks.exit)
            hs = hooks.enter("moe", h)
            hs = hs * s_[first] if first in s_ else hs
            # named as the routed experts' are (mlpwi_0, mlpwi_1, mlpwo): a policy places
            # them alike
            u = up_projections(hs, hooks.weight(first, p[first]))
            down = hooks.weight("shared_down", p["shared_down"])
            u = checkpoint_name(u, "mlp_act")
            out = checkpoint_name(jnp.einsum("bsf,fd->bsd", u, down), "mlpwo")
            if "shared_down" in s_:
                out = out * s_["shared_down"]
            y = y + hooks.exit("moe", out)
    return y.astype(x.dtype)


def decoder_layer(
    p: dict[str, Any],
    x: Any,
    hooks: Hooks = NO_HOOKS,
    *,
    attention_impl: str = "dense",
    attention_block: int = 512,
) -> tuple[Any, dict[str, Any]]:
    """One layer: ``x + attention(x)``, then ``+ mlp(.)``. Returns the new residual and the
    two sublayer outputs (for per-scope numerics)."""
    x = checkpoint_name(x, "decoder_layer_input")
    a = attention(p, x, hooks, impl=attention_impl, block=attention_block)
    x = hooks.residual(x + a)
    m = mlp(p, x, hooks)
    x = hooks.residual(x + m)
    return x, {"attention": a, "mlp": m}


def remat_policy(remat: str, hooks: Hooks = NO_HOOKS) -> Any:
    """The ``jax.checkpoint`` policy of a recomputation policy's name (see
    :func:`~shardscope._src.model.remat.remat_policy`): ``"full"`` saves nothing inside a
    layer (its input is kept by the layer loop), ``"selective"`` everything but the
    attention scores and probabilities (Korthikanti et al., arXiv 2205.05198, section 5),
    ``"matmuls"`` the outputs of matmuls without batch dimensions (the projections and the
    MLP; the attention core's batched ones are recomputed), and a policy by named tensor
    (``"offload"``, MaxText's, custom ones) ``save_and_offload_only_these_names`` of the
    tensors it keeps on the device and those it moves to host memory
    (:meth:`~shardscope._src.model.remat.RematPolicy.compiled_names`)."""

    policy = named_policy(remat)
    cp = jax.checkpoint_policies
    if policy.compiled_as == CompiledAs.NAMES:
        return cp.save_and_offload_only_these_names(
            names_which_can_be_saved=list(policy.compiled_names(Place.DEVICE)),
            names_which_can_be_offloaded=list(policy.compiled_names(Place.OFFLOAD)),
            offload_src="device",
            offload_dst="pinned_host",
        )
    if policy.compiled_as == CompiledAs.OFFLOAD_DOTS:
        return cp.offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host")
    if policy.compiled_as == CompiledAs.NOTHING:
        return cp.nothing_saveable
    if policy.compiled_as == CompiledAs.DOTS:
        return cp.dots_with_no_batch_dims_saveable
    dropped = () if policy.recomputes_nothing else ("attention_scores", "attention_probs")

    def keep(prim: Any, *_: Any, **params: Any) -> bool:
        # Everything is kept but the dropped names and the weights gathered at use.
        if prim.name == "name" and params.get("name") in dropped:
            return False
        return not hooks.gathers(prim, params)

    return keep


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

    if config.vocab is None:
        x = inputs
    else:
        x = hooks.embed(hooks.weight("embed", params["embed"]), inputs)
    x = hooks.residual(x)

    def layer_step(layer: dict[str, Any], x: Any) -> tuple[Any, Any]:
        return decoder_layer(
            layer,
            x,
            hooks,
            attention_impl=config.attention,
            attention_block=config.attention_block,
        )

    if not named_policy(config.remat).recomputes_nothing or hooks.gathers_weights:
        layer_step = jax.checkpoint(layer_step, policy=remat_policy(config.remat, hooks))

    def body(x: Any, layer: dict[str, Any]) -> tuple[Any, Any]:
        x, sub = layer_step(layer, x)
        return x, (sub if capture else None)

    layers = params["layers"]
    dense = config.dense_layers if config.is_moe else config.layers
    captured = None
    if dense and config.scan:
        x, captured = jax.lax.scan(body, x, layers, length=dense)
    elif dense:
        subs = []
        for i in range(dense):
            x, sub = body(x, jax.tree.map(lambda w, i=i: w[i], layers))
            subs.append(sub)
        captured = jax.tree.map(lambda *xs: jnp.stack(xs), *subs) if capture else None
    if config.is_moe:
        if capture:
            raise ValueError("capture= takes a dense model's sublayers; this one has experts")

        def moe_step(layer: dict[str, Any], x: Any) -> Any:
            return moe_layer(layer, x, config, hooks)

        if not named_policy(config.remat).recomputes_nothing or hooks.gathers_weights:
            moe_step = jax.checkpoint(moe_step, policy=remat_policy(config.remat, hooks))

        def moe_body(x: Any, layer: dict[str, Any]) -> tuple[Any, Any]:
            return moe_step(layer, x), None

        x, _ = jax.lax.scan(moe_body, x, params["moe_layers"])

    if config.vocab is not None:
        x = hooks.logits_input(hooks.norm("final_norm", x, params["final_norm"]))
        name = "unembed" if "unembed" in params else "embed"  # tied: the embedding's transpose
        x = hooks.logits(name, x, hooks.weight(name, params[name]))
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
    """The loss of a forward output against its targets (see :func:`loss`): the mean of
    :func:`token_losses`."""
    return jnp.mean(token_losses(out, targets, config))


def token_losses(out: Any, targets: Any, config: ModelConfig) -> Any:
    """Each token's float32 loss ``[batch, seq]``: its output's mean squared error against
    the target activations, or its cross entropy."""

    if config.vocab is None:
        out = out.astype(jnp.float32)
        return jnp.mean(jnp.square(out - targets.astype(jnp.float32)), axis=-1)
    # Cross entropy as log-sum-exp minus the target's logit, each reduced in float32 from the
    # logits at their own dtype: no float32 copy of the logits is ever stored.
    lse = jax.nn.logsumexp(out.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(out, targets[..., None], axis=-1)[..., 0]
    return lse - picked.astype(jnp.float32)


def train_step(
    params: dict[str, Any],
    batch: tuple[Any, Any],
    config: ModelConfig,
    hooks: Hooks = NO_HOOKS,
) -> tuple[Any, Any]:
    """``(loss, grads)``: one step's communication without the optimizer's update, which is
    local to each device for every strategy here."""

    return jax.value_and_grad(loss)(params, batch, config, hooks)
