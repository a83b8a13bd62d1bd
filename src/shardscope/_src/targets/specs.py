"""Compile targets: a hardware preset joined to the compiler that builds programs for it.

``cpu`` is the CPU backend over simulated devices. The GPU and TPU targets are the real XLA
GPU and TPU compilers run deviceless: JAX's CUDA plugin (given a description of the GPU) and
libtpu give compile-only devices, and ``jax.jit(f).lower(...).compile()`` over a mesh of them
produces the program the accelerator would run, with its own buffer assignment. Nothing here
opens an accelerator.

A GPU description is written from the vendor's datasheet and architecture whitepaper (the
numbers below); the device memory is the hardware preset's, so the compiler and the planner
judge fit against the same number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from shardscope._src.base.errors import TargetError
from shardscope._src.base.records import Record
from shardscope._src.targets.capabilities import BY_PLATFORM, Capabilities
from shardscope._src.targets.hardware import PRESETS, Hardware


class Family(StrEnum):
    """The compiler family a target's programs are built by (``Target.family``)."""

    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"


# The families by their short names, as the tables below write them.
CPU, GPU, TPU = Family.CPU, Family.GPU, Family.TPU
GPU_EXTRA, TPU_EXTRA = "gpu-compile", "tpu-compile"
GPUS_PER_NODE = 8
#: The share of the device memory XLA:GPU takes as its memory limit's base when no client
#: allocator says how much it holds (``gpu_compiler.cc``, ``GetSchedulerMemoryLimit``).
XLA_GPU_UNTOLD_SHARE = 0.8


@dataclass(frozen=True)
class GpuSpec:
    """What XLA's GPU compiler needs to know about one GPU (its ``GpuDeviceInfoProto``)."""

    description: str  # the name the driver reports
    compute_capability: tuple[int, int]
    sm_count: int  # the hardware preset's ``sms``
    fp32_lanes_per_sm: int
    clock_ghz: float  # boost clock
    memory_bandwidth: float  # bytes/s
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    source: str

    def target_config(self, memory_bytes: float) -> str:
        """The ``GpuTargetConfigProto`` text JAX's CUDA plugin compiles against, for a
        program that may hold ``memory_bytes`` (the device's memory, as the plan's fit
        test assumes).

        XLA:GPU sizes its scheduler's and its rematerialization's memory limit from what the
        client's allocator holds, and without a client (compiling deviceless) from 80% of the
        device memory it is told (``gpu_compiler.cc``, ``GetSchedulerMemoryLimit``: then
        less the program's arguments and outputs, times its 95% slop factor). Told
        ``memory_bytes / 0.8``, its limit is what a client holding the whole device would
        give: without it, a program that fits the device above 76% of its memory was
        rematerialized (matmuls computed again) to come under it."""
        major, minor = self.compute_capability
        return "\n".join(
            [
                "gpu_device_info {",
                f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
                f"  core_count: {self.sm_count}",
                f"  fpus_per_core: {self.fp32_lanes_per_sm}",
                f"  clock_rate_ghz: {self.clock_ghz}",
                f"  device_memory_size: {int(memory_bytes / XLA_GPU_UNTOLD_SHARE)}",
                f"  memory_bandwidth: {int(self.memory_bandwidth)}",
                f"  l2_cache_size: {self.l2_cache_bytes}",
                # Limits common to every CUDA GPU from compute capability 8.0 on.
                "  threads_per_warp: 32",
                "  threads_per_block_limit: 1024",
                "  threads_per_core_limit: 2048",
                "  block_dim_limit_x: 2147483647",
                "  block_dim_limit_y: 65535",
                "  block_dim_limit_z: 65535",
                "  registers_per_core_limit: 65536",
                "  registers_per_block_limit: 65536",
                "  shared_memory_per_block: 49152",
                f"  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}",
                f"  shared_memory_per_core: {self.shared_memory_per_sm}",
                "}",
                'platform_name: "CUDA"',
                # The cuDNN the JAX CUDA plugin is built against (9.8 or later).
                "dnn_version_info { major: 9 minor: 8 }",
                f'device_description_str: "{self.description}"',
                "",
            ]
        )


