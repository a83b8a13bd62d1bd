"""Sharding strategies as data: named PartitionSpec rules for parameters and activations.

A :class:`Strategy` writes its rules with *roles* instead of mesh axis names: ``"data"``
(batch, and the FSDP parameter dimension), ``"model"`` (heads, MLP hidden, and the
sequence between blocks under sequence parallelism) and ``"context"`` (the sequence of every
activation under context parallelism). A dimension sharded over several roles at once names
them as a tuple (``(Role.DATA, Role.CONTEXT)``: FSDP over the data and the context axes).
:meth:`Strategy.place` maps the roles to the axes of a concrete mesh, checks that every sharded
dimension divides, and returns a :class:`Placement` holding ``PartitionSpec``s. Programs are
built from it in :mod:`shardscope._src.sharding.programs`; bounds in
:mod:`shardscope._src.bounds`.

Role resolution: ``"model"`` is the mesh axis named ``model`` (or ``model_axis=``),
``"context"`` the axis named ``context``, ``"replica"`` the axis named ``replica``; ``"data"``
is every other mesh axis, in mesh order, when the strategy uses it. A strategy that does not
use ``"data"`` leaves the other axes as pure replicas (every replica computes the same).

The ``replica`` role is hybrid sharded data parallelism's outer axis (PyTorch FSDP's
``HYBRID_SHARD``, whose 2-D device mesh names its dimensions ``("replicate", "shard")``;
torchtitan's ``dp_replicate``; MaxText's ``dcn_data_parallelism``): the batch is split over it,
the model state replicated. It has an axis of its own name rather than the ``pod`` axes the
planner writes before ``data`` in its 3-D meshes, because those are part of the ``data`` role
of every other strategy (FSDP shards its weights over them): under one name, ``pod=2,data=4``
would shard the weights 8 ways under ``fsdp`` and 4 under ``hsdp``, with nothing in the mesh
saying which. A mesh written for ``hsdp`` says it (``replica=8,data=8``); under any other
strategy ``replica`` is one more data axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jax.sharding import NamedSharding, PartitionSpec

from shardscope._src.base.errors import IndivisibleError, StrategyError, is_int
from shardscope._src.base.records import json_value, record_dict
from shardscope._src.base.vocab import Vocab
from shardscope._src.mesh import (
    MeshShape,
    auto_mesh,
    first_devices_mesh,
    format_mesh_spec,
    mesh_axes,
)
from shardscope._src.model.config import (
    LAYER_PARAMS,
    MOE_PARAMS,
    ModelConfig,
    param_shapes,
    split_params,
)
from shardscope._src.sharding.parallelism import ContextComm, DataParallel, Parallelism, Tensor

if TYPE_CHECKING:
    import jax


class Role(Vocab):
    """What a dimension of a strategy's rules is sharded over, bound to mesh axes by
    :meth:`Strategy.place` (see the module docstring)."""

    #: the batch, and the FSDP parameter dimension: every mesh axis but the model's
    DATA = "data"
    #: heads, MLP hidden, and the sequence between blocks under sequence parallelism
    MODEL = "model"
    #: the sequence of every activation (context parallelism): the mesh axis named context
    CONTEXT = "context"
    #: the batch, with the model state replicated (HSDP's outer axis): the mesh axis named
    #: replica
    REPLICA = "replica"
    #: a mixture of experts' routed experts, each on one device of it, and the batch (the
    #: attention data-parallel over the same devices): the mesh axis named expert
    EXPERT = "expert"


#: The mesh axis the ``context`` role is bound to (MaxText's ``context`` mesh axis).
CONTEXT_AXIS = "context"
#: The mesh axis the ``replica`` role is bound to (HSDP's outer axis, across nodes: PyTorch's
#: ``replicate`` mesh dimension, torchtitan's ``dp_replicate``).
REPLICA_AXIS = "replica"
#: The mesh axis the ``expert`` role is bound to (torchtitan's ``ep``, MaxText's ``expert``).
EXPERT_AXIS = "expert"

#: One dimension's entry in a rule: unsharded, one role, or several roles at once (their
#: axes in that order, as one PartitionSpec entry).
Entry = str | tuple[str, ...] | None
Roles = tuple[Entry, ...]


def entry_roles(entry: Entry) -> tuple[str, ...]:
    """The roles of one dimension's entry: ``()``, ``("data",)``, ``("data", "context")``."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def uses_role(roles: Roles, role: str) -> bool:
    """Whether any dimension of ``roles`` is sharded over ``role`` (alone or with others)."""
    return any(role in entry_roles(e) for e in roles)


