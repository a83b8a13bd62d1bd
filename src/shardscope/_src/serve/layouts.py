"""The layouts a server lays a model out by, and what each holds of its weights.

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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

from shardscope._src.base.errors import StrategyError
from shardscope._src.cost.flops import Gemm
from shardscope._src.model.config import (
    EXPERT_PARAMS,
    LAYER_PARAMS,
    MOE_PARAMS,
    ModelConfig,
    param_shapes,
)
from shardscope._src.model.serving import FORMATS
from shardscope._src.plan.estimates import divisors, elements_per_device
from shardscope._src.serve.types import Layout, ServeLayout
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy


def layouts_for(config: ModelConfig, devices: int) -> list[Layout]:
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
        out.append(Layout(ServeLayout.DP_TP if r > 1 else ServeLayout.TP, t, r))
        if config.is_moe and r > 1 and config.experts % r == 0:
            out.append(Layout(ServeLayout.EP_TP, t, r))
    return [layout for layout in out if _places(config, layout)]


def _places(config: ModelConfig, layout: Layout) -> bool:
    """Whether the layout's placement splits every dimension it shards evenly (the
    vocabulary over ``model`` too)."""
    try:
        weight_elements(config, layout)
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
def weight_elements(config: ModelConfig, layout: Layout) -> tuple[int, int]:
    """``(weights, routed experts)``: the elements of them one device holds, as the layout's
    placement splits each (the vocabulary split over ``model``; what the strategy keeps
    whole, such as the norms' gains, latent attention's down-projections and a router, on
    every device)."""
    c = replace(served(config, layout.t), batch=layout.replicas, seq=1)
    strategy = get_strategy(layout.strategy).with_vocab_split()
    placement = strategy.place(c, abstract_mesh(layout.mesh))
    rules = strategy.param_rules()
    return elements_per_device(placement, rules), elements_per_device(placement, rules, "expert_")


def expert_bytes(config: ModelConfig, layout: Layout, weights: str) -> int:
    """The routed experts' bytes on one device: split ``t`` ways by tensor parallelism and
    over the expert axis."""
    return weight_elements(config, layout)[1] * FORMATS[weights]


def looked_up_bytes(config: ModelConfig, layout: Layout, weights: str) -> int:
    """The embedding table's bytes on one device (split over the vocabulary), which a step
    reads a row of a token from, not whole; 0 where the unembedding multiplies by it (tied
    embeddings) and so reads it all."""
    if config.tie_embeddings or not config.vocab:
        return 0
    return config.vocab // layout.t * config.d_model * FORMATS[weights]


def untouched_share(config: ModelConfig, layout: Layout, batch: int) -> float:
    """The expected share of a device's routed experts that no token of a decode step of
    ``batch`` sequences is routed to (uniform routing): each of the ``n`` tokens that can
    reach them picks ``top_k`` of the ``experts``, so an expert is missed by all with
    probability ``(1 - top_k / experts) ^ n``; ``n`` is the whole batch where the experts
    serve every replica (split over them, or under tensor parallelism alone), a replica's
    share where each replica holds its own. A server's grouped matmul (vLLM's and
    TensorRT-LLM's fused MoE kernels) reads only the experts it has tokens for.

    >>> from shardscope._src.model.presets import model_preset
    >>> mixtral = model_preset("mixtral-8x7b").config(batch=1)
    >>> untouched_share(mixtral, Layout("tp", 8, 1), 1)  # one token: 6 of the 8 experts
    0.75
    >>> round(untouched_share(mixtral, Layout("tp", 8, 1), 16), 3)
    0.01
    """
    if not config.is_moe:
        return 0.0
    n = batch // layout.replicas * layout.expert_parallel
    return (1 - config.top_k / config.experts) ** n


#: Weights whose input tensor parallelism splits (the attention's output projection and the
#: MLPs' down projections, each device's partial sums all-reduced); the others' output is
#: split, but for those every device holds whole (:data:`_WHOLE`).
_ROW_PARALLEL = ("wo", "w_down", "shared_down", "expert_down")
#: Matmul weights each device holds whole: latent attention's down-projections and a router.
_WHOLE = ("wq_a", "wkv_a", "router")


def weight_gemms(config: ModelConfig, layout: Layout, tokens: int) -> list[Gemm]:
    """The weights' matmuls one device runs for ``tokens`` tokens of its replica, as the
    layout splits them (``config`` as :func:`served` gives it): each projection a
    :class:`~shardscope._src.cost.flops.Gemm` of ``tokens`` rows, its output (or, for
    :data:`_ROW_PARALLEL`, its input) split over tensor parallelism's ``t``, a layer's fused
    as servers fuse them (the queries, keys and values one matmul, SwiGLU's gate and up
    one); each of the device's routed experts of the tokens routed to it (``top_k`` of the
    experts a token, at the routing's capacity, of the expert axis's replicas' tokens); the
    unembedding (the embedding, where it is tied) over the vocabulary's slice. The norms'
    gains and an untied embedding (a lookup) are no matmuls.

    >>> from shardscope._src.model.presets import model_preset
    >>> c = model_preset("llama3-8b").config(batch=1)
    >>> [g[1:] for g in weight_gemms(c, Layout("tp", 2, 1), 5)[:2]]  # wqkv, wo: 32 layers
    [(3072, 4096, 32), (4096, 2048, 32)]
    """
    return [g for _, g, _ in _weight_matmuls(config, layout, tokens)]


class WeightRead(NamedTuple):
    """A kind of the weights' matmul kernels a step of one device runs: the elements of the
    weights one kernel reads, how many such kernels, and whether they are routed experts'."""

    elements: int
    kernels: int
    experts: bool


