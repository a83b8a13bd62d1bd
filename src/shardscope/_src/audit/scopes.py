"""Module paths as named scopes, for the libraries that do not name their modules' ops.

Linen runs each module's methods under ``jax.named_scope`` of its path, so an audit reads a
collective's layer from its ``op_name`` (``Model/block_1/Dense_0``). Flax NNX names nothing,
and Equinox names its layers by class (``eqx.nn.Linear``), so every layer of an NNX
transformer, or every ``Linear`` of an Equinox MLP, reads as one. While shardscope traces a
program (:func:`module_scopes`), each NNX or Equinox module's ``__call__`` runs under the named
scope of its path from the module first called (``Model/blocks/0/attn``): the attribute names
and list indices that reach it (``nnx.iter_graph``; an Equinox module's fields). Only the
ops' names change; the program computes and sends what it did. A module the walk does not
reach (one rebuilt inside ``jax.lax.scan``, say) adds no scope of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax

#: How deep the walk of an Equinox module's fields goes.
_MAX_DEPTH = 64


def _nnx_paths(root: Any) -> dict[int, str]:
    nnx = sys.modules["flax.nnx"]
    return {
        id(node): "/".join(str(p) for p in path)
        for path, node in nnx.iter_graph(root)
        if path and isinstance(node, nnx.Module)
    }


def _eqx_paths(root: Any) -> dict[int, str]:
    eqx = sys.modules["equinox"]
    out: dict[int, str] = {}

    def walk(obj: Any, path: tuple[str, ...]) -> None:
        if len(path) > _MAX_DEPTH:
            return
        if isinstance(obj, eqx.Module):
            if id(obj) in out:
                return
            if path:
                out[id(obj)] = "/".join(path)
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name, None), (*path, f.name))
        elif isinstance(obj, list | tuple):
            for i, x in enumerate(obj):
                walk(x, (*path, str(i)))
        elif isinstance(obj, dict):
            for k, x in obj.items():
                walk(x, (*path, str(k)))

    walk(root, ())
    return out


def _subclasses(base: type) -> list[type]:
    seen: dict[type, None] = {}
    todo = [base]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in seen:
                seen[sub] = None
                todo.append(sub)
    return list(seen)


def _internal(cls: type) -> bool:
    """A library's own machinery that is a module too (Equinox's ``filter_jit`` wrapper, its
    transforms): not a layer, and never the root of the paths."""
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(("equinox._", "flax.nnx.transforms"))


class _Scopes:
    """The paths of the module tree being called, and the scopes entered so far."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.entered: list[str] = []  # full paths, outermost first ("" for the root)

    def scoped(self, call: Callable[..., Any], paths_of: Callable[[Any], dict[int, str]]) -> Any:
        def run(module: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.entered:  # the first module called: the root of the paths
                self.paths = paths_of(module)
                self.entered.append("")
                try:
                    with jax.named_scope(type(module).__name__):
                        return call(module, *args, **kwargs)
                finally:
                    self.entered.pop()
                    self.paths = {}
            path = self.paths.get(id(module))
            if path is None:
                return call(module, *args, **kwargs)
            parent = next((p for p in reversed(self.entered) if p), "")
            name = path[len(parent) + 1 :] if parent and path.startswith(parent + "/") else path
            self.entered.append(path)
            try:
                with jax.named_scope(name):
                    return call(module, *args, **kwargs)
            finally:
                self.entered.pop()

        with contextlib.suppress(AttributeError, TypeError):
            run = functools.wraps(call)(run)
        return run


@contextlib.contextmanager
def module_scopes() -> Iterator[None]:
    """Within the block, Flax NNX and Equinox modules (those of the libraries already
    imported) run their ``__call__`` under the named scope of their path (see the module
    docstring); outside it, as they were."""
    kinds: list[tuple[type, Callable[[Any], dict[int, str]]]] = []
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and hasattr(nnx, "iter_graph"):
        kinds.append((nnx.Module, _nnx_paths))
    eqx = sys.modules.get("equinox")
    if eqx is not None:
        kinds.append((eqx.Module, _eqx_paths))
    scopes = _Scopes()
    patched: list[tuple[type, Any]] = []
    try:
        for base, paths_of in kinds:
            for cls in _subclasses(base):
                call = cls.__dict__.get("__call__")
                if call is None or not callable(call) or _internal(cls):
                    continue
                try:
                    type.__setattr__(cls, "__call__", scopes.scoped(call, paths_of))
                except (AttributeError, TypeError):  # a class that takes no new attribute
                    continue
                patched.append((cls, call))
        yield
    finally:
        for cls, call in reversed(patched):
            type.__setattr__(cls, "__call__", call)
