"""Compile-only GPU and TPU devices, made on a machine that has neither.

JAX's CUDA plugin (given a description of the GPU) and libtpu give devices that programs can
be compiled for but not run on, laid out as a :mod:`~shardscope._src.targets.topology`. They
are made once per topology in a process, after the deviceless set-up
(:func:`~shardscope._src.targets.plugins.prepare_targets`), and this module remembers which
target each was made for: what an audit reads to say which compiler built a program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardscope._src.base.errors import TargetError
from shardscope._src.base.startup import module_present, quiet_plugin_start
from shardscope._src.targets.plugins import prepare_targets
from shardscope._src.targets.specs import GPU_SPECS, Family, Target, get_target
from shardscope._src.targets.topology import GpuTopology, Topology, topology

if TYPE_CHECKING:
    from jax import Device


def compiler_installed(target: str | Target) -> bool:
    """Whether the target's compiler is installed (always, for ``cpu``)."""
    return not _missing(get_target(target))


def require_compiler(target: str | Target, devices: int | None = None) -> Target:
    """The target, once its compiler is installed (:class:`TargetError` naming the extra that
    installs it otherwise) and, given ``devices``, once it is built with that many
    (:class:`TargetError` naming the counts it is built with otherwise)."""
    t = get_target(target)
    missing = _missing(t)
    if missing:
        raise TargetError(
            f"the {t.name} target compiles with {' and '.join(missing)}, which is not "
            f"installed; install it with: pip install 'shardscope[{t.extra}]'"
        )
    if devices is not None and t.family != Family.CPU:
        topology(t, devices)
    return t


def _missing(t: Target) -> list[str]:
    if t.family == Family.GPU:
        return [
            what
            for what, module in (
                ("the JAX CUDA plugin", "jax_plugins.xla_cuda12"),
                ("the CUDA compiler (ptxas)", "nvidia.cuda_nvcc"),
            )
            if not module_present(module)
        ]
    if t.family == Family.TPU:
        return [] if module_present("libtpu") else ["libtpu"]
    return []


def _make_devices(topo: Topology, memory_bytes: int | None = None) -> tuple[Device, ...]:
    """New compile-only devices of ``topo`` from the target's plugin; a GPU's compiler told
    its programs may hold ``memory_bytes`` (default: the device's memory)."""
    prepare_targets()
    from jax.experimental import topologies

    t = get_target(topo.target)
    try:
        with quiet_plugin_start():
            if isinstance(topo, GpuTopology):
                preset = t.preset
                assert preset is not None  # every GPU target has its hardware preset
                desc = topologies.get_topology_desc(
                    platform="cuda",
                    target_config=GPU_SPECS[t.name].target_config(
                        preset.memory_bytes if memory_bytes is None else memory_bytes
                    ),
                    topology=topo.name,
                )
            else:
                desc = topologies.get_topology_desc(
                    platform="tpu",
                    topology_name=topo.name,
                    chip_config_name=topo.chip_config,
                    chips_per_host_bounds=topo.chips_per_host,
                    num_slices=topo.slices,
                    wrap=topo.wrap,
                )
    except NotImplementedError as e:  # the plugin did not register in this process
        raise TargetError(
            f"JAX has no {t.family.upper()} compiler registered in this process ({e}); "
            f"reinstall it for the installed JAX: pip install 'shardscope[{t.extra}]'"
        ) from None
    devices = tuple(desc.devices)
    if len(devices) != topo.devices:
        raise TargetError(
            f"{t.name}: the {topo.name} topology gave {len(devices)} devices, not {topo.devices}"
        )
    return devices


class CompileOnlyDevices:
    """The compile-only devices made in this process, and the target each was made for.

    Each topology's devices are made once and kept (a GPU's once for each memory its
    compiler is told): the plugins give new objects on every call, and a mesh, a compiled
    program and the target's name must agree on them. The
    target of a device is looked up by the device itself (devices hash by identity), which
    this registry keeps alive, so a key is never reused by another object.
    """

    def __init__(self) -> None:
        self._made: dict[tuple[Topology, int | None], tuple[Device, ...]] = {}
        self._target: dict[Device, str] = {}

    def of(self, topo: Topology, memory_bytes: int | None = None) -> tuple[Device, ...]:
        """The devices of ``topo`` (told ``memory_bytes``), made on the first call."""
        key = (topo, memory_bytes)
        found = self._made.get(key)
        if found is None:
            found = _make_devices(topo, memory_bytes)
            self._made[key] = found
            self._target.update(dict.fromkeys(found, topo.target))
        return found

    def target_of(self, device: Device) -> str | None:
        """The target name ``device`` was made for here, or None for any other device."""
        return self._target.get(device)


#: The one registry of this process.
_MADE = CompileOnlyDevices()


def target_devices(
    target: str | Target, devices: int, *, memory_bytes: float | None = None
) -> list[Device]:
    """``devices`` compile-only devices of a GPU or TPU target, laid out as the vendor builds
    them (:func:`~shardscope._src.targets.topology.topology`). The same objects on every
    call with the same arguments.

    ``memory_bytes``: how much of a GPU's memory its programs may hold, which XLA:GPU's
    scheduler and rematerialization keep them under (default: the device's memory; less
    when something outside the program lives there, such as optimizer state added to the
    step's). The TPU compiler takes its chip's memory; it has no such setting."""
    t = require_compiler(target)
    if t.family == Family.CPU:
        raise TargetError(
            "the cpu target's devices are simulated: use shardscope.use_cpu_devices(n) and "
            "jax.devices('cpu')"
        )
    told: int | None = None
    if memory_bytes is not None:
        if t.family != Family.GPU:
            raise TargetError(
                f"memory_bytes={memory_bytes!r}: the {t.name} compiler takes its chip's memory; "
                "only a GPU target's can be set, leave it None"
            )
        if (
            isinstance(memory_bytes, bool)
            or not isinstance(memory_bytes, int | float)
            or not (memory_bytes > 0)
        ):
            raise TargetError(f"memory_bytes={memory_bytes!r}: must be a positive number of bytes")
        told = int(memory_bytes)
    return list(_MADE.of(topology(t, devices), told))


def target_of_device(device: Device) -> str | None:
    """The target name a compile-only device was made for here, or None."""
    return _MADE.target_of(device)
