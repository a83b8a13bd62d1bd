"""Atomic file writes: a result file is either the old one or the whole new one, never half."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib.metadata
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shardscope._src.base.errors import OutputPathError, ShardscopeError

# Temporary files carry their owner, so that the next write to their folder can tell one left
# by a killed run from one a running writer is still filling: ".out.json.shardscope-<host>-
# <pid>-<random>.tmp" beside a result, ".shardscope-probe-<host>-<pid>-<random>" from a
# writability probe. <host> is a short hash of the host name (the folder may be shared).
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_OURS = re.compile(
    r"\.(?:.+\.shardscope|shardscope-probe)-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[\w]+"
    r"(?:\.tmp)?",
    re.ASCII,
)
#: A temporary file of ours whose process is gone is removed once untouched this long (a
#: process of the same id in another container sharing the folder keeps writing it).
STALE_AFTER_S = 60.0
#: A temporary file of ours left by another host is removed once untouched this long.
STALE_ELSEWHERE_AFTER_S = 24 * 3600.0


def _owner() -> str:
    return f"{_HOST}-{os.getpid()}-"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, under another user
        return False
    return False


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Removes the temporary files of ours in ``folder`` that a killed run left: those whose
    process is gone (on this host) or that nobody touched for a day. Never one a running
    writer is filling. Returns what it removed."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _OURS.fullmatch(entry.name)
        if m is None or m.group("pid") == str(os.getpid()):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            idle = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        here = m.group("host") == _HOST
        if (here and idle >= STALE_AFTER_S and _process_gone(int(m.group("pid")))) or (
            idle >= STALE_ELSEWHERE_AFTER_S
        ):
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                pass  # another run removed it first, or it is not ours to remove
    return removed


def write_atomic(
    path: str | os.PathLike[str], write: Callable[[Any], None], *, binary: bool = False
) -> Path:
    """Calls ``write(fileobj)`` on a temporary file beside ``path``, then renames it into place.

    Temporary files that killed runs left in that folder are removed first
    (:func:`remove_stale_temporaries`). Raises :class:`OutputPathError` (naming the path) when
    the file cannot be written there.
    """
    path = check_file_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.shardscope-{_owner()}", suffix=".tmp", dir=path.parent
        )
    except OSError as e:
        raise _path_error(path, e) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(
            fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})
        ) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise _path_error(path, e) from None
        raise
    return path


def _path_error(path: Path, e: OSError) -> OutputPathError:
    reason = e.strerror or str(e) or type(e).__name__
    return OutputPathError(
        f"cannot write {str(path)!r}: {reason}; choose a path in a folder you can write to"
    )


def check_file_path(path: str | os.PathLike[str]) -> Path:
    """Refuses, before any work is done, a result file path that cannot be a file."""
    if not str(path).strip():
        raise OutputPathError("the output file path is empty; give a file name, e.g. out.json")
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(
            f"{str(p)!r} is a folder, not a file; give a file name, e.g. {str(p / 'out.json')!r}"
        )
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(
                    f"cannot write {str(p)!r}: {str(parent)!r} is a file, not a folder"
                )
            try:  # the one sure test of writability is writing
                fd, probe = tempfile.mkstemp(prefix=f".shardscope-probe-{_owner()}", dir=parent)
                os.close(fd)
                os.unlink(probe)
            except OSError as e:
                raise _path_error(p, e) from None
            break
    return p


def check_output_paths(
    paths: Mapping[str, str | os.PathLike[str] | None],
    inputs: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Refuses, before any work is done, result files (``{flag: path}``, None: not asked for)
    that cannot be written, two results asked for in one file (one would overwrite the
    other), and a result over one of the ``inputs`` it is made from."""
    read = {os.path.realpath(p): f for f, p in (inputs or {}).items() if p is not None}
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if path is None or os.fspath(path) == STDOUT:
            continue
        check_file_path(path)
        key = os.path.realpath(path)
        if key in read:
            raise OutputPathError(
                f"{flag} {os.fspath(path)!r} would overwrite the input {read[key]}; write the "
                f"result to another file"
            )
        if key in seen:
            raise OutputPathError(
                f"{seen[key]} and {flag} both write {os.fspath(path)!r}; give each result its "
                f"own file"
            )
        seen[key] = flag


def check_dir_path(path: str | os.PathLike[str]) -> Path:
    """Refuses, before any work is done, a result folder that cannot be made or written."""
    if not str(path).strip():
        raise OutputPathError(
            "the output folder is empty; give a folder, e.g. 'scores'", param="out_dir"
        )
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{str(p)!r} is a file, not a folder; give a folder for results")
    check_file_path(p / "results.json")
    return p


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


VERSION = _version("shardscope") or "0+unknown"
SCHEMA_VERSION = 2  # of every JSON result the command line writes; raised when a field changes
# 2: notes (and fit_note, empty_reason) are objects {"kind", "text", "values"[, "params"]}


def result_header(backend: str | None) -> dict[str, Any]:
    """What every JSON result starts with: its schema, the versions that made it and the
    backend it compiled for (``"cpu"``, ``"cuda"``, ``"tpu"``)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "shardscope_version": VERSION,
        "jax_version": _version("jax"),
        "jaxlib_version": _version("jaxlib"),
        "backend": backend,
    }


def json_value(value: Any) -> Any:
    """A record's value as JSON: records through their ``to_dict()`` (or :func:`record_dict`),
    tuples and lists as lists, mappings as dicts, enums as their value."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    return value


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


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Writes ``data`` as indented JSON, atomically. Values must already be JSON-ready."""

    def write(f: Any) -> None:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")

    return write_atomic(path, write)


STDOUT = "-"  # a result path that means standard output


def write_result(
    path: str | os.PathLike[str], data: dict[str, Any], *, backend: str | None
) -> Path | None:
    """Writes a result as JSON behind :func:`result_header`, atomically, or to standard output
    when ``path`` is ``"-"`` (then returns None)."""
    stamped = {**result_header(backend), **data}
    if os.fspath(path) == STDOUT:
        json.dump(stamped, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return None
    return write_json_atomic(path, stamped)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
