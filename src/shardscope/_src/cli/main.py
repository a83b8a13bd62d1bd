"""The ``shardscope`` command: a thin shell over the library.

A user error prints one line on stderr and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardscope._src.base.distributed import leave_run_on_failure
from shardscope._src.base.errors import DeviceSetupError, ShardscopeError
from shardscope._src.cli.args import (
    NO_FLAGS,
    PROG,
    Flags,
    UsageError,
)
from shardscope._src.cli.config import (
    AuditHloConfig,
    AuditMatmulConfig,
    AuditMoEConfig,
    AuditProgramConfig,
    AuditReshardConfig,
    AuditTransformerConfig,
    CommandConfig,
    DiffConfig,
    LabConfig,
    LaunchConfig,
    PlanConfig,
    ProfileConfig,
    ServeConfig,
    ShardConfig,
)
from shardscope._src.cli.parsers import build_parser
from shardscope._src.launch import (
    check_launch_command,
    check_launch_size,
    die_with_launcher,
    launch,
)
from shardscope._src.targets.plugins import prepare_targets


def _route_audit(argv: list[str]) -> list[str]:
    """``audit FILE.py:FUNCTION ...`` and ``audit --hlo FILE ...``: the shorthands of
    ``audit program FILE.py:FUNCTION`` and ``audit hlo --hlo FILE``."""
    if argv[:1] != ["audit"] or len(argv) < 2:
        return argv
    rest = argv[1:]
    if rest[0] in ("program", "hlo", "matmul", "moe", "reshard", "transformer"):
        return argv
    if "--hlo" in rest or any(a.startswith("--hlo=") for a in rest):
        return ["audit", "hlo", *rest]
    if ".py:" in rest[0] or rest[0].endswith(".py"):
        return ["audit", "program", *rest]
    return argv


# -- shardscope launch --------------------------------------------------------------------------


#: The sub-command's options the launcher gives each process, by the launcher's own option
#: that sets them.
_LAUNCHER_SETS = {"devices": "devices_per_process", "num_processes": "num_processes"}


def _launch_command(c: LaunchConfig) -> int:

    command = c.sub_command
    try:
        check_launch_command(command)
        check_launch_size(c.num_processes, c.devices_per_process)
    except ShardscopeError as e:
        raise UsageError(f"{PROG} launch: {in_shell_words(e, c.flags)}") from None
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
        if e.shell is None and e.params and set(e.params) <= set(_LAUNCHER_SETS):
            # what the launcher gives each process is set by its own flags
            words = f"{e}{c.flags(tuple(_LAUNCHER_SETS[p] for p in e.params))}"
        else:
            words = in_shell_words(e, sub.flags)
        raise UsageError(f"{PROG} launch: {where}: {words}") from None
    result = launch(
        command,
        c.num_processes,
        devices_per_process=c.devices_per_process,
        timeout_s=c.timeout,
    )
    if result.exit_code:
        print(f"{PROG} launch: {result.message}", file=sys.stderr)
    return result.exit_code


#: What runs each command and what refuses its bad input before any work (None: nothing),
#: as ``(module, function)``: a command's module is imported when it runs, so that a command
#: loads only what it uses.
_HANDLERS: dict[type[CommandConfig], tuple[tuple[str, str], tuple[str, str] | None]] = {
    LabConfig: (("lab", "lab_command"), ("lab", "check_lab")),
    **{
        config: (("audit", "audit_command"), ("audit", "check_audit"))
        for config in (
            AuditProgramConfig,
            AuditHloConfig,
            AuditMatmulConfig,
            AuditMoEConfig,
            AuditReshardConfig,
            AuditTransformerConfig,
        )
    },
    DiffConfig: (("diff", "diff_command"), ("diff", "check_diff")),
    LaunchConfig: (("main", "_launch_command"), None),
    PlanConfig: (("plan", "plan_command"), ("plan", "check_plan")),
    ProfileConfig: (("profile", "profile_command"), ("profile", "check_profile")),
    ServeConfig: (("serve", "serve_command"), ("serve", "check_serve")),
    ShardConfig: (("shard", "shard_command"), ("shard", "check_shard")),
}


def _function(where: tuple[str, str]) -> Callable[[Any], Any]:
    module, name = where
    found: Callable[[Any], Any] = getattr(
        importlib.import_module(f"shardscope._src.cli.{module}"), name
    )
    return found


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
        run: Callable[[CommandConfig], int] = _function(_HANDLERS[type(config)][0])
        return run(config)
    except UsageError as e:
        _fail(str(e))
    except (ShardscopeError, DeviceSetupError) as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {in_shell_words(e, flags)}")
    except OSError as e:  # a file we were asked to write or read; the message names it
        if debug:
            raise
        _fail(f"{PROG}: error: {e}")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


def in_shell_words(error: ShardscopeError | DeviceSetupError, flags: Flags) -> str:
    """A library error as the command line says it: its message in the shell's words where
    it has them (they name the flags), else its message and the flags of its parameters."""
    if error.shell is not None:
        return error.shell
    return f"{error}{flags(error.params)}"


def command_config(args: argparse.Namespace) -> CommandConfig:
    """The typed record of what the parsed command line asks for."""
    config: type[CommandConfig] = args.config
    return config.from_args(args)


def _check(config: CommandConfig) -> None:
    """Runs the sub-command's checks of its input, if it has any."""
    where = _HANDLERS[type(config)][1]
    if where is not None:
        check = _function(where)
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
