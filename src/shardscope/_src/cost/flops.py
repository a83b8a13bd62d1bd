"""How many FLOPs a transformer's matmuls do: the weights' and the attention core's.

* **the weights' matmuls**: two FLOPs (a multiply and an add) per weight per token
  (:func:`weight_flops`); a matmul of a known shape is a :class:`Gemm`.
* **the attention core** (``QK^T`` and ``PV``): per layer, each head's scores of every query
  against every key and the weighted values, ``2 x heads x (qk + v) x queries x keys``
  (Korthikanti et al., arXiv 2205.05198, Eq. 7), counted non-causal, as training counts it
  and as a program that masks its scores computes them (:func:`attention_core_flops`).
* **a fused causal kernel** (FlashAttention's count): it computes the causal half of that
  (:func:`causal_flops`); its backward :data:`ATTENTION_BACKWARD` times its forward's.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from shardscope._src.model.config import ModelConfig

#: A fused attention kernel's backward FLOPs over its forward's, as FlashAttention counts
#: them (its scores recomputed included), and as the measured rates of
#: :data:`~shardscope._src.targets.hardware.H100_ATTENTION_KERNELS` are counted.
ATTENTION_BACKWARD = 2.5

_N = TypeVar("_N", int, float)


class Gemm(NamedTuple):
    """``times`` matmuls of ``m`` rows (tokens) by ``k`` by ``n`` columns: ``m x k`` times
    ``k x n``. ``m`` may be a mean (the tokens routed to an expert), and so may ``k`` (an
    expert's weight gradient sums over its tokens)."""

    m: float
    n: int
    k: float
    times: int = 1

    @property
    def flops(self) -> float:
        """Two a multiply-add: ``2 x m x n x k`` each.

        >>> Gemm(2, 3, 4, times=5).flops
        240
        """
        return 2 * self.m * self.n * self.k * self.times


def weight_flops(params: _N, tokens: _N) -> _N:
    """The FLOPs of ``tokens`` tokens through matmuls of ``params`` weights: two a weight a
    token.

    >>> weight_flops(8_000_000_000, 2048)
    32768000000000
    """
    return 2 * tokens * params


def attention_core_flops(
    config: ModelConfig, queries: _N, keys: int, *, absorbed: bool = False
) -> _N:
    """One layer's attention core for ``queries`` queries, each against ``keys`` keys:
    ``2 x heads x (qk + v) x queries x keys``, counted whole (non-causal). Under latent
    attention ``absorbed`` (decode's form: the up-projections folded into the query and the
    output) the heads attend to the latents, a score of ``rank + rope`` dimensions and a
    value of ``rank``: ``2 x heads x (2 rank + rope) x queries x keys``.

    >>> from shardscope._src.model.presets import model_preset
    >>> attention_core_flops(model_preset("llama3-8b").config(batch=1), 1, 1) == 2 * 32 * 256
    True
    """
    c = config
    if absorbed and c.is_mla:
        per_head = 2 * c.kv_lora_rank + c.rope_head_dim
    else:
        per_head = c.qk_head_dim + c.value_head_dim
    return 2 * queries * keys * c.heads * per_head


def causal_flops(flops: float) -> float:
    """What a fused causal attention kernel computes of a core of ``flops`` counted whole:
    its causal half (the scores above the diagonal skipped), as FlashAttention counts it.

    >>> causal_flops(8.0)
    4.0
    """
    return flops / 2
