"""Command-line options generated from a request type's fields (:mod:`~shardscope._src.base.knobs`):
each knob's option, its help and the default the help names, written once in the request.

An option keeps no default of its own: not given, its ``dest`` is None and the request's default
applies; :func:`given` collects what the command line set.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from shardscope._src.base.knobs import REQUIRED, Kind, Knob, knob_of
from shardscope._src.cli.args import (
    choice_reader,
    fraction,
    nonnegative_int,
    positive_float,
    positive_int,
    positive_number,
)

#: How the command line reads each kind of value.
_READERS: Mapping[Kind, Callable[[str], Any]] = {
    Kind.COUNT: positive_int,
    Kind.WHOLE: nonnegative_int,
    Kind.NUMBER: positive_number,
    Kind.FRACTION: fraction,
    Kind.SECONDS: positive_float,
}


def _help(spec: Knob, f: dataclasses.Field[Any], required: bool) -> str:
    """The option's help, ending with the default where the field has one."""
    if required:
        return spec.help
    if spec.default_text is not None:
        return f"{spec.help} (default: {spec.default_text})"
    if f.default is None or f.default is REQUIRED:
        return spec.help
    if spec.kind is Kind.SWITCH:
        on = spec.option(f.name)
        return f"{spec.help} (default {on if f.default else on.replace('--', '--no-', 1)})"
    return f"{spec.help} (default {f.default})"


def add_request_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    request: type[Any],
    *,
    skip: Collection[str] = (),
    required: Collection[str] = (),
    suffix: str = "",
) -> None:
    """Adds an option for each knob of the dataclass ``request`` but those in ``skip``;
    those in ``required`` must be given; ``suffix`` ends each help (``" (--serve)"``)."""
    for f in dataclasses.fields(request):
        spec = knob_of(f)
        if spec is None or f.name in skip:
            continue
        must = f.name in required
        kwargs: dict[str, Any] = {"dest": f.name, "help": _help(spec, f, must) + suffix}
        if spec.kind is Kind.SWITCH:
            kwargs.update(action=argparse.BooleanOptionalAction, default=None)
        else:
            kwargs.update(metavar=spec.metavar)
            if spec.kind is Kind.CHOICE:
                kwargs.update(choices=list(spec.choices), metavar=None)
                kwargs.update(type=choice_reader(spec.choices))
            elif spec.kind in _READERS:
                kwargs.update(type=_READERS[spec.kind])
        if must:
            kwargs.update(required=True)
        parser.add_argument(spec.option(f.name), **kwargs)


def given(config: Any, request: type[Any], *, skip: Collection[str] = ()) -> dict[str, Any]:
    """The knobs of ``request`` that the command's record ``config`` holds a value for (an
    attribute of the field's name that is not None), but those in ``skip``."""
    out = {}
    for f in dataclasses.fields(request):
        if knob_of(f) is None or f.name in skip:
            continue
        value = getattr(config, f.name, None)
        if value is not None:
            out[f.name] = value
    return out


# -- what the terminal shows ---------------------------------------------------------------------

#: The docs page of the models, with every constant and its source, as the repository names it.
MODELS_PAGE = "docs/models/models.md"


def add_verbose_option(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: the option of ``plan``, ``serve``, ``shard`` and ``audit`` that prints
    everything (the default fits the answer on one screen)."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print everything: every skipped candidate and its reason, every table and every "
        "note in full, the time model's constants and their sources (by default the answer "
        "fits one screen; the JSON and the report always hold everything)",
    )


def more_line(*, report: bool) -> str:
    """The default output's closing line: where the rest is (``report``: the command writes
    a Markdown report)."""
    files = "--report FILE, --json FILE" if report else "--json FILE"
    return f"more: --verbose, {files}; the models, their constants and sources: {MODELS_PAGE}"


def print_more(console: Any, *, report: bool) -> None:
    """Prints :func:`more_line` on ``console`` (a rich Console), as it is."""
    console.print(more_line(report=report), highlight=False, markup=False)


@contextmanager
def compile_progress(console: Any = None) -> Iterator[Callable[[int, int, str], None]]:
    """A progress callback for the planners (training and serving), drawing a bar on
    ``console`` (default stderr) from the first plan it compiles; no bar in logs and pipes."""
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
