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
* **time to first token** ``= wait + its prefill``: a new request waits for the iteration
  under way (its mean residual at a random moment, when the replica is busy: ``1 -
  exp(-in flight)``, the chance that a Poisson count of sequences is not 0) and for the
  prompts queued before it, as a non-preemptive priority queue's first class does
  (Cobham: ``residual / (1 - rate x prefill)``), then prefills beside the sequences in
  flight;
* **in flight** ``= rate x (first token + (output - 1) x per token)`` (Little's law), the
  mean a request finds, and beside itself a sequence sees (a Poisson stream's arrivals
  see the time average; with requests independent of each other, so does a sequence
  during its life): a fixed point, since a decode step reads each sequence's cache.

The cache is sized for the 99th percentile of a Poisson count of that mean
(:func:`poisson_quantile`): the sequences a replica holds at its peaks. A replica whose
prefills alone fill its time (``rate x mixed >= 1``) does not sustain the rate.

**Chunked prefill** (``chunk``: the tokens an iteration carries, vLLM's
``max_num_batched_tokens``, as its V1 engine always runs): the running sequences' decodes
take a token each of the budget and a prompt fills the rest, so it is prefilled in ``k =
ceil(prompt / (chunk - in flight))`` iterations, each its share of the prefill (or the
weights' read, where that share is shorter) beside the decodes; a prompt is then ``k``
iterations of the sequences' tokens rather than one, its prefill no longer stalls them
for its whole length, and its own first token comes after all ``k`` (and a new prompt
waits for all of those of the prompt under way, as for a whole one).

Assumed: one prompt prefilled an iteration (servers that batch several prefills wait
less); each sequence's cache read at its whole context (a sequence holds its prompt and
half its output on average: the step is an upper bound); requests still waiting for their
prefill counted among those in flight; no request turned away at the peaks the cache does
not hold (1% of moments).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

#: The share of moments at which a replica's cache holds every sequence in flight.
PEAK_QUANTILE = 0.99


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
    if not math.isfinite(mean):
        raise ValueError(f"mean={mean!r}: a Poisson count's mean is a finite number")
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
    prefill_rate: float | None = None,
    prompt: int = 0,
    chunk: int | None = None,
) -> Load | None:
    """A replica's :class:`Load` at ``rate`` requests a second, each generating ``output``
    tokens: ``decode_s`` is its decode step at ``sequences`` sequences, ``sequence_s`` what
    one sequence adds to it, ``prefill_s`` one prompt's prefill alone; ``prefill_rate``
    the prefills a second its iterations carry (default ``rate``; more where replicas run
    in lockstep and each stalls for the others' prefills); ``chunk``: the tokens an
    iteration carries where the server chunks its prefills (None: each prompt whole), a
    prompt being ``prompt`` tokens. None where the replica does not sustain the rate (its
    prefills fill its time, or its sequences in flight grow without bound)."""
    prefills = rate if prefill_rate is None else prefill_rate
    floor = decode_s - sequences * sequence_s  # the step of no sequence

    def times(n: float) -> tuple[float, float] | None:
        """The time per output token and to the first token with ``n`` in flight."""
        k = chunks(prompt, chunk, n)
        return _latencies(n, prefills, floor, sequence_s, prefill_s, 1 - math.exp(-n), 0.5, k)

    def excess(n: float) -> float | None:
        """Little's law's arrivals times stay, less ``n`` (None: not sustained there)."""
        got = times(n)
        return None if got is None else rate * (got[1] + (output - 1) * got[0]) - n

    # the stay grows with the sequences in flight: the least n at which Little's law holds
    # is found by bisection, below the n at which prefills fill the replica's time
    cap = math.inf if sequence_s <= 0 else (1 / prefills - prefill_s - sequence_s) / sequence_s
    if chunk is not None:
        # a prompt's iterations grow in number with the sequences in flight (they take more
        # of each iteration's tokens): the most in flight at which its prefills leave the
        # replica time, by bisection (sustained is monotone in n)
        cap = _most_sustained(lambda n: times(n) is not None)
    if cap <= 0 or excess(0.0) is None:
        return None
    lo, hi = 0.0, 1.0
    while True:
        if hi >= cap:
            hi = cap * (1 - 1e-12)
            e = excess(hi)
            if e is None or e > 0:
                return None
            break
        e = excess(hi)
        if e is None:
            return None
        if e <= 0:
            break
        lo, hi = hi, 2 * hi
        if hi > 1e15:
            return None
    for _ in range(200):
        mid = (lo + hi) / 2
        e = excess(mid)
        if e is not None and e <= 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * (1 + hi):
            break
    got = times(hi)
    assert got is not None
    return Load(got[0], got[1], hi)