@functools.cache
def weight_reads(config: ModelConfig, layout: Layout) -> tuple[WeightRead, ...]:
    """The weights' matmul kernels a step of one device runs (:func:`weight_gemms`'
    matmuls), each kind a :class:`WeightRead`; a layer's routed experts one grouped kernel
    of each of their weights (the device's experts together, as servers' fused MoE kernels
    run them).

    >>> from shardscope._src.model.presets import model_preset
    >>> c = model_preset("llama3-8b").config(batch=1)
    >>> [r[:2] for r in weight_reads(c, Layout("tp", 2, 1))[:2]] == [
    ...     (4096 * 6144 // 2, 32), (2048 * 4096, 32)]
    True
    """
    return tuple(
        WeightRead(g.n * int(g.k) * group, g.times // group, name in EXPERT_PARAMS)
        for name, g, group in _weight_matmuls(config, layout, 1)
    )


def _weight_matmuls(
    config: ModelConfig, layout: Layout, tokens: int
) -> Iterator[tuple[str, Gemm, int]]:
    """Each of :func:`weight_gemms`' matmuls, with its weight's name and the experts one
    kernel runs together (a layer's experts on the device for a routed expert's weights,
    else 1)."""
    t, ep = layout.t, layout.expert_parallel
    for name, shape in param_shapes(config).items():
        base = name.removeprefix("moe_")
        if base.endswith("norm") or (base == "embed" and not config.tie_embeddings):
            continue
        rows: float = tokens
        group = 1
        count, dims = (shape[0], shape[1:]) if name in LAYER_PARAMS + MOE_PARAMS else (1, shape)
        if name in EXPERT_PARAMS:  # (experts, ...) of each layer
            experts, dims = dims[0], dims[1:]
            rows = tokens * ep * config.top_k * config.routed_capacity / config.experts
            group = experts // ep
            count *= group
        if base == "embed":  # tied: the unembedding multiplies by its transpose
            dims = dims[::-1]
        if base in _ROW_PARALLEL:
            k, n = math.prod(dims[:-1]) // t, dims[-1]
        elif base in _WHOLE:
            k, n = dims[0], math.prod(dims[1:])
        else:
            k, n = dims[0], math.prod(dims[1:]) // t
        yield name, Gemm(rows, n, k, count), group
