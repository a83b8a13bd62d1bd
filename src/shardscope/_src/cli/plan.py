"""``shardscope plan``: the checks of its input and its two runs as library calls (its
options are in parsers.py): a built-in model (:func:`run_plan_command`) or the user's own program
(:func:`run_plan_program`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from shardscope._src.audit.user_program import load_program
from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.devices import MAX_CPU_DEVICES, backends_started, use_cpu_devices
from shardscope._src.base.errors import PlanError, StrategyError
from shardscope._src.base.knobs import knob_of
from shardscope._src.base.notes import Note
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.args import (
    NO_FLAGS,
    PROG,
    Flags,
    UsageError,
)
from shardscope._src.cli.audit_program import simulate_devices
from shardscope._src.cli.config import HardwareOptions, PlanConfig
from shardscope._src.cli.options import compile_progress, print_more
from shardscope._src.cli.paths import check_file_path, check_output_paths, print_written
from shardscope._src.cli.serve import run_serve_command
from shardscope._src.plan.request import DEFAULT_REQUEST, PlanRequest, ServeRequest
from shardscope._src.program.program import plan_program
from shardscope._src.render.console import natural_width, output_console
from shardscope._src.render.plan import markdown_report, plan_table, render_plan
from shardscope._src.render.plan_plot import plot_plans
from shardscope._src.render.program_plan import program_markdown_report, render_program_plan
from shardscope._src.render.protocols import PlanSet, RankedPlan
from shardscope._src.sharding.rules import load_rules_file
from shardscope._src.sharding.strategies import ALL_STRATEGIES, get_strategy
from shardscope._src.train.sweep import plan_request

#: The knobs of a training plan.
PLAN_FIELDS = frozenset(f.name for f in fields(PlanRequest))


def _ensure_devices(devices: int) -> None:
    """Simulates ``devices`` CPU devices (at most what one process can) when JAX has not
    started, for in-process compiles: a plan of more compiles one pipeline stage."""

    if not backends_started():
        use_cpu_devices(min(devices, MAX_CPU_DEVICES))


def run_plan_command(
    request: PlanRequest,
    *,
    json_path: str | None = None,
    png_path: str | None = None,
    report_path: str | None = None,
    top: int | None = None,
    console: Any = None,
    progress_console: Any = None,
    flags: Flags = NO_FLAGS,
    verbose: bool = False,
) -> int:
    """Plans ``request``, prints the ranked table, writes the requested files; returns 0.

    Args:
        request: what to plan (:meth:`PlanConfig.request` maps the options onto it).
        json_path, png_path, report_path: where to write ``PlanResult.to_dict()``, the
            memory-vs-communication chart and the Markdown report (each atomically).
        top: show only the best ``top`` plans.
        console: a rich Console for the tables (default stdout); ``progress_console`` for
            the progress bar (default stderr).
        flags: the flags of the command line that asked, named after the notes that
            suggest a change.
        verbose: print everything (every skipped candidate, the validation table, every
            note in full); else the answer on one screen and a line saying where the rest is.

    Raises:
        PlanError: no plan at all (after printing what was skipped and writing the files),
            an unknown preset or a bad setting; the CLI prints it as one line, exit 2.
    """
    # before minutes of compiling, not after
    check_output_paths({"--json": json_path, "--png": png_path, "--report": report_path})
    _ensure_devices(request.devices)
    with compile_progress(progress_console) as progress:
        result = plan_request(request, progress)
    if console is None:
        # the plan table is the widest: piped, it is printed as wide as its cells need; JSON
        # on standard output sends the tables to stderr
        width = natural_width(plan_table(result), least=150)
        console = output_console(piped_width=width, stderr=json_path == STDOUT)
    render_plan(result, console=console, top=top, empty_reason=False, flags=flags, verbose=verbose)
    if not verbose:
        print_more(console, report=True)
    written = write_plan_files(
        result,
        markdown_report,
        json_path=json_path,
        png_path=png_path,
        report_path=report_path,
    )
    print_written(console, written)
    if not result.plans:
        raise no_plan_error(result.empty_reason)
    return 0


def check_program_devices(devices: int) -> None:
    """Refuses more devices than the CPU backend simulates, for a user's program, which runs
    on all of them (a :class:`PlanRequest` refuses more than the planner plans)."""
    if devices > MAX_CPU_DEVICES:
        raise PlanError(
            f"--devices {devices}: your program is compiled on all its devices, and the CPU "
            f"backend simulates at most {MAX_CPU_DEVICES}; plan {MAX_CPU_DEVICES} or fewer"
        )


class PlanFiles(PlanSet[RankedPlan], Protocol):
    """A sweep that can be written: the renderers' fields, its JSON and its backend."""

    @property
    def backend(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


SweepT = TypeVar("SweepT", bound=PlanFiles)


def write_plan_files(
    result: SweepT,
    report: Callable[[SweepT], str],
    *,
    json_path: str | None,
    png_path: str | None,
    report_path: str | None,
) -> list[Path | None]:
    """Writes, atomically, what was asked for: the plans as JSON (None in the list where it
    went to standard output), the memory-vs-communication chart and the Markdown
    ``report``; returns where each went."""
    written = []
    if json_path:
        written.append(write_result(json_path, result))
    if png_path:
        written.append(plot_plans(result, png_path))
    if report_path:
        text = report(result)
        written.append(write_atomic(report_path, lambda f: f.write(text)))
    return written


def no_plan_error(why: Note | None) -> PlanError:
    """The error a command that found no plan exits with, naming what would change that."""
    if why is None:
        return PlanError("no plan")
    return PlanError(str(why), param=why.params)


def check_plan(c: PlanConfig) -> None:
    """What ``plan`` can refuse before it compiles: strategy names and output files (the
    library refuses the rest of its input before compiling too)."""

    for name in c.strategies.split(",") if c.strategies is not None else []:
        if name.strip() not in ALL_STRATEGIES:
            # the library's own refusal: the presets and the naming rule, not every one of
            # the compositions (over a hundred names)
            try:
                get_strategy(name.strip())
            except StrategyError as e:
                raise PlanError(
                    f"{e} (in --strategies {c.strategies!r}, a comma-separated list)"
                ) from None
    check_output_paths({"--json": c.json, "--png": c.png, "--report": c.report})


def plan_command(c: PlanConfig) -> int:

    if c.program is None and (c.rules or c.rule_set or c.axes or c.meshes or c.axis_types):
        raise UsageError(
            f"{PROG} plan: --rules, --rule-set, --axes, --meshes and --axis-types plan your "
            f"own program; "
            f"give --program FILE.py:FUNCTION (the built-in model runs on Auto axes)"
        )
    if c.program is not None:
        return _cmd_plan_program(c, c.program)
    if c.serve:
        return _cmd_serve(c)
    serving = [c.flags.options[k] for k in SERVE_OPTIONS if getattr(c, k) is not None]
    if serving:
        one = len(serving) == 1
        raise UsageError(
            f"{PROG} plan: {', '.join(serving)} {'describes' if one else 'describe'} serving; "
            f"give --serve with {'it' if one else 'them'}"
        )
    return run_plan_command(
        c.request(),
        json_path=c.json,
        png_path=c.png,
        report_path=c.report,
        top=c.top,
        flags=c.flags,
        verbose=c.verbose,
    )


#: The options of ``plan --serve`` that planning training does not read.
SERVE_OPTIONS = tuple(
    f.name for f in fields(ServeRequest) if knob_of(f) and f.name not in PLAN_FIELDS
)


#: What ``plan --serve`` reads (the rest of ``plan``'s options plan training).
_SERVE_READS = frozenset(
    {"flags", "model", "devices", "hardware", "batch", "compiler", "top", "json", "png"}
    | {"verbose"}
    | {"serve", "imbalance", "dispatch_once", "weight_activations", *SERVE_OPTIONS}
    | {f.name for f in fields(HardwareOptions)}
)


def _cmd_serve(c: PlanConfig) -> int:
    """``plan --serve``: what ``shardscope serve`` does, with ``plan``'s options."""
    missing = [f"--{k}" for k in ("prompt", "output") if getattr(c, k) is None]
    if c.model is None or missing:
        need = ([] if c.model is not None else ["--model"]) + missing
        raise UsageError(f"{PROG} plan --serve: give {', '.join(need)}")
    training = [
        f.name for f in fields(c) if f.name not in _SERVE_READS and getattr(c, f.name) is not None
    ]
    if training:
        raise UsageError(
            f"{PROG} plan --serve: these options plan training, not serving"
            f"{c.flags(training)}; drop them (serving plans every layout of the devices)"
        )
    return run_serve_command(
        c.serve_request(), top=c.top, json_path=c.json, png_path=c.png, verbose=c.verbose
    )


def _cmd_plan_program(c: PlanConfig, program: str) -> int:

    model_flags = [f"--{k.replace('_', '-')}" for k, v in c.dims.items() if v is not None]
    model_flags += [
        flag
        for flag, value in (
            ("--model", c.model),
            ("--batch", c.batch),
            ("--seq", c.seq),
            ("--strategies", c.strategies),
            ("--mesh", c.mesh),
            ("--matmul-dtype", c.matmul_dtype),
            ("--fp8-saved-inputs", c.fp8_saved_inputs),
            ("--fp8-params", c.fp8_params),
        )
        if value is not None
    ]
    if model_flags:
        one = len(model_flags) == 1
        instead = ""
        if c.mesh is not None:  # the one with a twin: the meshes a program is planned on
            instead = f"; to plan your program on mesh {c.mesh}, give --meshes {c.mesh} instead"
        raise UsageError(
            f"{PROG} plan: {', '.join(model_flags)} {'describes' if one else 'describe'} the "
            f"built-in model; with --program your make_step builds the model (drop "
            f"{'it' if one else 'them'}){instead}"
        )
    # Without --hardware a program is timed on the built-in model's default hardware too.
    hardware = c.hardware or str(DEFAULT_REQUEST.hardware)
    target = None if c.compiler in (None, "cpu") else c.compiler
    if target is not None and target != hardware:
        raise UsageError(
            f"{PROG} plan: --compiler {target} compiles for {target} but the estimates use "
            f"--hardware {hardware}; give --hardware {target}"
        )
    return run_plan_program(
        program,
        c.devices,
        target=target,
        rules_path=c.rules,
        rule_set=c.rule_set,
        axes=_names(c.axes, "--axes"),
        meshes=c.meshes.split(";") if c.meshes else None,
        axis_types=c.axis_types,
        hardware=hardware,
        hardware_overrides=c.hardware_overrides,
        json_path=c.json,
        png_path=c.png,
        report_path=c.report,
        top=c.top,
        flags=c.flags,
        verbose=c.verbose,
    )


def _names(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(n.isidentifier() for n in names):
        raise UsageError(f"{PROG} plan: {flag} {text!r}: write axis names, e.g. data,model")
    return names


def run_plan_program(
    ref: str,
    devices: int,
    *,
    rules_path: str | None = None,
    rule_set: str | None = None,
    axes: Sequence[str] | None = None,
    meshes: Sequence[str] | None = None,
    hardware: str = "h100",
    hardware_overrides: Any = None,
    json_path: str | None = None,
    png_path: str | None = None,
    report_path: str | None = None,
    top: int | None = None,
    console: Any = None,
    target: str | None = None,
    axis_types: str | None = None,
    flags: Flags = NO_FLAGS,
    verbose: bool = False,
) -> int:
    """Plans ``make_step`` from ``FILE.py:FUNCTION`` on ``devices`` (simulated CPU devices, or
    ``target``'s compile-only devices and compiler); prints, writes the files.

    Rules come from ``rules_path`` (JSON, see :func:`load_rules_file`), else the module's
    ``RULES`` if it defines one, else the program is planned as written over ``axes``;
    ``rule_set`` keeps one of them.
    ``flags`` names the options of the command line after the notes that suggest a change;
    ``verbose`` prints everything (else the answer on one screen, as :func:`run_plan_command`).
    """

    check_program_devices(devices)
    for path in (json_path, png_path, report_path):
        if path is not None:
            check_file_path(path)
    if rules_path is not None:
        load_rules_file(rules_path)  # refused before the program runs, when it cannot be read
    if target is None:
        simulate_devices(devices)
    make_step = load_program(ref)
    if console is None:
        console = output_console(piped_width=150)
    result = plan_program(
        make_step,
        devices,
        rules=rules_path,
        rule_set=rule_set,
        axes=axes,
        meshes=meshes,
        hardware=hardware,
        hardware_overrides=hardware_overrides,
        target=target,
        axis_types=axis_types,
        name=ref,
    )
    if json_path != STDOUT:
        render_program_plan(result, console=console, top=top, flags=flags, verbose=verbose)
        if not verbose:
            print_more(console, report=True)
    written = write_plan_files(
        result,
        program_markdown_report,
        json_path=json_path,
        png_path=png_path,
        report_path=report_path,
    )
    if json_path != STDOUT:
        print_written(console, written)
    if not result.plans:
        raise no_plan_error(result.empty_reason)
    return 0
