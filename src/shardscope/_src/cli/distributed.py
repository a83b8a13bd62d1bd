"""The multi-process option group every sub-command that computes takes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shardscope._src.base.distributed import initialize_distributed, parse_coordinator
from shardscope._src.base.errors import ShardscopeError
from shardscope._src.cli.args import nonnegative_int, positive_int


def _coordinator(text: str) -> str:
    try:
        parse_coordinator(text)
    except ShardscopeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_distributed_options(parser: argparse.ArgumentParser) -> None:
    """Adds the multi-process option group to a sub-command's parser."""
    group = parser.add_argument_group(
        "multi-process run",
        "Join a multi-process JAX run (one process per host, or several on one machine via "
        "'shardscope launch'). Give all three values, or --distributed to let JAX detect them "
        "under SLURM, Open MPI or Kubernetes. Only process 0 prints and writes results.",
    )
    group.add_argument(
        "--coordinator",
        type=_coordinator,
        default=None,
        metavar="HOST:PORT",
        help="address of process 0, the same for every process",
    )
    group.add_argument(
        "--num-processes", type=positive_int, default=None, metavar="N", help="processes in the run"
    )
    group.add_argument(
        "--process-id", type=nonnegative_int, default=None, metavar="I", help="this process, 0..N-1"
    )
    group.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() and let JAX detect the cluster",
    )


@dataclass(frozen=True)
class DistributedConfig:
    """The multi-process option group's values: all None and ``detect`` False outside a
    multi-process run."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    detect: bool = False  # --distributed: let JAX detect the cluster

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DistributedConfig:
        return cls(args.coordinator, args.num_processes, args.process_id, args.distributed)

    def initialize(self) -> bool:
        """Starts the multi-process run these options describe, if any."""
        return initialize_distributed(
            self.coordinator, self.num_processes, self.process_id, detect=self.detect
        )
