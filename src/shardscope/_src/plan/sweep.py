"""The planner: every strategy and mesh shape for a model on N devices, compiled, audited,
estimated and ranked. Plain data in, plain data out: the records are in ``_plan_types``,
compiling one plan in ``_plan_compile``, the renderers in ``_render_plan`` and ``_plot_plan``.

A sweep has four steps:

1. **Enumerate** candidates: each strategy with each factorization of N over its roles (a 1-D
   mesh ``data=N`` or ``model=N``; a 2-D mesh ``data=d,model=t`` with ``d, t >= 2``; more axes
   would give the same program, because the ``data`` role spans every non-model axis).
2. **Filter** without compiling: a candidate whose dimensions do not divide is skipped
   (the strategy's own :class:`StrategyError` says which), one whose model state (parameters,
   gradients, optimizer state) alone exceeds the device memory is skipped for memory.
   Both need only an abstract mesh, so this runs without any device.
3. **Compile** each remaining plan from abstract arguments (nothing allocated, layers under
   ``lax.scan``) and audit the compiled program, in this process or in a pool of worker
   processes that each simulate N CPU devices.
4. **Estimate** and rank: alpha-beta time of every compiled collective on the hardware preset,
   compute time from model FLOPs, memory from the analytic formulas (the compiled CPU
   numbers beside them), the ratio to the lower bound of :mod:`shardscope._src.bounds`.

Two things the CPU compiler does that GPU and TPU compilers do not are accounted for and
reported: it runs bf16 arithmetic in f32 and moves f32 through the collectives (the plan
counts them at the model's 2 bytes per element), and it forms no reduce-scatter (an all-reduce
plus a slice moves twice the bytes; the plan keeps the compiled bytes and says so).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardscope._src.base.comm import ALL_REDUCE, KINDS, REDUCE_SCATTER, format_bytes, latency_steps
from shardscope._src.base.deviceless import compiler_installed, require_compiler
from shardscope._src.base.devices import MAX_CPU_DEVICES
from shardscope._src.base.errors import PlanError, StrategyError, is_int
from shardscope._src.base.hardware import Hardware
from shardscope._src.base.hardware import hardware as get_hardware
from shardscope._src.base.notes import Note
from shardscope._src.base.targets import CPU, TARGETS, get_target, topology
from shardscope._src.bounds.terms import Bound
from shardscope._src.mesh import parse_mesh_spec
from shardscope._src.model.config import MAX_DIM, REMATS, ModelConfig
from shardscope._src.model.presets import MODEL_PRESETS, model_preset
from shardscope._src.plan.compile import COMPILE_OPTIONS, Progress, compile_all, default_workers
from shardscope._src.plan.estimates import (
    DEFAULT_BYTES_PER_PARAM,
    Schedule,
    crosses_nodes,
    data_ways,
    estimate_memory,
    model_flops,
    settings_dict,
)
from shardscope._src.plan.target import target_facts
from shardscope._src.plan.timing import (
    bound_comm,
    scheduled_bound,
    step_time,
    step_work,
)
from shardscope._src.plan.timing import (
    describe as timing_constants,
)
from shardscope._src.plan.types import (
    AxisComm,
    Candidate,
    CompiledFacts,
    Plan,
    PlanCollective,
    PlanNote,
    PlanResult,
    Screened,
    Skipped,
    SkipReason,
    Validation,
)
from shardscope._src.sharding.strategies import (
    STRATEGIES,
    abstract_mesh,
    get_strategy,
    mesh_spec_for,
)

#: The strategies a sweep tries unless told otherwise ("replicated" is never a useful plan).
DEFAULT_STRATEGIES = (
    "dp",
    "fsdp",
    "zero1",
    "zero2",
    "tp",
    "sp",
    "dp_tp",
    "zero1_tp",
    "fsdp_tp",
    "dp_sp",
)
#: How many of the best estimated strategy-and-mesh pairs a sweep compiles (besides the best
#: plan of each validated strategy).
DEFAULT_COMPILE_TOP = 3
#: Strategies whose compiled communication must match the analytic formula within 5%; every
#: strategy's best plan is validated and reported.
VALIDATED_STRATEGIES = ("dp", "fsdp", "tp")
#: How far the compiled bytes may be from the formula's and still "match".
VALIDATION_TOLERANCE = 0.05
#: The most simulated devices a plan may ask for (see ``MAX_CPU_DEVICES``).
MAX_DEVICES = MAX_CPU_DEVICES
MODES = ("train", "forward")
#: The largest array (bytes, 4 per element) a plan accepts; dimensions stop at ``MAX_DIM``.
MAX_ARRAY_BYTES = 2**50


# -- enumeration -----------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(
    strategies: Iterable[str], devices: int, stages: Sequence[int] = (1,)
) -> list[Candidate]:
    """Every mesh shape of ``devices`` for each strategy and pipeline stage count, in a
    stable order. With ``p > 1`` stages the mesh has a leading ``stage=p`` axis and the
    strategy's axes share the ``devices / p`` of one stage.

    >>> [c.label for c in candidates(["tp", "dp_tp"], 8)]
    ['tp model=8', 'dp_tp data=4,model=2', 'dp_tp data=2,model=4']
    >>> [c.label for c in candidates(["fsdp"], 8, (1, 2))]
    ['fsdp data=8', 'fsdp stage=2,data=4']
    """

    out = []
    for p in stages:
        n = devices // p
        for name in strategies:
            if len(get_strategy(name).roles) <= 1:
                shapes = [(n,)]
            else:
                shapes = [(n // t, t) for t in divisors(n) if 1 < t < n]
            for shape in shapes:
                spec = parse_mesh_spec(mesh_spec_for(name, shape))
                lead = (("stage", p),) if p > 1 else ()
                out.append(Candidate(name, lead + tuple(spec.items())))
    return out


#: The most pipeline stages a sweep tries unless told (more rarely pays on one job).
MAX_STAGES = 16
#: The most micro-batch counts a sweep tries per candidate (the largest divisors are kept).
MAX_MICROBATCH_OPTIONS = 8


def stage_options(
    config: ModelConfig, devices: int, mode: str, stages: int | None
) -> tuple[int, ...]:
    """Pipeline stage counts to try: 1, and (train, unless ``stages`` fixes one) every
    count up to :data:`MAX_STAGES` dividing both the layers and the devices."""
    if stages is not None:
        if not is_int(stages, 1):
            raise PlanError(f"stages={stages!r}: must be a positive integer")
        if config.layers % stages or devices % stages:
            raise PlanError(
                f"stages={stages}: pipeline stages must divide the {config.layers} layers and "
                f"the {devices} devices; choose one of "
                f"{', '.join(str(p) for p in divisors(config.layers) if devices % p == 0)}"
            )
        return (stages,)
    if mode != "train":
        return (1,)
    return tuple(
        p
        for p in divisors(min(config.layers, MAX_STAGES))
        if config.layers % p == 0 and devices % p == 0
    )


def _remat_options(
    mode: str, remat: str | Sequence[str] | None, flash_attention: bool
) -> tuple[str, ...]:
    """Recomputation choices to try. Selective recomputation drops the attention scores,
    which memory-efficient attention never keeps: with it, selective is no recomputation."""

    if mode != "train":
        return ("none",)
    if remat is None:
        return tuple(r for r in REMATS if not (flash_attention and r == "selective"))
    chosen = (remat,) if isinstance(remat, str) else tuple(remat)
    for r in chosen:
        if r not in REMATS:
            raise PlanError(f"remat={r!r}: choose from {', '.join(REMATS)}")
    return tuple(dict.fromkeys(chosen))


def stage_config(config: ModelConfig, cand: Candidate, *, flash_attention: bool) -> ModelConfig:
    """The program one device runs for ``cand``: one stage's layers, the whole batch, its
    recomputation, and blocked attention when the estimate assumes memory-efficient attention
    (so that the compiled program computes what the estimate counts)."""
    return replace(
        config,
        layers=config.layers // cand.stages,
        remat=cand.remat,
        attention="blocked" if flash_attention else "dense",
        scan=True,
    )


def _microbatch_options(bound: Any, mode: str, microbatches: int | None) -> list[int]:
    per_shard = bound.config.batch // data_ways(bound) if bound.config.batch else 0
    if mode != "train":
        return [1]
    if microbatches is not None:
        return [microbatches] if per_shard and per_shard % microbatches == 0 else []
    options = divisors(per_shard) if per_shard else []
    if len(options) > MAX_MICROBATCH_OPTIONS:
        options = [1, *options[-(MAX_MICROBATCH_OPTIONS - 1) :]]
    return options


def screen(
    cand: Candidate,
    bound: Any,
    config: ModelConfig,
    hw: Hardware,
    mode: str = "train",
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
) -> Screened:
    """Estimates ``cand`` without compiling: memory per device and the time model's step.

    ``bound`` is the strategy bound to one stage's program (:func:`stage_config`) on the
    stage's mesh; ``config`` the whole model.
    """
    sched = Schedule(cand.microbatches, cand.remat, cand.stages)
    mem = estimate_memory(
        bound,
        mode,
        bytes_per_param=bytes_per_param,
        flash_attention=flash_attention,
        schedule=sched,
    )
    need = scheduled_bound(bound, sched, mode)
    work = step_work(
        bound,
        sched,
        config,
        math.prod(cand.sizes.values()),
        hw,
        flash_attention=flash_attention,
        mode=mode,
    )
    return Screened(
        cand,
        mem,
        step_time(hw, work, bound_comm(hw, bound, need.terms)),
        need,
        int(hw.memory_bytes),
    )


def screen_all(
    config: ModelConfig,
    devices: int,
    hw: Hardware,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    *,
    mode: str = "train",
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    remat: str | Sequence[str] | None = None,
    microbatches: int | None = None,
    stages: int | None = None,
) -> tuple[list[Screened], list[Skipped], int]:
    """Every candidate of a sweep estimated without compiling, best first (those that fit
    the device memory by step time, then the rest by memory); the (strategy, mesh) pairs
    skipped and why (indivisible, or whose model state alone exceeds the memory: never
    compiled); and how many strategy-and-mesh candidates there were."""

    names = tuple(strategies)
    skipped: list[Skipped] = []
    all_candidates = candidates(names, devices, stage_options(config, devices, mode, stages))
    remats = _remat_options(mode, remat, flash_attention)
    screened: list[Screened] = []
    for cand in all_candidates:
        base = stage_config(config, cand, flash_attention=flash_attention)
        try:
            bound = get_strategy(cand.strategy).place(base, abstract_mesh(cand.stage_mesh_spec))
        except StrategyError as e:
            skipped.append(Skipped(cand.strategy, cand.mesh_spec, SkipReason.DIVISIBILITY, str(e)))
            continue
        options = [
            screen(
                replace(cand, microbatches=m, remat=r),
                bound,
                config,
                hw,
                mode,
                bytes_per_param,
                flash_attention,
            )
            for m in _microbatch_options(bound, mode, microbatches)
            for r in remats
        ]
        if not options:
            skipped.append(
                Skipped(
                    cand.strategy,
                    cand.mesh_spec,
                    SkipReason.DIVISIBILITY,
                    f"microbatches={microbatches} does not divide the "
                    f"{bound.config.batch // data_ways(bound)} sequences of a data shard",
                )
            )
            continue
        state = min(s.memory.model_state for s in options)
        if state > hw.memory_bytes:
            what = "parameters, gradients and optimizer state" if mode == "train" else "parameters"
            skipped.append(
                Skipped(
                    cand.strategy,
                    cand.mesh_spec,
                    SkipReason.MEMORY,
                    f"{what} need {format_bytes(state)} per device, more than the "
                    f"{format_bytes(hw.memory_bytes)} of a {hw.name}; shard them over more "
                    f"devices (fsdp, fsdp_tp, zero2) or use a device with more memory",
                )
            )
        screened.extend(options)
    return sorted(screened, key=_screen_key(names)), skipped, len(all_candidates)


def estimate(
    candidate: Candidate,
    config: ModelConfig,
    hardware: str | Hardware = "h100",
    *,
    mode: str = "train",
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
) -> Screened:
    """One candidate (strategy, mesh, micro-batches, recomputation; a ``stage`` axis for
    pipeline stages) estimated without compiling: its memory per device and step time.

    >>> c = Candidate("fsdp", (("data", 64),), microbatches=2, remat="full")
    >>> estimate(c, model_preset("7b").config(batch=64)).fits  # doctest: +SKIP
    True
    """

    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    base = stage_config(config, candidate, flash_attention=flash_attention)
    bound = get_strategy(candidate.strategy).place(base, abstract_mesh(candidate.stage_mesh_spec))
    return screen(candidate, bound, config, hw, mode, bytes_per_param, flash_attention)


def _screen_key(names: Sequence[str]) -> Callable[[Screened], tuple[Any, ...]]:
    def key(s: Screened) -> tuple[Any, ...]:
        c = s.candidate
        return (
            not s.fits,
            s.time.step_s if s.fits else s.memory.total,
            s.memory.total,
            names.index(c.strategy),
            tuple(c.sizes.values()),
            c.microbatches,
        )

    return key


def _to_compile(ranked: Sequence[Screened], top: int) -> list[Screened]:
    """The screened candidates worth compiling, in rank order: the best schedule of each of
    the ``top`` best strategy-and-mesh pairs, and the best plan of each of
    :data:`VALIDATED_STRATEGIES` (whose compiled communication is checked against the
    formula) that fits, or, when nothing fits, the best of every strategy."""
    best: dict[tuple[str, str], Screened] = {}
    for s in ranked:
        best.setdefault((s.candidate.strategy, s.candidate.mesh_spec), s)
    pairs = list(best.values())  # still in rank order
    chosen = {id(s): s for s in pairs[:top]}
    any_fits = any(s.fits for s in pairs)
    seen: set[str] = set()
    for s in pairs:
        name = s.candidate.strategy
        if name in seen or (any_fits and not (s.fits and name in VALIDATED_STRATEGIES)):
            continue
        seen.add(name)
        chosen.setdefault(id(s), s)
    order = {id(s): i for i, s in enumerate(ranked)}
    return sorted(chosen.values(), key=lambda s: order[id(s)])


def _reduces_per_microbatch(got: CompiledFacts, bound: Any, cand: Candidate) -> bool:
    """Whether the compiled program all-reduces replicated gradients more often than once."""
    once = sum(
        t.traffic_bytes
        for t in bound.terms
        if t.kind == ALL_REDUCE and "summed over token shards" in t.what
    )
    compiled = sum(c.traffic_bytes for c in got.collectives if c.kind == ALL_REDUCE)
    return once > 0 and compiled > 1.5 * once


# -- estimates -------------------------------------------------------------------------------


def _bandwidth(hw: Hardware, sizes: Mapping[str, int], c: PlanCollective) -> tuple[float, bool]:
    cross = crosses_nodes(sizes, () if c.irregular else c.axes, hw.node_size)
    return (hw.cross_node_bandwidth if cross else hw.link_bandwidth), cross


def collective_time(hw: Hardware, sizes: Mapping[str, int], c: PlanCollective) -> float:
    """Alpha-beta seconds of all ``count`` executions of a collective."""

    bandwidth, _ = _bandwidth(hw, sizes, c)
    steps = latency_steps(c.kind, max(c.group_size, 1)) if c.traffic_bytes else 0
    return c.count * steps * hw.latency_s + c.traffic_bytes / bandwidth


def _bound_time(hw: Hardware, sizes: Mapping[str, int], bound: Any) -> float:

    # A lower bound on time: every byte of the bound at full bandwidth, and one collective's
    # latency per (axes, kind), since a compiler may merge the bound's terms (it does merge
    # the per-weight gradient all-reduces).
    total = 0.0
    latency: dict[tuple[Any, str], float] = {}
    for t in bound.terms:
        cross = crosses_nodes(sizes, t.axes, hw.node_size)
        bandwidth = hw.cross_node_bandwidth if cross else hw.link_bandwidth
        total += t.traffic_bytes / bandwidth
        steps = latency_steps(t.kind, t.group_size) * hw.latency_s
        latency[(t.axes, t.kind)] = max(latency.get((t.axes, t.kind), 0.0), steps)
    return total + sum(latency.values())


def _axis_comm(
    hw: Hardware, sizes: Mapping[str, int], collectives: Sequence[PlanCollective], bound: Any
) -> tuple[AxisComm, ...]:

    bound_by = {(",".join(axes), kind): b for (axes, kind), b in bound.by_axes_kind().items()}
    rows: dict[tuple[str, str], list[PlanCollective]] = {}
    for c in collectives:
        rows.setdefault((c.axes_label, c.kind), []).append(c)
    keys = set(rows) | set(bound_by)
    names = list(sizes)

    def order(key: tuple[str, str]) -> tuple[Any, ...]:
        label, kind = key
        first = label.split(",")[0]
        return (
            names.index(first) if first in names else len(names),
            label,
            KINDS.index(kind) if kind in KINDS else len(KINDS),
        )

    out = []
    for key in sorted(keys, key=order):
        group = rows.get(key, [])
        out.append(
            AxisComm(
                axes=key[0],
                kind=key[1],
                count=sum(c.count for c in group),
                traffic_bytes=sum(c.traffic_bytes for c in group),
                bound_bytes=bound_by.get(key, 0),
                time_s=sum(collective_time(hw, sizes, c) for c in group),
                crosses_nodes=any(_bandwidth(hw, sizes, c)[1] for c in group)
                if group
                else crosses_nodes(sizes, tuple(key[0].split(",")), hw.node_size),
            )
        )
    return tuple(out)


def _cpu_formula(bound: Any) -> Any:
    """The bound with every reduce-scatter as the all-reduce the CPU backend emits."""

    terms = tuple(
        replace(t, kind=ALL_REDUCE) if t.kind == REDUCE_SCATTER else t for t in bound.terms
    )
    return Bound(bound.label + " (CPU: all-reduce for reduce-scatter)", terms, bound.notes)


def _jit_formula(bound: Any, microbatches: int) -> Any:
    """The formula with the gradient all-reduces repeated per micro-batch, as jit compiles a
    gradient accumulation loop."""

    terms = tuple(
        replace(t, count=t.count * microbatches) if "summed over token shards" in t.what else t
        for t in bound.terms
    )
    return Bound(bound.label + " (gradients reduced per micro-batch)", terms, bound.notes)


def _ratio(a: int, b: int) -> float | None:
    if b:
        return a / b
    return 1.0 if a == 0 else None


def _within(r: float | None) -> bool:
    return r is not None and abs(r - 1.0) <= VALIDATION_TOLERANCE + 1e-12


def _validate(plan: Plan, bound: Any) -> Validation:
    formula = bound.traffic_bytes
    ratio = _ratio(plan.comm_bytes_per_device, formula)
    cpu = _cpu_formula(bound).traffic_bytes
    cpu_ratio = _ratio(plan.comm_bytes_per_device, cpu)
    jit = _jit_formula(bound, plan.microbatches)
    jit_cpu = _cpu_formula(jit)
    if _within(ratio):
        explanation = ""
    elif cpu != formula and _within(cpu_ratio):
        explanation = (
            "CPU backend: all-reduce + slice where the formula has a reduce-scatter (2x its "
            "bytes); with that substitution they match. GPU/TPU form the reduce-scatter."
        )
    elif jit.traffic_bytes != formula and (
        _within(_ratio(plan.comm_bytes_per_device, jit.traffic_bytes))
        or _within(_ratio(plan.comm_bytes_per_device, jit_cpu.traffic_bytes))
    ):
        explanation = (
            f"the jit program reduces replicated gradients after each of the "
            f"{plan.microbatches} micro-batches, where the formula (and the time model) "
            f"reduces them once per step; counted so they match"
            + (
                " (with the CPU backend's all-reduce for each reduce-scatter)"
                if not _within(_ratio(plan.comm_bytes_per_device, jit.traffic_bytes))
                else ""
            )
        )
    else:
        worst = max(plan.comm, key=lambda a: abs(a.traffic_bytes - a.bound_bytes), default=None)
        where = (
            f"; the largest difference is {worst.kind} over {worst.axes}: "
            f"{worst.traffic_bytes} compiled vs {worst.bound_bytes} in the formula"
            if worst
            else ""
        )
        explanation = (
            f"compiled communication is {ratio:.3g}x the formula"
            if ratio is not None
            else "the formula needs no communication but the compiled program has some"
        ) + where
    return Validation(
        plan.strategy,
        plan.mesh_spec,
        formula,
        plan.comm_bytes_per_device,
        ratio,
        _within(ratio),
        cpu,
        cpu_ratio,
        explanation,
    )


def _lacks_reduce_scatter(bound: Any, collectives: Sequence[PlanCollective]) -> bool:
    """Whether the bound reduce-scatters over axes the compiled program never does."""
    bound_rs = {t.axes for t in bound.terms if t.kind == REDUCE_SCATTER}
    compiled_rs = {c.axes for c in collectives if c.kind == REDUCE_SCATTER}
    return bool(bound_rs - compiled_rs)


def _notes(facts: CompiledFacts, bound: Any, collectives: Sequence[PlanCollective]) -> list[Note]:
    notes = []
    if _lacks_reduce_scatter(bound, collectives):
        notes.append(Note(PlanNote.CPU_ALL_REDUCE_FOR_REDUCE_SCATTER))
    if facts.rematerializations:
        sites = sorted(set(facts.rematerializations))
        notes.append(Note(PlanNote.REMATERIALIZATION, {"sites": sites}))
    if not facts.exact:
        notes.append(Note(PlanNote.INEXACT))
    return notes


def _pareto(plans: Sequence[Plan]) -> set[int]:
    """Indices of the plans no other plan beats on both memory and communication time."""
    front = set()
    for i, p in enumerate(plans):
        dominated = any(
            q.memory.total <= p.memory.total
            and q.comm_time_s <= p.comm_time_s
            and (q.memory.total < p.memory.total or q.comm_time_s < p.comm_time_s)
            for j, q in enumerate(plans)
            if j != i
        )
        if not dominated:
            front.add(i)
    return front


# -- the front door --------------------------------------------------------------------------


def resolve_config(
    model: str | ModelConfig | None = None,
    *,
    devices: int,
    batch: int | None = None,
    seq: int | None = None,
    dtype: str = "bfloat16",
    **dims: int | None,
) -> tuple[str, ModelConfig]:
    """``(name, config)`` from a preset name (with overrides) or explicit dimensions.

    The default batch is one sequence per device.
    """
    _check_dims({"batch": batch, "seq": seq, **dims})
    name, config = _resolve(model, devices=devices, batch=batch, seq=seq, dtype=dtype, **dims)
    _check_dims(
        {
            k: getattr(config, k)
            for k in ("batch", "seq", "d_model", "heads", "ff", "layers", "vocab")
        }
    )
    _check_arrays(config)
    return name, config


def _check_dims(values: Mapping[str, int | None]) -> None:
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_DIM:
            raise PlanError(
                f"{name}={value}: the planner takes dimensions up to {MAX_DIM} (2**20); "
                f"choose a smaller {name}",
                param=name,
            )


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


def _resolve(
    model: str | ModelConfig | None,
    *,
    devices: int,
    batch: int | None,
    seq: int | None,
    dtype: str,
    **dims: int | None,
) -> tuple[str, ModelConfig]:
    if isinstance(model, ModelConfig):
        extra = {k: v for k, v in dims.items() if v is not None}
        if batch is not None:
            extra["batch"] = batch
        if seq is not None:
            extra["seq"] = seq
        return "custom", replace(model, scan=True, **extra)
    batch = devices if batch is None else batch
    if model is not None:
        preset = model_preset(model)
        return preset.name, preset.config(batch=batch, seq=seq, dtype=dtype, **dims)
    missing = [k for k in ("d_model", "heads", "ff", "layers") if dims.get(k) is None]
    if missing:
        raise PlanError(
            f"a model needs a preset (model={'|'.join(MODEL_PRESETS)}) or its shape; missing "
            f"{', '.join(missing)}",
            param=tuple(missing),
        )
    fields = {k: v for k, v in dims.items() if v is not None}
    return "custom", ModelConfig(batch=batch, seq=seq or 2048, dtype=dtype, scan=True, **fields)


def plan(
    model: str | ModelConfig | None = "7b",
    devices: int = 8,
    *,
    batch: int | None = None,
    seq: int | None = None,
    mode: str = "train",
    hardware: str | Hardware = "h100",
    hardware_overrides: Mapping[str, float] | None = None,
    strategies: Sequence[str] | None = None,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
    dtype: str = "bfloat16",
    workers: int | None = None,
    progress: Progress | None = None,
    remat: str | Sequence[str] | None = None,
    microbatches: int | None = None,
    stages: int | None = None,
    compile_top: int = DEFAULT_COMPILE_TOP,
    compiler: str = "cpu",
    target_plans: int = 3,
    **dims: int | None,
) -> PlanResult:
    """Plans ``model`` on ``devices`` accelerators: every strategy, mesh shape, micro-batch
    count, recomputation and pipeline stage count estimated, the best compiled and ranked.

    Args:
        model: a preset (``tiny``, ``1b``, ``7b``, ``13b``, ``70b``), a :class:`ModelConfig`,
            or None with ``d_model=``, ``heads=``, ``ff=``, ``layers=`` (and ``vocab=``) given.
            Those keywords also override a preset's dimensions.
        devices: accelerators to plan for (simulated as CPU devices while compiling).
        batch: global batch in sequences (default: one per device); seq: sequence length
            (default: the preset's).
        mode: ``"train"`` (forward, backward, gradients) or ``"forward"``.
        hardware: ``h100``, ``h200``, ``b200``, ``tpu-v5e``, ``tpu-v5p``, ``tpu-v6e`` or
            a :class:`Hardware`; ``hardware_overrides`` changes fields (e.g.
            ``{"link_bandwidth": 370e9}``).
        strategies: names to try (default :data:`DEFAULT_STRATEGIES`).
        bytes_per_param: model-state bytes per parameter in training (16: mixed-precision Adam).
        flash_attention: memory-efficient attention: the compiled program runs a blocked
            attention and the estimate leaves the score matrix out; False: the program
            materialises the scores and the estimate counts them.
        remat: recomputation to try: ``"none"``, ``"selective"``, ``"full"`` or several
            (default: all three).
        microbatches: fix the micro-batches per data shard (default: every divisor of the
            sequences per data shard, up to 8 choices).
        stages: fix the pipeline stages (default: 1 and every count up to 16 dividing the
            layers and the devices).
        compile_top: how many of the best estimated strategy-and-mesh pairs to compile (the
            best plan of each validated strategy is compiled as well).
        workers: compile in this process (0; it must have ``devices`` CPU devices) or in that
            many worker processes that each simulate ``devices``; None: this process when it
            can, else one worker (:func:`default_workers`), so that the caller's JAX is never
            reconfigured.
        progress: called as ``progress(done, total, label)`` while compiling.
        compiler: ``"cpu"`` (every plan compiled by the CPU backend over simulated devices),
            or the hardware's own target (``"h100"``, ``"tpu-v5p"``, see
            ``shardscope.TARGETS``): every candidate is screened on the CPU compiler, then
            leading ones are compiled again by the target's compiler, deviceless, until
            ``target_plans`` of them fit (at most ``3 * target_plans`` compiles). Those plans
            take their collectives, memory per device and fit from that compile
            (``compiled_by``); a TPU out-of-memory at compile does not fit; ``best`` is then
            chosen among them.

    Every candidate is first estimated without compiling (memory per device, and the step
    time of :mod:`shardscope._src.plan.timing`); only the best are compiled and audited.

    Returns:
        A :class:`PlanResult`: the compiled ``plans`` ranked by estimated step time (plans
        that do not fit the device memory after those that do), ``skipped`` with reasons,
        ``validations``, how many candidates were ``screened``, and the ``closest`` one when
        none fits. No plan is not an error: ``empty_reason`` says why.

    Raises:
        PlanError: an unknown preset, a bad device count or mode.

    Not run as a doctest (it compiles every candidate; the planner tests run sweeps):

    >>> result = plan("tiny", 8, workers=0)  # doctest: +SKIP
    >>> result.best.label  # doctest: +SKIP
    'dp data=8'
    """

    start = time.perf_counter()
    names = _check_sweep(devices, mode, workers, compile_top, strategies)
    hw = get_hardware(hardware, **dict(hardware_overrides or {}))
    compiler = _check_compiler(compiler, hw, devices, target_plans)
    model_name, config = resolve_config(
        model, devices=devices, batch=batch, seq=seq, dtype=dtype, **dims
    )
    _check_bytes_per_param(bytes_per_param, config, mode)

    ranked_screen, skipped, n_candidates = screen_all(
        config,
        devices,
        hw,
        names,
        mode=mode,
        bytes_per_param=bytes_per_param,
        flash_attention=flash_attention,
        remat=remat,
        microbatches=microbatches,
        stages=stages,
    )
    todo = _to_compile(
        [s for s in ranked_screen if s.memory.model_state <= hw.memory_bytes], compile_top
    )
    stage_configs = {
        s.candidate: stage_config(config, s.candidate, flash_attention=flash_attention)
        for s in todo
    }
    n_workers = default_workers(devices) if workers is None else workers
    n_workers = min(n_workers, len(todo), os.cpu_count() or 1)  # more would only wait
    facts = compile_all(
        [s.candidate for s in todo], stage_configs, mode, devices, n_workers, progress
    )

    flops_per_device = model_flops(config, mode) / devices
    plans: list[Plan] = []
    bound_of: dict[int, Any] = {}
    for s in todo:
        got = facts[s.candidate]
        if isinstance(got, BaseException):
            message = f"{type(got).__name__}: {got}"
            skipped.append(
                Skipped(s.candidate.strategy, s.candidate.mesh_spec, SkipReason.ERROR, message)
            )
            continue
        p = _compiled_plan(s, got, hw, stage_configs[s.candidate], flops_per_device)
        bound_of[id(p)] = s.bound
        plans.append(p)

    order = sorted(plans, key=_rank_key(names))
    if compiler != "cpu":
        order = _on_target(
            order, bound_of, config, mode, hw, compiler, target_plans, progress, flash_attention
        )
        order = sorted(order, key=_rank_key(names))
    front = _pareto(order)
    ranked = tuple(replace(p, rank=i + 1, pareto=i in front) for i, p in enumerate(order))
    settings = {
        **settings_dict(bytes_per_param, flash_attention),
        "compile_options": dict(COMPILE_OPTIONS),
        "strategies": list(names),
        "remat": list(_remat_options(mode, remat, flash_attention)),
        "microbatches": microbatches,
        "stages": stages,
        "compile_top": compile_top,
        "time_model": timing_constants(hw),
    }
    return PlanResult(
        model=model_name,
        config=config,
        devices=devices,
        mode=mode,
        hardware=hw,
        settings=settings,
        plans=ranked,
        skipped=tuple(skipped),
        validations=_validations(ranked, order, bound_of),
        notes=tuple(_result_notes(config, hw, ranked) + _compiler_notes(compiler, ranked, hw)),
        wall_s=time.perf_counter() - start,
        workers=n_workers,
        candidates=n_candidates,
        screened=len(ranked_screen),
        closest=_closest(ranked_screen),
        compiler=compiler,
    )


def _check_sweep(
    devices: int, mode: str, workers: int | None, compile_top: int, strategies: Any
) -> tuple[str, ...]:
    """The strategies to sweep, once the sweep's counts and names are valid."""
    if not is_int(devices, 1):
        raise PlanError(f"devices={devices!r}: must be a positive whole number", param="devices")
    if devices > MAX_DEVICES:
        raise PlanError(
            f"devices={devices}: the CPU backend compiles for at most {MAX_DEVICES} "
            f"simulated devices in one process; plan for {MAX_DEVICES} or fewer",
            param="devices",
        )
    if mode not in MODES:
        raise PlanError(f"mode {mode!r}: choose one of {', '.join(MODES)}", param="mode")
    if workers is not None and (not is_int(workers, 0)):
        raise PlanError(
            f"workers={workers!r}: must be 0 (this process) or a positive number", param="workers"
        )
    if not is_int(compile_top, 0):
        raise PlanError(
            f"compile_top={compile_top!r}: must be 0 or a positive number", param="compile_top"
        )
    names = tuple(dict.fromkeys(strategies)) if strategies is not None else DEFAULT_STRATEGIES
    for name in names:
        if name not in STRATEGIES:
            raise PlanError(
                f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}",
                param="strategies",
            )
    return names


