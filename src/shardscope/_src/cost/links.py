"""What a collective costs on a target's links: the one pricing of communication.

Every time shardscope gives a collective (a term of a lower bound, a collective the compiler
inserted, a plan's communication, the exposed time of an audit) comes from
:func:`alpha_beta_seconds`, through :func:`collective_seconds` at the bandwidth the group's
links achieve (or :func:`alpha_beta_time`, the public form at a bandwidth the caller gives).

Devices are numbered in mesh order (the last axis varies fastest) and node ``k`` holds
devices ``k*node_size`` to ``(k+1)*node_size - 1``. Inside a node a device sends at the link
bandwidth; a group spanning nodes moves its traffic over the network cards of the nodes it
spans: with ``m`` of its members on each node, ``m`` cards carry it (NCCL runs one ring per
card), so ``min(link, m x cross_node)``. Either way at ``comm_fraction`` of it, the bus
bandwidth collectives measure against the line rate (``Hardware.comm_fraction``'s source).
An all-to-all spanning nodes gets no such help: each device's bytes for the other nodes
leave through its own card, so it moves them at ``cross_node`` while its bytes for its own
node's devices go over the links at the same time (:func:`exchange_bandwidth`). An
all-to-all that sends each token once to each device of its experts (DeepEP's dispatch and
combine) sends it across the network once to each node instead, and the node's links carry
it on to the node's devices of its experts (``once_per_node``).
A group whose axes are not plain mesh axes (a sub-axis, an irregular group) is priced as the
worst case: across nodes, one member on each.

On a GPU a small ring collective (all-reduce, all-gather, reduce-scatter) does not pay the
bandwidth protocol's latency at every step: NCCL picks, for each message size, the fastest of
its protocols by its own tuning model, and for a message of kilobytes that is the low-latency
one (:data:`LOW_LATENCY`: a fixed start and under a microsecond a step, at a quarter of the
bandwidth). :func:`collective_seconds` prices both and takes the faster, so a tensor-parallel
all-reduce of 16 KB over 8 GPUs costs about 15 us, not 14 steps of ``latency_s``, and a
gradient all-reduce of gigabytes is priced as before.

Inside a TPU slice a ring collective sends both ways round its ring at once, so it takes
half the group's size in hops (:func:`ici_hops`), and each hop costs the longer of its fixed
latency (``latency_s``, about a microsecond) and its share of the traffic: an execution
takes the longer of its hops' latency and its traffic's time, not their sum. Groups that
cross slices (over the data-center network) keep the alpha-beta sum.

While it runs, a GPU collective holds some of the device's multiprocessors
(:func:`held_share`): compute beside it has the rest. NCCL's channels, unless it is a
mixture's all-to-all and the hardware says how many its dispatcher takes (``exchange_sms``:
DeepEP's or HybridEP's configured count).

Serving engines all-reduce a tensor-parallel layer's small outputs inside a node with their
own kernel, not NCCL's: each GPU writes its part into buffers its peers read over NVLink, and
one kernel sums them (one-shot for a few kilobytes, two-shot, a reduce-scatter then an
all-gather, above). :func:`engine_all_reduce_seconds` prices one execution as measured on
H100s (:data:`H100_ENGINE_ALL_REDUCE`), or NCCL's price where that is faster or the message
is beyond the measured sizes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from shardscope._src.base.comm import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    EXCHANGES,
    REDUCE_SCATTER,
    latency_steps,
    traffic_bytes,
)
from shardscope._src.base.errors import ShardscopeError
from shardscope._src.model.moe import device_share
from shardscope._src.targets import specs
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import Family


class Protocol(NamedTuple):
    """A collective protocol's latency and bandwidth, as NCCL's tuning model prices it: a
    fixed start, a latency a ring step inside a node and across nodes, and the share of the
    bus bandwidth it reaches."""

    start_s: float
    hop_s: float
    net_hop_s: float
    bandwidth_share: float


#: NCCL's low-latency protocol (LL) on a ring (its source in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`): 6.6 us to start, 0.6 us a
#: step over NVLink and 2.7 us across the network, a quarter of the bus bandwidth (flags
#: travel with every 8 bytes of data).
LOW_LATENCY = Protocol(6.6e-6, 0.6e-6, 2.7e-6, 0.25)

#: The collectives NCCL runs as rings with a choice of protocol.
RING_KINDS = frozenset({ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER})


def _groups(sizes: Mapping[str, int], axes: Sequence[str]) -> np.ndarray | None:
    """The device ids of every group of a collective over ``axes``, one group a row (None:
    not plain mesh axes)."""
    names = list(sizes)
    if not axes or any(a not in sizes for a in axes):
        return None
    ids = np.arange(math.prod(sizes.values())).reshape(tuple(sizes.values()))
    group = [names.index(a) for a in axes]
    rest = [i for i in range(len(names)) if i not in group]
    return ids.transpose(rest + group).reshape(-1, math.prod(sizes[a] for a in axes))


class Span(NamedTuple):
    """How a collective's groups lie on nodes: whether any group spans two, and how many
    nodes the first spans (the groups of plain mesh axes are alike)."""

    crosses: bool
    nodes: int


@functools.lru_cache(maxsize=4096)
def _span(sizes: tuple[tuple[str, int], ...], axes: tuple[str, ...], node_size: int) -> Span | None:
    """The :class:`Span` of a collective over ``axes`` of a mesh of ``sizes`` (its items);
    None: not plain mesh axes. A planner prices the same few groups many thousand times."""
    groups = _groups(dict(sizes), axes)
    if groups is None:
        return None
    nodes = groups // node_size
    crosses = bool((nodes.min(axis=1) != nodes.max(axis=1)).any())
    return Span(crosses, len(set(nodes[0].tolist())))


def span(sizes: Mapping[str, int], axes: Sequence[str], node_size: int) -> Span | None:
    """:func:`_span` of a mesh's sizes as a mapping."""
    return _span(tuple(sizes.items()), tuple(axes), node_size)


