"""The collectives a transformer strategy cannot do without, per layer and mode: Megatron-LM
(arXiv 1909.08053 section 3), sequence parallelism (arXiv 2205.05198 section 4.2.2), ZeRO
(arXiv 1910.02054 section 7) and context parallelism (the keys and values gathered over the
sequence shards: MaxText's and torchtitan's all-gather form; ring attention, arXiv
2310.01889, moves the same bytes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    COLLECTIVE_PERMUTE,
    REDUCE_SCATTER,
)
from shardscope._src.base.errors import StrategyError
from shardscope._src.base.notes import Note
from shardscope._src.bounds.moe import INDEX_ITEMSIZE, moe_layer_terms
from shardscope._src.bounds.terms import Bound, BoundNote, Term, TermRole
from shardscope._src.model.config import (
    EXPERT_PARAMS,
    LAYER_PARAMS,
    MLA_PARAMS,
    MOE_PARAMS,
    Mode,
    ModelConfig,
    param_shapes,
)
from shardscope._src.model.moe import device_share
from shardscope._src.sharding.strategies import Placement, Role, entry_roles, uses_role

# -- transformer strategies -----------------------------------------------------------------


def transformer_bound(placement: Placement, mode: str = Mode.FORWARD) -> Bound:
    """Minimum communication of the reference model under a strategy's placement.

    Per layer (``A`` = one data shard's activations ``batch/data x seq x d_model``):

    * tensor parallel: forward 2 all-reduces of ``A`` over ``model`` (attention out-projection,
      MLP down-projection); train 2 more (the input gradients of the column-parallel QKV and
      MLP-up matmuls).
    * sequence parallel: each all-reduce becomes an all-gather (result ``A``) before the
      column-parallel matmul and a reduce-scatter (operand ``A``) after the row-parallel one;
      train doubles them, and the norm gains (which see only a sequence shard) need their
      gradients all-reduced over ``model``.
    * data parallel (train): the gradients of every weight a device holds are all-reduced over
      the data axes.
    * FSDP: each weight is all-gathered over the data axes before its use; train reduce-
      scatters its gradient. Keeping the gathered weights for the backward pass (what
      autodiff does without rematerialisation) needs no second gather; ZeRO-3 as published
      gathers again (1.5x data parallel).
    * hybrid sharded data parallel (HSDP, the batch over ``replica`` and ``data``, the
      weights sharded over ``data`` only): FSDP's gathers and reduce-scatters over ``data``,
      and each gradient shard (``1/data`` of the gradient) all-reduced over ``replica``, as
      PyTorch FSDP's ``HYBRID_SHARD`` does (reduce-scatter within the shard group, then
      all-reduce across the replicate group).
    * context parallel (the sequence over ``context``, ``c`` ways): every query attends to
      the whole sequence, so each layer all-gathers its keys and its values over ``context``
      (result ``batch/data x seq x kv_dim`` each); train reduce-scatters their gradients back
      to the sequence shards. The ring form (``..._cp_ring``) sends the same ``(c-1)/c`` of
      them as ``c-1`` collective-permutes a layer of one device's chunk of the keys and one
      of the values (``1/c`` of them each), and train passes their gradients back in as many.
      Every weight sees a slice of the tokens, so
      its gradient is summed over ``context`` too, in one all-reduce with the data axes (or,
      FSDP over data and context together, one reduce-scatter over both).
    * train, any strategy that shards tokens: the scalar loss is all-reduced over those axes.

    >>> from shardscope._src.model.config import ModelConfig
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> b = transformer_bound(get_strategy("tp").place(ModelConfig(), abstract_mesh("model=8")))
    >>> b.counts()
    {'all-reduce': 4}
    """
    Mode.parse(mode, what="mode", error=StrategyError)
    s, c = placement.strategy, placement.config
    L, train = c.layers, mode == Mode.TRAIN
    terms: list[Term] = []
    notes: list[Note] = []
    _, n_data = placement.group(s.batch_roles)
    model_axes, t = placement.group([Role.MODEL])
    # one data shard's activations, of its own tokens under context parallelism
    activation = (c.batch // n_data) * (c.seq // _context_ways(placement)) * c.d_model * c.itemsize

    if Role.MODEL in s.roles:
        terms += _activation_terms(
            s.sequence_parallel, model_axes, t, activation, L, train, mlp_layers=c.dense_layer_count
        )
    if c.is_moe:
        terms += _moe_terms(placement, train)
    if s.context_parallel:
        context_axes, n_context = placement.group([Role.CONTEXT])
        terms += _context_terms(
            context_axes, n_context, _keys_bytes(placement), L, train, ring=s.context_ring
        )
    if s.vocab_split and c.vocab is not None:
        tokens = (c.batch // n_data) * (c.seq // _context_ways(placement))
        terms += _vocab_terms(model_axes, t, activation, tokens, train, s.sequence_parallel)
    storage = s.param_rules()
    for weight in _weights_terms(placement, train).values():
        terms += weight
    if train:
        terms += _loss_terms(placement)
        if uses_role(storage["wqkv"], Role.DATA):
            notes.append(Note(BoundNote.FSDP_KEEPS_GATHERED))
    return Bound(f"{placement.name} {mode}", tuple(terms), tuple(notes))


def regathered_terms(placement: Placement) -> list[Term]:
    """What a train step that keeps no gathered copy for the backward gathers again for it:
    the layers' weights at their use (FSDP; the matrices and the norm gains, which the norms'
    backward takes again), and each layer's keys and values over ``context`` (context
    parallelism: gathered again, or passed around the ring again)."""
    c = placement.config
    terms = [
        t
        for name, weight in _weights_terms(placement, False).items()
        if _stacked(c, name)
        for t in weight
        if t.role is TermRole.WEIGHT_GATHER
    ]
    if placement.strategy.context_parallel:
        context_axes, n_context = placement.group([Role.CONTEXT])
        keys, ring = _keys_bytes(placement), placement.strategy.context_ring
        terms += _context_terms(context_axes, n_context, keys, c.layers, False, ring=ring)
    return terms


def _context_ways(placement: Placement) -> int:
    """How many ways ``context`` splits the sequence (1 without context parallelism)."""
    return placement.group([Role.CONTEXT])[1] if placement.strategy.context_parallel else 1


def _keys_bytes(placement: Placement) -> int:
    """The keys (or the values) of one data shard's whole sequence as attention uses them
    on one device under context parallelism: their heads split over ``model`` under tensor
    parallelism (the ``keys`` rule's)."""
    c, s = placement.config, placement.strategy
    assert c.kv_heads is not None and c.head_dim is not None  # set by ModelConfig
    _, n_data = placement.group(s.batch_roles)
    _, t = placement.group([Role.MODEL]) if Role.MODEL in s.roles else ((), 1)
    return (c.batch // n_data) * c.seq * (c.kv_heads // t) * c.head_dim * c.itemsize


def _term(
    kind: str,
    axes: tuple[str, ...],
    n: int,
    payload: int,
    count: int,
    what: str,
    scope: str,
    role: TermRole,
    *,
    stack: str = "",
) -> list[Term]:
    """The collective as a term, or none where it moves nothing (a group of one, no bytes)."""
    if n > 1 and count > 0 and payload > 0:
        return [Term(kind, axes, n, payload, count, what, scope, role=role, stack=stack)]
    return []


def _activation_terms(
    sequence_parallel: bool,
    axes: tuple[str, ...],
    n: int,
    activation: int,
    layers: int,
    train: bool,
    *,
    mlp_layers: int | None = None,
) -> list[Term]:
    """Tensor (and sequence) parallel activations over the model axes, attention (in each
    of ``layers``) then MLP (in each of ``mlp_layers``, default ``layers``: a mixture of
    experts' dense layers)."""
    terms: list[Term] = []
    passes = 2 if train else 1
    role = TermRole.ACTIVATION
    for scope, first, last, count in (
        ("attention", "QKV", "out-projection", layers),
        ("mlp", "MLP-up", "MLP-down", layers if mlp_layers is None else mlp_layers),
    ):
        if sequence_parallel:
            gather = f"sequence shards gathered before the column-parallel {first} matmul" + (
                " (and its transpose for the backward of the reduce-scatter)" if train else ""
            )
            scatter = f"{last} partial sums reduce-scattered to sequence shards" + (
                " (and the backward of the gather)" if train else ""
            )
            terms += _term(ALL_GATHER, axes, n, activation, passes * count, gather, scope, role)
            terms += _term(
                REDUCE_SCATTER, axes, n, activation, passes * count, scatter, scope, role
            )
            continue
        row = f"{last} partial sums (row-parallel)"
        terms += _term(ALL_REDUCE, axes, n, activation, count, row, scope, role)
        if train:
            column = f"input gradient of the column-parallel {first} matmul"
            terms += _term(ALL_REDUCE, axes, n, activation, count, column, scope, role)
    return terms


def _context_terms(
    axes: tuple[str, ...], n: int, keys: int, layers: int, train: bool, *, ring: bool = False
) -> list[Term]:
    """Context parallelism: per layer the keys and the values (``keys`` bytes each, the
    whole sequence of one data shard) all-gathered over ``context`` for attention, and in
    training their gradients reduce-scattered back to the sequence shards. The ring form
    (``ring``): per layer ``n - 1`` collective-permutes of one device's chunk of the keys
    (``keys / n`` bytes) and as many of the values, and in training as many of their
    gradients, passed back around the ring."""
    terms: list[Term] = []
    role, scope = TermRole.ACTIVATION, "attention"
    if ring:
        steps = layers * (n - 1)
        for name in ("keys", "values"):
            what = f"{name} passed around the context ring"
            terms += _term(COLLECTIVE_PERMUTE, axes, n, keys // n, steps, what, scope, role)
        if train:
            for name in ("keys", "values"):
                what = f"gradient of the {name} passed back around the context ring"
                terms += _term(COLLECTIVE_PERMUTE, axes, n, keys // n, steps, what, scope, role)
        return terms
    for name in ("keys", "values"):
        what = f"{name} gathered over the sequence shards"
        terms += _term(ALL_GATHER, axes, n, keys, layers, what, scope, role)
    if train:
        for name in ("keys", "values"):
            what = f"gradient of the gathered {name} reduce-scattered to the sequence shards"
            terms += _term(REDUCE_SCATTER, axes, n, keys, layers, what, scope, role)
    return terms


#: :func:`_weights_terms` of the placements asked for lately, by what they depend on: the
#: planner's screen asks for them again for each micro-batch count of one placement (one
#: micro-batch's placement differs only in its batch, which no weight's collective reads)
_WEIGHTS_TERMS: dict[tuple[Any, ...], dict[str, tuple[Term, ...]]] = {}
_WEIGHTS_TERMS_KEPT = 4096


def _weights_terms(placement: Placement, train: bool) -> dict[str, tuple[Term, ...]]:
    """:func:`_weight_terms` of every parameter of ``placement``'s model, in
    :func:`param_shapes` order."""
    c = placement.config
    key = (
        placement.strategy,
        placement.mesh,
        tuple(placement.axes.items()),
        placement.constraints,
        tuple(v for k, v in vars(c).items() if k != "batch"),
        train,
    )
    known = _WEIGHTS_TERMS.get(key)
    if known is None:
        if len(_WEIGHTS_TERMS) >= _WEIGHTS_TERMS_KEPT:
            _WEIGHTS_TERMS.clear()
        known = _WEIGHTS_TERMS[key] = {
            name: tuple(_weight_terms(placement, name, shape, train))
            for name, shape in param_shapes(c).items()
        }
    return known


def _weight_terms(
    placement: Placement, name: str, shape: tuple[int, ...], train: bool
) -> list[Term]:
    """One weight's collectives: gathered at use (FSDP), its gradient reduced over the data
    axes (and over ``model`` under sequence parallelism), its updated shards gathered (ZeRO)."""
    s, c = placement.strategy, placement.config
    storage, use = s.param_rules(), s.use_rules()
    count = _stacked(c, name)
    one = shape[1:] if count else shape
    count = count or 1
    used_roles = (use or storage)[name]
    # as the data group sees it: a model-axis slice, and of the routed experts those of one
    # device of the expert axis
    split = math.prod(
        placement.role_size(r)
        for e in used_roles
        for r in entry_roles(e)
        if r in (Role.MODEL, Role.EXPERT)
    )
    payload = math.prod(one) * c.itemsize // split
    scope = next((k for k, v in _SCOPE_OF.items() if name in v), "")
    stack = "layers" if name in LAYER_PARAMS else "moe_layers" if name in MOE_PARAMS else ""
    data_sharded = uses_role(storage[name], Role.DATA)
    # A gradient needs summing only into the shards its update reads: the gradients' own
    # (ZeRO-2, FSDP), or the optimizer state's (ZeRO-1: each device updates its shard, so a
    # reduce-scatter suffices, the ZeRO paper's 2x the weights with the gather, not an
    # all-reduce's 2x and the gather's 1x; XLA:GPU forms it from the all-reduce and slice).
    reduced_to = s.grad_rules()[name]
    if not uses_role(reduced_to, Role.DATA) and not data_sharded:
        reduced_to = s.optimizer_rules()[name]
    grads_sharded = train and uses_role(reduced_to, Role.DATA)
    data_axes, n_data = placement.group(_shard_roles(storage[name]))
    terms: list[Term] = []
    if data_sharded:
        what = f"{name} gathered at use"
        role = TermRole.WEIGHT_GATHER
        terms += _term(
            ALL_GATHER, data_axes, n_data, payload, count, what, scope, role, stack=stack
        )
    if grads_sharded:
        data_axes, n_data = placement.group(_shard_roles(reduced_to))
        what = f"{name} gradient reduce-scattered to its shards"
        role = TermRole.GRADIENT_SCATTER
        terms += _term(
            REDUCE_SCATTER, data_axes, n_data, payload, count, what, scope, role, stack=stack
        )
    if train and not data_sharded and uses_role(s.optimizer_rules()[name], Role.DATA):
        data_axes, n_data = placement.group(_shard_roles(s.optimizer_rules()[name]))
        what = f"{name} updated shards gathered (ZeRO)"
        role = TermRole.UPDATE_GATHER
        terms += _term(ALL_GATHER, data_axes, n_data, payload, count, what, scope, role)
    # A gradient is partial over every axis that splits the tokens its weight sees:
    # the batch's axes (unless FSDP's reduce-scatter covers them: HSDP's 'replica' it does
    # not), under sequence parallelism 'model' for weights it does not split (norm gains,
    # embeddings), and under context parallelism 'context' (unless the reduce-scatter covers
    # it too). One all-reduce over all of them at once is cheaper than one per axis, and
    # after a reduce-scatter it sums the shard it left (1/n of the gradient).
    scattered = _shard_roles(reduced_to) if grads_sharded else ()
    # a routed expert's gradient is whole over the expert axis: every token sent to the
    # expert reached its device
    own = (Role.EXPERT,) if uses_role(storage[name], Role.EXPERT) else ()
    partial = [r for r in s.batch_roles if r not in scattered and r not in own]
    if s.context_parallel and Role.CONTEXT not in scattered:
        partial.append(Role.CONTEXT)
    if s.sequence_parallel and not uses_role(used_roles, Role.MODEL):
        partial.append(Role.MODEL)
    if train and partial:
        axes, n = placement.group(partial)
        shard = payload // placement.group(scattered)[1]
        what = f"{name} gradient summed over token shards" + (
            f" ({'+'.join(scattered)} shard)" if scattered else ""
        )
        role = TermRole.GRADIENT_SUM
        terms += _term(ALL_REDUCE, axes, n, shard, count, what, scope, role)
    return terms


def _stacked(c: ModelConfig, name: str) -> int:
    """How many layers stack parameter ``name`` (0: it is not a layer's)."""
    if name in LAYER_PARAMS:
        return c.dense_layer_count
    if name in MOE_PARAMS:
        return c.moe_layers
    return 0


def _moe_terms(placement: Placement, train: bool) -> list[Term]:
    """A mixture of experts' layers: under expert parallelism each layer's dispatch and
    combine all-to-alls over ``expert`` (:func:`~shardscope._src.bounds.moe.moe_layer_terms`,
    each replica's tokens over the data axes, at the capacity factor: the padded slots move
    too); under tensor parallelism the routed experts' row-parallel outputs (the slots a
    device holds, ``cf k h`` a token) and the shared experts' (``h`` a token) all-reduced
    over ``model``, again for the column-parallel input gradients in training.

    Folded (MoE parallel folding: the experts whole over ``expert`` and ``model``), the
    all-to-alls span both axes, each device sending its own slice of the tokens (sequence
    parallelism's), and nothing of the routed experts is summed over ``model``; the shared
    experts are a sequence-parallel MLP: their input all-gathered along the sequence and
    their output reduce-scattered back, each twice in training (its backward's).

    Unfolded under sequence parallelism (ETP = TP, Megatron-LM's default: each device of
    ``model`` routes its own slice of the sequence), the all-to-alls over ``expert`` carry
    each device's own slice of the tokens, and the routed experts' row-parallel all-reduce
    becomes an all-gather over ``model`` of the slots once they arrive (result: the slots of
    a device's sequences, ``cf k h`` a token, in ``moe/dispatch``) and a reduce-scatter of
    the experts' partial outputs before they go back (``moe/combine``); training adds the
    backward of each (a reduce-scatter in ``moe/dispatch``, an all-gather in
    ``moe/combine``): Megatron-Core's ``MoEAlltoAllTokenDispatcher`` with tensor
    parallelism.

    Under context parallelism too (Megatron-Core's EP with CP), each device of ``context``
    routes its own chunk of the sequence: the all-to-alls over ``expert`` carry one
    context shard's tokens, and what ``model`` sums, gathers or scatters is a device's
    chunks' slots."""
    s, c = placement.strategy, placement.config
    terms: list[Term] = []
    _, n_tokens = placement.group(s.batch_roles)
    if s.expert_parallel:
        expert_roles = entry_roles(s.expert_entry)
        axes, e = placement.group(expert_roles)
        # the devices that split the tokens: the batch's, under sequence parallelism the
        # model axis's slices (folded, among the experts' axes), and under context
        # parallelism the context axis's chunks (each routed on its own device)
        slices = [Role.MODEL] if s.routes_slices else []
        chunks = [Role.CONTEXT] if s.routes_context else []
        _, n_split = placement.group([*s.batch_roles, *expert_roles, *chunks, *slices])
        replicas = n_split // e
        data = next((a for a in placement.mesh.shape if a not in axes), "data")
        for t in moe_layer_terms(
            c.batch * c.seq,
            c.d_model,
            c.top_k,
            c.experts,
            axes if s.expert_fold else axes[0],
            e,
            c.itemsize,
            imbalance=c.routed_capacity,
            train=train,
            data_axis=data if replicas > 1 else None,
            data_devices=replicas,
            once=c.dispatch_once,
            weight_activations=c.weight_activations,
            group_limit=c.group_limit,
        ):
            if t.kind == ALL_TO_ALL:
                terms.append(replace(t, count=t.count * c.moe_layers))
    if Role.MODEL in s.roles:
        model_axes, m = placement.group([Role.MODEL])
        # a device's tokens: its sequences, or its context shard's chunks of them where each
        # chunk is routed on its own device (expert with context parallelism)
        n_chunks = _context_ways(placement) if s.routes_context else 1
        tokens = (c.batch // n_tokens) * c.seq // n_chunks
        passes = 2 if train else 1
        role = TermRole.ACTIVATION
        activation = tokens * c.d_model * c.itemsize
        slots = math.ceil(c.routed_capacity * tokens * c.top_k) * c.d_model * c.itemsize
        if s.gathers_expert_slots:
            k = c.moe_layers
            rows, moved = slots, []
            if c.dispatch_once:
                # each token's row once to each device of its experts (moe_layer_terms'
                # once), which of them fills each slot and its router weight with them
                e = placement.role_size(Role.EXPERT)
                share = device_share(c.experts, e, c.top_k, c.group_limit)
                rows = math.ceil(c.routed_capacity * tokens * e * share) * c.d_model * c.itemsize
                n_slots = math.ceil(c.routed_capacity * tokens * c.top_k)
                moved = [
                    (n_slots * INDEX_ITEMSIZE, "which row fills each slot, gathered", False),
                    (n_slots * c.itemsize, "each slot's router weight, gathered", True),
                ]
            elif c.weight_activations:
                # each slot's router weight with it (moe_layer_terms' weight_activations)
                n_slots = math.ceil(c.routed_capacity * tokens * c.top_k)
                moved = [(n_slots * c.itemsize, "each slot's router weight, gathered", True)]
            for (kind, backward), scope, what in (
                ((ALL_GATHER, REDUCE_SCATTER), "moe/dispatch", "routed slots gathered"),
                ((REDUCE_SCATTER, ALL_GATHER), "moe/combine", "routed experts' sums scattered"),
            ):
                terms += _term(kind, model_axes, m, rows, k, what, scope, role)
                if train:
                    what += " (its backward)"
                    terms += _term(backward, model_axes, m, rows, k, what, scope, role)
            scope = "moe/dispatch"
            for size, what, differentiated in moved:
                terms += _term(ALL_GATHER, model_axes, m, size, k, what, scope, role)
                if train and differentiated:
                    what += " (its backward)"
                    terms += _term(REDUCE_SCATTER, model_axes, m, size, k, what, scope, role)
        elif not s.expert_fold:
            what = "routed experts' down-projection partial sums (row-parallel)"
            terms += _term(
                ALL_REDUCE, model_axes, m, slots, passes * c.moe_layers, what, "moe/experts", role
            )
        if c.shared_experts and s.sequence_parallel:
            count = passes * c.moe_layers
            what = "shared experts' input gathered along the sequence" + (
                " (and the backward of the reduce-scatter)" if train else ""
            )
            terms += _term(ALL_GATHER, model_axes, m, activation, count, what, "moe/shared", role)
            what = "shared experts' down-projection partial sums reduce-scattered" + (
                " (and the backward of the gather)" if train else ""
            )
            terms += _term(
                REDUCE_SCATTER, model_axes, m, activation, count, what, "moe/shared", role
            )
        elif c.shared_experts:
            what = "shared experts' down-projection partial sums (row-parallel)"
            terms += _term(
                ALL_REDUCE, model_axes, m, activation, passes * c.moe_layers, what, "moe", role
            )
    return terms


def _shard_roles(roles: Sequence[str | tuple[str, ...] | None]) -> tuple[str, ...]:
    """The roles of the dimension that holds ``data`` (FSDP's: ``data``, or ``data`` and
    ``context`` together), or ``()``."""
    return next((entry_roles(e) for e in roles if Role.DATA in entry_roles(e)), ())


def _vocab_terms(
    axes: tuple[str, ...],
    n: int,
    activation: int,
    tokens: int,
    train: bool,
    sequence_parallel: bool = False,
) -> list[Term]:
    """The vocabulary split over ``model`` (Megatron-LM's vocabulary-parallel embedding and
    cross entropy, arXiv 1909.08053 section 3): each device looks up the tokens of its
    vocabulary slice, so the embeddings are summed over the slices; training, the
    unembedding's input gradient is partial over them (its column-parallel backward), and the
    loss needs, per token, the largest logit (for a stable log-sum-exp), the sum of ``exp``
    and the target's logit from the slices (a float32 each, as Megatron-LM's cross entropy
    all-reduces them).

    Under sequence parallelism (arXiv 2205.05198 section 4.2.2 and Megatron-LM's
    ``--sequence-parallel``) the summed embeddings are reduce-scattered to the sequence shards
    instead, and the output layer's input (the final norm's output) is all-gathered along the
    sequence before it; training, the backward of each: the embeddings' gradient
    all-gathered, the output layer's input gradient reduce-scattered (the final norm's gain
    sees a sequence shard, so its gradient is summed over ``model`` as every norm's is under
    sequence parallelism). Each of the ``tokens`` (of one data and context shard) is then
    scored on every device of the group, so the loss's three float32 are the same."""
    role, scope = TermRole.ACTIVATION, "embedding"
    if sequence_parallel:
        passes = 2 if train else 1
        backward = " (and the backward of the other)" if train else ""
        what = "embeddings reduce-scattered to sequence shards over vocabulary slices"
        terms = _term(REDUCE_SCATTER, axes, n, activation, passes, what + backward, scope, role)
        what = "output layer's input gathered along the sequence"
        terms += _term(ALL_GATHER, axes, n, activation, passes, what + backward, scope, role)
    else:
        what = "embeddings summed over vocabulary slices"
        terms = _term(ALL_REDUCE, axes, n, activation, 1, what, scope, role)
        if train:
            what = "input gradient of the vocabulary-parallel unembedding"
            terms += _term(ALL_REDUCE, axes, n, activation, 1, what, scope, role)
    if train:
        for what in ("largest logit", "sum of exp", "target's logit"):
            what += " over vocabulary slices"
            terms += _term(ALL_REDUCE, axes, n, 4 * tokens, 1, what, "loss", role)
    return terms


def _loss_terms(placement: Placement) -> list[Term]:
    """Training: the scalar loss summed over the axes that shard the tokens."""
    s = placement.strategy
    token_roles = [
        *s.batch_roles,
        # a vocabulary split scores every token of the sequence on each device of 'model'
        *([Role.MODEL] if s.sequence_parallel and not s.vocab_split else []),
        *([Role.CONTEXT] if s.context_parallel else []),
    ]
    axes, n = placement.group(token_roles)
    what = "scalar loss summed over token shards"
    return _term(ALL_REDUCE, axes, n, 4, 1, what, "loss", TermRole.LOSS_SUM)


_ATTENTION = ("attn_norm", "wqkv", *MLA_PARAMS, "wo")
_SCOPE_OF = {
    "attention": _ATTENTION + tuple(f"moe_{n}" for n in _ATTENTION),
    "mlp": ("mlp_norm", "w_up", "w_gate_up", "w_down"),
    "moe": ("moe_mlp_norm", "router", "shared_gate_up", "shared_up", "shared_down"),
    "moe/experts": EXPERT_PARAMS,
    "embedding": ("embed", "final_norm", "unembed"),
}
