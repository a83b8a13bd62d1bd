"""The serving roofline: what a model's prefill and decode cost on N chips, from its shape and
the hardware's constants (the scaling book's inference chapter, jax-ml/scaling-book
``applied-inference.md``, works its examples this way).

* **The KV cache** holds, per token, each layer's key and value for every key/value head:
  ``2 x kv_heads x head_dim x layers`` elements (grouped-query attention's smaller cache);
  under latent attention, each layer's latent and rotary key, shared by the heads.
* **Memory**: the weights, and the cache of ``batch`` sequences of ``context`` tokens, spread
  over the chips; the smallest count whose memory holds both is the least a layout needs.
* **A decode step** (one token per sequence) reads every weight and the whole cache through
  HBM once, and does ``2 x params`` FLOPs per sequence: the slower of the two, over the
  chips (small batches are memory-bound: a step takes about as long for 1 sequence as for
  8).
* **Prefill** is compute-bound: ``2 x params x tokens`` FLOPs at a fraction of the chips'
  peak (the model FLOPs utilization the caller states).

No communication is priced here: the compiled prefill and decode programs' collectives are
(their all-reduces under tensor parallelism are latency-bound at decode's small messages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardscope._src.base.errors import PlanError, is_int
from shardscope._src.base.records import Record
from shardscope._src.model.config import ModelConfig
from shardscope._src.targets.hardware import Hardware

#: Bytes per element of the weight and cache formats a server holds.
FORMATS = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1}


def _format_bytes(name: str, what: str) -> int:
    if name not in FORMATS:
        raise PlanError(f"{what}={name!r}: give one of {', '.join(FORMATS)}")
    return FORMATS[name]


def cache_bytes_per_token(config: ModelConfig, cache: str = "bfloat16") -> int:
    """The KV cache of one token: ``2 x kv_heads x head_dim x layers`` elements of ``cache``;
    under latent attention, the latent and the rotary key each layer, ``(kv_lora_rank +
    rope_head_dim) x layers``, shared by the heads.

    >>> from shardscope._src.model.presets import model_preset
    >>> cache_bytes_per_token(model_preset("llama3-70b").config(batch=1), "int8")
    163840
    >>> cache_bytes_per_token(model_preset("deepseek-v3").config(batch=1))  # 576 x 61 x 2
    70272
    """
    size = _format_bytes(cache, "cache")
    if config.is_mla:
        return (config.kv_lora_rank + config.rope_head_dim) * config.layers * size
    assert config.kv_heads is not None and config.head_dim is not None
    return 2 * config.kv_heads * config.head_dim * config.layers * size


def held_bytes(
    config: ModelConfig, batch: int, context: int, weights: str, cache: str
) -> tuple[int, int]:
    """``(weights, cache)`` bytes a server holds: every weight, and the KV cache of ``batch``
    sequences of ``context`` tokens."""
    weight_bytes = config.param_count() * _format_bytes(weights, "weights")
    return weight_bytes, batch * context * cache_bytes_per_token(config, cache)


@dataclass(frozen=True)
class ServingRoofline(Record):
    """One layout's roofline: ``chips`` serving ``batch`` sequences of ``context`` tokens."""

    chips: int
    batch: int
    context: int
    weight_bytes: int
    cache_bytes: int
    memory_bytes_per_chip: int
    fits: bool
    decode_step_s: float
    decode_memory_s: float
    decode_compute_s: float

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Output tokens per second per chip: the batch's tokens of a step over its time."""
        return self.batch / self.decode_step_s / self.chips


def serving_roofline(
    config: ModelConfig,
    hw: Hardware,
    chips: int,
    batch: int,
    context: int,
    *,
    weights: str = "bfloat16",
    cache: str = "bfloat16",
) -> ServingRoofline:
    """The decode roofline of ``config`` on ``chips`` of ``hw`` (see the module docstring).

    >>> from shardscope._src.model.presets import model_preset
    >>> from shardscope._src.targets.hardware import PRESETS
    >>> r = serving_roofline(model_preset("llama3-70b").config(batch=1), PRESETS["tpu-v5e"],
    ...                      8, 32, 8192, weights="int8", cache="int8")
    >>> round(r.decode_step_s * 1e3, 1), r.fits
    (17.3, True)
    """
    for name, value in (("chips", chips), ("batch", batch), ("context", context)):
        if not is_int(value, 1):
            raise PlanError(f"{name}={value!r}: must be a positive whole number")
    weight_bytes, cache_bytes = held_bytes(config, batch, context, weights, cache)
    per_chip = math.ceil((weight_bytes + cache_bytes) / chips)
    memory_s = (weight_bytes + cache_bytes) / (chips * hw.hbm_bandwidth)
    compute_s = 2 * config.active_param_count() * batch / (chips * hw.peak_flops)
    return ServingRoofline(
        chips=chips,
        batch=batch,
        context=context,
        weight_bytes=weight_bytes,
        cache_bytes=cache_bytes,
        memory_bytes_per_chip=per_chip,
        fits=per_chip <= hw.memory_bytes,
        decode_step_s=max(memory_s, compute_s),
        decode_memory_s=memory_s,
        decode_compute_s=compute_s,
    )


def least_chips(
    config: ModelConfig,
    hw: Hardware,
    batch: int,
    context: int,
    *,
    weights: str = "bfloat16",
    cache: str = "bfloat16",
) -> int:
    """The fewest chips whose memory holds the weights and the cache (no temporaries)."""
    return max(
        1, math.ceil(sum(held_bytes(config, batch, context, weights, cache)) / hw.memory_bytes)
    )


def prefill_s(config: ModelConfig, hw: Hardware, chips: int, tokens: int, mfu: float) -> float:
    """Seconds to prefill ``tokens`` on ``chips`` at model FLOPs utilization ``mfu``:
    ``2 x params x tokens / (chips x peak x mfu)``."""
    if not 0 < mfu <= 1:
        raise PlanError(f"mfu={mfu!r}: a fraction of the peak, above 0 and at most 1")
    return 2 * config.active_param_count() * tokens / (chips * hw.peak_flops * mfu)
