"""The ``shardscope`` command: a thin shell over the library.

A user error prints one line on stderr and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardscope._src.base.distributed import leave_run_on_failure
from shardscope._src.base.errors import DeviceSetupError, ShardscopeError
from shardscope._src.base.records import result_header
from shardscope._src.cli.args import (
    NO_FLAGS,
    PROG,
    Parser,
    UsageError,
    positive_float,
    positive_int,
)
from shardscope._src.cli.audit import add_audit_parser, audit_command, check_audit
from shardscope._src.cli.config import (
    AuditHloConfig,
    AuditMatmulConfig,
    AuditProgramConfig,
    AuditReshardConfig,
    AuditTransformerConfig,
    CommandConfig,
    DiffConfig,
    LabConfig,
    LaunchConfig,
    PlanConfig,
)
from shardscope._src.cli.diff import add_diff_parser, check_diff, diff_command
from shardscope._src.cli.lab import add_lab_parser, check_lab, lab_command
from shardscope._src.cli.plan import add_plan_parser, check_plan, plan_command
from shardscope._src.launch import (
    check_launch_command,
    check_launch_size,
    die_with_launcher,
    launch,
)
from shardscope._src.targets.plugins import prepare_targets


def _version_text() -> str:

    h = result_header(None)
    return (
        f"{PROG} {h['shardscope_version']} (jax {h['jax_version']}, jaxlib {h['jaxlib_version']})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Show, check and plan how JAX shards arrays and what communication XLA "
        "inserts.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    add_lab_parser(sub)
    add_audit_parser(sub)
    add_diff_parser(sub)
    _add_launch_parser(sub)
    add_plan_parser(sub)
    return parser


def _route_audit(argv: list[str]) -> list[str]:
    """``audit FILE.py:FUNCTION ...`` and ``audit --hlo FILE ...``: the shorthands of
    ``audit program FILE.py:FUNCTION`` and ``audit hlo --hlo FILE``."""
    if argv[:1] != ["audit"] or len(argv) < 2:
        return argv
    rest = argv[1:]
    if rest[0] in ("program", "hlo", "matmul", "reshard", "transformer"):
        return argv
    if "--hlo" in rest or any(a.startswith("--hlo=") for a in rest):
        return ["audit", "hlo", *rest]
    if ".py:" in rest[0] or rest[0].endswith(".py"):
        return ["audit", "program", *rest]
    return argv


# -- shardscope launch --------------------------------------------------------------------------


def _add_launch_parser(sub: argparse._SubParsersAction) -> None:
    launch = sub.add_parser(
        "launch",
        help="run a sub-command as P local processes of one multi-process JAX run",
        description="Start P processes of 'shardscope SUB-COMMAND ...' on this machine, joined "
        "in one JAX run over a free loopback port (each gets --coordinator, --num-processes, "
        "--process-id and --devices), with every output line prefixed by '[i] '. If one "
        "process dies, the others are ended at once and the launcher names it. For local "
        "testing of multi-process code; on a cluster use srun/mpirun and --distributed.",
    )
    launch.add_argument(
        "-n",
        "--num-processes",
        type=positive_int,
        required=True,
        metavar="P",
        help="processes to start",
    )
    launch.add_argument(
        "--devices-per-process",
        type=positive_int,
        default=4,
        metavar="D",
        help="simulated CPU devices in each process (default: 4)",
    )
    launch.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="end the whole run after S seconds (exit 124)",
    )
    launch.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- SUB-COMMAND ...",
        help="the shardscope sub-command each process runs, after '--'",
    )
    launch.set_defaults(config=LaunchConfig)


def _launch_command(c: LaunchConfig) -> int:

    command = c.sub_command
    try:
        check_launch_command(command)
        check_launch_size(c.num_processes, c.devices_per_process)
    except ShardscopeError as e:
        raise UsageError(f"{PROG} launch: {e}{c.flags(e.params)}") from None
    # A bad sub-command is reported once, here, rather than by every process.
    try:
        build_parser().parse_args(_route_audit(command))
    except UsageError as e:
        raise UsageError(f"{PROG} launch: {e}") from None
    # What each process will be given, with the values it will be given.
    probe = [*_route_audit(command)]  # a copy: the command itself goes to every process
    probe += ["--coordinator", "127.0.0.1:1", "--num-processes", str(c.num_processes)]
    probe += ["--process-id", "0", "--devices", str(c.devices_per_process)]
    try:
        sub = command_config(build_parser().parse_args(probe))
    except UsageError:
        raise UsageError(
            f"{PROG} launch: '{command[0]}' cannot run as several processes (it takes no "
            f"--coordinator, --num-processes, --process-id and --devices options)"
        ) from None
    try:  # the sub-command's own checks, here, before any process starts
        _check(sub)
    except ShardscopeError as e:
        where = " ".join(command[:2])
        raise UsageError(f"{PROG} launch: {where}: {e}{sub.flags(e.params)}") from None
    result = launch(
        command,
        c.num_processes,
        devices_per_process=c.devices_per_process,
        timeout_s=c.timeout,
    )
    if result.exit_code:
        print(f"{PROG} launch: {result.message}", file=sys.stderr)
    return result.exit_code


#: What runs each command, and what refuses its bad input before any work (None: nothing).
_HANDLERS: dict[type[CommandConfig], tuple[Callable[[Any], int], Callable[[Any], None] | None]] = {
    LabConfig: (lab_command, check_lab),
    AuditProgramConfig: (audit_command, check_audit),
    AuditHloConfig: (audit_command, check_audit),
    AuditMatmulConfig: (audit_command, check_audit),
    AuditReshardConfig: (audit_command, check_audit),
    AuditTransformerConfig: (audit_command, check_audit),
    DiffConfig: (diff_command, check_diff),
    LaunchConfig: (_launch_command, None),
    PlanConfig: (plan_command, check_plan),
}


def main(argv: Sequence[str] | None = None) -> int:

    die_with_launcher()
    with leave_run_on_failure():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # --debug may stand anywhere before a "--" (after it, the words belong to a sub-command).
    end = args_list.index("--") if "--" in args_list else len(args_list)
    debug = "--debug" in args_list[:end]
    args_list = [a for a in args_list[:end] if a != "--debug"] + args_list[end:]
    args_list = _route_audit(args_list)
    parser = build_parser()
    flags = NO_FLAGS  # the flags that set the parameters a library error names
    try:
        args = parser.parse_args(args_list)
        if args.command is None:  # pragma: no cover - argparse enforces it
            parser.error("a command is required")
        config = command_config(args)
        flags = config.flags
        # The process is the command's own: the deviceless set-up (the environment the
        # accelerator plugins need, the plugins registered without their start-up chatter)
        # comes first, before any backend starts. Some checks below read JAX's dtypes.
        prepare_targets()
        _check(config)  # bad input is refused before any work
        return _HANDLERS[type(config)][0](config)
    except UsageError as e:
        _fail(str(e))
    except ShardscopeError as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {e}{flags(e.params)}")
    except DeviceSetupError as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {e}{flags(e.params)}")
    except OSError as e:  # a file we were asked to write or read; the message names it
        if debug:
            raise
        _fail(f"{PROG}: error: {e}")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


def command_config(args: argparse.Namespace) -> CommandConfig:
    """The typed record of what the parsed command line asks for."""
    config: type[CommandConfig] = args.config
    return config.from_args(args)


def _check(config: CommandConfig) -> None:
    """Runs the sub-command's checks of its input, if it has any."""
    check = _HANDLERS[type(config)][1]
    if check is not None:
        check(config)


def _fail(message: str) -> NoReturn:
    print(_shorten(" ".join(message.split())), file=sys.stderr)
    raise SystemExit(2)


def _shorten(line: str, longest: int = 80) -> str:
    """``line`` with any word longer than ``longest`` characters cut to its ends: a value
    thousands of characters long is named, not echoed whole."""

    def cut(m: re.Match[str]) -> str:
        word = m.group()
        return f"{word[:40]}...{word[-20:]} ({len(word):,} characters)"

    return re.sub(rf"\S{{{longest + 1},}}", cut, line)
