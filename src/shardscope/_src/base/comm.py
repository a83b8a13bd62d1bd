"""Minimum communication of one collective: the bytes each device sends and the latency steps.

Pure functions of the collective's kind, its payload and its group size; no JAX. The formulas
are the bandwidth-optimal ones (ring all-gather / reduce-scatter, Rabenseifner all-reduce,
pairwise all-to-all) from nccl-tests' PERFORMANCE.md, the MPICH cost comments, ZeRO (arXiv
1910.02054) section 7 and the JAX scaling book, part 3.

``payload_bytes`` is always the full logical array ``S``: the all-reduce operand, the
all-gather result, the reduce-scatter operand, the whole array an all-to-all exchanges (the
group size times one device's buffer) and, for a collective-permute, one device's buffer.

>>> traffic_bytes("all-reduce", 64 * 1024, 8)
114688
>>> traffic_bytes("all-gather", 8 * 1024, 8)
7168
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from shardscope._src.base.errors import ShardscopeError, is_int
from shardscope._src.base.records import Record
from shardscope._src.base.vocab import Vocab


class CollectiveKind(Vocab):
    """The collective kinds the audit reports (HLO opcodes), in the order tables list them."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    RAGGED_ALL_TO_ALL = "ragged-all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"
    COLLECTIVE_BROADCAST = "collective-broadcast"


ALL_REDUCE = CollectiveKind.ALL_REDUCE
ALL_GATHER = CollectiveKind.ALL_GATHER
REDUCE_SCATTER = CollectiveKind.REDUCE_SCATTER
ALL_TO_ALL = CollectiveKind.ALL_TO_ALL
RAGGED_ALL_TO_ALL = CollectiveKind.RAGGED_ALL_TO_ALL
COLLECTIVE_PERMUTE = CollectiveKind.COLLECTIVE_PERMUTE
COLLECTIVE_BROADCAST = CollectiveKind.COLLECTIVE_BROADCAST

#: Every collective kind the audit reports, in the order tables list them.
KINDS: tuple[CollectiveKind, ...] = tuple(CollectiveKind)


def kind_named(
    name: object, *, what: str = "collective kind", param: str | tuple[str, ...] = ()
) -> CollectiveKind:
    """The kind ``name`` spells, with dashes as HLO writes it or underscores as a keyword
    does (``"all-gather"``, ``"all_gather"``): the one vocabulary of every kind a user names.

    >>> kind_named("all_gather"), kind_named("reduce-scatter")
    ('all-gather', 'reduce-scatter')

    Raises:
        ShardscopeError: a name that spells no kind (``what`` and ``param`` name it).
    """
    found = CollectiveKind.get(name.strip().replace("_", "-")) if isinstance(name, str) else None
    if found is None:
        raise ShardscopeError(
            f"{what} {name!r}: choose one of {CollectiveKind.choices()} (with dashes or "
            f"underscores)",
            param=param,
        )
    return found


#: The kinds whose payload is exchanged among the group, each device receiving a part.
EXCHANGES = frozenset({ALL_TO_ALL, RAGGED_ALL_TO_ALL})
#: The kinds that move one device's buffer to others rather than combining the group's.
POINT_TO_POINT = frozenset({COLLECTIVE_PERMUTE, COLLECTIVE_BROADCAST})

# Bytes sent per device as a fraction num(n) / den(n) of the payload S.
_FRACTIONS: dict[str, tuple[Callable[[int], int], Callable[[int], int]]] = {
    ALL_REDUCE: (lambda n: 2 * (n - 1), lambda n: n),
    ALL_GATHER: (lambda n: n - 1, lambda n: n),
    REDUCE_SCATTER: (lambda n: n - 1, lambda n: n),
    ALL_TO_ALL: (lambda n: n - 1, lambda n: n * n),
    # The sizes of a ragged exchange are only known at run time; its buffers bound it.
    RAGGED_ALL_TO_ALL: (lambda n: n - 1, lambda n: n * n),
    # Pipelined broadcast: every device but the last forwards the whole buffer once.
    COLLECTIVE_BROADCAST: (lambda n: 1, lambda n: 1),
}

# Latency steps (multiples of alpha) of the same algorithms.
_STEPS: dict[str, Callable[[int], int]] = {
    ALL_REDUCE: lambda n: 2 * (n - 1),
    ALL_GATHER: lambda n: n - 1,
    REDUCE_SCATTER: lambda n: n - 1,
    ALL_TO_ALL: lambda n: n - 1,
    RAGGED_ALL_TO_ALL: lambda n: n - 1,
    COLLECTIVE_BROADCAST: lambda n: n - 1,
    COLLECTIVE_PERMUTE: lambda n: 1,
}


