"""Serving steps compiled: a plan's decode step (:func:`compile_decode`: the reference
decoder's :func:`~shardscope._src.model.serving.decode`, the cache donated) and its layout's
prefill of one prompt a replica (:func:`compile_prefill`), compiled by the hardware's own
compiler, deviceless: their times are then the compiled programs' (:func:`_compile`: the
bytes they move through HBM, the matmuls' at the bandwidth they reach, and the FLOPs of their
matmuls, counted from their HLO; on a GPU kernel by kernel, each kernel's arithmetic and
traffic overlapped as XLA's GPU cost model overlaps them
(:func:`~shardscope._src.cost.compute.kernel_seconds`), none shorter than the hardware's
``kernel_floor_s``, and the kernels one after another, on
a TPU the slower of the two totals; the attention core as the one fused kernel a server runs,
its scores kept on chip (a prefill's, its causal half at the rate of the kernel the plan's
engine runs on that GPU: :func:`~shardscope._src.cost.compute.prefill_attention`); their
collectives priced as every collective is, and the kernels
they launch at the hardware's ``kernel_launch_s``; then the plan's engine's host work, as
:func:`~shardscope._src.serve.estimate.estimate_plan` adds it), the decode step's memory its
compiled buffers (``compiled_by``; a prefill's beside them as estimated, its compiled buffers
holding the scores the fused kernel keeps on chip). On a TPU target the decode step is
compiled and timed so too, and the prefill is estimated. Each program is compiled at two
depths and extrapolated to the model's (:func:`_compile_layers`, :data:`DEPTH`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from shardscope._src.audit.pricing import execution_seconds
from shardscope._src.audit.records import Collective
from shardscope._src.base.comm import ALL_REDUCE
from shardscope._src.cost.compute import (
    by_kernel,
    compiled_step_seconds,
    flop_seconds,
    kernels_seconds,
    moved_seconds,
    prefill_attention,
    step_matmul_seconds,
)
from shardscope._src.cost.links import engine_all_reduce_seconds
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.serving import EIGHT_BIT
from shardscope._src.serve.estimate import (
    decode_flops,
    fp8_matmuls,
    prefill_flops,
    weights_read_seconds,
    weights_shape,
)
from shardscope._src.serve.layouts import served, untouched_share
from shardscope._src.serve.types import ServePlan
from shardscope._src.sharding.strategies import get_strategy
from shardscope._src.targets.engines import engine as get_engine
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import TARGETS, Family


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


def _collective_s(c: Collective, sizes: dict[str, int], hw: Hardware, engine: str) -> float:
    """One execution of a compiled serving step's collective ``c``: its price on the links
    (:func:`~shardscope._src.audit.pricing.execution_seconds`), or for an all-reduce the
    serving ``engine``'s own kernel's where it runs one
    (:func:`~shardscope._src.cost.links.engine_all_reduce_seconds`)."""
    nccl = execution_seconds(c, sizes, hw)
    if c.kind != ALL_REDUCE or c.irregular or not get_engine(engine).custom_all_reduce:
        return nccl
    return engine_all_reduce_seconds(hw, sizes, c.axes, c.payload_bytes, nccl)


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
        comm_s=sum(_collective_s(k, sizes, hw, plan.engine) * k.count for k in result.collectives),
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

    c = served(config, plan.tensor_parallel)
    of = decode_flops(c, plan.context)
    fp8 = fp8_matmuls(hw, weights)
    shape = weights_shape(hw, c, plan.layout, plan.batch // plan.replicas)
    got = _compile_layers(plan, config, hw, flop_seconds(hw, fp8=fp8, shape=shape), build)
    # the program's batched expert matmuls read every expert of a device; a server's
    # grouped kernel, those its tokens are routed to (untouched_share)
    untouched = untouched_share(config, plan.layout, plan.batch)
    skipped_s = weights_read_seconds(
        hw, c, plan.layout, weights or config.dtype, untouched=untouched, experts_only=True
    )
    memory_s = plan.decode_memory_s if got.memory_s is None else max(0.0, got.memory_s - skipped_s)
    compute_s = (
        plan.decode_compute_s
        if got.flops is None
        else step_matmul_seconds(hw, got.flops, of, fp8=fp8, shape=shape)
    )
    step_s = got.seconds(hw, memory_s, compute_s, skipped_s)
    host_s = get_engine(plan.engine).exposed_seconds(step_s, plan.batch // plan.replicas)
    step_s += host_s
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
        decode_host_s=host_s,
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
    collectives and its kernels' launches. Its buffers are not the plan's: they hold each
    layer's scores over the prompt, which the fused attention kernel the prefill is timed by
    (the engine's) keeps on chip; a prefill's temporaries are estimated
    (:func:`~shardscope._src.serve.estimate.prefill_bytes`). On a TPU target the plan is
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

    c = served(config, plan.tensor_parallel)
    of = prefill_flops(c, prompt)
    fp8 = fp8_matmuls(hw, weights)
    shape = weights_shape(hw, c, plan.layout, prompt)
    kernel = prefill_attention(hw, get_engine(plan.engine))
    rate = kernel.flops if kernel else 0.0
    flop_s = flop_seconds(hw, fp8=fp8, attention=rate, shape=shape)
    got = _compile_layers(plan, config, hw, flop_s, build)
    if got.memory_s is None or got.flops is None:  # an HLO too deep to count
        return plan
    compute_s = step_matmul_seconds(hw, got.flops, of, fp8=fp8, attention=rate, shape=shape)
    first_s = got.seconds(hw, got.memory_s, compute_s)
    return replace(
        plan,
        estimate=plan.estimated,
        first_token_s=first_s + get_engine(plan.engine).exposed_seconds(first_s, 1),
    )
