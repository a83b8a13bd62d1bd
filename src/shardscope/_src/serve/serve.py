"""Serving plans: for every layout of the devices and every batch that fits,
the memory a device holds, the time per output token, the time to first token and the
throughput per chip, and the latency-throughput front.

A layout is ``r`` replicas of tensor parallelism over ``t`` devices (``t x r`` = the
devices; ``tp`` on ``model=t`` when ``r`` is 1, ``dp_tp`` on ``data=r,model=t`` else): each
replica serves ``batch / r`` sequences, its heads, MLP and KV cache split ``t`` ways. Where
``t`` is a multiple of the key/value heads, each head is replicated on ``t / kv_heads``
devices (its projection weights and its cache), so that every device holds one whole head,
as tensor-parallel servers do; a ``t`` that neither divides nor is a multiple of them is
not a layout. A mixture of experts' replicas may also split its routed experts (``ep_tp``
on ``expert=r,model=t``: the attention data-parallel over ``expert``, each device holding
``experts / r`` of every layer's experts, each of them split ``t`` ways), or each hold them
all (``dp_tp``).

Per replica, by the prices of :mod:`shardscope._src.cost.compute` (its matmuls at the
rates they reach, the hardware's ``matmul_fraction`` and ``hbm_fraction``) and the one
pricing of collectives (:func:`~shardscope._src.cost.links.collective_seconds`):

* **decode** (one token per sequence): every weight (but an untied embedding table, of which
  the lookup takes a row a token) and the replica's whole cache through HBM once (``(weights
  + cache) / t`` a device) at the bandwidth matmuls reach reading their operands (the
  hardware's ``hbm_fraction`` of it), and its ``2 x active params`` FLOPs a sequence and its
  attention's at the matmul rate: on a GPU the weights' matmuls and the attention as two
  kernels one after another (:func:`~shardscope._src.cost.compute.work_seconds`), elsewhere
  the reads or the FLOPs, whichever is slower; then the all-reduces of tensor parallelism,
  two a layer (the attention's output and the MLP's down projection, ``batch / r x
  d_model`` each) and the vocabulary-parallel embedding's one (each device looks up the
  tokens of its slice of the vocabulary), which wait for the matmuls that feed them and are
  latency-bound at decode's small messages. A mixture reads only the routed experts its
  tokens reach (:func:`untouched_share`), its layers with experts all-reduce their
  experts' slots (``top_k`` rows a token), and over ``expert`` its dispatch and combine
  all-to-alls move each token's activations to its experts' devices and back
  (:func:`~shardscope._src.bounds.moe.moe_layer_terms`).
* **first token**: one prompt prefilled alone on a replica: its ``2 x active params x
  prompt`` FLOPs and the attention's ``prompt^2`` ones, counted non-causal as training counts
  them, at the matmul rate (a fused kernel's causal half at its forward rate where the
  hardware names one), beside its weights through HBM (one kernel), and
  the same all-reduces of ``prompt x d_model``.
* **fp8 weights** on a device with fp8 matmul units: the weights' matmuls (decode's and
  prefill's) at the fp8 rate, the attention's at 16 bits (:func:`fp8_matmuls`); int8
  weights, and fp8 ones elsewhere, are read as 8 bits and multiplied at 16.
* **memory** a device: its share of the weights and of the cache of ``context`` tokens for
  each of its replica's sequences, and the decode step's logits (float32, each device its
  slice of the vocabulary).

The best plan of each layout has its decode step compiled by the hardware's own compiler,
deviceless (:func:`compile_decode`: the reference decoder's
:func:`~shardscope._src.model.serving.decode`, the cache donated), and the layout's prefill
of one prompt a replica (:func:`compile_prefill`): their times are then the compiled
programs' (:func:`_compile`: the bytes they move through HBM, the matmuls' at the bandwidth
they reach, and the FLOPs of their matmuls, counted from their HLO; on a GPU kernel by
kernel, each kernel's arithmetic and traffic overlapped as XLA's GPU cost model overlaps
them (:func:`~shardscope._src.cost.compute.kernel_seconds`) and the kernels
one after another, on a TPU the slower of the two totals; the attention core as the one
fused kernel a server runs, its scores kept on chip; their collectives priced as every
collective is, and the kernels they launch at the hardware's ``kernel_launch_s``), their
memory the compiled buffers (``compiled_by``); the other plans are estimated. On a TPU
target the decode step is compiled and timed so too, and the prefill is estimated. A
layout's largest batch that does not fit once compiled gives way to the largest its
program would fit at (:func:`_compile_best`), and while an estimated plan ranks first it is
compiled too (:func:`_compile_leaders`), so that the best plan is a compiled one.

At a request rate (``rate``) each layout is planned at the sequences its replicas hold in
flight, and its times are those its requests see with prefills batched in flight
(:mod:`~shardscope._src.serve.online`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from shardscope._src.audit.pricing import execution_seconds
from shardscope._src.base.comm import ALL_REDUCE, format_bytes, format_seconds, traffic_bytes
from shardscope._src.base.errors import PlanError, StrategyError
from shardscope._src.base.records import Record, record_dict
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.base.vocab import Vocab
from shardscope._src.bounds.moe import moe_layer_terms
from shardscope._src.cost.compute import (
    by_kernel,
    compiled_step_seconds,
    flop_seconds,
    kernels_seconds,
    launch_seconds,
    matmul_read_seconds,
    moved_seconds,
    step_matmul_seconds,
    work_seconds,
)
from shardscope._src.cost.flops import attention_core_flops, weight_flops
from shardscope._src.cost.links import collective_seconds
from shardscope._src.cost.memory import memory_fits
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.model.serving import (
    EIGHT_BIT,
    FORMATS,
    WeightFormat,
    cache_bytes_per_token,
    check_servable,
)
from shardscope._src.plan.estimates import divisors, elements_per_device
from shardscope._src.plan.rank import pareto_front, rank_key
from shardscope._src.plan.request import ServeRequest
from shardscope._src.serve.online import Load, poisson_quantile, under_load
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import TARGETS, Family

#: The largest batch the sweep tries when none is given (a power of two).
MAX_BATCH = 4096


@dataclass(frozen=True)
class ServePlan(Record):
    """One layout serving ``batch`` sequences of ``context`` tokens on ``devices``."""

    strategy: str
    mesh: dict[str, int]
    batch: int
    context: int
    weight_bytes_per_device: int
    cache_bytes_per_device: int
    temp_bytes_per_device: int
    memory_limit_bytes: int
    decode_step_s: float
    decode_memory_s: float
    decode_compute_s: float
    decode_comm_s: float
    first_token_s: float
    tokens_per_s_per_chip: float
    pareto: bool = False
    #: the target whose compiler compiled this plan's decode step (None: estimated): its
    #: memory per device is that compile's buffers (``temp_bytes_per_device`` the rest of
    #: them beyond the weights and the cache), its all-reduces the compiled ones
    compiled_by: str | None = None
    #: the compiled decode step's all-reduces a step (0 when not compiled)
    compiled_all_reduces: int = 0
    #: the kernels the compiled decode step launches, each priced at the hardware's
    #: ``kernel_launch_s`` in ``decode_step_s``: the compiled step's, or on an estimated
    #: plan its layout's compiled step's (0 where the layout has none)
    decode_kernels: int = 0
    #: the devices that hold each key/value head (above 1 where tensor parallelism is wider
    #: than the model's key/value heads)
    kv_replicas: int = 1
    #: at a request rate (:mod:`~shardscope._src.serve.online`): the mean sequences in flight
    #: (``batch`` is what the cache holds: each replica's 99th percentile of its own), the
    #: decode step alone at ``batch`` and one prompt's prefill alone, which
    #: ``decode_step_s`` and ``first_token_s`` stretch by the load; None without a rate
    in_flight: float | None = None
    decode_iteration_s: float | None = None
    prefill_s: float | None = None
    #: the estimate whose figures a compile replaced (its decode step's, its prefill's, or
    #: its layout's at another batch), kept beside them as a training plan keeps its
    #: ``estimated_time``; None: the plan is the estimate. Not written to JSON.
    estimate: ServePlan | None = field(default=None, compare=False, repr=False)

    @property
    def estimated(self) -> ServePlan:
        """The plan as estimated, before any compile replaced its figures."""
        return self.estimate if self.estimate is not None else self

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, omit=("estimate",))

    @property
    def memory_bytes_per_device(self) -> int:
        return (
            self.weight_bytes_per_device + self.cache_bytes_per_device + self.temp_bytes_per_device
        )

    @property
    def fits(self) -> bool:
        return memory_fits(self.memory_bytes_per_device, self.memory_limit_bytes)

    @property
    def tensor_parallel(self) -> int:
        return self.mesh["model"]

    @property
    def replicas(self) -> int:
        """The attention's data-parallel replicas: the shards of the batch (over ``data``,
        or over ``expert`` where the experts are split)."""
        return self.mesh.get("data", 1) * self.mesh.get("expert", 1)

    @property
    def expert_parallel(self) -> int:
        """The devices a mixture's routed experts are split over (1: each replica holds
        every expert)."""
        return self.mesh.get("expert", 1)

    @property
    def layout(self) -> _Layout:
        return _Layout(ServeLayout(self.strategy), self.tensor_parallel, self.replicas)

    @property
    def batch_axis(self) -> str | None:
        """The mesh axis the sequences are split over (None without replicas)."""
        return next((a for a in ("data", "expert") if a in self.mesh), None)

    @property
    def label(self) -> str:
        return f"{self.strategy} {format_mesh_spec(self.mesh)} batch {self.batch}"


@dataclass(frozen=True)
class ServeResult(Record):
    """Every layout and batch that fits, best throughput per chip first; ``best`` is the
    highest throughput per chip (with ``latency``, among the plans whose time per output
    token meets it); ``front`` the plans no other beats on both latency and throughput."""

    model: str
    devices: int
    hardware: str
    prompt: int
    output: int
    context: int
    weights: str
    cache: str
    latency: float | None
    plans: tuple[ServePlan, ...]
    #: a mixture's routing as served: the busiest expert's tokens over its even share, and
    #: whether each token goes once to each device of its experts
    imbalance: float = 1.0
    dispatch_once: bool = False
    #: requests a second arriving at the devices (None: each plan at its batch)
    rate: float | None = None

    @property
    def best(self) -> ServePlan:
        return self.plans[0]

    @property
    def backend(self) -> str:
        """What computed the plans: the roofline (nothing compiled)."""
        return "estimate"

    @property
    def front(self) -> tuple[ServePlan, ...]:
        return tuple(p for p in self.plans if p.pareto)


def serve(model: str | ModelConfig, devices: int, **knobs: Any) -> ServeResult:
    """Plans serving ``model`` on ``devices``: :func:`serve_request` of the
    :class:`~shardscope._src.plan.request.ServeRequest` that ``model``, ``devices`` and the
    keywords (its fields: ``prompt=`` and ``output=`` are required) make.

    Raises:
        TypeError: a keyword that is not a field of the request.
        PlanError: see :class:`~shardscope._src.plan.request.ServeRequest` and
            :func:`serve_request`.
    """
    return serve_request(ServeRequest(model, devices, **knobs))


def serve_request(request: ServeRequest) -> ServeResult:
    """Plans serving the request's ``model`` on ``devices`` of ``hardware``: prompts of
    ``prompt`` tokens, ``output`` tokens generated each, a KV cache of ``context`` (default:
    ``prompt + output``) per sequence, ``weights`` and ``cache`` in bfloat16, float16, int8 or fp8
    (see the module docstring). ``batch`` fixes the sequences served at once (default: every
    power of two that fits, and the largest that does); ``latency`` (seconds per output
    token) keeps the plans that meet it. ``compiler`` None (the default) or the hardware's
    own target name: the best plan of each layout has its decode step and its prefill
    compiled by the hardware's own compiler, deviceless, where it has one (and the weights
    and cache are in the model's dtype or in 8 bits): its memory, collectives and times are
    then the compiled programs' (:func:`compile_decode`, :func:`compile_prefill`);
    ``"cpu"``: the roofline alone, nothing compiled (a CPU compile of the served program
    would say nothing of the hardware's memory or its collectives). 8-bit weights halve a
    decode step's traffic; int8 ones are weight-only (their matmuls compute in the model's
    dtype), fp8 ones on a device with fp8 matmul units are multiplied in fp8
    (:func:`fp8_matmuls`), which speeds a prefill's matmuls too. ``imbalance`` and
    ``dispatch_once`` set a dropless mixture's routing as :class:`ModelConfig` has them (the
    busiest expert's tokens over its even share; each token once to each device of its
    experts), in place of the model's. ``rate`` (requests a second, arriving at random at
    the devices, spread evenly over the replicas) plans online serving
    (:mod:`~shardscope._src.serve.online`): each layout holds the sequences in flight at
    that rate (each replica's 99th percentile of them, as its batch), and its time per output token
    and to the first token are those its requests see, prefills batched in flight beside
    the decode; the best is the fastest per output token. Give ``batch`` or ``rate``, not
    both.

    Raises:
        PlanError: a bad count, format or compiler (naming it); a batch or context that
            fits no layout (naming the largest that fits and on how many devices); a latency
            no layout meets (naming the fastest layout and its time per output token); a
            rate no layout sustains (naming the most one does).
        ModelConfigError: a model without a vocabulary (the serving steps take tokens), or
            a routing it cannot have (an imbalance of a dense or capacity-padded model).
    """
    devices, prompt, output = request.devices, request.prompt, request.output
    batch, weights, cache = request.batch, request.weights, request.cache
    latency, rate = request.latency, request.rate
    name, config = _model(request.model)
    if request.imbalance is not None:
        config = replace(config, imbalance=request.imbalance)
    if request.dispatch_once is not None:
        config = replace(config, dispatch_once=request.dispatch_once)
    hw = request.device
    ctx = request.context_tokens
    layouts = _layouts(config, devices)
    if not layouts:
        raise PlanError(
            f"devices={devices}: no tensor-parallel size divides both them and the "
            f"{config.heads} heads, and divides or is a multiple of the {config.kv_heads} "
            f"key/value heads; choose a device count with a divisor of {config.kv_heads}",
            param="devices",
        )
    online = (
        None
        if rate is None
        else _Online(rate, config, hw, devices, prompt, output, ctx, weights, cache)
    )
    plans = []
    for layout in layouts:
        r = layout.replicas
        if online is not None:
            held = online.plan(layout)
            plans.extend([] if held is None else [held])
            continue
        sizes = (
            [batch]
            if batch is not None
            else _batches(config, hw, layout, prompt, ctx, weights, cache)
        )
        for b in sizes:
            if b % r:
                continue
            plans.append(_plan(config, hw, layout, b, prompt, ctx, weights, cache))
    fitting = [p for p in plans if p.fits]
    if not fitting and online is not None:
        raise online.error()
    if not fitting:
        text, param = _no_fit(config, hw, devices, batch, prompt, ctx, weights, cache)
        raise PlanError(text, param=param)
    # at a rate, the latency is met (or not) by the times the load gives
    per_token = None if rate is not None else latency
    fitting = _meeting(fitting, per_token)
    compiled = request.compile_target is not None
    if compiled and {weights, cache} <= {config.dtype, *EIGHT_BIT}:
        fitting, prefills, refits = _compile_best(
            fitting,
            config,
            hw,
            prompt,
            weights,
            cache,
            fixed=batch is not None or rate is not None,
        )
        fitting = [p for p in fitting if p.fits]
        fitting = _compile_leaders(fitting, prefills, config, hw, prompt, weights, cache, per_token)
        if not fitting and online is not None:
            raise online.error(refits=refits)
        if not fitting and refits:
            misfit, smaller = max(refits, key=lambda pair: pair[1].batch)
            raise PlanError(
                f"batch={batch} fits no layout once compiled by the {hw.name} compiler: "
                f"{misfit.label} holds {format_bytes(misfit.memory_bytes_per_device)} a device "
                f"of {format_bytes(misfit.memory_limit_bytes)}; its program fits "
                f"{smaller.batch}: give batch={smaller.batch} or less",
                param="batch",
            )
        if not fitting:
            text, param = _no_fit(config, hw, devices, batch, prompt, ctx, weights, cache)
            raise PlanError(text, param=param)
        fitting = _meeting(fitting, per_token)  # as compiled
    if online is not None:
        loaded = [online.loaded(p) for p in fitting]
        if not any(loaded):
            raise online.error(compiled=[p for p in fitting if p.compiled_by is not None])
        fitting = _meeting([p for p in loaded if p is not None], latency, at_rate=True)
    fitting.sort(key=_RANK)
    # the lower the better: at a request rate, which every plan delivers, the time to the
    # first token in place of the throughput per chip
    front = pareto_front(
        fitting,
        lambda p: p.decode_step_s,
        (lambda p: p.first_token_s) if rate is not None else (lambda p: -p.tokens_per_s_per_chip),
    )
    ranked = tuple(replace(p, pareto=i in front) for i, p in enumerate(fitting))
    return ServeResult(
        model=name,
        devices=devices,
        hardware=hw.name,
        prompt=prompt,
        output=output,
        context=ctx,
        weights=weights,
        cache=cache,
        latency=latency,
        plans=ranked,
        imbalance=config.imbalance,
        dispatch_once=config.dispatch_once,
        rate=rate,
    )


def _round_down(x: float) -> float:
    """``x`` to three significant figures, rounded down (a rate suggested is one met)."""
    if x <= 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.floor(x / unit * (1 + 1e-12)) * unit


@dataclass(frozen=True)
class _Online:
    """Serving at a request rate (:mod:`~shardscope._src.serve.online`): the rate, and what
    planning a layout at it needs."""

    rate: float
    config: ModelConfig
    hw: Hardware
    devices: int
    prompt: int
    output: int
    context: int
    weights: str
    cache: str

    def one(self, layout: _Layout) -> _Held:
        """What one sequence a replica holds on a device."""
        c = self
        return _held(c.config, layout, layout.replicas, c.prompt, c.context, c.weights, c.cache)

    def sequence_s(self, plan: ServePlan) -> float:
        """What one more sequence a replica adds to ``plan``'s decode step: its cache read
        through HBM; on a compiled plan, at least its share of the program's traffic beyond
        the weights it reads (its cache and whatever else the program moves for it: float32
        scores, logits)."""
        per_replica = plan.batch // plan.replicas
        hw = self.hw
        cached = matmul_read_seconds(hw, plan.cache_bytes_per_device / per_replica)
        if plan.compiled_by is None:
            return cached
        looked_up = _looked_up_bytes(self.config, plan.layout, self.weights)
        read = matmul_read_seconds(hw, plan.weight_bytes_per_device - looked_up)
        beyond = plan.decode_memory_s - read
        return max(cached, beyond / per_replica)

    def load(self, plan: ServePlan, rate: float | None = None) -> Load | None:
        """``plan``'s replica at its share of ``rate`` (default: the rate planned): its
        decode step and its prefill alone are the plan's. Replicas over ``expert`` run
        their layers in lockstep (an all-to-all each), so each stalls for every prefill."""
        rate = self.rate if rate is None else rate
        r = plan.replicas
        return under_load(
            rate=rate / r,
            output=self.output,
            decode_s=plan.decode_step_s,
            sequences=plan.batch // r,
            sequence_s=self.sequence_s(plan),
            prefill_s=plan.first_token_s,
            prefill_rate=rate if plan.expert_parallel > 1 else None,
        )

    def plan(self, layout: _Layout, rate: float | None = None) -> ServePlan | None:
        """The layout's plan (estimated) at the batch that holds its sequences in flight:
        each replica's 99th percentile of them (:data:`~shardscope._src.serve.online.
        PEAK_QUANTILE`), planned again until it holds what its times put in flight (a
        mixture's decode step reads more experts at a larger batch); None where its
        replicas do not sustain the rate."""
        c, r = self, layout.replicas
        tried: dict[int, ServePlan] = {}
        k = 1
        for _ in range(16):  # a round or two: the batch moves the mean in flight little
            plan = _plan(c.config, c.hw, layout, k * r, c.prompt, c.context, c.weights, c.cache)
            load = self.load(plan, rate)
            if load is None:
                return None
            tried[k] = plan
            peak = max(1, poisson_quantile(load.in_flight))
            if peak == k or (peak < k and peak in tried):  # held, or going back: keep the larger
                return plan
            k = peak
        return tried[max(tried)]

    def loaded(self, plan: ServePlan, rate: float | None = None) -> ServePlan | None:
        """``plan`` at the rate: its time per output token and to the first token as its
        requests see them, its throughput per chip the rate's tokens; its batch raised
        where its (compiled) times put more in flight than it holds, each sequence added
        with its cache and its decode step's temporaries, as estimated. None where it does
        not sustain the rate, or does not hold those sequences."""
        rate = self.rate if rate is None else rate
        load = self.load(plan, rate)
        if load is None:
            return None
        r = plan.replicas
        per_replica = plan.batch // r
        extra = max(0, poisson_quantile(load.in_flight) - per_replica)
        one = self.one(plan.layout)
        if plan.memory_bytes_per_device + extra * (one.cache + one.decode) > (
            plan.memory_limit_bytes
        ):
            return None
        return replace(
            plan,
            batch=(per_replica + extra) * r,
            cache_bytes_per_device=plan.cache_bytes_per_device + extra * one.cache,
            temp_bytes_per_device=plan.temp_bytes_per_device + extra * one.decode,
            decode_step_s=load.token_s,
            first_token_s=load.first_token_s,
            tokens_per_s_per_chip=rate * self.output / self.devices,
            in_flight=load.in_flight * r,
            decode_iteration_s=plan.decode_step_s + extra * self.sequence_s(plan),
            prefill_s=plan.first_token_s,
        )

    def error(
        self,
        compiled: Sequence[ServePlan] = (),
        refits: Sequence[tuple[ServePlan, ServePlan]] = (),
    ) -> PlanError:
        """The error of a rate no layout sustains, naming why on the layout that sustains
        the most, and that rate (rounded down to three figures): among the ``compiled``
        plans that fit where there are some, else by the compiled misfits' times and the
        batches their programs fit (``refits``), else by the estimates."""
        c = self
        fill = (
            "its prefills, and its decode steps slowed by each sequence more in flight, fill "
            "a replica's time"
        )

        def peak_of(load: Load) -> str:
            return f"its {poisson_quantile(load.in_flight)} sequences a replica at the peaks"

        # each test: a layout, and why it does not sustain a rate (None: it does)
        tests: list[tuple[str, Any]] = []
        for p in compiled:

            def loaded(rate: float, p: ServePlan = p) -> str | None:
                load = self.load(p, rate)
                if load is None:
                    return fill
                if self.loaded(p, rate) is None:
                    return f"{peak_of(load)} do not fit beside its compiled program"
                return None

            tests.append((p.label, loaded))
        for misfit, smaller in refits:

            def held(
                rate: float, misfit: ServePlan = misfit, fits: int = smaller.batch
            ) -> str | None:
                load = self.load(misfit, rate)
                if load is None:
                    return fill
                if poisson_quantile(load.in_flight) * misfit.replicas > fits:
                    holds = fits // misfit.replicas
                    return f"{peak_of(load)} pass the {holds} its compiled program holds"
                return None

            tests.append((misfit.label, held))
        if not tests:
            for layout in _layouts(c.config, c.devices):
                mesh = layout.mesh.spec

                def fits(rate: float, layout: _Layout = layout) -> str | None:
                    plan = self.plan(layout, rate)
                    if plan is None:
                        return fill
                    if not plan.fits:
                        return (
                            f"its {plan.batch // plan.replicas} sequences a replica at the "
                            f"peaks need {format_bytes(plan.memory_bytes_per_device)} a device "
                            f"of {format_bytes(plan.memory_limit_bytes)}"
                        )
                    return None

                tests.append((f"{layout.strategy} {mesh}", fits))
        most, where, why = 0.0, "", fill
        for label, fails in tests:
            lo, hi = 0.0, self.rate
            for _ in range(48):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if fails(mid) else (mid, hi)
            if lo > most or not where:
                most, where, why = lo, label, fails(self.rate) or fill
        once = f" once compiled by the {c.hw.name} compiler" if compiled or refits else ""
        head = (
            f"rate={self.rate:g} requests/s: no layout of {c.devices} x {c.hw.name} sustains "
            f"it{once}"
        )
        if most <= 0:
            text, _ = _no_fit(
                c.config, c.hw, c.devices, None, c.prompt, c.context, c.weights, c.cache
            )
            return PlanError(f"{head}; {text}", param="rate")
        most = _round_down(most)
        return PlanError(
            f"{head}: on {where}, {why}; the most it sustains is {most:g} requests/s: give "
            f"rate={most:g} or less, or more devices",
            param="rate",
        )


def _meeting(
    plans: list[ServePlan], latency: float | None, *, at_rate: bool = False
) -> list[ServePlan]:
    """The plans whose time per output token meets ``latency`` (all of them without one);
    ``at_rate``, the times at a request rate."""
    if latency is None:
        return plans
    meet = [p for p in plans if p.decode_step_s <= latency]
    if not meet:
        fastest = min(plans, key=lambda p: p.decode_step_s)
        raise PlanError(
            f"latency={latency * 1e3:g} ms per output token: no layout meets it; the "
            f"fastest is {fastest.label} at {format_seconds(fastest.decode_step_s)}"
            + (" at this rate; a lower rate stretches its tokens less" if at_rate else ""),
            param="latency",
        )
    return meet


def _model(model: str | ModelConfig) -> tuple[str, ModelConfig]:
    if isinstance(model, ModelConfig):
        config, name = model, "custom"
    else:
        preset = model_preset(model)
        config, name = preset.config(batch=1), preset.name
    check_servable(config)
    return name, config


class ServeLayout(Vocab):
    """How a server lays a model over its devices: the strategy of that name on a mesh of
    ``model`` and, with replicas, ``data`` or ``expert``."""

    TP = "tp"  # tensor parallelism over every device
    DP_TP = "dp_tp"  # replicas of tensor parallelism, each holding every expert
    EP_TP = "ep_tp"  # replicas of tensor parallelism that split a mixture's experts


@dataclass(frozen=True)
class _Layout:
    """``replicas`` of tensor parallelism over ``t`` devices; a mixture's routed experts
    split over the replicas (``ep_tp``: the attention data-parallel over ``expert``, each
    device ``experts / replicas`` experts) or held by each (``dp_tp``)."""

    strategy: ServeLayout
    t: int
    replicas: int

    @property
    def mesh(self) -> MeshShape:
        """``model=t``, with ``data`` (or ``expert``) first where there are replicas."""
        r, t = self.replicas, self.t
        if self.strategy is ServeLayout.EP_TP:
            return MeshShape((("expert", r), ("model", t)))
        return MeshShape((("data", r), ("model", t)) if r > 1 else (("model", t),))

    @property
    def expert_parallel(self) -> int:
        return self.replicas if self.strategy is ServeLayout.EP_TP else 1


def _layouts(config: ModelConfig, devices: int) -> list[_Layout]:
    """Every tensor-parallel size ``t`` dividing the devices, the heads and the MLPs' widths
    (the dense one, and a mixture's experts' and shared experts'), and dividing or a
    multiple of the key/value heads, with the devices it leaves as replicas; a mixture's
    replicas also split its experts where they divide them (``ep_tp``)."""
    kv = config.kv_heads
    assert kv is not None
    widths = [config.ff] if config.dense_layer_count else []
    if config.is_moe:
        widths.append(config.expert_ff or config.ff)
    out = []
    for t in divisors(devices):
        if not ((kv % t == 0 or t % kv == 0) and config.heads % t == 0):
            continue
        if any(w % t for w in widths):
            continue
        r = devices // t
        out.append(_Layout(ServeLayout.DP_TP if r > 1 else ServeLayout.TP, t, r))
        if config.is_moe and r > 1 and config.experts % r == 0:
            out.append(_Layout(ServeLayout.EP_TP, t, r))
    return [layout for layout in out if _places(config, layout)]


def _places(config: ModelConfig, layout: _Layout) -> bool:
    """Whether the layout's placement splits every dimension it shards evenly (the
    vocabulary over ``model`` too)."""
    try:
        _weight_elements(config, layout)
    except StrategyError:
        return False
    return True


def served(config: ModelConfig, t: int) -> ModelConfig:
    """``config`` as tensor parallelism over ``t`` holds it: the same model, with each
    key/value head replicated ``t / kv_heads`` times where ``t`` is a multiple of them (its
    projection weights and its cache on each device that serves its query heads)."""
    assert config.kv_heads is not None
    return config if config.kv_heads % t == 0 else replace(config, kv_heads=t)


@functools.cache
def _weight_elements(config: ModelConfig, layout: _Layout) -> tuple[int, int]:
    """``(weights, routed experts)``: the elements of them one device holds, as the layout's
    placement splits each (the vocabulary split over ``model``; what the strategy keeps
    whole, such as the norms' gains, latent attention's down-projections and a router, on
    every device)."""
    c = replace(served(config, layout.t), batch=layout.replicas, seq=1)
    strategy = get_strategy(layout.strategy).with_vocab_split()
    placement = strategy.place(c, abstract_mesh(layout.mesh))
    rules = strategy.param_rules()
    return elements_per_device(placement, rules), elements_per_device(placement, rules, "expert_")


def _expert_bytes(config: ModelConfig, layout: _Layout, weights: str) -> int:
    """The routed experts' bytes on one device: split ``t`` ways by tensor parallelism and
    over the expert axis."""
    return _weight_elements(config, layout)[1] * FORMATS[weights]


def _looked_up_bytes(config: ModelConfig, layout: _Layout, weights: str) -> int:
    """The embedding table's bytes on one device (split over the vocabulary), which a step
    reads a row of a token from, not whole; 0 where the unembedding multiplies by it (tied
    embeddings) and so reads it all."""
    if config.tie_embeddings or not config.vocab:
        return 0
    return config.vocab // layout.t * config.d_model * FORMATS[weights]


def untouched_share(config: ModelConfig, layout: _Layout, batch: int) -> float:
    """The expected share of a device's routed experts that no token of a decode step of
    ``batch`` sequences is routed to (uniform routing): each of the ``n`` tokens that can
    reach them picks ``top_k`` of the ``experts``, so an expert is missed by all with
    probability ``(1 - top_k / experts) ^ n``; ``n`` is the whole batch where the experts
    serve every replica (split over them, or under tensor parallelism alone), a replica's
    share where each replica holds its own. A server's grouped matmul (vLLM's and
    TensorRT-LLM's fused MoE kernels) reads only the experts it has tokens for.

    >>> mixtral = model_preset("mixtral-8x7b").config(batch=1)
    >>> untouched_share(mixtral, _Layout("tp", 8, 1), 1)  # one token: 6 of the 8 experts
    0.75
    >>> round(untouched_share(mixtral, _Layout("tp", 8, 1), 16), 3)
    0.01
    """
    if not config.is_moe:
        return 0.0
    n = batch // layout.replicas * layout.expert_parallel
    return (1 - config.top_k / config.experts) ** n


def _scores_bytes(config: ModelConfig, t: int, queries: int, keys: int) -> int:
    """One layer's attention scores (float32) and probabilities (the model's dtype) on a
    device of tensor parallelism over ``t``: ``queries x keys`` for each of its heads (the
    layers run one after another, so one layer's are held at a time)."""
    return config.heads // t * queries * keys * (4 + config.itemsize)


class _Held(NamedTuple):
    """Bytes on one device: the weights, the cache, the decode step's temporaries (the
    logits, float32, each device its slice of the vocabulary; a layer's scores and
    probabilities over the context) and a prefill's beside them (one prompt a replica: a
    layer's scores and probabilities over the prompt)."""

    weights: int
    cache: int
    decode: int
    prefill: int

    @property
    def temporaries(self) -> int:
        return max(self.decode, self.prefill)


def _held(
    config: ModelConfig,
    layout: _Layout,
    batch: int,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
) -> _Held:
    """What one device holds serving ``batch`` sequences (:class:`_Held`)."""
    t, r = layout.t, layout.replicas
    c = served(config, t)
    weight = _weight_elements(config, layout)[0] * FORMATS[weights]
    cached = (batch // r) * context * cache_bytes_per_token(c, cache)
    # split by key/value head; latent attention's latent is every head's, whole on each
    cached //= 1 if c.is_mla else t
    decode = (batch // r) * ((c.vocab or 0) // t * 4 + _scores_bytes(c, t, 1, context))
    return _Held(weight, cached, decode, _scores_bytes(c, t, prompt, prompt))


def _largest_batch(
    config: ModelConfig,
    hw: Hardware,
    layout: _Layout,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
) -> int:
    """The most sequences the layout's replicas hold beside their weights and a prefill's
    temporaries (a multiple of the replicas; 0 when the weights alone do not leave room for
    one)."""
    r = layout.replicas
    one = _held(config, layout, r, prompt, context, weights, cache)  # a sequence a replica
    room = hw.memory_bytes - one.weights
    if room <= 0:
        return 0
    return r * int(min(room // (one.cache + one.decode), max(0, room - one.prefill) // one.cache))


def _batches(
    config: ModelConfig,
    hw: Hardware,
    layout: _Layout,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
) -> list[int]:
    """Powers of two times the replicas, and the largest batch that fits a device."""
    r = layout.replicas
    largest = _largest_batch(config, hw, layout, prompt, context, weights, cache)
    largest = min(largest, MAX_BATCH * r)
    out = []
    b = r
    while b <= largest:
        out.append(b)
        b *= 2
    if largest >= r and largest not in out:
        out.append(largest)
    return out or [r]


def _allreduce_s(hw: Hardware, layout: _Layout, elements: int, itemsize: int, count: int) -> float:
    t = layout.t
    if t == 1:
        return 0.0
    # collective_seconds takes the traffic of all ``count`` executions
    traffic = count * traffic_bytes(ALL_REDUCE, elements * itemsize, t)
    return collective_seconds(hw, layout.mesh, ALL_REDUCE, ("model",), t, traffic, count)


def _tp_allreduces_s(hw: Hardware, config: ModelConfig, layout: _Layout, tokens: int) -> float:
    """Tensor parallelism's all-reduces for ``tokens`` a replica: the attention's output in
    every layer, the MLP's down projection in every dense layer, the vocabulary-parallel
    embedding's once; in a layer with experts, the routed experts' outputs, summed in their
    slots before they are combined (``top_k`` rows a token, times the routing's capacity)."""
    c = config
    dense = _allreduce_s(
        hw, layout, tokens * c.d_model, c.itemsize, c.layers + c.dense_layer_count + 1
    )
    if not c.is_moe:
        return dense
    slots = math.ceil(c.routed_capacity * tokens * c.top_k)
    return dense + _allreduce_s(hw, layout, slots * c.d_model, c.itemsize, c.moe_layers)


def _all_to_all_s(hw: Hardware, config: ModelConfig, layout: _Layout, tokens: int) -> float:
    """A mixture's dispatch and combine over the expert axis, every layer with experts, for
    ``tokens`` over the axis (:func:`~shardscope._src.bounds.moe.moe_layer_terms`: each
    token's activations to its experts' devices and back; under tensor parallelism each
    device of a replica sends its copy of them, in parallel over its own expert group)."""
    e = layout.expert_parallel
    if e == 1 or not config.is_moe:
        return 0.0
    terms = moe_layer_terms(
        tokens,
        config.d_model,
        config.top_k,
        config.experts,
        "expert",
        e,
        config.itemsize,
        imbalance=config.routed_capacity,
        once=config.dispatch_once,
    )
    layers = config.moe_layers
    return sum(
        collective_seconds(
            hw, layout.mesh, term.kind, ("expert",), e, term.traffic_bytes * layers, layers
        )
        for term in terms
    )


def fp8_matmuls(hw: Hardware, weights: str | None) -> bool:
    """Whether the weights' matmuls run in fp8: fp8 weights on a device with fp8 matmul
    units, whose servers run them as fp8 GEMMs (TensorRT-LLM's and vLLM's fp8 checkpoints
    quantize each layer's input per tensor); the attention core stays 16-bit. Elsewhere, and
    for int8 weights (the scaling book's inference examples time int8 weights at the bf16
    rate), the weights are widened to 16 bits for their matmuls."""
    return WeightFormat.get(weights) is WeightFormat.FP8 and hw.has_fp8


def _decode_flops(config: ModelConfig, context: int) -> tuple[int, int]:
    """A sequence's matmul FLOPs in a decode step over a cache of ``context``: the
    weights' (``2 x`` the active parameters) and the attention's, its one query against the
    cache (under latent attention against the latents, the up-projections absorbed).

    >>> from shardscope._src.model.presets import model_preset
    >>> _decode_flops(model_preset("llama3-8b").config(batch=1), 1)[1] == 2 * 32 * 256 * 32
    True
    """
    core = attention_core_flops(config, 1, context, absorbed=True) * config.layers
    return weight_flops(config.active_param_count(), 1), core


def _prefill_flops(config: ModelConfig, prompt: int) -> tuple[int, int]:
    """The matmul FLOPs of prefilling one ``prompt``: the weights' and the attention's,
    counted non-causal as training counts them and as the compiled prefill computes them
    (its masked scores whole); a fused kernel's causal half is half of them (each head's
    keys and values made from the latents under latent attention: prefill's form)."""
    core = attention_core_flops(config, prompt, prompt) * config.layers
    return weight_flops(config.active_param_count(), prompt), core


def _plan(
    config: ModelConfig,
    hw: Hardware,
    layout: _Layout,
    batch: int,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
) -> ServePlan:
    t, r = layout.t, layout.replicas
    c = served(config, t)
    held = _held(config, layout, batch, prompt, context, weights, cache)
    weight, cached = held.weights, held.cache
    per_replica = batch // r
    skipped = untouched_share(c, layout, batch) * _expert_bytes(config, layout, weights)
    read = weight - _looked_up_bytes(config, layout, weights)
    # the weights' matmuls read the weights, the attention the cache
    w, a = (f * per_replica / t for f in _decode_flops(c, context))
    fp8 = fp8_matmuls(hw, weights)
    per_w, per_a = flop_seconds(hw, fp8=fp8)
    by_weights = (w * per_w, matmul_read_seconds(hw, read - skipped))
    by_cache = (a * per_a, matmul_read_seconds(hw, cached))
    memory_s, compute_s = by_weights[1] + by_cache[1], by_weights[0] + by_cache[0]
    comm_s = _tp_allreduces_s(hw, c, layout, per_replica)
    comm_s += _all_to_all_s(hw, c, layout, batch)
    decode = work_seconds(hw, by_weights, by_cache) + comm_s
    of = _prefill_flops(c, prompt)
    matmuls = step_matmul_seconds(hw, sum(of) / t, of, fp8=fp8, fused_attention=True)
    prefill = work_seconds(hw, (matmuls, matmul_read_seconds(hw, read)))
    prefill += _tp_allreduces_s(hw, c, layout, prompt)
    # one prompt a replica: the expert axis's devices prefill theirs together
    prefill += _all_to_all_s(hw, c, layout, prompt * layout.expert_parallel)
    return ServePlan(
        strategy=layout.strategy,
        mesh=layout.mesh.sizes,
        batch=batch,
        context=context,
        weight_bytes_per_device=weight,
        cache_bytes_per_device=cached,
        temp_bytes_per_device=held.temporaries,
        memory_limit_bytes=int(hw.memory_bytes),
        decode_step_s=decode,
        decode_memory_s=memory_s,
        decode_compute_s=compute_s,
        decode_comm_s=comm_s,
        first_token_s=prefill,
        tokens_per_s_per_chip=batch / decode / (t * r),
        kv_replicas=(c.kv_heads or 1) // (config.kv_heads or 1),
    )


#: Decode steps compiled per layout at most, largest batch first, until one fits.
COMPILES_PER_LAYOUT = 4

#: Decode steps compiled at most after those, while an estimated plan ranks first.
SERVE_LEADER_COMPILES = 4


#: A plan's layout: its strategy and mesh.
_LayoutKey = tuple[str, MeshShape]


def _key(plan: ServePlan) -> _LayoutKey:
    return plan.strategy, MeshShape.of(plan.mesh)


#: Best first: the throughput per chip, then the time per output token.
_RANK: Callable[[ServePlan], tuple[Any, ...]] = rank_key(
    lambda p: -p.tokens_per_s_per_chip, lambda p: p.decode_step_s
)


def _beside(compiled: ServePlan, prefilled: ServePlan) -> ServePlan:
    """``compiled`` (a decode step) with its layout's compiled prefill: its time to first
    token, and its buffers beyond the weights where they pass the decode step's
    temporaries (``prefilled``'s temporaries are those alone)."""
    return replace(
        compiled,
        first_token_s=prefilled.first_token_s,
        temp_bytes_per_device=max(compiled.temp_bytes_per_device, prefilled.temp_bytes_per_device),
    )


def _beside_compiled(estimate: ServePlan, compiled: ServePlan, hw: Hardware) -> ServePlan:
    """An estimated plan of a layout whose decode step and prefill are compiled at another
    batch: the compiled prefill's time to first token, and its decode step launching as
    many kernels as the compiled one (as near as is known uncompiled: the compiler fuses a
    little differently at each batch, Llama 3 70B's ``dp_tp`` step on 8 H100s launching
    963 kernels at batch 456 and 1,123 at 48)."""
    kernels = compiled.decode_kernels
    step = estimate.decode_step_s + launch_seconds(hw, kernels)
    chips = estimate.replicas * estimate.tensor_parallel
    return replace(
        estimate,
        first_token_s=compiled.first_token_s,
        decode_step_s=step,
        decode_kernels=kernels,
        tokens_per_s_per_chip=estimate.batch / step / chips,
        estimate=estimate.estimated,
    )


def _prefill_alone(
    compiled: ServePlan, config: ModelConfig, hw: Hardware, prompt: int, weights: str, cache: str
) -> ServePlan:
    """``compiled`` with its layout's compiled prefill, its temporaries the prefill's alone
    (beyond the weights)."""
    alone = replace(compiled, temp_bytes_per_device=0)
    return compile_prefill(alone, config, hw, prompt, weights=weights, cache=cache)


def _compile_best(
    plans: list[ServePlan],
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    weights: str,
    cache: str,
    *,
    fixed: bool = False,
) -> tuple[list[ServePlan], dict[_LayoutKey, ServePlan], list[tuple[ServePlan, ServePlan]]]:
    """``plans`` with the best of each layout compiled: its largest batch first, and while
    the compiled program does not fit, the largest batch it would fit at (its excess over
    the memory taken off in sequences, each replica's cache and temporaries a sequence), or
    the next smaller (at most :data:`COMPILES_PER_LAYOUT` compiles); the batches above the
    largest that fits compiled are dropped with the misfits. The layout's prefill is
    compiled once, beside its first decode step that fits: its time to first token is every
    plan's of the layout (one prompt a replica, whatever the batch), its buffers count
    towards each compiled plan's memory (a server prefills beside the cache it decodes
    from), so that a decode step that fits alone may not beside them.

    With a ``fixed`` batch (the user's) no other is tried: a compiled misfit is returned
    beside the largest batch its program would fit at, ``(misfit, smaller)``, for the error
    that names it."""
    layouts: dict[_LayoutKey, list[ServePlan]] = {}
    refits: list[tuple[ServePlan, ServePlan]] = []
    for p in sorted(plans, key=lambda p: -p.batch):
        layouts.setdefault(_key(p), []).append(p)
    out: list[ServePlan] = []
    prefills: dict[_LayoutKey, ServePlan] = {}
    for key, group in layouts.items():
        queue, tries = list(group), 0
        while queue and tries < COMPILES_PER_LAYOUT:
            p, tries = queue.pop(0), tries + 1
            compiled = compile_decode(p, config, hw, weights=weights, cache=cache)
            if compiled.fits:
                if key not in prefills:
                    prefills[key] = _prefill_alone(compiled, config, hw, prompt, weights, cache)
                compiled = _beside(compiled, prefills[key])
            if compiled.fits:
                rest = [_beside_compiled(q, compiled, hw) for q in queue]
                out.extend([compiled, *rest])
                queue = []
                break
            smaller = _refit(p, compiled, config, hw, prompt, weights, cache)
            if fixed:
                if smaller is not None:
                    refits.append((compiled, smaller))
                continue
            if smaller is not None and (not queue or smaller.batch > queue[0].batch):
                queue.insert(0, smaller)
        out.extend(queue)  # estimated: beyond the compiles a layout takes
    return out, prefills, refits


def _compile_leaders(
    plans: list[ServePlan],
    prefills: dict[_LayoutKey, ServePlan],
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    weights: str,
    cache: str,
    latency: float | None,
) -> list[ServePlan]:
    """``plans`` (those that fit) with the first-ranked one compiled while it is an estimate
    (at most :data:`SERVE_LEADER_COMPILES`): a layout's smaller batch may pass its compiled
    largest by the roofline, and the compiled program says whether it does (a misfit
    dropped). Among the plans that meet ``latency``, where given."""
    for _ in range(SERVE_LEADER_COMPILES):
        meeting = [p for p in plans if latency is None or p.decode_step_s <= latency]
        top = min(meeting, key=_RANK, default=None)
        if top is None or top.compiled_by is not None:
            break
        compiled = compile_decode(top, config, hw, weights=weights, cache=cache)
        key = _key(top)
        if compiled.fits and key not in prefills:
            prefills[key] = _prefill_alone(compiled, config, hw, prompt, weights, cache)
        if key in prefills:
            compiled = _beside(compiled, prefills[key])
        plans = [compiled if p is top else p for p in plans]
        plans = [p for p in plans if p.fits]
    return plans


def _refit(
    plan: ServePlan,
    compiled: ServePlan,
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    weights: str,
    cache: str,
) -> ServePlan | None:
    """The plan of ``plan``'s layout at the largest batch its compiled program (which does
    not fit) would fit at: its excess over the memory taken off a replica's sequence at a
    time, each the cache and the decode step's temporaries of one sequence a replica (as
    estimated; None where no batch is left)."""
    layout = plan.layout
    r = layout.replicas
    one = _held(config, layout, r, prompt, plan.context, weights, cache)  # a sequence a replica
    excess = compiled.memory_bytes_per_device - compiled.memory_limit_bytes
    batch = plan.batch - r * max(1, math.ceil(excess / (one.cache + one.decode)))
    if batch < r:
        return None
    return _plan(config, hw, layout, batch, prompt, plan.context, weights, cache)


@dataclass(frozen=True)
class _Compiled:
    """What one compiled serving step costs a device: its HBM traffic's time and its
    matmul FLOPs (None where its HLO does not count them, see :func:`_compile`), on a GPU
    its kernels' time one after another (None elsewhere), its collectives' time, the bytes
    it holds at once (:attr:`~shardscope._src.cost.memory.CompiledMemory.held_bytes`), its
    all-reduces, and the kernels it launches
    (:func:`~shardscope._src.audit.overlap.kernel_costs`, its attention core one a layer)."""

    memory_s: float | None
    flops: float | None
    kernels_s: float | None
    comm_s: float
    held_bytes: int
    all_reduces: int
    kernels: int

    def deeper(self, shallower: _Compiled, layers: int) -> _Compiled:
        """The costs at ``layers``, from this program of one layer more than
        ``shallower``'s (of :data:`DEPTH`): each further layer adds what the last one did
        (its weights, cache, traffic, FLOPs, kernels, collectives and the temporaries the
        compiler keeps for it)."""

        def at(a: float, b: float) -> float:
            return a + (layers - DEPTH) * (b - a)

        def timed(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else at(a, b)

        return _Compiled(
            memory_s=timed(shallower.memory_s, self.memory_s),
            flops=timed(shallower.flops, self.flops),
            kernels_s=timed(shallower.kernels_s, self.kernels_s),
            comm_s=at(shallower.comm_s, self.comm_s),
            held_bytes=round(at(shallower.held_bytes, self.held_bytes)),
            all_reduces=round(at(shallower.all_reduces, self.all_reduces)),
            kernels=round(at(shallower.kernels, self.kernels)),
        )

    def seconds(
        self, hw: Hardware, memory_s: float, compute_s: float, skipped_s: float = 0.0
    ) -> float:
        """The step's time (:func:`~shardscope._src.cost.compute.compiled_step_seconds`)
        from its traffic ``memory_s`` and its matmuls ``compute_s``, less the reads
        ``skipped_s`` a server does not make."""
        return compiled_step_seconds(
            hw,
            memory_s=memory_s,
            compute_s=compute_s,
            kernels_s=self.kernels_s,
            comm_s=self.comm_s,
            kernels=self.kernels,
            skipped_s=skipped_s,
        )


#: The shallower of the two depths a served program is compiled at (and one more): from
#: the second layer on, each adds the same FLOPs, collectives, arguments and outputs (the
#: first layer's prefill differs from the others' by its fusions), measured on the H100
#: compiler (Llama 3 70B, 1 to 8 layers; a 6-layer model). A few layers' element-wise work
#: is fused differently: the decode step's traffic comes within 0.2% at 6 layers; a 70B
#: prefill's third layer moves 0.29 ms of element-wise traffic where later ones move 0.26,
#: which puts its time 1% over at 6 layers and about 2% over at 80. The decode step's
#: temporaries come within 1 MiB; a prefill's grow by uneven steps on a small model (the
#: extrapolation then holds more than the whole program: 20 MB against 18 at 6 layers) and
#: not at all on a 70B (0.3 GB at every depth, 80 layers included).
DEPTH = 2


def _compile(
    plan: ServePlan, hw: Hardware, flop_s: tuple[float, float], step: Any, *args: Any
) -> _Compiled:
    """The compiled ``step``'s costs: its HBM traffic and matmuls counted from its HLO (on a
    TPU, its asynchronous slices and copies of the weights into on-chip memory read them
    once, :mod:`~shardscope._src.hlo.cost`), its attention core as the one kernel a
    server runs (:data:`~shardscope._src.model.serving.ATTENTION_CORE`); on a GPU each of
    its kernels timed (:func:`~shardscope._src.cost.compute.kernels_seconds`,
    a FLOP of the weights' matmuls and of the attention core's taking ``flop_s``'s
    seconds) and summed; its collectives, its buffers and its kernels."""
    from shardscope._src.audit.overlap import kernel_costs
    from shardscope._src.model.serving import ATTENTION_CORE
    from shardscope._src.plan.compile import compile_plan

    # XLA:GPU's scheduler logs an error line when a program's arguments pass its memory
    # limit's base (the device's memory), as a server's weights and cache may, and its
    # rematerialization a warning when a program does not fit: the compile is sound, and
    # the fit says the rest
    compiled = compile_plan(step, *args, drop=("gpu_hlo_schedule.cc", "hlo_rematerialization.cc"))
    result = compiled.audit
    sizes = dict(plan.mesh)
    memory_s = kernels_s = None
    kernels = 0
    if result.program is not None:
        runs = kernel_costs(result.program.module, scope=ATTENTION_CORE)
        kernels = sum(runs.values())
        if result.hlo_bytes is not None:
            memory_s = sum(n * moved_seconds(hw, k.cost) for k, n in runs.items())
        if result.hlo_bytes is not None and compiled.hlo_flops is not None and by_kernel(hw):
            kernels_s = kernels_seconds(hw, runs, flop_s)
    return _Compiled(
        memory_s=memory_s,
        flops=compiled.hlo_flops,
        kernels_s=kernels_s,
        comm_s=sum(execution_seconds(k, sizes, hw) * k.count for k in result.collectives),
        held_bytes=compiled.memory.held_bytes,
        all_reduces=sum(k.count for k in result.collectives if k.kind == ALL_REDUCE),
        kernels=kernels,
    )


def _compile_layers(
    plan: ServePlan, config: ModelConfig, hw: Hardware, flop_s: tuple[float, float], build: Any
) -> _Compiled:
    """The costs of the served program of ``config.layers`` layers, from its compiles at
    :data:`DEPTH` layers and one more (``build(layers)`` gives the step and its arguments;
    a model that shallow is compiled whole): the layers are unrolled (see
    :mod:`~shardscope._src.model.serving`) and alike, so each adds the same bytes, FLOPs,
    collectives and buffers, and a full-depth compile (minutes for a large model) gives
    what the two shallow ones do. A mixture's layers with experts are the ones counted (its
    dense layers before them compiled in both)."""
    repeated = config.moe_layers if config.is_moe else config.layers
    if repeated <= DEPTH + 1:
        return _compile(plan, hw, flop_s, *build(config.layers))
    first = config.layers - repeated
    shallow = _compile(plan, hw, flop_s, *build(first + DEPTH))
    return _compile(plan, hw, flop_s, *build(first + DEPTH + 1)).deeper(shallow, repeated)


def _placed(
    plan: ServePlan,
    config: ModelConfig,
    hw: Hardware,
    batch: int,
    seq: int,
    layers: int,
    weights: str | None,
) -> Any:
    """``(config, mesh, params, rows, hooks)``: the served model of ``layers`` layers at
    ``batch`` x ``seq``, the layout's compile-only mesh, its weights layer by layer as placed
    shapes (8-bit ones where ``weights`` is ``int8`` or ``fp8``, each with its replicated
    scale), the mesh axis its sequences are split over (None without replicas), and the
    hooks that place a mixture's routed tokens (its expert slots moved to their experts'
    devices: the dispatch and combine; capacity-padded at the routing's imbalance, 1 for
    uniform routing, as the planner compiles a dropless mixture)."""
    import jax
    from jax.sharding import NamedSharding

    from shardscope._src.model.serving import (
        abstract_quantized,
        abstract_serving_params,
        serving_specs,
    )
    from shardscope._src.model.transformer import NO_HOOKS
    from shardscope._src.sharding.programs import JitHooks
    from shardscope._src.targets.mesh import target_mesh

    mesh = target_mesh(hw.name, plan.mesh, axis_types="auto")
    c = replace(served(config, plan.tensor_parallel), batch=batch, seq=seq, layers=layers)
    if c.is_moe:  # padded to the routing's imbalance, which the capacity then bounds
        c = replace(c, capacity_factor=c.routed_capacity, imbalance=1.0)
    shapes = abstract_serving_params(c)
    # a server splits the embedding and the output projection over the vocabulary, as
    # Megatron-LM's and vLLM's vocabulary-parallel layers do (replicated, each device would
    # hold both whole: 4.2 GB of Llama 3 70B's 141)
    strategy = get_strategy(plan.strategy).with_vocab_split()
    placement = strategy.place(c, mesh)
    specs = serving_specs(placement.param_specs(), c)
    if weights in EIGHT_BIT:
        assert weights is not None
        specs = abstract_quantized(shapes, weights, specs)
        shapes = abstract_quantized(shapes, weights)
    params = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s)),
        shapes,
        specs,
    )
    hooks = JitHooks(placement) if c.is_moe else NO_HOOKS
    return c, mesh, params, plan.batch_axis, hooks


def compile_decode(
    plan: ServePlan,
    config: ModelConfig,
    hw: Hardware,
    *,
    weights: str | None = None,
    cache: str | None = None,
) -> ServePlan:
    """``plan`` with its decode step compiled by ``hw``'s compiler on its compile-only
    devices: the reference decoder's :func:`~shardscope._src.model.serving.decode` under the
    layout's placement, the cache donated and split by sequence over the replicas and by
    key/value head over ``model`` (at two depths, :func:`_compile_layers`). The step's
    time becomes the compiled program's (:func:`_compile`: its matmuls and traffic, its
    collectives, and its kernels' launches), the memory per device its buffers (arguments,
    temporaries and the outputs that do not alias the donated cache). ``weights`` and
    ``cache`` of ``int8`` or ``fp8`` compile the 8-bit program
    (:class:`~shardscope._src.model.serving.Quantized`); any other, the model's dtype."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardscope._src.model.serving import abstract_cache, decode

    def build(layers: int) -> tuple[Any, ...]:
        c, mesh, params, rows, hooks = _placed(plan, config, hw, plan.batch, 1, layers, weights)
        # split by sequence over the replicas, and by key/value head over model (latent
        # attention's latents whole on each device of a replica: every head reads them)
        by = P(rows, None, None) if c.is_mla else P(rows, "model", None, None)
        per_layer = NamedSharding(mesh, by)
        whole = NamedSharding(mesh, P())  # an 8-bit cache's scales
        kv = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=per_layer if x.shape else whole
            ),
            abstract_cache(c, plan.batch, plan.context, cache if cache in EIGHT_BIT else None),
        )
        tokens = jax.ShapeDtypeStruct(
            (plan.batch,), jnp.int32, sharding=NamedSharding(mesh, P(rows))
        )
        pos = jax.ShapeDtypeStruct((), jnp.int32, sharding=whole)
        groups = plan.replicas  # a mixture routes each device's sequences apart

        def run(p: Any, k: Any, t: Any, i: Any) -> Any:
            return decode(p, k, t, i, c, hooks, groups=groups)

        step = jax.jit(run, donate_argnums=1)
        return step, params, kv, tokens, pos

    of = _decode_flops(served(config, plan.tensor_parallel), plan.context)
    fp8 = fp8_matmuls(hw, weights)
    got = _compile_layers(plan, config, hw, flop_seconds(hw, fp8=fp8), build)
    # the program's batched expert matmuls read every expert of a device; a server's
    # grouped kernel, those its tokens are routed to (untouched_share)
    layout = plan.layout
    skipped = untouched_share(config, layout, plan.batch) * _expert_bytes(
        config, layout, weights or config.dtype
    )
    skipped_s = matmul_read_seconds(hw, skipped)
    memory_s = plan.decode_memory_s if got.memory_s is None else max(0.0, got.memory_s - skipped_s)
    compute_s = (
        plan.decode_compute_s
        if got.flops is None
        else step_matmul_seconds(hw, got.flops, of, fp8=fp8)
    )
    step_s = got.seconds(hw, memory_s, compute_s, skipped_s)
    return replace(
        plan,
        estimate=plan.estimated,
        temp_bytes_per_device=max(
            0, got.held_bytes - plan.weight_bytes_per_device - plan.cache_bytes_per_device
        ),
        decode_memory_s=memory_s,
        decode_compute_s=compute_s,
        decode_comm_s=got.comm_s,
        decode_step_s=step_s,
        tokens_per_s_per_chip=plan.batch / step_s / (plan.replicas * plan.tensor_parallel),
        compiled_by=hw.name,
        compiled_all_reduces=got.all_reduces,
        decode_kernels=got.kernels,
    )


def compile_prefill(
    plan: ServePlan,
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    *,
    weights: str | None = None,
    cache: str | None = None,
) -> ServePlan:
    """``plan`` with its time to first token from the compiled prefill of one ``prompt`` a
    replica (the reference decoder's :func:`~shardscope._src.model.serving.prefill`, the
    last token's logits; at two depths, :func:`_compile_layers`; ``weights`` and ``cache``
    as :func:`compile_decode` takes them): its matmuls and traffic (:func:`_compile`), its
    collectives and its kernels' launches. Its buffers beyond the weights (the prompt's
    activations, scores and cache) are the plan's temporaries where they pass the decode
    step's: a server prefills beside the cache it decodes from. On a TPU target the plan is
    returned as it is (the prefill estimated)."""
    if TARGETS[hw.name].family != Family.GPU:
        return plan
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardscope._src.model.serving import prefill

    r = plan.replicas
    kept = cache if cache in EIGHT_BIT else None

    def build(layers: int) -> tuple[Any, ...]:
        c, mesh, params, rows, hooks = _placed(plan, config, hw, r, prompt, layers, weights)
        tokens = jax.ShapeDtypeStruct((r, prompt), jnp.int32, sharding=NamedSharding(mesh, P(rows)))

        def run(p: Any, t: Any) -> Any:
            return prefill(p, t, c, prompt, hooks, cache=kept, groups=r)

        return jax.jit(run), params, tokens

    of = _prefill_flops(served(config, plan.tensor_parallel), prompt)
    fp8 = fp8_matmuls(hw, weights)
    flop_s = flop_seconds(hw, fp8=fp8, fused_attention=True)
    got = _compile_layers(plan, config, hw, flop_s, build)
    if got.memory_s is None or got.flops is None:  # an HLO too deep to count
        return plan
    compute_s = step_matmul_seconds(hw, got.flops, of, fp8=fp8, fused_attention=True)
    extra = max(0, got.held_bytes - plan.weight_bytes_per_device)
    return replace(
        plan,
        estimate=plan.estimated,
        first_token_s=got.seconds(hw, got.memory_s, compute_s),
        temp_bytes_per_device=max(plan.temp_bytes_per_device, extra),
    )


def _no_fit(
    config: ModelConfig,
    hw: Hardware,
    devices: int,
    batch: int | None,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
) -> tuple[str, str]:
    """Why nothing fits, and the largest batch that does at this context (on how many
    devices), or that the weights alone do not; with the parameter to change."""
    best: tuple[int, int] | None = None
    for layout in _layouts(config, devices):
        fits = _largest_batch(config, hw, layout, prompt, context, weights, cache)
        if fits and (best is None or fits > best[0]):
            best = (fits, layout.t)
    asked = f"batch={batch} " if batch is not None else ""
    if best is not None:
        t = best[1]
        where = "on each device alone" if t == 1 else f"with tensor parallelism over {t} devices"
    if best is None:
        size = config.param_count() * FORMATS[weights] / 2**30
        need = math.ceil(config.param_count() * FORMATS[weights] / hw.memory_bytes)
        if devices < need:
            return (
                f"{asked}at context={context}: the {weights} weights alone ({size:.1f} GiB) do "
                f"not fit {devices} x {hw.name} with room for one sequence; give more devices "
                f"(at least {need} hold the weights), or int8 or fp8 weights"
            ), "devices"
        # enough devices, but no layout of them splits the weights far enough
        serving = [
            n
            for n in range(1, 2 * devices + 1)
            if any(
                _largest_batch(config, hw, layout, prompt, context, weights, cache)
                for layout in _layouts(config, n)
            )
        ]
        counts = ", ".join(map(str, serving[:8])) or "none up to twice as many"
        return (
            f"{asked}at context={context}: no layout of {devices} x {hw.name} holds the "
            f"{weights} weights ({size:.1f} GiB) with room for one sequence: tensor "
            f"parallelism splits them over a count dividing the {config.heads} heads and the "
            f"MLP widths (and dividing or a multiple of the {config.kv_heads} key/value heads)"
            + (
                f", expert parallelism over one dividing the {config.experts} experts"
                if config.is_moe
                else ""
            )
            + f"; device counts that serve it: {counts}"
        ), "devices"
    return (
        f"{asked}at context={context} fits no layout of {devices} x {hw.name}; the largest "
        f"batch that fits is {best[0]}, {where}; "
        f"give batch={best[0]} or less, a shorter context, or an int8 cache"
    ), ("batch" if batch is not None else "context")
