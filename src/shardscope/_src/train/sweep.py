"""The planner's front door: every strategy and mesh shape for a model on N devices, compiled,
audited, estimated and ranked. Plain data in, plain data out: the records are in
:mod:`~shardscope._src.plan.types`, the renderers in :mod:`~shardscope._src.render.plan` and
:mod:`~shardscope._src.render.plan_plot`.

A sweep has four steps:

1. **Enumerate** candidates: each strategy with each factorization of N over its roles, with
   its schedules (:mod:`~shardscope._src.train.candidates`).
2. **Filter** without compiling: a candidate whose dimensions do not divide is skipped, one
   whose model state alone exceeds the device memory is skipped for memory; the rest are
   estimated (memory per device, the step time of :mod:`~shardscope._src.train.timing`) and the
   best chosen for compiling. Both need only an abstract mesh, so this runs without any device.
3. **Compile** each chosen plan from abstract arguments (nothing allocated, layers under
   ``lax.scan``) and audit the compiled program, in this process or in a pool of worker
   processes that each simulate N CPU devices (:mod:`~shardscope._src.plan.compile`); with a
   target's compiler, compile the leading plans again (:mod:`~shardscope._src.train.target`).
4. **Price** and rank: a compiled plan's step is the time model's schedule with the compiled
   program's matmul FLOPs (counted from its HLO) and collectives in place of the formula's,
   each collective priced by the one pricing of :mod:`~shardscope._src.cost.links`
   (:func:`~shardscope._src.train.timing.compiled_step`), and the plans rank by it (the
   screening estimate is kept beside it, and a note says where their FLOPs differ); memory
   from the analytic formulas (the compiled CPU numbers beside them), the ratio to the lower
   bound of :mod:`shardscope._src.bounds`, and the compiled communication validated against
   the formula (:mod:`~shardscope._src.train.validate`).

What the compiler of a plan does that the formulas do not assume is read from its record
(``Capabilities``) and reported: XLA:CPU runs bf16 arithmetic in f32 and moves f32 through
the collectives (the plan counts them at the model's 2 bytes per element), and a compiler that
does not dependably form reduce-scatters (XLA:CPU never, XLA:TPU for some steps) all-reduces
and slices, twice the bytes (the plan keeps the compiled bytes and says so).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shardscope._src.base.comm import REDUCE_SCATTER, format_bytes
from shardscope._src.base.devices import MAX_CPU_DEVICES
from shardscope._src.base.errors import PlanError
from shardscope._src.base.notes import Note
from shardscope._src.cost.memory import memory_fits
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import Mode, ModelConfig
from shardscope._src.model.presets import MODEL_PRESETS, is_preset, model_preset
from shardscope._src.plan.collectives import axis_comm, bound_time
from shardscope._src.plan.compile import COMPILE_OPTIONS, Progress, default_workers
from shardscope._src.plan.estimates import MatmulDtype, PipelineSplit, model_flops, settings_dict
from shardscope._src.plan.notes import (
    BesideBestValues,
    ExpertsUnsplitValues,
    FitOnEstimateValues,
    Fp8MatmulsValues,
    MeshReadValues,
    NotCompiledValues,
    PipelineStageValues,
    PlanNote,
    ReduceScatterValues,
    TimeModelValues,
    WidenedValues,
    disagree,
)
from shardscope._src.plan.rank import memory_time_front, step_rank_key
from shardscope._src.plan.request import (
    COMPOSED_DEFAULTS,
    DEFAULT_REQUEST,
    DEFAULT_STRATEGIES,
    MODEL_DIMS,
    PlanRequest,
    check_dims,
    with_routing,
)
from shardscope._src.plan.types import Skipped, SkipReason
from shardscope._src.sharding.strategies import ALL_STRATEGIES, get_strategy
from shardscope._src.targets.capabilities import CPU_COMPILER
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.hardware import hardware as get_hardware
from shardscope._src.targets.specs import CPU_TARGET
from shardscope._src.train.candidates import (
    MOE_PRICED,
    crossing_axes,
    indivisible_mesh_error,
    maxtext_mesh,
    moe_remats,
    moe_strategies,
    pinned_mesh,
    remat_options,
    runs_on,
    screen_all,
    stage_config,
    to_compile,
)
from shardscope._src.train.compile import compile_all
from shardscope._src.train.target import check_compiler, compiler_notes, recompile_on_target
from shardscope._src.train.timing import compiled_step, substitutes_reduce_scatter
from shardscope._src.train.timing import describe as timing_constants
from shardscope._src.train.types import (
    STAGE_AXIS,
    Candidate,
    CompiledFacts,
    Plan,
    PlanResult,
    Screened,
    StageProgram,
)
from shardscope._src.train.validate import (
    compiled_flops,
    compiled_notes,
    flops_note,
    plan_compiler,
    reduces_per_microbatch,
    validations,
)

#: The most simulated devices the program of one plan may need (see ``MAX_CPU_DEVICES``):
#: a pipelined plan compiles one stage, so a plan may have more devices than this.
MAX_DEVICES = MAX_CPU_DEVICES
#: The largest array (bytes, 4 per element) a plan accepts; dimensions stop at ``MAX_DIM``.
MAX_ARRAY_BYTES = 2**50


def resolve_config(request: PlanRequest) -> tuple[str, ModelConfig]:
    """``(name, config)`` of the request's model: a preset (with the dimensions given
    overriding it) or the dimensions given.

    The default batch is one sequence per device.
    """
    name, config = _resolve(request)
    check_dims({k: getattr(config, k) for k in ("batch", "seq", *MODEL_DIMS)})
    _check_arrays(config)
    return name, config


def _check_arrays(c: ModelConfig) -> None:

    v = c.vocab or 0
    largest = 4 * max(
        c.batch * c.seq * max(c.d_model, c.ff, v),  # activations and logits
        c.batch * c.heads * c.seq * c.seq,  # attention scores
        c.layers * c.d_model * max(3 * c.d_model, c.ff),  # stacked weights
        v * c.d_model,  # embeddings
    )
    if largest > MAX_ARRAY_BYTES:
        raise PlanError(
            f"this model's largest array would hold {format_bytes(largest)} at 4 bytes per "
            f"element, more than the {format_bytes(MAX_ARRAY_BYTES)} the planner compiles; "
            f"choose a smaller batch, seq or width"
        )


def _resolve(r: PlanRequest) -> tuple[str, ModelConfig]:
    name, config = _resolve_model(r)
    return name, with_routing(config, r)


def _resolve_model(r: PlanRequest) -> tuple[str, ModelConfig]:
    dims = r.dims
    if isinstance(r.model, ModelConfig):
        extra: dict[str, Any] = {k: v for k, v in dims.items() if v is not None}
        if r.batch is not None:
            extra["batch"] = r.batch
        if r.seq is not None:
            extra["seq"] = r.seq
        return "custom", replace(r.model, scan=True, **extra)
    batch = r.devices if r.batch is None else r.batch
    if r.model is not None:
        preset = model_preset(r.model)
        return preset.name, preset.config(batch=batch, seq=r.seq, dtype=r.dtype, **dims)
    missing = [k for k in ("d_model", "heads", "ff", "layers") if dims.get(k) is None]
    if missing:
        raise PlanError(
            f"a model needs a preset (model= one of {', '.join(MODEL_PRESETS)}) or its "
            f"shape; missing {', '.join(missing)}",
            param=tuple(missing),
        )
    fields: dict[str, Any] = {k: v for k, v in dims.items() if v is not None}
    return "custom", ModelConfig(batch=batch, seq=r.seq or 2048, dtype=r.dtype, scan=True, **fields)


def plan(
    model: str | ModelConfig | None = DEFAULT_REQUEST.model,
    devices: int = DEFAULT_REQUEST.devices,
    *,
    progress: Progress | None = None,
    **knobs: Any,
) -> PlanResult:
    """Plans ``model`` on ``devices`` accelerators: every strategy, mesh shape, micro-batch
    count, recomputation and pipeline stage count estimated, the best compiled and ranked.

    :func:`plan_request` of the :class:`PlanRequest` of these arguments.

    Args:
        model, devices and every keyword but ``progress``: the field of
            :class:`PlanRequest` of that name, with its default (the preset ``7b`` on 8
            devices, batch one sequence per device, ``train`` on ``h100``, every strategy
            and schedule searched); see there.
        progress: called as ``progress(done, total, label)`` while compiling.

    Every candidate is first estimated without compiling (memory per device, and the step
    time of :mod:`shardscope._src.train.timing`); only the best are compiled and audited.

    Returns:
        A :class:`PlanResult`: the compiled ``plans`` ranked by the compiled program's step
        time (plans that do not fit the device memory after those that do), ``skipped`` with
        reasons, ``validations``, how many candidates were ``screened``, and the ``closest``
        one when none fits. No plan is not an error: ``empty_reason`` says why.

    Raises:
        PlanError: an unknown preset, a bad device count or mode.
        TypeError: a keyword that is not a field of :class:`PlanRequest`.

    Not run as a doctest (it compiles plans; the planner tests run sweeps):

    >>> result = plan("tiny", 8, workers=0)  # doctest: +SKIP
    >>> result.best.label  # doctest: +SKIP
    'dp data=8'
    """
    request = PlanRequest(model, devices, **knobs)
    return plan_request(request, progress)


def plan_request(request: PlanRequest, progress: Progress | None = None) -> PlanResult:
    """Plans what ``request`` asks for (see :func:`plan`, which builds the request from its
    arguments); ``progress`` is called as ``progress(done, total, label)`` while compiling.

    Not run as a doctest (it compiles plans; the planner tests run sweeps):

    >>> result = plan_request(PlanRequest("tiny", 8, workers=0))  # doctest: +SKIP
    >>> result.best.label  # doctest: +SKIP
    'dp data=8'
    """

    r = request
    start = time.perf_counter()
    names = r.strategy_names
    hw = get_hardware(r.hardware, **r.hardware_overrides)
    compiler = check_compiler(r.compiler, hw, r.devices, r.target_plans)
    model_name, config = resolve_config(r)
    if config.is_moe or config.is_mla:
        names = moe_strategies(names, asked=r.strategies is not None, experts=config.is_moe)
    _check_bytes_per_param(r.bytes_per_param, config, r.mode)
    devices, mode, stages = r.devices, r.mode, r.stages
    pinned = None
    read_note: list[Note] = []
    if r.mesh is not None:
        # a mesh on which none of the default strategies runs plans those that do, of the
        # strategies the model is planned under
        takes = MOE_PRICED if config.is_moe or config.is_mla else tuple(ALL_STRATEGIES)
        allowed = names if r.strategies is not None else takes
        pinned = pinned_mesh(r.mesh, devices, allowed, takes=takes, asked=r.strategies is not None)
        if r.strategies is None and not runs_on(pinned, devices, names):
            names = tuple(runs_on(pinned, devices, allowed))
            if not config.is_moe and names and all(get_strategy(n).expert_parallel for n in names):
                raise PlanError(
                    f"mesh={pinned.spec!r}: its 'expert' axis splits a mixture's routed "
                    f"experts, and {model_name} has none; give a mesh without one (e.g. "
                    f"data={devices})",
                    param="mesh",
                )
        given = MeshShape.of(r.mesh)
        if given != pinned:
            values = MeshReadValues(
                given=given.spec,
                read=pinned.spec,
                node_size=hw.node_size,
                given_crossing=crossing_axes(given, hw.node_size),
                read_crossing=crossing_axes(pinned, hw.node_size),
                maxtext=maxtext_mesh(given) is not None,
            )
            read_note.append(Note(PlanNote.MESH_READ, values, ("mesh",)))
    if pinned is not None and stages is not None and stages != pinned.get(STAGE_AXIS, 1):
        raise PlanError(
            f"stages={stages} and mesh={pinned.spec!r} disagree: the mesh's "
            f"{STAGE_AXIS} axis sets the pipeline stages; give one of them",
            param=("stages", "mesh"),
        )
    if pinned is not None and (r.virtual_stages or 1) > 1 and STAGE_AXIS not in pinned:
        raise PlanError(
            f"virtual_stages={r.virtual_stages}: interleaving splits the layers of each "
            f"pipeline stage, and mesh={pinned.spec!r} has no {STAGE_AXIS} axis; "
            f"give a mesh with one (e.g. {STAGE_AXIS}=2,...) or virtual_stages=1",
            param=("virtual_stages", "mesh"),
        )

    ranked_screen, skipped, n_candidates = _screen(
        r,
        config,
        hw,
        names,
        remat=r.remat,
        microbatches=r.microbatches,
        stages=stages,
        mesh=pinned,
        virtual_stages=r.virtual_stages,
    )
    indivisible = all(k.reason == SkipReason.DIVISIBILITY for k in skipped)
    if pinned is not None and not ranked_screen and skipped and indivisible:
        # a pinned mesh that splits a dimension of the model it does not divide: the mesh to
        # choose, in one line, before anything is written
        refused = indivisible_mesh_error(
            config,
            pinned,
            skipped[0].strategy,
            flash_attention=r.flash_attention,
            preset=model_name if isinstance(r.model, str) and is_preset(r.model) else None,
            written=MeshShape.of(r.mesh).spec,
        )
        if refused is not None:
            raise refused
    if r.beside_best:
        read_note.extend(_beside_best(r, config, hw, ranked_screen))
    ranked_screen, too_big = _simulable(ranked_screen, devices)
    skipped += too_big
    # a default sweep's compositions are screened, and compiled only among the best pairs
    every = names if r.strategies is not None else [n for n in names if n not in COMPOSED_DEFAULTS]
    todo = to_compile(
        [s for s in ranked_screen if memory_fits(s.memory.model_state, hw.memory_bytes)],
        r.compile_top,
        every,
    )
    left = not_compiled(ranked_screen, todo)
    if left is not None:
        read_note.append(left)
    simulated = max((_stage_devices(s) for s in todo), default=1)
    n_workers = default_workers(simulated) if r.workers is None else r.workers
    n_workers = min(n_workers, len(todo), os.cpu_count() or 1)  # more would only wait
    plans, failed = _compile_plans(
        todo, config, mode, devices, simulated, hw, n_workers, progress, r.flash_attention
    )

    order = sorted(plans, key=step_rank_key(names))
    if compiler.is_accelerator:
        order = recompile_on_target(
            order, hw, compiler, r.target_plans, progress, step_rank_key(names)
        )
    front = memory_time_front(order)
    ranked = tuple(replace(p, rank=i + 1, pareto=i in front) for i, p in enumerate(order))
    settings = {
        **settings_dict(r.bytes_per_param, r.flash_attention),
        "compile_options": dict(COMPILE_OPTIONS),
        "strategies": list(names),
        "remat": list(_remats(config, mode, r, hw)),
        "offload_optimizer": r.offload_optimizer,
        "vocab_split": r.vocab_split,
        "imbalance": r.imbalance,
        "dispatch_once": r.dispatch_once,
        "weight_activations": r.weight_activations,
        "microbatches": r.microbatches,
        "stages": stages,
        "virtual_stages": r.virtual_stages,
        # written where the embedding or the loss is counted: old results read the same
        **(
            {"pipeline_split": str(r.pipeline_split)}
            if PipelineSplit.parse(r.pipeline_split).accounted
            else {}
        ),
        **({"offload_layers": r.offload_layers} if r.offload_layers else {}),
        "mesh": None if pinned is None else pinned.spec,
        "compile_top": r.compile_top,
        "matmul_dtype": r.matmul_dtype,
        "fp8_saved_inputs": r.fp8_saved_inputs,
        # written where the weights are kept in fp8: old results read the same
        **({"fp8_params": r.fp8_params} if r.fp8_params is not None else {}),
        "time_model": timing_constants(hw, r.matmul_dtype),
    }
    return PlanResult(
        model=model_name,
        config=config,
        devices=devices,
        mode=mode,
        hardware=hw,
        settings=settings,
        plans=ranked,
        skipped=(*skipped, *failed),
        validations=validations(ranked),
        notes=tuple(
            read_note
            + _result_notes(config, hw, ranked, r.matmul_dtype, r.fp8_params, mode)
            + compiler_notes(compiler, ranked, hw)
        ),
        wall_s=time.perf_counter() - start,
        workers=n_workers,
        candidates=n_candidates,
        screened=len(ranked_screen),
        closest=_closest(ranked_screen),
        compiler=compiler,
    )


def _screen(
    r: PlanRequest, config: ModelConfig, hw: Hardware, names: Sequence[str], **layout: Any
) -> tuple[list[Screened], list[Skipped], int]:
    """:func:`screen_all` of ``config`` on the request's devices, mode, state, attention,
    precision, optimizer placement and vocabulary split, the ``layout`` (remat, mesh,
    micro-batches, stages, virtual stages) pinned as given and the rest searched."""
    return screen_all(
        config,
        r.devices,
        hw,
        names,
        mode=r.mode,
        bytes_per_param=r.bytes_per_param,
        flash_attention=r.flash_attention,
        offload_optimizer=r.offload_optimizer,
        matmul_dtype=r.matmul_dtype,
        vocab_split=r.vocab_split,
        fp8_saved_inputs=r.fp8_saved_inputs,
        pipeline_split=r.pipeline_split,
        offload_layers=r.offload_layers,
        fp8_params=r.fp8_params,
        **layout,
    )


def _beside_best(
    r: PlanRequest, config: ModelConfig, hw: Hardware, pinned: Sequence[Screened]
) -> list[Note]:
    """:data:`PlanNote.BESIDE_BEST` for a request that pins a layout: its fastest screened
    plan that fits beside the fastest that fits of every layout (every default strategy,
    mesh, recomputation, micro-batch count and pipeline schedule; the request's model,
    hardware, precision and state as given), both by the estimate; none where either has
    no plan that fits."""
    mine = next((s for s in pinned if s.fits), None)
    if mine is None:
        return []
    names: tuple[str, ...] = DEFAULT_STRATEGIES
    if config.is_moe or config.is_mla:
        names = moe_strategies(names, asked=False)
    every, _, _ = _screen(r, config, hw, names)
    best = min((s for s in every if s.fits), key=lambda s: s.step_time_s, default=None)
    if best is None:
        return []
    return [beside_best_note(mine, best)]


def beside_best_note(mine: Screened, best: Screened) -> Note:
    """:data:`PlanNote.BESIDE_BEST` of the screened plan ``mine`` beside ``best`` (``mine``
    itself where ``best`` is no faster): their labels, steps and the parts of each step
    (:meth:`~shardscope._src.train.timing.StepTime.parts`)."""
    if best.step_time_s >= mine.step_time_s:
        best = mine
    ours, theirs = mine.time.parts(), best.time.parts()
    values = BesideBestValues(
        pinned=mine.candidate.label,
        best=best.candidate.label,
        pinned_s=mine.step_time_s,
        best_s=best.step_time_s,
        parts=tuple((part, ours[part], theirs[part]) for part in ours),
    )
    return Note(PlanNote.BESIDE_BEST, values)


def _remats(config: ModelConfig, mode: str, r: PlanRequest, hw: Hardware) -> tuple[str, ...]:
    """The recomputations the sweep tried (a mixture of experts' or latent attention's are
    the ones its estimates price)."""
    remats = remat_options(mode, r.remat, r.flash_attention, hw)
    if config.is_moe or config.is_mla:
        return moe_remats(remats, config, asked=r.remat is not None)
    return remats


def _check_bytes_per_param(bytes_per_param: int, config: ModelConfig, mode: str) -> None:
    if bytes_per_param < 2 * config.itemsize and mode == Mode.TRAIN:
        raise PlanError(
            f"bytes_per_param={bytes_per_param} is less than a parameter and its gradient at "
            f"{config.dtype} ({2 * config.itemsize} bytes); use at least {2 * config.itemsize}",
            param="bytes_per_param",
        )


def _stage_devices(s: Screened) -> int:
    """The devices the program of ``s`` (one pipeline stage's) runs on."""
    return s.candidate.stage_mesh.devices


def _simulable(ranked: list[Screened], devices: int) -> tuple[list[Screened], list[Skipped]]:
    """The candidates whose program the CPU backend can compile (one stage's, on at most
    :data:`MAX_DEVICES` simulated devices), and the others as skipped; none at all is an
    error that names the largest count and what splits a program."""
    fit = [s for s in ranked if _stage_devices(s) <= MAX_DEVICES]
    over = [s for s in ranked if _stage_devices(s) > MAX_DEVICES]
    if ranked and not fit:
        least = min(_stage_devices(s) for s in over)
        raise PlanError(
            f"devices={devices}: every candidate's program needs more than the {MAX_DEVICES} "
            f"simulated devices the CPU backend compiles for in one process (the smallest "
            f"needs {least}); pipeline stages split it (stages= dividing the "
            f"devices), or plan fewer devices",
            param=("devices", "stages"),
        )
    seen: set[tuple[str, str]] = set()
    skipped = []
    for s in over:
        key = (s.candidate.strategy, s.candidate.mesh_spec)
        if key not in seen:
            seen.add(key)
            skipped.append(
                Skipped(
                    *key,
                    SkipReason.SIMULATION,
                    f"its program needs {_stage_devices(s)} simulated devices; the CPU "
                    f"backend compiles for at most {MAX_DEVICES} in one process",
                )
            )
    return fit, skipped


def _compile_plans(
    todo: Sequence[Screened],
    config: ModelConfig,
    mode: str,
    devices: int,
    simulated: int,
    hw: Hardware,
    workers: int,
    progress: Progress | None,
    flash_attention: bool,
) -> tuple[list[Plan], list[Skipped]]:
    """The plans of the screened candidates ``todo``, compiled (in this process or ``workers``
    worker processes), each with the bound it is validated against and the program it
    compiled; and the candidates whose compile failed."""
    programs = {s.candidate: _program(s.candidate, config, mode, flash_attention) for s in todo}
    facts = compile_all(programs, simulated, workers, progress)
    flops_per_device = model_flops(config, mode) / devices
    plans: list[Plan] = []
    failed: list[Skipped] = []
    for s in todo:
        got = facts[s.candidate]
        if isinstance(got, BaseException):
            message = f"{type(got).__name__}: {got}"
            failed.append(
                Skipped(s.candidate.strategy, s.candidate.mesh_spec, SkipReason.ERROR, message)
            )
            continue
        p = _compiled_plan(s, got, hw, programs[s.candidate], flops_per_device, config.layers)
        plans.append(p)
    return plans, failed


def _program(
    cand: Candidate, config: ModelConfig, mode: str, flash_attention: bool
) -> StageProgram:
    """The program ``cand`` compiles: its strategy on one stage's mesh, one stage of the
    model (:func:`~shardscope._src.train.candidates.stage_config`), its micro-batches."""
    stage = stage_config(config, cand, flash_attention=flash_attention)
    return StageProgram(cand.strategy_record, cand.stage_mesh, stage, mode, cand.microbatches)


def _compiled_plan(
    s: Screened,
    got: CompiledFacts,
    hw: Hardware,
    program: StageProgram,
    flops_per_device: float,
    layers: int,
) -> Plan:
    """The plan of a screened candidate from the compiled facts of its ``program``
    (``layers``: the whole model's, of which the program holds one pipeline stage's)."""
    cand, bound, stage = s.candidate, s.bound, program.config
    sizes = program.mesh.sizes
    comm = axis_comm(hw, sizes, got.collectives, bound)
    # The sweep compiles its plans on the CPU backend (a target recompiles the leaders).
    notes = compiled_notes(got, bound, got.collectives, CPU_COMPILER)
    if cand.microbatches > 1 and reduces_per_microbatch(got, bound, cand):
        notes.append(Note(PlanNote.PER_MICROBATCH_REDUCTION))
    if cand.stages > 1:
        stage_values = PipelineStageValues(
            stages=cand.stages,
            layers=stage.layers,
            of_layers=layers,
            virtual_stages=cand.virtual_stages if cand.virtual_stages > 1 else None,
            devices=math.prod(sizes.values()),
            pipeline_split=str(cand.pipeline_split) if cand.split.accounted else None,
        )
        notes.append(Note(PlanNote.PIPELINE_STAGE, stage_values))
    # The fit is judged on the estimate; where the CPU compiler's memory stands far from it,
    # the plan says so and why.
    judged = FitOnEstimateValues(
        compiler=CPU_COMPILER.compiler,
        compiled_bytes=got.memory.held_by(CPU_TARGET),
        optimizer_bytes=s.memory.device_optimizer,
        estimate_bytes=s.memory.total,
        stages=cand.stages,
    )
    if disagree(judged.other_bytes, judged.estimate_bytes):
        notes.append(Note(PlanNote.FIT_ON_ESTIMATE, judged))
    # The step as the compiled program has it: the time model's schedule, its own matmul
    # FLOPs and collectives priced in place of the formula's.
    step, flops, formula = s.time, None, None
    if s.pricing is not None:
        flops = compiled_flops(got.hlo_flops, got.exact)
        formula = s.pricing.work.step_matmul_flops
        step = compiled_step(hw, s.pricing, got.collectives, bound, CPU_COMPILER, flops)
        flops_differ = flops_note(formula, flops, CPU_COMPILER)
        if flops_differ is not None:
            notes.append(flops_differ)
    return Plan(
        strategy=cand.strategy,
        summary=get_strategy(cand.strategy).summary,
        mesh=cand.sizes,
        memory=s.memory,
        compiled_memory=got.memory,
        memory_limit_bytes=int(hw.memory_bytes),
        host_memory_limit_bytes=int(hw.host_memory_bytes),
        collectives=got.collectives,
        comm=comm,
        bound_bytes_per_device=bound.traffic_bytes,
        bound_comm_time_s=bound_time(hw, sizes, bound),
        comm_time_s=sum(a.time_s for a in comm),
        flops_per_device=flops_per_device,
        compute_time_s=step.compute_s,
        notes=tuple(notes),
        analysis_s=got.analysis_s,
        timing={"lower_s": got.lower_s, "compile_s": got.compile_s, "audit_s": got.audit_s},
        exact=got.exact,
        microbatches=cand.microbatches,
        remat=cand.remat,
        offload_optimizer=cand.offload_optimizer,
        vocab_split=cand.vocab_split,
        stages=cand.stages,
        virtual_stages=cand.virtual_stages,
        pipeline_split=cand.pipeline_split,
        offload_layers=cand.offload_layers,
        time=step,
        estimated_time=s.time,
        matmul_flops_per_device=flops,
        estimated_matmul_flops_per_device=formula,
        pricing=s.pricing,
        bound=bound,
        candidate=cand,
        program=program,
    )


def _closest(ranked_screen: Sequence[Screened]) -> dict[str, Any] | None:
    """The candidate needing the least memory per device, when the best does not fit."""
    if not ranked_screen or ranked_screen[0].fits:
        return None
    small = min(ranked_screen, key=lambda s: s.memory.total)
    return {"label": small.candidate.label, "bytes": small.memory.total}


def _expert_axis(plan: Plan) -> bool:
    """Whether ``plan`` splits a mixture's experts over an expert axis of more than one
    device."""
    return plan.mesh.get("expert", 1) > 1


def not_compiled(ranked: Sequence[Screened], todo: Sequence[Screened]) -> Note | None:
    """The strategies with a screened plan that fits and none compiled, each named with its
    best screened plan (``ranked`` is in rank order) and that plan's step by the estimate;
    None where every such strategy has a compiled plan."""
    compiled = {s.candidate.strategy for s in todo}
    best: dict[str, Screened] = {}
    for s in ranked:
        name = s.candidate.strategy
        if s.fits and name not in compiled:
            best.setdefault(name, s)
    if not best:
        return None
    values = NotCompiledValues(
        strategies=tuple(best),
        labels=tuple(s.candidate.label for s in best.values()),
        estimates=tuple(s.step_time_s for s in best.values()),
    )
    return Note(PlanNote.NOT_COMPILED, values, ("compile_top", "strategies"))


def experts_unsplit_note(plans: Sequence[Plan]) -> Note | None:
    """A mixture's plans without an expert axis that rank above the best with one (all of
    them where none has one), whose estimate the published sweeps of such a layout do not
    bear out, named beside that best; None where there are none: below it they would not
    change what the user runs."""
    split = min((p for p in plans if _expert_axis(p)), key=lambda p: p.rank, default=None)
    unsplit = tuple(
        p.label for p in plans if not _expert_axis(p) and (split is None or p.rank < split.rank)
    )
    if not unsplit:
        return None
    values = ExpertsUnsplitValues(
        labels=unsplit,
        split=None if split is None else split.label,
        split_rank=None if split is None else split.rank,
    )
    return Note(PlanNote.EXPERTS_UNSPLIT, values)


def _result_notes(
    config: ModelConfig,
    hw: Hardware,
    plans: Sequence[Plan],
    matmul_dtype: str,
    fp8_params: int | None = None,
    mode: str = Mode.TRAIN,
) -> list[Note]:
    notes = [
        Note(PlanNote.ANALYTIC_MEMORY),
        Note(PlanNote.COMMUNICATION),
        Note(PlanNote.TIME_MODEL, TimeModelValues(hardware=hw)),
    ]
    if matmul_dtype == MatmulDtype.FP8:
        fp8 = Fp8MatmulsValues(
            name=hw.name,
            fp8_peak_flops=hw.fp8_peak_flops,
            fp8_matmul_fraction=hw.fp8_matmul_fraction,
            dtype=config.dtype,
            fp8_params=fp8_params,
        )
        notes.append(Note(PlanNote.FP8_MATMULS, fp8, ("matmul_dtype",)))
    if config.is_moe and mode == Mode.TRAIN:
        notes.append(Note(PlanNote.MIXTURE_STEP))
        if matmul_dtype == MatmulDtype.FP8:
            notes.append(Note(PlanNote.MIXTURE_FP8, params=("matmul_dtype",)))
    unsplit = experts_unsplit_note(plans) if config.is_moe else None
    if unsplit is not None:
        notes.append(unsplit)
    widened = {
        plan_compiler(p).compiler
        for p in plans
        if any(c.payload_bytes != c.cpu_payload_bytes for c in p.collectives)
    }
    if config.itemsize == 2:
        for compiler in sorted(widened):
            wide = WidenedValues(dtype=config.dtype, itemsize=2, compiler=compiler)
            notes.append(Note(PlanNote.WIDENED, wide))
    # A reduce-scatter row the bound has and the compiled program does not run, where its
    # compiler may leave one out on its own.
    short = {
        plan_compiler(p)
        for p in plans
        if any(a.kind == REDUCE_SCATTER and a.bound_bytes > 0 and a.count == 0 for a in p.comm)
    }
    for c in sorted(short, key=lambda c: c.compiler):
        if c.may_all_reduce_for_reduce_scatter:
            priced = hw.name if substitutes_reduce_scatter(hw, c) else None
            forms = ReduceScatterValues(
                compiler=c.compiler, forms=c.forms_reduce_scatter, priced_as=priced
            )
            notes.append(Note(PlanNote.NO_REDUCE_SCATTER, forms))
    return notes
