"""A front door's knob, written once: its field in the request type, its default, and what the
command line says of it.

A request type (``PlanRequest``, ``ServeRequest``, ...) declares each knob with :func:`knob`;
the command line's options are generated from those fields (``cli/options.py``), so the
library and the shell cannot disagree on a name or a default.

>>> from dataclasses import dataclass, fields
>>> @dataclass(frozen=True)
... class Ask:
...     tokens: int = knob(8, "tokens to read", kind=Kind.COUNT)
>>> spec = knob_of(fields(Ask)[0])
>>> spec.kind, spec.option("tokens"), spec.help
('count', '--tokens', 'tokens to read')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardscope._src.base.vocab import Vocab


class Kind(Vocab):
    """What a knob's value is, as the command line reads it."""

    COUNT = "count"  # a positive whole number
    WHOLE = "whole"  # a whole number, 0 or more
    NUMBER = "number"  # a positive number
    FRACTION = "fraction"  # a number in (0, 1]
    SECONDS = "seconds"  # a positive number of seconds
    TEXT = "text"  # a word or a list the request parses
    CHOICE = "choice"  # one of ``choices``
    SWITCH = "switch"  # True, False or None (``--x`` / ``--no-x``)


@dataclass(frozen=True)
class Knob:
    """What the command line says of one request field.

    Attributes:
        help: the option's help; the field's default is appended to it where it has one.
        kind: how the command line reads the value.
        metavar: the value's placeholder in the help (default by ``kind``).
        flag: the option's name where it is not ``--`` + the field's name with dashes.
        choices: the values a ``Kind.CHOICE`` knob takes.
        default_text: the default as the help says it, where the field's own value does not
            say it (a default computed from other knobs).
    """

    help: str
    kind: Kind = Kind.TEXT
    metavar: str | None = None
    flag: str | None = None
    choices: tuple[str, ...] = ()
    default_text: str | None = None

    def option(self, name: str) -> str:
        """The option that sets the field ``name``."""
        return self.flag or "--" + name.replace("_", "-")


#: The default of a knob the caller must give.
REQUIRED: Any = dataclasses.MISSING


def knob(
    default: Any,
    help: str,
    *,
    kind: Kind = Kind.TEXT,
    metavar: str | None = None,
    flag: str | None = None,
    choices: Sequence[str] = (),
    default_text: str | None = None,
) -> Any:
    """A request field with ``default`` (:data:`REQUIRED`: none, the caller gives it) and what
    the command line says of it (:class:`Knob`)."""
    spec = Knob(help, kind, metavar, flag, tuple(choices), default_text)
    return dataclasses.field(default=default, metadata={"knob": spec})


def knob_of(f: dataclasses.Field[Any]) -> Knob | None:
    """The :class:`Knob` of a request field, or None (a field the command line does not set)."""
    spec = f.metadata.get("knob")
    return spec if isinstance(spec, Knob) else None
