"""The estimated serving step: what a device holds serving a batch, and the time of a
decode step and of a prefill by the roofline, for a layout
(:mod:`~shardscope._src.serve.layouts`) at a batch (:func:`estimate_plan`).

Per replica, by the prices of :mod:`shardscope._src.cost.compute` (its matmuls at the
rates they reach: the hardware's ``matmul_fraction``, and the bandwidth a kernel of its
size reaches) and the one
pricing of collectives (:func:`~shardscope._src.cost.links.collective_seconds`):

* **decode** (one token per sequence): every weight (but an untied embedding table, of which
  the lookup takes a row a token) and the replica's whole cache through HBM once (``(weights
  + cache) / t`` a device) at the bandwidth matmuls reach reading their operands, each
  kernel at what a kernel of its size reaches (:func:`weights_read_seconds`,
  :func:`cache_read_seconds`: an H100 reads a matrix of 8 MiB at a third of its bandwidth,
  one of 128 MiB at four fifths), and its ``2 x active params`` FLOPs a sequence and its
  attention's at the matmul rate: on a GPU the weights' matmuls and the attention as two
  kernels one after another (:func:`~shardscope._src.cost.compute.work_seconds`), elsewhere
  the reads or the FLOPs, whichever is slower; then the all-reduces of tensor parallelism,
  two a layer (the attention's output and the MLP's down projection, ``batch / r x
  d_model`` each) and the vocabulary-parallel embedding's one (each device looks up the
  tokens of its slice of the vocabulary), which wait for the matmuls that feed them and are
  latency-bound at decode's small messages. A mixture reads only the routed experts its
  tokens reach (:func:`~shardscope._src.serve.layouts.untouched_share`), its layers with
  experts all-reduce their experts' slots (``top_k`` rows a token), and over ``expert`` its
  dispatch and combine all-to-alls move each token's activations to its experts' devices
  and back (:func:`~shardscope._src.bounds.moe.moe_layer_terms`).
* **first token**: one prompt prefilled alone on a replica: its ``2 x active params x
  prompt`` FLOPs at the matmul rate and the attention's ``prompt^2`` ones (counted whole) as
  the fused causal kernel the engine runs on that GPU, their causal half at its measured
  forward rate (:func:`~shardscope._src.cost.compute.prefill_attention`: FlashAttention-3
  on an H100 under vLLM; where no rate is published, as on a B200, at the matmul rate,
  non-causal), beside its weights through HBM (one kernel), and the same all-reduces of
  ``prompt x d_model``.
* **the weights' matmuls' shapes**: on a GPU, decode's (a replica's sequences as their rows)
  and prefill's (the prompt's tokens) at the share of the matmul rate their tiles fill of
  their waves (:func:`weights_shape`): a few rows leave most of each tile empty; a TPU's at
  the rate whatever their shape.
* **fp8 weights** on a device with fp8 matmul units: the weights' matmuls (decode's and
  prefill's) at the fp8 rate, the attention's at 16 bits (:func:`fp8_matmuls`); int8
  weights, and fp8 ones elsewhere, are read as 8 bits and multiplied at 16.
* **the kernels** (on a GPU): a step launches one kernel for each operation of a layer as
  serving engines fuse them (:func:`decode_kernels`), each at the hardware's
  ``kernel_launch_s`` (:func:`~shardscope._src.cost.compute.launch_seconds`), and the
  element-wise ones among them (norms, rotary embeddings, the cache's update, activations),
  whose few tokens' work is not priced above, each the least a kernel runs
  (:func:`~shardscope._src.cost.compute.floor_seconds`): the decode step's and the
  prefill's alike.
* **the engine's host** (:mod:`~shardscope._src.targets.engines`): its work an iteration
  and a sequence of it after the device's step, or beside it where the engine overlaps the
  two (the longer of them), for the decode step (the replica's sequences) and the prefill
  (one).
* **memory** a device: its share of the weights and of the cache of ``context`` tokens for
  each of its replica's sequences, and the larger of the decode step's temporaries (its
  logits, float32, each device its slice of the vocabulary, and a layer's scores over the
  context) and a prefill's beside them (:func:`prefill_bytes`: one layer's activations for
  the tokens an iteration prefills, the prompt or the engine's chunk of it; the fused
  attention kernel the prefill is timed by holds no scores).

"""

