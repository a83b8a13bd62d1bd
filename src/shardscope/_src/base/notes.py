"""Notes: what a result wants its reader to know, as a kind and its values.

Code reads a note's :attr:`~Note.kind` (a member of the enum of the result that makes it:
``VerdictNote``, ``BoundNote``, ``PlanNote``); people read its :attr:`~Note.text`, which the
kind writes from the values when shown. Where a note suggests a change, :attr:`Note.params`
names the library parameters that make it, so that the command line can name its flags.

A kind may give its values a record of their own (a :class:`NoteValues`, one per kind, read by
attribute): :meth:`NoteKind.values_of` makes it from their mapping, so a note is made from
either.

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

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self

from shardscope._src.base.records import json_value, record_dict


class NoteKind(StrEnum):
    """The kinds of note one result makes; each member writes its note's text."""

    def describe(self, values: Any) -> str:
        raise NotImplementedError(f"{type(self).__name__}.describe")

    @property
    def whole(self) -> bool:
        """Whether the short view prints this kind's notes whole rather than cut to a line:
        a note that reconciles two figures on the same screen (by default, none)."""
        return False

    def values_of(self, values: Any) -> Any:
        """``values`` as this kind's notes hold them: by default as given; a kind whose values
        have a record (:class:`NoteValues`) makes it from their mapping."""
        return values


@dataclass(frozen=True)
class NoteValues:
    """A note's values as a record of their own, one per kind: each field a value its words
    read. Its JSON is its fields in order, less those named in ``optional`` while they are
    None (values a kind has only sometimes). Read by key (``values["need"]``) it gives the
    JSON's value, as the mappings notes held before did.
    """

    #: The fields left out of the JSON while None.
    optional: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The record of ``data``, a mapping of its fields (as :meth:`to_dict` writes them)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise TypeError(
                f"{cls.__name__} has no field {', '.join(map(repr, unknown))} (its fields: "
                f"{', '.join(sorted(names)) or 'none'})"
            )
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out = record_dict(self)
        return {k: v for k, v in out.items() if not (k in self.optional and v is None)}

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]


@dataclass(frozen=True)
class Note:
    """A note: its ``kind``, the ``values`` its text is written from (the kind's
    :class:`NoteValues` where it has one, made from a mapping too), and the ``params``
    (library parameter names) that change what it reports."""

    kind: NoteKind
    values: Mapping[str, Any] | NoteValues = field(default_factory=dict, hash=False)
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", self.kind.values_of(self.values))

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
