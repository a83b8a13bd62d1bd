"""``shardscope serve`` (and ``plan --serve``): the serving plans of a built-in model, as the
library's :func:`~shardscope._src.serve.search.serve_request` makes them."""

from __future__ import annotations

from pathlib import Path

from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.config import ServeConfig
from shardscope._src.cli.options import compile_progress, print_more
from shardscope._src.cli.paths import check_output_paths, print_written
from shardscope._src.plan.request import ServeRequest


def check_serve(c: ServeConfig) -> None:
    """What ``serve`` refuses before it plans: the files it would write (the request refuses
    its knobs when it is made)."""
    check_output_paths({"--json": c.json, "--png": c.png})


def serve_command(c: ServeConfig) -> int:
    return run_serve_command(
        c.request(), top=c.top, json_path=c.json, png_path=c.png, verbose=c.verbose
    )


def run_serve_command(
    request: ServeRequest,
    *,
    top: int | None = None,
    json_path: str | None = None,
    png_path: str | None = None,
    verbose: bool = False,
) -> int:
    """Plans ``request``, prints the table and writes the files asked for; returns 0.
    ``verbose`` prints the caption that explains the columns (else the answer on one screen
    and a line saying where the rest is)."""
    from shardscope._src.render.brief import print_line
    from shardscope._src.render.console import natural_width, output_console
    from shardscope._src.render.serve import plot_serve, render_serve
    from shardscope._src.serve.search import serve_request

    with compile_progress() as progress:
        result = serve_request(request, progress)
    if verbose and top is None:  # everything: every plan that fits
        top = len(result.plans)
    # piped, the table is printed as wide as its cells need (the caption wraps to it); the
    # JSON written to standard output owns it, and the table goes to standard error
    width = natural_width(render_serve(result, top=top, caption=False), least=100)
    console = output_console(piped_width=width, stderr=json_path == STDOUT)
    console.print(render_serve(result, top=top, verbose=verbose))
    for note in result.notes:
        if verbose:
            console.print(f"note: {note}", highlight=False)
        else:
            print_line(console, f"note: {note}")
    if not verbose:
        print_more(console, report=False)
    written: list[Path | None] = []
    if json_path:
        written.append(write_result(json_path, result))
    if png_path:
        written.append(plot_serve(result, png_path))
    print_written(console, written)
    return 0
