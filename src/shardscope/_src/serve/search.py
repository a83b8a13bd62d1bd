"""Serving plans: for every layout of the devices and every batch that fits, the memory a
device holds, the time per output token, the time to first token and the throughput per
chip, and the latency-throughput front (:func:`serve_request`).

Each layout (:mod:`~shardscope._src.serve.layouts`) is estimated at every batch
(:mod:`~shardscope._src.serve.estimate`), and the best plan of each has its decode step and
its prefill compiled by the hardware's own compiler, deviceless
(:mod:`~shardscope._src.serve.compiled`); the other plans are estimated. A layout's largest
batch that does not fit once compiled gives way to the largest its program would fit at
(:func:`_compile_best`), and while an estimated plan ranks first it is compiled too
(:func:`_compile_leaders`), so that the best plan is a compiled one.

At a request rate (``rate``) each layout is planned at the sequences its replicas hold in
flight, and its times are those its requests see with prefills batched in flight
(:mod:`~shardscope._src.serve.online`); under clients in a closed loop (``clients``), at
those clients' sequences (as many as its cache holds: the rest wait for a place), and its
times those of :func:`~shardscope._src.serve.online.closed_loop`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardscope._src.base.comm import format_bytes, format_seconds
from shardscope._src.base.errors import PlanError
from shardscope._src.base.notes import Note
from shardscope._src.cost.compute import launch_seconds, prefill_attention
from shardscope._src.cost.memory import least_devices_for_state
from shardscope._src.mesh import MeshShape
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.model.serving import EIGHT_BIT, FORMATS, check_servable
from shardscope._src.plan.compile import Progress
from shardscope._src.plan.rank import StepSource, pareto_front, rank_key
from shardscope._src.plan.request import ServeRequest, with_routing
from shardscope._src.serve.compiled import compile_decode, compile_prefill
from shardscope._src.serve.estimate import (
    Held,
    batch_sizes,
    cache_read_seconds,
    estimate_plan,
    holds,
    largest_batch,
    weights_read_seconds,
)
from shardscope._src.serve.layouts import layouts_for, served, untouched_share
from shardscope._src.serve.online import Load, closed_loop, poisson_quantile, under_load
from shardscope._src.serve.types import (
    ExpertsNotSplitValues,
    Layout,
    ServeLayout,
    ServeNote,
    ServePlan,
    ServeResult,
)
from shardscope._src.targets.engines import engine as get_engine
from shardscope._src.targets.hardware import Hardware


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


def serve_request(request: ServeRequest, progress: Progress | None = None) -> ServeResult:
    """Plans serving the request's ``model`` on ``devices`` of ``hardware``: prompts of ``prompt``
    tokens, ``output`` tokens generated each, a KV cache of ``context`` (default: ``prompt +
    output``) per sequence, ``weights`` and ``cache`` in bfloat16, float16, int8 or fp8 (see
    :mod:`~shardscope._src.serve.estimate`). ``batch`` fixes the sequences served at once
    (default: every power of two that fits, and the largest that does); ``latency`` (seconds per
    output token) keeps the plans that meet it. ``compiler`` None (the default) or the
    hardware's own target name: the best plan of each layout has its decode step and its prefill
    compiled by the hardware's own compiler, deviceless, where it has one (and the weights and
    cache are in the model's dtype or in 8 bits): its memory, collectives and times are then the
    compiled programs' (:func:`~shardscope._src.serve.compiled.compile_decode`,
    :func:`~shardscope._src.serve.compiled.compile_prefill`); ``"cpu"``: the roofline alone,
    nothing compiled (a CPU compile of the served program would say nothing of the hardware's
    memory or its collectives). 8-bit weights halve a decode step's traffic; int8 ones are
    weight-only (their matmuls compute in the model's dtype), fp8 ones on a device with fp8
    matmul units are multiplied in fp8 (:func:`~shardscope._src.serve.estimate.fp8_matmuls`),
    which speeds a prefill's matmuls too. ``imbalance``, ``dispatch_once`` and
    ``weight_activations`` set a mixture's routing as :class:`ModelConfig` has them (a dropless
    one's busiest expert's tokens over its even share; each token once to each device of its
    experts; the router weights scaling the experts' activations), in place of the model's.
    ``rate`` (requests a second, arriving at random at the devices, spread evenly over the
    replicas) plans online serving (:mod:`~shardscope._src.serve.online`): each layout holds the
    sequences in flight at that rate (each replica's 99th percentile of them, as its batch), and
    its time per output token and to the first token are those its requests see, prefills
    batched in flight beside the decode; the best is the fastest per output token. Give
    ``batch`` or ``rate``, not both. Every step and prefill pays the host work of the
    request's ``engine`` (:mod:`~shardscope._src.targets.engines`), and each request's first
    token its API server's time. ``progress(done, total, label)`` is called as each layout's
    best plan is compiled (the command line's progress bar).

    Raises:
        PlanError: a bad count, format or compiler (naming it); a batch or context that
            fits no layout (naming the largest that fits and on how many devices); a latency
            no layout meets (naming the fastest layout and its time per output token); a
            rate no layout sustains (naming the most one does).
        ModelConfigError: a model without a vocabulary (the serving steps take tokens), or
            a routing it cannot have (an imbalance of a dense or capacity-padded model).
    """
    name, config = _model(request.model)
    config = with_routing(config, request)
    hw, ctx, rate = request.device, request.context_tokens, request.rate
    prompt, weights, cache = request.prompt, request.weights, request.cache
    setting = (
        config, hw, request.devices, prompt, request.output, ctx, weights, cache, request.engine,
        request.chunk_tokens, request.memory_share,
    )  # fmt: skip
    online: _Online | _Closed | None = None
    if rate is not None:
        online = _Online(*setting, rate)
    elif request.clients is not None:
        # a closed loop's sequences are at every point of their lives alike: a decode step
        # reads each cache at its mean length, the prompt and half the output
        mean = prompt + (request.output + 1) // 2
        online = _Closed(*setting[:5], mean, *setting[6:], request.clients)
    fitting = _estimated(request, config, hw, online)
    # under load, the latency is met (or not) by the times the load gives
    per_token = None if online is not None else request.latency
    fitting = _meeting(fitting, per_token)
    if request.compile_target is not None and {weights, cache} <= {config.dtype, *EIGHT_BIT}:
        fitting = _compiled(request, config, hw, fitting, per_token, online, progress)
    if online is not None:
        loaded = [online.loaded(p) for p in fitting]
        if not any(loaded):
            compiled = [p for p in fitting if p.step_source is StepSource.COMPILED]
            raise online.error(compiled=compiled)
        fitting = _meeting([p for p in loaded if p is not None], request.latency, at_rate=True)
    # the engine's API server holds each request before it is queued, the device serving
    # the others meanwhile: a delay of its first token alone
    host = get_engine(request.engine)
    request_s = host.request_s
    fitting = [replace(p, first_token_s=p.first_token_s + request_s) for p in fitting]
    kernel = prefill_attention(hw, host)
    return ServeResult(
        model=name,
        devices=request.devices,
        hardware=hw.name,
        prompt=prompt,
        output=request.output,
        context=ctx,
        weights=weights,
        cache=cache,
        latency=request.latency,
        plans=_ranked(fitting, at_rate=online is not None),
        imbalance=config.imbalance,
        dispatch_once=config.dispatch_once,
        weight_activations=config.weight_activations,
        rate=rate,
        clients=request.clients,
        engine=request.engine,
        chunked_prefill=None if online is None else online.chunk,
        prefill_attention=None if kernel is None else kernel.kernel,
        memory_share=request.memory_share,
        notes=_experts_not_split(name, config, request.devices),
    )


def _experts_not_split(name: str, config: ModelConfig, devices: int) -> tuple[Note, ...]:
    """The note of a mixture none of whose layouts on ``devices`` splits its experts (an
    expert axis spans a layout's replicas, and none of their counts divides the experts),
    with the device counts up to twice as many whose layouts do; nothing otherwise."""
    if not config.is_moe:
        return ()
    layouts = layouts_for(config, devices)
    replicas = tuple(sorted({layout.replicas for layout in layouts if layout.replicas > 1}))
    if not replicas or any(layout.strategy is ServeLayout.EP_TP for layout in layouts):
        return ()
    counts = tuple(
        n
        for n in range(2, 2 * devices + 1)
        if any(layout.strategy is ServeLayout.EP_TP for layout in layouts_for(config, n))
    )
    values = ExpertsNotSplitValues(
        model=name, experts=config.experts, devices=devices, replicas=replicas, counts=counts
    )
    return (Note(ServeNote.EXPERTS_NOT_SPLIT, values, ("devices",)),)


def _estimated(
    request: ServeRequest, config: ModelConfig, hw: Hardware, online: _Online | _Closed | None
) -> list[ServePlan]:
    """The estimated plans that fit: each layout's at every batch that fits (or at the
    request's), or under load the one that holds its sequences in flight."""
    devices, batch, prompt = request.devices, request.batch, request.prompt
    ctx, weights, cache = request.context_tokens, request.weights, request.cache
    layouts = layouts_for(config, devices)
    if not layouts:
        raise PlanError(
            f"devices={devices}: no tensor-parallel size divides both them and the "
            f"{config.heads} heads, and divides or is a multiple of the {config.kv_heads} "
            f"key/value heads; choose a device count with a divisor of {config.kv_heads}",
            param="devices",
        )
    # the engine whose host each plan pays, at the memory share it holds and the tokens it
    # prefills an iteration, and the most sequences a replica of it runs at once
    on_engine: dict[str, Any] = dict(
        engine=request.engine, memory_share=request.memory_share, chunk=request.chunk_tokens
    )
    cap = get_engine(request.engine).max_sequences(hw)
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
            else batch_sizes(config, hw, layout, prompt, ctx, weights, cache, **on_engine)
        )
        for b in sizes:
            if b % r or (cap is not None and b // r > cap):
                continue
            plans.append(
                estimate_plan(config, hw, layout, b, prompt, ctx, weights, cache, **on_engine)
            )
    fitting = [p for p in plans if p.fits]
    if not fitting and online is not None:
        raise online.error()
    if not fitting:
        raise _nothing_fits(request, config, hw)
    return fitting


def _nothing_fits(request: ServeRequest, config: ModelConfig, hw: Hardware) -> PlanError:
    """The request's refusal where no plan fits (:func:`_no_fit`)."""
    text, param = _no_fit(
        config, hw, request.devices, request.batch, request.prompt, request.context_tokens,
        request.weights, request.cache, request.engine, request.memory_share,
        request.chunk_tokens,
    )  # fmt: skip
    return PlanError(text, param=param)


def _compiled(
    request: ServeRequest,
    config: ModelConfig,
    hw: Hardware,
    fitting: list[ServePlan],
    per_token: float | None,
    online: _Online | _Closed | None,
    progress: Progress | None = None,
) -> list[ServePlan]:
    """``fitting`` with the best of each layout compiled, and the leaders while an estimate
    ranks first (:func:`_compile_best`, :func:`_compile_leaders`): those that fit once
    compiled and meet ``per_token``; ``progress`` told as each layout is compiled."""
    batch, prompt = request.batch, request.prompt
    weights, cache = request.weights, request.cache
    fitting, prefills, refits = _compile_best(
        fitting,
        config,
        hw,
        prompt,
        weights,
        cache,
        fixed=batch is not None or online is not None,
        progress=progress,
        chunk=request.chunk_tokens,
    )
    fitting = [p for p in fitting if p.fits]
    fitting = _compile_leaders(
        fitting, prefills, config, hw, prompt, weights, cache, per_token, request.chunk_tokens
    )
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
        raise _nothing_fits(request, config, hw)
    return _meeting(fitting, per_token)  # as compiled


def _ranked(fitting: list[ServePlan], *, at_rate: bool) -> tuple[ServePlan, ...]:
    """``fitting`` best first (:data:`_RANK`), the front marked: the plans no other beats on
    both the time per output token and, the lower the better, the throughput per chip or,
    at a request rate (which every plan delivers), the time to the first token."""
    fitting = sorted(fitting, key=_RANK)
    front = pareto_front(
        fitting,
        lambda p: p.step_time_s,
        (lambda p: p.first_token_s) if at_rate else (lambda p: -p.tokens_per_s_per_chip),
    )
    return tuple(replace(p, pareto=i in front) for i, p in enumerate(fitting))


def _round_down(x: float) -> float:
    """``x`` to three significant figures, rounded down (a rate suggested is one met)."""
    if x <= 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.floor(x / unit * (1 + 1e-12)) * unit


@dataclass(frozen=True)
class _Serving:
    """What planning a layout under a load needs: the model, the hardware and the devices,
    the requests' tokens, the cache's tokens a sequence, the formats, the engine, the
    tokens an iteration of a chunked prefill carries (None: each prompt whole) and the share
    of a device's memory the engine holds (None: its own)."""

    config: ModelConfig
    hw: Hardware
    devices: int
    prompt: int
    output: int
    context: int
    weights: str
    cache: str
    engine: str
    chunk: int | None
    memory_share: float | None

    def sized(self, layout: Layout) -> tuple[Any, ...]:
        """:func:`largest_batch`'s arguments before its keywords, for ``layout``."""
        return (self.config, self.hw, layout, self.prompt, self.context, self.weights, self.cache)

    def estimated(self, layout: Layout, batch: int) -> ServePlan:
        """``layout``'s plan at ``batch``, estimated on the engine, at its memory share."""
        return estimate_plan(
            self.config, self.hw, layout, batch, self.prompt, self.context, self.weights,
            self.cache, engine=self.engine, memory_share=self.memory_share, chunk=self.chunk,
        )  # fmt: skip

    def no_fit(self) -> str:
        """Why no batch of any layout fits at this context, and what does (:func:`_no_fit`)."""
        return _no_fit(
            self.config, self.hw, self.devices, None, self.prompt, self.context, self.weights,
            self.cache, self.engine, self.memory_share, self.chunk,
        )[0]  # fmt: skip


@dataclass(frozen=True)
class _Online(_Serving):
    """Serving at a request rate (:mod:`~shardscope._src.serve.online`): the rate, and what
    planning a layout at it needs."""

    rate: float

    def one(self, layout: Layout) -> Held:
        """What one sequence a replica holds on a device."""
        c = self
        return holds(
            c.config, layout, layout.replicas, c.prompt, c.context, c.weights, c.cache, c.chunk
        )

    def sequence_s(self, plan: ServePlan) -> float:
        """What one more sequence a replica adds to ``plan``'s decode step
        (:func:`_sequence_s`)."""
        return _sequence_s(self.config, self.hw, self.weights, plan)

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
            prompt=self.prompt,
            chunk=self.chunk,
        )

    def plan(self, layout: Layout, rate: float | None = None) -> ServePlan | None:
        """The layout's plan (estimated) at the batch that holds its sequences in flight:
        each replica's 99th percentile of them (:data:`~shardscope._src.serve.online.
        PEAK_QUANTILE`), planned again until it holds what its times put in flight (a
        mixture's decode step reads more experts at a larger batch); None where its
        replicas do not sustain the rate."""
        c, r = self, layout.replicas
        tried: dict[int, ServePlan] = {}
        k = 1
        for _ in range(16):  # a round or two: the batch moves the mean in flight little
            plan = c.estimated(layout, k * r)
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
        cap = get_engine(self.engine).max_sequences(self.hw)
        if cap is not None and per_replica + extra > cap:  # more than the engine runs at once
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
        most, where, why = 0.0, "", _FILL
        for label, fails in self._limits(compiled, refits):
            lo = _most_sustained(fails, self.rate)
            if lo > most or not where:
                most, where, why = lo, label, fails(self.rate) or _FILL
        once = f" once compiled by the {c.hw.name} compiler" if compiled or refits else ""
        head = (
            f"rate={self.rate:g} requests/s: no layout of {c.devices} x {c.hw.name} sustains "
            f"it{once}"
        )
        if most <= 0:
            text = c.no_fit()
            return PlanError(f"{head}; {text}", param="rate")
        most = _round_down(most)
        return PlanError(
            f"{head}: on {where}, {why}; the most it sustains is {most:g} requests/s: give "
            f"rate={most:g} or less, or more devices",
            param="rate",
        )

    def _limits(
        self, compiled: Sequence[ServePlan], refits: Sequence[tuple[ServePlan, ServePlan]]
    ) -> list[tuple[str, Callable[[float], str | None]]]:
        """Each layout :meth:`error` weighs, and why it does not sustain a rate (a function
        of the rate; None: it does): the ``compiled`` plans, else the compiled misfits
        (``refits``), else every layout as estimated."""
        tests: list[tuple[str, Callable[[float], str | None]]] = [
            (p.label, functools.partial(self._compiled_fails, p)) for p in compiled
        ]
        tests += [
            (misfit.label, functools.partial(self._refit_fails, misfit, smaller.batch))
            for misfit, smaller in refits
        ]
        if not tests:
            for layout in layouts_for(self.config, self.devices):
                mesh = layout.mesh.spec
                tests.append(
                    (f"{layout.strategy} {mesh}", functools.partial(self._estimate_fails, layout))
                )
        return tests

    def _compiled_fails(self, plan: ServePlan, rate: float) -> str | None:
        """Why the compiled ``plan`` does not sustain ``rate`` (None: it does)."""
        load = self.load(plan, rate)
        if load is None:
            return _FILL
        if self.loaded(plan, rate) is None:
            return f"{_peak_of(load)} do not fit beside its compiled program"
        return None

    def _refit_fails(self, misfit: ServePlan, fits: int, rate: float) -> str | None:
        """Why the compiled ``misfit``, whose program fits a batch of ``fits``, does not
        sustain ``rate`` (None: it does)."""
        load = self.load(misfit, rate)
        if load is None:
            return _FILL
        if poisson_quantile(load.in_flight) * misfit.replicas > fits:
            holds = fits // misfit.replicas
            return f"{_peak_of(load)} pass the {holds} its compiled program holds"
        return None

    def _estimate_fails(self, layout: Layout, rate: float) -> str | None:
        """Why ``layout``, as estimated, does not sustain ``rate`` (None: it does)."""
        plan = self.plan(layout, rate)
        if plan is None:
            return _FILL
        if not plan.fits:
            return (
                f"its {plan.batch // plan.replicas} sequences a replica at the "
                f"peaks need {format_bytes(plan.memory_bytes_per_device)} a device "
                f"of {format_bytes(plan.memory_limit_bytes)}"
            )
        return None


@dataclass(frozen=True)
class _Closed(_Serving):
    """Serving ``clients`` in a closed loop (:func:`~shardscope._src.serve.online.
    closed_loop`), spread evenly over a layout's replicas: the clients, and what planning a
    layout under them needs; ``context`` the tokens a sequence's cache holds on average
    (the plans are planned there: a server that pages its cache holds what its sequences
    hold, and they are at every point of their lives alike)."""

    clients: int

    def plan(self, layout: Layout) -> ServePlan | None:
        """The layout's plan (estimated) at a batch of its clients (each replica its share,
        rounded up), or the most its cache holds, the other clients waiting for a place;
        None where a replica holds no sequence."""
        c, r = self, layout.replicas
        per_replica = -(-self.clients // r)
        most = largest_batch(
            *c.sized(layout), engine=c.engine, memory_share=c.memory_share, chunk=c.chunk
        )
        k = min(per_replica, most // r)
        if k < 1:
            return None
        return c.estimated(layout, k * r)

    def loaded(self, plan: ServePlan) -> ServePlan:
        """``plan`` under the clients: its time per output token and to the first token as
        their requests see them (a client its cache has no place for waits, in its first
        token, for one: the clients beyond the places cycle through them), its throughput
        per chip the tokens they receive."""
        r = plan.replicas
        share, places = self.clients / r, plan.batch // r
        held = min(share, places)  # a replica's clients with a place (fewer than one: it
        # serves one at a time, idle between them)
        load = closed_loop(
            clients=max(1.0, held),
            output=self.output,
            decode_s=plan.decode_step_s,
            sequences=places,
            sequence_s=_sequence_s(self.config, self.hw, self.weights, plan),
            prefill_s=plan.first_token_s,
            lockstep=r if plan.expert_parallel > 1 else 1,
            prompt=self.prompt,
            chunk=self.chunk,
        )
        stay = load.first_token_s + (self.output - 1) * load.token_s
        # each place serves a request a stay: the clients beyond the places wait their turn
        waited = (share - held) * stay / held
        return replace(
            plan,
            decode_step_s=load.token_s,
            first_token_s=waited + load.first_token_s,
            tokens_per_s_per_chip=r * held * self.output / stay / self.devices,
            in_flight=held * r,
            decode_iteration_s=plan.decode_step_s,
            prefill_s=plan.first_token_s,
        )

    def error(
        self,
        compiled: Sequence[ServePlan] = (),
        refits: Sequence[tuple[ServePlan, ServePlan]] = (),
    ) -> PlanError:
        """The error of clients no layout serves: no replica holds one sequence (as
        estimated), or none that fits once compiled."""
        c = self
        head = f"clients={c.clients}: no layout of {c.devices} x {c.hw.name} serves them"
        if refits:
            misfit, smaller = max(refits, key=lambda pair: pair[1].batch)
            return PlanError(
                f"{head} once compiled by the {c.hw.name} compiler: {misfit.label} holds "
                f"{format_bytes(misfit.memory_bytes_per_device)} a device of "
                f"{format_bytes(misfit.memory_limit_bytes)}; its program fits a batch of "
                f"{smaller.batch}: give clients={smaller.batch} or less, or more devices",
                param="clients",
            )
        text = c.no_fit()
        return PlanError(f"{head}; {text}", param="clients")


def _sequence_s(config: ModelConfig, hw: Hardware, weights: str, plan: ServePlan) -> float:
    """What one more sequence a replica adds to ``plan``'s decode step: its cache read
    through HBM; on a compiled plan, at least its share of the program's traffic beyond
    the weights it reads (its cache and whatever else the program moves for it: float32
    scores, logits); and the engine's host work a sequence, where it follows the device's
    step (an engine that overlaps the two hides it behind the step)."""
    per_replica = plan.batch // plan.replicas
    host = get_engine(plan.engine)
    host_s = 0.0 if host.overlapped else host.sequence_s
    whole = plan.cache_bytes_per_device
    cached = cache_read_seconds(hw, config, whole / per_replica, whole)
    if plan.step_source is StepSource.ESTIMATED:
        return cached + host_s
    untouched = untouched_share(config, plan.layout, plan.batch)
    c = served(config, plan.layout.t)
    read = weights_read_seconds(hw, c, plan.layout, weights, untouched=untouched)
    beyond = plan.decode_memory_s - read
    return max(cached, beyond / per_replica) + host_s


#: Why a replica does not sustain a rate, where its time runs out.
_FILL = (
    "its prefills, and its decode steps slowed by each sequence more in flight, fill "
    "a replica's time"
)


def _peak_of(load: Load) -> str:
    return f"its {poisson_quantile(load.in_flight)} sequences a replica at the peaks"


def _most_sustained(fails: Callable[[float], str | None], rate: float) -> float:
    """The most a layout sustains below ``rate``, by bisection of ``fails`` (48 halvings)."""
    lo, hi = 0.0, rate
    for _ in range(48):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    return lo


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


COMPILES_PER_LAYOUT = 4

#: Decode steps compiled at most after those, while an estimated plan ranks first.
SERVE_LEADER_COMPILES = 4


#: A plan's layout: its strategy and mesh.
_LayoutKey = tuple[str, MeshShape]


def _key(plan: ServePlan) -> _LayoutKey:
    return plan.strategy, MeshShape.of(plan.mesh)


#: Best first: the throughput per chip, then the time per output token.
_RANK: Callable[[ServePlan], tuple[Any, ...]] = rank_key(
    lambda p: -p.tokens_per_s_per_chip, lambda p: p.step_time_s
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
    963 kernels at batch 456 and 1,123 at 48) in place of the estimate's count of them
    (the estimate's element-wise kernels still each the least a kernel runs); the engine's
    host work after the step, or beside it, as on the estimate."""
    kernels = compiled.decode_kernels
    launches = launch_seconds(hw, kernels) - launch_seconds(hw, estimate.decode_kernels)
    device = estimate.decode_step_s - estimate.decode_host_s + launches
    host_s = get_engine(estimate.engine).exposed_seconds(
        device, estimate.batch // estimate.replicas
    )
    step = device + host_s
    chips = estimate.replicas * estimate.tensor_parallel
    return replace(
        estimate,
        first_token_s=compiled.first_token_s,
        decode_step_s=step,
        decode_host_s=host_s,
        decode_kernels=kernels,
        tokens_per_s_per_chip=estimate.batch / step / chips,
        estimate=estimate.estimated,
    )


def _prefill_alone(
    compiled: ServePlan,
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    weights: str,
    cache: str,
    chunk: int | None,
) -> ServePlan:
    """``compiled`` with its layout's compiled prefill's time to the first token, its
    temporaries the prefill's alone as estimated (:func:`~shardscope._src.serve.estimate.
    prefill_bytes`, ``chunk`` tokens an iteration): the compiled program's buffers hold the
    prompt's scores, which the fused kernel its time is priced by keeps on chip."""
    prefilled = compile_prefill(compiled, config, hw, prompt, weights=weights, cache=cache)
    held = holds(config, compiled.layout, compiled.replicas, prompt, compiled.context,
                 weights, cache, chunk)  # fmt: skip
    return replace(prefilled, temp_bytes_per_device=held.prefill)


def _compile_best(
    plans: list[ServePlan],
    config: ModelConfig,
    hw: Hardware,
    prompt: int,
    weights: str,
    cache: str,
    *,
    fixed: bool = False,
    progress: Progress | None = None,
    chunk: int | None = None,
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
    that names it. ``progress(done, layouts, label)`` is told as each layout is done."""
    layouts: dict[_LayoutKey, list[ServePlan]] = {}
    refits: list[tuple[ServePlan, ServePlan]] = []
    for p in sorted(plans, key=lambda p: -p.batch):
        layouts.setdefault(_key(p), []).append(p)
    out: list[ServePlan] = []
    prefills: dict[_LayoutKey, ServePlan] = {}
    for done, (key, group) in enumerate(layouts.items(), 1):
        queue, tries = list(group), 0
        while queue and tries < COMPILES_PER_LAYOUT:
            p, tries = queue.pop(0), tries + 1
            compiled = compile_decode(p, config, hw, weights=weights, cache=cache)
            if compiled.fits:
                if key not in prefills:
                    prefills[key] = _prefill_alone(
                        compiled, config, hw, prompt, weights, cache, chunk
                    )
                compiled = _beside(compiled, prefills[key])
            if compiled.fits:
                rest = [_beside_compiled(q, compiled, hw) for q in queue]
                out.extend([compiled, *rest])
                queue = []
                break
            smaller = _refit(p, compiled, config, hw, prompt, weights, cache, chunk)
            if fixed:
                if smaller is not None:
                    refits.append((compiled, smaller))
                continue
            if smaller is not None and (not queue or smaller.batch > queue[0].batch):
                queue.insert(0, smaller)
        out.extend(queue)  # estimated: beyond the compiles a layout takes
        if progress is not None:
            progress(done, len(layouts), group[0].label)
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
    chunk: int | None = None,
) -> list[ServePlan]:
    """``plans`` (those that fit) with the first-ranked one compiled while it is an estimate
    (at most :data:`SERVE_LEADER_COMPILES`): a layout's smaller batch may pass its compiled
    largest by the roofline, and the compiled program says whether it does (a misfit
    dropped). Among the plans that meet ``latency``, where given."""
    for _ in range(SERVE_LEADER_COMPILES):
        meeting = [p for p in plans if latency is None or p.decode_step_s <= latency]
        top = min(meeting, key=_RANK, default=None)
        if top is None or top.step_source is StepSource.COMPILED:
            break
        compiled = compile_decode(top, config, hw, weights=weights, cache=cache)
        key = _key(top)
        if compiled.fits and key not in prefills:
            prefills[key] = _prefill_alone(compiled, config, hw, prompt, weights, cache, chunk)
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
    chunk: int | None = None,
) -> ServePlan | None:
    """The plan of ``plan``'s layout at the largest batch its compiled program (which does
    not fit) would fit at: its excess over the memory taken off a replica's sequence at a
    time, each the cache and the decode step's temporaries of one sequence a replica (as
    estimated, beside a prefill of ``chunk`` tokens an iteration; None where no batch is
    left)."""
    layout = plan.layout
    r = layout.replicas
    one = holds(config, layout, r, prompt, plan.context, weights, cache, chunk)  # one a replica
    excess = compiled.memory_bytes_per_device - compiled.memory_limit_bytes
    batch = plan.batch - r * max(1, math.ceil(excess / (one.cache + one.decode)))
    if batch < r:
        return None
    smaller = estimate_plan(
        config, hw, layout, batch, prompt, plan.context, weights, cache, engine=plan.engine,
        chunk=chunk,
    )  # fmt: skip
    # the same layout and weights: what the engine lets a device hold is the misfit's
    return replace(smaller, memory_limit_bytes=plan.memory_limit_bytes)


def _no_fit(
    config: ModelConfig,
    hw: Hardware,
    devices: int,
    batch: int | None,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
    engine: str,
    memory_share: float | None,
    chunk: int | None = None,
) -> tuple[str, str]:
    """Why nothing fits, and the largest batch that does at this context (on how many
    devices) within what the serving ``engine`` lets a device hold (at ``memory_share``
    where given, beside a prefill of ``chunk`` tokens an iteration), or that the weights
    alone do not; with the parameter to change."""
    best: tuple[int, int] | None = None
    capped = False  # the best is as many sequences a replica as the engine runs at once
    host = get_engine(engine)
    cap = host.max_sequences(hw)
    for layout in layouts_for(config, devices):
        fits = largest_batch(
            config, hw, layout, prompt, context, weights, cache, engine=engine,
            memory_share=memory_share, chunk=chunk,
        )  # fmt: skip
        if fits and (best is None or fits > best[0]):
            best = (fits, layout.t)
            capped = cap is not None and fits == cap * layout.replicas
    asked = f"batch={batch} " if batch is not None else ""
    if best is not None:
        t = best[1]
        where = "on each device alone" if t == 1 else f"with tensor parallelism over {t} devices"
    rule = host.memory
    if best is None and rule is not None:
        # the engine's share may be all that stands in the way: what all of a device holds
        whole = [
            (n, layout)
            for layout in layouts_for(config, devices)
            if (
                n := largest_batch(config, hw, layout, prompt, context, weights, cache, chunk=chunk)
            )
        ]
        if whole:
            n, layout = max(whole, key=lambda pair: pair[0])
            return (
                f"{asked}at context={context}: no layout of {devices} x {hw.name} holds the "
                f"{weights} weights and one sequence within what {engine} lets a device hold "
                f"({rule.words(hw, layout.t, memory_share)}); all of a device's "
                f"{hw.runtime_memory / 2**30:.2f} GiB hold {n} sequences on {layout.strategy} "
                f"{layout.mesh.spec}: give a larger memory_share (start {engine} with a larger "
                f"{rule.setting})"
            ), "memory_share"
    if best is None:
        size = config.param_count() * FORMATS[weights] / 2**30
        need = least_devices_for_state(config.param_count(), FORMATS[weights], hw.runtime_memory)
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
                largest_batch(
                    config,
                    hw,
                    layout,
                    prompt,
                    context,
                    weights,
                    cache,
                    engine=engine,
                    memory_share=memory_share,
                    chunk=chunk,
                )  # fmt: skip
                for layout in layouts_for(config, n)
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
    within = (
        ""
        if rule is None
        else f" within what {engine} lets a device hold ({rule.words(hw, best[1], memory_share)})"
    )
    if capped and host.sequences is not None:
        # the engine runs no more at once, whatever the memory holds
        return (
            f"{asked}fits no layout of {devices} x {hw.name} as {engine} starts: it runs at "
            f"most {cap} sequences a replica at once (its {host.sequences.setting} on "
            f"{hw.name}); the "
            f"largest batch is {best[0]}, {where}; give batch={best[0]} or less, or plan a "
            f"load (rate or clients), whose requests beyond it wait"
        ), ("batch" if batch is not None else "context")
    return (
        f"{asked}at context={context} fits no layout of {devices} x {hw.name}{within}; the "
        f"largest batch that fits is {best[0]}, {where}; "
        f"give batch={best[0]} or less, a shorter context, or an int8 cache"
        + (
            ""
            if rule is None
            else f", or a larger memory_share (start {engine} with a larger {rule.setting})"
        )
    ), ("batch" if batch is not None else "context")
