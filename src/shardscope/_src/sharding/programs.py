"""Programs built from a strategy's placement: jit (the compiler inserts collectives) or
shard_map (explicit ``psum`` / ``all_gather`` / ``psum_scatter``), in forward or train-step mode.

A :class:`Program` carries its jitted function and abstract arguments
(``jax.ShapeDtypeStruct`` with shardings), so it can be lowered, compiled and audited without
allocating anything; :meth:`Program.example_args` makes concrete sharded arrays for running it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from shardscope._src.base.errors import StrategyError, is_int
from shardscope._src.base.text import format_spec
from shardscope._src.model.config import Mode, ModelConfig, param_shapes
from shardscope._src.model.fused import fused_norm
from shardscope._src.model.moe import moe_capacity_local
from shardscope._src.model.transformer import (
    Hooks,
    abstract_batch,
    abstract_params,
    forward,
    init_batch,
    init_params,
    loss,
    loss_from_output,
    ring_attention,
    token_losses,
)
from shardscope._src.sharding.strategies import (
    PARAM_DIMS,
    STRATEGIES,
    Entry,
    Placement,
    Role,
    Strategy,
    entry_roles,
    get_strategy,
    uses_role,
)

IMPLS = ("jit", "shard_map")


class JitHooks(Hooks):
    """Sharding constraints at the strategy's activation points and weight uses; under
    context parallelism's ring form, the attention core in a ``shard_map`` over the context
    axis (manual over it alone, the compiler placing the rest), each shard running
    :func:`~shardscope._src.model.transformer.ring_attention` on its part of the sequence.

    ``copies``: weights given one copy per model shard (a leading axis over ``model``) under
    sequence parallelism (:func:`sequence_copies`), each shard's part of the sequence using
    its own, so that each copy's gradient is that shard's partial one, summed by no
    collective: a norm's gain, the embedding and the unembedding applied per shard."""

    def __init__(
        self,
        placement: Placement,
        *,
        regather: bool = False,
        copies: tuple[str, ...] = (),
    ) -> None:
        self.placement = placement
        ring = placement.strategy.context_ring
        self._context = placement.entry(Role.CONTEXT) if ring else None
        self._copies = frozenset(copies)
        self._model = placement.entry(Role.MODEL) if copies else None
        uses = [self._use_spec(n) for n in param_shapes(placement.config)]
        # Context parallelism's keys and values, whole along the sequence.
        uses.append(placement.activation_spec("keys"))
        self._use_shardings = {placement.sharding(s) for s in uses if s is not None}
        self.gathers_weights = regather and bool(self._use_shardings)
        if Role.EXPERT in placement.strategy.roles:
            self.expert_devices = placement.role_size(placement.strategy.expert_entry)
            self.sequence_groups = placement.sequence_groups
            if placement.strategy.gathers_expert_slots:
                self.expert_slices = placement.model_slices
            if placement.strategy.routes_context:
                self.context_chunks = placement.role_size(Role.CONTEXT)

    def gathers(self, prim: Any, params: dict[str, Any]) -> bool:
        """A weight's constraint to its use (FSDP's gather) or the keys' and values' to the
        whole sequence (context parallelism's), told by its sharding: the other activations'
        constraints shard their sequence, the weights' never shard their batch; and the
        ring's passes of the keys and values (a ``ppermute`` over the context axis), which
        the backward passes again rather than keep every chunk."""
        if prim.name == "ppermute" and self._context is not None:
            return _names(params.get("axis_name")) == _names(self._context)
        return prim.name == "sharding_constraint" and params.get("sharding") in self._use_shardings

    def attend(self, q: Any, k: Any, v: Any, positions: Any, core: Any) -> Any:
        if self._context is None:
            return core(q, k, v, positions)
        axis = self._context
        shards = self.placement.role_size(Role.CONTEXT)

        def ring(q: Any, k: Any, v: Any) -> Any:
            return ring_attention(q, k, v, axis, shards)

        seq = PartitionSpec(None, axis)
        return jax.shard_map(
            ring,
            mesh=self.placement.mesh,
            in_specs=(seq, seq, seq),
            out_specs=seq,
            axis_names=set(_names(axis)),
        )(q, k, v)

    def _constrain(self, x: Any, spec: Any) -> Any:

        if spec is None:
            return x
        return jax.lax.with_sharding_constraint(x, self.placement.sharding(spec))

    def residual(self, x: Any) -> Any:
        return self._constrain(x, self.placement.activation_spec("residual"))

    def enter(self, scope: str, h: Any) -> Any:
        return self._constrain(h, self.placement.activation_spec("enter"))

    def heads(self, x: Any) -> Any:
        return self._constrain(x, self.placement.activation_spec("heads"))

    def keys(self, x: Any) -> Any:
        return self._constrain(x, self.placement.activation_spec("keys"))

    def hidden(self, x: Any) -> Any:
        return self._constrain(x, self.placement.activation_spec("hidden"))

    def exit(self, scope: str, y: Any) -> Any:
        return self._constrain(y, self.placement.activation_spec("residual"))

    def _use_spec(self, name: str) -> Any:
        spec = self.placement.use_spec(name)
        if name not in self._copies:
            return spec
        dims = len(PARAM_DIMS[name])
        return PartitionSpec(self._model, *(tuple(spec) if spec is not None else (None,) * dims))

    def weight(self, name: str, w: Any) -> Any:
        return self._constrain(w, self._use_spec(name))

    def norm(self, name: str, x: Any, gain: Any) -> Any:
        if name not in self._copies:
            return super().norm(name, x, gain)
        # each model shard's part of the sequence by its own copy of the gain [model, d]:
        # its gradient one sum over the shard's tokens (summing each position's over the
        # batch first has the compiler reduce every position's over the data axes)
        b, s, d = x.shape
        w = self.weight(name, gain)
        y = fused_norm(x.reshape(b, w.shape[0], s // w.shape[0], d), w[:, None])
        return y.reshape(b, s, d)

    def embed(self, table: Any, tokens: Any) -> Any:
        if "embed" not in self._copies:
            return super().embed(table, tokens)
        b, s = tokens.shape
        parts = tokens.reshape(b, table.shape[0], -1)  # [batch, model, seq / model]
        x = jax.vmap(lambda tab, tok: jnp.take(tab, tok, axis=0), in_axes=(0, 1), out_axes=1)(
            table, parts
        )
        return x.reshape(b, s, -1)

    def logits_input(self, x: Any) -> Any:
        return self._constrain(x, self.placement.activation_spec("logits_in"))

    def logits(self, name: str, x: Any, w: Any) -> Any:
        if name not in self._copies:
            return super().logits(name, x, w)
        b, s, d = x.shape
        parts = x.reshape(b, w.shape[0], -1, d)  # [batch, model, seq / model, d_model]
        equation = "btsd,tdv->btsv" if name == "unembed" else "btsd,tvd->btsv"
        return jnp.einsum(equation, parts, w).reshape(b, s, -1)

    def moe(self, point: str, x: Any) -> Any:
        return self._constrain(x, self.placement.moe_spec(point))


#: The axis name a train step maps the context shards over (:func:`_local_accumulation`).
CONTEXT_SHARDS = "context_shards"


def _names(axis: Any) -> tuple[str, ...]:
    """A collective's axis names as a tuple (one name, or several)."""
    return tuple(axis) if isinstance(axis, tuple | list) else (axis,)


class ContextShardHooks(JitHooks):
    """One context shard's program in a train step mapped over the context shards
    (:func:`local_context`): it holds one part of every sequence of its micro-batch, gathers
    the keys and values of the whole sequence from the other shards (``all_gather`` over
    :data:`CONTEXT_SHARDS`, whose transpose reduce-scatters their gradients back) and masks
    its queries at their positions in the whole sequence.

    In the ring form the shards are mapped by a ``shard_map`` over the context axis instead
    (:func:`_over_context_shards`), and each passes its keys and values around them
    (:func:`~shardscope._src.model.transformer.ring_attention`, ``ppermute`` over the
    context axis): a ``ppermute`` over a ``vmap``'s axis is a permutation of an array's
    dimension, which the compiler partitions into all-gathers, not collective-permutes."""

    def __init__(self, placement: Placement, **kw: Any) -> None:
        super().__init__(placement, **kw)
        self._shards: Any = CONTEXT_SHARDS if self._context is None else self._context

    def attend(self, q: Any, k: Any, v: Any, positions: Any, core: Any) -> Any:
        if self._context is None:
            return core(q, k, v, positions)
        return ring_attention(q, k, v, self._context, self.placement.role_size(Role.CONTEXT))

    def _constrain(self, x: Any, spec: Any) -> Any:
        if spec is None or self._context is None:
            return super()._constrain(x, spec)
        # inside the shard_map the data and context axes are manual: a constraint names the
        # mesh as the map sees it
        mesh = jax.sharding.get_abstract_mesh()
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def keys(self, x: Any) -> Any:
        return super().keys(jax.lax.all_gather(x, CONTEXT_SHARDS, axis=1, tiled=True))

    def positions(self, seq: int) -> Any:
        return jax.lax.axis_index(self._shards) * seq + jnp.arange(seq)

    def gathers(self, prim: Any, params: dict[str, Any]) -> bool:
        if prim.name == "all_gather" and params.get("axis_name") in (
            CONTEXT_SHARDS,
            (CONTEXT_SHARDS,),
        ):
            return True
        return super().gathers(prim, params)


class ShardMapHooks(Hooks):
    """Megatron's explicit collectives over the model axis, per device inside shard_map,
    and a mixture of experts' all-to-alls over the expert axis.

    Tensor parallel: the row-parallel output is ``psum``-ed. Sequence parallel: the normed
    input is ``all_gather``-ed along the sequence before the column-parallel matmuls and the
    row-parallel output is ``psum_scatter``-ed back to sequence shards. Expert parallel: each
    device's sequences fill their slots of every expert and an ``all_to_all`` over the
    expert axis takes them to their experts and back
    (:func:`~shardscope._src.model.moe.moe_capacity_local`); under tensor parallelism too,
    the experts' split hidden is ``psum``-ed before they go back, and under sequence
    parallelism (each device of ``model`` routing its own slice of its sequences) the slots
    that arrive are ``all_gather``-ed over ``model`` first and the experts' output
    ``psum_scatter``-ed back (Megatron-Core's dispatcher with ETP = TP). Folded (``fold_experts``,
    the expert axis the tuple of the expert and model axes), each device's slice of its
    sequences (sequence parallelism's) is routed as its own group, and the all-to-alls span
    both axes: each expert whole, nothing summed over ``model``. FSDP: each weight stored
    sharded over axes it is not used sharded over is ``all_gather``-ed over them at its use
    (``gathers``: per weight, each dimension and its axes), and autodiff reduce-scatters its
    gradient (``psum_scatter``, the gather's transpose). The vocabulary split over the model
    axis (``vocab_split``, Megatron-LM's ``VocabParallelEmbedding``): each device looks up the
    tokens of its slice of the vocabulary (the others' rows zero) and the embeddings are
    ``psum``-ed, or ``psum_scatter``-ed to sequence shards under sequence parallelism, where
    the output layer's input is ``all_gather``-ed along the sequence first.
    """

    def __init__(
        self,
        model_axis: str | tuple[str, ...] | None,
        sequence_parallel: bool,
        expert_axis: str | tuple[str, ...] | None = None,
        gathers: dict[str, tuple[tuple[int, tuple[str, ...]], ...]] | None = None,
        *,
        vocab_split: bool = False,
        fold_experts: bool = False,
    ) -> None:
        self.axis = model_axis
        self.sequence_parallel = sequence_parallel
        self.expert_axis = expert_axis
        self._gathered = gathers or {}
        self.vocab_split = vocab_split and model_axis is not None
        self.fold_experts = fold_experts

    def embed(self, table: Any, tokens: Any) -> Any:
        if not self.vocab_split:
            return super().embed(table, tokens)
        rows = table.shape[0]  # this device's slice of the vocabulary
        local = tokens - jax.lax.axis_index(self.axis) * rows
        mine = (local >= 0) & (local < rows)
        x = jnp.take(table, jnp.where(mine, local, 0), axis=0)
        x = jnp.where(mine[..., None], x, jnp.zeros((), x.dtype))
        if not self.sequence_parallel:
            return jax.lax.psum(x, self.axis)
        return jax.lax.psum_scatter(x, self.axis, scatter_dimension=1, tiled=True)

    def logits_input(self, x: Any) -> Any:
        if not (self.vocab_split and self.sequence_parallel):
            return x
        return jax.lax.all_gather(x, self.axis, axis=1, tiled=True)

    def weight(self, name: str, w: Any) -> Any:
        for dim, axes in self._gathered.get(name, ()):
            w = jax.lax.all_gather(w, axes, axis=dim, tiled=True)
        return w

    def enter(self, scope: str, h: Any) -> Any:

        if not self.sequence_parallel or self.axis is None:
            return h
        return jax.lax.all_gather(h, self.axis, axis=1, tiled=True)

    def exit(self, scope: str, y: Any) -> Any:

        if self.axis is None:
            return y
        if not self.sequence_parallel:
            return jax.lax.psum(y, self.axis)
        return jax.lax.psum_scatter(y, self.axis, scatter_dimension=1, tiled=True)

    def routed_experts(
        self, tokens: Any, router: Any, w_in: Any, w_down: Any, config: ModelConfig, groups: int
    ) -> Any:
        assert self.expert_axis is not None and config.capacity_factor is not None
        # folded, each expert is whole: nothing to sum over the model axis; under sequence
        # parallelism unfolded, the slots are gathered over it and the sums scattered back
        gather = self.sequence_parallel and not self.fold_experts
        axis = None if self.fold_experts or gather else self.axis
        assert not isinstance(self.axis, tuple)

        def reduce(y: Any) -> Any:
            return jax.lax.psum(y, axis)

        return moe_capacity_local(
            tokens,
            router,
            w_in,
            w_down,
            config.top_k,
            config.capacity_factor,
            self.expert_axis,
            groups=groups,
            reduce=None if axis is None else reduce,
            once=config.dispatch_once,
            gather_axis=self.axis if gather else None,
            weight_activations=config.weight_activations,
            group_limit=config.group_limit,
        )


@dataclass(frozen=True)
class Program:
    """A compiled-on-demand program of one strategy, mode and implementation."""

    placement: Placement
    mode: str
    impl: str
    capture: bool
    fn: jax.stages.Wrapped
    arg_shardings: tuple[Any, ...]
    microbatches: int = 1

    @property
    def name(self) -> str:
        suffix = "" if self.placement.constraints else ", no activation constraints"
        return f"{self.placement.name} ({self.impl}, {self.mode}{suffix})"

    @property
    def config(self) -> ModelConfig:
        return self.placement.config

    @property
    def mesh(self) -> Any:
        return self.placement.mesh

    def abstract_args(self) -> tuple[Any, ...]:
        """The arguments as ``jax.ShapeDtypeStruct`` with their shardings: nothing allocated."""

        def attach(sds: Any, sharding: Any) -> Any:
            return jax.ShapeDtypeStruct(sds.shape, sds.dtype, sharding=sharding)

        return jax.tree.map(attach, self._abstract(), self.arg_shardings)

    def _abstract(self) -> tuple[Any, ...]:
        params = abstract_params(self.config)
        inputs, targets = abstract_batch(self.config)
        return (params, inputs) if self.mode == Mode.FORWARD else (params, (inputs, targets))

    def example_args(self, seed: int = 0) -> tuple[Any, ...]:
        """Random arguments, placed with the program's input shardings (from host copies:
        placing an array that sits on one device compiles a slicing program per shape)."""

        params = init_params(self.config, seed)
        inputs, targets = init_batch(self.config, seed + 1)
        args = (params, inputs) if self.mode == Mode.FORWARD else (params, (inputs, targets))
        return jax.device_put(jax.tree.map(np.asarray, args), self.arg_shardings)

    def lower(self) -> Any:
        return self.fn.lower(*self.abstract_args())

    def compile(self) -> Any:
        return self.lower().compile()


def build_reference_program(
    strategy: str | Strategy | Placement,
    config: ModelConfig | None = None,
    mesh: Any = None,
    *,
    mode: str = Mode.FORWARD,
    impl: str = "jit",
    capture: bool = False,
    constraints: bool = True,
    microbatches: int = 1,
    regather: bool = False,
) -> Program:
    """Builds the reference model under ``strategy`` on ``mesh``.

    Args:
        strategy: a built-in name (``"tp"``), a :class:`Strategy`, or a :class:`Placement` of one
            (then ``config``, ``mesh`` and ``constraints`` come from it).
        config: the model; required unless ``strategy`` is a placement.
        mesh: a ``Mesh`` or a description such as ``"data=2,model=4"``.
        mode: ``"forward"`` (``fn(params, inputs)``) or ``"train"`` (``fn(params, (inputs,
            targets)) -> (loss, grads)``; grads come out sharded like the parameters).
        impl: ``"jit"`` or ``"shard_map"`` (only for strategies with a twin).
        capture: forward also returns every layer's attention and MLP outputs (numerics).
        constraints: keep the strategy's activation sharding constraints (jit only).
        microbatches: train mode, jit: split each data shard's sequences into this many
            micro-batches, run them one after another (``lax.scan``) and accumulate the
            gradients, stored as the strategy stores gradients (ZeRO-2: data-sharded);
            gradients replicated over data or context shards (under sequence parallelism,
            the model shards' partial gradients of the norms' gains and the embeddings) and
            the loss are accumulated on each shard and summed over them once, after the last
            micro-batch (:func:`accumulated_roles`).
        regather: train mode, jit: weights gathered at use (FSDP) are gathered again for the
            backward instead of kept (PyTorch FSDP's ``reshard_after_forward``, ZeRO-3: every
            layer's gathered weights never live at once); the default keeps them, the least
            communication (the bound's).

    A strategy whose optimizer state is sharded finer than its parameters (ZeRO-1, ZeRO-2)
    returns ``(loss, new_params)`` in train mode: each device takes a plain gradient step on
    its shard (Adam's element-wise arithmetic moves no data between devices either) and the
    new parameters are gathered back to the parameters' sharding.

    >>> import shardscope
    >>> prog = build_reference_program("tp", ModelConfig(layers=1), "model=8")
    >>> shardscope.audit(prog).counts()["all-reduce"]  # out-projection and MLP-down
    2
    """

    Mode.parse(mode, what="mode", error=StrategyError)
    if impl not in IMPLS:
        raise StrategyError(f"impl {impl!r} is not one of {', '.join(IMPLS)}")
    if isinstance(strategy, Placement):
        placement = strategy
    else:
        if config is None or mesh is None:
            raise StrategyError(
                "build_reference_program needs a model config and a mesh with a strategy that is "
                "not placed yet; pass config=ModelConfig(...) and mesh='model=8' (or a placement: "
                "strategy.place(config, mesh))"
            )
        placement = get_strategy(strategy).place(config, mesh, constraints=constraints)
    if impl == "shard_map" and not placement.strategy.twin:
        twins = ", ".join(s for s in _twins())
        raise StrategyError(
            f"strategy {placement.name!r} has no shard_map version; use impl='jit', or one of "
            f"the strategies with explicit collectives: {twins}"
        )
    if impl == "shard_map" and placement.config.is_moe != placement.strategy.expert_parallel:
        which = (
            ", ".join(n for n, s in STRATEGIES.items() if s.twin and s.expert_parallel)
            if placement.config.is_moe
            else ", ".join(n for n, s in STRATEGIES.items() if s.twin and not s.expert_parallel)
        )
        what = "a mixture of experts" if placement.config.is_moe else "a dense model"
        raise StrategyError(
            f"the shard_map twin of strategy {placement.name!r} does not place {what}; use "
            f"impl='jit', or the twin of {which}"
        )
    if impl == "shard_map" and twin_needs_capacity(placement):
        raise StrategyError(
            "the shard_map twins of expert parallelism dispatch by capacity; set "
            "capacity_factor (1.0 drops nothing under balanced routing), or use impl='jit'"
        )
    if capture and mode != Mode.FORWARD:
        raise StrategyError("capture=True needs mode='forward' (it returns sublayer outputs)")
    _check_microbatches(placement, mode, impl, microbatches)
    _check_dropless(placement, mode, impl, microbatches)

    config = placement.config
    params_sh = jax.tree.map(placement.sharding, placement.param_specs())
    in_spec, target_spec = placement.batch_specs()
    out_sh = placement.sharding(placement.output_spec())
    if mode == Mode.FORWARD:
        arg_sh: tuple[Any, ...] = (params_sh, placement.sharding(in_spec))
    else:
        arg_sh = (params_sh, (placement.sharding(in_spec), placement.sharding(target_spec)))

    run: Callable[..., Any]
    if impl == "jit":
        hooks = JitHooks(placement, regather=regather)

        if mode == Mode.FORWARD:

            def run_forward(params: Any, inputs: Any) -> Any:
                return forward(params, inputs, config, hooks, capture=capture)

            run = run_forward
        else:

            def objective(params: Any, batch: Any) -> Any:
                return loss(params, batch, config, hooks)

            hook_type = ContextShardHooks if local_context(placement) else JitHooks
            shard_hooks = hook_type(
                _per_shard(placement, mapped_roles(placement)),
                regather=regather,
                copies=sequence_copies(placement, microbatches),
            )

            def shard_objective(params: Any, batch: Any) -> Any:
                out = forward(params, batch[0], config, shard_hooks)
                per_token = token_losses(out, batch[1], config)
                return jnp.mean(per_token), _loss_parts(placement, per_token, microbatches)

            run = _train_step(placement, objective, microbatches, shard_objective)
    else:
        local = _shard_map_forward(placement, capture)
        if mode == Mode.FORWARD:
            run = local
        else:

            def run_train(params: Any, batch: Any) -> Any:
                def objective(p: Any) -> Any:
                    return loss_from_output(local(p, batch[0]), batch[1], config)

                return jax.value_and_grad(objective)(params)

            run = run_train

    if capture:
        out_shardings: Any = None
    elif mode == Mode.FORWARD:
        out_shardings = out_sh
    elif placement.strategy.updates_shards:
        out_shardings = (placement.sharding(placement.spec(())), params_sh)
    else:
        grads_sh = jax.tree.map(placement.sharding, placement.grad_specs())
        out_shardings = (placement.sharding(placement.spec(())), grads_sh)
    jitted = jax.jit(run, in_shardings=arg_sh, out_shardings=out_shardings)
    return Program(placement, mode, impl, capture, jitted, arg_sh, microbatches)


#: The step size of the sharded update (its value changes no communication).
UPDATE_STEP = 1e-3


def _check_microbatches(bound: Placement, mode: str, impl: str, microbatches: int) -> None:
    if not is_int(microbatches, 1):
        raise StrategyError(f"microbatches={microbatches!r}: must be a positive integer")
    if microbatches == 1:
        return
    if mode != Mode.TRAIN or impl != "jit":
        raise StrategyError(
            f"microbatches={microbatches} needs mode='train' and impl='jit' (gradient "
            f"accumulation); use microbatches=1 here"
        )
    data = bound.role_size(bound.strategy.batch_entry)
    batch = bound.config.batch
    if batch % (data * microbatches):
        fits = [m for m in range(1, batch // data + 1) if (batch // data) % m == 0]
        raise StrategyError(
            f"batch={batch} over {data} data shard(s) gives {batch / data:g} sequences per "
            f"shard, which {microbatches} micro-batches do not divide; choose microbatches "
            f"from {', '.join(map(str, fits[:12]))}"
            + (" (the batch must divide by the data axes)" if batch % data else "")
        )


def twin_needs_capacity(placement: Placement) -> bool:
    """Whether ``placement``'s shard_map twin cannot be built for its model: a dropless
    mixture of experts (``capacity_factor`` None), where the expert-parallel twins dispatch
    by capacity."""
    return placement.config.is_moe and placement.config.capacity_factor is None


def _check_dropless(bound: Placement, mode: str, impl: str, microbatches: int) -> None:
    """A dropless mixture of experts (``jax.lax.ragged_dot``) cannot run in a train step
    mapped over the data shards (:func:`_local_accumulation`): JAX has no batching rule for
    it there. Under plain jit it compiles, but its routing sorts the whole batch's
    assignments at once and the partitioner sends every slot to every device (the dispatch
    and combine all-reduces of all ``tokens x top_k`` rows, measured on XLA's CPU and H100
    compilers): capacity-padded dispatch is what moves each token to its experts alone."""
    c = bound.config
    if not c.is_moe or c.capacity_factor is not None or mode != Mode.TRAIN or impl != "jit":
        return
    if (microbatches > 1 and accumulates_locally(bound)) or reduces_in_two_steps(bound):
        raise StrategyError(
            f"strategy {bound.name!r} maps its train step over the data shards "
            f"({', '.join(local_roles(bound))}) to reduce the gradients once, and a dropless "
            f"mixture of experts (capacity_factor=None: jax.lax.ragged_dot) cannot be mapped "
            f"so; set capacity_factor (1.0 drops nothing under balanced routing, 1.25 is "
            f"MaxText's), or use microbatches=1 with a strategy whose gradients are sharded "
            f"(fsdp, fsdp_ep)"
        )


def _per_shard(placement: Placement, mapped: tuple[str, ...]) -> Placement:
    """``placement`` as one shard's program sees it: the activations no longer split over
    the ``mapped`` roles (the shards are mapped over them instead)."""
    s = placement.strategy

    def drop(entry: Entry) -> Entry:
        kept = tuple(r for r in entry_roles(entry) if r not in mapped)
        return None if not kept else kept[0] if len(kept) == 1 else kept

    acts = {point: tuple(drop(r) for r in roles) for point, roles in s.activation_rules().items()}
    local = replace(s, activations=tuple(acts.items()))
    return Placement(local, placement.config, placement.mesh, placement.axes, placement.constraints)


def local_roles(placement: Placement) -> tuple[str, ...]:
    """The batch's roles over which the gradients are replicated, so that each shard can add
    up its own micro-batches' gradients and reduce them once per step: DP, ZeRO-1 and their
    tensor-parallel forms ``("data",)``, HSDP ``("replica",)`` (its gradients are sharded
    over ``data``, replicated over ``replica``); FSDP and ZeRO-2 none."""
    s = placement.strategy
    return tuple(
        r for r in s.batch_roles if not any(uses_role(g, r) for g in s.grad_rules().values())
    )


def dense_local_roles(placement: Placement) -> tuple[str, ...]:
    """The batch's roles over which a mixture's dense weights' gradients (all but the routed
    experts') are replicated: :func:`local_roles`, which leaves out ``expert`` because the
    routed experts' gradients are split over it, and ``expert`` too where no dense weight's
    gradient is. Each device can add up its own dense gradients over the micro-batches and
    reduce them over these roles once per step, as Megatron-LM's distributed optimizer
    reduce-scatters the dense weights' over its data x expert group once; the routed
    experts' are never reduced over ``expert`` (each expert's gradient is its own device's).
    :func:`local_roles` where the model has no experts."""
    s = placement.strategy
    own = local_roles(placement)
    if not placement.config.is_moe or Role.EXPERT not in s.batch_roles or Role.EXPERT in own:
        return own
    dense = (g for name, g in s.grad_rules().items() if not name.startswith("expert_"))
    if any(uses_role(g, Role.EXPERT) for g in dense):
        return own
    return (*own, Role.EXPERT)


def local_context(placement: Placement) -> tuple[str, ...]:
    """``("context",)`` where the gradients are replicated over the context axis, so that
    each context shard can add up its own partial gradients (those of its part of every
    sequence) over the micro-batches and they are summed over ``context`` once per step, as
    Megatron-LM's distributed optimizer reduces them over its data x context group: context
    parallelism under DP, ZeRO-1 and their tensor-parallel forms; ``()`` where the gradients
    are sharded over ``context`` (FSDP, HSDP, ZeRO-2: reduce-scattered as the backward makes
    them), without context parallelism, and for a mixture of experts (it routes each whole
    sequence as one group, which its context shards would route apart)."""
    s = placement.strategy
    if not s.context_parallel or placement.config.is_moe:
        return ()
    if any(uses_role(g, Role.CONTEXT) for g in s.grad_rules().values()):
        return ()
    return (Role.CONTEXT,)


def local_sequence(placement: Placement) -> tuple[str, ...]:
    """``("model",)`` under sequence parallelism, where each model shard holds part of every
    sequence between the sublayers, so that the weights used there unsplit over ``model``
    (:func:`sequence_copies`: the norms' gains, the embedding and the unembedding unless the
    vocabulary is split) get partial gradients on each shard, and the loss a partial sum:
    each model shard adds up its own over the micro-batches and they are summed over
    ``model`` once per step, as Megatron-LM's ``finalize_model_grads`` all-reduces the
    sequence-parallel norms' gradients over the tensor-parallel group once (its
    ``_allreduce_layernorm_grads``); ``()`` otherwise, and for a mixture of experts (its
    router sees the sequence shards too)."""
    s = placement.strategy
    if not s.sequence_parallel or placement.config.is_moe:
        return ()
    return (Role.MODEL,)


#: The weights used on the residual stream, which sequence parallelism splits along the
#: sequence over ``model``: the norms before each sublayer and before the output layer, the
#: embedding and the unembedding. (A latent attention's norms and down-projections see the
#: sequence gathered.)
_ON_THE_SEQUENCE = ("attn_norm", "mlp_norm", "final_norm", "embed", "unembed")


def sequence_copies(placement: Placement, microbatches: int = 2) -> tuple[str, ...]:
    """The weights whose gradients the reference train step with ``microbatches`` adds up
    per model shard (:func:`local_sequence`, :class:`JitHooks`' ``copies``): those of
    :data:`_ON_THE_SEQUENCE` the model has and uses unsplit over ``model``; none with one
    micro-batch (a step then sums each gradient once anyway)."""
    if microbatches == 1 or not local_sequence(placement):
        return ()
    use = placement.strategy.use_rules() or placement.strategy.param_rules()
    shapes = param_shapes(placement.config)
    return tuple(n for n in _ON_THE_SEQUENCE if n in shapes and not uses_role(use[n], Role.MODEL))


def mapped_roles(placement: Placement) -> tuple[str, ...]:
    """The roles the reference train step with micro-batches maps its objective over (a
    ``vmap`` or a ``shard_map`` a shard), each shard's gradients its own: :func:`local_roles`
    and :func:`local_context`."""
    return local_roles(placement) + local_context(placement)


def accumulated_roles(placement: Placement) -> tuple[str, ...]:
    """The roles over which the reference train step with micro-batches has each device
    accumulate its own partial gradients (and loss), summed over them once per step: those
    it maps its objective over (:func:`mapped_roles`) and, under sequence parallelism,
    ``model`` for the weights of :func:`sequence_copies` (:func:`local_sequence`)."""
    return mapped_roles(placement) + local_sequence(placement)


def _loss_parted(placement: Placement, microbatches: int) -> bool:
    """Whether each model shard adds up its own part of the loss (:func:`_loss_parts`):
    where it adds up its own gradients (:func:`sequence_copies`) and scores its own tokens
    (the vocabulary split scores every token on each shard)."""
    return bool(sequence_copies(placement, microbatches)) and not placement.strategy.vocab_split


def _loss_parts(placement: Placement, per_token: Any, microbatches: int) -> Any:
    """The mean of ``per_token`` (``[batch, seq]``, one shard's) as its model shards'
    partial sums ``[model]`` where each holds part of the sequence and adds up its own
    (:func:`_loss_parted`), else the mean."""
    if not _loss_parted(placement, microbatches):
        return jnp.mean(per_token)
    b, seq = per_token.shape
    t = placement.role_size(Role.MODEL)
    return per_token.reshape(b, t, seq // t).sum(axis=(0, 2)) / per_token.size


def accumulates_locally(placement: Placement) -> bool:
    """Whether the reference train step accumulates each shard's gradients locally over the
    micro-batches and sums them over :func:`accumulated_roles` once per step, as Megatron-LM,
    DeepSpeed and PyTorch DDP's ``no_sync`` do for replicated gradients (DP, ZeRO-1; under
    context parallelism each context shard's partial gradients too, reduced over data x
    context once, as Megatron-LM's distributed optimizer does), and PyTorch FSDP2's
    ``set_requires_all_reduce(False)`` for HSDP: each micro-batch's gradients are still
    reduce-scattered over ``data`` (FSDP, ZeRO-2 and HSDP's inner axis: a gradient stored
    sharded is reduced as the backward makes it), and HSDP's shards are all-reduced over
    ``replica`` once."""
    return bool(accumulated_roles(placement))


def reduces_in_two_steps(placement: Placement) -> bool:
    """Whether the gradients are sharded over some of the batch's roles and replicated over
    the others (HSDP), so that the train step maps its objective over the replicated ones
    (:func:`local_roles`) even without micro-batches: each replica's gradients are reduced
    over the sharded roles first (reduce-scattered over ``data``) and only the shards left
    are summed over the replicas (an all-reduce over ``replica`` of ``1/data`` of them), as
    PyTorch FSDP's ``HYBRID_SHARD`` reduces them. One sum of the whole gradient over both
    makes XLA all-reduce all of it over every device and slice it."""
    roles = local_roles(placement)
    # the expert axis splits the experts' gradients because the all-to-alls took every
    # token to its expert, not to be summed in two steps: one sum over every axis does
    tokens = tuple(r for r in placement.strategy.batch_roles if r != Role.EXPERT)
    return bool(roles) and roles != tokens


def _train_step(
    bound: Placement,
    objective: Callable[[Any, Any], Any],
    microbatches: int,
    shard_objective: Callable[[Any, Any], Any] | None = None,
) -> Callable[[Any, Any], Any]:
    """``(params, batch) -> (loss, grads)``, or ``(loss, new_params)`` for ZeRO-1/-2.

    With micro-batches, a strategy whose gradients are replicated over some of the batch's
    axes or over the context axis, or partial over the model axis under sequence parallelism
    (:func:`accumulates_locally`), maps ``shard_objective`` over those shards: each device
    adds up its own shard's gradients (under context parallelism, those of its part of each
    sequence; under sequence parallelism, those of the weights of :func:`sequence_copies`
    from its part of each sequence) and loss, unreduced over them, and they are summed over
    those axes once, after the last micro-batch. (Accumulating the summed gradient instead
    makes the compiler all-reduce every micro-batch's.)"""

    wsc = jax.lax.with_sharding_constraint
    grad_sh = jax.tree.map(bound.sharding, bound.grad_specs())
    in_spec, target_spec = bound.batch_specs()
    m = microbatches
    if shard_objective is not None and (
        (m > 1 and accumulates_locally(bound)) or reduces_in_two_steps(bound)
    ):
        return _local_accumulation(bound, shard_objective, m)

    def split(x: Any) -> Any:
        # [B, ...] -> [m, B/m, ...]: micro-batch i holds sequences i, i + m, ... of every
        # shard, so each data shard splits its own sequences and nothing moves.
        x = x.reshape(x.shape[0] // m, m, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    def accumulate(params: Any, batch: Any) -> Any:
        if m == 1:
            value, grads = jax.value_and_grad(objective)(params, batch)
            return value, grads
        inputs = split(batch[0])
        targets = split(batch[1])

        def step(carry: Any, mb: Any) -> Any:
            total, acc = carry
            x = wsc(mb[0], bound.sharding(in_spec))
            y = wsc(mb[1], bound.sharding(target_spec))
            value, grads = jax.value_and_grad(objective)(params, (x, y))
            acc = jax.tree.map(lambda a, g: a + g, acc, grads)
            return (total + value, wsc(acc, grad_sh)), None

        zeros = wsc(jax.tree.map(jnp.zeros_like, params), grad_sh)
        (total, acc), _ = jax.lax.scan(step, (jnp.float32(0.0), zeros), (inputs, targets))
        return total / m, jax.tree.map(lambda g: g / m, acc)

    if not bound.strategy.updates_shards:
        return accumulate
    return _sharded_update(bound, accumulate)


def _sharded_update(
    bound: Placement, accumulate: Callable[[Any, Any], Any]
) -> Callable[[Any, Any], Any]:
    """ZeRO-1/-2's step after ``accumulate``: each device updates its shard of the
    parameters, and the new parameters are gathered back to their sharding."""
    wsc = jax.lax.with_sharding_constraint
    opt_sh = jax.tree.map(bound.sharding, bound.optimizer_specs())
    params_sh = jax.tree.map(bound.sharding, bound.param_specs())

    def run(params: Any, batch: Any) -> Any:
        value, grads = accumulate(params, batch)
        shard = jax.tree.map(
            lambda p, g, s: wsc(p, s) - jnp.asarray(UPDATE_STEP, p.dtype) * wsc(g, s),
            params,
            grads,
            opt_sh,
        )
        return value, wsc(shard, params_sh)

    return run


def _local_accumulation(
    bound: Placement, shard_objective: Callable[[Any, Any], Any], m: int
) -> Callable[[Any, Any], Any]:
    """The train step of :func:`_train_step` that accumulates per shard of
    :func:`local_roles` (the data shards; HSDP's replicas), of :func:`local_context` (the
    context shards: ``shard_objective``, with :class:`ContextShardHooks`, mapped over each
    one's part of every sequence, named :data:`CONTEXT_SHARDS`) and of
    :func:`local_sequence` (the model shards, for the weights of :func:`sequence_copies`:
    ``shard_objective`` takes one copy of each per model shard, and its hooks give each
    shard's part of the sequence its own). ``shard_objective`` returns ``(loss, parts)``:
    ``parts`` the loss's, summed over the shards with the gradients, once."""
    wsc = jax.lax.with_sharding_constraint
    roles = local_roles(bound)
    data = bound.entry(roles)
    d = bound.role_size(roles)
    # The batch's other roles (HSDP's 'data') still split each shard's sequences.
    inner = bound.entry(tuple(r for r in bound.strategy.batch_roles if r not in roles))
    cp = local_context(bound)
    context, c = bound.entry(cp), bound.role_size(cp)
    mapped = bool(mapped_roles(bound))
    # Each partial gradient's leading axes: one per data shard [d, ...], and one per context
    # shard [d, c, ...], over their mesh axes.
    shards = (data, context) if cp else (data,) if mapped else ()
    lead = (d, c) if cp else (d,) if mapped else ()
    copies = sequence_copies(bound, m)
    sp = local_sequence(bound)
    model, t = bound.entry(sp), bound.role_size(sp)
    # the loss of each shard, and of each of its model shards where they add up their own
    loss_parts = (t,) if _loss_parted(bound, m) else ()
    loss_sh = bound.sharding(PartitionSpec(*shards, *(model for _ in loss_parts)))

    def copied(path: Any) -> int | None:
        # the axis of a weight's copies (after the layers'), or None for a weight not copied
        name = path[-1].key
        return None if name not in copies else len(path) - 1

    def with_copies(path: Any, spec: Any) -> Any:
        axis = copied(path)
        return spec if axis is None else PartitionSpec(*spec[:axis], model, *spec[axis:])

    grad_specs = bound.grad_specs()
    grad_sh = jax.tree.map(bound.sharding, grad_specs)
    partial_sh = jax.tree_util.tree_map_with_path(
        lambda path, s: bound.sharding(PartitionSpec(*shards, *with_copies(path, s))), grad_specs
    )
    param_specs = bound.param_specs()
    copies_sh = jax.tree_util.tree_map_with_path(
        lambda path, s: bound.sharding(with_copies(path, s)), param_specs
    )

    def by_shard(x: Any) -> Any:
        # [B, ...] -> [m, d, B/(m d), ...]: micro-batch i of shard j holds that shard's own
        # sequences (as the plain accumulation splits them), so nothing moves.
        x = x.reshape(d, x.shape[0] // (d * m), m, *x.shape[1:])
        x = jnp.moveaxis(x, 2, 0)
        if not mapped:
            return wsc(x[:, 0], bound.sharding(PartitionSpec(None, inner)))
        if not cp:
            return wsc(x, bound.sharding(PartitionSpec(None, data, inner)))
        # -> [m, d, c, B/(m d), S/c, ...]: context shard k holds the k-th part of each
        # sequence (split over 'model' in turn under sequence parallelism), as it is placed.
        x = x.reshape(*x.shape[:3], c, x.shape[3] // c, *x.shape[4:])
        x = jnp.moveaxis(x, 3, 2)
        seq = _per_shard(bound, mapped_roles(bound)).batch_specs()[0][1]
        return wsc(x, bound.sharding(PartitionSpec(None, data, context, inner, seq)))

    def copy(path: Any, p: Any) -> Any:
        axis = copied(path)
        if axis is None:
            return p
        return jnp.broadcast_to(jnp.expand_dims(p, axis), (*p.shape[:axis], t, *p.shape[axis:]))

    def run(params: Any, batch: Any) -> Any:
        params = wsc(jax.tree_util.tree_map_with_path(copy, params), copies_sh)

        def one(params: Any, batch: Any) -> Any:
            (_, parts), grads = jax.value_and_grad(shard_objective, has_aux=True)(params, batch)
            return parts, grads

        if cp and bound.strategy.context_ring:
            per_shard = _over_shards(bound, one, (data, context))
        else:
            if cp:
                one = jax.vmap(
                    one, in_axes=(None, 0), spmd_axis_name=context, axis_name=CONTEXT_SHARDS
                )
            per_shard = jax.vmap(one, in_axes=(None, 0), spmd_axis_name=data) if mapped else one

        def step(carry: Any, mb: Any) -> Any:
            total, acc = carry
            parts, grads = per_shard(params, mb)
            acc = jax.tree.map(lambda a, g: a + g, acc, grads)
            return (wsc(total + parts, loss_sh), wsc(acc, partial_sh)), None

        zeros = jax.tree.map(lambda p: jnp.zeros((*lead, *p.shape), p.dtype), params)
        zeros = wsc(zeros, partial_sh)
        inputs, targets = by_shard(batch[0]), by_shard(batch[1])
        start = wsc(jnp.zeros((*lead, *loss_parts), jnp.float32), loss_sh)
        (total, acc), _ = jax.lax.scan(step, (start, zeros), (inputs, targets))
        n = d * c * m

        def reduce(path: Any, g: Any) -> Any:
            # Summed at the gradients' own dtype: jnp.sum computes a 16-bit sum in float32,
            # and the compiler then all-reduces float32, twice the bytes (seen on XLA:GPU).
            for _ in lead:
                g = _sum_axis(g)
            axis = copied(path)
            if axis is not None:
                g = _sum_axis(g, axis)
            return g / jnp.asarray(n, g.dtype)

        grads = jax.tree_util.tree_map_with_path(reduce, acc)
        return jnp.sum(total) / n, wsc(grads, grad_sh)

    if not bound.strategy.updates_shards:
        return run
    return _sharded_update(bound, run)


def _over_shards(
    bound: Placement, one: Callable[[Any, Any], Any], entries: tuple[Any, ...]
) -> Callable[[Any, Any], Any]:
    """``one`` (``(params, batch) -> (loss, grads)`` of one data and context shard) mapped
    over the shards of the mesh axes of ``entries`` (data's, context's) as the two ``vmap`` of
    :func:`_local_accumulation` map it, the batch's and the results' leading axes one per
    entry, by a ``shard_map`` manual over those axes (the rest left to the compiler): the
    ring's ``ppermute`` over the context axis then compiles to collective-permutes, where
    over a ``vmap``'s axis it is a permutation of an array's dimension, which the compiler
    partitions into all-gathers."""
    lead = PartitionSpec(*entries)
    n = len(entries)

    def body(params: Any, batch: Any) -> Any:
        value, grads = one(params, jax.tree.map(lambda x: x.reshape(x.shape[n:]), batch))
        ones = (1,) * n
        return jax.tree.map(lambda x: x.reshape(*ones, *x.shape), (value, grads))

    return jax.shard_map(
        body,
        mesh=bound.mesh,
        in_specs=(PartitionSpec(), lead),
        out_specs=(lead, lead),
        axis_names={a for e in entries if e is not None for a in _names(e)},
        # each shard's gradients its own, unreduced (as under the vmap): checking would
        # mark the replicated parameters as varying, and their gradients summed over the
        # shards inside the map
        check_vma=False,
    )


def _sum_axis(x: Any, axis: int = 0) -> Any:
    """``x`` summed over its axis ``axis`` in its own dtype."""
    return jax.lax.reduce(x, jnp.zeros((), x.dtype), jax.lax.add, (axis,))


def _gathers_at_use(placement: Placement) -> dict[str, tuple[tuple[int, tuple[str, ...]], ...]]:
    """Per weight (one layer's, without the stacked axis), each dimension stored sharded over
    mesh axes it is not sharded over where used, and those axes (FSDP's gathers)."""
    use = placement.strategy.use_rules()
    if use is None:
        return {}
    out = {}
    for name, stored in placement.strategy.param_rules().items():
        dims = []
        for dim, (kept, used) in enumerate(zip(stored, use[name], strict=True)):
            have, want = placement.entry_axes(kept), placement.entry_axes(used)
            gathered = tuple(a for a in have if a not in want)
            if gathered and have[: len(want)] != want:
                raise StrategyError(
                    f"strategy {placement.name!r} stores {name} dimension {dim} over "
                    f"{have} and uses it over {want}: its shard_map twin gathers only the "
                    f"trailing axes of a dimension; give it impl='jit'"
                )
            if gathered:
                dims.append((dim, gathered))
        if dims:
            out[name] = tuple(dims)
    return out


def _twins() -> list[str]:

    return [name for name, s in STRATEGIES.items() if s.twin]


def _shard_map_forward(placement: Placement, capture: bool) -> Callable[..., Any]:

    config = placement.config
    model = placement.entry(Role.MODEL) if Role.MODEL in placement.strategy.roles else None
    # the expert axis, or folded the expert and the model axes together
    expert = placement.entry(placement.strategy.expert_entry)
    hooks = ShardMapHooks(
        model,
        placement.strategy.sequence_parallel,
        expert,
        _gathers_at_use(placement),
        vocab_split=placement.strategy.vocab_split,
        fold_experts=placement.strategy.expert_fold,
    )
    in_spec, _ = placement.batch_specs()
    out_spec = placement.output_spec()
    if capture:
        residual = placement.spec(placement.strategy.activation_rules()["residual"])
        stacked = PartitionSpec(None, *residual)
        out_specs: Any = (out_spec, {"attention": stacked, "mlp": stacked})
    else:
        out_specs = out_spec

    def body(params: Any, inputs: Any) -> Any:
        return forward(params, inputs, config, hooks, capture=capture)

    return jax.shard_map(
        body,
        mesh=placement.mesh,
        in_specs=(placement.param_specs(), in_spec),
        out_specs=out_specs,
    )


# -- one sharded matmul ------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulProgram:
    """``C = A @ B`` under jit with the problem's specs, optionally forced to a schedule."""

    label: str
    problem: Any
    mesh: Any
    fn: jax.stages.Wrapped
    code: str

    def abstract_args(self) -> tuple[Any, Any]:

        p = self.problem
        dtype = jnp.dtype(p.dtype)
        return (
            jax.ShapeDtypeStruct(
                (p.m, p.k), dtype, sharding=NamedSharding(self.mesh, PartitionSpec(*p.a_spec))
            ),
            jax.ShapeDtypeStruct(
                (p.k, p.n), dtype, sharding=NamedSharding(self.mesh, PartitionSpec(*p.b_spec))
            ),
        )

    def lower(self) -> Any:
        return self.fn.lower(*self.abstract_args())


def build_matmul(
    problem: Any, mesh: Any, schedule: Any = None, *, explicit: bool = False
) -> MatmulProgram:
    """The matmul of ``problem`` (a :class:`~shardscope._src.bounds.matmul.MatmulProblem`) on
    ``mesh``.

    Without ``schedule``: the compiler chooses (the program a user writes). With a
    :class:`~shardscope._src.bounds.matmul.MatmulSchedule`: sharding constraints put A, B and
    the product in the schedule's layouts (``explicit=False``), or a ``shard_map`` computes the
    local product and reduces partial sums with ``psum`` / ``psum_scatter`` (``explicit=True``);
    the output sharding then moves the result to the problem's output spec.
    """

    def sharding(spec: Any) -> Any:
        return NamedSharding(mesh, PartitionSpec(*spec))

    in_sh = (sharding(problem.a_spec), sharding(problem.b_spec))
    out_sh = sharding(problem.out_spec)
    if schedule is None:

        def run(a: Any, b: Any) -> Any:
            return a @ b

        return MatmulProgram(
            "as written",
            problem,
            mesh,
            jax.jit(run, in_shardings=in_sh, out_shardings=out_sh),
            "a @ b",
        )

    a_spec, b_spec = schedule.layout("a"), schedule.layout("b")
    if not explicit:
        split_k = any(p.partition == "k" for p in schedule.axes)
        c_spec = None if split_k else schedule.layout("product")
        wsc = jax.lax.with_sharding_constraint

        def run(a: Any, b: Any) -> Any:
            c = wsc(a, sharding(a_spec)) @ wsc(b, sharding(b_spec))
            return c if c_spec is None else wsc(c, sharding(c_spec))

        # Runnable as printed inside the jitted function, given the mesh (Auto axes, as
        # shardscope.make_mesh builds them).
        def named(spec: Any) -> str:
            return f"NamedSharding(mesh, {format_spec(spec)})"

        code = (
            "wsc = jax.lax.with_sharding_constraint; "
            f"c = wsc(a, {named(a_spec)}) @ wsc(b, {named(b_spec)})"
            + ("" if c_spec is None else f"; c = wsc(c, {named(c_spec)})")
        )
        return MatmulProgram(
            "sharding constraints",
            problem,
            mesh,
            jax.jit(run, in_shardings=in_sh, out_shardings=out_sh),
            code,
        )

    # shard_map: the product's spec gains each contraction axis where the output wants it.
    product = list(schedule.layout("product"))
    reductions: list[tuple[str, int | None]] = []
    for p in schedule.axes:
        if p.partition != "k":
            continue
        dim = problem.where("c", p.axis)
        index = None if dim is None else ("m", "n").index(dim)
        if index is not None and product[index] is not None:
            raise ValueError(f"axis {p.axis} cannot scatter onto a dimension already sharded")
        if index is not None:
            product[index] = p.axis
        reductions.append((p.axis, index))

    def local(a: Any, b: Any) -> Any:
        c = a @ b
        for axis, index in reductions:
            if index is None:
                c = jax.lax.psum(c, axis)
            else:
                c = jax.lax.psum_scatter(c, axis, scatter_dimension=index, tiled=True)
        return c

    body = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(PartitionSpec(*a_spec), PartitionSpec(*b_spec)),
        out_specs=PartitionSpec(*product),
    )
    steps = "; ".join(
        f"c = {'psum' if i is None else 'psum_scatter'}(c, {axis!r}"
        + ("" if i is None else f", scatter_dimension={i}, tiled=True")
        + ")"
        for axis, i in reductions
    )
    code = (
        f"shard_map(in_specs=({format_spec(a_spec)}, {format_spec(b_spec)}), "
        f"out_specs={format_spec(product)}): c = a @ b" + (f"; {steps}" if steps else "")
    )
    return MatmulProgram(
        "shard_map", problem, mesh, jax.jit(body, in_shardings=in_sh, out_shardings=out_sh), code
    )
