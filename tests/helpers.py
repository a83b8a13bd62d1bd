"""Small shared helpers for the tests."""

import jax
import pytest


def need_devices(n: int) -> None:
    """Skips the calling test, saying how many devices it needs, when fewer exist."""
    have = jax.device_count()
    if have < n:
        pytest.skip(f"test requires {n} devices and found {have}")
