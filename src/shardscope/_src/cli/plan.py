"""``shardscope plan``: the CLI's work as one library function (argparse lives in cli/main.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardscope._src.base.deviceless import compiler_installed
from shardscope._src.base.devices import backends_started, use_cpu_devices
from shardscope._src.base.errors import PlanError
from shardscope._src.base.io import STDOUT, check_output_paths, write_atomic, write_result
from shardscope._src.base.notes import Note
from shardscope._src.base.targets import TARGETS
from shardscope._src.cli.args import NO_FLAGS, Flags
from shardscope._src.plan.sweep import MAX_DEVICES, plan
from shardscope._src.render.console import output_console
from shardscope._src.render.plan import markdown_report, render_plan
from shardscope._src.render.plan_plot import plot_plans


def _ensure_devices(devices: int) -> None:
    """Simulates ``devices`` CPU devices when JAX has not started (for in-process compiles)."""

    if not backends_started():
        use_cpu_devices(devices)


def run_plan_command(
    *,
    model: str | None,
    devices: int,
    dims: Mapping[str, int | None] | None = None,
    batch: int | None = None,
    seq: int | None = None,
    mode: str = "train",
    hardware: str = "h100",
    hardware_overrides: Mapping[str, float] | None = None,
    strategies: Sequence[str] | None = None,
    bytes_per_param: int = 16,
    flash_attention: bool = True,
    remat: Sequence[str] | None = None,
    microbatches: int | None = None,
    stages: int | None = None,
    compile_top: int = 3,
    workers: int | None = None,
    json_path: str | None = None,
    png_path: str | None = None,
    report_path: str | None = None,
    top: int | None = None,
    console: Any = None,
    progress_console: Any = None,
    compiler: str | None = None,
    target_plans: int = 3,
    flags: Flags = NO_FLAGS,
) -> int:
    """Plans, prints the ranked table, writes the requested files; returns 0.

    Args:
        model: a preset name, or None with ``dims`` (``d_model``, ``heads``, ``ff``,
            ``layers``, ``vocab``) giving the shape; dims also override a preset.
        devices: accelerators to plan for.
        compiler: ``"cpu"``, or the hardware's own target whose compiler compiles the
            ``target_plans`` leading plans after the CPU screening; None: the hardware's own
            when the hardware is a target (every preset is), else ``"cpu"``.
        json_path, png_path, report_path: where to write ``PlanResult.to_dict()``, the
            memory-vs-communication chart and the Markdown report (each atomically).
        console: a rich Console for the tables (default stdout); ``progress_console`` for
            the progress bar (default stderr).
        flags: the flags of the command line that asked, named after the notes that
            suggest a change.
        Other arguments as :func:`shardscope.plan`.

    Raises:
        PlanError: no plan at all (after printing what was skipped and writing the files),
            an unknown preset or a bad setting; the CLI prints it as one line, exit 2.
    """
    check_device_count(devices)
    # before minutes of compiling, not after
    check_output_paths({"--json": json_path, "--png": png_path, "--report": report_path})
    _ensure_devices(devices)
    if console is None:
        # the plan table is the widest; JSON on standard output sends the tables to stderr
        console = output_console(piped_width=150, stderr=json_path == STDOUT)
    with _compile_progress(progress_console) as progress:
        result = plan(
            model,
            devices,
            batch=batch,
            seq=seq,
            mode=mode,
            hardware=hardware,
            hardware_overrides=hardware_overrides,
            strategies=strategies,
            bytes_per_param=bytes_per_param,
            flash_attention=flash_attention,
            remat=remat,
            microbatches=microbatches,
            stages=stages,
            compile_top=compile_top,
            workers=workers,
            progress=progress,
            compiler=_default_compiler(hardware) if compiler is None else compiler,
            target_plans=target_plans,
            **dict(dims or {}),
        )
    render_plan(result, console=console, top=top, empty_reason=False, flags=flags)
    backend = "cpu" if result.compiler == "cpu" else TARGETS[result.compiler].family
    written = write_plan_files(
        result,
        markdown_report,
        backend,
        json_path=json_path,
        png_path=png_path,
        report_path=report_path,
    )
    print_written(console, written)
    if not result.plans:
        raise no_plan_error(result.empty_reason)
    return 0


def check_device_count(devices: int) -> None:
    """Refuses more devices than the CPU backend compiles for."""
    if devices > MAX_DEVICES:
        raise PlanError(
            f"--devices {devices}: the CPU backend compiles for at most {MAX_DEVICES} "
            f"simulated devices; plan {MAX_DEVICES} or fewer"
        )


def print_written(console: Any, paths: Sequence[Path | None]) -> None:
    """``wrote PATH`` for each file written (None: the JSON went to standard output)."""
    for path in paths:
        if path is not None:
            console.print(f"wrote {path}", highlight=False)


@contextmanager
def _compile_progress(console: Any = None) -> Iterator[Callable[[int, int, str], None]]:
    """A progress callback for the planner, drawing a bar on ``console`` (default stderr)
    from the first plan it compiles; no bar in logs and pipes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar_console = console or Console(stderr=True)
    bar = Progress(
        TextColumn("compiling plans"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        console=bar_console,
        transient=True,
        disable=not bar_console.is_terminal,
    )
    task = None

    def progress(done: int, total: int, label: str) -> None:
        nonlocal task
        if total == 0:
            return
        if task is None:
            bar.start()
            task = bar.add_task("", total=total)
        bar.update(task, completed=done, description=label)

    try:
        yield progress
    finally:
        if task is not None:
            bar.stop()


def write_plan_files(
    result: Any,
    report: Callable[[Any], str],
    backend: str,
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
        written.append(write_result(json_path, result.to_dict(), backend=backend))
    if png_path:
        written.append(plot_plans(result, png_path))
    if report_path:
        text = report(result)
        written.append(write_atomic(report_path, lambda f: f.write(text)))
    return written


def _default_compiler(hardware: str) -> str:
    """The hardware preset's own compiler (``plan --hardware h100`` compiles for H100s) when
    it is installed; else the CPU backend alone, and the plan's notes say how to add it."""

    name = str(hardware).lower()
    if name in TARGETS and compiler_installed(name):
        return name
    return "cpu"


def no_plan_error(why: Note | None) -> PlanError:
    """The error a command that found no plan exits with, naming what would change that."""
    if why is None:
        return PlanError("no plan")
    return PlanError(str(why), param=why.params)
