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

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardscope._src.base.errors import HloParseError

_INTS = re.compile(r"\s*-?\d+\s*")
_IOTA = re.compile(r"\[([\d,\s]+)\]<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?")
_MESH_AXIS = re.compile(r"""\s*(?:'([^']*)'|"([^"]*)"|([\w.\-]+))\s*=\s*(\d+)\s*""")
_AXIS_REF = re.compile(r"""\s*(?:'([^']*)'|"([^"]*)"|([\w.\-]+))\s*(?::\((\d+)\)(\d+))?\s*""")

# Meshes larger than this are not expanded into explicit groups (memory guard for fuzzed text).
_MAX_IDS = 1 << 20


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
            raise _error(raw, f"{piece.strip()!r} is not an integer")
        out.append(int(piece))
    return tuple(out)


def _iota_array(reshape: Sequence[int], perm: Sequence[int] | None, raw: str) -> np.ndarray:
    total = math.prod(reshape)
    if total > _MAX_IDS:
        raise _error(raw, f"{total} ids is more than this tool expands")
    perm = tuple(range(len(reshape))) if perm is None else tuple(perm)
    if sorted(perm) != list(range(len(reshape))):
        raise _error(raw, f"T{perm} is not a permutation of {len(reshape)} dimensions")
    return np.arange(total, dtype=np.int64).reshape(tuple(reshape)).transpose(perm)


def parse_replica_groups(text: str) -> ReplicaGroups:
    """Parses any printed form of ``replica_groups`` (see the module docstring)."""
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
            raise _error(text, f"{list(dims)} does not hold the {math.prod(reshape)} ids")
        arr = _iota_array(reshape, perm, text).reshape(dims)
        return ReplicaGroups("iota", tuple(tuple(int(v) for v in row) for row in arr), text)
    if s.startswith(("mesh[", "maximal_mesh[")):
        return _parse_mesh(s, text)
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


def _parse_mesh(s: str, raw: str) -> ReplicaGroups:
    if s.startswith("maximal_mesh["):
        m = re.fullmatch(r"maximal_mesh\[device_id=(\d+)\]\s*(\{\s*\})?", s)
        if m is None:
            raise _error(raw, "expected maximal_mesh[device_id=N] {}")
        return ReplicaGroups("mesh", ((int(m.group(1)),),), raw)
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
        sizes.append(int(m.group(4)))
    if len(set(names)) != len(names) or 0 in sizes:
        raise _error(raw, "mesh axes must have distinct names and positive sizes")
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
    total = math.prod(sizes)
    if total > _MAX_IDS:
        raise _error(raw, f"{total} ids is more than this tool expands")
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
        pre = int(m.group(4)) if m.group(4) else None
        size = int(m.group(5)) if m.group(5) else None
        if pre is not None and (pre < 1 or size < 2 or sizes[dim] % (pre * size)):  # type: ignore[operator]
            raise _error(raw, f"sub-axis {piece.strip()} does not divide axis size {sizes[dim]}")
        refs.append((dim, pre, size))
    return ReplicaGroups("mesh", _mesh_groups(ids, sizes, refs, raw), raw)


def _device_ids(text: str, sizes: list[int], raw: str) -> np.ndarray:
    total = math.prod(sizes)
    t = text.strip()
    if t.startswith("["):
        m = re.fullmatch(r"\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", t)
        if m is not None:
            reshape = _ints(m.group(1), raw)
            perm = _ints(m.group(2), raw) if m.group(2) else None
            if math.prod(reshape) != total:
                raise _error(raw, f"device_ids {t} does not hold {total} ids")
            return _iota_array(reshape, perm, raw).reshape(-1)
        # An explicit array printed with its dimensions first: [2,4]0,4,1,5,...
        m2 = re.fullmatch(r"\[([\d,\s]+)\]([\d,\s]+)", t)
        if m2 is None:
            raise _error(raw, f"device_ids {t!r} is neither an iota nor a list of ids")
        t = m2.group(2)
    ids = np.asarray(_ints(t, raw), dtype=np.int64)
    if len(ids) != total or sorted(ids.tolist()) != list(range(total)):
        raise _error(raw, f"device_ids {text!r} is not a permutation of 0..{total - 1}")
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
    group_size = math.prod(shape[i] for i in grouped)
    arr = ids.reshape(shape).transpose(rest + grouped).reshape(-1, group_size)
    return tuple(tuple(int(v) for v in row) for row in arr)


