"""The deviceless set-up: JAX's CUDA plugin and libtpu started on a machine without the chips.

JAX's CUDA plugin and libtpu each give a *topology*: devices that programs can be compiled
for but not run on (:mod:`shardscope._src.targets.devices`). Both are optional installs (the
``gpu-compile`` and ``tpu-compile`` extras). Three habits of theirs are handled here, each
only where the user has not decided:

* the CUDA plugin refuses to register on a host without a CUDA driver unless JAX is told to
  skip its version check (or is limited to other platforms);
* libtpu, started on a host without TPU chips, prints start-up errors unless it is told the
  accelerator type and worker host names, and lets one process at a time load it;
* both print harmless start-up lines from C++ ("Could not find cuda drivers on your machine",
  absl's "before absl::InitializeLog()" notice), which are dropped while JAX loads its plugins
  under :func:`quiet_plugin_start`. Everything else they print is passed on.

Nothing here runs when shardscope is imported. :func:`prepare_targets` is the deviceless
set-up: it runs when a GPU or TPU target's devices are first asked for (and when the command
line starts, whose process it is), sets the environment variables named in
:func:`prepare_environment` where they are unset, and registers the plugins.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import sys

from shardscope._src.base.errors import TargetError
from shardscope._src.base.stderr import capture_stderr

#: Lines the accelerator plugins print on every start on a host without the accelerator.
_START_UP_NOISE = (
    "Could not find cuda drivers on your machine",
    "All log messages before absl::InitializeLog() is called are written to STDERR",
)


def _has_nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


def _has_tpu_chips() -> bool:
    # Google's PCI vendor id: the check libtpu itself starts from.
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as f:
                if f.read().strip() == "0x1ae0":
                    return True
        except OSError:
            continue
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def prepare_environment() -> None:
    """Sets, where unset, what lets the plugins start quietly on a host without the chips.

    On a host with an NVIDIA GPU or TPU chips nothing is set: JAX and libtpu find them as
    usual, and the compile-only devices work beside the real ones.
    """
    if not _has_nvidia_gpu():
        # The plugin's check that the installed CUDA libraries match the driver: without a
        # driver it fails and the plugin (and so the compile-only GPU topology) is dropped.
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if not _has_tpu_chips():
        # libtpu asks the cloud metadata for these and logs errors when it finds none.
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # libtpu takes a lock file (/tmp/libtpu_lockfile) so that one process owns the
        # chips; with no chips, several processes may compile at once.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def quiet_plugin_start() -> contextlib.AbstractContextManager[list[str]]:
    """Drops the plugins' known start-up lines from what C++ writes to stderr meanwhile."""
    return capture_stderr(drop=_START_UP_NOISE)


def _cuda_plugin_installed() -> bool:
    return module_present("jax_cuda12_plugin")


def import_jax() -> None:
    """Imports JAX; where the CUDA plugin is installed, with its start-up lines dropped.

    ``shardscope._src`` calls this before any of its modules loads. JAX's import loads the
    CUDA plugin's kernels, whose stub prints "Could not find cuda drivers" on a host without
    a driver; nothing else in JAX's import writes to stderr, so without the plugin (or once
    JAX is imported) this is a plain import. It sets no environment variable. This module is
    the one that imports JAX inside functions: it loads before JAX does.
    """
    if "jax" in sys.modules or not _cuda_plugin_installed():
        import jax  # noqa: F401

        return
    with quiet_plugin_start():
        import jax  # noqa: F401


def start_jax() -> None:
    """Imports JAX and registers its plugins with their start-up lines dropped.

    Does not start a backend (no device is opened), and sets no environment variable. Cheap
    after the first call.
    """
    import_jax()
    from jax._src import xla_bridge  # private: JAX has no public call that only registers

    with quiet_plugin_start():
        # JAX registers its plugins lazily, when the first backend or topology is asked for.
        xla_bridge._discover_and_register_pjrt_plugins()


def prepare_targets() -> None:
    """The deviceless set-up: the environment the plugins need (:func:`prepare_environment`)
    and the plugins registered, so that GPU and TPU topologies can be made.

    If JAX registered its plugins before this ran (a JAX computation came first), the CUDA
    plugin may have refused to register for want of a driver; it is registered again here.
    """
    prepare_environment()
    start_jax()
    _register_cuda_again()


def _register_cuda_again() -> None:
    from jax._src import xla_bridge  # private: where JAX keeps the registered topologies

    if "cuda" in xla_bridge._topology_factories or not module_present("jax_plugins.xla_cuda12"):
        return
    import jax_plugins.xla_cuda12 as cuda_plugin

    # The plugin's own entry point, the one JAX's registration calls; it reads
    # JAX_SKIP_CUDA_CONSTRAINTS_CHECK, which prepare_environment has now set.
    try:
        with quiet_plugin_start():
            cuda_plugin.initialize()
    except Exception as e:  # the plugin raises what its loader met; its classes vary
        raise TargetError(
            f"JAX's CUDA plugin did not register in this process ({type(e).__name__}: {e}); "
            f"reinstall it for the installed JAX: pip install 'shardscope[gpu-compile]'"
        ) from None


def module_present(name: str) -> bool:
    """Whether the module ``name`` can be imported (found, not loaded)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
