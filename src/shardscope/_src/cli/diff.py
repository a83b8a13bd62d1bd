"""``shardscope diff OLD.json NEW.json``: the comparison of two audits as library calls (its
options are in parsers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardscope._src.audit.diff import diff_audits
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.config import DiffConfig
from shardscope._src.cli.paths import check_output_paths
from shardscope._src.render.console import natural_width, output_console
from shardscope._src.render.diff import diff_table, render_diff

#: What ``diff`` says when it is given no budget: it exits 0 whatever changed.
NO_BUDGET = "no budget: exit 0 whatever changed; --max-bytes-increase or --no-new set one"


def check_diff(c: DiffConfig) -> None:

    check_output_paths({"--json": c.json}, {"OLD.json": c.old, "NEW.json": c.new})


def diff_command(c: DiffConfig) -> int:

    return run_diff(
        c.old,
        c.new,
        max_bytes_increase=c.max_bytes_increase,
        no_new=c.no_new,
        json_path=c.json,
        by_scope=c.by_scope,
    )


def run_diff(
    old: str,
    new: str,
    *,
    max_bytes_increase: str | None = None,
    no_new: Sequence[str] = (),
    json_path: str | None = None,
    console: Any = None,
    by_scope: bool = False,
) -> int:
    """Prints how the collectives changed; 1 when a budget is broken, else 0 (without a
    budget it only reports, and says so)."""

    d = diff_audits(
        old, new, max_bytes_increase=max_bytes_increase, no_new=no_new, by_scope=by_scope
    )
    if json_path != STDOUT:
        if console is None:  # piped (a CI log), as wide as the table's cells need
            least = natural_width(diff_table(d), least=80) if d.changed else 80
            console = output_console(piped_width=least)
        render_diff(d, console=console)
        if max_bytes_increase is None and not no_new:
            console.print(NO_BUDGET, highlight=False, markup=False, soft_wrap=True)
    if json_path is not None:
        write_result(json_path, d)
    return 0 if d.ok else 1