def crosses_nodes(sizes: Mapping[str, int], axes: Sequence[str], node_size: int) -> bool:
    """Whether a collective over ``axes`` of a mesh of ``sizes`` has a group spanning two
    nodes (an axis that is not a plain mesh axis crosses whenever the mesh does)."""
    if math.prod(sizes.values()) <= node_size:
        return False
    found = span(sizes, axes, node_size)
    return True if found is None else found.crosses


def held_share(
    hw: Hardware, sizes: Mapping[str, int], axes: Sequence[str], kind: str = ""
) -> float:
    """The share of a GPU's multiprocessors a collective of ``kind`` over ``axes`` of a mesh
    of ``sizes`` holds while it runs (NCCL's channels, one multiprocessor each):
    ``comm_sms_net`` of ``sms`` where a group spans nodes, ``comm_sms`` inside one; a
    mixture's all-to-all ``exchange_sms`` of ``sms`` where that is set (DeepEP's or
    HybridEP's own, across nodes or not); 0 on a TPU. Compute beside it runs on the rest
    (:func:`~shardscope._src.cost.compute.overlap_seconds`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> held_share(hardware("a100"), {"data": 8}, ("data",)) == 24 / 108
    True
    >>> held_share(hardware("a100"), {"data": 16}, ("data",)) == 16 / 108
    True
    >>> hybridep = hardware("h100", exchange_sms=32)
    >>> held_share(hybridep, {"expert": 16}, ("expert",), "all-to-all") == 32 / 132
    True
    """
    if kind == ALL_TO_ALL and hw.exchange_sms and hw.sms:
        return min(hw.exchange_sms, hw.sms) / hw.sms
    return _channels_share(hw, crosses_nodes(sizes, axes, hw.node_size))


def _channels_share(hw: Hardware, across: bool) -> float:
    """The share of ``hw``'s multiprocessors NCCL's channels hold: ``comm_sms_net`` of
    ``sms`` ``across`` nodes, ``comm_sms`` inside one; 0 on a TPU."""
    if not hw.sms:
        return 0.0
    return min(hw.comm_sms_net if across else hw.comm_sms, hw.sms) / hw.sms


