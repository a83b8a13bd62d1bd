"""How ``n`` devices of a target are laid out: nodes of 8 GPUs, or TPU slices.

The vendors build GPU clusters of nodes (NVLink inside, the network between) and TPU pods of
slices (ICI inside, the data-center network between); a topology is one such layout, the
description JAX's CUDA plugin or libtpu makes compile-only devices from.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope._src.base.errors import TargetError, is_int
from shardscope._src.targets.specs import (
    GPUS_PER_NODE,
    TPU_GENERATIONS,
    Family,
    Target,
    TpuSlice,
    get_target,
)


@dataclass(frozen=True)
class GpuTopology:
    """``devices`` GPUs in ``nodes`` nodes of ``gpus_per_node`` (one node may be partial)."""

    target: str
    devices: int
    nodes: int
    gpus_per_node: int

    @property
    def name(self) -> str:
        """``1x8x8``: slices x nodes x GPUs per node, as JAX's CUDA plugin takes it."""
        return f"1x{self.nodes}x{self.gpus_per_node}"

    def describe(self) -> str:
        gpus = f"{self.devices} GPU" + ("s" if self.devices > 1 else "")
        if self.nodes > 1:
            return f"{gpus} in {self.nodes} nodes of {self.gpus_per_node}"
        return f"{gpus} in one node"


@dataclass(frozen=True)
class TpuTopology:
    """``devices`` TPU chips in ``slices`` slices of one shape."""

    target: str
    devices: int
    slice: TpuSlice
    slices: int
    chip_config: str  # "megacore" (one device per chip over both cores) or "default"

    @property
    def name(self) -> str:
        """``v5:4x4x4``: one slice, as libtpu names it."""
        return self.slice.topology

    @property
    def nodes(self) -> int:
        """The slices: the groups joined by the slower network."""
        return self.slices

    @property
    def chips_per_host(self) -> tuple[int, int, int]:
        return self.slice.chips_per_host

    @property
    def wrap(self) -> tuple[bool, bool, bool]:
        return self.slice.wrap

    def describe(self) -> str:
        chips = f"{self.devices} chip" + ("s" if self.devices > 1 else "")
        if self.slices > 1:
            return f"{self.slices} slices of {self.slice.dims} ({chips})"
        return f"one {self.slice.dims} slice ({chips})"


#: The layout of a GPU or TPU target's devices.
Topology = GpuTopology | TpuTopology


def topology(target: str | Target, devices: int) -> Topology:
    """The node or slice layout a vendor builds ``devices`` devices of ``target`` as.

    Raises :class:`TargetError` for a count the target cannot be built with, naming those
    it can.

    >>> topology("h100", 64).describe()
    '64 GPUs in 8 nodes of 8'
    """
    t = get_target(target)
    if not is_int(devices, 1):
        raise TargetError(f"device count must be a positive integer, got {devices!r}")
    if t.family == Family.GPU:
        if devices <= GPUS_PER_NODE:
            return GpuTopology(t.name, devices, 1, devices)
        if devices % GPUS_PER_NODE == 0:
            return GpuTopology(t.name, devices, devices // GPUS_PER_NODE, GPUS_PER_NODE)
    elif t.family == Family.TPU:
        gen = TPU_GENERATIONS[t.name]
        largest = max(gen.slices)
        n_slices = 1
        one = gen.slices.get(devices)
        if one is None and gen.multislice and devices % largest == 0:
            n_slices, one = devices // largest, gen.slices[largest]
        if one is not None:
            return TpuTopology(t.name, devices, one, n_slices, gen.chip_config)
    else:
        raise TargetError(
            "the cpu target has no topology: its devices are simulated (shardscope.use_cpu_devices)"
        )
    raise TargetError(
        f"{t.name} cannot be built with {devices} devices; it comes as {t.device_counts()}"
    )