@dataclass(frozen=True)
class AxisMatch:
    """The user's mesh axes a set of groups runs over.

    ``axes`` is in mesh order; a sub-axis is written ``'name:(pre)size'``. ``irregular`` is
    True when the groups fit no set of axes (``axes`` is then empty and ``reason`` says why).
    """

    axes: tuple[str, ...]
    group_size: int
    irregular: bool = False
    reason: str = ""


def _dim_factor(values: list[int], size: int) -> list[tuple[int, int]] | None:
    """The (pre, size) sub-axes of one mesh dimension whose product is ``values``.

    ``values`` are the distinct coordinates a group takes along a dimension of ``size``; a
    sub-axis ``(pre)k`` of it varies index // post % k with post = size // (pre * k).
    Returns None if the values are no such product.
    """
    n = len(values)
    if n == size:
        return [(1, size)]
    # One strided run: {base + j * post}.
    if n > 1:
        post = values[1] - values[0]
        if (
            post > 0
            and size % (post * n) == 0
            and all(values[j] == values[0] + j * post for j in range(n))
        ):
            if (values[0] // post) % n == 0:
                return [(size // (post * n), n)]
    # Several runs: split the dimension into prime digits and find which ones vary.
    primes: list[int] = []
    rest, p = size, 2
    while rest > 1:
        while rest % p == 0:
            primes.append(p)
            rest //= p
        p += 1
    digits = []
    for v in values:
        d = []
        for q in reversed(primes):
            d.append(v % q)
            v //= q
        digits.append(tuple(reversed(d)))
    varying = [len({d[i] for d in digits}) > 1 for i in range(len(primes))]
    expected = math.prod(q for q, var in zip(primes, varying, strict=True) if var)
    if expected != n:
        return None
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
    return out


def axes_of_groups(groups: Sequence[Sequence[int]], mesh_axes: Mapping[str, int]) -> AxisMatch:
    """Names the mesh axes that every group in ``groups`` spans (partition ids).

    All groups must span the same (sub-)axes, hold every combination of them exactly once,
    and together hold every partition once; otherwise the match is irregular.
    """
    names = list(mesh_axes)
    sizes = [int(v) for v in mesh_axes.values()]
    total = math.prod(sizes)
    if not groups:
        return AxisMatch((), 0, True, "no groups")
    group_size = len(groups[0])
    if any(len(g) != group_size for g in groups):
        return AxisMatch((), group_size, True, "groups differ in size")
    flat = [p for g in groups for p in g]
    if any(p < 0 or p >= total for p in flat):
        return AxisMatch((), group_size, True, f"an id is outside the mesh's {total} partitions")
    if len(set(flat)) != len(flat):
        return AxisMatch((), group_size, True, "a partition appears in two groups")
    if len(flat) != total:
        return AxisMatch((), group_size, True, f"the groups hold {len(flat)} of {total} partitions")
    if group_size == 1:
        return AxisMatch((), 1)
    coords = np.stack(np.unravel_index(np.asarray(groups, dtype=np.int64), sizes), axis=-1)
    result: tuple[str, ...] | None = None
    for g in coords:  # g: (group_size, ndim)
        labels: list[str] = []
        per_dim: list[list[int]] = []
        for d in range(len(sizes)):
            vals = sorted({int(v) for v in g[:, d]})
            per_dim.append(vals)
            if len(vals) == 1:
                continue
            subs = _dim_factor(vals, sizes[d])
            if subs is None:
                return AxisMatch(
                    (), group_size, True, f"the group spans an irregular part of {names[d]!r}"
                )
            for pre, size in subs:
                labels.append(names[d] if size == sizes[d] else f"{names[d]}:({pre}){size}")
        if math.prod(len(v) for v in per_dim) != group_size:
            return AxisMatch((), group_size, True, "the group is not every combination of its axes")
        if result is None:
            result = tuple(labels)
        elif result != tuple(labels):
            return AxisMatch((), group_size, True, "groups span different axes")
    return AxisMatch(result or (), group_size)


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
    for src, dst in pairs:
        a = np.unravel_index(src, sizes)
        b = np.unravel_index(dst, sizes)
        for d in range(len(sizes)):
            if a[d] != b[d]:
                moving[d] = True
    axes = tuple(n for n, m in zip(names, moving, strict=True) if m)
    size = math.prod(s for s, m in zip(sizes, moving, strict=True) if m)
    return AxisMatch(axes, size if axes else 1)
