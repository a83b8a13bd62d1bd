"""Replica groups as printed in HLO, and the user's mesh axes they run over.

XLA prints a collective's groups in one of these forms (``xla/hlo/ir/replica_group.cc``,
``tile_assignment.cc``, ``mesh_and_axis.cc``):

* explicit lists ``{{0,1,2,3},{4,5,6,7}}``; ``{}`` is one group of every participant;
* iota ``[2,4]<=[8]`` (rows of ``arange(8).reshape(2,4)``) and ``[4,2]<=[2,4]T(1,0)``
  (rows of ``arange(8).reshape(2,4).transpose(1,0).reshape(4,2)``);
* mesh axes ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``, optionally with
  ``, device_ids=([2,4]T(1,0))`` giving the device order, and sub-axes ``'a':(pre)size``;
  ``maximal_mesh[device_id=3] {}`` is a single device.

collective-permute prints ``source_target_pairs={{0,1},{1,2},...}`` instead.

The ids are logical partition ids: partition ``p`` runs on ``mesh.devices.flat[p]``, so its
coordinate in the user's mesh is ``numpy.unravel_index(p, mesh shape)``, whatever order the
devices were put in. A group runs over the axes whose coordinates vary inside it; a group
covering only a strided part of an axis runs over a sub-axis, written like Shardy does,
``'name:(pre)size'``; a group that fits no set of (sub-)axes is irregular.

>>> parse_replica_groups("[2,4]<=[8]").groups
((0, 1, 2, 3), (4, 5, 6, 7))
>>> axes_of_groups(((0, 4), (1, 5), (2, 6), (3, 7)), {"dp": 2, "mp": 4}).axes
('dp',)
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardscope._src.base.errors import HloParseError
from shardscope._src.base.vocab import Vocab
from shardscope._src.hlo.parse import MAX_MODULE_DEVICES, read_int

# Digits are ASCII digits (re.ASCII): Python's \d also takes those of other scripts.
_INTS = re.compile(r"\s*-?[0-9]+\s*", re.ASCII)
_IOTA = re.compile(r"\[([0-9,\s]+)\]<=\[([0-9,\s]+)\](?:T\(([0-9,\s]+)\))?", re.ASCII)
_MESH_AXIS = re.compile(r"""\s*(?:'([^']*)'|"([^"]*)"|([\w.\-]+))\s*=\s*([0-9]+)\s*""", re.ASCII)
_AXIS_REF = re.compile(
    r"""\s*(?:'([^']*)'|"([^"]*)"|([\w.\-]+))\s*(?::\(([0-9]+)\)([0-9]+))?\s*""", re.ASCII
)

# numpy arrays have at most 64 dimensions; printed tile shapes have a handful.
_MAX_RANK = 32

#: Device ids the replica groups of one module may expand to, over all its distinct printed
#: forms (each form is expanded once however many collectives print it): a real program prints
#: a few forms per mesh axis, e.g. 16 forms of 8,192 devices or 64 of 2,048 (2**17 ids).
MAX_GROUP_IDS_PER_MODULE = 2**17


class GroupMode(Vocab):
    """XLA's ``CollectiveOpGroupMode``: what the ids of a collective's groups count."""

    #: replica ids (each partition on its own when there is one replica)
    REPLICA = "replica"
    #: partition ids
    PARTITION = "partition"
    #: replica ids, each group spanning every partition
    REPLICA_AND_PARTITION = "replica_and_partition"
    #: global device ids (``use_global_device_ids=true``)
    FLATTENED = "flattened"


@dataclass(frozen=True)
class ReplicaGroups:
    """Parsed ``replica_groups``: its printed ``form`` and the groups of partition ids.

    ``groups`` is None for ``{}`` (all participants; see :meth:`resolve`).
    """

    form: str  # "explicit", "all", "iota", "mesh"
    groups: tuple[tuple[int, ...], ...] | None
    raw: str

    def resolve(self, num_participants: int) -> tuple[tuple[int, ...], ...]:
        """The groups, with ``{}`` expanded to one group of ``num_participants`` ids."""
        if self.groups is None:
            return (tuple(range(num_participants)),)
        return self.groups


