"""Every test and doctest (``src/shardscope``'s ``>>>`` examples are collected too) runs with 8
simulated CPU devices, set before JAX starts.

The suite's CPU compiles skip LLVM's optimisations (``--xla_backend_optimization_level=0``,
unless ``XLA_FLAGS`` already sets a level): XLA's passes, and so the optimised HLO, its
collectives and its buffers, are the same (``tests/test_plan.py`` compares them with the
default level); only the machine code is slower to run, and a third faster to build. The
accelerators' deviceless compilers build the same programs either way. Subprocesses inherit
the flag."""

import os

import shardscope

_LEVEL = "--xla_backend_optimization_level"
if _LEVEL not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_LEVEL}=0".strip()

shardscope.use_cpu_devices(8)

# Scripts, not modules: importing them (to look for doctests) would run them.
collect_ignore = ["src/shardscope/__main__.py", "tests/mp_worker.py"]
collect_ignore_glob = ["tests/fixtures/*"]
