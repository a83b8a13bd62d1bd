"""JAX's start in this process: its import and its plugins' registration, made quietly, and
which accelerator chips this host has.

JAX's CUDA plugin and libtpu are optional installs (the ``gpu-compile`` and ``tpu-compile``
extras) that give compile-only devices on a host without the chips
(:mod:`shardscope._src.targets.plugins`). On such a host, their C++ prints harmless start-up
lines ("Could not find cuda drivers on your machine", absl's "before absl::InitializeLog()"
notice) whenever JAX loads them; :func:`quiet_plugin_start` drops those lines and passes on
everything else. Nothing here sets an environment variable.

This module is the one that imports JAX inside functions: it loads before JAX does.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pkgutil
import sys
from importlib.metadata import entry_points

from shardscope._src.base.stderr import capture_stderr

#: Lines the accelerator plugins print on every start on a host without the accelerator.
_START_UP_NOISE = (
    "Could not find cuda drivers on your machine",
    "All log messages before absl::InitializeLog() is called are written to STDERR",
)

#: JAX's plugin modules whose chips :func:`accelerator_present` can look for.
_KNOWN_PLUGINS = frozenset({"jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"})


def has_nvidia_gpu() -> bool:
    """Whether this host has an NVIDIA GPU (its driver, or a device file of one)."""
    return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


def has_tpu_chips() -> bool:
    """Whether this host has TPU chips (Google's PCI vendor id: the check libtpu starts from,
    or an accelerator device file)."""
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as f:
                if f.read().strip() == "0x1ae0":
                    return True
        except OSError:
            continue
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def _plugin_modules() -> set[str]:
    """JAX's plugin modules installed here, found as JAX finds them (the ``jax_plugins``
    namespace and the ``jax_plugins`` entry points), without loading any."""
    found = {ep.value for ep in entry_points(group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations is not None:
        found |= {
            f"jax_plugins.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations)
        }
    return found


def accelerator_present() -> bool:
    """Whether JAX may find an accelerator on this host: an NVIDIA GPU, TPU chips, or a plugin
    whose chips this module cannot look for (ROCm, Metal, ...), which counts as present."""
    return has_nvidia_gpu() or has_tpu_chips() or bool(_plugin_modules() - _KNOWN_PLUGINS)


def quiet_plugin_start() -> contextlib.AbstractContextManager[list[str]]:
    """Drops the plugins' known start-up lines from what C++ writes to stderr meanwhile."""
    return capture_stderr(drop=_START_UP_NOISE)


def module_present(name: str) -> bool:
    """Whether the module ``name`` can be imported (found, not loaded)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_jax() -> None:
    """Imports JAX; where the CUDA plugin is installed, with its start-up lines dropped.

    ``shardscope._src`` calls this before any of its modules loads. JAX's import loads the
    CUDA plugin's kernels, whose stub prints "Could not find cuda drivers" on a host without
    a driver; nothing else in JAX's import writes to stderr, so without the plugin (or once
    JAX is imported) this is a plain import.
    """
    if "jax" in sys.modules or not module_present("jax_cuda12_plugin"):
        import jax  # noqa: F401

        return
    with quiet_plugin_start():
        import jax  # noqa: F401


def start_jax() -> None:
    """Imports JAX and registers its plugins with their start-up lines dropped.

    Does not start a backend (no device is opened). Cheap after the first call.
    """
    import_jax()
    from jax._src import xla_bridge  # private: JAX has no public call that only registers

    with quiet_plugin_start():
        # JAX registers its plugins lazily, when the first backend or topology is asked for.
        xla_bridge._discover_and_register_pjrt_plugins()  # type: ignore[no-untyped-call]