from __future__ import annotations

import math
from typing import NamedTuple

from shardscope._src.base.comm import ALL_REDUCE, traffic_bytes
from shardscope._src.bounds.moe import moe_layer_terms
from shardscope._src.cost.compute import (
    floor_seconds,
    flop_seconds,
    gemms_efficiency,
    launch_seconds,
    matmul_read_seconds,
    prefill_attention,
    step_matmul_seconds,
    work_seconds,
)
from shardscope._src.cost.flops import attention_core_flops, weight_flops
from shardscope._src.cost.links import collective_seconds, engine_all_reduce_seconds
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.serving import FORMATS, WeightFormat, cache_bytes_per_token
from shardscope._src.serve.layouts import (
    served,
    untouched_share,
    weight_elements,
    weight_gemms,
    weight_reads,
)
from shardscope._src.serve.types import Layout, ServePlan
from shardscope._src.targets.engines import Engine
from shardscope._src.targets.engines import engine as get_engine
from shardscope._src.targets.hardware import Hardware

#: The largest batch the sweep tries when none is given (a power of two).
MAX_BATCH = 4096


def _scores_bytes(config: ModelConfig, t: int, queries: int, keys: int) -> int:
    """One layer's attention scores (float32) and probabilities (the model's dtype) on a
    device of tensor parallelism over ``t``: ``queries x keys`` for each of its heads (the
    layers run one after another, so one layer's are held at a time)."""
    return config.heads // t * queries * keys * (4 + config.itemsize)