def _check(kind: str, payload_bytes: int, group_size: int) -> None:
    if kind not in KINDS:
        raise ShardscopeError(
            f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}"
        )
    if not is_int(payload_bytes, 0):
        raise ShardscopeError(
            f"payload_bytes must be a non-negative integer, got {payload_bytes!r}"
        )
    if not is_int(group_size, 1):
        raise ShardscopeError(f"group_size must be a positive integer, got {group_size!r}")


def traffic_bytes(kind: str, payload_bytes: int, group_size: int) -> int:
    """Bytes one device sends for one execution of a collective (bandwidth-optimal).

    Args:
        kind: an HLO collective kind, e.g. ``"all-reduce"`` (see :data:`KINDS`).
        payload_bytes: the full logical array ``S`` (module docstring says which array).
        group_size: ``n``, the devices in one replica group.

    Returns:
        all-reduce ``2(n-1)/n*S``; all-gather and reduce-scatter ``(n-1)/n*S``; all-to-all
        ``(n-1)/n**2*S``; collective-permute ``S`` (its payload is one device's buffer; pass
        ``group_size=1`` for a permute whose pairs are all self pairs: 0 bytes);
        collective-broadcast ``S``. A group of one sends nothing. Fractions of a byte are
        rounded up (a device cannot send part of a byte).

    >>> traffic_bytes("all-to-all", 64 * 64 * 4, 8)
    1792
    >>> traffic_bytes("collective-permute", 256, 8)
    256
    """
    _check(kind, payload_bytes, group_size)
    n = group_size
    if n == 1:
        return 0
    if kind == COLLECTIVE_PERMUTE:
        return payload_bytes
    num, den = _FRACTIONS[kind]
    return -(-num(n) * payload_bytes // den(n))


def latency_steps(kind: str, group_size: int) -> int:
    """Sequential message steps of the bandwidth-optimal algorithm (multiples of alpha)."""
    _check(kind, 0, group_size)
    return 0 if group_size == 1 else _STEPS[kind](group_size)


def ratio(actual: int | float, bound: int | float) -> float | None:
    """``actual / bound``; 1.0 when both are 0, None when only ``bound`` is (no finite ratio).

    >>> ratio(3, 2), ratio(0, 0), ratio(5, 0)
    (1.5, 1.0, None)
    """
    if bound == 0:
        return 1.0 if actual == 0 else None
    return actual / bound


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


_SIZE = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*([KMGT]i?B|B)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_bytes(text: str) -> float | None:
    """Bytes from a number (``"80e9"``) or a size with its unit (``"80GB"``, ``"79.1GiB"``,
    ``"64 MiB"``: KB, MB, GB, TB are powers of 1000, KiB to TiB of 1024), signed as written
    (the caller judges the range); None when ``text`` is neither.

    >>> parse_bytes("80GB"), parse_bytes("2 KiB"), parse_bytes("1e3"), parse_bytes("lots")
    (80000000000.0, 2048.0, 1000.0, None)
    >>> parse_bytes("-5GB")
    -5000000000.0
    """
    m = _SIZE.match(text)
    if m:
        return float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    try:
        return float(text)
    except ValueError:
        return None


def parse_budget(
    text: str | int, *, what: str = "byte budget", param: str | tuple[str, ...] = ()
) -> tuple[float, bool]:
    """``(amount, is_percent)`` from ``1048576``, ``"1MiB"``, ``"500KB"`` or ``"5%"``: a
    budget of bytes, the amount or a percentage of an earlier total (``what`` and ``param``
    name it in errors).

    >>> parse_budget("1MiB"), parse_budget("5%"), parse_budget(4096)
    ((1048576.0, False), (5.0, True), (4096.0, False))
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ShardscopeError(f"{what} must be >= 0, got {text}", param=param)
        return float(text), False
    words = str(text).strip()
    percent = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", words)
    if percent:
        return float(percent.group(1)), True
    size = parse_bytes(words)
    if size is None or not size >= 0 or size == float("inf"):
        raise ShardscopeError(
            f"{what} {text!r}: write a number of bytes, a size such as 64MiB or 1GB, or a "
            f"percentage of the old total such as 5%",
            param=param,
        )
    return size, False


def format_memory(n: int | float) -> str:
    """A device's memory for people: a datasheet's decimal size beside its binary one
    (``80e9`` -> ``'80 GB (74.51 GiB)'``, what a runtime's GiB shows below it), a binary
    size as :func:`format_bytes` writes it.

    >>> format_memory(80e9), format_memory(16 * 2**30), format_memory(79.11 * 2**30)
    ('80 GB (74.51 GiB)', '16 GiB', '79.11 GiB')
    """
    gb = n / 1e9
    if n >= 2**30 and gb == int(gb) and n % 2**30:
        return f"{gb:g} GB ({format_bytes(n)})"
    return format_bytes(n)


def format_bytes(n: int | float) -> str:
    """Bytes for people: ``65536`` -> ``'64 KiB'``; exact below 1 KiB; any size.

    >>> format_bytes(16 * 1024 * 4), format_bytes(1000), format_bytes(3 * 2**20 // 2)
    ('64 KiB', '1000 B', '1.5 MiB')
    >>> format_bytes(10**400)
    '8.272e+375 YiB'
    """
    if not n >= 1024:  # also NaN
        return f"{n} B"
    power = 1
    while power < len(_UNITS) and n >= 1024 ** (power + 1):
        power += 1
    unit = _UNITS[power - 1]
    if isinstance(n, float) or n < 2**1000:
        return f"{n / 1024**power:.4g} {unit}"
    # Past what a float holds: four significant digits by integer arithmetic.
    q = n // 1024**power
    e = int(math.log10(q))
    e += (10 ** (e + 1) <= q) - (10**e > q)
    lead = (q * 10 // 10 ** (e - 3) + 5) // 10  # four digits, rounded
    if lead >= 10**4:
        lead, e = lead // 10, e + 1
    mantissa = f"{lead // 1000}.{lead % 1000:03d}".rstrip("0").rstrip(".")
    return f"{mantissa}e+{e} {unit}"


@dataclass(frozen=True)
class Totals(Record):
    """Sums over collectives (compiled, or a bound's terms), each weighted by its count:
    executions, payload bytes and bytes each device sends."""

    count: int = 0
    payload_bytes: int = 0
    traffic_bytes: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.count + other.count,
            self.payload_bytes + other.payload_bytes,
            self.traffic_bytes + other.traffic_bytes,
        )


_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)


def group_totals(
    items: Iterable[_T], key: Callable[[_T], _K], totals: Callable[[_T], Totals]
) -> dict[_K, Totals]:
    """``{key(item): sum of totals(item)}``, keys in the order they first appear: how audits,
    bounds and verdicts sum collectives per (mesh axes, kind).

    >>> pairs = [("x", 1), ("y", 2), ("x", 3)]
    >>> sums = group_totals(pairs, lambda p: p[0], lambda p: Totals(1, p[1]))
    >>> {k: (t.count, t.payload_bytes) for k, t in sums.items()}
    {'x': (2, 4), 'y': (1, 2)}
    """
    out: dict[_K, Totals] = {}
    for item in items:
        k = key(item)
        out[k] = out.get(k, Totals()) + totals(item)
    return out


def _scaled(n: float, units: tuple[tuple[str, float], ...]) -> str:
    """``n`` to three significant digits in the largest of ``units`` (name and size, largest
    first; the last takes what is smaller) that it reaches once rounded: ``999.6`` of a unit
    below is one of this unit, not ``1e+03`` of that. Past a thousand of the largest unit,
    whole numbers with thousands separators."""
    rounded = float(f"{n:.3g}")
    for unit, scale in units:
        if abs(rounded) >= scale or unit == units[-1][0]:
            value = rounded / scale
            return f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:.3g} {unit}"
    raise AssertionError("unreachable: the last unit takes the rest")


def format_seconds(s: float) -> str:
    """``0.00123`` -> ``'1.23 ms'``; ``0.9996`` -> ``'1 s'``.

    >>> format_seconds(0.00123), format_seconds(0.9996), format_seconds(4321.0)
    ('1.23 ms', '1 s', '4,320 s')
    """
    if s == 0:
        return "0"
    return _scaled(s, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)))


def format_flops(n: float) -> str:
    """``"9.44 GFLOP"``: three significant digits in the largest unit below ``n``.

    >>> format_flops(9.437e9), format_flops(1.2e15), format_flops(512), format_flops(999.7e12)
    ('9.44 GFLOP', '1.2 PFLOP', '512 FLOP', '1 PFLOP')
    """
    units = (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("FLOP", 1.0))
    return _scaled(n, units)
