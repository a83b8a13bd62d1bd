"""Serving at a request rate: the time per output token and to the first token that a
replica's sequences see when requests arrive at random (a Poisson stream of ``rate`` a
second) and the server batches in flight, as TensorRT-LLM's and vLLM's schedulers do.

A replica runs iterations back to back while it has sequences. An iteration decodes one
token of every running sequence (``decode``: the plan's decode step, its caches those of
the sequence and of the others in flight); a new request's prompt is prefilled in an
iteration of its own beside them (``mixed``: the prefill, and the running sequences'
caches read beside it, the weights read once for both). Per second of a sequence's life
the replica runs ``rate`` mixed iterations and fills the rest with decode ones, each
giving the sequence a token:

* **time per output token** ``= 1 / (rate + (1 - rate x mixed) / decode)``: the decode step,
  stretched by the prefills that interleave with it;
* **time to first token** ``= wait + mixed``: a new request waits for the iteration under
  way (its mean residual ``E[T^2] / 2E[T]`` over the mix of iterations, when the replica is
  busy: ``1 - exp(-in flight)``, the chance that a Poisson count of sequences is not 0),
  then its own;
* **in flight** ``= rate x (first token + (output - 1) x per token)`` (Little's law), the
  mean a request finds, and beside itself a sequence sees (a Poisson stream's arrivals
  see the time average; with requests independent of each other, so does a sequence
  during its life): a fixed point, since a decode step reads each sequence's cache.

The cache is sized for the 99th percentile of a Poisson count of that mean
(:func:`poisson_quantile`): the sequences a replica holds at its peaks. A replica whose
prefills alone fill its time (``rate x mixed >= 1``) does not sustain the rate.
"""

from __future__ import annotations

import math
from typing import NamedTuple

#: The share of moments at which a replica's cache holds every sequence in flight.
PEAK_QUANTILE = 0.99

#: Fixed-point iterations at most; each moves the mean in flight by less than the last.
_ROUNDS = 200


class Load(NamedTuple):
    """A replica's latencies at a request rate, and its mean sequences in flight."""

    token_s: float
    first_token_s: float
    in_flight: float


def poisson_quantile(mean: float, q: float = PEAK_QUANTILE) -> int:
    """The least ``k`` with ``P(N <= k) >= q`` for ``N`` a Poisson count of ``mean``.

    >>> poisson_quantile(2.5)
    7
    """
    if mean <= 0:
        return 0
    k, cdf = 0, 0.0
    while True:
        cdf += math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
        if cdf >= q or k > mean + 40 * math.sqrt(mean) + 40:
            return k
        k += 1


def under_load(
    *,
    rate: float,
    output: int,
    decode_s: float,
    sequences: int,
    sequence_s: float,
    prefill_s: float,
) -> Load | None:
    """A replica's :class:`Load` at ``rate`` requests a second, each generating ``output``
    tokens: ``decode_s`` is its decode step at ``sequences`` sequences, ``sequence_s`` what
    one sequence's cache adds to it, ``prefill_s`` one prompt's prefill alone. None where
    the replica does not sustain the rate (its prefills fill its time, or its sequences in
    flight grow without bound)."""
    floor = decode_s - sequences * sequence_s  # the step of no sequence's cache
    n = rate * (prefill_s + (output - 1) * decode_s)
    for _ in range(_ROUNDS):
        beside = n * sequence_s  # the caches of the others in flight
        decode = floor + sequence_s + beside  # the sequence's own, and theirs
        mixed = prefill_s + sequence_s + beside  # a prefill beside the sequence and them
        if rate * mixed >= 1:
            return None
        token = decode / (1 - rate * (mixed - decode))
        share = rate * token  # of the sequence's iterations, those with a prefill
        mean = share * mixed + (1 - share) * decode
        residual = (share * mixed**2 + (1 - share) * decode**2) / (2 * mean)
        # a new request waits for the iteration under way, if any, then prefills beside
        # the sequences in flight
        first = (1 - math.exp(-n)) * residual + prefill_s + beside
        after = rate * (first + (output - 1) * token)
        if abs(after - n) <= 1e-9 * (1 + n):
            return Load(token, first, after)
        if after > 1e9:
            return None
        n = after
    return None
