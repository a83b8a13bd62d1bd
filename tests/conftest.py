"""Test set-up: a deterministic hypothesis (the 8 simulated devices: ../conftest.py)."""

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
