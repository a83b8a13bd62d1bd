"""Device set-up runs in fresh processes: JAX's backend can start only once per process."""

import os
import subprocess
import sys
import textwrap

import pytest

from shardscope._src.base.startup import accelerator_present
from shardscope._src.targets.devices import compiler_installed


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_use_cpu_devices_honours_flags_and_keeps_them():
    r = run_py(
        """
        import os, shardscope
        print(shardscope.use_cpu_devices())
        import jax
        print(jax.device_count(), os.environ["XLA_FLAGS"])
        """,
        XLA_FLAGS="--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [
        "4",
        "4 --xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4",
    ]


def test_explicit_count_and_default():
    r = run_py(
        """
        import shardscope, jax
        print(shardscope.use_cpu_devices(6), jax.device_count(), jax.devices()[0].platform)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6", "6", "cpu"]
    r = run_py("import shardscope, jax; shardscope.use_cpu_devices(); print(jax.device_count())")
    assert r.stdout.split() == ["8"]


def test_too_late_raises_with_the_fix():
    r = run_py(
        """
        import jax, shardscope
        jax.numpy.zeros(3).block_until_ready()
        print(shardscope.use_cpu_devices(1))  # what is running already: fine
        try:
            shardscope.use_cpu_devices(8)
        except shardscope.DeviceSetupError as e:
            print(isinstance(e, RuntimeError), e)
        """
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().split("\n")
    assert first == "1"
    assert second.startswith("True JAX's backend is already running with 1 CPU device(s)")
    assert "before the first JAX computation" in second


def test_notebook_style_flags_then_bootstrap():
    r = run_py(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        import shardscope
        lab = shardscope.bootstrap("nb", verbose=False)
        import jax
        print(jax.device_count(), lab.hardware["device_count"])
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["8", "8"]


#: What the deviceless set-up sets (targets/plugins.py), which a test process may hold already.
PLUGIN_VARIABLES = (
    "JAX_SKIP_CUDA_CONSTRAINTS_CHECK",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
    "JAX_PLATFORMS",
)


def run_fresh(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new Python whose environment holds nothing shardscope sets."""
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_VARIABLES}
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(accelerator_present(), reason="JAX's defaults are this host's accelerators")
def test_cpu_devices_compute_without_the_accelerator_plugins_start_up_noise():
    # Where the compile extras are installed, the CUDA plugin would print a traceback for want
    # of a driver, and libtpu its search for chips, at the first computation.
    r = run_fresh(
        """
        import shardscope
        shardscope.use_cpu_devices(8)
        import jax
        print(jax.numpy.ones(3).sum(), jax.device_count(), jax.default_backend())
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.0", "8", "cpu"]
    assert r.stderr == ""


@pytest.mark.skipif(accelerator_present(), reason="JAX's defaults are this host's accelerators")
@pytest.mark.skipif(
    not (compiler_installed("h100") and compiler_installed("tpu-v5p")),
    reason="needs the gpu-compile and tpu-compile extras",
)
def test_cpu_devices_leave_the_deviceless_targets_compiling():
    r = run_fresh(
        """
        import shardscope
        shardscope.use_cpu_devices(8)
        import jax, jax.numpy as jnp
        jnp.ones(3).sum().block_until_ready()
        for target in ("h100", "tpu-v5p"):
            audit = shardscope.audit(
                jax.jit(lambda x: x.sum()), jax.ShapeDtypeStruct((8, 128), jnp.float32),
                mesh="data=8", target=target, in_shardings=jax.sharding.PartitionSpec("data"),
            )
            print(audit.backend, audit.target, *sorted({c.kind for c in audit.collectives}))
        print(jax.default_backend())
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["gpu h100 all-reduce", "tpu tpu-v5p all-reduce", "cpu"]
    assert r.stderr == ""
