"""One column spec drawn two ways: the rich table and the Markdown table of the same columns.
No devices needed."""

from shardscope._src.render.columns import Alarm, Column, markdown_table, rich_cells, rich_table

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
