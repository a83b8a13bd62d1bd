"""The verdict's front doors: :func:`matmul_verdict` and :func:`transformer_verdict` build and
compile the program, audit it, compare it with its bound and, when it exceeds the bound, try
the changes that should reach it (sharding constraints, an explicit shard_map), each compiled
(:mod:`~shardscope._src.verdict.hints`); their reports hold the audit, the bound or schedule,
and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardscope._src.audit.compile import audit
from shardscope._src.audit.records import Audit
from shardscope._src.base.notes import Note
from shardscope._src.base.records import json_value, record_dict
from shardscope._src.bounds.matmul import (
    MatmulSchedule,
    best_schedule,
    matmul_problem,
)
from shardscope._src.bounds.terms import Bound, BoundNote
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.check.compare import Hint, Verdict, compare
from shardscope._src.mesh import auto_mesh, first_devices_mesh, format_mesh_spec
from shardscope._src.model.config import Mode, ModelConfig, param_shapes
from shardscope._src.sharding.programs import Program, build_matmul, build_reference_program
from shardscope._src.verdict.hints import (
    duplicated_compute_note,
    matmul_hints,
    no_hint_note,
    transformer_hints,
)

# -- matmul ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulReport:
    """A sharded matmul: its audit, cheapest schedule, and verdict (with verified hints)."""

    audit: Audit
    schedule: MatmulSchedule
    verdict: Verdict

    @property
    def backend(self) -> str | None:
        """The platform its audit's program was compiled for (``Audit.backend``)."""
        return self.audit.backend

    def to_dict(self) -> dict[str, Any]:
        """The audit's JSON with the problem, the cheapest schedule and the verdict."""
        return {
            **self.audit.to_dict(),
            "problem": json_value(self.schedule.problem),
            **record_dict(self, omit=("audit",)),
        }


def matmul_verdict(
    mesh: Any,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: Any,
    b_spec: Any,
    out_spec: Any,
    *,
    hints: bool = True,
) -> MatmulReport:
    """Compiles ``C = A @ B`` with the given specs, audits it, and judges it.

    When the compiled program exceeds the bound (by more than ``TOLERANCE``), the hints are the
    cheapest schedule forced with sharding constraints, the same schedule as an explicit
    shard_map when a reduce-scatter is involved, and, when the cheapest schedule duplicates the
    compute, the cheapest one that does not; each compiled and audited. A hint that duplicates
    the compute says so, with its flops per device: fewer bytes are not free.
    ``mesh``: a ``Mesh``, or a description (``"x=8"``) built of the first devices it holds
    (``"x=4"`` on 8 devices uses 4 of them); one of more devices than JAX has is refused.

    >>> report = matmul_verdict("x=8", 4096, 1024, 1024, "float32", "None,x", "None,None",
    ...                         "None,x")
    >>> round(report.verdict.ratio, 2), report.verdict.hints[0].reaches_bound
    (4.0, True)
    """

    problem = matmul_problem(mesh, m, k, n, dtype, a_spec, b_spec, out_spec)
    described = isinstance(mesh, str | dict)
    mesh_obj = auto_mesh(first_devices_mesh(dict(problem.mesh)) if described else mesh)
    schedule = best_schedule(problem)
    result = audit(build_matmul(problem, mesh_obj).lower())
    bound = schedule.bound()
    verdict = compare(
        result, bound, program_dtype=problem.dtype, label=f"matmul [{m},{k}]x[{k},{n}] {dtype}"
    )
    if hints and not verdict.optimal:
        verdict = verdict.replace(
            hints=matmul_hints(problem, mesh_obj, schedule, bound, verdict.actual_bytes)
        )
    if any(p.duplicated_flops for p in schedule.axes):
        # The byte minimum has every device compute all of C; say so, and where the program
        # stands against the cheapest schedule that keeps the compute split.
        note = duplicated_compute_note(problem, schedule, verdict.actual_bytes)
        verdict = verdict.with_note(note)
    return MatmulReport(result, schedule, verdict)


# -- transformer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerReport:
    """The reference model under a strategy: audit, bound and verdict (with verified hints)."""

    program: Program
    audit: Audit
    bound: Bound
    verdict: Verdict

    @property
    def backend(self) -> str | None:
        """The platform its audit's program was compiled for (``Audit.backend``)."""
        return self.audit.backend

    def to_dict(self) -> dict[str, Any]:
        """The audit's JSON with the program's strategy, config, mode and implementation, the
        bound and the verdict."""
        program = self.program
        return {
            **self.audit.to_dict(),
            "strategy": program.placement.to_dict(),
            "config": program.config.to_dict(),
            "mode": program.mode,
            "impl": program.impl,
            **record_dict(self, omit=("program", "audit")),
        }


