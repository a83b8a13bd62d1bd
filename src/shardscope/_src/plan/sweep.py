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

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardscope._src.base.comm import ALL_REDUCE, REDUCE_SCATTER
from shardscope._src.base.devices import MAX_CPU_DEVICES
from shardscope._src.base.errors import PlanError, StrategyError, is_int
from shardscope._src.base.hardware import Hardware
from shardscope._src.base.hardware import hardware as get_hardware
from shardscope._src.model.config import MAX_DIM, ModelConfig
from shardscope._src.model.presets import MODEL_PRESETS, model_preset
from shardscope._src.plan.compile import COMPILE_OPTIONS, Progress, compile_all, default_workers
from shardscope._src.plan.estimates import (
    DEFAULT_BYTES_PER_PARAM,
    MemoryEstimate,
    crosses_nodes,
    estimate_memory,
    model_flops,
    settings_dict,
)
from shardscope._src.plan.types import (
    AxisComm,
    Candidate,
    CompiledFacts,
    Plan,
    PlanCollective,
    PlanResult,
    Skipped,
    SkipReason,
    Validation,
)

#: The strategies a sweep tries unless told otherwise ("replicated" is never a useful plan).
DEFAULT_STRATEGIES = ("dp", "fsdp", "tp", "sp", "dp_tp", "fsdp_tp", "dp_sp")
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