def _most_sustained(sustained: Callable[[float], bool]) -> float:
    """The most ``n`` at which ``sustained(n)`` (true below it, false above), to within a
    part in 10^12 below; 0 where it is false at 0, infinite where it never turns false."""
    if not sustained(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while sustained(hi):
        lo, hi = hi, 2 * hi
        if hi > 1e15:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        if sustained(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * (1 + hi):
            break
    return lo


def chunks(prompt: int, chunk: int | None, in_flight: float) -> int:
    """The iterations a ``prompt`` of tokens is prefilled in where each carries ``chunk``
    tokens, one of them each of the ``in_flight`` sequences' decodes (at least one token of
    the prompt an iteration); 1 where the server prefills it whole (``chunk`` None).

    >>> chunks(5000, 2048, 8), chunks(5000, None, 8), chunks(2048, 2048, 0)
    (3, 1, 1)
    """
    if chunk is None or prompt <= 0:
        return 1
    return max(1, math.ceil(prompt / max(1.0, chunk - in_flight)))


def _latencies(
    n: float,
    prefills: float,
    floor: float,
    sequence_s: float,
    prefill_s: float,
    busy: float,
    waited: float,
    k: int = 1,
) -> tuple[float, float] | None:
    """The time per output token and to the first token a sequence sees with ``n`` others
    in flight and ``prefills`` prompts a second prefilled beside it (None: they fill the
    replica's time); ``floor`` is the decode step of no sequence, ``sequence_s`` what each
    adds, ``prefill_s`` a prompt's prefill alone, in ``k`` iterations (chunked: each its
    share of it, or the weights' read where that is longer); a new prompt finds the
    replica running an iteration with chance ``busy``, and waits for the share ``waited``
    of it (a half, on average, arriving at a random moment)."""
    beside = n * sequence_s  # what the others in flight add to an iteration
    decode = floor + sequence_s + beside  # the sequence's own, and theirs
    part = prefill_s if k == 1 else max(prefill_s / k, floor)  # one iteration's prefill
    mixed = part + sequence_s + beside  # a prefill (or a chunk) beside the sequence and them
    if prefills * k * mixed >= 1:
        return None
    token = decode / (1 - prefills * k * (mixed - decode))
    # A new prompt waits for the iteration under way, then for the prompts queued before
    # it (prefills go first: the non-preemptive priority queue's W = R / (1 - rho)), then
    # prefills beside the sequences in flight. R, the mean residual of the work under way
    # (arriving at a random moment, each piece's T^2 / 2 over the time): a prompt's
    # prefill, all its iterations (a chunked one's are scheduled before a new prompt's), a
    # share rho of the time, decode steps of the n in flight the rest of it the replica is
    # busy.
    arriving = k * (part + beside)
    rho = prefills * arriving
    residual = (rho * arriving + max(0.0, busy - rho) * (floor + beside)) * waited
    return token, residual / (1 - rho) + arriving


def closed_loop(
    *,
    clients: float,
    output: int,
    decode_s: float,
    sequences: int,
    sequence_s: float,
    prefill_s: float,
    lockstep: int = 1,
    prompt: int = 0,
    chunk: int | None = None,
) -> Load:
    """A replica's :class:`Load` under ``clients`` in a closed loop, each sending its next
    request as soon as its last one ends (as ``vllm bench serve --max-concurrency`` and
    NIM's and LMDeploy's benchmarks drive a server): every client's request is in flight
    all the time, and each request's life (its ``cycle``: its first token, then ``output -
    1`` more) holds one prefill of every other client. By the arrival theorem of closed
    queueing networks (mean-value analysis: Reiser and Lavenberg, J. ACM 27(2), 1980), a
    request arrives to find the others as they are at a random moment: ``clients - 1`` in
    flight, whose prompts come ``clients - 1`` a cycle; its latencies are
    :func:`under_load`'s at that rate of prefills with those sequences beside it, and the
    cycle is the fixed point of ``cycle = first token + (output - 1) x per token``. Unlike
    a random arrival, a request comes as the iteration after its predecessor's last token
    begins (the client reads that token, then sends): it waits for the whole iteration
    under way, where there are others to run one.
    ``lockstep``: the replicas whose layers run together (over ``expert``), each stalling
    for all their clients' prefills. The other arguments are :func:`under_load`'s
    (``prompt`` and ``chunk``: a chunked prefill's).

    A lone client waits for nothing and is stretched by no other prompt:

    >>> one = closed_loop(clients=1, output=101, decode_s=0.01, sequences=1,
    ...                   sequence_s=0.0, prefill_s=0.05)
    >>> one.token_s, one.first_token_s, one.in_flight
    (0.01, 0.05, 1.0)
    """
    if not (math.isfinite(clients) and clients >= 1):
        raise ValueError(f"clients={clients!r}: a closed loop has at least one client")
    floor = decode_s - sequences * sequence_s
    others = clients - 1
    k = chunks(prompt, chunk, others)

    def times(cycle: float) -> tuple[float, float] | None:
        prefills = (clients * lockstep - 1) / cycle
        return _latencies(others, prefills, floor, sequence_s, prefill_s, busy, 1.0, k)

    def stay(got: tuple[float, float]) -> float:
        return got[1] + (output - 1) * got[0]

    # A shorter cycle brings the others' prompts more often and stretches the request's
    # life: the cycle that is its own request's life is found by bisection, above the life
    # with no other prompt (or the cycle in which the prompts fill the replica's time).
    busy = min(1.0, others)  # the others' iterations run back to back
    alone = _latencies(others, 0.0, floor, sequence_s, prefill_s, busy, 1.0, k)
    assert alone is not None
    lo = stay(alone)
    hi = 2 * lo
    while (got := times(hi)) is None or stay(got) > hi:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        got = times(mid)
        if got is None or stay(got) > mid:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    got = times(hi)
    assert got is not None
    return Load(got[0], got[1], float(clients))
