"""Every test and doctest (``src/shardscope``'s ``>>>`` examples are collected too) runs with 8
simulated CPU devices, set before JAX starts.

The suite's CPU compiles use the planner's fast-compile options (``FAST_COMPILE_OPTIONS``,
each unless ``XLA_FLAGS`` already sets it; subprocesses inherit them):

- LLVM's optimisations off (``--xla_backend_optimization_level=0``): XLA's passes, and so
  the optimised HLO, its collectives and its buffers, are the same (``tests/test_plan.py``
  compares them with the default level); only the machine code is slower to run, and a third
  faster to build.
- XLA:CPU's loop emitters for its fusions, not its MLIR fusion emitters
  (``--xla_cpu_use_fusion_emitters=false``): the same collectives, arguments and outputs
  (``tests/test_plan.py`` compiles a program both ways with XLA's defaults and compares
  them); the CPU fusions differ, and so the temporaries, by a percent or two. A CPU compile
  builds 3 to 5 times faster (the six files that compile most on the CPU, test_verdict,
  test_bounds, test_moe_strategies, test_context, test_hsdp and test_strategies: 198
  CPU-seconds to 117).

Python's cyclic garbage collector runs less often in the suite's processes (the youngest
generation collected every 10,000 new objects instead of 700, the older two after 50 and 100
of the younger's collections instead of 10 and 10), and what is alive once the tests are
collected (JAX, the libraries, the test modules) is never scanned again (``gc.freeze``): a
process of the suite holds a large heap of long-lived objects, which each full collection
walks. test_plan, test_targets and test_moe_plan in one process spent 10.7 s collecting (28
full collections), and 2.0 s so (5), at the same peak memory. What a test computes is the
same.

The accelerators' deviceless compilers build the same programs either way. The GPU compiler
keeps the machine code of each kernel it builds in a file of this process's
(``--xla_gpu_kernel_cache_file``, deleted when the process ends) and takes it from there when
a later compile has the same kernel: a deviceless compile's machine code is never run or
shown, and its HLO, buffers and costs are the same (``tests/test_targets.py`` compiles a
program with and without the file and compares them). Most of a GPU compile's time is that
code generation (each kernel to PTX, then ``ptxas`` started once a kernel), and the suite
compiles the same kernels many times over (layers, depths, batches): the seven files that
compile most for GPUs, test_serve, test_moe_plan, test_moe_strategies, test_targets,
test_serving_steps, test_latent_attention and test_fused_blocks, take 222 CPU-seconds with
the file and 316 without."""

import atexit
import gc
import os
import shutil
import tempfile

import shardscope

#: ``FAST_COMPILE_OPTIONS`` as XLA flags (``tests/test_plan.py`` checks they are the same).
_FLAGS = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}
_KERNEL_FILE = "--xla_gpu_kernel_cache_file"
#: The kernel files' folders: a process of the suite (a pytest-xdist worker) makes its own in
#: place of the one it inherits (two processes writing one file could tear it); a file the
#: user's ``XLA_FLAGS`` names is kept.
_KERNELS = "shardscope-suite-kernels-"

_set = " ".join(
    f for f in os.environ.get("XLA_FLAGS", "").split() if not (_KERNEL_FILE in f and _KERNELS in f)
)
for _name, _value in _FLAGS.items():
    if f"--{_name}" not in _set:
        _set = f"{_set} --{_name}={_value}".strip()
if _KERNEL_FILE not in _set:
    _kernels = tempfile.mkdtemp(prefix=_KERNELS)
    atexit.register(shutil.rmtree, _kernels, ignore_errors=True)
    _set = f"{_set} {_KERNEL_FILE}={_kernels}/kernels.bin".strip()
os.environ["XLA_FLAGS"] = _set

shardscope.use_cpu_devices(8)

gc.set_threshold(10_000, 50, 100)


def pytest_collection_finish(session):
    """What the collected tests hold from here on (modules, JAX) is left out of collections."""
    gc.collect()
    gc.freeze()


# Scripts, not modules: importing them (to look for doctests) would run them.
collect_ignore = ["src/shardscope/__main__.py", "tests/mp_worker.py"]
collect_ignore_glob = ["tests/fixtures/*"]
