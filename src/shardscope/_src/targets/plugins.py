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
  under :func:`~shardscope._src.base.startup.quiet_plugin_start`. Everything else they
  print is passed on.

Nothing here runs when shardscope is imported. :func:`prepare_targets` is the deviceless
set-up: it runs when a GPU or TPU target's devices are first asked for (and when the command
line starts, whose process it is), sets the environment variables named in
:func:`prepare_environment` where they are unset, and registers the plugins.
"""

from __future__ import annotations

import os

from shardscope._src.base.errors import TargetError
from shardscope._src.base.startup import (
    has_nvidia_gpu,
    has_tpu_chips,
    module_present,
    quiet_plugin_start,
    start_jax,
)


def prepare_environment() -> None:
    """Sets, where unset, what lets the plugins start quietly on a host without the chips.

    On a host with an NVIDIA GPU or TPU chips nothing is set: JAX and libtpu find them as
    usual, and the compile-only devices work beside the real ones.
    """
    if not has_nvidia_gpu():
        # The plugin's check that the installed CUDA libraries match the driver: without a
        # driver it fails and the plugin (and so the compile-only GPU topology) is dropped.
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if not has_tpu_chips():
        # libtpu asks the cloud metadata for these and logs errors when it finds none.
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # libtpu takes a lock file (/tmp/libtpu_lockfile) so that one process owns the
        # chips; with no chips, several processes may compile at once.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


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