def group_bandwidth(hw: Hardware, sizes: Mapping[str, int], axes: Sequence[str]) -> float:
    """Achieved bytes/s per device of a collective over ``axes`` of a mesh of ``sizes``."""
    inside = hw.link_bandwidth * hw.comm_fraction
    if math.prod(sizes.values()) <= hw.node_size:
        return inside
    found = span(sizes, axes, hw.node_size)
    if found is None:  # not plain mesh axes: across nodes, one member on each
        return min(hw.link_bandwidth, hw.cross_node_bandwidth) * hw.comm_fraction
    if found.nodes == 1:
        return inside
    per_node = math.prod(sizes[a] for a in axes) // found.nodes
    return min(hw.link_bandwidth, per_node * hw.cross_node_bandwidth) * hw.comm_fraction


def exchange_bandwidth(
    hw: Hardware,
    sizes: Mapping[str, int],
    axes: Sequence[str],
    *,
    once_per_node: tuple[int, ...] = (),
) -> float:
    """Achieved bytes/s per device of an all-to-all over ``axes`` of a mesh of ``sizes``.

    Inside a node, :func:`group_bandwidth`'s. Across ``k`` nodes with ``m`` members on each
    (of ``n``), each device sends ``(n - m) / (n - 1)`` of its bytes to devices on other nodes
    through its own network card, at ``cross_node_bandwidth``, and the rest over the links
    inside its node at ``link_bandwidth``, both at once: the slower share sets the time (both
    at ``comm_fraction``). A ring collective's ``m`` cards a group
    (:func:`group_bandwidth`) do not apply: every device's remote share is its own to send.
    DeepEP's internode dispatch and combine measure 43-58 GB/s a GPU at EP 16-64 on 50 GB/s
    cards (its source in :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
    A group whose axes are not plain mesh axes: one member on each node.

    ``once_per_node`` ``(experts, top_k)``: the all-to-all sends each token once to each
    device of the group holding any of its ``top_k`` of ``experts`` experts (``experts / n``
    a device, uniform routing; ``(experts, top_k, groups, chosen)`` within a group limit:
    :func:`~shardscope._src.model.moe.device_share`), as DeepEP's dispatch and combine do,
    and its internode kernels send a token across the network once to each node holding any
    of them, to the device of the sender's local rank there, which forwards it over NVLink
    to the node's devices that need it (deepseek-ai/DeepEP's README: "forwarding from RDMA to NVLink
    domain"). Of the remote share, the network then carries ``(k - 1) q / ((n - m) d)``
    (:func:`~shardscope._src.model.moe.device_share`: ``d`` a device's, ``q`` a node's of
    the ``k``), and the links inside the node the rest, the forwarding, beside the node's
    own share: 0.69 of the remote bytes for 256 experts, 8 a token, at EP 64 on 8 nodes (0.49
    within DeepSeek-V3's 4 of 8 groups, a node's experts each), 0.50 for Kimi K2 at EP 32 on
    4.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> exchange_bandwidth(h, {"expert": 8}, ("expert",)) / 1e9  # one node: NVLink
    360.0
    >>> round(exchange_bandwidth(h, {"expert": 64}, ("expert",)) / 1e9, 1)  # 56 of 63 away
    45.0
    >>> round(exchange_bandwidth(h, {"expert": 64}, ("expert",), once_per_node=(256, 8)) / 1e9,
    ...       1)  # 256 experts, 8 a token, once a node
    65.2
    >>> round(exchange_bandwidth(h, {"expert": 64}, ("expert",),
    ...                          once_per_node=(256, 8, 8, 4)) / 1e9, 1)  # from 4 of 8 groups
    91.3
    """
    inside = group_bandwidth(hw, sizes, axes)
    if math.prod(sizes.values()) <= hw.node_size:
        return inside
    found = span(sizes, axes, hw.node_size)
    if found is None:
        return min(hw.link_bandwidth, hw.cross_node_bandwidth) * hw.comm_fraction
    n, nodes = math.prod(sizes[a] for a in axes), found.nodes
    if nodes == 1:
        return inside
    m = n // nodes
    remote, local = (n - m) / (n - 1), (m - 1) / (n - 1)
    if once_per_node:
        experts, top_k, *limit = once_per_node
        group_limit = (limit[0], limit[1]) if limit else (1, 1)
        per_device = (n - m) * device_share(experts, n, top_k, group_limit)
        node = device_share(experts, nodes, top_k, group_limit)
        crossing = remote * (nodes - 1) * node / per_device
        local, remote = local + remote - crossing, crossing
    per_byte = max(remote / hw.cross_node_bandwidth, local / hw.link_bandwidth)
    return hw.comm_fraction / per_byte