def _check_bytes_per_param(bytes_per_param: int, config: ModelConfig, mode: str) -> None:
    if bytes_per_param < 2 * config.itemsize and mode == "train":
        raise PlanError(
            f"bytes_per_param={bytes_per_param} is less than a parameter and its gradient at "
            f"{config.dtype} ({2 * config.itemsize} bytes); use at least {2 * config.itemsize}",
            param="bytes_per_param",
        )


def _compiled_plan(
    s: Screened, got: CompiledFacts, hw: Hardware, stage: ModelConfig, flops_per_device: float
) -> Plan:
    """The plan of a screened candidate from its compiled facts."""
    cand, bound = s.candidate, s.bound
    sizes = dict(cand.stage_mesh)
    comm = _axis_comm(hw, sizes, got.collectives, bound)
    notes = _notes(got, bound, got.collectives)
    if cand.microbatches > 1 and _reduces_per_microbatch(got, bound, cand):
        notes.append(Note(PlanNote.PER_MICROBATCH_REDUCTION))
    if cand.stages > 1:
        values = {"stages": cand.stages, "layers": stage.layers}
        notes.append(
            Note(PlanNote.PIPELINE_STAGE, {**values, "devices": math.prod(sizes.values())})
        )
    return Plan(
        strategy=cand.strategy,
        summary=STRATEGIES[cand.strategy].summary,
        mesh=cand.sizes,
        memory=s.memory,
        compiled_memory=got.memory,
        memory_limit_bytes=int(hw.memory_bytes),
        collectives=got.collectives,
        comm=comm,
        bound_bytes_per_device=bound.traffic_bytes,
        bound_comm_time_s=_bound_time(hw, sizes, bound),
        comm_time_s=sum(a.time_s for a in comm),
        flops_per_device=flops_per_device,
        compute_time_s=s.time.compute_s,
        notes=tuple(notes),
        analysis_s=got.analysis_s,
        timing={"lower_s": got.lower_s, "compile_s": got.compile_s, "audit_s": got.audit_s},
        exact=got.exact,
        microbatches=cand.microbatches,
        remat=cand.remat,
        stages=cand.stages,
        time=s.time.to_dict(),
    )