KIB, MIB = 2**10, 2**20
_AMPERE = "NVIDIA A100 datasheet and Ampere (GA100) architecture whitepaper"
_HOPPER = "NVIDIA H100 datasheet and Hopper (GH100) architecture whitepaper"

GPU_SPECS: dict[str, GpuSpec] = {
    "a100": GpuSpec(
        "NVIDIA A100-SXM4-80GB",
        (8, 0),
        PRESETS["a100"].sms,
        64,
        1.41,
        2.039e12,
        40 * MIB,
        164 * KIB,
        163 * KIB,
        _AMPERE + " (SXM4 80GB: 2,039 GB/s, 1,410 MHz boost)",
    ),
    "h100": GpuSpec(
        "NVIDIA H100 80GB HBM3",
        (9, 0),
        PRESETS["h100"].sms,
        128,
        1.98,
        3.35e12,
        50 * MIB,
        228 * KIB,
        227 * KIB,
        _HOPPER + " (SXM5: 3.35 TB/s, 1,980 MHz boost)",
    ),
    "h200": GpuSpec(
        "NVIDIA H200",
        (9, 0),
        PRESETS["h200"].sms,
        128,
        1.98,
        4.8e12,
        50 * MIB,
        228 * KIB,
        227 * KIB,
        "NVIDIA H200 datasheet (SXM: 141 GB HBM3e at 4.8 TB/s) on the Hopper GH100 of the "
        "H100 whitepaper",
    ),
    "b200": GpuSpec(
        "NVIDIA B200",
        (10, 0),
        PRESETS["b200"].sms,
        128,
        1.965,
        8e12,
        126 * MIB,
        228 * KIB,
        227 * KIB,
        "NVIDIA HGX B200 datasheet (8 TB/s per GPU) and Blackwell architecture technical brief",
    ),
}


@dataclass(frozen=True)
class TpuSlice:
    """One TPU slice shape (chips along each torus axis) and how its hosts are cut."""

    prefix: str  # libtpu's topology prefix: "v5e", "v5", "v6e"
    shape: tuple[int, ...]
    chips_per_host: tuple[int, int, int]
    wrap: tuple[bool, bool, bool]

    @property
    def dims(self) -> str:
        """``4x4x4``."""
        return "x".join(str(n) for n in self.shape)

    @property
    def topology(self) -> str:
        """The slice as libtpu names it: ``v5:4x4x4``."""
        return f"{self.prefix}:{self.dims}"


@dataclass(frozen=True)
class TpuGeneration:
    prefix: str  # libtpu's topology prefix: "v5e", "v5", "v6e"
    chip_config: str  # "megacore" (one device per chip over both cores) or "default"
    slices: dict[int, TpuSlice]  # chips -> slice shape, as the vendor sells them
    multislice: bool  # whether several largest slices may be joined over the network


def _slices_2d(prefix: str) -> dict[int, TpuSlice]:
    # Cloud TPU v5e / v6e slice shapes; a slice wraps a dimension only once it spans 16 chips.
    shapes = {
        1: (1, 1),
        4: (2, 2),
        8: (2, 4),
        16: (4, 4),
        32: (4, 8),
        64: (8, 8),
        128: (8, 16),
        256: (16, 16),
    }
    out = {}
    for n, (a, b) in shapes.items():
        host = (1, 1, 1) if n == 1 else (2, 2, 1)
        out[n] = TpuSlice(prefix, (a, b), host, (a == 16, b == 16, False))
    return out