# Dimension names, used to check divisibility and to word errors.
PARAM_DIMS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("d_model",),
    "wqkv": ("d_model", "kv_heads", "qkv_slots", "head_dim"),
    # multi-head latent attention's projections (model.config.MLA_PARAMS)
    "wq": ("d_model", "heads", "qk_dim"),
    "wq_a": ("d_model", "q_lora"),
    "q_norm": ("q_lora",),
    "wq_b": ("q_lora", "heads", "qk_dim"),
    "wkv_a": ("d_model", "kv_latent"),
    "kv_norm": ("kv_lora",),
    "wkv_b": ("kv_lora", "heads", "kv_dim"),
    "wo": ("heads", "head_dim", "d_model"),
    "mlp_norm": ("d_model",),
    "w_up": ("d_model", "ff"),
    "w_gate_up": ("d_model", "gate_up", "ff"),
    "w_down": ("ff", "d_model"),
    "embed": ("vocab", "d_model"),
    "final_norm": ("d_model",),
    "unembed": ("d_model", "vocab"),
    # a mixture of experts' layers with experts (model.config.MOE_PARAMS)
    "moe_attn_norm": ("d_model",),
    "moe_wqkv": ("d_model", "kv_heads", "qkv_slots", "head_dim"),
    "moe_wq": ("d_model", "heads", "qk_dim"),
    "moe_wq_a": ("d_model", "q_lora"),
    "moe_q_norm": ("q_lora",),
    "moe_wq_b": ("q_lora", "heads", "qk_dim"),
    "moe_wkv_a": ("d_model", "kv_latent"),
    "moe_kv_norm": ("kv_lora",),
    "moe_wkv_b": ("kv_lora", "heads", "kv_dim"),
    "moe_wo": ("heads", "head_dim", "d_model"),
    "moe_mlp_norm": ("d_model",),
    "router": ("d_model", "experts"),
    "expert_gate_up": ("experts", "d_model", "gate_up", "expert_ff"),
    "expert_up": ("experts", "d_model", "expert_ff"),
    "expert_down": ("experts", "expert_ff", "d_model"),
    "shared_gate_up": ("d_model", "gate_up", "shared_ff"),
    "shared_up": ("d_model", "shared_ff"),
    "shared_down": ("shared_ff", "d_model"),
}
#: Each parameter of a layer with experts and the dense one whose rule it takes (the routed
#: experts' after their experts dimension; the router's ``d_model`` as the norm's).
_MOE_LIKE = {
    "moe_attn_norm": "attn_norm",
    "moe_wqkv": "wqkv",
    **{f"moe_{n}": n for n in ("wq", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b")},
    "moe_wo": "wo",
    "moe_mlp_norm": "mlp_norm",
    "expert_gate_up": "w_gate_up",
    "expert_up": "w_up",
    "expert_down": "w_down",
    "shared_gate_up": "w_gate_up",
    "shared_up": "w_up",
    "shared_down": "w_down",
}
ACTIVATION_DIMS: dict[str, tuple[str, ...]] = {
    "residual": ("batch", "seq", "d_model"),
    "enter": ("batch", "seq", "d_model"),
    "heads": ("batch", "seq", "heads", "head_dim"),
    "hidden": ("batch", "seq", "ff"),
    "keys": ("batch", "seq", "kv_heads", "head_dim"),
    "logits_in": ("batch", "seq", "d_model"),
}


def _rules(**kw: Roles) -> tuple[tuple[str, Roles], ...]:
    return tuple(kw.items())


#: The parameters with a leading layers axis (their specs get ``None`` for it).
_STACKED = frozenset(LAYER_PARAMS) | frozenset(MOE_PARAMS)

#: The dense model's parameters: the strategies' tables name these; a mixture of experts'
#: take their rules from them (:func:`_with_experts`).
_DENSE_PARAMS = tuple(n for n in PARAM_DIMS if n not in _MOE_LIKE and n != "router")
_REPLICATED_PARAMS = {name: (None,) * len(PARAM_DIMS[name]) for name in _DENSE_PARAMS}
_TP_PARAMS = dict(
    _REPLICATED_PARAMS,
    wqkv=(None, Role.MODEL, None, None),
    # latent attention: each head's query, key and value projections from the latents
    # column-parallel (the latents themselves are small and replicated)
    wq=(None, Role.MODEL, None),
    wq_b=(None, Role.MODEL, None),
    wkv_b=(None, Role.MODEL, None),
    wo=(Role.MODEL, None, None),
    w_up=(None, Role.MODEL),
    w_gate_up=(None, None, Role.MODEL),
    w_down=(Role.MODEL, None),
)
_FSDP_PARAMS = dict(
    attn_norm=(Role.DATA,),
    wqkv=(Role.DATA, None, None, None),
    wq=(Role.DATA, None, None),
    wq_a=(Role.DATA, None),
    q_norm=(Role.DATA,),
    wq_b=(Role.DATA, None, None),
    wkv_a=(Role.DATA, None),
    kv_norm=(Role.DATA,),
    wkv_b=(Role.DATA, None, None),
    wo=(None, None, Role.DATA),
    mlp_norm=(Role.DATA,),
    w_up=(Role.DATA, None),
    w_gate_up=(Role.DATA, None, None),
    w_down=(None, Role.DATA),
    embed=(None, Role.DATA),
    final_norm=(Role.DATA,),
    unembed=(Role.DATA, None),
)


def _without(entry: Entry, role: str) -> Entry:
    kept = tuple(r for r in entry_roles(entry) if r != role)
    return None if not kept else kept[0] if len(kept) == 1 else kept


@functools.cache
def _with_experts(
    rules_items: tuple[tuple[str, Roles], ...], roles: tuple[str, ...], fold: bool = False
) -> Mapping[str, Roles]:
    """``rules`` with an entry for each parameter of a layer with experts that it does not
    name: the attention's, the shared experts' and the routed experts' as their dense
    counterparts', the routed experts' ``experts`` dimension over the ``expert`` role where
    the strategy has one (and that role dropped from their other dimensions: each expert
    lives on one device of it), the router's ``d_model`` as the norm's. Folded (``fold``:
    MoE parallel folding), the ``experts`` dimension is over ``expert`` and ``model``
    together and both roles are dropped from the others: each expert whole on one device of
    the group."""
    rules = dict(rules_items)
    out = dict(rules)
    expert: Entry = (
        (Role.EXPERT, Role.MODEL) if fold else Role.EXPERT if Role.EXPERT in roles else None
    )
    for name, dense in _MOE_LIKE.items():
        if name in out or dense not in rules:
            continue
        if name.startswith("expert_"):
            kept = [_without(e, Role.EXPERT) for e in rules[dense]]
            if fold:
                kept = [_without(e, Role.MODEL) for e in kept]
            out[name] = (expert, *kept)
        else:
            out[name] = rules[dense]
    if "router" not in out and "attn_norm" in rules:
        out["router"] = (rules["attn_norm"][0], None)
    # read-only: the planner asks for a strategy's rules millions of times a sweep, and each
    # table's are worked out once
    return MappingProxyType(out)


def _acts(batch: Entry, model: str | None, seq: Entry) -> dict[str, Roles]:
    return {
        "residual": (batch, seq, None),
        "enter": (batch, None, None),
        "heads": (batch, None, model, None),
        "hidden": (batch, None, model),
    }


def _context_acts(batch: Entry, model: str | None, seq: Entry) -> dict[str, Roles]:
    """Context parallelism: the sequence of every activation over ``context`` (between
    blocks under sequence parallelism over ``context`` and then ``model``: ``seq``); the keys
    and values as attention uses them hold the whole sequence, so the compiler all-gathers
    them over ``context`` in each layer (MaxText's and torchtitan's all-gather form), and
    reduce-scatters their gradients in the backward.

    The ring form (:attr:`Strategy.context_comm` ``ring``: ring attention, Liu et al., arXiv
    2310.01889; Megatron-LM's and Transformer Engine's default context parallelism) places
    the same activations and never makes the keys whole: its program passes each shard's
    keys and values around the context ring (:mod:`~shardscope._src.sharding.programs`)."""
    c = Role.CONTEXT
    return {
        "residual": (batch, seq, None),
        "enter": (batch, c, None),
        "heads": (batch, c, model, None),
        "hidden": (batch, c, model),
        "keys": (batch, None, model, None),
    }


def _sharded_params(group: Entry, *, expert: bool, tensor: bool) -> dict[str, Roles]:
    """The block of the sharded model state: each parameter's FSDP dimension over ``group``
    (the data axes; with the context axes too under context parallelism, as torchtitan shards
    FSDP over dp_shard x cp and Megatron-LM its distributed optimizer over the data and
    context ranks: the context devices hold other tokens of the same sequences, so they are
    data-parallel replicas of every weight; gathers and reduce-scatters over ``d x c``
    devices send (dc - 1)/dc of each weight, barely more than (d - 1)/d over ``data`` alone,
    and the gradient needs no separate sum over ``context``), and under tensor parallelism
    its Megatron dimension over ``model`` too.

    With experts (FSDP over the data and the expert axes together: torchtitan's FSDP over
    dp_shard, within which its expert parallelism borrows the ep devices; both hold other
    tokens), latent attention's up-projections have no model dimension to shard over both
    axes, and their latent dimension (DeepSeek-V3's 512 and 1536) divides few meshes: the
    latent over the data axes, the heads over 'expert'; the latents' norm gains over the data
    axes."""
    out = {
        name: tuple(group if r == Role.DATA else r for r in roles)
        for name, roles in _FSDP_PARAMS.items()
    }
    if expert:
        out.update(
            wq_b=(Role.DATA, Role.EXPERT, None),
            wkv_b=(Role.DATA, Role.EXPERT, None),
            q_norm=(Role.DATA,),
            kv_norm=(Role.DATA,),
        )
    if tensor:
        out = {
            name: tuple(a or b for a, b in zip(out[name], _TP_PARAMS[name], strict=True))
            for name in _DENSE_PARAMS
        }
    if expert and tensor:
        # the heads over 'model' as Megatron splits them, and over 'expert' within that
        out.update(
            wq_b=(Role.DATA, (Role.MODEL, Role.EXPERT), None),
            wkv_b=(Role.DATA, (Role.MODEL, Role.EXPERT), None),
        )
    return out


@dataclass(frozen=True)
class Strategy:
    """A named set of PartitionSpec rules, written with roles (``Role.DATA``, ``Role.MODEL``,
    ``Role.CONTEXT``).

    Attributes:
        name: short name used by the CLI and the planner (``"tp"``, ``"dp_sp"``, ...).
        summary: one line for tables and help.
        roles: the roles the strategy needs bound to mesh axes.
        params: per parameter (without the stacked layers axis), the role of each dimension
            where it is stored.
        use: per parameter, the role of each dimension where it is used (FSDP gathers the
            data-sharded dimension at use); ``None`` means stored = used, no constraint.
        activations: ``residual``, ``enter``, ``heads``, ``hidden``, ``keys`` (the keys
            and values as attention uses them) and ``logits_in`` (the output layer's input, under
            sequence parallelism with the vocabulary split) -> roles per dimension,
            applied as sharding constraints under jit; empty for none.
        sequence_parallel: the residual stream is sharded on the sequence between blocks.
        twin: a ``shard_map`` version with explicit collectives exists.
        grads: per parameter, the roles its gradient is stored with (ZeRO-2 shards it over
            the data axes while the parameter stays replicated); ``None``: as the parameter.
        optimizer: per parameter, the roles its optimizer state (fp32 master copy, Adam
            moments) is stored with (ZeRO-1 and -2 shard it over the data axes); ``None``:
            as the gradient. A train step of a strategy whose optimizer state is sharded
            finer than its parameters ends with the update: each device updates its shard and
            the new parameters are all-gathered (ZeRO, arXiv 1910.02054, section 5).
        vocab_split: the embedding and the unembedding are split over ``model`` along the
            vocabulary, and so are the logits (Megatron-LM's vocabulary-parallel embedding and
            cross entropy, torchtitan's loss parallelism): :meth:`with_vocab_split`.
        context_comm: under context parallelism, how the keys and values cross the context
            shards: ``all_gather`` (each layer gathers them whole) or ``ring`` (each shard's
            chunk passed around the ring, ``c - 1`` steps a layer); its JSON key is written
            only for the ring, so a strategy written before the ring reads as it did.
        expert_fold: expert parallelism folded over ``model`` (MoE parallel folding,
            Megatron-LM's ``--expert-tensor-parallel-size 1``): the routed experts split over
            ``expert`` and ``model`` together, each whole, and each sequence's tokens routed
            in one group a slice of ``model`` (:attr:`Placement.sequence_groups`); its JSON key is
            written only when folded, so a strategy written before reads as it did.
    """

    name: str
    summary: str
    roles: tuple[str, ...]
    params: tuple[tuple[str, Roles], ...]
    use: tuple[tuple[str, Roles], ...] | None = None
    activations: tuple[tuple[str, Roles], ...] = ()
    sequence_parallel: bool = False
    twin: bool = False
    grads: tuple[tuple[str, Roles], ...] | None = None
    optimizer: tuple[tuple[str, Roles], ...] | None = None
    vocab_split: bool = False
    context_comm: ContextComm = ContextComm.ALL_GATHER
    expert_fold: bool = False

    def with_vocab_split(self) -> Strategy:
        """This strategy with the vocabulary split over ``model``: the embedding's and the
        unembedding's vocabulary dimension (stored, used, and in their gradients and
        optimizer state) and the logits'. Each device then projects onto its slice of the
        vocabulary; the loss sums its log-sum-exp over the slices.

        Under sequence parallelism (Megatron-LM's vocabulary-parallel embedding and output
        layer with ``--sequence-parallel``) every device of a ``model`` group looks up the
        tokens of the whole sequence (of its context shard) in its slice, and the embeddings
        are reduce-scattered along the sequence; the final norm's output is all-gathered
        along it for the output layer (the ``logits_in`` activation), and the logits are
        ``(batch, sequence, vocabulary over model)``.

        Raises :class:`StrategyError` for a strategy without a ``model`` role."""
        if Role.MODEL not in self.roles:
            raise StrategyError(
                f"strategy {self.name!r} has no 'model' axis to split it over; split the "
                f"vocabulary under one of "
                f"{', '.join(n for n, s in STRATEGIES.items() if s.splits_vocab)}"
            )
        if self.vocab_split:
            return self

        def split(rules: tuple[tuple[str, Roles], ...] | None) -> Any:
            if rules is None:
                return None
            out = dict(rules)
            out["embed"] = (Role.MODEL, out["embed"][1])
            out["unembed"] = (out["unembed"][0], Role.MODEL)
            return tuple(out.items())

        rules = {k: split(getattr(self, k)) for k in ("params", "use", "grads", "optimizer")}
        acts = dict(self.activations)
        if self.sequence_parallel and "residual" in acts:
            batch, seq, _ = acts["residual"]
            acts["logits_in"] = (batch, _without(seq, Role.MODEL), None)
        return replace(self, vocab_split=True, activations=tuple(acts.items()), **rules)

    @property
    def splits_vocab(self) -> bool:
        """Whether :meth:`with_vocab_split` applies: the strategy has a ``model`` role."""
        return Role.MODEL in self.roles

    def param_rules(self) -> Mapping[str, Roles]:
        return _with_experts(self.params, self.roles, self.expert_fold)

    def grad_rules(self) -> Mapping[str, Roles]:
        if self.grads is None:
            return self.param_rules()
        return _with_experts(self.grads, self.roles, self.expert_fold)

    def optimizer_rules(self) -> Mapping[str, Roles]:
        if self.optimizer is None:
            return self.grad_rules()
        return _with_experts(self.optimizer, self.roles, self.expert_fold)

    @property
    def updates_shards(self) -> bool:
        """The optimizer state is sharded finer than the parameters (ZeRO-1, ZeRO-2): the
        train step updates shards and all-gathers the new parameters."""
        return self.optimizer is not None and self.optimizer_rules() != self.param_rules()

    @functools.cached_property
    def shards_weights(self) -> bool:
        """Some parameter is stored sharded over ``data`` (FSDP, ZeRO-3): gathered at use."""
        return any(uses_role(roles, Role.DATA) for roles in self.param_rules().values())

    def use_rules(self) -> Mapping[str, Roles] | None:
        return None if self.use is None else _with_experts(self.use, self.roles, self.expert_fold)

    def activation_rules(self) -> dict[str, Roles]:
        return dict(self.activations)

    # the screen asks it of every candidate (data_ways), through a dict of the rules each time
    @functools.cached_property
    def batch_roles(self) -> tuple[str, ...]:
        """The roles the batch is split over, in the order of its entry: ``()`` (every
        device sees the whole batch), ``("data",)``, or HSDP's ``("replica", "data")``."""
        return entry_roles(self.activation_rules().get("residual", (None,))[0])

    @property
    def batch_entry(self) -> Entry:
        """The batch dimension's entry (one role, several, or None)."""
        roles = self.batch_roles
        return None if not roles else roles[0] if len(roles) == 1 else roles

    @property
    def expert_parallel(self) -> bool:
        """The routed experts of a mixture of experts are split over ``expert``: the strategy
        places only models with experts."""
        return Role.EXPERT in self.roles

    @property
    def expert_entry(self) -> Entry:
        """The routed experts' ``experts`` dimension's entry: ``expert``, or folded
        ``(expert, model)`` (the group a token's all-to-alls span); None without expert
        parallelism."""
        if not self.expert_parallel:
            return None
        return (Role.EXPERT, Role.MODEL) if self.expert_fold else Role.EXPERT

    @property
    def routes_slices(self) -> bool:
        """Each device of ``model`` routes its own slice of the sequence, sequence
        parallelism's, as one group of a layer with experts: expert parallelism under sequence
        parallelism, folded or not (Megatron-Core's ``MoEAlltoAllTokenDispatcher`` routes,
        and counts a capacity for, each rank's own ``S/TP x B`` tokens)."""
        return self.expert_parallel and self.sequence_parallel

    @property
    def gathers_expert_slots(self) -> bool:
        """Expert parallelism under sequence parallelism unfolded (Megatron-LM's default
        expert tensor parallelism, ETP = TP): the slots each device of ``model`` sent over
        ``expert`` are all-gathered over ``model`` for the experts' split hidden once they
        arrive, and the experts' partial outputs reduce-scattered back over it before they
        return (Megatron-Core's dispatcher: all-to-all over EP, then all-gather over TP;
        reduce-scatter over TP, then all-to-all over EP)."""
        return self.routes_slices and not self.expert_fold

    @property
    def routes_context(self) -> bool:
        """Each device of ``context`` routes its own chunk of every sequence as a group of a
        layer with experts (expert with context parallelism: Megatron-Core's EP with CP, each
        context rank's tokens routed, and counted a capacity, on that rank); a strategy
        without expert parallelism routes each whole sequence as one group."""
        return self.expert_parallel and self.context_parallel

    @property
    def context_parallel(self) -> bool:
        """The sequence of every activation is sharded over ``context``; attention gathers
        the keys and values of the whole sequence in each layer (or, :attr:`context_ring`,
        passes them around the context ring)."""
        return Role.CONTEXT in self.roles

    @property
    def context_ring(self) -> bool:
        """Context parallelism in its ring form: each layer's keys and values pass around
        the context ring, ``c - 1`` collective-permutes of one shard's chunk."""
        return self.context_parallel and self.context_comm == ContextComm.RING

    def place(
        self,
        config: ModelConfig,
        mesh: jax.sharding.Mesh | str,
        *,
        model_axis: str = "model",
        axes: Mapping[str, tuple[str, ...]] | None = None,
        constraints: bool = True,
    ) -> Placement:
        """Resolves the roles on ``mesh`` and checks that every sharded dimension divides.

        ``mesh`` is a ``Mesh``, a description (made into a ``Mesh`` of this process's
        devices), or an :func:`abstract_mesh` (specs and bounds only, no devices).

        ``axes`` overrides the resolution (``{"data": ("pod", "data"), "model": ("model",)}``).
        ``constraints=False`` drops the activation constraints (what a user who only
        shards the weights writes); the verdict shows what that costs.

        Raises :class:`StrategyError` naming the value, the rule and a fix.
        """
        if self.expert_parallel and not config.is_moe:
            dense = [n for n, st in STRATEGIES.items() if not st.expert_parallel]
            raise StrategyError(
                f"strategy {self.name!r} splits a mixture of experts' routed experts over "
                f"'{EXPERT_AXIS}', and this model has none (experts=0); give the model "
                f"experts (ModelConfig(experts=8, top_k=2, ...)), or "
                f"choose a strategy for dense models: {', '.join(dense)}",
                param="strategy",
            )
        # The reference model constrains its activations (with_sharding_constraint) and lets
        # the compiler choose the collectives: it runs on Auto axes whatever the mesh's types.
        mesh = auto_mesh(first_devices_mesh(mesh) if isinstance(mesh, str) else mesh)
        sizes = mesh_axes(mesh)
        resolved = _resolve_roles(self, sizes, model_axis, axes)
        placement = Placement(self, config, mesh, resolved, constraints)
        placement.validate()
        return placement

    def to_dict(self) -> dict[str, Any]:
        # rules are stored as pairs and written as {name: roles}; grads and optimizer resolved
        out = record_dict(self)
        if self.context_comm == ContextComm.ALL_GATHER:
            del out["context_comm"]  # as written before the ring form
        if not self.expert_fold:
            del out["expert_fold"]  # as written before the folded form
        return {
            **out,
            "params": json_value(self.param_rules()),
            "use": json_value(self.use_rules()),
            "activations": json_value(self.activation_rules()),
            "grads": json_value(self.grad_rules()),
            "optimizer": json_value(self.optimizer_rules()),
        }


#: The strategies named before the dimensions, in their order, with their summaries word for
#: word (plans and their JSON carry them). Each is the composition of its name's parts.
_PRESET_SUMMARIES = {
    "replicated": "every device holds and computes everything",
    "dp": "data parallel: batch sharded on every mesh axis, weights replicated",
    "fsdp": "fully sharded data parallel: weights sharded on the data axes, gathered at use",
    "zero1": "ZeRO-1: data parallel with the optimizer state sharded on the data axes; "
    "gradients whole on each device, reduced to each one's shard for its update (a "
    "reduce-scatter at least), updated shards all-gathered",
    "zero2": "ZeRO-2: data parallel with gradients and optimizer state sharded on the data "
    "axes; gradients reduce-scattered, updated shards all-gathered",
    "tp": "Megatron tensor parallel on 'model': QKV and MLP-up column-parallel, "
    "out-projection and MLP-down row-parallel",
    "dp_tp": "data x tensor parallel: batch on the data axes, Megatron on 'model'",
    "zero1_tp": "ZeRO-1 on the data axes x Megatron on 'model' (Megatron-LM's distributed "
    "optimizer)",
    "fsdp_tp": "FSDP on the data axes x Megatron on 'model'",
    "sp": "Megatron tensor parallel with sequence parallelism: residual stream "
    "sharded on the sequence over 'model'",
    "dp_sp": "data parallel x tensor-and-sequence parallel",
    "fsdp_sp": "FSDP on the data axes x tensor-and-sequence parallel on 'model' (torchtitan's "
    "2-D parallelism)",
    "dp_cp": "data x context parallel: batch on the data axes, the sequence on 'context' "
    "(keys and values gathered per layer), weights replicated",
    "fsdp_cp": "FSDP on the data and context axes together x context parallel on 'context' "
    "(torchtitan's FSDP over dp_shard x cp)",
    "hsdp": "hybrid sharded data parallel: weights sharded on 'data' (inside a node), "
    "replicated on 'replica' (across nodes), the batch on both",
    "ep": "expert parallel: each routed expert on one device of 'expert', the rest "
    "replicated, the batch over 'expert' (data-parallel attention)",
    "dp_ep": "data x expert parallel: the experts split over 'expert' and replicated over the "
    "data axes, the rest replicated, the batch over both",
    "fsdp_ep": "FSDP x expert parallel (torchtitan's EP within dp_shard): the dense weights "
    "sharded over the data and expert axes, the experts split over 'expert' and "
    "sharded over the data axes, gathered at use; the batch over both",
    "ep_tp": "expert x tensor parallel: the experts split over 'expert' and their hidden "
    "over 'model', the attention and shared MLP Megatron on 'model', the batch over "
    "'expert'",
}
#: Today's names: the presets of the dimensions, first in :data:`STRATEGIES`.
PRESETS = tuple(_PRESET_SUMMARIES)

_DATA_PHRASES = {
    DataParallel.DP: "data parallel",
    DataParallel.ZERO1: "ZeRO-1 (the distributed optimizer: the optimizer state sharded)",
    DataParallel.ZERO2: "ZeRO-2 (the gradients and the optimizer state sharded)",
    DataParallel.FSDP: "FSDP (the weights sharded, gathered at use)",
    DataParallel.HSDP: "HSDP (the weights sharded on 'data', replicated on 'replica')",
}


def _summary(p: Parallelism) -> str:
    """One line for a composition without a preset's summary, from its dimensions' phrases."""
    where = (
        "the data, expert and context axes (the routed experts' on the data and context axes)"
        if p.context and p.expert
        else "the data and context axes"
        if p.context
        else "the data and expert axes (the routed experts' on the data axes)"
        if p.expert
        else "the data axes"
    )
    parts = []
    if p.data != DataParallel.NONE:
        parts.append(f"{_DATA_PHRASES[p.data]} on {where}")
    if p.expert_fold:
        parts.append(
            "expert parallel folded on 'expert' x 'model' (each expert whole, ETP 1: MoE "
            "parallel folding; the batch over 'expert' too)"
        )
    elif p.expert and p.tensor == Tensor.SP:
        parts.append(
            "expert parallel on 'expert' (the batch over it too; each model rank's slots "
            "all-gathered over 'model' for the experts' split hidden, ETP = TP)"
        )
    elif p.expert:
        parts.append("expert parallel on 'expert' (the batch over it too)")
    if p.tensor == Tensor.TP:
        parts.append("Megatron tensor parallel on 'model'")
    elif p.tensor == Tensor.SP:
        parts.append("tensor-and-sequence parallel on 'model'")
    if p.context_comm == ContextComm.RING:
        parts.append("context parallel on 'context' (keys and values passed around a ring)")
    elif p.context:
        parts.append("context parallel on 'context' (keys and values gathered per layer)")
    return " x ".join(parts)


def compose(dims: Parallelism | str) -> Strategy:
    """The strategy of one choice along each dimension (:class:`Parallelism`, or a name
    written by its naming rule), built from the shared rule blocks: the parameters
    replicated or Megatron's (tensor), the sharded state's block over the data axes (and
    ``context``, ``expert``) for whichever of the parameters (FSDP, HSDP), gradients (ZeRO-2)
    and optimizer state (ZeRO-1, -2) the data flavour shards, and the activations' batch,
    heads, hidden and sequence entries.

    >>> s = compose("zero1_sp_cp")
    >>> s.roles, s.sequence_parallel, s.optimizer_rules()["w_up"]
    (('data', 'context', 'model'), True, (('data', 'context'), 'model'))
    >>> compose("fsdp_tp") == STRATEGIES["fsdp_tp"]
    True
    """
    p = Parallelism.parse(dims) if isinstance(dims, str) else dims
    d, tensor = p.data, p.tensor != Tensor.NONE
    roles = tuple(
        r
        for r, on in (
            (Role.REPLICA, d == DataParallel.HSDP),
            (Role.DATA, d != DataParallel.NONE),
            (Role.EXPERT, p.expert),
            (Role.CONTEXT, p.context),
            (Role.MODEL, tensor),
        )
        if on
    )
    kept = _TP_PARAMS if tensor else _REPLICATED_PARAMS
    # the dense weights' data-parallel group: every device that holds other tokens
    # (Megatron-Core's data x context group, the expert devices among the data ones); the
    # routed experts' is what is left when _with_experts drops 'expert' from it
    group: Entry = (
        (Role.DATA, Role.EXPERT, Role.CONTEXT)
        if p.context and p.expert
        else (Role.DATA, Role.CONTEXT)
        if p.context
        else (Role.DATA, Role.EXPERT)
        if p.expert
        else Role.DATA
    )
    sharded = _rules(**_sharded_params(group, expert=p.expert, tensor=tensor))
    weights_sharded = d in (DataParallel.FSDP, DataParallel.HSDP)

    batch: Entry = None
    if d == DataParallel.HSDP:
        batch = (Role.REPLICA, Role.DATA)
    elif d != DataParallel.NONE:
        batch = (Role.DATA, Role.EXPERT) if p.expert else Role.DATA
    elif p.expert:
        batch = Role.EXPERT
    model = Role.MODEL if tensor else None
    sp = p.tensor == Tensor.SP
    acts: dict[str, Roles] = {}
    if p.context:
        seq: Entry = (Role.CONTEXT, Role.MODEL) if sp else Role.CONTEXT
        acts = _context_acts(batch, model, seq)
    elif batch is not None or tensor:
        acts = _acts(batch, model, Role.MODEL if sp else None)
    # the shard_map twins place tensor and expert parallelism over replicated data shards
    # (and expert parallelism over FSDP's, gathered at use); none updates sharded optimizer
    # state (ZeRO's train step is jit's)
    replicas = (DataParallel.NONE, DataParallel.DP)
    twin = not p.context and (
        (p.expert and d in (*replicas, DataParallel.FSDP)) or (tensor and d in replicas)
    )
    return Strategy(
        p.name,
        _PRESET_SUMMARIES.get(p.name) or _summary(p),
        roles,
        sharded if weights_sharded else _rules(**kept),
        use=_rules(**kept) if weights_sharded else None,
        activations=_rules(**acts),
        sequence_parallel=sp,
        twin=twin,
        grads=sharded if d == DataParallel.ZERO2 else None,
        optimizer=sharded if d in (DataParallel.ZERO1, DataParallel.ZERO2) else None,
        context_comm=p.context_comm,
        expert_fold=p.expert_fold,
    )


def _compositions() -> list[Parallelism]:
    """Every combination the rule sets compose, in a stable order (data, tensor, context,
    expert), then the ring forms of the context-parallel ones in the same order, then the
    folded forms of expert parallelism in the same order (without context parallelism)."""
    out = []
    for d in DataParallel:
        for t in Tensor:
            for context in (False, True):
                for expert in (False, True):
                    try:
                        out.append(Parallelism(d, t, context, expert))
                    except StrategyError:
                        continue
    rings = []
    for p in out:
        if p.context:
            try:
                rings.append(replace(p, context_comm=ContextComm.RING))
            except StrategyError:
                continue
    folds = []
    for d in DataParallel:
        try:
            folds.append(Parallelism(d, Tensor.SP, expert=True, expert_fold=True))
        except StrategyError:
            continue
    return out + rings + folds


#: The strategies named before the dimensions (the presets), in their order.
STRATEGIES: dict[str, Strategy] = {name: compose(name) for name in PRESETS}
#: Every strategy the dimensions compose: the presets, then the other compositions (in the
#: order data, tensor, context, expert); each is accepted wherever a strategy name is.
ALL_STRATEGIES: dict[str, Strategy] = {
    **STRATEGIES,
    **{p.name: compose(p) for p in _compositions() if p.name not in STRATEGIES},
}


def get_strategy(name: str | Strategy) -> Strategy:
    """The built-in strategy called ``name``, a preset or any composition of the dimensions
    (:data:`ALL_STRATEGIES`); a :class:`Strategy` is returned as is."""
    if isinstance(name, Strategy):
        return name
    if name not in ALL_STRATEGIES:
        why = composes_error(name)
        if why is not None:
            raise StrategyError(why, param="strategy")
        raise StrategyError(
            f"unknown strategy {name!r}; choose a preset ({', '.join(STRATEGIES)}) or name a "
            f"composition by its dimensions' parts in the order data (dp, zero1, zero2, fsdp, "
            f"hsdp), ep (ep_fold under sp), tp or sp, cp (cp_ring), joined by '_' (e.g. "
            f"zero1_sp_cp_ring)"
        )
    return ALL_STRATEGIES[name]


def composes_error(name: object) -> str | None:
    """Why a name that reads by the naming rule names no strategy: its dimensions do not
    compose (``hsdp_ep_cp``: the message says what they compose with); None for any other
    name (the caller's unknown-name error lists the names).

    >>> composes_error("hsdp_ep_cp")[:51]
    'hsdp_ep_cp: expert parallelism composes with data p'
    >>> composes_error("zero1_ep_cp") is None
    True
    >>> composes_error("megatron") is None
    True
    """
    if not isinstance(name, str):
        return None
    try:
        Parallelism.parse(name)
    except StrategyError as e:
        return None if str(e).startswith("unknown strategy") else str(e)
    return None


def abstract_mesh(spec: str | Mapping[str, int]) -> Any:
    """A ``jax.sharding.AbstractMesh`` (Auto axes) for a description (or a
    :class:`~shardscope._src.mesh.MeshShape`'s :meth:`~shardscope._src.mesh.MeshShape.abstract`):
    no devices needed.

    Binding a strategy to it checks the fit and gives specs and bounds for meshes larger
    than the devices at hand (the planner's case); compiling needs a real mesh.

    >>> dict(abstract_mesh("data=64,model=16").shape)
    {'data': 64, 'model': 16}
    """

    return MeshShape.of(spec).abstract()


def mesh_spec_for(strategy: str | Strategy, sizes: tuple[int, ...]) -> str:
    """A mesh description of shape ``sizes`` whose axis names fit ``strategy``'s roles.

    The last axis is ``model`` or ``context`` when the strategy uses that role (both:
    ``context`` then ``model``, the innermost); the others are ``data``, preceded by ``pod``
    and ``pod1``, ... for more axes. A strategy with the ``expert`` role has it last but for
    ``model``. A 1-D mesh for a data-only strategy is ``data=N``. A strategy with the
    ``replica`` role (HSDP) has it first, the slowest-varying axis (across nodes), and
    ``data`` after it, the last but for ``context`` and ``model``.

    >>> mesh_spec_for("dp_tp", (2, 4))
    'data=2,model=4'
    >>> mesh_spec_for("tp", (8,))
    'model=8'
    >>> mesh_spec_for("fsdp", (2, 2, 2))
    'pod=2,data=2,model=2'
    >>> mesh_spec_for("fsdp_cp", (2, 4))
    'data=2,context=4'
    >>> mesh_spec_for("hsdp", (8, 8))
    'replica=8,data=8'
    >>> mesh_spec_for("fsdp_ep", (8, 8))
    'data=8,expert=8'
    >>> mesh_spec_for("zero1_ep_tp", (2, 4, 2))
    'data=2,expert=4,model=2'
    >>> mesh_spec_for("zero1_ep_sp_cp", (2, 2, 2, 2))
    'data=2,expert=2,context=2,model=2'
    >>> mesh_spec_for("zero1_sp_cp", (2, 2, 4))
    'data=2,context=2,model=4'
    >>> mesh_spec_for("hsdp_tp", (4, 2, 8))
    'replica=4,data=2,model=8'
    """
    s = get_strategy(strategy)
    if not sizes or not all(is_int(v, 1) for v in sizes):
        raise StrategyError(f"mesh shape {sizes!r} must be one or more positive integers")
    names: list[str]
    last = CONTEXT_AXIS if s.context_parallel else Role.MODEL
    if Role.EXPERT in s.roles:
        # the experts' axis last but for the model's (its devices closest, for the
        # all-to-alls), the data axes before it
        # (with context parallelism, 'context' between them: Megatron-Core's tp-cp-ep-dp
        # order, the tensor-parallel ranks innermost)
        tail = [
            EXPERT_AXIS,
            *([CONTEXT_AXIS] if s.context_parallel else []),
            *([Role.MODEL] if Role.MODEL in s.roles else []),
        ]
        tail = tail[-len(sizes) :]
        n_lead = len(sizes) - len(tail)
        lead = ["pod" if i == 0 else f"pod{i}" for i in range(n_lead - 1)]
        names = [*lead, Role.DATA, *tail] if n_lead else tail
    elif len(sizes) == 1:
        alone = CONTEXT_AXIS if s.roles == (Role.CONTEXT,) else Role.DATA
        names = [Role.MODEL if Role.MODEL in s.roles else alone]
    else:
        # context inside the data axes, the model axis innermost (the closest devices)
        tail = (
            [CONTEXT_AXIS, Role.MODEL] if s.context_parallel and Role.MODEL in s.roles else [last]
        )
        head = [REPLICA_AXIS] if Role.REPLICA in s.roles else []
        if Role.REPLICA in s.roles and not (s.context_parallel or Role.MODEL in s.roles):
            tail = []
        n_lead = len(sizes) - len(head) - 1 - len(tail)
        if n_lead < 0:
            names = [*head, Role.DATA, *tail][-len(sizes) :]
        else:
            lead = ["pod" if i == 0 else f"pod{i}" for i in range(n_lead)]
            names = [*head, *lead, Role.DATA, *tail]
    return ",".join(f"{n}={v}" for n, v in zip(names, sizes, strict=True))


# A sweep places each strategy on many meshes (and each placement again per micro-batch
# count), of one model: what to check is worked out once a strategy and its parameters.
@functools.lru_cache(maxsize=1024)
def _sharded_dims(
    strategy: Strategy, params: tuple[str, ...]
) -> tuple[tuple[tuple[str, Entry], str], ...]:
    """Each ``(dimension, role)`` that ``strategy`` splits among the arrays of a model whose
    parameters are ``params``, with the first array that splits it so (``"parameter
    'wqkv'"``, ``"activation 'residual'"``), in the order :meth:`Placement.validate` checks
    them: the sequence over ``context`` first (the dimension a context-parallel mesh is
    chosen for, so its message comes before the weights'), the rest in rule order."""
    wanted: dict[tuple[str, Entry], str] = {}
    for kind, rules in (
        ("parameter", strategy.param_rules()),
        ("gradient", strategy.grad_rules()),
        ("optimizer state", strategy.optimizer_rules()),
    ):
        for name in params:
            for dim, role in zip(PARAM_DIMS[name], rules[name], strict=True):
                if role is not None:
                    wanted.setdefault((dim, role), f"{kind} {name!r}")
    for point, roles in strategy.activation_rules().items():
        for dim, role in zip(ACTIVATION_DIMS[point], roles, strict=True):
            if role is not None:
                wanted.setdefault((dim, role), f"activation {point!r}")
    return tuple(sorted(wanted.items(), key=lambda kv: kv[0] != ("seq", Role.CONTEXT)))


def _resolve_roles(
    strategy: Strategy,
    sizes: dict[str, int],
    model_axis: str,
    axes: Mapping[str, tuple[str, ...]] | None,
) -> dict[str, tuple[str, ...]]:
    mesh_text = format_mesh_spec(sizes)
    if axes is not None:
        resolved = {role: tuple(axes.get(role, ())) for role in strategy.roles}
        for role, names in resolved.items():
            for name in names:
                if name not in sizes:
                    raise StrategyError(
                        f"strategy {strategy.name!r}: role {role!r} is bound to axis {name!r}, "
                        f"which mesh {mesh_text!r} does not have; use one of "
                        f"{', '.join(sizes)}"
                    )
        used = [n for names in resolved.values() for n in names]
        if len(used) != len(set(used)):
            raise StrategyError(
                f"strategy {strategy.name!r}: axes {used} are bound to more than one role; "
                f"give each mesh axis to one role"
            )
    else:
        resolved = {}
        if Role.MODEL in strategy.roles:
            if model_axis not in sizes:
                raise StrategyError(
                    f"strategy {strategy.name!r} shards heads and MLP hidden over a mesh axis "
                    f"named {model_axis!r}, but mesh {mesh_text!r} has none; name one axis "
                    f"{model_axis!r} (e.g. mesh '{model_axis}={math.prod(sizes.values())}') "
                    f"or pass model_axis=<one of {', '.join(sizes)}>",
                    param="mesh",
                )
            resolved[Role.MODEL] = (model_axis,)
        if Role.CONTEXT in strategy.roles:
            if CONTEXT_AXIS not in sizes:
                data = math.prod(sizes.values())
                raise StrategyError(
                    f"strategy {strategy.name!r} shards the sequence over a mesh axis named "
                    f"{CONTEXT_AXIS!r}, but mesh {mesh_text!r} has none; name one axis "
                    f"{CONTEXT_AXIS!r} (e.g. mesh 'data={max(1, data // 2)},"
                    f"{CONTEXT_AXIS}={min(2, data)}')",
                    param="mesh",
                )
            resolved[Role.CONTEXT] = (CONTEXT_AXIS,)
        if Role.REPLICA in strategy.roles:
            if REPLICA_AXIS not in sizes:
                n = math.prod(sizes.values())
                r = next((k for k in range(2, n + 1) if n % k == 0 and n // k > 1), 2)
                raise StrategyError(
                    f"strategy {strategy.name!r} replicates its sharded weights over a mesh "
                    f"axis named {REPLICA_AXIS!r} (the outer axis, across nodes) and shards "
                    f"them over 'data' (the inner one), but mesh {mesh_text!r} has no "
                    f"{REPLICA_AXIS!r} axis; name the outer axis {REPLICA_AXIS!r} (e.g. mesh "
                    f"'{REPLICA_AXIS}={r},data={max(1, n // r)}', 'data' inside a node), or "
                    f"use fsdp to shard over every axis",
                    param="mesh",
                )
            resolved[Role.REPLICA] = (REPLICA_AXIS,)
        if Role.EXPERT in strategy.roles:
            if EXPERT_AXIS not in sizes:
                n = math.prod(sizes.values())
                shape = (n,) if len(strategy.roles) == 1 else (max(1, n // 2), min(2, n))
                raise StrategyError(
                    f"strategy {strategy.name!r} splits the routed experts over a mesh axis "
                    f"named {EXPERT_AXIS!r}, but mesh {mesh_text!r} has none; name one axis "
                    f"{EXPERT_AXIS!r} (e.g. mesh {mesh_spec_for(strategy, shape)!r})",
                    param="mesh",
                )
            resolved[Role.EXPERT] = (EXPERT_AXIS,)
        if Role.DATA in strategy.roles:
            taken = {a for names in resolved.values() for a in names}
            resolved[Role.DATA] = tuple(a for a in sizes if a not in taken)
    for role in strategy.roles:
        if not resolved.get(role):
            other = (
                Role.DATA
                if role != Role.DATA
                else next((r for r in strategy.roles if r != Role.DATA), Role.MODEL)
            )
            raise StrategyError(
                f"strategy {strategy.name!r} needs a mesh axis for role {role!r}, but mesh "
                f"{mesh_text!r} leaves none (the {other} role took "
                f"{', '.join(resolved.get(other, ())) or 'nothing'}); add an axis, e.g. "
                f"mesh {mesh_spec_for(strategy, (2, 4))!r}, or choose a strategy without "
                f"{role!r}",
                param="mesh",
            )
    return resolved


@dataclass(frozen=True)
class Placement:
    """Where a strategy puts things on one mesh, for one model config: its roles resolved to
    the mesh's axes, and from them the ``PartitionSpec`` of every parameter and activation."""

    strategy: Strategy
    config: ModelConfig
    mesh: Any
    axes: dict[str, tuple[str, ...]]
    constraints: bool = True
    _sizes: dict[str, int] = field(init=False, repr=False, compare=False)
    #: :meth:`role_size` of each entry asked for, and :meth:`ways` of each array's roles:
    #: the planner's screen asks the same few of one placement for every candidate on it
    _role_sizes: dict[Entry, int] = field(init=False, repr=False, compare=False)
    _ways: dict[Roles, int] = field(init=False, repr=False, compare=False)
    _groups: dict[tuple[str, ...], tuple[tuple[str, ...], int]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sizes", mesh_axes(self.mesh))
        object.__setattr__(self, "_role_sizes", {})
        object.__setattr__(self, "_ways", {})
        object.__setattr__(self, "_groups", {})

    # -- roles ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.strategy.name

    def entry_axes(self, role: Entry) -> tuple[str, ...]:
        """The mesh axes one dimension with ``role`` (one role, several, or None) is split
        over, in the entry's order."""
        return tuple(a for r in entry_roles(role) for a in self.axes[r])

    def role_size(self, role: Entry) -> int:
        """How many ways ``role`` (one role, several, or None) splits a dimension (1 for
        ``None``)."""
        size = self._role_sizes.get(role)
        if size is None:
            size = self._role_sizes[role] = math.prod(self._sizes[a] for a in self.entry_axes(role))
        return size

    def group(self, roles: Sequence[str]) -> tuple[tuple[str, ...], int]:
        """The mesh axes of ``roles`` (each role's, in the mesh's order) and how many devices
        one group over them holds: where a collective over those roles runs."""
        key = tuple(roles)
        group = self._groups.get(key)
        if group is None:
            names = {a for r in key for a in self.axes.get(r, ())}
            axes = tuple(a for a in self._sizes if a in names)
            group = self._groups[key] = (axes, math.prod(self._sizes[a] for a in axes))
        return group

    def ways(self, roles: Roles) -> int:
        """How many pieces an array whose dimensions have ``roles`` is split into on each
        device: the product of each dimension's :meth:`role_size`."""
        ways = self._ways.get(roles)
        if ways is None:
            ways = self._ways[roles] = math.prod(self.role_size(r) for r in roles)
        return ways

    @functools.cached_property
    def param_elements(self) -> tuple[tuple[str, int], ...]:
        """Each parameter's name and element count (:func:`param_shapes`), in its order."""
        return tuple((n, math.prod(shape)) for n, shape in param_shapes(self.config).items())

    def entry(self, role: Entry) -> str | tuple[str, ...] | None:
        """The PartitionSpec entry for one dimension with ``role``."""
        names = self.entry_axes(role)
        if not names:
            return None
        return names[0] if len(names) == 1 else names

    def spec(self, roles: Roles, *, layers: bool = False) -> Any:

        entries = [self.entry(r) for r in roles]
        return PartitionSpec(*([None] if layers else []), *entries)

    def sharding(self, spec: Any) -> Any:

        return NamedSharding(self.mesh, spec)

    # -- specs ---------------------------------------------------------------------------
    def param_specs(self) -> dict[str, Any]:
        """PartitionSpec per parameter, in the model's pytree (layer weights stacked)."""

        return self._specs(self.strategy.param_rules())

    def grad_specs(self) -> dict[str, Any]:
        """PartitionSpec per gradient (ZeRO-2: sharded on the data axes), like
        :meth:`param_specs`."""
        return self._specs(self.strategy.grad_rules())

    def optimizer_specs(self) -> dict[str, Any]:
        """PartitionSpec per parameter's optimizer state (ZeRO-1/-2: data-sharded)."""
        return self._specs(self.strategy.optimizer_rules())

    def _specs(self, rules: Mapping[str, Roles]) -> dict[str, Any]:

        shapes = param_shapes(self.config)
        return split_params(
            {name: self.spec(rules[name], layers=name in _STACKED) for name in shapes}
        )

    def use_spec(self, name: str) -> Any | None:
        """Spec a weight is constrained to at its use (one layer's slice), or None."""
        use = self.strategy.use_rules()
        return None if use is None else self.spec(use[name])

    def activation_spec(self, point: str) -> Any | None:
        if not self.constraints:
            return None
        rules = self.strategy.activation_rules()
        return self.spec(rules[point]) if point in rules else None

    @property
    def sequence_groups(self) -> int:
        """How many groups each sequence's tokens are routed in by a layer with experts: one,
        or under expert and sequence parallelism (:attr:`Strategy.routes_slices`, folded or
        not) one a device of ``model``, its slice of the sequence (Megatron-Core routes, and
        counts a capacity for, each rank's own tokens), and under expert and context
        parallelism (:attr:`Strategy.routes_context`) that many a device of ``context``, its
        chunk of the sequence (Megatron-Core's EP with CP: each context rank routes its own
        chunk)."""
        s = self.strategy
        context = self.role_size(Role.CONTEXT) if s.routes_context else 1
        return context * (self.role_size(Role.MODEL) if s.routes_slices else 1)

    @property
    def model_slices(self) -> int:
        """Of :attr:`sequence_groups`, the slices of each context shard's chunk (one per
        device of ``model`` under expert and sequence parallelism, else 1)."""
        return self.role_size(Role.MODEL) if self.strategy.routes_slices else 1

    def moe_spec(self, point: str) -> Any | None:
        """The spec of a layer with experts' ``point`` (its tokens routed in groups, one per
        sequence, or under expert and sequence parallelism one per slice of it on a device of
        ``model``): ``"tokens"`` ``[groups, tokens, d_model]`` and ``"slots"`` ``[experts,
        groups, slots, d_model]`` over the batch's axes (with slices, and ``model``);
        ``"experts"`` (the slots as the experts take them) with ``experts`` over the
        ``expert`` axis (folded, ``expert`` and ``model``) and the groups over the batch's
        other axes. Between ``"slots"`` and ``"experts"`` the compiler moves each group's
        slots to their experts: the all-to-all over the experts' axes. Unfolded under
        sequence parallelism (:attr:`Strategy.gathers_expert_slots`) the groups are
        slice-major, over ``model`` then the batch's axes, and ``"arrived"`` and
        ``"experts"`` place them split ``[experts, groups / t, t, ...]``: at ``"arrived"``
        over their experts' devices with each slice still on its device of ``model`` (the
        all-to-all over ``expert``), at ``"experts"`` every slice on each device of ``model``
        (the all-gather over it; the experts' partial sums are reduce-scattered back);
        ``"arrived"`` is ``None`` for any other strategy. Under expert and context
        parallelism (:attr:`Strategy.routes_context`) the groups are chunk-major too, over
        ``context`` before the batch's axes (after ``model`` with the slices). ``None``
        without activation constraints."""
        if not self.constraints:
            return None
        s = self.strategy
        batch = s.batch_entry
        if s.routes_context:
            # each context shard's chunk of a sequence its own group, chunk-major
            # (moe_capacity's chunks): over 'context', then the batch's axes, so that the
            # expert axis is the groups' innermost and leaves them by one all-to-all
            batch = (Role.CONTEXT, *entry_roles(batch))
        if s.gathers_expert_slots:
            # slice-major groups (moe_capacity's slices): a device's slices one block of them
            batch = (Role.MODEL, *entry_roles(batch))
        elif s.routes_slices:
            batch = (*entry_roles(batch), Role.MODEL)
        if point == "tokens":
            return self.spec((batch, None, None))
        if point == "slots":
            return self.spec((None, batch, None, None))
        if point in ("experts", "arrived"):
            expert = s.expert_entry
            rest = batch
            for role in entry_roles(expert):
                rest = _without(rest, role)
            if s.gathers_expert_slots:
                # [experts, groups / t, t, ...] (moe_capacity's slices): each device's slice
                # over 'model' until the slots arrive, then every slice on each device of it
                slices = Role.MODEL if point == "arrived" else None
                return self.spec((expert, _without(rest, Role.MODEL), slices))
            if point == "arrived":
                return None
            return self.spec((expert, rest, None, None))
        raise ValueError(f"unknown point {point!r} of a layer with experts")

    def batch_specs(self) -> tuple[Any, Any]:
        """Specs of ``(inputs, targets)``: the residual stream's (first two dims for tokens;
        under a vocabulary split, the sequence not over ``model``: every device of a
        ``model`` group looks up, and scores, the tokens of the whole sequence)."""
        residual = self.strategy.activation_rules().get("residual", (None, None, None))
        roles = residual if self.config.vocab is None else self._token_roles(residual)
        return self.spec(roles), self.spec(roles)

    def output_spec(self) -> Any:
        """Spec of the forward's output: the residual's (logits: the vocabulary replicated,
        or split over ``model`` under :meth:`Strategy.with_vocab_split`, the sequence then
        gathered from ``model`` under sequence parallelism)."""
        residual = self.strategy.activation_rules().get("residual", (None, None, None))
        vocab = Role.MODEL if self.strategy.vocab_split else None
        return self.spec(self._token_roles(residual) + (vocab,))

    def _token_roles(self, residual: Roles) -> Roles:
        """The batch's and the sequence's roles of the tokens and the logits: the
        residual's, with ``model`` dropped from the sequence under a vocabulary split."""
        batch, seq = residual[:2]
        return (batch, _without(seq, Role.MODEL) if self.strategy.vocab_split else seq)

    # -- validation ----------------------------------------------------------------------
    def dim_sizes(self) -> dict[str, int]:
        c = self.config
        # ModelConfig sets both when it is made (from d_model / heads, and heads).
        assert c.head_dim is not None and c.kv_heads is not None
        sizes: dict[str, int] = {
            "d_model": c.d_model,
            "heads": c.heads,
            "kv_heads": c.kv_heads,
            "qkv_slots": c.q_per_kv + 2,
            "gate_up": 2,
            "head_dim": c.head_dim,
            "ff": c.ff,
            "batch": c.batch,
            "seq": c.seq,
        }
        if c.vocab is not None:
            sizes["vocab"] = c.vocab
        if c.is_moe:
            f = c.expert_ff or c.ff
            sizes.update(experts=c.experts, expert_ff=f, shared_ff=c.shared_experts * f)
        if c.is_mla:
            sizes.update(
                qk_dim=c.qk_head_dim,
                q_lora=c.q_lora_rank or 1,
                kv_lora=c.kv_lora_rank,
                kv_latent=c.kv_lora_rank + c.rope_head_dim,
                kv_dim=c.head_dim + c.value_head_dim,
            )
        return sizes

    def validate(self) -> None:
        """Raises :class:`StrategyError` when a sharded dimension is not divisible, or a ring
        of context parallelism has one shard (nothing to pass around)."""
        if self.strategy.context_ring and self.role_size(Role.CONTEXT) < 2:
            axes = ", ".join(f"{a}={self._sizes[a]}" for a in self.entry_axes(Role.CONTEXT))
            gather = self.name.removesuffix("_ring")
            raise StrategyError(
                f"strategy {self.name!r} passes the keys and values around a ring over mesh "
                f"axis {axes}, a ring of one shard; give the mesh context=2 or more (the "
                f"sequence split that many ways), or a strategy without context parallelism"
                f" (the all-gather form {gather!r} over context=1 is the same program)"
            )
        sizes = self.dim_sizes()
        for (dim, role), where in _sharded_dims(self.strategy, tuple(param_shapes(self.config))):
            ways = self.role_size(role)
            size = sizes[dim]
            if size % ways:
                axes = ", ".join(f"{a}={self._sizes[a]}" for a in self.entry_axes(role))
                what = "+".join(entry_roles(role))
                # the widest split of the dimension, no wider than this one, that a mesh of
                # these devices has: dividing the devices too (6 of 12 sequences on 8 devices
                # is no mesh's; 2 of 8192 tokens on 12 is)
                devices = math.prod(self._sizes.values())
                fits = max(
                    d for d in range(1, min(size, ways) + 1) if size % d == 0 and devices % d == 0
                )
                if dim == "kv_heads" and self.config.kv_heads == self.config.heads:
                    dim = "heads"  # multi-head attention: the heads themselves
                elif dim == "kv_heads":
                    raise StrategyError(
                        f"strategy {self.name!r} splits the {size} key/value heads over mesh "
                        f"axes {axes} ({ways} ways), but {size} is not divisible by {ways}; "
                        f"tensor parallelism here refuses to replicate key/value heads (as "
                        f"Megatron-LM requires the query groups to divide by the tensor-"
                        f"parallel size): choose a model axis dividing {size} "
                        f"(e.g. {fits})"
                    )
                raise IndivisibleError(
                    f"strategy {self.name!r} shards {dim}={size} ({where}) over mesh axes "
                    f"{axes} ({ways} ways), but {size} is not divisible by {ways}; choose "
                    f"{dim} a multiple of {ways} (e.g. {dim}={ways * max(1, size // ways)}), "
                    f"or a mesh whose {what} axes multiply to a divisor of {size} "
                    f"(e.g. {fits})",
                    dim=dim,
                    size=size,
                    ways=ways,
                    axes=axes,
                    roles=what,
                    fits=fits,
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "mesh": dict(self._sizes),
            **record_dict(
                self, omit=("strategy", "config", "mesh", "_sizes", "_role_sizes", "_ways")
            ),
        }