def _rank_key(names: Sequence[str]) -> Callable[[Plan], tuple[Any, ...]]:
    """Plans that fit first, then by step time, memory, the strategies' order and mesh."""

    def key(p: Plan) -> tuple[Any, ...]:
        return (
            not p.fits,
            p.step_time_s,
            p.memory.total,
            names.index(p.strategy),
            tuple(p.mesh.values()),
        )

    return key


def _validations(
    ranked: Sequence[Plan], order: Sequence[Plan], bound_of: dict[int, Any]
) -> tuple[Validation, ...]:
    """One validation per strategy, on its best plan."""
    first: dict[str, tuple[Plan, Any]] = {}
    for p, q in zip(ranked, order, strict=True):
        first.setdefault(p.strategy, (p, bound_of[id(q)]))
    return tuple(_validate(p, b) for p, b in first.values())


def _closest(ranked_screen: Sequence[Screened]) -> dict[str, Any] | None:
    """The candidate needing the least memory per device, when the best does not fit."""
    if not ranked_screen or ranked_screen[0].fits:
        return None
    small = min(ranked_screen, key=lambda s: s.memory.total)
    return {"label": small.candidate.label, "bytes": small.memory.total}


def _compiler_notes(compiler: str, plans: Sequence[Plan], hw: Hardware) -> list[Note]:
    if compiler == "cpu":
        own = TARGETS.get(hw.name)
        if own is not None and own.extra and not compiler_installed(own):
            values = {"target": own.name, "extra": own.extra}
            return [Note(PlanNote.TARGET_COMPILER_MISSING, values, ("compiler",))]
        return []
    ranks = [p.rank for p in plans if p.compiled_by == compiler]
    return [Note(PlanNote.RECOMPILED_BY_TARGET, {"target": compiler, "ranks": ranks})]


