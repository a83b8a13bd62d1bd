"""Atomic file writes: a result file is either the old one or the whole new one, never half."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(
    path: str | os.PathLike[str], write: Callable[[Any], None], *, binary: bool = False
) -> Path:
    """Calls ``write(fileobj)`` on a temporary file beside ``path``, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(
            fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})
        ) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Writes ``data`` as indented JSON, atomically. Values must already be JSON-ready."""

    def write(f: Any) -> None:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")

    return write_atomic(path, write)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text))
