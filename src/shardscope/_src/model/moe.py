"""A mixture-of-experts MLP in plain JAX: a linear router, top-k routing, and the two ways
programs dispatch tokens to their experts.

* **Capacity-padded** (GShard, Switch, MaxText's and Flaxformer's dispatch): each expert
  takes at most ``C = ceil(capacity_factor x tokens x top_k / experts)`` tokens, in token
  order; they are gathered into an ``[experts, C, d_model]`` buffer (padded where an expert
  has fewer), the experts run as one batched matmul, and a scatter-add weighted by the
  router brings them back (the assignment GShard's one-hot dispatch and combine tensors
  ``[tokens, experts, C]`` make, as indices). Tokens beyond an expert's capacity are dropped:
  their slot contributes nothing and the residual carries them. Sharded over an expert
  axis, the dispatch and combine are where the compiler puts the all-to-alls.
* **Dropless** (MegaBlocks, grouped GEMMs, ``jax.lax.ragged_dot``): the ``tokens x top_k``
  assignments sorted by expert, each expert's rows one group of a ragged matmul, nothing
  dropped.

Routing is Mixtral's: the softmax of the top-k router logits (in float32), so each token's
weights sum to one. The router runs in ``jax.named_scope("moe/router")``, the dispatch in
``("moe/dispatch")``, the experts in ``("moe/experts")`` and the combine in
``("moe/combine")``, so that the audit names their collectives. The experts' gate and up
projections over their slots are named ``mlpwi_0`` and ``mlpwi_1`` (GELU's one up-projection
``mlpwi_0``) and their down-projections ``mlpwo`` (``checkpoint_name``, MaxText's names in its
MoE block), their input ``expert_input`` and their activation ``expert_act``, so that a
recomputation policy by named tensor keeps, offloads or recomputes them as it does a dense
MLP's.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from shardscope._src.model.fused import (
    fused_gelu,
    fused_swiglu,
    fused_weighted_gelu,
    fused_weighted_swiglu,
    gate_and_up,
)


def capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """Slots per expert: ``ceil(factor x tokens x top_k / experts)``, at least 1.

    >>> capacity(4096, 8, 2, 1.25)
    1280
    """
    return max(1, math.ceil(factor * tokens * top_k / experts))


def route(
    h: Any, router: Any, top_k: int, place: Any = None, group_limit: tuple[int, int] = (1, 1)
) -> tuple[Any, Any]:
    """``(weights, experts)`` of each token ``[..., d]``, ``[..., top_k]`` each: the top-k
    experts by router logit, highest first, and the softmax of their logits (float32).
    ``place("tokens", logits)`` keeps the logits where their tokens are. ``group_limit``
    ``(groups, chosen)``: the experts are ``groups`` equal groups, each ranked by its best
    logit, and a token's top-k are taken from its ``chosen`` best groups (DeepSeek-V3's
    node-limited routing; :attr:`~shardscope._src.model.config.ModelConfig.group_limit`).

    >>> import numpy as np
    >>> one = np.ones((1, 1), np.float32)  # a token whose logits are the router's row
    >>> router = np.array([[0, 1, 9, 8, 7, 2, 3, 6]], np.float32)  # groups' best 1, 9, 7, 6
    >>> route(one, router, 3)[1].tolist()
    [[2, 3, 4]]
    >>> route(one, router, 3, group_limit=(4, 2))[1].tolist()  # experts 2, 3, 4 and 5
    [[2, 3, 4]]
    >>> route(one, router, 4, group_limit=(4, 2))[1].tolist()  # not 7: its group is out
    [[2, 3, 4, 5]]
    >>> route(one, router, 3, group_limit=(4, 1))
    Traceback (most recent call last):
    ...
    ValueError: top_k=3 experts from 1 of 4 groups of 2: at most 2
    """
    groups, chosen = group_limit
    n_experts = router.shape[-1]
    if top_k > chosen * (n_experts // groups):
        raise ValueError(
            f"top_k={top_k} experts from {chosen} of {groups} groups of "
            f"{n_experts // groups}: at most {chosen * (n_experts // groups)}"
        )
    with jax.named_scope("moe/router"):
        logits = jnp.einsum("...d,de->...e", h, router).astype(jnp.float32)
        if place is not None:
            logits = place("tokens", logits)
        ranked = logits
        if chosen < groups:
            # each group by its best expert's logit; the experts of the other groups out
            grouped = logits.reshape(*logits.shape[:-1], groups, n_experts // groups)
            best = jnp.argsort(-jnp.max(grouped, axis=-1), axis=-1, stable=True)[..., :chosen]
            kept = jnp.sum(jax.nn.one_hot(best, groups, dtype=jnp.bool_), axis=-2) > 0
            ranked = jnp.where(kept[..., None], grouped, -jnp.inf).reshape(logits.shape)
        # a stable sort rather than lax.top_k, whose partitioning gathers every token's
        # logits (measured on XLA's CPU compiler): ties go to the lower expert either way
        experts = jnp.argsort(-ranked, axis=-1, stable=True)[..., :top_k]
        top = jnp.take_along_axis(logits, experts, axis=-1)
        return jax.nn.softmax(top, axis=-1), experts


def _expert_mlp(x: Any, w_in: Any, w_down: Any, weight: Any = None) -> Any:
    """Each expert's MLP on its rows ``[experts, rows, d]``: SwiGLU when ``w_in`` is
    ``[experts, d, 2, f]``, GELU when ``[experts, d, f]``; the activation keeps only its
    input for the backward, as a fused kernel does (:func:`~shardscope._src.model.fused.fused`).
    With ``weight`` ``[experts, rows]``, each row's activation is scaled by its router weight
    before the down-projection (:func:`~shardscope._src.model.fused.weighted_swiglu`), so the
    outputs need not be kept to differentiate the weights."""
    with jax.named_scope("moe/experts"):
        x = checkpoint_name(x, "expert_input")
        if w_in.ndim == 4:
            # the gate and the up as two matmuls of the one weight's halves, as the dense MLP's
            gate, up = gate_and_up("ecd,edtf->ectf", x, w_in)
            gate, up = checkpoint_name(gate, "mlpwi_0"), checkpoint_name(up, "mlpwi_1")
            if weight is None:
                u = fused_swiglu(gate, up)
            else:
                u = fused_weighted_swiglu(gate, up, weight)
        else:
            h = checkpoint_name(jnp.einsum("ecd,edf->ecf", x, w_in), "mlpwi_0")
            u = fused_gelu(h) if weight is None else fused_weighted_gelu(h, weight)
        u = checkpoint_name(u, "expert_act")
        return checkpoint_name(jnp.einsum("ecf,efd->ecd", u, w_down), "mlpwo")


def slot_tokens(weights: Any, experts: Any, n_experts: int, slots: int) -> tuple[Any, Any]:
    """``(token, weight)``, each ``[experts x slots]`` for one group of tokens: which token
    fills each slot of each expert (``tokens``, one past the last, where the slot is empty)
    and its router weight there (0 where empty): slots in token order (then by the token's
    rank of the expert), assignments beyond an expert's ``slots`` dropped."""
    tokens, top_k = experts.shape
    one_hot = jax.nn.one_hot(experts, n_experts, dtype=jnp.int32)  # [t, k, e]
    flat = one_hot.reshape(tokens * top_k, n_experts)
    position = (jnp.cumsum(flat, axis=0) - flat).reshape(tokens, top_k, n_experts)
    position = jnp.sum(position * one_hot, axis=-1)  # [t, k]
    # a dropped assignment writes past the end, which the scatter drops
    slot = jnp.where(position < slots, experts * slots + position, n_experts * slots)
    who = jnp.broadcast_to(jnp.arange(tokens)[:, None], (tokens, top_k))
    token = jnp.full((n_experts * slots,), tokens, jnp.int32)
    token = token.at[slot.reshape(-1)].set(who.reshape(-1), mode="drop")
    weight = jnp.zeros((n_experts * slots,), weights.dtype)
    weight = weight.at[slot.reshape(-1)].set(weights.reshape(-1), mode="drop")
    return token, weight


