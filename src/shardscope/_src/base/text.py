"""Meshes and PartitionSpecs as text, written one way everywhere (tables, errors, hints).

>>> format_mesh_spec({"dp": 2, "mp": 4})
'dp=2,mp=4'
>>> format_spec((None, ("dp", "mp")))
"P(None, ('dp', 'mp'))"
>>> format_spec_entries(("x", None))
'x,None'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def format_mesh_spec(axes: Mapping[str, int] | Iterable[tuple[str, int]]) -> str:
    """``{'dp': 2, 'mp': 4}`` (or its items) -> ``'dp=2,mp=4'``, the form ``--mesh`` takes."""
    pairs = axes.items() if isinstance(axes, Mapping) else axes
    return ",".join(f"{k}={v}" for k, v in pairs)


def format_spec(spec: Sequence[Any]) -> str:
    """A PartitionSpec (or its entries) as code: ``P(None, ('dp', 'mp'))``."""
    return "P(" + ", ".join(repr(tuple(e) if isinstance(e, list) else e) for e in spec) + ")"


def format_spec_entries(spec: Sequence[str | None]) -> str:
    """One axis name or ``None`` per dimension, the form ``--a-spec`` takes: ``'x,None'``."""
    return ",".join("None" if a is None else a for a in spec)


def and_list(words: Sequence[object]) -> str:
    """``"1, 2 and 4"``: ``words`` as a sentence lists them.

    >>> and_list(["remat"]), and_list(["remat", "mesh", "stages"])
    ('remat', 'remat, mesh and stages')
    """
    text = [str(w) for w in words]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"