def stage_bandwidth(hw: Hardware, stage_devices: int) -> float:
    """Achieved bytes/s per device of a pipeline's point-to-point transfers between stages
    of ``stage_devices`` devices each: across nodes where a stage fills a node or more, else
    over the links inside one.

    >>> from shardscope._src.targets.hardware import hardware
    >>> stage_bandwidth(hardware("h100"), 8) / 1e9, stage_bandwidth(hardware("h100"), 4) / 1e9
    (40.0, 360.0)
    """
    if stage_devices >= hw.node_size:
        return hw.cross_node_bandwidth * hw.comm_fraction
    return hw.link_bandwidth * hw.comm_fraction


def stage_held_share(hw: Hardware, stage_devices: int) -> float:
    """The share of a GPU's multiprocessors a pipeline's point-to-point transfer between
    stages of ``stage_devices`` devices each holds while it runs beside compute, across
    nodes or inside one as :func:`stage_bandwidth` reads it (:func:`held_share`'s channels);
    0 on a TPU.

    >>> from shardscope._src.targets.hardware import hardware
    >>> stage_held_share(hardware("h100"), 8) == 16 / 132
    True
    >>> stage_held_share(hardware("h100"), 4) == 32 / 132, stage_held_share(hardware("tpu-v5p"), 8)
    (True, 0.0)
    """
    return _channels_share(hw, stage_devices >= hw.node_size)


def alpha_beta_seconds(
    steps: int, latency_s: float, traffic_bytes: float, bandwidth: float
) -> float:
    """The alpha-beta model: ``steps`` message latencies and ``traffic_bytes`` at
    ``bandwidth`` bytes/s, ``steps x latency_s + traffic_bytes / bandwidth``.

    >>> alpha_beta_seconds(14, 5e-6, 7e9, 350e9)
    0.02007
    """
    return steps * latency_s + traffic_bytes / bandwidth


def collective_seconds(
    hw: Hardware,
    sizes: Mapping[str, int],
    kind: str,
    axes: Sequence[str],
    group_size: int,
    traffic_bytes: float,
    count: int = 1,
    *,
    once_per_node: tuple[int, ...] = (),
) -> float:
    """Alpha-beta seconds of ``count`` executions of a collective that send
    ``traffic_bytes`` per device in all: ``count x steps x latency + traffic / bandwidth``, or
    on a GPU, for a ring collective, NCCL's low-latency protocol's time where it is faster
    (:data:`LOW_LATENCY`). ``once_per_node``: an all-to-all's routing, priced by
    :func:`exchange_bandwidth`.

    >>> from shardscope._src.targets.hardware import hardware
    >>> round(collective_seconds(hardware("h100"), {"model": 8}, "all-reduce", ("model",), 8,
    ...                          7e9) * 1e3, 3)
    19.514
    >>> round(collective_seconds(hardware("h100"), {"model": 8}, "all-reduce", ("model",), 8,
    ...                          14 * 16384 / 8) * 1e6, 2)
    15.32
    """
    if traffic_bytes <= 0 or group_size <= 1:
        return 0.0
    steps = latency_steps(kind, group_size)
    if kind in EXCHANGES:
        bandwidth = exchange_bandwidth(hw, sizes, axes, once_per_node=once_per_node)
    else:
        bandwidth = group_bandwidth(hw, sizes, axes)
    seconds = alpha_beta_seconds(count * steps, hw.latency_s, traffic_bytes, bandwidth)
    if kind not in RING_KINDS:
        return seconds
    family = specs.family(hw.name)
    nodes = _nodes_spanned(hw, sizes, axes)
    if family is Family.GPU:
        low = _low_latency_seconds(kind, steps, nodes, bandwidth, traffic_bytes, count)
        seconds = min(seconds, low)
    elif family is Family.TPU and nodes == 1:
        seconds = _ici_seconds(kind, group_size, hw.latency_s, bandwidth, traffic_bytes, count)
    return seconds


