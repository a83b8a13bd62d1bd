"""Closed vocabularies whose members are their JSON strings.

A member of a :class:`Vocab` *is* its string: it compares and hashes equal to it, formats as
it, and prints as it (``repr``), so a record, tuple or dict that holds members reads the same
as one that holds the plain strings, and the JSON writes the strings. Functions keep accepting
the plain strings; :meth:`Vocab.parse` turns one into a member or names the choices.

>>> class Colour(Vocab):
...     RED = "red"
...     BLUE = "blue"
>>> Colour.RED == "red", f"{Colour.BLUE}", [Colour.RED], Colour.choices()
(True, 'blue', ['red'], 'red, blue')
>>> Colour.parse("blue") is Colour.BLUE
True
>>> Colour.parse("green", what="colour")
Traceback (most recent call last):
...
shardscope._src.base.errors.ShardscopeError: colour 'green': choose one of red, blue
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from shardscope._src.base.errors import ShardscopeError


class Vocab(StrEnum):
    """A closed set of names (see the module docstring)."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def choices(cls) -> str:
        """The members' strings, comma-separated, in definition order."""
        return ", ".join(m.value for m in cls)

    @classmethod
    def get(cls, value: object) -> Self | None:
        """The member equal to ``value`` (a member or its string), else None."""
        if isinstance(value, cls):  # a member is the one equal to it
            return value
        for m in cls:
            if value == m.value:
                return m
        return None

    @classmethod
    def parse(
        cls,
        value: object,
        *,
        what: str | None = None,
        error: type[ShardscopeError] = ShardscopeError,
        param: str | tuple[str, ...] = (),
    ) -> Self:
        """The member equal to ``value``; else ``error`` naming ``what`` (the parameter), the
        value and the choices."""
        member = cls.get(value)
        if member is None:
            raise error(
                f"{what or cls.__name__} {value!r}: choose one of {cls.choices()}", param=param
            )
        return member
