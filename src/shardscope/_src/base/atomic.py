"""Atomic file writes: a result file is either the old one or the whole new one, never half."""

from __future__ import annotations

import errno
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from shardscope._src.base.errors import OutputPathError


def write_atomic(
    path: str | os.PathLike[str], write: Callable[[IO[Any]], object], *, binary: bool = False
) -> Path:
    """Calls ``write(fileobj)`` on a temporary file beside ``path``, then renames it into place.

    On any failure the temporary file is removed and the file at ``path``, if there was one,
    is left as it was. Raises :class:`OutputPathError` (naming the path) when the file cannot
    be written there.
    """
    path = refuse_non_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temporary_beside(path)
    except OSError as e:
        raise _path_error(path, e) from None
    try:
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
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


def _temporary_beside(path: Path) -> tuple[int, Path]:
    """A new hidden file beside ``path``, open for writing: ``(fd, its path)``.

    It is created with mode 0666, as ``open()`` creates a file, so the umask alone decides
    its permissions (``tempfile.mkstemp`` would make it 0600, and a result is an ordinary
    file).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(path.parent))


def _path_error(path: Path, e: OSError) -> OutputPathError:
    reason = e.strerror or str(e) or type(e).__name__
    return OutputPathError(
        f"cannot write {str(path)!r}: {reason}; choose a path in a folder you can write to"
    )


def refuse_non_file(path: str | os.PathLike[str], example: str = "out.json") -> Path:
    """``path`` as a :class:`~pathlib.Path`; an :class:`OutputPathError` when it is empty, a
    folder, or inside a file, so it cannot be a file (the error's ``example``: a file name of
    the kind the result is)."""
    if not str(path).strip():
        raise OutputPathError(f"the output file path is empty; give a file name, e.g. {example}")
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(
            f"{str(p)!r} is a folder, not a file; give a file name, e.g. {str(p / example)!r}"
        )
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(
                    f"cannot write {str(p)!r}: {str(parent)!r} is a file, not a folder"
                )
            break
    return p


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Writes ``data`` as indented JSON, atomically. Values must already be JSON-ready."""

    def write(f: IO[Any]) -> None:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")

    return write_atomic(path, write)