def _error(text: str, why: str) -> HloParseError:
    return HloParseError(f"replica groups {text[:200]!r}: {why}")


def _ints(text: str, raw: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    out = []
    for piece in text.split(","):
        if not _INTS.fullmatch(piece):
            raise _error(raw, f"{piece.strip()[:30]!r} is not an integer")
        t = piece.strip()
        value = read_int(t.removeprefix("-"))
        if value is None:
            raise _error(raw, f"{t[:30]!r} is larger than a device id can be")
        out.append(-value if t.startswith("-") else value)
    return tuple(out)


def _check_ids(total: int, max_ids: int | None, raw: str) -> None:
    """Refuses, before anything is expanded, a form holding more ids than there are devices."""
    limit = MAX_MODULE_DEVICES if max_ids is None else max_ids
    if total > limit:
        where = (
            "the module runs on"
            if max_ids is not None
            else "this tool audits (more than any single program runs on)"
        )
        raise _error(raw, f"they hold {total:,} device ids but {where} {limit:,} devices")


def _iota_array(
    reshape: Sequence[int], perm: Sequence[int] | None, raw: str, max_ids: int | None
) -> np.ndarray:
    if len(reshape) > _MAX_RANK:
        raise _error(raw, f"{len(reshape)} dimensions; device arrays have at most {_MAX_RANK}")
    total = math.prod(reshape)
    _check_ids(total, max_ids, raw)
    perm = tuple(range(len(reshape))) if perm is None else tuple(perm)
    if sorted(perm) != list(range(len(reshape))):
        raise _error(raw, f"T{perm} is not a permutation of {len(reshape)} dimensions")
    return np.arange(total, dtype=np.int64).reshape(tuple(reshape)).transpose(perm)


def parse_replica_groups(text: str, max_ids: int | None = None) -> ReplicaGroups:
    """Parses any printed form of ``replica_groups`` (see the module docstring).

    ``max_ids``: the devices the module runs on; a compact form (iota, mesh) holding more ids
    is refused before it is expanded (default: :data:`MAX_MODULE_DEVICES`).
    """
    s = text.strip()
    if s.startswith("{"):
        return _parse_explicit(s)
    if s.startswith("["):
        m = _IOTA.fullmatch(s)
        if m is None:
            raise _error(text, "expected the iota form [groups,size]<=[dims]T(perm)")
        dims = _ints(m.group(1), text)
        reshape = _ints(m.group(2), text)
        perm = _ints(m.group(3), text) if m.group(3) else None
        if len(dims) != 2 or math.prod(dims) != math.prod(reshape) or 0 in reshape:
            total = math.prod(reshape)
            shown = f"{total:,}" if total.bit_length() < 64 else "so many"
            raise _error(text, f"{list(dims)[:8]} does not hold the {shown} ids")
        arr = _iota_array(reshape, perm, text, max_ids).reshape(dims)
        return ReplicaGroups("iota", tuple(map(tuple, arr.tolist())), text)
    if s.startswith(("mesh[", "maximal_mesh[")):
        return _parse_mesh(s, text, max_ids)
    raise _error(text, "not a form XLA prints (explicit {{...}}, iota [..]<=[..], mesh[...])")


def _parse_explicit(s: str) -> ReplicaGroups:
    if not s.endswith("}"):
        raise _error(s, "explicit groups must end with '}'")
    inner = s[1:-1].strip()
    if not inner:
        return ReplicaGroups("all", None, s)
    groups = []
    pos = 0
    while pos < len(inner):
        while pos < len(inner) and inner[pos] in " ,":
            pos += 1
        if pos >= len(inner):
            break
        if inner[pos] != "{":
            raise _error(s, f"expected '{{' at {inner[pos : pos + 20]!r}")
        end = inner.find("}", pos)
        if end < 0:
            raise _error(s, "a group is never closed")
        groups.append(_ints(inner[pos + 1 : end], s))
        pos = end + 1
    return ReplicaGroups("explicit", tuple(groups), s)


def parse_source_target_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """``{{0,1},{1,2}}`` -> ``((0, 1), (1, 2))``."""
    rg = _parse_explicit(text.strip())
    pairs = rg.groups or ()
    for p in pairs:
        if len(p) != 2:
            raise _error(text, f"source_target_pairs entry {list(p)} is not a pair")
    return tuple((p[0], p[1]) for p in pairs)


def _parse_mesh(s: str, raw: str, max_ids: int | None) -> ReplicaGroups:
    if s.startswith("maximal_mesh["):
        m = re.fullmatch(r"maximal_mesh\[device_id=([0-9]+)\]\s*(\{\s*\})?", s, re.ASCII)
        if m is None:
            raise _error(raw, "expected maximal_mesh[device_id=N] {}")
        return ReplicaGroups("mesh", (_ints(m.group(1), raw),), raw)
    close = s.find("]")
    if close < 0:
        raise _error(raw, "mesh[...] is never closed")
    names: list[str] = []
    sizes: list[int] = []
    for piece in s[len("mesh[") : close].split(","):
        m = _MESH_AXIS.fullmatch(piece)
        if m is None:
            raise _error(raw, f"mesh axis {piece.strip()!r} is not name=size")
        names.append(m.group(1) or m.group(2) or m.group(3) or "")
        sizes.extend(_ints(m.group(4), raw))
    if len(set(names)) != len(names) or 0 in sizes:
        raise _error(raw, "mesh axes must have distinct names and positive sizes")
    if len(sizes) > _MAX_RANK:
        raise _error(raw, f"{len(sizes)} mesh axes; a mesh has at most {_MAX_RANK}")
    total = math.prod(sizes)
    _check_ids(total, max_ids, raw)
    rest = s[close + 1 :].strip()
    device_ids: np.ndarray | None = None
    if rest.startswith(","):
        rest = rest[1:].strip()
        m = re.match(r"device_ids=\(", rest)
        if m is None:
            raise _error(raw, f"expected device_ids=(...) after the mesh, found {rest[:30]!r}")
        depth, j = 0, m.end() - 1
        for j in range(m.end() - 1, len(rest)):
            depth += {"(": 1, ")": -1}.get(rest[j], 0)
            if depth == 0:
                break
        if depth != 0:
            raise _error(raw, "device_ids=( is never closed")
        device_ids = _device_ids(rest[m.end() : j], sizes, raw)
        rest = rest[j + 1 :].strip()
    if not (rest.startswith("{") and rest.endswith("}")):
        raise _error(raw, "expected the grouped axes {'a',...} after the mesh")
    ids = np.arange(total, dtype=np.int64) if device_ids is None else device_ids
    refs: list[tuple[int, int | None, int | None]] = []  # (mesh dim, pre, size)
    inner = rest[1:-1]
    for piece in inner.split(",") if inner.strip() else []:
        m = _AXIS_REF.fullmatch(piece)
        if m is None:
            raise _error(raw, f"grouped axis {piece.strip()!r} is not 'name' or 'name':(pre)size")
        name = m.group(1) or m.group(2) or m.group(3) or ""
        if name not in names:
            raise _error(raw, f"grouped axis {name!r} is not an axis of the printed mesh")
        dim = names.index(name)
        pre = _ints(m.group(4), raw)[0] if m.group(4) else None
        size = _ints(m.group(5), raw)[0] if m.group(5) else None
        if pre is not None and (pre < 1 or size < 2 or sizes[dim] % (pre * size)):  # type: ignore[operator]
            raise _error(raw, f"sub-axis {piece.strip()} does not divide axis size {sizes[dim]}")
        refs.append((dim, pre, size))
    return ReplicaGroups("mesh", _mesh_groups(ids, sizes, refs, raw), raw)


def _device_ids(text: str, sizes: list[int], raw: str) -> np.ndarray:
    total = math.prod(sizes)
    t = text.strip()
    if t.startswith("["):
        m = re.fullmatch(r"\[([0-9,\s]+)\](?:T\(([0-9,\s]+)\))?", t, re.ASCII)
        if m is not None:
            reshape = _ints(m.group(1), raw)
            perm = _ints(m.group(2), raw) if m.group(2) else None
            if math.prod(reshape) != total:
                raise _error(raw, f"device_ids {t[:60]} does not hold {total} ids")
            return _iota_array(reshape, perm, raw, total).reshape(-1)
        # An explicit array printed with its dimensions first: [2,4]0,4,1,5,...
        m2 = re.fullmatch(r"\[([0-9,\s]+)\]([0-9,\s]+)", t, re.ASCII)
        if m2 is None:
            raise _error(raw, f"device_ids {t!r} is neither an iota nor a list of ids")
        t = m2.group(2)
    ids = np.asarray(_ints(t, raw), dtype=np.int64)
    if len(ids) != total or sorted(ids.tolist()) != list(range(total)):
        raise _error(raw, f"device_ids {text[:60]!r} is not a permutation of 0..{total - 1}")
    return ids


def _mesh_groups(
    ids: np.ndarray,
    sizes: list[int],
    refs: list[tuple[int, int | None, int | None]],
    raw: str,
) -> tuple[tuple[int, ...], ...]:
    # Split every mesh dimension into the factors its (sub-)axes name, then move the named
    # factors last in the order they are listed; each row is then one group.
    factors: list[list[int]] = []  # per mesh dim, sizes of its factors, major first
    factor_of_ref: list[tuple[int, int]] = []
    by_dim: dict[int, list[int]] = {}
    for k, (dim, _, _) in enumerate(refs):
        by_dim.setdefault(dim, []).append(k)
    ref_factor: dict[int, tuple[int, int]] = {}
    for dim, full in enumerate(sizes):
        ks = by_dim.get(dim, [])
        if not ks:
            factors.append([full])
            continue
        if any(refs[k][1] is None for k in ks):
            if len(ks) > 1:
                raise _error(raw, "a whole axis is listed together with its sub-axes")
            factors.append([full])
            ref_factor[ks[0]] = (dim, 0)
            continue
        pieces: list[int] = []
        covered = 1
        for k in sorted(ks, key=lambda k: refs[k][1]):  # type: ignore[arg-type,return-value]
            pre, size = refs[k][1], refs[k][2]
            assert pre is not None and size is not None
            if pre % covered:
                raise _error(raw, "sub-axes of one axis overlap")
            if pre != covered:
                pieces.append(pre // covered)
            ref_factor[k] = (dim, len(pieces))
            pieces.append(size)
            covered = pre * size
        if full % covered:
            raise _error(raw, "sub-axes of one axis overlap or exceed it")
        if covered != full:
            pieces.append(full // covered)
        factors.append(pieces)
    flat_index: dict[tuple[int, int], int] = {}
    shape: list[int] = []
    for dim, pieces in enumerate(factors):
        for j, p in enumerate(pieces):
            flat_index[(dim, j)] = len(shape)
            shape.append(p)
    for k in range(len(refs)):
        factor_of_ref.append(ref_factor[k])
    grouped = [flat_index[f] for f in factor_of_ref]
    if len(set(grouped)) != len(grouped):
        raise _error(raw, "an axis is listed twice")
    rest = [i for i in range(len(shape)) if i not in grouped]
    if len(shape) > _MAX_RANK:
        raise _error(raw, f"the axes split into {len(shape)} factors; at most {_MAX_RANK}")
    group_size = math.prod(shape[i] for i in grouped)
    arr = ids.reshape(shape).transpose(rest + grouped).reshape(-1, group_size)
    return tuple(map(tuple, arr.tolist()))


_SUB_AXIS = re.compile(r"(.*):\(([0-9]+)\)([0-9]+)", re.ASCII | re.DOTALL)


@dataclass(frozen=True)
class AxisRef:
    """A mesh axis, or a sub-axis of one (Shardy's ``name:(pre)size``): the axis ``name``
    split into factors, the sub-axis is the factor of ``size`` after (minor to) factors of
    ``pre`` devices in all, so its devices sit ``axis size / (pre * size)`` apart along the
    axis; ``size`` None is the whole axis.

    Written as :attr:`label` in tables and JSON (``'mp'``, ``'mp:(2)2'``); :meth:`parse`
    reads a label back.

    >>> AxisRef("mp", 2, 2).label, AxisRef.parse("mp:(2)2"), AxisRef.parse("mp").label
    ('mp:(2)2', AxisRef(name='mp', pre=2, size=2), 'mp')
    """

    name: str
    pre: int = 1
    size: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.size is None else f"{self.name}:({self.pre}){self.size}"

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, label: str) -> AxisRef:
        """The reference a :attr:`label` writes (a name without the suffix is a whole axis)."""
        return _parse_axis_ref(label)


@functools.lru_cache(maxsize=1024)
def _parse_axis_ref(label: str) -> AxisRef:
    m = _SUB_AXIS.fullmatch(label)
    if m is None:
        return AxisRef(label)
    return AxisRef(m.group(1), int(m.group(2)), int(m.group(3)))


@dataclass(frozen=True)
class AxisMatch:
    """The user's mesh axes a set of groups runs over.

    ``axes`` is in mesh order, each the :attr:`AxisRef.label` of an axis or sub-axis
    (``'name:(pre)size'``). ``irregular`` is True when the groups fit no set of axes (``axes``
    is then empty and ``reason`` says why).
    """

    axes: tuple[str, ...]
    group_size: int
    irregular: bool = False
    reason: str = ""


@functools.lru_cache(maxsize=256)
def _prime_digits(size: int) -> tuple[int, ...]:
    """The prime factors of ``size``, smallest first (trial division up to its square root)."""
    primes: list[int] = []
    rest, p = size, 2
    while p * p <= rest:
        while rest % p == 0:
            primes.append(p)
            rest //= p
        p += 1
    if rest > 1:
        primes.append(rest)
    return tuple(primes)


_Factors = tuple[tuple[int, int], ...]


def _dim_factors(rows: np.ndarray, size: int) -> list[tuple[int, _Factors | None]]:
    """For each row of distinct coordinates along one mesh dimension of ``size``, how many
    there are and the (pre, size) sub-axes whose product they are (None if they are no such
    product).

    ``rows`` holds one group's distinct coordinates per row, increasing, padded with ``size``.
    A sub-axis ``(pre)k`` varies index // post % k with post = size // (pre * k). All rows are
    judged at once, digit by digit, so that many groups cost no more than a few array passes.
    """
    valid = rows < size
    n = valid.sum(axis=1)
    first = rows[:, :1]
    # One strided run: {base + j * post}.
    if rows.shape[1] > 1:
        post = rows[:, 1] - rows[:, 0]
        steps_ok = np.all((np.diff(rows, axis=1) == post[:, None]) | ~valid[:, 1:], axis=1)
        safe = np.where(post > 0, post, 1)
        strided = (
            (n > 1)
            & (post > 0)
            & steps_ok
            & (size % (safe * np.maximum(n, 1)) == 0)
            & ((rows[:, 0] // safe) % np.maximum(n, 1) == 0)
        )
    else:
        post = np.zeros(len(rows), dtype=np.int64)
        strided = np.zeros(len(rows), dtype=bool)
    # Several runs: split the dimension into prime digits and find which ones vary.
    primes = _prime_digits(size)
    varying = np.zeros((len(rows), len(primes)), dtype=bool)
    place = 1
    for i in range(len(primes) - 1, -1, -1):  # least significant digit first
        digit = (rows // place) % primes[i]
        varying[:, i] = np.any((digit != (first // place) % primes[i]) & valid, axis=1)
        place *= primes[i]
    # The verdict depends on the count, the stride of a strided run and which digits vary:
    # rows that agree on these are judged once.
    keys = np.concatenate(
        [n[:, None], np.where(strided, post, 0)[:, None], varying.astype(np.int64)], axis=1
    )
    distinct, inverse = _unique_rows(keys)
    verdicts: list[tuple[int, _Factors | None]] = []
    for key in distinct.tolist():
        count, step, vary = key[0], key[1], key[2:]
        if count == size:
            verdicts.append((count, ((1, size),)))
        elif step:
            verdicts.append((count, ((size // (step * count), count),)))
        else:
            expected, factors = _runs(primes, [bool(x) for x in vary])
            verdicts.append((count, factors if expected == count else None))
    return [verdicts[i] for i in inverse.tolist()]


def _runs(primes: Sequence[int], varying: Sequence[bool]) -> tuple[int, _Factors]:
    """The product of the varying prime digits, and each run of them as (pre, size)."""
    expected = math.prod(q for q, var in zip(primes, varying, strict=True) if var)
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(primes):
        if not varying[i]:
            i += 1
            continue
        j = i
        while j < len(primes) and varying[j]:
            j += 1
        out.append((math.prod(primes[:i]), math.prod(primes[i:j])))
        i = j
    return expected, tuple(out)


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a 2-D array, and for each row the index of its distinct row.

    Rows are compared as raw bytes (one opaque item per row), which stays fast for wide rows
    where ``np.unique(axis=0)`` builds a field per column.
    """
    a = np.ascontiguousarray(a)
    items = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).reshape(-1)
    _, first, inverse = np.unique(items, return_index=True, return_inverse=True)
    return a[first], inverse.reshape(-1)


def axes_of_groups(groups: Sequence[Sequence[int]], mesh_axes: Mapping[str, int]) -> AxisMatch:
    """Names the mesh axes that every group in ``groups`` spans (partition ids).

    All groups must span the same (sub-)axes, hold every combination of them exactly once,
    and together hold every partition once; otherwise the match is irregular (the reason
    names the first group, in order, that breaks a rule).
    """
    names = list(mesh_axes)
    sizes = [int(v) for v in mesh_axes.values()]
    total = math.prod(sizes)
    if not groups:
        return AxisMatch((), 0, True, "no groups")
    group_size = len(groups[0])
    if any(len(g) != group_size for g in groups):
        return AxisMatch((), group_size, True, "groups differ in size")
    ids = np.asarray(groups, dtype=np.int64).reshape(len(groups), group_size)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= total):
        return AxisMatch((), group_size, True, f"an id is outside the mesh's {total} partitions")
    if len(np.unique(ids)) != ids.size:
        return AxisMatch((), group_size, True, "a partition appears in two groups")
    if ids.size != total:
        return AxisMatch((), group_size, True, f"the groups hold {ids.size} of {total} partitions")
    if group_size == 1:
        return AxisMatch((), 1)
    # Each group's distinct coordinates along each mesh dimension, found for all groups at
    # once; groups with the same coordinate sets (usually all of them, up to an offset along
    # the axes they do not span) are judged once.
    coords = np.unravel_index(ids, sizes)
    results: list[list[tuple[int, _Factors | None]]] = []  # per dimension: distinct verdicts
    which = np.empty((len(groups), len(sizes)), dtype=np.int64)  # group -> verdict, per dim
    for d, size in enumerate(sizes):
        v = np.sort(coords[d], axis=1)
        new = np.ones(v.shape, dtype=bool)
        new[:, 1:] = v[:, 1:] != v[:, :-1]
        # The distinct values first, then ``size`` (no coordinate) as padding.
        padded = np.sort(np.where(new, v, size), axis=1)
        # Along a dimension a group does not span, where it sits does not matter.
        padded[new.sum(axis=1) == 1] = np.r_[0, np.full(group_size - 1, size)]
        rows, inverse = _unique_rows(padded)
        index: dict[tuple[int, _Factors | None], int] = {}
        row_verdict = [index.setdefault(f, len(index)) for f in _dim_factors(rows, size)]
        results.append(list(index))
        which[:, d] = np.asarray(row_verdict, dtype=np.int64)[inverse]
    kinds, inverse = _unique_rows(which)
    verdicts: list[tuple[str, ...] | AxisMatch] = []
    for kind in kinds:
        labels: list[str] = []
        spans = 1
        verdict: tuple[str, ...] | AxisMatch | None = None
        for d, size in enumerate(sizes):
            count, subs = results[d][kind[d]]
            spans *= count
            if count == 1:
                continue
            if subs is None:
                verdict = AxisMatch(
                    (), group_size, True, f"the group spans an irregular part of {names[d]!r}"
                )
                break
            for pre, k in subs:
                ref = AxisRef(names[d]) if k == size else AxisRef(names[d], pre, k)
                labels.append(ref.label)
        if verdict is None and spans != group_size:
            verdict = AxisMatch(
                (), group_size, True, "the group is not every combination of its axes"
            )
        verdicts.append(tuple(labels) if verdict is None else verdict)
    first = verdicts[inverse[0]]
    if isinstance(first, AxisMatch):
        return first
    bad = [k for k, v in enumerate(verdicts) if v != first]
    if not bad:
        return AxisMatch(first, group_size)
    culprit = verdicts[inverse[int(np.argmax(np.isin(inverse, bad)))]]
    if isinstance(culprit, AxisMatch):
        return culprit
    return AxisMatch((), group_size, True, "groups span different axes")


def groups_of_axes(
    axes: Sequence[str], mesh_axes: Mapping[str, int]
) -> tuple[tuple[int, ...], ...] | None:
    """The replica groups (partition ids) that span exactly ``axes`` (labels, as
    :attr:`AxisMatch.axes` writes them) over a mesh of ``mesh_axes``, in one order: the
    groups by the coordinates they do not span, each group by those it spans, both
    row-major in mesh order. None where a label names no axis of the mesh, a sub-axis does
    not divide its axis, or two sub-axes overlap.

    :func:`axes_of_groups` of the result gives ``axes`` back; a compiler may print the same
    groups in another order (``[4,2]<=[2,2,2]T(1,0,2)``), which this does not reproduce.

    >>> groups_of_axes(("dp",), {"dp": 2, "mp": 4})
    ((0, 4), (1, 5), (2, 6), (3, 7))
    >>> groups_of_axes(("dp", "mp:(2)2"), {"dp": 2, "mp": 4})
    ((0, 1, 4, 5), (2, 3, 6, 7))
    """
    return _groups_of_axes(tuple(axes), tuple((str(k), int(v)) for k, v in mesh_axes.items()))


@functools.lru_cache(maxsize=256)
def _groups_of_axes(
    axes: tuple[str, ...], mesh: tuple[tuple[str, int], ...]
) -> tuple[tuple[int, ...], ...] | None:
    sizes = dict(mesh)
    refs: dict[str, list[tuple[int, int]]] = {}  # axis -> (pre, size) of each reference
    for label in axes:
        ref = AxisRef.parse(label)
        if ref.name not in sizes:
            return None
        n = sizes[ref.name]
        size = n if ref.size is None else ref.size
        if ref.pre < 1 or size < 1 or n % (ref.pre * size):
            return None
        refs.setdefault(ref.name, []).append((ref.pre, size))
    # Each axis cut into factors, major first, at the bounds of the sub-axes named on it.
    factors: list[int] = []
    spanned: list[bool] = []
    for name, n in mesh:
        on = refs.get(name, [])
        cuts = sorted({1, n, *(p for p, _ in on), *(p * k for p, k in on)})
        for low, high in zip(cuts, cuts[1:], strict=False):
            if high % low:
                return None
            owners = sum(p <= low and high <= p * k for p, k in on)
            if owners > 1:
                return None
            factors.append(high // low)
            spanned.append(owners == 1)
    ids = np.arange(math.prod(n for _, n in mesh)).reshape(factors or [1])
    order = [i for i, s in enumerate(spanned) if not s] + [i for i, s in enumerate(spanned) if s]
    size = math.prod(f for f, s in zip(factors, spanned, strict=True) if s)
    rows = ids.transpose(order or [0]).reshape(-1, size)
    return tuple(tuple(row) for row in rows.tolist())


def axes_of_pairs(pairs: Sequence[tuple[int, int]], mesh_axes: Mapping[str, int]) -> AxisMatch:
    """Axes along which a collective-permute moves data: where source and target differ.

    ``group_size`` is the number of devices along those axes (the ring length).
    """
    names = list(mesh_axes)
    sizes = [int(v) for v in mesh_axes.values()]
    total = math.prod(sizes)
    if any(p < 0 or p >= total for pair in pairs for p in pair):
        return AxisMatch((), 0, True, f"an id is outside the mesh's {total} partitions")
    moving = [False] * len(sizes)
    if pairs:
        ends = np.asarray(pairs, dtype=np.int64).reshape(len(pairs), 2)
        a = np.unravel_index(ends[:, 0], sizes)
        b = np.unravel_index(ends[:, 1], sizes)
        moving = [bool(np.any(a[d] != b[d])) for d in range(len(sizes))]
    axes = tuple(n for n, m in zip(names, moving, strict=True) if m)
    size = math.prod(s for s, m in zip(sizes, moving, strict=True) if m)
    return AxisMatch(axes, size if axes else 1)