def prefill_bytes(config: ModelConfig, t: int, tokens: int) -> int:
    """What a prefill of ``tokens`` tokens a replica holds on a device of tensor parallelism
    over ``t`` beside the weights and the cache: one layer's activations at a time (the
    layers run one after another), the larger of its attention's and its MLP's, and the
    last token's logits (float32, the device's slice of the vocabulary). The attention
    runs as a fused kernel (FlashAttention's, as every engine's prefill does and as the
    prefill is timed), which keeps its scores on chip: its inputs and outputs alone.

    * attention: the residual stream and its normed copy (``2 x d_model`` a token), the
      queries and the attention's output (``heads x head_dim / t`` each), the keys and the
      values (``kv_heads x head_dim / t`` each; latent attention makes them per head);
    * MLP: the residual stream and its normed copy, and the gated MLP's gate, up and their
      product (``3 x ff / t`` a token); with experts, each token's ``top_k`` routed rows (at
      the routing's capacity) and its shared experts' of the experts' width, and its
      dispatched copies (``top_k x d_model``).

    Llama 3 70B's 8,192-token chunk on four devices: its MLP's 8,192 x (2 x 8,192 +
    3 x 28,672 / 4) elements of two bytes, and 128,256 / 4 logits of four:

    >>> from shardscope._src.model.presets import model_preset
    >>> c = model_preset("llama3-70b").config(batch=1)
    >>> prefill_bytes(c, 4, 8192) == 8192 * (2 * 8192 + 3 * 28672 // 4) * 2 + 128256 // 4 * 4
    True
    """
    c = config
    d, hd = c.d_model, c.head_dim or c.d_model // c.heads
    if c.is_mla:
        q = k = c.heads * (hd + c.rope_head_dim)
        v = c.heads * (c.v_head_dim or hd)
        attention = q + k + v + c.heads * (c.v_head_dim or hd)
    else:
        attention = 2 * c.heads * hd + 2 * (c.kv_heads or c.heads) * hd
    widths = [attention // t]
    if c.dense_layer_count:
        widths.append(3 * c.ff // t)
    if c.is_moe:
        rows = c.routed_capacity * c.top_k + c.shared_experts
        widths.append(int(rows * 3 * (c.expert_ff or c.ff) // t + c.top_k * d))
    return tokens * (2 * d + max(widths)) * c.itemsize + (c.vocab or 0) // t * 4


class Held(NamedTuple):
    """Bytes on one device: the weights, the cache, the decode step's temporaries (the
    logits, float32, each device its slice of the vocabulary; a layer's scores and
    probabilities over the context) and a prefill's beside them (one prompt a replica, or
    the engine's chunk of it: :func:`prefill_bytes`)."""

    weights: int
    cache: int
    decode: int
    prefill: int

    @property
    def temporaries(self) -> int:
        return max(self.decode, self.prefill)


def holds(
    config: ModelConfig,
    layout: Layout,
    batch: int,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
    chunk: int | None = None,
) -> Held:
    """What one device holds serving ``batch`` sequences (:class:`Held`), a prefill
    carrying ``chunk`` tokens an iteration (None: the prompt whole)."""
    t, r = layout.t, layout.replicas
    c = served(config, t)
    weight = weight_elements(config, layout)[0] * FORMATS[weights]
    cached = (batch // r) * context * cache_bytes_per_token(c, cache)
    # split by key/value head; latent attention's latent is every head's, whole on each
    cached //= 1 if c.is_mla else t
    decode = (batch // r) * ((c.vocab or 0) // t * 4 + _scores_bytes(c, t, 1, context))
    prefilled = prompt if chunk is None else min(prompt, chunk)
    return Held(weight, cached, decode, prefill_bytes(c, t, prefilled))


def largest_batch(
    config: ModelConfig,
    hw: Hardware,
    layout: Layout,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
    *,
    engine: str = "none",
    memory_share: float | None = None,
    chunk: int | None = None,
) -> int:
    """The most sequences the layout's replicas hold beside their weights and a prefill's
    temporaries (``chunk`` tokens an iteration, None: the prompt whole) within the memory
    the serving ``engine`` lets a device hold (at ``memory_share`` where given:
    :meth:`~shardscope._src.targets.engines.Engine.memory_limit`), and no more a replica
    than the engine runs at once (:meth:`~shardscope._src.targets.engines.Engine.
    max_sequences`); a multiple of the replicas; 0 when the weights alone do not leave
    room for one."""
    r = layout.replicas
    one = holds(config, layout, r, prompt, context, weights, cache, chunk)  # one a replica
    host = get_engine(engine)
    room = host.memory_limit(hw, layout.t, one.weights, memory_share) - one.weights
    if room <= 0:
        return 0
    most = int(min(room // (one.cache + one.decode), max(0, room - one.prefill) // one.cache))
    cap = host.max_sequences(hw)  # the engine's own cap on a replica's sequences
    return r * (most if cap is None else min(most, cap))


def batch_sizes(
    config: ModelConfig,
    hw: Hardware,
    layout: Layout,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
    *,
    engine: str = "none",
    memory_share: float | None = None,
    chunk: int | None = None,
) -> list[int]:
    """Powers of two times the replicas, and the largest batch that fits a device under the
    serving ``engine`` (at ``memory_share``, prefilling ``chunk`` tokens an iteration:
    :func:`largest_batch`)."""
    r = layout.replicas
    largest = largest_batch(
        config, hw, layout, prompt, context, weights, cache, engine=engine,
        memory_share=memory_share, chunk=chunk,
    )  # fmt: skip
    largest = min(largest, MAX_BATCH * r)
    out = []
    b = r
    while b <= largest:
        out.append(b)
        b *= 2
    if largest >= r and largest not in out:
        out.append(largest)
    return out or [r]


def tp_all_reduce_seconds(hw: Hardware, layout: Layout, nbytes: int, engine: Engine) -> float:
    """One execution of tensor parallelism's all-reduce of ``nbytes`` a device over the
    layout's ``model`` axis: NCCL's (:func:`~shardscope._src.cost.links.collective_seconds`),
    or the serving ``engine``'s own kernel where it runs one
    (:func:`~shardscope._src.cost.links.engine_all_reduce_seconds`)."""
    t, mesh = layout.t, layout.mesh
    if t == 1:
        return 0.0
    traffic = traffic_bytes(ALL_REDUCE, nbytes, t)
    nccl = collective_seconds(hw, mesh, ALL_REDUCE, ("model",), t, traffic)
    if not engine.custom_all_reduce:
        return nccl
    return engine_all_reduce_seconds(hw, mesh, ("model",), nbytes, nccl)


def _tp_allreduces_s(
    hw: Hardware, config: ModelConfig, layout: Layout, tokens: int, engine: Engine
) -> float:
    """Tensor parallelism's all-reduces for ``tokens`` a replica on ``engine``: the
    attention's output in every layer, the MLP's down projection in every dense layer, the
    vocabulary-parallel embedding's once; in a layer with experts, the routed experts'
    outputs, summed in their slots before they are combined (``top_k`` rows a token, times
    the routing's capacity)."""
    c = config
    count = c.layers + c.dense_layer_count + 1
    dense = count * tp_all_reduce_seconds(hw, layout, tokens * c.d_model * c.itemsize, engine)
    if not c.is_moe:
        return dense
    slots = math.ceil(c.routed_capacity * tokens * c.top_k)
    each = tp_all_reduce_seconds(hw, layout, slots * c.d_model * c.itemsize, engine)
    return dense + c.moe_layers * each


def _all_to_all_s(hw: Hardware, config: ModelConfig, layout: Layout, tokens: int) -> float:
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
        weight_activations=config.weight_activations,
        group_limit=config.group_limit,
    )
    layers = config.moe_layers
    return sum(
        collective_seconds(
            hw,
            layout.mesh,
            term.kind,
            ("expert",),
            e,
            term.traffic_bytes * layers,
            layers,
            once_per_node=term.once_per_node,
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


def weights_shape(hw: Hardware, config: ModelConfig, layout: Layout, tokens: int) -> float:
    """The share of the flat matmul rate a device's weights' matmuls reach for ``tokens``
    tokens of its replica (``config`` as :func:`~shardscope._src.serve.layouts.served`
    gives it): on a GPU, by their shapes' tiles and waves
    (:func:`~shardscope._src.cost.compute.gemms_efficiency` of
    :func:`~shardscope._src.serve.layouts.weight_gemms`); 1 on a TPU.

    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.targets.hardware import hardware
    >>> c = model_preset("llama3-8b").config(batch=1)
    >>> weights_shape(hardware("tpu-v5e"), c, Layout("tp", 1, 1), 1)
    1.0
    >>> round(weights_shape(hardware("h100"), c, Layout("tp", 1, 1), 8192), 2)
    0.98
    """
    return gemms_efficiency(hw, weight_gemms(config, layout, tokens))


def weights_read_seconds(
    hw: Hardware,
    config: ModelConfig,
    layout: Layout,
    weights: str,
    *,
    untouched: float = 0.0,
    experts_only: bool = False,
) -> float:
    """The time one device's matmuls take to read its weights (``config`` as
    :func:`~shardscope._src.serve.layouts.served` gives it) in ``weights``' format: each
    kernel its own matrices (:func:`~shardscope._src.serve.layouts.weight_reads`) at the
    share of the bandwidth a kernel of that size reaches
    (:func:`~shardscope._src.cost.compute.matmul_read_seconds`); the routed experts' kernels
    less the ``untouched`` share of them a step's tokens do not reach, or (``experts_only``)
    those kernels' alone. An untied embedding's table is looked up, not read.

    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.targets.hardware import hardware
    >>> c = model_preset("llama3-70b").config(batch=1)
    >>> h = hardware("h100")
    >>> for t in (2, 8):  # the share of the bandwidth each split's fp8 matrices reach
    ...     layout = Layout("tp", t, 1)
    ...     held = sum(r.elements * r.kernels for r in weight_reads(c, layout))
    ...     print(round(held / weights_read_seconds(h, c, layout, "fp8") / h.hbm_bandwidth, 2))
    0.81
    0.59
    """
    itemsize = FORMATS[weights]
    seconds = 0.0
    for r in weight_reads(config, layout):
        if experts_only and not r.experts:
            continue
        share = (untouched if experts_only else 1 - untouched) if r.experts else 1.0
        size = r.elements * itemsize
        seconds += share * r.kernels * matmul_read_seconds(hw, size)
    return seconds


def cache_read_seconds(
    hw: Hardware, config: ModelConfig, nbytes: float, whole: float | None = None
) -> float:
    """The time one device's attention takes to read ``nbytes`` of its cache in a decode
    step: a kernel a layer, each reading its layer's share of the ``whole`` cache (``nbytes``
    where None; a sequence's part of it reads at the pace of the whole read), at the share
    of the bandwidth a kernel of that size reaches
    (:func:`~shardscope._src.cost.compute.matmul_read_seconds`)."""
    return matmul_read_seconds(hw, nbytes, (nbytes if whole is None else whole) / config.layers)


class Kernels(NamedTuple):
    """The kernels one run of a served decoder launches (:func:`decode_kernels`): its
    matmuls and attention cores, whose work is priced by their FLOPs and reads, and its
    element-wise kernels, whose work on a few tokens is not."""

    matmuls: int
    elementwise: int

    @property
    def total(self) -> int:
        """All of them."""
        return self.matmuls + self.elementwise

    def seconds(self, hw: Hardware) -> float:
        """What they cost beyond the work priced: each one's launch, and each element-wise
        one the least a kernel runs (0 on a TPU)."""
        return launch_seconds(hw, self.total) + floor_seconds(hw, self.elementwise)


def decode_kernels(config: ModelConfig) -> Kernels:
    """The kernels a decode step (or a prefill) of ``config`` launches, one for each
    operation as serving engines fuse them (the collectives apart: their latency prices each
    one's start). Each layer: its two norms (each with the residual's add), the rotary
    embedding, the cache's update and the MLP's activation (with the gate's product)
    element-wise; the query, key and value projection (one), the attention core and its
    output projection; a dense MLP's up (with its gate) and down projections, or a
    mixture's router, its routing (element-wise), its experts' up and down projections
    (grouped, one each), the combine of their outputs (element-wise) and its shared
    experts' up and down; then the step's embedding lookup, final norm and sampling
    (element-wise) and its unembedding.

    >>> from shardscope._src.model.presets import model_preset
    >>> k = decode_kernels(model_preset("llama3-70b").config(batch=1))
    >>> k.matmuls == 80 * 5 + 1, k.elementwise == 80 * 5 + 3
    (True, True)
    """
    c = config
    shared = 2 if c.shared_experts else 0
    matmuls = c.layers * 3 + c.dense_layer_count * 2 + c.moe_layers * (3 + shared) + 1
    elementwise = c.layers * 5 + c.moe_layers * 2 + 3
    return Kernels(matmuls, elementwise)


def decode_flops(config: ModelConfig, context: int) -> tuple[int, int]:
    """A sequence's matmul FLOPs in a decode step over a cache of ``context``: the
    weights' (``2 x`` the active parameters) and the attention's, its one query against the
    cache (under latent attention against the latents, the up-projections absorbed).

    >>> from shardscope._src.model.presets import model_preset
    >>> decode_flops(model_preset("llama3-8b").config(batch=1), 1)[1] == 2 * 32 * 256 * 32
    True
    """
    core = attention_core_flops(config, 1, context, absorbed=True) * config.layers
    return weight_flops(config.active_param_count(), 1), core


def prefill_flops(config: ModelConfig, prompt: int) -> tuple[int, int]:
    """The matmul FLOPs of prefilling one ``prompt``: the weights' and the attention's,
    counted non-causal as training counts them and as the compiled prefill computes them
    (its masked scores whole); the fused causal kernel a server runs computes half of them
    (:func:`~shardscope._src.cost.compute.prefill_attention`; each head's keys and values
    made from the latents under latent attention: prefill's form)."""
    core = attention_core_flops(config, prompt, prompt) * config.layers
    return weight_flops(config.active_param_count(), prompt), core


def estimate_plan(
    config: ModelConfig,
    hw: Hardware,
    layout: Layout,
    batch: int,
    prompt: int,
    context: int,
    weights: str,
    cache: str,
    *,
    engine: str = "none",
    memory_share: float | None = None,
    chunk: int | None = None,
) -> ServePlan:
    """The plan of ``layout`` serving ``batch`` sequences of ``context`` tokens, estimated
    (see the module docstring): what a device holds (within what the serving ``engine``
    lets it hold, at ``memory_share`` where given, beside a prefill of ``chunk`` tokens an
    iteration, None: the prompt whole), the decode step's time and its parts, and the time
    to the first token of one ``prompt`` a replica, each with the host's work of the
    ``engine`` (:func:`~shardscope._src.targets.engines.engine`)."""
    t, r = layout.t, layout.replicas
    c = served(config, t)
    held = holds(config, layout, batch, prompt, context, weights, cache, chunk)
    weight, cached = held.weights, held.cache
    per_replica = batch // r
    # the weights' matmuls read the weights (but those of experts no token reaches), the
    # attention the cache
    w, a = (f * per_replica / t for f in decode_flops(c, context))
    fp8 = fp8_matmuls(hw, weights)
    per_w, per_a = flop_seconds(hw, fp8=fp8, shape=weights_shape(hw, c, layout, per_replica))
    unreached = untouched_share(c, layout, batch)
    by_weights = (w * per_w, weights_read_seconds(hw, c, layout, weights, untouched=unreached))
    by_cache = (a * per_a, cache_read_seconds(hw, c, cached))
    memory_s, compute_s = by_weights[1] + by_cache[1], by_weights[0] + by_cache[0]
    host = get_engine(engine)
    comm_s = _tp_allreduces_s(hw, c, layout, per_replica, host)
    comm_s += _all_to_all_s(hw, c, layout, batch)
    kernels = decode_kernels(c)
    decode = work_seconds(hw, by_weights, by_cache) + comm_s + kernels.seconds(hw)
    host_s = host.exposed_seconds(decode, per_replica)
    decode += host_s
    of = prefill_flops(c, prompt)
    shape = weights_shape(hw, c, layout, prompt)
    kernel = prefill_attention(hw, host)
    rate = kernel.flops if kernel else 0.0
    matmuls = step_matmul_seconds(hw, sum(of) / t, of, fp8=fp8, attention=rate, shape=shape)
    reads = weights_read_seconds(hw, c, layout, weights)
    prefill = work_seconds(hw, (matmuls, reads)) + kernels.seconds(hw)
    prefill += _tp_allreduces_s(hw, c, layout, prompt, host)
    # one prompt a replica: the expert axis's devices prefill theirs together
    prefill += _all_to_all_s(hw, c, layout, prompt * layout.expert_parallel)
    prefill += host.exposed_seconds(prefill, 1)
    return ServePlan(
        strategy=layout.strategy,
        mesh=layout.mesh.sizes,
        batch=batch,
        context=context,
        weight_bytes_per_device=weight,
        cache_bytes_per_device=cached,
        temp_bytes_per_device=held.temporaries,
        memory_limit_bytes=int(host.memory_limit(hw, t, weight, memory_share)),
        engine_memory_share=host.memory_fraction(hw, t, memory_share),
        decode_step_s=decode,
        decode_memory_s=memory_s,
        decode_compute_s=compute_s,
        decode_comm_s=comm_s,
        first_token_s=prefill,
        tokens_per_s_per_chip=batch / decode / (t * r),
        kv_replicas=(c.kv_heads or 1) // (config.kv_heads or 1),
        engine=host.name,
        decode_host_s=host_s,
        decode_kernels=kernels.total,
    )
