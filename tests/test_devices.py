"""Device set-up runs in fresh processes: JAX's backend can start only once per process."""

import os
import subprocess
import sys
import textwrap


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
