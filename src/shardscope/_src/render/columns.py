"""One column spec, three renderings: a table's columns are written once and drawn as a rich
table for the terminal, as a Markdown table for reports, and as plain text for messages.

A :class:`Column` names its header, how to read its cell from a row, and how the terminal lays
it out; a column that only one of the two renderings shows says which. A cell marked
:class:`Alarm` stands out (red in the terminal, bold in Markdown); a ``code`` column is set in
backticks in Markdown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

Row = TypeVar("Row")
Other = TypeVar("Other")
#: A column reads its rows: one that reads any plan reads the planner's plans too.
RowT_contra = TypeVar("RowT_contra", contravariant=True)


class Alarm(str):
    """A cell's text that must stand out: a plan that does not fit, for instance."""

    __slots__ = ()


@dataclass(frozen=True)
class Column(Generic[RowT_contra]):
    """One column of a table rendered both by rich and as Markdown.

    Attributes:
        header: the column's heading in the terminal (and in Markdown, unless ``markdown``).
        value: the cell's text for a row (an :class:`Alarm` to make it stand out).
        markdown: the Markdown heading where it differs from the terminal's.
        justify: the terminal's alignment of the cells.
        no_wrap: the terminal keeps each cell on one line.
        fold: the terminal folds a long cell over lines instead of cutting it short.
        code: Markdown sets the cells as code (mesh descriptions).
        only: ``"rich"`` or ``"markdown"`` for a column one rendering alone shows.
    """

    header: str
    value: Callable[[RowT_contra], str]
    markdown: str | None = None
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = False
    fold: bool = False
    code: bool = False
    only: Literal["rich", "markdown"] | None = None

    def on(self, part: Callable[[Other], RowT_contra]) -> Column[Other]:
        """The same column read from a larger row, of which ``part`` picks this column's row."""
        value = self.value

        def read(row: Other) -> str:
            return value(part(row))

        return Column(
            self.header,
            read,
            markdown=self.markdown,
            justify=self.justify,
            no_wrap=self.no_wrap,
            fold=self.fold,
            code=self.code,
            only=self.only,
        )


def rich_columns(columns: Iterable[Column[Row]]) -> list[Column[Row]]:
    return [c for c in columns if c.only != "markdown"]


def rich_cells(columns: Sequence[Column[Row]], row: Row) -> list[str]:
    """The terminal's cells of ``row`` (``columns`` as :func:`rich_columns` keeps them)."""
    return [_rich_text(c.value(row)) for c in columns]


def rich_table(columns: Iterable[Column[Row]], rows: Iterable[Row], **options: Any) -> Any:
    """A rich table of ``rows`` in the house's plain style (``options``: the title, caption and
    whatever else ``rich.table.Table`` takes)."""
    from rich import box
    from rich.table import Table

    shown = rich_columns(columns)
    options = {
        "title_justify": "left",
        "caption_justify": "left",
        "box": box.SIMPLE_HEAD,
        "pad_edge": False,
        **options,
    }
    table = Table(**options)
    for c in shown:
        table.add_column(
            c.header,
            justify=c.justify,
            no_wrap=c.no_wrap,
            overflow="fold" if c.fold else "ellipsis",
        )
    for row in rows:
        table.add_row(*rich_cells(shown, row))
    return table


def markdown_table(columns: Iterable[Column[Row]], rows: Iterable[Row]) -> list[str]:
    """The Markdown lines of a table of ``rows``."""
    shown = [c for c in columns if c.only != "rich"]
    return markdown_lines(
        [c.header if c.markdown is None else c.markdown for c in shown],
        [[_markdown_text(c.value(row), code=c.code) for c in shown] for row in rows],
    )


def markdown_lines(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table of text cells; ``|`` and line breaks in a cell are escaped."""

    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return out


def text_table(
    columns: Iterable[Column[Row]], rows: Iterable[Row], *, indent: str = "  "
) -> list[str]:
    """The plain-text lines of a table of ``rows`` (the terminal's columns, aligned as it
    aligns them, two spaces apart, no trailing spaces): for messages such as an
    ``AssertionError``'s, which no terminal draws."""
    shown = rich_columns(columns)
    cells = [[c.header for c in shown]] + [[str(c.value(row)) for c in shown] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(shown))]
    return [
        (
            indent
            + "  ".join(
                cell.rjust(w) if c.justify == "right" else cell.ljust(w)
                for c, cell, w in zip(shown, line, widths, strict=True)
            )
        ).rstrip()
        for line in cells
    ]


def _rich_text(text: str) -> str:
    return f"[red]{text}[/red]" if isinstance(text, Alarm) else text


def _markdown_text(text: str, *, code: bool) -> str:
    if isinstance(text, Alarm):
        return f"**{text}**"
    return f"`{text}`" if code else text
