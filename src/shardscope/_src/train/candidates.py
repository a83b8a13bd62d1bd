"""The sweep's candidates, before anything compiles: every strategy on every mesh shape of N
devices with its schedules (micro-batches, recomputation, pipeline stages), each placed on
an abstract mesh and estimated (memory per device, the time model's step), and the few worth
compiling.

1. **Enumerate** candidates: each strategy with each factorization of N over its roles (a 1-D
   mesh ``data=N`` or ``model=N``; a 2-D mesh ``data=d,model=t``, or ``data=d,context=c`` for
   the context-parallel strategies, or ``replica=r,data=d`` for HSDP, with
   ``d, t, c, r >= 2``; more axes would give the same program, because the ``data`` role
   spans every axis the other roles leave). HSDP's ``data`` groups stay inside a node (GPU)
   or a slice (TPU): its gathers and reduce-scatters are the step's largest collectives, and
   only the gradient shards' all-reduce over ``replica`` is meant for the slower network.
2. **Screen** without compiling: a candidate whose dimensions do not divide is skipped
   (the strategy's own :class:`StrategyError` says which), one whose model state (parameters,
   gradients, optimizer state) alone exceeds the device memory is skipped for memory.
   Both need only an abstract mesh, so this runs without any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from shardscope._src.base.collect import collector_paused
from shardscope._src.base.comm import format_bytes, format_memory
from shardscope._src.base.errors import (
    IndivisibleError,
    PlanError,
    ShardscopeError,
    StrategyError,
    is_int,
)
from shardscope._src.bounds.terms import Bound
from shardscope._src.cost.links import crosses_nodes
from shardscope._src.cost.memory import memory_fits
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import REMATS, Mode, ModelConfig, Remat
from shardscope._src.model.remat import model_problem, remat_policy
from shardscope._src.plan.estimates import (
    DEFAULT_BYTES_PER_PARAM,
    MatmulDtype,
    PipelineSplit,
    PipelineStage,
    Schedule,
    check_fp8_params,
    check_fp8_saved_inputs,
    data_ways,
    divisors,
    estimate_memory,
    interleave_problem,
    layer_matmul_params,
    moe_layer_matmul_params,
    offload_layers_problem,
    or_list,
    split_problem,
    split_stages,
)
from shardscope._src.plan.request import DEFAULT_STRATEGIES, MODEL_DIMS, MOE_STRATEGIES
from shardscope._src.plan.types import Skipped, SkipReason
from shardscope._src.sharding.parallelism import DataParallel, Parallelism
from shardscope._src.sharding.strategies import (
    ALL_STRATEGIES,
    CONTEXT_AXIS,
    Placement,
    Role,
    Strategy,
    abstract_mesh,
    get_strategy,
    mesh_spec_for,
)
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.hardware import hardware as get_hardware
from shardscope._src.train.timing import (
    CommLoad,
    Pricing,
    comm_items,
    reruns_forward_collectives,
    step_bound,
    step_time,
    step_work,
)
from shardscope._src.train.types import STAGE_AXIS, Candidate, Screened

#: The most pipeline stages a sweep tries unless told (more rarely pays on one job).
MAX_STAGES = 16
#: The most micro-batch counts a sweep tries per candidate (the largest divisors are kept).
MAX_MICROBATCH_OPTIONS = 8
#: The most virtual stages (model chunks per device) a sweep tries unless told: each doubles
#: the point-to-point transfers of the one before, for a bubble already cut to ``1 / v``.
MAX_VIRTUAL_STAGES = 4


def candidates(
    strategies: Iterable[str],
    devices: int,
    stages: Sequence[int] = (1,),
    mesh: Mapping[str, int] | None = None,
    *,
    node_size: int | None = None,
) -> list[Candidate]:
    """Every mesh shape of ``devices`` for each strategy and pipeline stage count, in a
    stable order. With ``p > 1`` stages the mesh has a leading ``stage=p`` axis and the
    strategy's axes share the ``devices / p`` of one stage. ``node_size`` (the devices with
    the fast links: a GPU node, a TPU slice) keeps only the HSDP meshes whose ``data`` groups
    do not cross a node (:func:`~shardscope._src.cost.links.crosses_nodes`: on 8-GPU nodes,
    ``data`` dividing 8); None, or a pinned ``mesh``, keeps every one.

    >>> [c.label for c in candidates(["hsdp"], 32, node_size=8)]
    ['hsdp replica=16,data=2', 'hsdp replica=8,data=4', 'hsdp replica=4,data=8']

    >>> [c.label for c in candidates(["tp", "dp_tp"], 8)]
    ['tp model=8', 'dp_tp data=4,model=2', 'dp_tp data=2,model=4']
    >>> [c.label for c in candidates(["fsdp"], 8, (1, 2))]
    ['fsdp data=8', 'fsdp stage=2,data=4']
    >>> [c.label for c in candidates(["fsdp_cp"], 8)]
    ['fsdp_cp data=4,context=2', 'fsdp_cp data=2,context=4']

    A stage of one device is one program whatever the one-role strategy: the first names it.

    >>> [c.label for c in candidates(["dp", "fsdp", "tp"], 4, (2, 4))]
    ['dp stage=2,data=2', 'fsdp stage=2,data=2', 'tp stage=2,model=2', 'dp stage=4,data=1']

    With ``mesh`` (axis sizes, in the planner's order: ``stage``, ``pod``..., ``data``,
    ``model``), only the candidates on exactly that mesh:

    >>> [c.label for c in candidates(["dp", "dp_tp", "fsdp_tp"], 8, mesh={"data": 4, "model": 2})]
    ['dp_tp data=4,model=2', 'fsdp_tp data=4,model=2']
    """
    if mesh is not None:
        pinned = MeshShape.of(mesh)
        stage = pinned.get(STAGE_AXIS, 1)
        every = _enumerate(strategies, devices, (stage,), None, distinct=False)
        return [c for c in every if c.mesh == pinned]
    return _enumerate(strategies, devices, stages, node_size)


def _enumerate(
    strategies: Iterable[str],
    devices: int,
    stages: Sequence[int],
    node_size: int | None,
    *,
    distinct: bool = True,
) -> list[Candidate]:
    """:func:`candidates` without a pinned mesh: each strategy's meshes, an expert-parallel
    strategy's ``data=1`` among them unless ``distinct`` and another of ``strategies`` is
    that program (:func:`_data_one_repeats`)."""
    strategies = list(strategies)
    # a stage of one device runs one program whatever the one-role strategy (its axis of
    # one device shards and replicates nothing): the first of them names it
    alone = next((n for n in strategies if len(get_strategy(n).roles) <= 1), None)
    out = []
    for p in stages:
        n = devices // p
        for name in strategies:
            shapes: list[tuple[int, ...]]
            strategy = get_strategy(name)
            if len(strategy.roles) <= 1:
                if n == 1 and distinct and name != alone:
                    continue
                shapes = [(n,)]
            elif strategy.expert_parallel and Role.DATA in strategy.roles:
                # the experts over every device too (data=1): the dense weights then
                # sharded over all of them (fsdp_ep, zero1_ep's optimizer state) or
                # replicated (dp_ep, as ep); with 'model' too, each factorization of the
                # devices but data=1 (ep_tp's meshes), folded data=1 too (the experts
                # over every device of the stage, each whole: the model zoo's EDP 1)
                rest = len(strategy.roles) - 1
                shapes = [
                    (n // t, *f)
                    for t in divisors(n)
                    if 1 < t and (rest == 1 or t < n or strategy.expert_fold)
                    if t < n or not (distinct and _data_one_repeats(name, strategies))
                    for f in factorizations(t, rest)
                ]
            else:
                shapes = factorizations(n, len(strategy.roles))
            for shape in shapes:
                lead: tuple[tuple[str, int], ...] = ((STAGE_AXIS, p),) if p > 1 else ()
                sizes = MeshShape(lead + MeshShape.of(mesh_spec_for(name, shape)).axes)
                if node_size is not None and _crosses(strategy, sizes, node_size):
                    continue
                out.append(Candidate(name, sizes))
    return out


def _data_one_repeats(name: str, strategies: Sequence[str]) -> bool:
    """Whether ``name`` on ``data=1`` is a program another of ``strategies`` already
    enumerates: a data-parallel flavour that replicates the weights over ``data`` (``dp``)
    has nothing on an axis of one device, so ``dp_ep data=1,expert=n`` is ``ep expert=n``.
    A flavour that shards over ``data`` and ``expert`` together (FSDP, ZeRO) is not.

    >>> _data_one_repeats("dp_ep", ["ep", "dp_ep"]), _data_one_repeats("dp_ep", ["dp_ep"])
    (True, False)
    >>> _data_one_repeats("fsdp_ep", ["ep", "fsdp_ep"])
    False
    """
    try:
        dims = Parallelism.parse(name)
    except StrategyError:  # a strategy not named by the naming rule
        return False
    if dims.data != DataParallel.DP:
        return False
    return replace(dims, data=DataParallel.NONE).name in strategies


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every way to write ``n`` as an ordered product of ``k`` factors, each at least 2
    (one axis per role: a role of size 1 is the strategy without it), the last factors
    growing fastest.

    >>> factorizations(8, 2), factorizations(16, 3)
    ([(4, 2), (2, 4)], [(4, 2, 2), (2, 4, 2), (2, 2, 4)])
    """
    if k == 1:
        return [(n,)] if n >= 2 else []
    return [(*rest, t) for t in divisors(n) if 1 < t < n for rest in factorizations(n // t, k - 1)]


def _crosses(strategy: Strategy, sizes: MeshShape, node_size: int) -> bool:
    """Whether a mesh of the sweep is one the sweep leaves out for crossing nodes (GPU) or
    slices (TPU): HSDP's ``data`` groups (its gathers and reduce-scatters are the step's
    largest collectives, and only the all-reduce over ``replica`` is meant for the slower
    network), and, with three roles or more, the ``model`` groups (tensor parallelism's
    activations on every layer's critical path: Megatron-LM keeps it inside a node) and a
    ``context`` axis of more than a node's devices (splitting the sequence wider still is the
    long-context case, which the two-role ``*_cp`` strategies screen): this keeps the meshes
    of the strategies that combine the dimensions to a few per stage count."""
    if Role.REPLICA in strategy.roles and crosses_nodes(sizes, (Role.DATA,), node_size):
        return True
    if len(strategy.roles) < 3:
        return False
    return crosses_nodes(sizes, (Role.MODEL,), node_size) or sizes.get(CONTEXT_AXIS, 1) > node_size


#: MaxText's parallelism axes, as its ``ici_X_parallelism`` and ``dcn_X_parallelism``
#: settings name them (base.yml), and the planner's axis each is read as: ``data`` (the
#: weights replicated over it) is HSDP's ``replica`` where ``fsdp`` (the weights sharded) is
#: there too, else the planner's ``data``; ``sequence`` and ``context`` split the sequence.
MAXTEXT_AXES = {
    "pipeline": STAGE_AXIS,
    "data": "data",
    "fsdp": "data",
    "sequence": CONTEXT_AXIS,
    "context": CONTEXT_AXIS,
    "tensor": "model",
    "expert": "expert",
}


def maxtext_mesh(mesh: MeshShape) -> MeshShape | None:
    """The planner's mesh of a MaxText parallelism (``ici_fsdp=8,dcn_fsdp=16,dcn_data=4``,
    each name with or without its ``_parallelism``), or None where ``mesh`` names other axes.
    Each axis is its ICI and DCN sizes' product, in the planner's order (``stage``,
    ``replica``, ``data``, ``context``, ``model``; ``expert`` after ``data``): MaxText's
    hybrid mesh puts each axis's DCN part outside its ICI part, as the planner's device
    order then does, so the DCN axes cross nodes or slices and the ICI ones stay inside.

    >>> maxtext_mesh(MeshShape.of("ici_fsdp=8,dcn_fsdp=16,dcn_data=4")).spec
    'replica=4,data=128'
    >>> maxtext_mesh(MeshShape.of("ici_tensor_parallelism=8,dcn_fsdp_parallelism=4")).spec
    'data=4,model=8'
    """
    if not mesh.names or not all(n.startswith(("ici_", "dcn_")) for n in mesh.names):
        return None
    total: dict[str, int] = {}
    for name, size in mesh.items():
        axis = name[4:].removesuffix("_parallelism")
        if axis not in MAXTEXT_AXES:
            raise PlanError(
                f"mesh={mesh.spec!r}: MaxText's {name} is not a parallelism the planner "
                f"plans; it reads {', '.join(f'ici_/dcn_{a}' for a in MAXTEXT_AXES)}",
                param="mesh",
            )
        total[axis] = total.get(axis, 1) * size
    data, fsdp = total.get("data", 1), total.get("fsdp", 1)
    pairs = [
        (STAGE_AXIS, total.get("pipeline", 1)),
        ("replica", data if fsdp > 1 else 1),
        ("data", fsdp if fsdp > 1 else data),
        ("expert", total.get("expert", 1)),
        (CONTEXT_AXIS, total.get("sequence", 1) * total.get("context", 1)),
        ("model", total.get("tensor", 1)),
    ]
    kept = [(a, n) for a, n in pairs if n > 1]
    return MeshShape(tuple(kept) or (("data", 1),))


def crossing_axes(mesh: MeshShape, node_size: int) -> tuple[str, ...]:
    """The axes of ``mesh`` whose groups span two nodes of ``node_size`` devices, its
    devices numbered in its axes' order (the last inner).

    >>> crossing_axes(MeshShape.of("data=4,model=4"), 8)
    ('data',)
    >>> crossing_axes(MeshShape.of("model=4,data=4"), 8)
    ('model',)
    """
    return tuple(a for a in mesh.names if crosses_nodes(mesh.sizes, (a,), node_size))


def runs_on(mesh: MeshShape, devices: int, strategies: Sequence[str]) -> list[str]:
    """Those of ``strategies`` that run on ``mesh``, in their order."""
    stage = mesh.get(STAGE_AXIS, 1)
    return [s for s in strategies if candidates([s], devices, (stage,), mesh)]


def pinned_mesh(
    mesh: str | Mapping[str, int],
    devices: int,
    strategies: Sequence[str],
    *,
    takes: Sequence[str] | None = None,
    asked: bool = True,
) -> MeshShape:
    """A mesh to plan on exactly (``"data=32,model=8"``, or its shape), checked: its devices
    are the plan's and at least one of ``strategies`` runs on it (a :class:`PlanError` says
    which do). Its axes may come in any order (read in the planner's, which
    :func:`crossing_axes` of the two tells apart), as MaxText's parallelism
    (:func:`maxtext_mesh`), and without an axis of size 1 that a strategy names (``expert=64``
    is fsdp_ep's ``data=1,expert=64``).

    ``takes``: the strategies the model can be planned under (default: every one), the only
    ones a refusal names as running on the mesh; ``asked``: whether ``strategies`` were the
    user's (a refusal then says what each of them needs of the mesh).
    """
    sizes = MeshShape.of(mesh)
    sizes = maxtext_mesh(sizes) or sizes
    where = sizes.spec
    total = sizes.devices
    if total != devices:
        raise PlanError(
            f"mesh={where!r} has {total} devices, the plan {devices}; give devices={total} "
            f"or a mesh of {devices}",
            param=("mesh", "devices"),
        )
    stage = sizes.get(STAGE_AXIS, 1)
    if candidates(strategies, devices, (stage,), sizes):
        return sizes
    # the same axes written in another order, or without those of size 1 (which change
    # nothing the program does): read as the strategies write them
    for c in candidates(strategies, devices, (stage,)):
        if _sized(c.mesh) == _sized(sizes):
            return c.mesh
    every = candidates(ALL_STRATEGIES, devices, (stage,))
    same = sorted(sizes.items())
    sizes = next((c.mesh for c in every if sorted(c.mesh.items()) == same), sizes)
    unknown = [a for a in sizes.names if a != STAGE_AXIS and a not in set(Role)]
    if unknown:
        raise PlanError(
            f"mesh={where!r}: axis {unknown[0]!r} is none the planner names; {_AXES}",
            param="mesh",
        )
    takes = tuple(ALL_STRATEGIES) if takes is None else tuple(takes)
    which = "" if set(takes) == set(ALL_STRATEGIES) else " the model is planned under"
    fits = runs_on(sizes, devices, list(takes))
    if asked:
        needs = "; ".join(_mesh_needs(n, sizes, devices) for n in strategies)
        ran = f"; the strategies{which} that run on it: {', '.join(fits)}" if fits else ""
        raise PlanError(f"mesh={where!r}: {needs}{ran}", param=("mesh", "strategies"))
    if fits:  # none of the default strategies runs on it: the sweep plans these
        raise PlanError(
            f"mesh={where!r}: none of the strategies {', '.join(strategies)} runs on it; "
            f"the strategies{which} that run on it: {', '.join(fits)}",
            param=("mesh", "strategies"),
        )
    near = [c.mesh.spec for c in _nearest(candidates(takes, devices, (stage,)), sizes)]
    raise PlanError(
        f"mesh={where!r}: no strategy{which} runs on it; {_AXES}, e.g. "
        f"{', '.join(list(dict.fromkeys(near))[:4])}",
        param="mesh",
    )


def _sized(mesh: MeshShape) -> list[tuple[str, int]]:
    """``mesh``'s axes of more than one device, sorted: what a program on it depends on."""
    return sorted((a, n) for a, n in mesh.items() if n > 1)


def _nearest(cands: Sequence[Candidate], mesh: MeshShape) -> list[Candidate]:
    """``cands`` ordered by how much of ``mesh`` their meshes keep: the axes of the same
    size first, then the same axes, then the sizes nearest (by factors of 2), then as
    given."""
    pairs, names = set(mesh.items()), set(mesh.names)

    def apart(other: MeshShape) -> float:
        axes = set(other.names) | names
        return sum(abs(math.log2(other.get(a, 1)) - math.log2(mesh.get(a, 1))) for a in axes)

    return sorted(
        cands,
        key=lambda c: (
            -len(pairs & set(c.mesh.items())),
            -len(names & set(c.mesh.names)),
            apart(c.mesh),
        ),
    )


def _axes_words(axes: Sequence[str]) -> str:
    """``an 'expert' axis``, ``a 'model' axis`` or ``axes 'data' and 'model'``."""
    quoted = [repr(a) for a in axes]
    if len(quoted) == 1:
        return f"{'an' if axes[0][:1] in 'aeiou' else 'a'} {quoted[0]} axis"
    return f"axes {', '.join(quoted[:-1])} and {quoted[-1]}"


def _mesh_needs(name: str, mesh: MeshShape, devices: int) -> str:
    """What strategy ``name`` needs of ``mesh`` that it lacks, with the nearest mesh of
    ``devices`` it runs on: the axes it needs and the mesh does not have, else the axes it
    takes none of, else the sizes."""
    stage = mesh.get(STAGE_AXIS, 1)
    own = candidates([name], devices, (stage,))
    if not own:
        return f"{name} has no mesh of {devices} devices in {stage} stage(s)"
    example = f"e.g. mesh={_nearest(own, mesh)[0].mesh.spec!r}"
    meshes = [set(c.mesh.names) for c in own]
    missing = [a for a in own[0].mesh.names if all(a in m for m in meshes) and a not in mesh]
    if missing:
        return f"{name} needs {_axes_words(missing)}, {example}"
    extra = [a for a, n in mesh.items() if n > 1 and not any(a in m for m in meshes)]
    if extra:
        return f"{name} takes no {' or '.join(map(repr, extra))} axis, {example}"
    return f"{name} does not run on these sizes, {example}"


def indivisible_mesh_error(
    config: ModelConfig,
    mesh: MeshShape,
    strategy: str,
    *,
    flash_attention: bool,
    preset: str | None = None,
    written: str | None = None,
) -> PlanError | None:
    """The refusal of a pinned ``mesh`` (``written`` so by the user, where that differs) on
    which ``strategy`` splits a dimension of the model over axes that do not divide it (None
    where it places there): the mesh to choose, with the nearest of its devices on which the
    strategy places; for a ``preset``, whose dimensions the planner takes no other value of
    but those it is given (its experts), the mesh alone, and that a config.json plans another
    count."""
    stage = mesh.get(STAGE_AXIS, 1)
    devices = mesh.devices

    def problem(cand: Candidate) -> IndivisibleError | None:
        base = stage_config(config, cand, flash_attention=flash_attention)
        try:
            cand.strategy_record.place(base, abstract_mesh(cand.stage_mesh))
        except IndivisibleError as e:
            return e
        except StrategyError:
            return None  # another refusal: not this one's to word
        return None

    here = candidates([strategy], devices, (stage,), mesh)
    e = problem(here[0]) if here else None
    if e is None:
        return None
    own = _nearest(candidates([strategy], devices, (stage,)), mesh)
    fix = next((c.mesh.spec for c in own if c.mesh != mesh and problem(c) is None), None)
    example = f", e.g. mesh={fix!r}" if fix else ""
    where = f"mesh={written or mesh.spec!r}"
    if written is not None and written != mesh.spec:
        where += f" (read as {mesh.spec})"
    if preset is None or e.dim in MODEL_DIMS or e.dim in ("batch", "seq"):
        return PlanError(f"{where}: {e}{example}", param="mesh")
    return PlanError(
        f"{where}: strategy {strategy!r} splits the {e.size} {e.dim} of {preset} "
        f"over mesh axes {e.axes} ({e.ways} ways), and {e.size} is not divisible by "
        f"{e.ways}; choose a mesh whose {e.roles} axes multiply to a divisor of {e.size}"
        f"{example} (a preset's {e.dim} are its own: to plan another count, give the path of "
        f"a config.json as the model)",
        param="mesh",
    )


#: The mesh axes the planner names (a role's axis is named as the role), in the words its
#: refusals give them.
_AXES = (
    f"the planner names the axes {STAGE_AXIS} (pipeline stages), replica, data, expert, "
    f"context and model, in any order (or MaxText's ici_X and dcn_X parallelism)"
)


def stage_options(
    config: ModelConfig, devices: int, mode: str, stages: int | None
) -> tuple[int, ...]:
    """Pipeline stage counts to try: 1, and (train, unless ``stages`` fixes one) every
    count up to :data:`MAX_STAGES` and the layers that divides the devices. Stages need not
    divide the layers: DeepSeek-V3's 61 in 16 stages are stages of 4 and 3 layers, planned by
    a stage of 4 (:func:`stage_layers`). A mixture of experts is staged only where its layers
    with experts are the heavier kind (:func:`experts_outweigh_dense`): its planned stage is
    one of those layers alone.

    >>> from shardscope._src.model.presets import model_preset
    >>> stage_options(model_preset("deepseek-v3").config(batch=1), 1024, "train", None)
    (1, 2, 4, 8, 16)
    """
    staged = mode == Mode.TRAIN and (not config.is_moe or experts_outweigh_dense(config))
    if stages is not None:
        if not is_int(stages, 1):
            raise PlanError(f"stages={stages!r}: must be a positive integer", param="stages")
        if stages > 1 and not staged and config.is_moe:
            raise PlanError(
                f"stages={stages}: this mixture's {config.dense_layers} dense layers compute "
                f"more a token than its layers with experts, and the planner plans a "
                f"mixture's pipeline stage by the latter; give stages=1 or leave it out",
                param="stages",
            )
        if devices % stages or stages > config.layers:
            raise PlanError(
                f"stages={stages}: pipeline stages must divide the {devices} devices and be "
                f"no more than the {config.layers} layers; choose one of "
                f"{or_list([p for p in divisors(devices) if p <= config.layers])}",
                param="stages",
            )
        return (stages,)
    if not staged:
        return (1,)
    most = min(config.layers, MAX_STAGES)
    return tuple(p for p in divisors(devices) if p <= most)


def stage_layers(layers: int, stages: int) -> int:
    """The layers of the stage a pipeline of ``stages`` is planned by: the last stage's,
    which holds the unembedding and, where the stages cannot be equal, one layer more than
    the fewest (``layers`` split as evenly as they go, the larger stages last): the slowest
    stage, which sets the pipeline's pace.

    >>> stage_layers(80, 4), stage_layers(61, 16), stage_layers(61, 1)
    (20, 4, 61)
    """
    return -(-layers // stages)


def uneven_stages(layers: int, stages: int) -> str:
    """``'stages of 4 and 3 of the 61 layers'``, or ``''`` when the stages are equal."""
    if layers % stages == 0:
        return ""
    big = stage_layers(layers, stages)
    return f"stages of {big} and {big - 1} of the {layers} layers"


def experts_outweigh_dense(config: ModelConfig) -> bool:
    """Whether a token's matmuls in a layer with experts (its attention, router, ``top_k``
    routed and the shared experts) go through at least the weights of a dense layer's: then
    the last pipeline stage, all (or most) of its layers with experts, is the slowest and
    holds the most, and is the one planned (:func:`stage_config`). True of every mixture
    preset (DeepSeek-V3's dense MLP is exactly its nine active experts' width)."""
    if not config.dense_layers:
        return True
    return moe_layer_matmul_params(config, routed=config.top_k) >= layer_matmul_params(config)


def interleaved_stage_options(
    config: ModelConfig,
    mode: str,
    stage_counts: Sequence[int],
    virtual_stages: int | None,
    microbatches: int | None,
    *,
    fixed: bool,
    pipeline_split: str = PipelineSplit.LAYERS,
) -> tuple[int, ...]:
    """The pipeline stage counts of ``stage_counts`` (:func:`stage_options`) that
    ``virtual_stages`` runs with: all of them when it is None or 1. A :class:`PlanError`
    says why and what to choose when none does
    (:func:`~shardscope._src.plan.estimates.interleave_problem`); ``fixed``: the stages were
    given (``stages=`` or a pinned mesh), so their own problem is the error. A
    ``pipeline_split`` that counts the embedding or the loss as a layer keeps the counts
    that divide what it counts (:func:`~shardscope._src.plan.estimates.split_problem`)."""
    v = virtual_stages
    split = PipelineSplit.parse(pipeline_split, what="pipeline_split", error=PlanError)
    if split.accounted:
        if fixed:
            (p,) = stage_counts
            problem = split_problem(split, config.layers, p)
            if problem is not None:
                raise PlanError(problem, param="pipeline_split")
        stage_counts = [p for p in stage_counts if split_problem(split, config.layers, p) is None]
    if v is None or v == 1:
        return tuple(stage_counts)
    problem = interleave_problem(v, None, train=mode == Mode.TRAIN)
    if problem is None and fixed:
        (p,) = stage_counts
        problem = _stages_interleave_problem(v, config.layers, p, microbatches, split)
    if problem is not None and split.accounted:
        raise PlanError(problem, param=("virtual_stages", "pipeline_split"))
    if problem is not None:
        raise PlanError(problem, param="virtual_stages")
    runs = tuple(
        p
        for p in stage_counts
        if _stages_interleave_problem(v, config.layers, p, microbatches, split) is None
    )
    if not runs:
        tried = ", ".join(_stage_sizes(config.layers, p) for p in stage_counts if p > 1)
        m = "" if microbatches is None else f" and microbatches={microbatches}"
        raise PlanError(
            f"virtual_stages={v}{m}: no pipeline stage count the sweep tries runs it (stages "
            f"{tried or 'none: the devices have no divisor above 1'}); interleaving needs "
            f"stages of equal layers, the stages dividing the micro-batches and {v} the "
            f"layers of each; choose another virtual_stages, stages= or virtual_stages=1",
            param="virtual_stages",
        )
    return runs


def _stage_sizes(layers: int, stages: int) -> str:
    """``'16 of 5 layers'``, or ``'16 of 4 and 3 layers (unequal)'``."""
    big = stage_layers(layers, stages)
    if uneven_stages(layers, stages):
        return f"{stages} of {big} and {big - 1} layers (unequal)"
    return f"{stages} of {big} layers"


def _stages_interleave_problem(
    v: int,
    layers: int,
    stages: int,
    microbatches: int | None,
    split: str = PipelineSplit.LAYERS,
) -> str | None:
    """Why ``v`` virtual stages cannot run on ``stages`` pipeline stages of the ``layers``
    and ``microbatches`` (:func:`~shardscope._src.plan.estimates.interleave_problem`, and
    unequal stages, which interleaving's equal chunks cannot split), or None. A ``split``
    that counts the embedding or the loss as a layer splits what it counts into equal
    chunks (:func:`~shardscope._src.plan.estimates.split_problem`)."""
    if PipelineSplit.parse(split).accounted and stages > 1:
        problem = split_problem(split, layers, stages, v)
        return problem or interleave_problem(v, stages, microbatches)
    if v != 1 and stages > 1 and uneven_stages(layers, stages):
        return (
            f"virtual_stages={v}: interleaving splits every stage's layers into {v} equal "
            f"chunks, and {stages} pipeline stages of the {layers} layers are unequal "
            f"({uneven_stages(layers, stages)}); give stages= dividing the layers, or "
            f"virtual_stages=1"
        )
    return interleave_problem(v, stages, microbatches, stage_layers(layers, stages))


def virtual_stage_options(
    layers: int,
    stages: int,
    microbatches: int,
    virtual_stages: int | None,
    split: str = PipelineSplit.LAYERS,
) -> tuple[int, ...]:
    """Virtual stages to try for ``stages`` pipeline stages of the model's ``layers`` and
    ``microbatches`` micro-batches: ``virtual_stages`` when it fixes them (none when it does
    not run with these), else 1 and every count up to :data:`MAX_VIRTUAL_STAGES` that runs
    (:func:`_stages_interleave_problem`).

    >>> virtual_stage_options(48, 4, 8, None), virtual_stage_options(48, 4, 6, None)
    ((1, 2, 3, 4), (1,))
    >>> virtual_stage_options(47, 4, 8, None)
    (1,)
    """
    tried = range(1, MAX_VIRTUAL_STAGES + 1) if virtual_stages is None else (virtual_stages,)
    return tuple(
        v
        for v in tried
        if _stages_interleave_problem(v, layers, stages, microbatches, split) is None
    )


#: The recomputation policies a sweep tries when none is asked for: today's five words
#: (selective only without memory-efficient attention, offload where the hardware has host
#: memory).
SWEPT_REMATS: tuple[str, ...] = tuple(REMATS)


def remat_options(
    mode: str,
    remat: str | Sequence[str] | None,
    flash_attention: bool,
    hw: Hardware | None = None,
) -> tuple[str, ...]:
    """Recomputation policies to try, by their canonical names
    (:func:`~shardscope._src.model.remat.remat_policy`). Selective recomputation drops the
    attention scores, which memory-efficient attention never keeps: with it, selective is
    no recomputation. A policy that offloads needs host memory: the sweep tries offload
    where ``hw`` has some, and refuses one asked for where it has none."""

    if mode != Mode.TRAIN:
        return (Remat.NONE,)
    host = hw is None or hw.host_memory_bytes > 0
    if remat is None:
        return tuple(
            r
            for r in SWEPT_REMATS
            if not (flash_attention and r == Remat.SELECTIVE)
            and (host or not remat_policy(r).offloaded)
        )
    chosen = (remat,) if isinstance(remat, str) else tuple(remat)
    names = []
    for r in chosen:
        try:
            policy = remat_policy(r)
        except ShardscopeError as e:
            raise PlanError(str(e), param="remat") from None
        if policy.offloaded and not host:
            assert hw is not None
            raise PlanError(
                f"remat={r!r}: hardware {hw.name!r} has no host memory to offload "
                f"{', '.join(policy.offloaded)} to (host_memory_bytes=0); give it "
                f"host_memory_bytes= and host_bandwidth=, or choose a recomputation that "
                f"offloads nothing ({', '.join(x for x in REMATS if x != Remat.OFFLOAD)})",
                param="remat",
            )
        names.append(policy.name)
    return tuple(dict.fromkeys(names))


#: The strategies whose estimates price a mixture of experts (and latent attention): expert
#: parallelism with each data flavour but HSDP and with tensor parallelism (tp or sp), both at
#: once too, and the data-parallel, FSDP and tensor-parallel ones with the experts as their MLPs (no
#: sequence or context parallelism or HSDP yet); a sweep tries any of them when asked.
MOE_PRICED = (
    "dp",
    "fsdp",
    "dp_tp",
    "fsdp_tp",
    *(n for n, s in ALL_STRATEGIES.items() if s.expert_parallel),
)
#: The recomputations a sweep of a mixture of experts (or latent attention) tries when none is
#: asked for; one asked for is priced where the model's layers can run it
#: (:func:`~shardscope._src.model.remat.model_problem`): a policy by named tensor, offload
#: included, or one that keeps everything.
MOE_REMATS = (Remat.NONE, Remat.FULL)


def moe_strategies(names: Sequence[str], *, asked: bool, experts: bool = True) -> tuple[str, ...]:
    """The strategies a sweep of a mixture of experts (``experts``; else of latent attention
    alone) tries: :data:`MOE_STRATEGIES` when none were ``asked`` for, else those given, each
    of which must be one of :data:`MOE_PRICED` (a :class:`PlanError` says why each other is
    not, and names the nearest that is: :func:`moe_refusal`)."""
    if not asked:
        return MOE_STRATEGIES
    other = [n for n in names if n not in MOE_PRICED]
    if other:
        raise PlanError(
            "; ".join(moe_refusal(n, experts=experts) for n in other), param="strategies"
        )
    return tuple(names)


def moe_refusal(name: str, *, experts: bool = True) -> str:
    """Why ``name``, not one of :data:`MOE_PRICED`, is not planned for a mixture of experts
    (``experts``; else for latent attention alone), and the nearest strategies that are:
    with expert parallelism added (for a mixture), and without it, HSDP read as FSDP.

    >>> moe_refusal("zero1_sp_cp").split("; ")[1]
    'nearest: zero1_ep_sp_cp'
    >>> moe_refusal("hsdp")
    'hsdp: a mixture of experts is not planned under HSDP; nearest: fsdp_ep or fsdp'
    """
    what = "a mixture of experts" if experts else "latent attention"
    dense = [n for n in MOE_PRICED if not ALL_STRATEGIES[n].expert_parallel]
    p = Parallelism.parse(name)
    if p.data == DataParallel.HSDP:
        why = f"{what} is not planned under HSDP"
        p = replace(p, data=DataParallel.FSDP)
    else:
        why = f"without expert parallelism {what} is planned only under {or_list(dense)}"
    near = [replace(p, expert=True).name] if experts and not p.expert else []
    near = [n for n in dict.fromkeys([*near, p.name]) if n in MOE_PRICED and n != name]
    return f"{name}: {why}; " + (
        f"nearest: {or_list(near)}" if near else f"choose {or_list(dense)}"
    )


def moe_remats(remats: Sequence[str], config: ModelConfig, *, asked: bool) -> tuple[str, ...]:
    """The recomputations a sweep of a mixture of experts (or latent attention) tries: those
    ``asked`` for, each of which its layers must be able to run (else an error naming it,
    :func:`~shardscope._src.model.remat.model_problem`), or else :data:`MOE_REMATS`."""
    if not asked:
        return tuple(r for r in remats if r in MOE_REMATS)
    return runnable_remats(remats, config)


def runnable_remats(remats: Sequence[str], config: ModelConfig) -> tuple[str, ...]:
    """``remats``, each of which the model's layers can run; else an error naming the first
    that they cannot (:func:`~shardscope._src.model.remat.model_problem`)."""
    for r in remats:
        gated = config.mlp == "swiglu"
        problem = model_problem(
            remat_policy(r), experts=config.is_moe, latent=config.is_mla, gated=gated
        )
        if problem is not None:
            raise PlanError(f"remat={r}: {problem}", param="remat")
    return tuple(remats)


def dense_strategies(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` for a dense model: an expert-parallel one among them is refused."""
    experts = [n for n in names if get_strategy(n).expert_parallel]
    if experts:
        raise PlanError(
            f"strategies {', '.join(experts)}: expert parallelism splits a mixture of "
            f"experts' routed experts, and this model has none; choose from "
            f"{', '.join(DEFAULT_STRATEGIES)}, or plan a mixture (model='mixtral-8x7b')",
            param="strategies",
        )
    return tuple(names)


def stage_config(
    config: ModelConfig,
    cand: Candidate,
    *,
    flash_attention: bool,
    stage: PipelineStage | None = None,
) -> ModelConfig:
    """The program one device runs for ``cand``: one stage's layers, the whole batch, its
    recomputation, and blocked attention when the estimate assumes memory-efficient attention
    (so that the compiled program computes what the estimate counts).

    Interleaved (``cand.virtual_stages`` > 1), a device runs the same ``layers / stages``
    layers in that many chunks of ``layers / (stages x virtual_stages)``: within a stage the
    collectives per layer are the same, so the program compiled is one stage's, of all its
    layers; the chunks change only the schedule (the bubble, the point-to-point transfers and
    the activations held, in the estimates).

    A mixture of experts' dense layers open the first stage: the stage planned is the last,
    whose layers have experts (:func:`experts_outweigh_dense`: the heaviest).

    Where ``cand.pipeline_split`` counts the embedding or the loss as a layer, the stages
    are Megatron's (:func:`~shardscope._src.plan.estimates.split_stages`): the program is the
    stage of the most layers, and ``stage`` one of the split's stages, whose layers it is
    (the first stage's dense layers its own, another's those that reach it from the first).

    A dropless mixture of experts is compiled capacity-padded at capacity factor 1: what a
    dropless program computes and moves under uniform routing (the published benchmarks
    force it), and what the partitioner can place (under jit a dropless program's dispatch
    and combine all-reduce every slot of the batch to every device)."""
    capacity = config.routed_capacity if config.is_moe else config.capacity_factor
    layers = stage_layers(config.layers, cand.stages)
    if stage is not None:
        layers = stage.layers
    elif cand.split.accounted and cand.stages > 1:
        layers = max(s.layers for s in split_stages(cand.split, config.layers, cand.stages))
    # a mixture's dense layers open the first stage; the last stage is planned (the heaviest:
    # experts_outweigh_dense), with those of them that reach it (interleaved, the last
    # device's chunks hold no more dense layers than that, so it is planned as no lighter)
    dense = max(0, config.dense_layers - (config.layers - layers))
    if stage is not None and stage.rank == 0:
        dense = min(config.dense_layers, layers)
    return replace(
        config,
        layers=layers,
        dense_layers=dense,
        remat=cand.remat,
        attention="blocked" if flash_attention else "dense",
        scan=True,
        capacity_factor=capacity,
        imbalance=1.0,  # padded to it: the capacity bounds the busiest expert's tokens
    )


def _microbatch_options(placement: Placement, mode: str, microbatches: int | None) -> list[int]:
    batch = placement.config.batch
    per_shard = batch // data_ways(placement) if batch else 0
    if mode != Mode.TRAIN:
        return [1]
    if microbatches is not None:
        return [microbatches] if per_shard and per_shard % microbatches == 0 else []
    options = divisors(per_shard) if per_shard else []
    if len(options) > MAX_MICROBATCH_OPTIONS:
        options = [1, *options[-(MAX_MICROBATCH_OPTIONS - 1) :]]
    return options


#: One pipeline stage a screen prices: its schedule, its program placed, and the memo and
#: pieces its screens share (:func:`screen`).
_StagePart = tuple[
    Schedule, Placement, dict[tuple[Any, ...], Any] | None, dict[tuple[Any, ...], Any] | None
]


def screen(
    cand: Candidate,
    placement: Placement,
    config: ModelConfig,
    hw: Hardware,
    mode: str = Mode.TRAIN,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    *,
    matmul_dtype: str = MatmulDtype.BFLOAT16,
    fp8_saved_inputs: str | None = None,
    fp8_params: int | None = None,
    memo: dict[tuple[Any, ...], tuple[Bound, CommLoad]] | None = None,
    parts: dict[tuple[Any, ...], Any] | None = None,
) -> Screened:
    """Estimates ``cand`` without compiling: memory per device and the time model's step.

    ``placement`` is the strategy placed on the stage's mesh with one stage's program
    (:func:`stage_config`); ``config`` the whole model. ``matmul_dtype="fp8"`` changes the
    step's time, and its memory only as ``fp8_saved_inputs`` says (fp8 training keeps
    16-bit weights and 32-bit master weights and optimizer state; ``"fp8"``: the linear
    layers' inputs kept for the backward in fp8, Transformer Engine's,
    :class:`Fp8SavedInputs`; None or ``"high-precision"``: at the model's dtype), and
    ``fp8_params`` (a count: the layers' linear weights kept in fp8 but that many layers at
    each end, :func:`~shardscope._src.plan.estimates.check_fp8_params`; None: 16-bit).
    ``memo``:
    the step's bound and its collectives, summed (:class:`~shardscope._src.train.timing.
    CommLoad`), of earlier candidates on the same placement and mode (they depend only on
    the micro-batches, whether the forward is recomputed, and fp8 gathers);
    ``parts``: the pieces of those collectives, memory and work of earlier candidates on
    the same placement and mode (:func:`~shardscope._src.train.timing.step_bound`,
    :func:`~shardscope._src.plan.estimates.estimate_memory`,
    :func:`~shardscope._src.train.timing.step_work`).
    """
    stages: list[_StagePart]
    if cand.split.accounted and cand.stages > 1 and mode == Mode.TRAIN:
        stages = _split_stage_parts(cand, config, flash_attention, parts)
    else:
        stages = [(cand.schedule(), placement, memo, parts)]
    each = [
        _screen_stage(
            cand,
            placed,
            config,
            hw,
            mode,
            bytes_per_param,
            flash_attention,
            sched,
            matmul_dtype=matmul_dtype,
            fp8_saved_inputs=fp8_saved_inputs,
            fp8_params=fp8_params,
            memo=stage_memo,
            parts=stage_parts,
        )
        for sched, placed, stage_memo, stage_parts in stages
    ]
    if len(each) == 1:
        return each[0]
    # a split's stages priced each on its own: the slowest sets the pipeline's pace, the
    # fullest is the device that must fit
    slowest = max(each, key=lambda s: s.time.step_s)
    fullest = max(each, key=lambda s: s.memory.total)
    return replace(slowest, memory=fullest.memory)


def _split_stage_parts(
    cand: Candidate,
    config: ModelConfig,
    flash_attention: bool,
    parts: dict[tuple[Any, ...], Any] | None,
) -> list[_StagePart]:
    """The stages of a candidate whose pipeline split counts the embedding or the loss as a
    layer (:func:`~shardscope._src.plan.estimates.split_stages`), each to be priced on its
    own: its schedule, its program placed (its layers, the embedding or the output layer, its
    logits and loss where it holds them) and the memo and pieces its screens share, kept in
    ``parts`` for the candidate's other schedules."""
    known = {} if parts is None else parts
    out = []
    for stage in split_stages(cand.split, config.layers, cand.stages, cand.virtual_stages):
        key = ("split stage", stage.rank, stage.layers)
        if key not in known:
            base = stage_config(config, cand, flash_attention=flash_attention, stage=stage)
            placed = cand.strategy_record.place(base, abstract_mesh(cand.stage_mesh))
            known[key] = placed, {}, {}
        placement, memo, stage_parts = known[key]
        out.append((cand.schedule(stage), placement, memo, stage_parts))
    return out


def _screen_stage(
    cand: Candidate,
    placement: Placement,
    config: ModelConfig,
    hw: Hardware,
    mode: str,
    bytes_per_param: int,
    flash_attention: bool,
    sched: Schedule,
    *,
    matmul_dtype: str,
    fp8_saved_inputs: str | None,
    fp8_params: int | None,
    memo: dict[tuple[Any, ...], tuple[Bound, CommLoad]] | None,
    parts: dict[tuple[Any, ...], Any] | None,
) -> Screened:
    """:func:`screen` of one stage's program under ``sched``."""
    mem = estimate_memory(
        placement,
        mode,
        bytes_per_param=bytes_per_param,
        flash_attention=flash_attention,
        schedule=sched,
        fp8_saved_inputs=fp8_saved_inputs,
        fp8_params=fp8_params,
        parts=parts,
    )
    work = step_work(
        placement,
        sched,
        config,
        math.prod(cand.sizes.values()),
        hw,
        flash_attention=flash_attention,
        mode=mode,
        bytes_per_param=bytes_per_param,
        matmul_dtype=matmul_dtype,
        fp8_saved_inputs=fp8_saved_inputs,
        fp8_params=fp8_params,
        parts=parts,
    )
    pricing = Pricing(placement, work)
    share = pricing.fp8_param_share
    key: tuple[Any, ...] = (
        cand.microbatches,
        reruns_forward_collectives(cand.remat),
        pricing.fp8_gathers,
    )
    if share:
        key = (*key, share)
    if memo is not None and key in memo:
        need, comm = memo[key]
    else:
        need = step_bound(placement, sched, mode, parts=parts)
        comm = CommLoad.of(
            comm_items(
                hw,
                placement,
                need.terms,
                fp8_gathers=pricing.fp8_gathers,
                fp8_param_share=share,
                parts=parts,
            )
        )
        if memo is not None:
            memo[key] = need, comm
    return Screened(
        cand,
        mem,
        step_time(hw, work, comm),
        need,
        int(hw.memory_bytes),
        pricing,
        int(hw.host_memory_bytes),
    )


@collector_paused
def screen_all(
    config: ModelConfig,
    devices: int,
    hw: Hardware,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    *,
    mode: str = Mode.TRAIN,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    remat: str | Sequence[str] | None = None,
    microbatches: int | None = None,
    stages: int | None = None,
    mesh: Mapping[str, int] | None = None,
    offload_optimizer: bool | None = None,
    matmul_dtype: str = MatmulDtype.BFLOAT16,
    vocab_split: bool | None = None,
    virtual_stages: int | None = None,
    fp8_saved_inputs: str | None = None,
    pipeline_split: str = PipelineSplit.LAYERS,
    offload_layers: int = 0,
    fp8_params: int | None = None,
) -> tuple[list[Screened], list[Skipped], int]:
    """Every candidate of a sweep estimated without compiling, best first (those that fit
    the device memory by step time, then the rest by memory); the (strategy, mesh) pairs
    skipped and why (indivisible, or whose model state alone exceeds the memory: never
    compiled); and how many strategy-and-mesh candidates there were. ``mesh`` pins the mesh
    (:func:`pinned_mesh`): only the candidates on it. ``virtual_stages`` fixes the model
    chunks per device (interleaved 1F1B; None: 1 and each count that runs, up to
    :data:`MAX_VIRTUAL_STAGES`). ``fp8_saved_inputs``: how an fp8 step keeps its linear
    layers' inputs (:func:`screen`; refused with 16-bit matmuls); ``fp8_params``: their
    weights kept in fp8 but that many layers at each end (:func:`screen`; refused without
    ``fp8_saved_inputs="fp8"``). ``pipeline_split``: what
    the pipeline stages split (:class:`~shardscope._src.plan.estimates.PipelineSplit`;
    Megatron's counts the embedding and the loss as a layer each, and only the stage
    counts that divide what it counts are tried). ``offload_layers``: how many of the first
    layers keep their activations in host memory from their forward to their backward
    (Megatron-Core's ``cpu_offloading_num_layers``; without a pipeline, as Megatron-Core
    runs it, so only one stage is tried). The garbage collector's passes are held off while it
    runs (:func:`~shardscope._src.base.collect.collector_paused`)."""

    saved = check_fp8_saved_inputs(fp8_saved_inputs, matmul_dtype)
    fp8_params = check_fp8_params(fp8_params, matmul_dtype, saved)
    split = PipelineSplit.parse(
        pipeline_split, what="pipeline_split", error=PlanError, param="pipeline_split"
    )
    names = tuple(strategies)
    skipped: list[Skipped] = []
    if mesh is not None:
        stages = MeshShape.of(mesh).get(STAGE_AXIS, 1)
    if offload_layers:
        problem = offload_layers_problem(offload_layers, config.layers, stages or 1)
        if problem is None and (mode != Mode.TRAIN or hw.host_memory_bytes <= 0):
            problem = f"offload_layers={offload_layers}: " + (
                "a forward pass keeps no activations for a backward"
                if mode != Mode.TRAIN
                else f"hardware {hw.name!r} has no host memory (host_memory_bytes=0)"
            )
            problem += "; give offload_layers=0"
        if problem is not None:
            raise PlanError(problem, param="offload_layers")
        stages = 1
    stage_counts = interleaved_stage_options(
        config,
        mode,
        stage_options(config, devices, mode, stages),
        virtual_stages,
        microbatches,
        fixed=stages is not None,
        pipeline_split=split,
    )
    all_candidates = candidates(names, devices, stage_counts, mesh, node_size=hw.node_size)
    if split.accounted:
        all_candidates = [replace(c, pipeline_split=split) for c in all_candidates]
    if offload_layers:
        all_candidates = [replace(c, offload_layers=offload_layers) for c in all_candidates]
    remats = remat_options(mode, remat, flash_attention, hw)
    if config.is_moe or config.is_mla:
        remats = moe_remats(remats, config, asked=remat is not None)
        names = moe_strategies(names, asked=True, experts=config.is_moe)
    elif remat is not None:
        remats = runnable_remats(remats, config)
    if config.is_mla and matmul_dtype == MatmulDtype.FP8:
        raise PlanError(
            "matmul_dtype='fp8': the planner prices latent attention's matmuls in 16 bits "
            "(its casts are counted for the dense decoder's projections); give "
            "matmul_dtype='bfloat16'",
            param="matmul_dtype",
        )
    if not config.is_moe:
        names = dense_strategies(names)
    if offload_optimizer and (mode != Mode.TRAIN or hw.host_memory_bytes <= 0):
        why = (
            "a forward pass has no optimizer state"
            if mode != Mode.TRAIN
            else (f"hardware {hw.name!r} has no host memory (host_memory_bytes=0)")
        )
        raise PlanError(
            f"offload_optimizer=True: {why}; leave it None or False",
            param="offload_optimizer",
        )
    pairs = len(all_candidates)  # strategy-and-mesh pairs, each vocabulary choice of one
    screened: list[Screened] = []
    for cand in _vocab_options(all_candidates, config, vocab_split):
        base = stage_config(config, cand, flash_attention=flash_attention)
        try:
            placement = cand.strategy_record.place(base, abstract_mesh(cand.stage_mesh))
        except StrategyError as e:
            if not (cand.vocab_split and vocab_split is None):  # the unsplit one speaks
                reason = SkipReason.DIVISIBILITY
                skipped.append(Skipped(cand.strategy, cand.mesh_spec, reason, str(e)))
            continue
        counts = _microbatch_options(placement, mode, microbatches)
        schedules = [
            (m, v)
            for m in counts
            for v in virtual_stage_options(config.layers, cand.stages, m, virtual_stages, split)
        ]

        screened_on_placement = partial(
            screen,
            placement=placement,
            config=config,
            hw=hw,
            mode=mode,
            bytes_per_param=bytes_per_param,
            flash_attention=flash_attention,
            matmul_dtype=matmul_dtype,
            fp8_saved_inputs=saved,
            fp8_params=fp8_params,
            memo={},
            parts={},
        )
        options = [
            screened_on_placement(replace(cand, microbatches=m, remat=r, virtual_stages=v))
            for m, v in schedules
            for r in remats
        ]
        if not options:
            per_shard = placement.config.batch // data_ways(placement)
            why = (
                f"virtual_stages={virtual_stages}: the interleaved schedule needs the "
                f"micro-batches a multiple of the {cand.stages} stages, and the {per_shard} "
                f"sequences of a data shard split into {or_list(counts)}"
                if counts
                else f"microbatches={microbatches} does not divide the {per_shard} "
                f"sequence{'s' if per_shard != 1 else ''} of a data shard (batch "
                f"{placement.config.batch} over {data_ways(placement)}): give microbatches "
                f"dividing {per_shard}, or a batch of a multiple of "
                f"{(microbatches or 1) * data_ways(placement)}"
            )
            skipped.append(Skipped(cand.strategy, cand.mesh_spec, SkipReason.DIVISIBILITY, why))
            continue
        if offload_optimizer is True or (
            offload_optimizer is None and mode == Mode.TRAIN and hw.host_memory_bytes > 0
        ):
            # What does not fit the device may fit with the optimizer state on the host.
            moved = [
                replace(s.candidate, offload_optimizer=True)
                for s in options
                if offload_optimizer or not s.fits
            ]
            options = [s for s in options if not offload_optimizer] + [
                screened_on_placement(c) for c in moved
            ]
        state = min(s.memory.model_state for s in options)
        if not memory_fits(state, hw.memory_bytes):
            what = (
                "parameters, gradients and optimizer state" if mode == Mode.TRAIN else "parameters"
            )
            skipped.append(
                Skipped(
                    cand.strategy,
                    cand.mesh_spec,
                    SkipReason.MEMORY,
                    f"{'with the vocabulary split over model, ' if cand.vocab_split else ''}"
                    f"{what} need {format_bytes(state)} per device, more than the "
                    f"{format_memory(hw.memory_bytes)} of one {hw.name}; shard them over more "
                    f"devices (fsdp, fsdp_tp, zero2) or use a device with more memory",
                )
            )
        screened.extend(options)
    return sorted(screened, key=_screen_key(names)), skipped, pairs


def _vocab_options(
    cands: Sequence[Candidate], config: ModelConfig, vocab_split: bool | None
) -> list[Candidate]:
    """Each candidate whose strategy can split the vocabulary over ``model``
    (:meth:`~shardscope._src.sharding.strategies.Strategy.with_vocab_split`) with it split
    (True), without (False), or both (None); the others as they are."""
    if config.vocab is None or vocab_split is False:
        return list(cands)
    out = []
    for c in cands:
        can = get_strategy(c.strategy).splits_vocab
        if not (can and vocab_split):
            out.append(c)
        if can:
            out.append(replace(c, vocab_split=True))
    return out


def estimate(
    candidate: Candidate,
    config: ModelConfig,
    hardware: str | Hardware = "h100",
    *,
    mode: str = Mode.TRAIN,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    matmul_dtype: str = MatmulDtype.BFLOAT16,
    fp8_saved_inputs: str | None = None,
    fp8_params: int | None = None,
) -> Screened:
    """One candidate (strategy, mesh, micro-batches, recomputation; a ``stage`` axis for
    pipeline stages) estimated without compiling: its memory per device and step time
    (``matmul_dtype="fp8"``: the layers' matmuls in fp8, their linear layers' inputs kept
    as ``fp8_saved_inputs`` says, and their weights kept in fp8 as ``fp8_params`` says,
    see :func:`screen`; refused with 16-bit matmuls).

    A 7B model trained with FSDP on 64 H100s, 128 sequences in 2 micro-batches per data shard,
    with full recomputation:

    >>> from shardscope._src.model.presets import model_preset
    >>> c = Candidate("fsdp", (("data", 64),), microbatches=2, remat="full")
    >>> s = estimate(c, model_preset("7b").config(batch=128))
    >>> s.fits, f"{s.memory.total / 2**30:.1f} GiB", f"{s.time.step_s:.2f} s"
    (True, '4.0 GiB', '1.06 s')
    """

    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    saved = check_fp8_saved_inputs(fp8_saved_inputs, matmul_dtype)
    fp8_params = check_fp8_params(fp8_params, matmul_dtype, saved)
    base = stage_config(config, candidate, flash_attention=flash_attention)
    placement = candidate.strategy_record.place(base, abstract_mesh(candidate.stage_mesh))
    return screen(
        candidate,
        placement,
        config,
        hw,
        mode,
        bytes_per_param,
        flash_attention,
        matmul_dtype=matmul_dtype,
        fp8_saved_inputs=saved,
        fp8_params=fp8_params,
    )


def _screen_key(names: Sequence[str]) -> Callable[[Screened], tuple[Any, ...]]:
    def key(s: Screened) -> tuple[Any, ...]:
        c = s.candidate
        return (
            not s.fits,
            s.step_time_s if s.fits else s.memory.total,
            s.memory.total,
            names.index(c.strategy),
            tuple(c.sizes.values()),
            c.microbatches,
            c.virtual_stages,
        )

    return key


def to_compile(
    ranked: Sequence[Screened], top: int, every: Sequence[str] | None = None
) -> list[Screened]:
    """The screened candidates worth compiling, in rank order: the best schedule of each of
    the ``top`` best strategy-and-mesh pairs, and the best plan of every strategy of
    ``every`` (None: all) that fits (so that the table holds each strategy's best; the best
    of :data:`VALIDATED_STRATEGIES` also has its compiled communication checked against the
    formula), or, when nothing fits, the best of every such strategy. A strategy left out
    of ``every`` (a default sweep's compositions,
    :data:`~shardscope._src.plan.request.COMPOSED_DEFAULTS`) is compiled only among the
    ``top`` pairs: screening more strategies compiles no more plans."""
    best: dict[tuple[str, str], Screened] = {}
    for s in ranked:
        best.setdefault((s.candidate.strategy, s.candidate.mesh_spec), s)
    pairs = list(best.values())  # still in rank order
    chosen = {id(s): s for s in pairs[:top]}
    any_fits = any(s.fits for s in pairs)
    seen: set[str] = set()
    for s in pairs:
        name = s.candidate.strategy
        if name in seen or (any_fits and not s.fits) or (every is not None and name not in every):
            continue
        seen.add(name)
        chosen.setdefault(id(s), s)
    order = {id(s): i for i, s in enumerate(ranked)}
    return sorted(chosen.values(), key=lambda s: order[id(s)])
