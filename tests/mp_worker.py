"""A worker of a real multi-process JAX run for the launcher tests; one process can fail.

Usage: python mp_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID FAULTY_ID MODE, MODE one of
``ok``, ``kill`` (SIGKILL itself), ``exit3`` (exit code 3), ``raise`` (an exception), ``hang``
(sleep). The faulty process fails after the run has formed and one collective has run; the
others then wait in the next collective, as survivors of a dead peer do.
"""

import os
import signal
import sys
import time

import numpy as np

import shardscope
from shardscope._src.base.distributed import leave_run_on_failure

coordinator, n, me, faulty, mode = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
shardscope.use_cpu_devices(2)
shardscope.initialize_distributed(coordinator, n, me)

from jax.experimental import multihost_utils  # noqa: E402

with leave_run_on_failure():
    first = multihost_utils.process_allgather(np.array([me]))
    print(f"formed {n} processes, gathered {np.asarray(first).ravel().tolist()}", flush=True)
    if me == faulty:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "exit3":
            raise SystemExit(3)
        elif mode == "raise":
            raise RuntimeError("worker failed on purpose")
        elif mode == "hang":
            time.sleep(600)
    multihost_utils.process_allgather(np.array([me]))
    print("second collective done", flush=True)
