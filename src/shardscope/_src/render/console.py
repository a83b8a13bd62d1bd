"""The rich consoles the renderers print to: stdout's, and a recording one for notebooks.
``rich`` is imported when one is made, so that ``import shardscope`` stays light."""

from __future__ import annotations

import io
from typing import Any

PIPED_WIDTH = 140  # piped or captured output has no terminal width to follow


def output_console(*, piped_width: int = PIPED_WIDTH, **kwargs: Any) -> Any:
    """A rich Console for stdout: the terminal's width, or ``piped_width`` columns in a log or
    pipe, so that wide tables stay readable rather than squeezed into 80 columns."""
    from rich.console import Console

    console = Console(**kwargs)
    if console.is_terminal or console.is_jupyter:
        return console
    return Console(**kwargs, width=piped_width)


def natural_width(renderable: Any, *, least: int = PIPED_WIDTH, most: int = 240) -> int:
    """The columns ``renderable`` takes unsqueezed, between ``least`` and ``most``: the width
    for a pipe or log, where no terminal says how wide to be and a table squeezed into fewer
    columns cuts its cells short."""
    from rich.console import Console

    wide = Console(width=10_000, file=io.StringIO())
    return max(least, min(most, wide.measure(renderable).maximum))


def _recorded(renderable: Any, width: int) -> Any:
    """A rich Console, ``width`` wide, that printed ``renderable`` to nothing and kept it."""
    from rich.console import Console

    rec = Console(width=width, record=True, file=io.StringIO(), force_jupyter=False)
    rec.print(renderable)
    return rec


def mimebundle_text(renderable: Any, width: int = 110) -> str:
    """Plain text of a rich renderable, as :func:`mimebundle` gives it."""
    text: str = _recorded(renderable, width).export_text(clear=False)
    return text


def mimebundle(renderable: Any, width: int = 110) -> dict[str, str]:
    """Plain text and HTML of a rich renderable, for notebooks' ``_repr_mimebundle_``."""
    rec = _recorded(renderable, width)
    return {
        "text/plain": rec.export_text(clear=False),
        "text/html": rec.export_html(inline_styles=True, code_format="<pre>{code}</pre>"),
    }
