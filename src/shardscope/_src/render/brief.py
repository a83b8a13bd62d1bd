"""The terminal's short answer: the lines a renderer prints in place of a long table or a
paragraph when it is not asked to be verbose (the command line's default; ``--verbose``, the
JSON and the reports keep everything).

A skipped candidate's reason is one line with the count and a few of the layouts; a note is
one line, cut after a whole word at the console's width, with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardscope._src.plan.types import skipped_by_reason

if TYPE_CHECKING:
    from shardscope._src.plan.types import Skipped

#: The layouts a skipped reason's line names before it counts the rest.
NAMED = 3


def skipped_lines(skipped: Sequence[Skipped], *, named: int = NAMED) -> list[str]:
    """One line a reason the candidates were skipped for: how many, and the first ``named``
    of them (``'skipped for divisibility: 21 (tp model=64, sp model=64, dp_tp
    data=4,model=16 and 18 more)'``)."""
    lines = []
    for reason, group in skipped_by_reason(skipped).items():
        names = ", ".join(f"{s.strategy} {s.mesh}" for s in group[:named])
        more = f" and {len(group) - named} more" if len(group) > named else ""
        lines.append(f"skipped for {reason}: {len(group)} ({names}{more})")
    return lines


def cut_line(text: str, width: int) -> str:
    """``text`` in ``width`` characters: whole where it fits, else cut after its last whole
    word that leaves room for an ellipsis (mid-word only where the first word is wider).

    >>> cut_line("the step is priced as compiled", 20)
    'the step is priced…'
    >>> cut_line("short", 20), cut_line("unbreakable", 5)
    ('short', 'unbr…')
    """
    if len(text) <= width:
        return text
    kept = text[: max(0, width - 1)]
    space = kept.rfind(" ")
    return (kept[:space].rstrip() if space > 0 else kept) + "…"


def print_line(console: Any, text: str, *, style: str | None = None) -> None:
    """Prints ``text`` on one line of ``console``, cut after a whole word with an ellipsis
    where it is wider (:func:`cut_line`); ``style`` colours it."""
    console.print(
        cut_line(text, console.width),
        style=style,
        no_wrap=True,
        overflow="ellipsis",
        highlight=False,
        markup=False,
    )
