"""Records as JSON: the one serializer the records share, its inverse for the records that are
read back, and the header every JSON result starts with."""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from shardscope._src.base.atomic import write_json_atomic
from shardscope._src.base.errors import RecordError, ShardscopeError


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


VERSION = _version("shardscope") or "0+unknown"
SCHEMA_VERSION = 4  # of every JSON result the command line writes; raised when a field changes
# 2: notes (and fit_note, empty_reason) are objects {"kind", "text", "values"[, "params"]}
# 3: a plan's step time is "step_time_s" (and "step_time_overlap_s"), not "est_step_time_s":
#    a compiled plan's step is not an estimate (``plan_step_time`` reads either)
# 4: a serving result's "backend" is the platform of the compiler that compiled its plans
#    ("gpu", "tpu"; null when none was), not "estimate" (``ServeResult.from_dict`` reads either)

STDOUT = "-"  # a result path that means standard output


def result_header(backend: str | None) -> dict[str, Any]:
    """What every JSON result starts with: its schema, the versions that made it and the
    platform the result's programs were compiled for (``"cpu"``, ``"gpu"`` or ``"tpu"``;
    None when it compiled nothing, as a diff of two files)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "shardscope_version": VERSION,
        "jax_version": _version("jax"),
        "jaxlib_version": _version("jaxlib"),
        "backend": backend,
    }


def json_value(value: Any, *, strict: bool = True) -> Any:
    """A record's value as JSON: records through their ``to_dict()`` (or :func:`record_dict`),
    tuples and lists as lists, mappings as dicts, enums as their value, NumPy scalars as the
    Python number they hold.

    ``strict=False`` is for free-form values (a check's details): a non-finite float and an
    object JSON has no form for become their text, where JSON output would refuse them.

    >>> json_value({"shape": (2, 3), "ok": True})
    {'shape': [2, 3], 'ok': True}
    >>> json_value({"ratio": float("inf"), "what": object}, strict=False)
    {'ratio': 'inf', 'what': "<class 'object'>"}
    """
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [json_value(v, strict=strict) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_value(v, strict=strict) for k, v in value.items()}
    if not isinstance(value, bool | int | float | str) and getattr(value, "shape", None) == ():
        value = value.item()  # a NumPy or JAX scalar
    if strict:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def record_dict(
    record: Any,
    *,
    keys: Mapping[str, str] | None = None,
    omit: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """A record (a dataclass) as JSON-ready plain data: its fields in order, less ``omit``,
    then the properties named in ``extra`` (a method among them is called with no
    arguments), each through :func:`json_value`. ``keys`` maps an attribute to its JSON key
    where the two differ. The one serialization the records share.

    >>> from shardscope._src.base.comm import Totals
    >>> record_dict(Totals(2, 64, 112))
    {'count': 2, 'payload_bytes': 64, 'traffic_bytes': 112}
    >>> record_dict(Totals(2, 64, 112), keys={"count": "n"}, omit=("payload_bytes",))
    {'n': 2, 'traffic_bytes': 112}
    """
    names = [f.name for f in dataclasses.fields(record) if f.name not in omit]
    out: dict[str, Any] = {}
    for name in names:
        out[(keys or {}).get(name, name)] = json_value(getattr(record, name))
    for name in extra:
        value = getattr(record, name)
        out[(keys or {}).get(name, name)] = json_value(value() if callable(value) else value)
    return out


class Record:
    """A frozen dataclass record whose ``to_dict()`` is :func:`record_dict`: JSON-ready
    plain data, its fields in order."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain data: the record's fields, in order."""
        return record_dict(self)


def field_of(data: Mapping[str, Any], key: str, what: str) -> Any:
    """``data[key]``; a :class:`RecordError` naming the record and the field when it is not
    there."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{what} must be a JSON object, got {type(data).__name__}")
    try:
        return data[key]
    except KeyError:
        raise RecordError(
            f"{what} has no {key!r} field (it has {', '.join(map(repr, data)) or 'none'}); "
            f"write it again with this shardscope"
        ) from None


def int_tuple(value: Any) -> tuple[int, ...]:
    """A JSON list of integers as a tuple."""
    return tuple(int(v) for v in value)


class Result(Protocol):
    """A record written as a JSON result: its data, and the platform its programs were
    compiled for (``"cpu"``, ``"gpu"``, ``"tpu"``; None when it compiled none)."""

    @property
    def backend(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


def write_result(
    path: str | os.PathLike[str], record: Result, *, leading: Mapping[str, Any] | None = None
) -> Path | None:
    """Writes ``record`` as JSON behind :func:`result_header` (with the record's
    ``backend``), atomically, or to standard output when ``path`` is ``"-"`` (then returns
    None). ``leading`` are fields placed before the record's own (what it was made from)."""
    stamped = {**result_header(record.backend), **(leading or {}), **record.to_dict()}
    if os.fspath(path) == STDOUT:
        json.dump(stamped, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return None
    return write_json_atomic(path, stamped)


def read_json(
    path: str | os.PathLike[str],
    what: str,
    error: type[ShardscopeError],
    *,
    hint: str = "",
) -> Any:
    """The JSON in the file at ``path``; an ``error`` naming the file as ``what`` (e.g.
    ``"rules file"``) when it is missing, unreadable or not JSON, with ``hint`` on the last."""
    name = repr(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{what} {name} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{what} {name} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        tail = f"; {hint}" if hint else ""
        raise error(f"{what} {name} is not JSON ({e}){tail}") from None
