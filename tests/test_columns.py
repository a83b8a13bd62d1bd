"""One column spec drawn three ways: the rich table, the Markdown table and the plain text of
the same columns. No devices needed."""

from shardscope._src.render.columns import (
    Alarm,
    Column,
    markdown_table,
    rich_cells,
    rich_table,
    text_table,
)

ROWS = [
    {"name": "a|b", "mesh": "data=8", "fits": True, "why": "line\nbreak"},
    {"name": "c", "mesh": "model=8", "fits": False, "why": ""},
]
COLUMNS = (
    Column("name", lambda r: r["name"], no_wrap=True),
    Column("mesh", lambda r: r["mesh"], code=True),
    Column("fits", lambda r: "yes" if r["fits"] else Alarm("no"), justify="right"),
    Column("terminal", lambda r: "t", only="rich"),
    Column("why", lambda r: r["why"], markdown="why not", fold=True),
    Column("md", lambda r: "m", only="markdown"),
)


def test_markdown_shows_its_columns_with_code_alarms_and_escapes():
    assert markdown_table(COLUMNS, ROWS) == [
        "| name | mesh | fits | why not | md |",
        "|---|---|---|---|---|",
        "| a\\|b | `data=8` | yes | line break | m |",
        "| c | `model=8` | **no** |  | m |",
    ]


def test_rich_shows_its_columns_laid_out_as_specified():
    table = rich_table(COLUMNS, ROWS, title="plans")
    cols = table.columns
    assert [c.header for c in cols] == ["name", "mesh", "fits", "terminal", "why"]
    assert [c.justify for c in cols] == ["left", "left", "right", "left", "left"]
    assert [c.no_wrap for c in cols] == [True, False, False, False, False]
    assert [c.overflow for c in cols] == ["ellipsis", "ellipsis", "ellipsis", "ellipsis", "fold"]
    # Markdown's code marks stay out of the terminal; an alarm is red there.
    assert list(cols[1].cells) == ["data=8", "model=8"]
    assert list(cols[2].cells) == ["yes", "[red]no[/red]"]
    assert (table.title, table.title_justify, table.pad_edge) == ("plans", "left", False)


def test_a_column_reads_its_row_from_a_larger_one():
    name = COLUMNS[0].on(lambda pair: pair[1])
    assert rich_cells([name], ("label", ROWS[1])) == ["c"]
    assert markdown_table([COLUMNS[2].on(lambda pair: pair[1])], [("x", ROWS[1])])[2] == (
        "| **no** |"
    )


def test_plain_text_shows_the_terminals_columns_aligned_without_trailing_spaces():
    rows = [{"name": "c", "n": "7"}, {"name": "longer", "n": "1234"}]
    columns = (
        Column("name", lambda r: r["name"]),
        Column("n", lambda r: r["n"], justify="right"),
        Column("md", lambda r: "m", only="markdown"),
        Column("", lambda r: "<- this" if r["name"] == "c" else ""),
    )
    assert text_table(columns, rows, indent="> ") == [
        "> name       n",
        "> c          7  <- this",
        "> longer  1234",
    ]
