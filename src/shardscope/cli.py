"""The ``shardscope`` command: a thin shell over the library.

A user error prints one line on stderr and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardscope._errors import DeviceSetupError, ShardscopeError

PROG = "shardscope"


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive whole number")
    return value


def _cmd_lab(args: argparse.Namespace) -> int:
    from shardscope import taster

    lab, summary = taster.run(devices=args.devices, out_dir=args.out)
    return 0 if summary["passed"] == summary["total"] else 1


def _cmd_audit(args: argparse.Namespace) -> int:
    from shardscope._audit_cli import run_audit_command

    return run_audit_command(args.program, args.mesh, args.json)


def _cmd_plan(args: argparse.Namespace) -> int:
    from shardscope._plan_cli import run_plan_command

    overrides = {
        k: getattr(args, k)
        for k in ("link_bandwidth", "cross_node_bandwidth", "latency_s", "memory_bytes",
                  "peak_flops", "node_size")
        if getattr(args, k) is not None
    }
    dims = {k: getattr(args, k) for k in ("d_model", "heads", "ff", "layers", "vocab")}
    return run_plan_command(
        model=args.model, devices=args.devices, dims=dims, batch=args.batch, seq=args.seq,
        mode=args.mode, hardware=args.hardware, hardware_overrides=overrides,
        strategies=args.strategies.split(",") if args.strategies else None,
        bytes_per_param=args.bytes_per_param, flash_attention=not args.no_flash_attention,
        workers=args.workers, json_path=args.json, png_path=args.png, report_path=args.report,
        top=args.top,
    )


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 450e9)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def _add_plan_parser(sub: Any) -> None:
    from shardscope._hardware import PRESETS
    from shardscope._model_presets import MODEL_PRESETS

    p = sub.add_parser(
        "plan",
        help="rank sharding strategies and mesh shapes for a model on N devices",
        description="Compile every strategy and mesh shape for a model on N simulated "
        "devices (nothing allocated), audit the collectives, estimate memory, communication "
        "and step time on a hardware preset, and rank the plans.",
    )
    p.add_argument("--model", choices=list(MODEL_PRESETS), help="a model preset")
    for dim in ("d-model", "heads", "ff", "layers", "vocab"):
        p.add_argument(f"--{dim}", type=positive_int, metavar="N",
                       help="model shape (overrides the preset's)")
    p.add_argument("--devices", type=positive_int, required=True, metavar="N",
                   help="accelerators to plan for")
    p.add_argument("--batch", type=positive_int, metavar="N",
                   help="global batch in sequences (default: one per device)")
    p.add_argument("--seq", type=positive_int, metavar="N", help="sequence length")
    p.add_argument("--mode", choices=["train", "forward"], default="train")
    p.add_argument("--hardware", default="h100", choices=list(PRESETS),
                   help="hardware preset (default h100)")
    for flag, dest, what in (
        ("--link-bandwidth", "link_bandwidth", "bytes/s per device within a node"),
        ("--cross-node-bandwidth", "cross_node_bandwidth", "bytes/s per device across nodes"),
        ("--latency", "latency_s", "seconds per collective step"),
        ("--memory", "memory_bytes", "device memory in bytes"),
        ("--peak-flops", "peak_flops", "FLOP/s per device"),
    ):
        p.add_argument(flag, dest=dest, type=positive_float, metavar="X", help=what)
    p.add_argument("--node-size", type=positive_int, metavar="N",
                   help="devices per node with the fast links")
    p.add_argument("--strategies", metavar="LIST",
                   help="comma-separated strategies to try (default: dp,fsdp,tp,sp,dp_tp,"
                   "fsdp_tp,dp_sp)")
    p.add_argument("--bytes-per-param", type=positive_int, default=16, metavar="N",
                   help="training model state per parameter (default 16: mixed-precision Adam)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="count the attention scores in the activation estimate")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="compile in N worker processes (0: in this process; default: auto)")
    p.add_argument("--top", type=positive_int, metavar="N", help="show only the best N")
    p.add_argument("--json", metavar="FILE", help="write the plans as JSON")
    p.add_argument("--png", metavar="FILE", help="write the memory vs communication chart")
    p.add_argument("--report", metavar="FILE", help="write a Markdown report")
    p.set_defaults(run=_cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Show, check and plan how JAX shards arrays and what communication XLA "
        "inserts.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    lab = sub.add_parser(
        "lab",
        help="run the sharding taster lab: every claim a named check, JSON scorecard + PNG",
        description="Simulate devices, shard a parameter, check a sharded matmul against one "
        "device, reshard, plot per-device memory; writes <out>/sharding_taster.json and a PNG. "
        "Exit 0 when every check passes, 1 when any fails.",
    )
    lab.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        metavar="N",
        help="simulated CPU devices (default: XLA_FLAGS' count if set, else 8)",
    )
    lab.add_argument(
        "--out", default="scores", metavar="DIR", help="result folder (default: scores)"
    )
    lab.set_defaults(run=_cmd_lab)

    from shardscope._demos import DEMOS

    audit = sub.add_parser(
        "audit",
        help="compile a program and list the collectives XLA inserted: kind, axis, bytes, line",
        description="Audit a built-in program: every collective XLA inserted, by mesh axis and "
        "kind, with counts (loop trips included), bytes and source lines.",
    )
    audit.add_argument("program", choices=list(DEMOS), help="the program to compile and audit")
    audit.add_argument(
        "--mesh",
        default=None,
        metavar="SPEC",
        help="mesh description, e.g. 'model=8' (default) or 'dp=2,model=4'",
    )
    audit.add_argument("--json", default=None, metavar="FILE", help="also write the audit as JSON")
    audit.set_defaults(run=_cmd_audit)
    _add_plan_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
        if args.command is None:  # pragma: no cover - argparse enforces it
            parser.error("a command is required")
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except UsageError as e:
        _fail(str(e))
    except (ShardscopeError, DeviceSetupError) as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {e}")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


def _fail(message: str) -> NoReturn:
    print(" ".join(message.split()), file=sys.stderr)
    raise SystemExit(2)