def _slices_v5p() -> dict[int, TpuSlice]:
    # Cloud TPU v5p: a 3-D torus, wrapped in every dimension from a full 4x4x4 cube on.
    shapes = [
        (2, 2, 1),
        (2, 2, 2),
        (2, 2, 4),
        (2, 4, 4),
        (4, 4, 4),
        (4, 4, 8),
        (4, 8, 8),
        (8, 8, 8),
        (8, 8, 16),
        (8, 16, 16),
        (16, 16, 16),
    ]
    out = {}
    for s in shapes:
        wrap = min(s) >= 4
        out[math.prod(s)] = TpuSlice("v5", s, (2, 2, 1), (wrap,) * 3)
    return out


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "tpu-v5e": TpuGeneration("v5e", "default", _slices_2d("v5e"), True),
    "tpu-v6e": TpuGeneration("v6e", "default", _slices_2d("v6e"), True),
    "tpu-v5p": TpuGeneration("v5", "megacore", _slices_v5p(), False),
}


@dataclass(frozen=True)
class Target(Record):
    """A hardware preset and the compiler that builds programs for it.

    Attributes:
      name: ``"cpu"``, ``"h100"``, ``"tpu-v5p"``...
      family: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (the backend its programs are compiled by).
      hardware: the preset the planner's estimates use (None for ``cpu``).
      extra: the package extra that installs its compiler (None for ``cpu``).
      description: what the devices are, in words.
      capabilities: what its compiler does that the formulas do not assume.
    """

    name: str
    family: Family
    hardware: str | None
    extra: str | None
    description: str
    capabilities: Capabilities = field(repr=False, compare=False)

    @property
    def preset(self) -> Hardware | None:
        return PRESETS.get(self.hardware) if self.hardware else None

    @property
    def is_accelerator(self) -> bool:
        """Whether its compiler is a GPU's or a TPU's (run deviceless): its buffer assignment
        and collectives are what those devices would run, where ``cpu``'s are the CPU
        backend's over simulated devices."""
        return self.family != CPU

    def device_counts(self) -> str:
        """The device counts this target can be built with, in words."""
        if self.family == GPU:
            return (
                f"1 to {GPUS_PER_NODE} (one node), or a multiple of {GPUS_PER_NODE} "
                f"({GPUS_PER_NODE} GPUs per node)"
            )
        if self.family == TPU:
            gen = TPU_GENERATIONS[self.name]
            counts = ", ".join(str(n) for n in gen.slices)
            text = f"{counts} chips (one slice)"
            if gen.multislice:
                text += f", or a multiple of {max(gen.slices)} (several slices)"
            return text
        return "1 to 2048 (simulated CPU devices)"


def _targets() -> dict[str, Target]:
    cpu = "the CPU backend over simulated devices"
    out = {"cpu": Target("cpu", CPU, None, None, cpu, BY_PLATFORM[CPU])}
    for name, spec in GPU_SPECS.items():
        gpu = spec.description + " (XLA GPU compiler)"
        out[name] = Target(name, GPU, name, GPU_EXTRA, gpu, BY_PLATFORM[GPU])
    for name, label in (("tpu-v5e", "TPU v5e"), ("tpu-v5p", "TPU v5p"), ("tpu-v6e", "TPU v6e")):
        tpu = label + " (XLA TPU compiler, libtpu)"
        out[name] = Target(name, TPU, name, TPU_EXTRA, tpu, BY_PLATFORM[TPU])
    return out


#: Every target by name.
TARGETS: dict[str, Target] = _targets()
#: The CPU backend over simulated devices: what every plan is screened on.
CPU_TARGET: Target = TARGETS["cpu"]


def family(name: str) -> Family | None:
    """The device family of the compile target called ``name`` (None: no such target, as
    for a hardware preset made up by hand).

    >>> family("h100"), family("tpu-v5e"), family("mine")
    (<Family.GPU: 'gpu'>, <Family.TPU: 'tpu'>, None)
    """
    target = TARGETS.get(name)
    return None if target is None else target.family


def get_target(name: str | Target) -> Target:
    """A target by name (``cpu``, ``a100``, ``h100``, ``h200``, ``b200``, ``tpu-v5e``,
    ``tpu-v5p``, ``tpu-v6e``)."""
    if isinstance(name, Target):
        return name
    found = TARGETS.get(str(name).strip().lower())
    if found is None:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return found
