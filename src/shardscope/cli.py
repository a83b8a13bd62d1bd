"""The ``shardscope`` command: a thin shell over the library.

A user error prints one line on stderr and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

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