def _check_compiler(compiler: str, hw: Hardware, devices: int, target_plans: int) -> str:
    """The compiler's target name, once it can compile for ``devices`` of ``hw``."""

    t = get_target(compiler)
    if t.family == CPU:
        return t.name
    if t.hardware != hw.name:
        raise PlanError(
            f"compiler {t.name!r} compiles for {t.hardware} devices but the plan is for "
            f"{hw.name}; use compiler={hw.name!r} or 'cpu'",
            param="compiler",
        )
    if not is_int(target_plans, 1):
        raise PlanError(f"target_plans={target_plans!r}: must be a positive whole number")
    require_compiler(t)
    topology(t, devices)  # a device count the target is not built with fails here
    return t.name


def _on_target(
    order: list[Plan],
    bound_of: dict[int, Any],
    config: ModelConfig,
    mode: str,
    hw: Hardware,
    target: str,
    leading: int,
    progress: Progress | None,
    flash_attention: bool = True,
) -> list[Plan]:
    """The leading plans compiled again by the target's compiler, in the screening's order,
    until ``leading`` of them fit the device memory by its buffer assignment (or ``3 x
    leading`` are compiled, or the list ends); the rest kept as screened."""

    out: list[Plan] = []
    fitting = 0
    budget = min(len(order), 3 * leading)
    for i, p in enumerate(order[:budget], start=1):
        if fitting >= leading:
            break
        cand = Candidate(p.strategy, tuple(p.mesh.items()), p.microbatches, p.remat)
        facts = target_facts(
            cand, stage_config(config, cand, flash_attention=flash_attention), mode, target
        )
        bound = bound_of[id(p)]

        if facts.error is None:
            values = {"target": target, "memory_bytes": facts.memory_bytes_per_device}
            values["estimate_bytes"] = p.memory.total
        else:
            values = {"target": target, "error": facts.error}
        note = Note(PlanNote.COMPILED_BY_TARGET, values)
        # The target's compiler forms its own collectives: the CPU backend's note goes.
        kept = tuple(n for n in p.notes if n.kind != PlanNote.CPU_ALL_REDUCE_FOR_REDUCE_SCATTER)
        changes: dict[str, Any] = {
            "notes": (note, *kept),
            "compiled_by": target,
            "target_memory": dict(facts.memory) if facts.error is None else None,
            "target_error": facts.error,
            "target_optimal_seconds": facts.optimal_seconds,
            "timing": {**p.timing, "target_compile_s": facts.compile_s},
        }
        if facts.error is None:
            comm = _axis_comm(hw, dict(cand.stage_mesh), facts.collectives, bound)
            changes.update(
                collectives=facts.collectives,
                comm=comm,
                comm_time_s=sum(a.time_s for a in comm),
                exact=facts.exact,
            )
        q = replace(p, **changes)
        bound_of[id(q)] = bound
        out.append(q)
        fitting += q.fits
        if progress:
            progress(i, budget, f"{p.label} on {target}")
    return out + order[len(out) :]


def _result_notes(config: ModelConfig, hw: Hardware, plans: Sequence[Plan]) -> list[Note]:
    notes = [
        Note(PlanNote.ANALYTIC_MEMORY),
        Note(PlanNote.COMMUNICATION),
        Note(PlanNote.TIME_MODEL, hw.to_dict()),
    ]
    if config.itemsize == 2 and any(
        c.payload_bytes != c.cpu_payload_bytes for p in plans for c in p.collectives
    ):
        notes.append(Note(PlanNote.CPU_WIDENED, {"dtype": config.dtype, "itemsize": 2}))
    # A reduce-scatter row the bound has and the compiled program does not run.
    if any(
        a.kind == REDUCE_SCATTER and a.bound_bytes > 0 and a.count == 0
        for p in plans
        for a in p.comm
    ):
        notes.append(Note(PlanNote.CPU_NO_REDUCE_SCATTER))
    return notes
