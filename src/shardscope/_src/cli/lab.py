"""``shardscope lab``: the sharding taster lab's run (its options are in parsers.py)."""

from __future__ import annotations

import os

from shardscope._src.audit.compile import FAST_COMPILE_OPTIONS
from shardscope._src.base.devices import backends_started
from shardscope._src.cli.config import LabConfig
from shardscope._src.cli.paths import check_dir_path
from shardscope._src.lab import taster
from shardscope._src.lab.harness import scorecard_name


def check_lab(c: LabConfig) -> None:

    check_dir_path(c.out, writes=scorecard_name(taster.LAB_ID))
    if c.devices is not None:  # each process's, in a run of several
        taster.check_devices(c.devices, processes=c.multiprocess.num_processes or 1)


def fast_compile_flags() -> None:
    """Appends FAST_COMPILE_OPTIONS to ``XLA_FLAGS``, each unless the user set it there: the
    lab checks what its programs compute and communicate, not how fast, and waits on XLA's
    compiles for most of its run. Only the command does it (the process is its own), before
    JAX's backend starts, which is when XLA reads the flags."""
    if backends_started():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    for name, value in FAST_COMPILE_OPTIONS.items():
        if f"--{name}=" not in flags:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags = f"{flags} --{name}={text}".strip()
    os.environ["XLA_FLAGS"] = flags


def lab_command(c: LabConfig) -> int:

    fast_compile_flags()
    c.multiprocess.initialize()
    lab, summary = taster.run(devices=c.devices, out_dir=c.out)
    return 0 if summary["passed"] == summary["total"] else 1
