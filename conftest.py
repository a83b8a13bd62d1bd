"""Every test and doctest (``src/shardscope``'s ``>>>`` examples are collected too) runs with 8
simulated CPU devices, set before JAX starts."""

import shardscope

shardscope.use_cpu_devices(8)

# Running it would start the command line.
collect_ignore = ["src/shardscope/__main__.py"]