def transformer_verdict(
    strategy: Any,
    config: Any,
    mesh: Any,
    *,
    mode: str = Mode.FORWARD,
    impl: str = "jit",
    constraints: bool = True,
    hints: bool = True,
) -> TransformerReport:
    """Compiles the reference model under ``strategy``, audits it and judges it.

    Hints, tried when the program exceeds its bound: the strategy's activation sharding
    constraints (if they were left out), then its shard_map twin with explicit
    ``psum`` / ``all_gather`` / ``psum_scatter`` (if it has one: the expert-parallel twins
    dispatch by capacity, so for a dropless mixture of experts the twin is not tried and a
    note says why). Each is compiled and audited; its traffic is reported whether or not it
    reaches the bound.
    ``mesh``: a ``Mesh``, or a description (``"model=8"``) built of the first devices it holds.
    """

    program = build_reference_program(
        strategy, config, mesh, mode=mode, impl=impl, constraints=constraints
    )
    bound = transformer_bound(program.placement, mode)
    result = audit(program.lower())

    weights = {}
    for name, shape in param_shapes(program.config).items():
        weights[shape] = f"weight {name}{list(shape)}"
        weights.setdefault(shape[1:], f"weight {name}{list(shape[1:])} (one layer)")
    verdict = compare(
        result, bound, program_dtype=program.config.dtype, label=program.name, known_arrays=weights
    )
    found: tuple[Hint, ...] = ()
    if hints and not verdict.optimal:
        found, untried = transformer_hints(program, bound, mode, impl, constraints)
        verdict = verdict.replace(notes=(*verdict.notes, *untried))
        if not found:
            verdict = verdict.with_note(no_hint_note(verdict))
    return TransformerReport(program, result, bound, verdict.replace(hints=found))


# -- mixture of experts --------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEReport:
    """An expert-parallel mixture-of-experts layer: its shape, audit, bound and verdict."""

    shape: dict[str, Any]
    audit: Audit
    bound: Bound
    verdict: Verdict

    @property
    def backend(self) -> str | None:
        """The platform its audit's program was compiled for (``Audit.backend``)."""
        return self.audit.backend

    def to_dict(self) -> dict[str, Any]:
        """The audit's JSON with the layer's shape, the bound and the verdict."""
        return {
            **self.audit.to_dict(),
            "layer": dict(self.shape),
            **record_dict(self, omit=("audit", "shape")),
        }


#: The expert-parallel layer's mesh axis: the tokens and the experts are split over it.
EXPERT_AXIS = "expert"
#: Its optional data-parallel axis: the tokens split over it too, the experts replicated.
DATA_AXIS = "data"


