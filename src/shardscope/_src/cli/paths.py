"""The command line's checks of its result paths, made before any work is done."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardscope._src.base.atomic import refuse_non_file
from shardscope._src.base.errors import OutputPathError
from shardscope._src.base.records import STDOUT

#: A file name of the kind each result flag writes, for its errors (default ``out.json``).
_EXAMPLES = {"--png": "out.png", "--report": "report.md"}


def check_file_path(path: str | os.PathLike[str], example: str = "out.json") -> Path:
    """Refuses a result file path that cannot be a file, or whose nearest existing folder
    cannot be written (``example``: a file name of the result's kind, for the error)."""
    p = refuse_non_file(path, example)
    for parent in p.parents:
        if parent.exists():
            try:  # the one sure test of writability is writing
                fd, probe = tempfile.mkstemp(prefix=".shardscope-probe-", dir=parent)
                os.close(fd)
                os.unlink(probe)
            except OSError as e:
                reason = e.strerror or str(e) or type(e).__name__
                raise OutputPathError(
                    f"cannot write {str(p)!r}: {reason}; choose a path in a folder you can write to"
                ) from None
            break
    return p


def check_output_paths(
    paths: Mapping[str, str | os.PathLike[str] | None],
    inputs: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Refuses result files (``{flag: path}``, None: not asked for) that cannot be written,
    two results asked for in one file (one would overwrite the other), and a result over one
    of the ``inputs`` it is made from."""
    read = {os.path.realpath(p): f for f, p in (inputs or {}).items() if p is not None}
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if path is None or os.fspath(path) == STDOUT:
            continue
        check_file_path(path, _EXAMPLES.get(flag, "out.json"))
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


def check_dir_path(path: str | os.PathLike[str], *, writes: str) -> Path:
    """Refuses a result folder that cannot be made or written; ``writes`` names a file the
    command writes there (the errors name it)."""
    if not str(path).strip():
        raise OutputPathError(
            "the output folder is empty; give a folder, e.g. 'scores'", param="out_dir"
        )
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{str(p)!r} is a file, not a folder; give a folder for results")
    check_file_path(p / writes)
    return p


def print_written(console: Any, paths: Sequence[Path | None]) -> None:
    """``wrote PATH`` for each file written (None: the JSON went to standard output)."""
    for path in paths:
        if path is not None:
            console.print(f"wrote {path}", highlight=False)
