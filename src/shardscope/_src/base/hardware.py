"""Hardware presets for time and memory estimates, from vendor datasheets and the scaling book.

Every number is an estimate input a user can override; ``source`` says where it comes from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from shardscope._src.base.errors import ShardscopeError

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """One accelerator, as the planner's alpha-beta and roofline estimates see it.

    Attributes:
      name: preset name (``"h100"``).
      peak_flops: dense bf16 FLOP/s per device.
      memory_bytes: device memory (HBM) in bytes.
      link_bandwidth: bytes/s one device can send in a collective over one mesh axis (the
        ``B`` of the alpha-beta model).
      latency_s: per-step latency of a collective (the ``alpha``).
      cross_node_bandwidth: bytes/s per device once a collective leaves a node or slice.
      node_size: devices in one node (GPU) or one slice (TPU) with the fast links.
      source: where the numbers come from.
    """

    name: str
    peak_flops: float
    memory_bytes: float
    link_bandwidth: float
    latency_s: float
    cross_node_bandwidth: float
    node_size: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_NVLINK_SRC = (
    "NVIDIA: NVLink 4 450 GB/s per direction, ~989 TFLOP/s dense bf16; NDR 8x400 Gb/s per node"
)

PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            "a100",
            312e12,
            80 * GB,
            300 * GB,
            5e-6,
            25 * GB,
            8,
            "NVIDIA A100 datasheet: NVLink 3 300 GB/s per direction, 312 TFLOP/s dense bf16, "
            "80 GB; HDR 200 Gb/s per GPU across nodes",
        ),
        Hardware("h100", 989e12, 80 * GB, 450 * GB, 5e-6, 50 * GB, 8, _NVLINK_SRC),
        Hardware("h200", 989e12, 141 * GB, 450 * GB, 5e-6, 50 * GB, 8, _NVLINK_SRC),
        Hardware(
            "b200",
            2250e12,
            180 * GB,
            900 * GB,
            5e-6,
            50 * GB,
            8,
            "NVIDIA HGX B200 datasheet: NVLink 5 900 GB/s, dense bf16, HBM",
        ),
        # TPU ICI: a ring along one torus axis uses both directions of a link.
        Hardware(
            "tpu-v5e",
            197e12,
            16 * GIB,
            2 * 4.5e10,
            1e-6,
            6.25e9,
            256,
            "scaling book part 2: 4.5e10 B/s per ICI link each way, 2-D 16x16 torus, 197 TFLOP/s",
        ),
        Hardware(
            "tpu-v5p",
            459e12,
            95 * GIB,
            2 * 9e10,
            1e-6,
            6.25e9,
            8960,
            "scaling book part 2: 9e10 B/s per ICI link each way, 3-D torus, DCN 6.25e9 B/s",
        ),
        Hardware(
            "tpu-v6e",
            918e12,
            32 * GIB,
            2 * 9e10,
            1e-6,
            12.5e9,
            256,
            "scaling book part 2: 9e10 B/s per ICI link each way, 2-D torus, DCN 12.5e9 B/s",
        ),
    )
}


def hardware(name: str | Hardware, **overrides: Any) -> Hardware:
    """A preset by name (``a100``, ``h100``, ``h200``, ``b200``, ``tpu-v5e``, ``tpu-v5p``,
    ``tpu-v6e``), with any field overridden, e.g. ``hardware("h100", link_bandwidth=370e9)``.

    >>> hardware("h100", memory_bytes=40e9).memory_bytes
    40000000000.0
    """
    base = name if isinstance(name, Hardware) else PRESETS.get(str(name).lower())
    if base is None:
        raise ShardscopeError(
            f"unknown hardware preset {name!r}; choose one of {', '.join(PRESETS)}"
        )
    known = {f.name for f in fields(Hardware)} - {"name", "source"}
    for key, value in overrides.items():
        if key not in known:
            raise ShardscopeError(
                f"unknown hardware setting {key!r}; settable: {', '.join(sorted(known))}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ShardscopeError(f"hardware setting {key}={value!r} must be a positive number")
    if not overrides:
        return base
    return replace(
        base,
        **overrides,
        source=base.source
        + " (overridden: "
        + ", ".join(f"{k}={v:g}" for k, v in overrides.items())
        + ")",
    )
