"""The collectives a transformer strategy cannot do without, per layer and mode: Megatron-LM
(arXiv 1909.08053 section 3), sequence parallelism (arXiv 2205.05198 section 4.2.2) and ZeRO
(arXiv 1910.02054 section 7)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    REDUCE_SCATTER,
)
from shardscope._src.base.errors import StrategyError
from shardscope._src.base.notes import Note
from shardscope._src.bounds.terms import Bound, BoundNote, Term
from shardscope._src.model.config import LAYER_PARAMS, param_shapes
from shardscope._src.sharding.strategies import Placement

MODES = ("forward", "train")


# -- transformer strategies -----------------------------------------------------------------


def _group(placement: Placement, roles: Sequence[str]) -> tuple[tuple[str, ...], int]:
    """The mesh axes of ``roles`` (in mesh order) and the size of one group over them."""
    names = {a for r in roles if r in placement.axes for a in placement.axes[r]}
    sizes = {str(k): int(v) for k, v in placement.mesh.shape.items()}
    axes = tuple(a for a in sizes if a in names)
    return axes, math.prod(sizes[a] for a in axes)


def transformer_bound(placement: Placement, mode: str = "forward") -> Bound:
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
    * train, any strategy that shards tokens: the scalar loss is all-reduced over those axes.

    >>> from shardscope._src.model.config import ModelConfig
    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> b = transformer_bound(get_strategy("tp").place(ModelConfig(), abstract_mesh("model=8")))
    >>> b.counts()
    {'all-reduce': 4}
    """
    if mode not in MODES:
        raise StrategyError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    s, c = placement.strategy, placement.config
    L, train = c.layers, mode == "train"
    terms: list[Term] = []
    notes: list[Note] = []
    data_axes, n_data = _group(placement, ["data"]) if s.batch_role else ((), 1)
    model_axes, t = _group(placement, ["model"])
    activation = (c.batch // n_data) * c.seq * c.d_model * c.itemsize

    def add(
        kind: str,
        axes: tuple[str, ...],
        n: int,
        payload: int,
        count: int,
        what: str,
        scope: str = "",
    ) -> None:
        if n > 1 and count > 0 and payload > 0:
            terms.append(Term(kind, axes, n, payload, count, what, scope))

    # Tensor (and sequence) parallel activations over the model axis.
    if "model" in s.roles:
        passes = 2 if train else 1
        for scope, first, last in (
            ("attention", "QKV", "out-projection"),
            ("mlp", "MLP-up", "MLP-down"),
        ):
            if s.sequence_parallel:
                add(
                    ALL_GATHER,
                    model_axes,
                    t,
                    activation,
                    passes * L,
                    f"sequence shards gathered before the column-parallel {first} matmul"
                    + (
                        " (and its transpose for the backward of the reduce-scatter)"
                        if train
                        else ""
                    ),
                    scope,
                )
                add(
                    REDUCE_SCATTER,
                    model_axes,
                    t,
                    activation,
                    passes * L,
                    f"{last} partial sums reduce-scattered to sequence shards"
                    + (" (and the backward of the gather)" if train else ""),
                    scope,
                )
            else:
                add(
                    ALL_REDUCE,
                    model_axes,
                    t,
                    activation,
                    L,
                    f"{last} partial sums (row-parallel)",
                    scope,
                )
                if train:
                    add(
                        ALL_REDUCE,
                        model_axes,
                        t,
                        activation,
                        L,
                        f"input gradient of the column-parallel {first} matmul",
                        scope,
                    )

    # Weights: gathered at use (FSDP), gradients reduced over the data axes.
    storage, use = s.param_rules(), s.use_rules()
    grad_storage, opt_storage = s.grad_rules(), s.optimizer_rules()
    shapes = param_shapes(c)
    for name, shape in shapes.items():
        count = L if name in LAYER_PARAMS else 1
        one = shape[1:] if name in LAYER_PARAMS else shape
        used_roles = (use or storage)[name]
        model_ways = math.prod(placement.role_size(r) for r in used_roles if r == "model")
        payload = math.prod(one) * c.itemsize // model_ways  # as the data group sees it
        scope = next((k for k, v in _SCOPE_OF.items() if name in v), "")
        data_sharded = "data" in storage[name]
        grads_sharded = train and "data" in grad_storage[name]
        if data_sharded:
            axes, n = _group(placement, ["data"])
            add(ALL_GATHER, axes, n, payload, count, f"{name} gathered at use", scope)
        if grads_sharded:
            axes, n = _group(placement, ["data"])
            add(
                REDUCE_SCATTER,
                axes,
                n,
                payload,
                count,
                f"{name} gradient reduce-scattered to its shards",
                scope,
            )
        if train and not data_sharded and "data" in opt_storage[name]:
            axes, n = _group(placement, ["data"])
            add(
                ALL_GATHER,
                axes,
                n,
                payload,
                count,
                f"{name} updated shards gathered (ZeRO)",
                scope,
            )
        # A gradient is partial over every axis that splits the tokens its weight sees:
        # the data axes (unless FSDP's reduce-scatter covers them) and, under sequence
        # parallelism, 'model' for weights it does not split (norm gains, embeddings).
        # One all-reduce over all of them at once is cheaper than one per axis.
        partial = []
        if s.batch_role == "data" and not grads_sharded:
            partial.append("data")
        if s.sequence_parallel and "model" not in used_roles:
            partial.append("model")
        if train and partial:
            axes, n = _group(placement, partial)
            add(
                ALL_REDUCE,
                axes,
                n,
                payload,
                count,
                f"{name} gradient summed over token shards",
                scope,
            )

    if train:
        token_roles = [
            r
            for r in ("data", "model")
            if r in placement.axes
            and ((r == "data" and s.batch_role == "data") or (r == "model" and s.sequence_parallel))
        ]
        axes, n = _group(placement, token_roles)
        add(ALL_REDUCE, axes, n, 4, 1, "scalar loss summed over token shards", "loss")
        if "data" in storage["wqkv"]:
            notes.append(Note(BoundNote.FSDP_KEEPS_GATHERED))
    return Bound(f"{placement.name} {mode}", tuple(terms), tuple(notes))


_SCOPE_OF = {
    "attention": ("attn_norm", "wqkv", "wo"),
    "mlp": ("mlp_norm", "w_up", "w_gate_up", "w_down"),
    "embedding": ("embed", "final_norm", "unembed"),
}
