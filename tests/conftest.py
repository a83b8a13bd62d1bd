"""Test set-up: 8 simulated CPU devices before JAX starts, and a deterministic hypothesis."""

import os

from hypothesis import settings

import shardscope

# The suite runs everything on one host with 8 simulated devices (the lab's default).
shardscope.use_cpu_devices(8)

settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