#: A serving engine's custom all-reduce on H100s inside a node, one execution by the devices
#: of its group and the bytes each holds: ``{group size: ((bytes, seconds), ...)}``, measured
#: from 512 B to 1 MiB (its source in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
H100_ENGINE_ALL_REDUCE: dict[int, tuple[tuple[int, float], ...]] = {
    2: ((512, 3.7e-6), (4096, 3.9e-6), (32768, 4.5e-6), (262144, 7.9e-6), (524288, 12.5e-6),
        (1048576, 19.9e-6)),
    4: ((512, 4.8e-6), (4096, 3.7e-6), (32768, 4.8e-6), (262144, 13.9e-6), (524288, 20.2e-6),
        (1048576, 31.1e-6)),
    8: ((512, 5.9e-6), (4096, 5.7e-6), (32768, 7.8e-6), (262144, 16.7e-6), (524288, 22.1e-6),
        (1048576, 33.8e-6)),
}  # fmt: skip


def engine_all_reduce_seconds(
    hw: Hardware, sizes: Mapping[str, int], axes: Sequence[str], nbytes: float, nccl_s: float
) -> float:
    """One execution of a serving engine's all-reduce of ``nbytes`` a device over ``axes``
    of a mesh of ``sizes`` on ``hw``, where NCCL's takes ``nccl_s``: inside one node of H100s,
    over a group the engines' kernels were measured on (:data:`H100_ENGINE_ALL_REDUCE`: 2, 4
    or 8 devices) and within the measured sizes, the measured time (the line between the two
    measured sizes either side; the least measured size's below it) where it is faster than
    NCCL's; else NCCL's.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h100, model = hardware("h100"), {"model": 8}
    >>> engine_all_reduce_seconds(h100, model, ("model",), 32768, 15e-6)  # 8 GPUs, 32 KiB
    7.8e-06
    >>> round(engine_all_reduce_seconds(h100, model, ("model",), 65536, 15e-6) * 1e6, 2)
    9.07
    >>> engine_all_reduce_seconds(h100, model, ("model",), 2 * 2**20, 60e-6)  # not measured
    6e-05
    >>> engine_all_reduce_seconds(hardware("a100"), model, ("model",), 32768, 15e-6)
    1.5e-05
    """
    if not axes or any(a not in sizes for a in axes):  # a sub-axis: no measured group
        return nccl_s
    table = H100_ENGINE_ALL_REDUCE.get(math.prod(sizes[a] for a in axes))
    if (
        table is None
        or not hw.name.startswith("h100")
        or nbytes > table[-1][0]
        or _nodes_spanned(hw, sizes, axes) > 1
    ):
        return nccl_s
    measured = float(np.interp(nbytes, [b for b, _ in table], [s for _, s in table]))
    return min(measured, nccl_s)


def ici_hops(kind: str, group_size: int) -> int:
    """The hops of a ring collective over ``group_size`` chips of a TPU slice, which sends
    both ways round its ring at once: ``group_size // 2`` for an all-gather or a
    reduce-scatter, twice that for an all-reduce (one of each).

    >>> [ici_hops("all-gather", n) for n in (2, 4, 8, 16)], ici_hops("all-reduce", 8)
    ([1, 2, 4, 8], 8)
    """
    hops = group_size // 2
    return 2 * hops if kind == ALL_REDUCE else hops