def candidates(strategies: Iterable[str], devices: int) -> list[Candidate]:
    """Every mesh shape of ``devices`` for each strategy, in a stable order.

    >>> [c.label for c in candidates(["tp", "dp_tp"], 8)]
    ['tp model=8', 'dp_tp data=4,model=2', 'dp_tp data=2,model=4']
    """
    from shardscope._src.mesh import parse_mesh_spec
    from shardscope._src.sharding.strategies import get_strategy, mesh_spec_for

    out = []
    for name in strategies:
        if len(get_strategy(name).roles) <= 1:
            shapes = [(devices,)]
        else:
            shapes = [(devices // t, t) for t in divisors(devices) if 1 < t < devices]
        for shape in shapes:
            spec = parse_mesh_spec(mesh_spec_for(name, shape))
            out.append(Candidate(name, tuple(spec.items())))
    return out


# -- estimates -------------------------------------------------------------------------------


def _bandwidth(hw: Hardware, sizes: Mapping[str, int], c: PlanCollective) -> tuple[float, bool]:
    cross = crosses_nodes(sizes, () if c.irregular else c.axes, hw.node_size)
    return (hw.cross_node_bandwidth if cross else hw.link_bandwidth), cross


def collective_time(hw: Hardware, sizes: Mapping[str, int], c: PlanCollective) -> float:
    """Alpha-beta seconds of all ``count`` executions of a collective."""
    from shardscope._src.base.comm import latency_steps

    bandwidth, _ = _bandwidth(hw, sizes, c)
    steps = latency_steps(c.kind, max(c.group_size, 1)) if c.traffic_bytes else 0
    return c.count * steps * hw.latency_s + c.traffic_bytes / bandwidth


def _bound_time(hw: Hardware, sizes: Mapping[str, int], bound: Any) -> float:
    from shardscope._src.base.comm import latency_steps

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
    from shardscope._src.base.comm import KINDS

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
    from shardscope._src.bounds.terms import Bound

    terms = tuple(
        replace(t, kind=ALL_REDUCE) if t.kind == REDUCE_SCATTER else t for t in bound.terms
    )
    return Bound(bound.label + " (CPU: all-reduce for reduce-scatter)", terms, bound.notes)


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
    if _within(ratio):
        explanation = ""
    elif cpu != formula and _within(cpu_ratio):
        explanation = (
            "CPU backend: all-reduce + slice where the formula has a reduce-scatter (2x its "
            "bytes); with that substitution they match. GPU/TPU form the reduce-scatter."
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


def _notes(facts: CompiledFacts, bound: Any, collectives: Sequence[PlanCollective]) -> list[str]:
    notes = []
    if _lacks_reduce_scatter(bound, collectives):
        notes.append(
            "CPU backend: all-reduce + slice where a reduce-scatter suffices (the GPU "
            "compiler forms one; the TPU compiler was seen to all-reduce too), so the "
            "compiled bytes exceed the bound"
        )
    if facts.rematerializations:
        notes.append(
            "the partitioner replicated a whole array then sliced it (involuntary full "
            f"rematerialization) at {', '.join(sorted(set(facts.rematerializations)))}"
        )
    if not facts.exact:
        notes.append("some collective counts are not exact (unknown trip count or a branch)")
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
    from shardscope._src.base.comm import format_bytes

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
    compiler: str = "cpu",
    target_plans: int = 3,
    **dims: int | None,
) -> PlanResult:
    """Plans ``model`` on ``devices`` accelerators: every strategy and mesh, compiled and ranked.

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
        flash_attention: leave the attention-score term out of the activation estimate.
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

    Returns:
        A :class:`PlanResult`: ``plans`` ranked by estimated step time (plans that do not fit
        the device memory after those that do), ``skipped`` with reasons, ``validations``.
        No plan is not an error: ``empty_reason`` says why.

    Raises:
        PlanError: an unknown preset, a bad device count or mode.

    Not run as a doctest (it compiles every candidate; the planner tests run sweeps):

    >>> result = plan("tiny", 8, workers=0)  # doctest: +SKIP
    >>> result.best.label  # doctest: +SKIP
    'dp data=8'
    """
    from shardscope._src.bounds.transformer import transformer_bound
    from shardscope._src.sharding.strategies import STRATEGIES, abstract_mesh, get_strategy

    start = time.perf_counter()
    if not is_int(devices, 1):
        raise PlanError(f"devices={devices!r}: must be a positive whole number")
    if devices > MAX_DEVICES:
        raise PlanError(
            f"devices={devices}: the CPU backend compiles for at most {MAX_DEVICES} "
            f"simulated devices in one process; plan for {MAX_DEVICES} or fewer"
        )
    if mode not in MODES:
        raise PlanError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    if workers is not None and (not is_int(workers, 0)):
        raise PlanError(f"workers={workers!r}: must be 0 (this process) or a positive number")
    names = tuple(dict.fromkeys(strategies)) if strategies is not None else DEFAULT_STRATEGIES
    for name in names:
        if name not in STRATEGIES:
            raise PlanError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    hw = get_hardware(hardware, **dict(hardware_overrides or {}))
    compiler = _check_compiler(compiler, hw, devices, target_plans)
    model_name, config = resolve_config(
        model, devices=devices, batch=batch, seq=seq, dtype=dtype, **dims
    )
    if bytes_per_param < 2 * config.itemsize and mode == "train":
        raise PlanError(
            f"bytes_per_param={bytes_per_param} is less than a parameter and its gradient at "
            f"{config.dtype} ({2 * config.itemsize} bytes); use at least {2 * config.itemsize}"
        )

    skipped: list[Skipped] = []
    todo: list[Candidate] = []
    bounds: dict[Candidate, Any] = {}
    memory: dict[Candidate, MemoryEstimate] = {}
    all_candidates = candidates(names, devices)
    for cand in all_candidates:
        try:
            placement = get_strategy(cand.strategy).place(config, abstract_mesh(cand.mesh_spec))
        except StrategyError as e:
            skipped.append(Skipped(cand.strategy, cand.mesh_spec, SkipReason.DIVISIBILITY, str(e)))
            continue
        mem = estimate_memory(
            placement, mode, bytes_per_param=bytes_per_param, flash_attention=flash_attention
        )
        if mem.model_state > hw.memory_bytes:
            from shardscope._src.base.comm import format_bytes

            what = (
                "parameters, gradients and optimizer state" if mode == "train" else ("parameters")
            )
            skipped.append(
                Skipped(
                    cand.strategy,
                    cand.mesh_spec,
                    SkipReason.MEMORY,
                    f"{what} need {format_bytes(mem.model_state)} per device, more than the "
                    f"{format_bytes(hw.memory_bytes)} of a {hw.name}; shard them over more "
                    f"devices (fsdp, fsdp_tp) or give more memory (--memory)",
                )
            )
            continue
        todo.append(cand)
        bounds[cand] = transformer_bound(placement, mode)
        memory[cand] = mem

    n_workers = default_workers(devices) if workers is None else workers
    n_workers = min(n_workers, len(todo), os.cpu_count() or 1)  # more would only wait
    facts = compile_all(todo, config, mode, devices, n_workers, progress)

    flops = model_flops(config, mode)
    plans: list[Plan] = []
    bound_of: dict[int, Any] = {}
    for cand in todo:
        got = facts[cand]
        if isinstance(got, BaseException):
            skipped.append(
                Skipped(
                    cand.strategy, cand.mesh_spec, SkipReason.ERROR, f"{type(got).__name__}: {got}"
                )
            )
            continue
        sizes = cand.sizes
        bound = bounds[cand]
        comm = _axis_comm(hw, sizes, got.collectives, bound)
        p = Plan(
            strategy=cand.strategy,
            summary=STRATEGIES[cand.strategy].summary,
            mesh=sizes,
            memory=memory[cand],
            compiled_memory=got.memory,
            memory_limit_bytes=int(hw.memory_bytes),
            collectives=got.collectives,
            comm=comm,
            bound_bytes_per_device=bound.traffic_bytes,
            bound_comm_time_s=_bound_time(hw, sizes, bound),
            comm_time_s=sum(a.time_s for a in comm),
            flops_per_device=flops / devices,
            compute_time_s=flops / devices / hw.peak_flops,
            notes=tuple(_notes(got, bound, got.collectives)),
            analysis_s=got.analysis_s,
            timing={"lower_s": got.lower_s, "compile_s": got.compile_s, "audit_s": got.audit_s},
            exact=got.exact,
        )
        bound_of[id(p)] = bound
        plans.append(p)

    order = sorted(
        plans,
        key=lambda p: (
            not p.fits,
            p.step_time_s,
            p.memory.total,
            names.index(p.strategy),
            tuple(p.mesh.values()),
        ),
    )
    if compiler != "cpu":
        order = _on_target(order, bound_of, config, mode, hw, compiler, target_plans, progress)
        order = sorted(
            order,
            key=lambda p: (
                not p.fits,
                p.step_time_s,
                p.memory.total,
                names.index(p.strategy),
                tuple(p.mesh.values()),
            ),
        )
    front = _pareto(order)
    ranked = tuple(replace(p, rank=i + 1, pareto=i in front) for i, p in enumerate(order))
    # One validation per strategy, on its best plan: the DP, FSDP and TP, and the rest.
    first: dict[str, tuple[Plan, Any]] = {}
    for p, q in zip(ranked, order, strict=True):
        first.setdefault(p.strategy, (p, bound_of[id(q)]))
    validations = tuple(_validate(p, b) for p, b in first.values())
    result = PlanResult(
        model=model_name,
        config=config,
        devices=devices,
        mode=mode,
        hardware=hw,
        settings={
            **settings_dict(bytes_per_param, flash_attention),
            "compile_options": dict(COMPILE_OPTIONS),
            "strategies": list(names),
        },
        plans=ranked,
        skipped=tuple(skipped),
        validations=validations,
        notes=tuple(_result_notes(config, hw, ranked) + _compiler_notes(compiler, ranked, hw)),
        wall_s=time.perf_counter() - start,
        workers=n_workers,
        candidates=len(all_candidates),
        compiler=compiler,
    )
    return result


def _compiler_notes(compiler: str, plans: Sequence[Plan], hw: Hardware) -> list[str]:
    if compiler == "cpu":
        from shardscope._src.base.deviceless import compiler_installed
        from shardscope._src.base.targets import TARGETS

        own = TARGETS.get(hw.name)
        if own is not None and own.extra and not compiler_installed(own):
            return [
                f"every plan was compiled by the CPU backend; pip install "
                f"'shardscope[{own.extra}]' to compile the leading plans with the {own.name} "
                f"compiler (deviceless) and judge their fit from its buffer assignment"
            ]
        return []
    by_target = [str(p.rank) for p in plans if p.compiled_by == compiler]
    return [
        f"plans ranked {', '.join(by_target)} were compiled again by the {compiler} compiler "
        f"(deviceless): their fit is judged from its buffer assignment and their "
        f"communication is its collectives; the other plans are the CPU compiler's screening"
    ]


def _check_compiler(compiler: str, hw: Hardware, devices: int, target_plans: int) -> str:
    """The compiler's target name, once it can compile for ``devices`` of ``hw``."""
    from shardscope._src.base.deviceless import require_compiler
    from shardscope._src.base.targets import CPU, get_target, topology

    t = get_target(compiler)
    if t.family == CPU:
        return t.name
    if t.hardware != hw.name:
        raise PlanError(
            f"compiler {t.name!r} compiles for {t.hardware} devices but the plan is for "
            f"{hw.name}; use compiler={hw.name!r} (--compiler {hw.name}) or 'cpu'"
        )
    if isinstance(target_plans, bool) or not isinstance(target_plans, int) or target_plans < 1:
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
) -> list[Plan]:
    """The leading plans compiled again by the target's compiler, in the screening's order,
    until ``leading`` of them fit the device memory by its buffer assignment (or ``3 x
    leading`` are compiled, or the list ends); the rest kept as screened."""
    from shardscope._src.plan.target import target_facts

    out: list[Plan] = []
    fitting = 0
    budget = min(len(order), 3 * leading)
    for i, p in enumerate(order[:budget], start=1):
        if fitting >= leading:
            break
        cand = Candidate(p.strategy, tuple(p.mesh.items()))
        facts = target_facts(cand, config, mode, target)
        bound = bound_of[id(p)]
        from shardscope._src.base.comm import format_bytes

        if facts.error is None:
            note = (
                f"compiled by the {target} compiler: {format_bytes(facts.memory_bytes_per_device)}"
                f" per device in its buffer assignment (analytic estimate "
                f"{format_bytes(p.memory.total)})"
            )
        else:
            note = f"compiled by the {target} compiler: {facts.error}"
        kept = tuple(n for n in p.notes if not n.startswith("CPU backend"))
        changes: dict[str, Any] = {
            "notes": (note, *kept),
            "compiled_by": target,
            "target_memory": dict(facts.memory) if facts.error is None else None,
            "target_error": facts.error,
            "target_optimal_seconds": facts.optimal_seconds,
            "timing": {**p.timing, "target_compile_s": facts.compile_s},
        }
        if facts.error is None:
            comm = _axis_comm(hw, p.mesh, facts.collectives, bound)
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


def _result_notes(config: ModelConfig, hw: Hardware, plans: Sequence[Plan]) -> list[str]:
    notes = [
        "memory per device is the analytic estimate (ZeRO model state, Korthikanti "
        "activations); the compiled numbers beside it are the CPU compiler's buffer "
        "assignment (bf16 computed in f32, no GPU/TPU memory scheduler), not a GPU/TPU "
        "prediction",
        "communication is the compiled program's collectives, loop trips counted, bytes each "
        "device sends under bandwidth-optimal algorithms",
        f"time: alpha-beta per collective ({hw.name}: {hw.link_bandwidth / 1e9:g} GB/s within "
        f"a node of {hw.node_size}, {hw.cross_node_bandwidth / 1e9:g} GB/s for groups that "
        f"span nodes, {hw.latency_s * 1e6:g} us per step); compute = model FLOPs / (devices x "
        f"{hw.peak_flops / 1e12:g} TFLOP/s peak); step = compute + communication (no "
        f"overlap) or the larger of the two (perfect overlap)",
    ]
    if config.itemsize == 2 and any(
        c.payload_bytes != c.cpu_payload_bytes for p in plans for c in p.collectives
    ):
        notes.append(
            f"the CPU backend runs {config.dtype} arithmetic in f32 and moves f32 through the "
            f"collectives; they are counted at {config.itemsize} bytes per element, as GPU "
            f"and TPU compilers keep them (cpu_comm_bytes_per_device has the CPU bytes)"
        )
    # A reduce-scatter row the bound has and the compiled program does not run.
    if any(
        a.kind == REDUCE_SCATTER and a.bound_bytes > 0 and a.count == 0
        for p in plans
        for a in p.comm
    ):
        notes.append(
            "the CPU backend forms no reduce-scatter (all-reduce + slice, twice the bytes): "
            "plans that need one (FSDP gradients, sequence parallelism) are charged the "
            "compiled all-reduce; bound_comm_time_s is the time at the lower bound"
        )
    return notes