def _fill(xg: Any, token: Any) -> Any:
    """Each group's slots ``[groups, experts x slots, d]`` filled with its tokens (``xg``
    ``[groups, tokens, d]``; an empty slot takes the zero row past them)."""
    groups, _, d = xg.shape
    padded = jnp.concatenate([xg, jnp.zeros((groups, 1, d), xg.dtype)], axis=1)
    return jax.vmap(lambda rows, i: jnp.take(rows, i, axis=0))(padded, token)


def _scatter(rows: Any, token: Any, weight: Any, tokens: int) -> Any:
    """Each group's slot outputs ``[groups, experts x slots, d]`` weighted by their router
    weights and added to their tokens: ``[groups, tokens, d]`` (empty slots drop out)."""
    rows = rows * weight[..., None].astype(rows.dtype)

    def back(r: Any, i: Any) -> Any:
        return jnp.zeros((tokens, r.shape[-1]), r.dtype).at[i].add(r, mode="drop")

    return jax.vmap(back)(rows, token)


def _same(name: str, x: Any) -> Any:
    return x


def _slice_major(x: Any, groups: int, slices: int, chunks: int = 1) -> Any:
    """``x`` ``[tokens, d]`` (``groups / (chunks x slices)`` sequences of ``chunks`` chunks
    of ``slices`` slices each) as ``[groups, tokens / groups, d]``, slice-major then
    chunk-major (group ``(i x chunks + k) x sequences + j`` is slice ``i`` of chunk ``k`` of
    sequence ``j``), so that the groups of a device of the model axis, which holds slice
    ``i`` of its sequences' chunks, and of the context axis, which holds chunk ``k`` of
    them, are one block of them: the groups' sharding is the model axis, the context axis,
    then the batch's."""
    t, d = x.shape
    x = x.reshape(groups // (slices * chunks), chunks, slices, t // groups, d)
    return jnp.transpose(x, (2, 1, 0, 3, 4)).reshape(groups, t // groups, d)


def _arrive(place: Any, a: Any, slices: int) -> Any:
    """``a`` ``[experts or devices, groups, ...]`` (placed at ``"slots"``) moved to where its
    experts take it, ``"experts"``: with ``slices``, its slice-major groups split and turned
    ``[groups / slices, slices]`` (each device's slices one dimension, over the model axis)
    and placed at ``"arrived"`` on the way (the all-to-all over the expert axis, then the
    all-gather over the model axis), then merged back group-major: the same groups in
    another order, which :func:`_depart` undoes."""
    if slices == 1:
        return place("experts", a)
    n, groups, *rest = a.shape
    a = jnp.swapaxes(a.reshape(n, slices, groups // slices, *rest), 1, 2)
    a = place("experts", place("arrived", a))
    return a.reshape(n, groups, *rest)


def _depart(place: Any, a: Any, slices: int) -> Any:
    """:func:`_arrive`'s way back, from ``"experts"`` to ``"slots"`` (with ``slices``,
    through ``"arrived"``: the experts' partial sums reduce-scattered over the model axis,
    then the all-to-all over the expert axis)."""
    if slices == 1:
        return place("slots", place("experts", a))
    n, groups, *rest = a.shape
    a = place("arrived", place("experts", a.reshape(n, groups // slices, slices, *rest)))
    return place("slots", jnp.swapaxes(a, 1, 2).reshape(n, groups, *rest))


def _sequence_major(x: Any, slices: int, chunks: int = 1) -> Any:
    """:func:`_slice_major`'s inverse: ``[groups, tokens, d]`` back to ``[all tokens, d]`` in
    sequence order."""
    groups, t, d = x.shape
    x = x.reshape(slices, chunks, groups // (slices * chunks), t, d)
    return jnp.transpose(x, (2, 1, 0, 3, 4)).reshape(groups * t, d)


@functools.cache  # the screen asks it of every candidate; a few hundred devices take a ms
def device_share(
    experts: int, devices: int, top_k: int, group_limit: tuple[int, int] = (1, 1)
) -> float:
    """Under uniform routing, the share of a group's tokens that send to one device of an
    expert axis of ``devices`` (each holding ``experts / devices`` experts, in order): those
    with at least one of their ``top_k`` experts there, ``1 - C(E - E/e, k) / C(E, k)``;
    ``top_k / experts`` with one expert a device.

    With ``group_limit`` ``(G, g)`` (:func:`route`'s: a token's experts from ``g`` of ``G``
    groups of ``s = E / G``, the groups chosen uniformly), a device is missed when the
    groups chosen hold none of its experts, or hold ``L`` of them and the ``k`` experts
    drawn from the ``g s`` of the chosen groups miss those: summed over which of the ``m``
    groups its experts lie in are chosen, ``C(G - m, g - |T|) / C(G, g) x C(g s - L_T, k) /
    C(g s, k)``, averaged over the devices (their experts lie across the groups alike or
    not).

    >>> round(device_share(128, 8, 8), 4)  # Qwen3-30B-A3B over 8 devices
    0.6674
    >>> round(device_share(256, 8, 8), 4), round(device_share(256, 8, 8, (8, 4)), 4)
    (0.6618, 0.4536)
    """
    local = experts // devices
    groups, chosen = group_limit
    if chosen == groups:
        return 1 - math.comb(experts - local, top_k) / math.comb(experts, top_k)
    size = experts // groups
    pool = chosen * size
    missed = 0.0
    for device in range(devices):
        first, last = device * local, (device + 1) * local
        held = [  # the device's experts in each group they lie in
            min(last, (g + 1) * size) - max(first, g * size)
            for g in range(first // size, (last - 1) // size + 1)
        ]
        m = len(held)
        for taken in itertools.product((False, True), repeat=m):
            t = sum(taken)
            if t > chosen or chosen - t > groups - m:
                continue
            drawn = sum(h for h, on in zip(held, taken, strict=True) if on)
            p_groups = math.comb(groups - m, chosen - t) / math.comb(groups, chosen)
            missed += p_groups * math.comb(pool - drawn, top_k) / math.comb(pool, top_k)
    return 1 - missed / devices


def device_capacity(
    tokens: int,
    experts: int,
    devices: int,
    top_k: int,
    factor: float,
    group_limit: tuple[int, int] = (1, 1),
) -> int:
    """Rows a group sends each device when each token is sent once to each device holding
    any of its experts: ``ceil(factor x tokens x`` :func:`device_share` ``)``, at least 1;
    :func:`capacity` with one expert a device.

    >>> device_capacity(4096, 8, 8, 2, 1.25) == capacity(4096, 8, 2, 1.25)
    True
    """
    share = device_share(experts, devices, top_k, group_limit)
    return max(1, math.ceil(factor * tokens * share))


def device_rows(
    experts: Any, token: Any, n_experts: int, devices: int, rows: int, slots: int
) -> tuple[Any, Any]:
    """``(sent, row)`` for one group sending each token once to each device of its experts:
    ``sent`` ``[devices x rows]``, the token in each row a device receives (``tokens``, one
    past the last, where empty), and ``row`` ``[experts x slots]``, the row of its device's
    buffer that fills each expert slot (``rows``, one past the last, where the slot is empty
    or its token was beyond the device's ``rows``). ``experts`` ``[tokens, top_k]`` is the
    routing and ``token`` the slots' tokens (:func:`slot_tokens`)."""
    tokens = experts.shape[0]
    local = n_experts // devices
    # [t, devices]: some expert of the token is there
    on = jnp.max(jax.nn.one_hot(experts // local, devices, dtype=jnp.int32), axis=1)
    position = jnp.cumsum(on, axis=0) - on
    kept = (on > 0) & (position < rows)
    device = jnp.arange(devices)[None, :]
    at = jnp.where(kept, device * rows + position, devices * rows)
    who = jnp.broadcast_to(jnp.arange(tokens)[:, None], at.shape)
    sent = jnp.full((devices * rows,), tokens, jnp.int32)
    sent = sent.at[at.reshape(-1)].set(who.reshape(-1), mode="drop")
    # each token's row on each device; the empty token (one past the last) has none
    row_of = jnp.concatenate(
        [jnp.where(kept, position, rows), jnp.full((1, devices), rows, jnp.int32)]
    )
    slot_device = jnp.arange(n_experts * slots) // (local * slots)
    return sent, row_of[token, slot_device]


def moe_capacity(
    x: Any,
    router: Any,
    w_in: Any,
    w_down: Any,
    top_k: int,
    factor: float,
    *,
    groups: int = 1,
    place: Any = _same,
    devices: int | None = None,
    slices: int = 1,
    chunks: int = 1,
    weight_activations: bool = False,
    group_limit: tuple[int, int] = (1, 1),
) -> tuple[Any, Any]:
    """The capacity-padded MoE of ``x`` ``[tokens, d]``: ``(output, dropped)``, ``dropped``
    the number of token-expert assignments beyond their expert's capacity; each token
    routed within ``group_limit`` (:func:`route`).

    The tokens are split into ``groups`` (GShard's: one per device of the expert axis), each
    routed and padded on its own, so that a group's tokens go to every expert's slots for
    that group: ``place(name, x)`` then shards ``"tokens"`` ``[groups, tokens/groups, d]``
    and ``"slots"`` ``[experts, groups, slots, d]`` over the group axis, and ``"experts"``
    (the same array) over the expert axis, and the compiler moves the slots to their experts
    and back with an all-to-all each way.

    Each group fills its slots by gathering its tokens (:func:`slot_tokens`) and takes the
    outputs back by a weighted scatter-add: no FLOPs, where GShard's one-hot dispatch and
    combine einsums cost ``2 x tokens x experts x slots x d`` each way.

    With ``devices`` (the expert axis's size), each token is sent once to each device that
    holds any of its experts, not once per expert (DeepEP's dispatch): a group fills
    ``[devices, rows, d]`` (:func:`device_capacity` rows, tokens beyond them dropped on that
    device), each device fills its experts' slots from the rows it received, runs them with
    each slot's activation scaled by its router weight (Megatron-Core's grouped MLP and NeMo
    AutoModel's DeepEP experts weight there, not in the combine, so the backward keeps no
    expert output), and sums each token's outputs of its experts there before they go back.
    Which rows fill which slots, and their router weights, travel with the rows
    (``[devices, groups, experts / devices, slots]`` each).

    With ``slices`` (expert parallelism under sequence parallelism unfolded: each
    sequence's groups its ``slices`` slices, routed on the devices of the model axis, the
    experts' hidden split over it), the groups are slice-major (:func:`_slice_major`: a
    device's slices one block of them) and the slots stop at ``"arrived"`` on their way to
    ``"experts"`` and back (:func:`_arrive`): the all-to-all over the expert axis, then
    the all-gather over the model axis, as Megatron-Core's dispatcher orders them.

    With ``chunks`` (expert with context parallelism: each sequence's groups its ``chunks``
    chunks, each routed on its device of the context axis, Megatron-Core's EP with CP), the
    groups are chunk-major (within the slices): a device's chunks one block of them.

    With ``weight_activations`` (sent once per expert; ``devices`` implies it), each slot's
    router weight travels with it to its expert (``[experts, groups, slots, 1]``, placed as
    the slots are), scales its activation before the down-projection, and the combine sums
    the outputs unweighted (Megatron-Core's grouped experts under its all-to-all dispatcher,
    which permutes the probabilities with the tokens): the same sums, and the backward
    keeps no expert output to differentiate the weights."""
    n_experts = router.shape[-1]
    t, d = x.shape
    if t % groups or groups % (slices * chunks):
        raise ValueError(
            f"tokens={t} do not split into groups={groups} of slices={slices} x chunks={chunks}"
        )
    xg = place("tokens", _slice_major(x, groups, slices, chunks))
    weights, experts = route(xg, router, top_k, place, group_limit)
    slots = capacity(t // groups, n_experts, top_k, factor)
    token, weight = jax.vmap(lambda w, e: slot_tokens(w, e, n_experts, slots))(weights, experts)
    if devices is not None:
        if n_experts % devices:
            raise ValueError(f"experts={n_experts} do not split over devices={devices}")
        out, dropped = _moe_once(
            xg, experts, token, weight, w_in, w_down, n_experts, devices, slots, factor, place,
            slices=slices, group_limit=group_limit,
        )  # fmt: skip
        return _sequence_major(out.reshape(groups, t // groups, d), slices, chunks), dropped
    with jax.named_scope("moe/dispatch"):
        # each group fills its slots of every expert where the group is (an empty slot takes
        # the zero row past its tokens), then the slots go to their experts (the all-to-all)
        filled = _fill(xg, token).reshape(groups, n_experts, slots, d)
        buffer = _to_experts(place, filled, slices)
        scale = None
        if weight_activations:
            # at the activations' dtype, in which they scale them (as the combine's would)
            w = weight.astype(xg.dtype).reshape(groups, n_experts, slots, 1)
            scale = _to_experts(place, w, slices)
    e, g, c, _ = buffer.shape
    if scale is not None:
        scale = scale.reshape(e, g * c)
    y = _expert_mlp(buffer.reshape(e, g * c, d), w_in, w_down, scale).reshape(e, g, c, d)
    with jax.named_scope("moe/combine"):
        y = _depart(place, y, slices)  # back to their groups (the all-to-all)
        rows = jnp.swapaxes(y, 0, 1).reshape(groups, n_experts * slots, d)
        # weighted already, the outputs are summed as they come
        combine = jnp.ones_like(weight) if weight_activations else weight
        out = place("tokens", _scatter(rows, token, combine, t // groups))
    dropped = t * top_k - jnp.sum(token < t // groups).astype(jnp.int32)
    return _sequence_major(out, slices, chunks), dropped


def _to_experts(place: Any, a: Any, slices: int) -> Any:
    """Each group's slots of every expert ``[groups, experts, slots, ...]`` sent to their
    experts, ``[experts, groups, slots, ...]`` (placed at ``"slots"``, then
    :func:`_arrive`): the dispatch's all-to-all."""
    return _arrive(place, place("slots", jnp.swapaxes(a, 0, 1)), slices)


def _local_experts(rows: Any, w_in: Any, w_down: Any, reduce: Any, weight: Any = None) -> Any:
    """One device's experts on their rows ``[local, rows, d]`` inside ``shard_map`` (each
    row's activation scaled by its ``weight``, where given), their output summed by
    ``reduce`` where their hidden is split further (tensor parallelism)."""
    y = _expert_mlp(rows, w_in, w_down, weight)
    return y if reduce is None else reduce(y)


def _moe_once(
    xg: Any,
    experts: Any,
    token: Any,
    weight: Any,
    w_in: Any,
    w_down: Any,
    n_experts: int,
    devices: int,
    slots: int,
    factor: float,
    place: Any = _same,
    axis: str | tuple[str, ...] | None = None,
    reduce: Any = None,
    *,
    slices: int = 1,
    gather_axis: str | None = None,
    group_limit: tuple[int, int] = (1, 1),
) -> tuple[Any, Any]:
    """:func:`moe_capacity` sending each token once to each device of its experts (as many
    rows as :func:`device_capacity` gives the routing's ``group_limit``): under
    jit with ``place`` (the arrays ``[devices, groups, ...]`` resharded onto the expert
    axis; ``slices``: :func:`moe_capacity`'s), or on one device of ``axis`` inside
    ``shard_map`` (an explicit ``all_to_all`` each way, ``w_in`` and ``w_down`` this device's
    experts, ``reduce`` summing their output over a tensor-parallel axis, or the rows that
    arrive all-gathered over ``gather_axis`` and the outputs reduce-scattered back over it:
    :func:`moe_capacity_local`)."""
    groups, tokens, d = xg.shape
    top_k = experts.shape[-1]
    local = n_experts // devices
    rows = device_capacity(tokens, n_experts, devices, top_k, factor, group_limit)
    sent, row = jax.vmap(lambda e, tk: device_rows(e, tk, n_experts, devices, rows, slots))(
        experts, token
    )

    def to_devices(a: Any) -> Any:
        # [groups, devices, ...] where the groups are to the devices: under jit one array
        # [devices, groups, ...] sharded over them; in shard_map what each device receives,
        # [source devices, groups, ...]
        a = jnp.swapaxes(a, 0, 1)
        if axis is None:
            return _arrive(place, place("slots", a), slices)
        a = jax.lax.all_to_all(a, axis, 0, 0, tiled=True)
        if gather_axis is not None:
            a = jax.lax.all_gather(a, gather_axis, axis=1, tiled=True)
        return a

    def to_groups(a: Any) -> Any:
        if axis is not None:
            if gather_axis is not None:
                a = jax.lax.psum_scatter(a, gather_axis, scatter_dimension=1, tiled=True)
            a = jax.lax.all_to_all(a, axis, 0, 0, tiled=True)
        else:
            a = _depart(place, a, slices)
        return jnp.swapaxes(a, 0, 1)

    # an assignment is done where its slot is filled and its row reaches the device
    done = jnp.sum((token < tokens) & (row < rows)).astype(jnp.int32)
    with jax.named_scope("moe/dispatch"):
        buffer = to_devices(_fill(xg, sent).reshape(groups, devices, rows, d))
        row = to_devices(row.reshape(groups, devices, local, slots))
        # the router weights travel at the activations' dtype, in which they scale them
        weight = to_devices(weight.astype(xg.dtype).reshape(groups, devices, local, slots))
        # each device fills its experts' slots from the rows it received (a row past the
        # last is the empty one); g groups of them, every device's of the gather axis
        g = buffer.shape[1]
        padded = jnp.concatenate([buffer, jnp.zeros((devices, g, 1, d), xg.dtype)], axis=2)
        take = jax.vmap(jax.vmap(lambda b, i: jnp.take(b, i.reshape(-1), axis=0)))
        filled = take(padded, row).reshape(devices, g, local, slots, d)
    # each slot's router weight scales its expert's activation (Megatron-Core's and NeMo
    # AutoModel's grouped experts under DeepEP), so the outputs are summed unweighted
    if axis is None:  # every expert, sharded: [experts, groups x slots, d]
        filled = jnp.moveaxis(filled, 2, 1).reshape(n_experts, groups * slots, d)
        scale = jnp.moveaxis(weight, 2, 1).reshape(n_experts, groups * slots)
        y = _expert_mlp(filled, w_in, w_down, scale).reshape(devices, local, groups, slots, d)
        y = jnp.moveaxis(y, 1, 2)
    else:  # this device's experts: [local, sources x groups x slots, d]
        filled = jnp.moveaxis(filled, 2, 0).reshape(local, devices * g * slots, d)
        scale = jnp.moveaxis(weight, 2, 0).reshape(local, devices * g * slots)
        y = _local_experts(filled, w_in, w_down, reduce, scale)
        y = jnp.moveaxis(y.reshape(local, devices, g, slots, d), 0, 2)
    with jax.named_scope("moe/combine"):
        # each token's outputs of this device's experts, summed into its row

        def add(r: Any, i: Any) -> Any:
            flat = r.reshape(local * slots, d)
            return jnp.zeros((rows, d), r.dtype).at[i.reshape(-1)].add(flat, mode="drop")

        back = to_groups(jax.vmap(jax.vmap(add))(y, row)).reshape(groups, devices * rows, d)
        ones = jnp.ones((groups, devices * rows), back.dtype)
        out = place("tokens", _scatter(back, sent, ones, tokens))
    return out.reshape(groups * tokens, d), groups * tokens * top_k - done


def moe_dropless(
    x: Any,
    router: Any,
    w_in: Any,
    w_down: Any,
    top_k: int,
    *,
    weight_activations: bool = False,
    group_limit: tuple[int, int] = (1, 1),
) -> Any:
    """The dropless MoE of ``x`` ``[tokens, d]``: the assignments (within ``group_limit``,
    :func:`route`) sorted by expert, each expert's rows a group of ``jax.lax.ragged_dot``,
    the outputs weighted and summed back; with ``weight_activations``, each row's activation
    weighted before the down-projection and the outputs summed unweighted
    (:func:`moe_capacity`'s)."""
    n_experts = router.shape[-1]
    tokens = x.shape[0]
    weights, experts = route(x, router, top_k, group_limit=group_limit)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token_of = order // top_k
    sizes = jnp.bincount(flat, length=n_experts).astype(jnp.int32)
    with jax.named_scope("moe/dispatch"):
        rows = checkpoint_name(jnp.take(x, token_of, axis=0), "expert_input")
        # the router weights permuted with the rows, at the activations' dtype, in which
        # they scale them
        scale = None
        if weight_activations:
            scale = jnp.take(weights.reshape(-1), order).astype(x.dtype)
    with jax.named_scope("moe/experts"):
        if w_in.ndim == 4:
            gate = checkpoint_name(jax.lax.ragged_dot(rows, w_in[:, :, 0], sizes), "mlpwi_0")
            up = checkpoint_name(jax.lax.ragged_dot(rows, w_in[:, :, 1], sizes), "mlpwi_1")
            u = fused_swiglu(gate, up) if scale is None else fused_weighted_swiglu(gate, up, scale)
        else:
            h = checkpoint_name(jax.lax.ragged_dot(rows, w_in, sizes), "mlpwi_0")
            u = fused_gelu(h) if scale is None else fused_weighted_gelu(h, scale)
        u = checkpoint_name(u, "expert_act")
        y = checkpoint_name(jax.lax.ragged_dot(u, w_down, sizes), "mlpwo")
    with jax.named_scope("moe/combine"):
        if scale is None:
            y = y * jnp.take(weights.reshape(-1), order)[:, None].astype(y.dtype)
        out = jnp.zeros((tokens, x.shape[1]), y.dtype).at[token_of].add(y)
    return out


def moe_capacity_local(
    x: Any,
    router: Any,
    w_in: Any,
    w_down: Any,
    top_k: int,
    factor: float,
    axis: str | tuple[str, ...],
    *,
    groups: int = 1,
    reduce: Any = None,
    once: bool = False,
    gather_axis: str | None = None,
    weight_activations: bool = False,
    group_limit: tuple[int, int] = (1, 1),
) -> Any:
    """The body of :func:`moe_capacity`'s ``shard_map`` twin, on one device of the expert
    axis ``axis`` (``e`` devices): its share of the tokens ``[tokens / e, d]``, routed in
    ``groups`` groups (one, GShard's; the decoder's: one per sequence), and of the experts
    (``w_in`` and ``w_down`` hold ``experts / e`` of them). Each group fills its slots of
    every expert, an explicit ``all_to_all`` sends each device the slots of its experts, they
    run (``reduce`` sums their output where their hidden is split further, over a tensor-
    parallel axis), and a second ``all_to_all`` brings the outputs back; the same arithmetic
    as :func:`moe_capacity` with as many groups. With ``once``, each token goes once to each
    device of its experts (:func:`moe_capacity`'s ``devices``). With ``gather_axis`` (the
    experts' hidden split over it, each of its devices holding its own slice of the
    sequences: expert parallelism under sequence parallelism, ETP = TP), the slots that
    arrive are all-gathered over it and the experts' partial outputs reduce-scattered back
    before the second ``all_to_all`` (Megatron-Core's ``MoEAlltoAllTokenDispatcher``). With
    ``weight_activations`` (``once`` implies it), the slots' router weights go with them by
    their own ``all_to_all`` (and gather), scale the experts' activations before the
    down-projection, and the outputs are summed unweighted (:func:`moe_capacity`'s)."""
    e = jax.lax.axis_size(axis)
    n_experts = router.shape[-1]
    local = w_in.shape[0]
    t, d = x.shape
    xg = x.reshape(groups, t // groups, d)
    weights, experts = route(xg, router, top_k, group_limit=group_limit)
    slots = capacity(t // groups, n_experts, top_k, factor)
    token, weight = jax.vmap(lambda w, i: slot_tokens(w, i, n_experts, slots))(weights, experts)
    if once:
        out, _ = _moe_once(
            xg, experts, token, weight, w_in, w_down, n_experts, e, slots, factor,
            axis=axis, reduce=reduce, gather_axis=gather_axis, group_limit=group_limit,
        )  # fmt: skip
        return out
    with jax.named_scope("moe/dispatch"):
        # [devices, experts of a device, groups, slots, d]: row j goes to device j; what
        # arrives is every device's groups' slots of this device's experts
        filled = jnp.moveaxis(_fill(xg, token).reshape(groups, e, local, slots, d), 0, 2)
        buffer = jax.lax.all_to_all(filled, axis, 0, 0, tiled=True)
        if gather_axis is not None:  # every slice's slots, for the experts' split hidden
            buffer = jax.lax.all_gather(buffer, gather_axis, axis=2, tiled=True)
        scale = None
        if weight_activations:
            # each slot's router weight with it, at the activations' dtype, in which it
            # scales them
            w = weight.astype(xg.dtype).reshape(groups, e, local, slots)
            scale = jax.lax.all_to_all(jnp.moveaxis(w, 0, 2), axis, 0, 0, tiled=True)
            if gather_axis is not None:
                scale = jax.lax.all_gather(scale, gather_axis, axis=2, tiled=True)
    g = buffer.shape[2]
    rows = jnp.swapaxes(buffer, 0, 1).reshape(local, e * g * slots, d)
    if scale is not None:
        scale = jnp.swapaxes(scale, 0, 1).reshape(local, e * g * slots)
    y = _local_experts(rows, w_in, w_down, reduce, scale)
    y = jnp.swapaxes(y.reshape(local, e, g, slots, d), 0, 1)
    with jax.named_scope("moe/combine"):
        if gather_axis is not None:  # the partial sums of this device's slices
            y = jax.lax.psum_scatter(y, gather_axis, scatter_dimension=2, tiled=True)
        y = jax.lax.all_to_all(y, axis, 0, 0, tiled=True)
        back = jnp.moveaxis(y, 2, 0).reshape(groups, n_experts * slots, d)
        # weighted already, the outputs are summed as they come
        combine = jnp.ones_like(weight) if weight_activations else weight
        out = _scatter(back, token, combine, t // groups)
    return out.reshape(t, d)