def _ici_seconds(
    kind: str,
    group_size: int,
    hop_s: float,
    bandwidth: float,
    traffic_bytes: float,
    count: int,
) -> float:
    """``count`` executions of a ring collective over ``group_size`` chips of one TPU slice:
    each hop takes the longer of its fixed cost ``hop_s`` and its share of the traffic at
    ``bandwidth``, so an execution takes the longer of :func:`ici_hops` hops' latency and
    its traffic's time (the scaling book's ICI model; source in
    :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).

    >>> round(_ici_seconds("all-gather", 8, 1e-6, 72e9, 7 * 1024, 1) * 1e6, 2)  # latency
    4.0
    >>> round(_ici_seconds("all-gather", 8, 1e-6, 72e9, 7 * 2**30, 1) * 1e3, 2)  # bandwidth
    104.39
    """
    hops = ici_hops(kind, group_size)
    return count * max(hops * hop_s, traffic_bytes / count / bandwidth)


def _nodes_spanned(hw: Hardware, sizes: Mapping[str, int], axes: Sequence[str]) -> int:
    """How many nodes one group of a collective over ``axes`` spans (a group whose axes are
    not plain mesh axes: one member on each node, as :func:`group_bandwidth` prices it)."""
    if math.prod(sizes.values()) <= hw.node_size:
        return 1
    found = span(sizes, axes, hw.node_size)
    if found is None:
        return max(1, math.prod(sizes[a] for a in axes if a in sizes))
    return found.nodes


def _low_latency_seconds(
    kind: str, steps: int, nodes: int, bandwidth: float, traffic_bytes: float, count: int
) -> float:
    """``count`` executions of a ring collective of ``steps`` steps over ``nodes`` nodes in
    NCCL's :data:`LOW_LATENCY` protocol: each its start and a latency a step (the steps that
    cross nodes at the network's: two a node for an all-reduce, one a node boundary for an
    all-gather or a reduce-scatter, as NCCL's tuning model counts them), and all of
    ``traffic_bytes`` at its share of the group's ``bandwidth``.

    >>> round(_low_latency_seconds("all-reduce", 14, 1, 360e9, 0, 1) * 1e6, 2)
    15.0
    """
    ll = LOW_LATENCY
    across = 0 if nodes == 1 else (2 * nodes if kind == ALL_REDUCE else nodes - 1)
    across = min(across, steps)
    one = ll.start_s + (steps - across) * ll.hop_s + across * ll.net_hop_s
    return alpha_beta_seconds(count, one, traffic_bytes, bandwidth * ll.bandwidth_share)


def alpha_beta_time(
    kind: str,
    payload_bytes: int,
    group_size: int,
    *,
    bandwidth_bytes_per_s: float,
    alpha_s: float = 0.0,
) -> float:
    """Seconds for one execution under the alpha-beta model: ``steps*alpha + traffic/B``
    (:func:`alpha_beta_seconds` of the collective's bandwidth-optimal steps and traffic).

    ``bandwidth_bytes_per_s`` is one device's egress bandwidth ``B``; ``alpha_s`` the
    per-message latency. For all-reduce this is ``2(n-1)a + 2(n-1)S/(nB)``; for all-to-all on
    a switch ``(n-1)a + (n-1)S/(n**2 B)``.

    >>> alpha_beta_time("all-gather", 8 * 10**9, 8, bandwidth_bytes_per_s=10**9)
    7.0
    """
    if not bandwidth_bytes_per_s > 0:
        raise ShardscopeError(
            f"bandwidth_bytes_per_s must be positive, got {bandwidth_bytes_per_s!r}"
        )
    if not alpha_s >= 0:
        raise ShardscopeError(f"alpha_s must be non-negative, got {alpha_s!r}")
    sent = traffic_bytes(kind, payload_bytes, group_size)
    return alpha_beta_seconds(latency_steps(kind, group_size), alpha_s, sent, bandwidth_bytes_per_s)
