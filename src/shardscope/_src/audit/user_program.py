"""A user's program from a file: ``FILE.py:FUNCTION``, what ``shardscope audit`` and ``plan
--program`` take, its file run as a module and the function looked up in it."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from shardscope._src.base.errors import ProgramError, ShardscopeError


def check_program_ref(ref: str) -> tuple[str, str]:
    """``(file, function)`` of ``"path/to/file.py:make_step"``, refused if the file does not
    exist or the function is no Python name (nothing is run)."""

    path, sep, attr = str(ref).rpartition(":")
    if not sep or not path or not attr:
        raise ProgramError(f"program {ref!r}: write FILE.py:FUNCTION, e.g. train.py:make_step")
    if not os.path.isfile(path):
        raise ProgramError(f"program file {path!r} does not exist")
    if not attr.isidentifier():
        raise ProgramError(f"program {ref!r}: {attr!r} is not a Python name")
    return path, attr


def load_program(ref: str) -> Callable[..., Any]:
    """The function named by ``"path/to/file.py:make_step"``, its file run as a module.

    The file's folder goes first on ``sys.path``, so the file may import its neighbours.
    """

    path, attr = check_program_ref(ref)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0] or "program"
    name = stem
    if not stem.isidentifier() or stem in sys.modules:
        name = f"_shardscope_program_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProgramError(f"program file {path!r} cannot be loaded as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ShardscopeError:
        raise
    except Exception as e:
        del sys.modules[name]
        first = str(e).strip().splitlines()
        raise ProgramError(
            f"running {path!r} raised {type(e).__name__}: {first[0] if first else ''}"
        ) from e
    fn: object = getattr(module, attr, None)
    if fn is None:
        names = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == name
        )
        raise ProgramError(
            f"{path!r} defines no {attr!r}"
            + (f"; its functions are {', '.join(names)}" if names else "")
        )
    if not callable(fn):
        raise ProgramError(f"{path}:{attr} is a {type(fn).__name__}, not a function")
    return fn
