"""Every test and doctest (``src/shardscope``'s ``>>>`` examples are collected too) runs with 8
simulated CPU devices, set before JAX starts."""

import shardscope

shardscope.use_cpu_devices(8)

# Scripts, not modules: importing them (to look for doctests) would run them.
collect_ignore = ["src/shardscope/__main__.py", "tests/mp_worker.py"]
collect_ignore_glob = ["tests/fixtures/*"]
