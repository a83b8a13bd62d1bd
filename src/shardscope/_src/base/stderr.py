"""What C++ writes to file descriptor 2 (XLA and the accelerator plugins log there), captured
around a block and passed on afterwards."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


def _flush() -> None:
    with contextlib.suppress(AttributeError, ValueError):
        sys.stderr.flush()


@contextlib.contextmanager
def capture_stderr(drop: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """Collects what is written to file descriptor 2 inside the block; afterwards the list
    holds it as one string and it is written on to stderr, less the lines containing any of
    ``drop``. Without a file descriptor 2 (a daemon, say) nothing is captured."""
    out: list[str] = []
    _flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield out
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            lines = text.splitlines(keepends=True)
            kept = "".join(x for x in lines if not any(d in x for d in drop))
            if kept:
                os.write(2, kept.encode())
            out.append(text)
