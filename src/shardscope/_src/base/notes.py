"""Notes: what a result wants its reader to know, as a kind and its values.

Code reads a note's :attr:`~Note.kind` (a member of the enum of the result that makes it:
``VerdictNote``, ``BoundNote``, ``PlanNote``); people read its :attr:`~Note.text`, which the
kind writes from the values when shown. Where a note suggests a change, :attr:`Note.params`
names the library parameters that make it, so that the command line can name its flags.

>>> class Weather(NoteKind):
...     RAIN = "rain"
...
...     def describe(self, values):
...         return f"{values['mm']} mm of rain"
>>> note = Note(Weather.RAIN, {"mm": 3})
>>> note.kind is Weather.RAIN, str(note)
(True, '3 mm of rain')
>>> note.to_dict()
{'kind': 'rain', 'text': '3 mm of rain', 'values': {'mm': 3}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardscope._src.base.records import json_value


class NoteKind(StrEnum):
    """The kinds of note one result makes; each member writes its note's text."""

    def describe(self, values: Mapping[str, Any]) -> str:
        raise NotImplementedError(f"{type(self).__name__}.describe")


@dataclass(frozen=True)
class Note:
    """A note: its ``kind``, the ``values`` its text is written from, and the ``params`` (library
    parameter names) that change what it reports."""

    kind: NoteKind
    values: Mapping[str, Any] = field(default_factory=dict, hash=False)
    params: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return self.kind.describe(self.values)

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind.value, "text": self.text, "values": json_value(self.values)}
        if self.params:
            out["params"] = list(self.params)
        return out