def moe_verdict(
    mesh: Any,
    *,
    tokens: int = 4096,
    d_model: int = 256,
    ff: int = 512,
    experts: int = 8,
    top_k: int = 2,
    capacity_factor: float = 1.0,
    dtype: str = "bfloat16",
    mode: str = Mode.FORWARD,
    target: str | None = None,
    impl: str = "jit",
    dispatch_once: bool = False,
    weight_activations: bool = False,
) -> MoEReport:
    """Compiles one expert-parallel MoE layer (SwiGLU experts, capacity-padded dispatch in
    GShard's groups, :func:`~shardscope._src.model.moe.moe_capacity`), audits it and judges
    it against :func:`~shardscope._src.bounds.moe.moe_layer_terms`: the least top-k routing
    sends, each expert's slots its even share of the tokens (capacity factor 1). A capacity
    factor above 1 pads the slots, and the all-to-alls send the padding: the layer then sends
    up to that factor times the bound, and the bound's note says why. ``mesh`` has the axis
    ``expert``: the tokens and the experts are split over it (``"expert=8"``: made of the
    first devices it holds, or of ``target``'s compile-only devices when given); an axis
    ``data`` splits the tokens further and replicates the experts (``"data=2,expert=4"``:
    expert x data parallelism, whose train step sums the experts' gradients over ``data``).
    ``mode`` ``"train"`` differentiates the layer's input and weights. ``impl``
    ``"shard_map"`` compiles its twin with explicit ``all_to_all`` s
    (:func:`~shardscope._src.model.moe.moe_capacity_local`) instead of jit's constraints.
    ``dispatch_once`` sends each token once to each device of its experts (DeepEP's), judged
    against the bound of that dispatch; ``weight_activations`` sends each slot's router weight
    with it to its expert, which scales its activation by it (Megatron-Core's all-to-all
    dispatcher and grouped experts), judged against the bound that counts the weights.

    Raises:
        ModelConfigError: a shape the mesh does not divide (the tokens or the experts over
            the expert axis), a top-k above the experts, a capacity factor at or below 0.
        MeshSpecError: a mesh without the axis ``expert``.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from shardscope._src.base.errors import MeshSpecError, ModelConfigError
    from shardscope._src.bounds.moe import moe_layer_terms
    from shardscope._src.model.moe import moe_capacity, moe_capacity_local
    from shardscope._src.targets.mesh import target_mesh

    if impl not in ("jit", "shard_map"):
        raise ModelConfigError(f"impl={impl!r}: give 'jit' or 'shard_map'")
    cf = capacity_factor
    if isinstance(cf, bool) or not isinstance(cf, int | float) or not cf > 0:
        # the layer dispatches by capacity alone: it has no dropless form to offer
        raise ModelConfigError(
            f"capacity_factor={cf!r}: each expert's slots over its even share of the tokens, "
            f"a number above 0 (1 pads nothing under balanced routing)",
            param="capacity_factor",
        )

    config = ModelConfig(
        d_model=d_model,
        heads=1,
        ff=ff,
        batch=1,
        seq=tokens,
        dtype=dtype,
        mlp="swiglu",
        experts=experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
    )  # the shape's own checks
    if isinstance(mesh, str | dict):
        mesh = target_mesh(target, mesh, axis_types="auto") if target else first_devices_mesh(mesh)
    mesh = auto_mesh(mesh)
    sizes = dict(mesh.shape)
    if EXPERT_AXIS not in sizes or set(sizes) - {EXPERT_AXIS, DATA_AXIS}:
        raise MeshSpecError(
            f"mesh {format_mesh_spec(sizes)}: the layer splits its tokens and experts over an "
            f"axis {EXPERT_AXIS!r} and may replicate the experts over an axis {DATA_AXIS!r}, "
            f"e.g. mesh 'expert=8' or 'data=2,expert=4'"
        )
    e, dp = sizes[EXPERT_AXIS], sizes.get(DATA_AXIS, 1)
    for what, n, over in (("tokens", tokens, e * dp), ("experts", experts, e)):
        if n % over:
            raise ModelConfigError(
                f"{what}={n} do not split over the {over} devices that share them; choose a "
                f"multiple of {over}"
            )
    # GShard's groups: one per device; each replica's all-to-alls run over the expert axis
    groups: Any = (DATA_AXIS, EXPERT_AXIS) if DATA_AXIS in sizes else EXPERT_AXIS
    rows = DATA_AXIS if DATA_AXIS in sizes else None
    specs = {
        "tokens": PartitionSpec(groups, None, None),
        "slots": PartitionSpec(None, groups, None, None),
        "experts": PartitionSpec(EXPERT_AXIS, rows, None, None),
    }

    def place(name: str, x: Any) -> Any:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, specs[name]))

    def layer(x: Any, router: Any, w_in: Any, w_down: Any) -> Any:
        if impl == "shard_map":
            expert = PartitionSpec(EXPERT_AXIS)
            twin = jax.shard_map(
                lambda x, r, wi, wd: moe_capacity_local(
                    x,
                    r,
                    wi,
                    wd,
                    top_k,
                    capacity_factor,
                    EXPERT_AXIS,
                    once=dispatch_once,
                    weight_activations=weight_activations,
                ),
                mesh=mesh,
                in_specs=(PartitionSpec(groups), PartitionSpec(), expert, expert),
                out_specs=PartitionSpec(groups),
            )
            return twin(x, router, w_in, w_down)
        out, _ = moe_capacity(
            x, router, w_in, w_down, top_k, capacity_factor, groups=e * dp, place=place,
            devices=e if dispatch_once else None, weight_activations=weight_activations,
        )  # fmt: skip
        return out

    def train(x: Any, router: Any, w_in: Any, w_down: Any) -> Any:
        def loss(*a: Any) -> Any:
            return jnp.sum(jnp.square(layer(*a).astype(jnp.float32)))

        return jax.grad(loss, argnums=(0, 1, 2, 3))(x, router, w_in, w_down)

    def sds(shape: tuple[int, ...], spec: Any) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    expert = PartitionSpec(EXPERT_AXIS)
    args = (
        sds((tokens, d_model), PartitionSpec(groups, None)),
        sds((d_model, experts), PartitionSpec()),
        sds((experts, d_model, 2, ff), expert),
        sds((experts, ff, d_model), expert),
    )
    fn = train if mode == Mode.TRAIN else layer
    result = audit(jax.jit(fn).lower(*args))
    terms = moe_layer_terms(
        tokens,
        d_model,
        top_k,
        experts,
        EXPERT_AXIS,
        e,
        config.itemsize,
        # top-k routing's least: each expert's slots its even share; padding beyond it is
        # the program's to answer for (the note says so)
        imbalance=1.0,
        train=mode == Mode.TRAIN,
        data_axis=DATA_AXIS if dp > 1 else None,
        data_devices=dp,
        expert_weight_bytes=experts // e * 3 * d_model * ff * config.itemsize,
        once=dispatch_once,
        weight_activations=weight_activations,
    )
    label = f"moe layer {experts} experts top-{top_k} [{tokens},{d_model}] {dtype}"
    notes = []
    if capacity_factor > 1:
        notes.append(Note(BoundNote.CAPACITY_PADDED, {"capacity_factor": capacity_factor}))
    bound = Bound(label, terms, tuple(notes))
    verdict = compare(result, bound, program_dtype=dtype, label=label)
    shape = dict(
        tokens=tokens,
        d_model=d_model,
        ff=ff,
        experts=experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
        dtype=dtype,
        mode=mode,
        impl=impl,
        mesh=sizes,
    )
    return MoEReport(shape, result, bound, verdict)
