"""How records are shown: a registry of renderers by record type, filled by the renderers.

Records sit below their renderers and never import them. rich and notebooks look up
``__rich__`` and ``_repr_mimebundle_`` on a record; the record asks :func:`show` for the
renderer of its type, and a renderer module registers its functions (:func:`register`) when
it is imported. :data:`RENDERER_MODULES` names the module to import for a record type that
has none yet, so that ``rich.print(record)`` works without the user importing a renderer
(as treescope's ``type_registries`` keeps its handlers and the modules that set them up).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import StrEnum
from typing import Any


class View(StrEnum):
    """A way to show a record."""

    #: a rich renderable (``__rich__``: ``rich.print``, a rich console)
    RICH = "rich"
    #: plain text and HTML by MIME type (``_repr_mimebundle_``: notebooks)
    NOTEBOOK = "notebook"
    #: plain text
    TEXT = "text"
    #: an audit's expectations that failed, with the collectives that differ (plain text)
    EXPECTATIONS = "expectations"


#: The renderer of each (record type, view), as the renderer modules register them.
_RENDERERS: dict[tuple[type, View], Callable[..., Any]] = {}

#: The module that registers the renderers of each record type (by the type's module and
#: name), imported when such a record is first shown.
RENDERER_MODULES: dict[str, str] = {
    "shardscope._src.layout.Layout": "shardscope._src.render.layout",
    "shardscope._src.layout.TreeLayout": "shardscope._src.render.layout",
    "shardscope._src.audit.records.Audit": "shardscope._src.render.audit",
    "shardscope._src.audit.diff.AuditDiff": "shardscope._src.render.diff",
}


def register(record_type: type, view: View, renderer: Callable[..., Any]) -> None:
    """Shows records of ``record_type`` (and its subclasses) in ``view`` with ``renderer``,
    called as ``renderer(record, *args, **kwargs)``."""
    _RENDERERS[record_type, view] = renderer


def _find(record_type: type, view: View) -> Callable[..., Any] | None:
    for cls in record_type.__mro__:
        found = _RENDERERS.get((cls, view))
        if found is not None:
            return found
    return None


def renderer(record_type: type, view: View) -> Callable[..., Any]:
    """The renderer of ``record_type`` in ``view``: registered for it or for a class it
    derives from, after importing the module :data:`RENDERER_MODULES` names for it.

    Raises:
        LookupError: no renderer shows such records in ``view``.
    """
    found = _find(record_type, view)
    if found is None:
        for cls in record_type.__mro__:
            module = RENDERER_MODULES.get(f"{cls.__module__}.{cls.__qualname__}")
            if module is not None:
                importlib.import_module(module)
        found = _find(record_type, view)
    if found is None:
        raise LookupError(f"no renderer shows a {record_type.__qualname__} as {view.value}")
    return found


def show(record: object, view: View, /, *args: Any, **kwargs: Any) -> Any:
    """``record`` shown in ``view`` by its type's renderer (``args`` and ``kwargs`` passed
    on): a rich renderable, a MIME bundle or text, as the view says."""
    return renderer(type(record), view)(record, *args, **kwargs)
