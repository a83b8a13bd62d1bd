"""A profile JAX's profiler wrote, read back as one event per HLO instruction a device ran.

``jax.profiler.trace(DIR)`` writes ``DIR/plugins/profile/<session>/<host>.xplane.pb``: an
XSpace of planes, their lines and their events. It is read here through JAX's own reader,
``jax.profiler.ProfileData``, and what it holds depends on the backend (JAX 0.10.2):

* **GPU** (and TPU): a ``/device:GPU:N`` plane per device, whose stream lines hold the
  kernels; each kernel event has ``hlo_op`` (the instruction that launched it: for an
  asynchronous collective its ``-start``) and ``hlo_module`` stats.
* **CPU**: no device plane. The ``/host:CPU`` plane's thread-pool lines hold one event per
  thunk XLA:CPU ran, with ``hlo_op``, ``hlo_module``, ``device_ordinal`` (the simulated
  device) and ``run_id`` (one execution of the program) stats; a device's thunks hop between
  threads and may run at once.

Either way an :class:`OpEvent` is one instruction's run on one device; nothing else of the
trace (Python frames, the runtime's own spans) is kept.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from shardscope._src.base.errors import ProfileError

#: The suffix of the files ``jax.profiler.trace`` writes, one per host.
TRACE_SUFFIX = ".xplane.pb"
_DEVICE_PLANE = re.compile(r"^/device:(?:GPU|TPU):(\d+)")
_HOST_PLANE = "/host:CPU"


class OpEvent(NamedTuple):
    """One run of one HLO instruction on one device: times in seconds from the trace's
    origin; ``run`` the program execution it belongs to where the trace says (XLA:CPU's
    ``run_id``), else None."""

    device: int
    module: str
    op: str
    start_s: float
    end_s: float
    run: int | None


@dataclass(frozen=True)
class Trace:
    """The instruction events of one profiling session, and where they were read from.

    ``source`` is ``"device"`` when the events come from device planes (GPU, TPU), ``"host"``
    when from the CPU backend's thread-pool lines."""

    path: str
    files: tuple[str, ...]
    events: tuple[OpEvent, ...]
    source: str
    #: the session read (the folder ``jax.profiler.trace`` named by its start time), and how
    #: many sessions the folder holds: a folder traced twice holds two, and the newest is read
    session: str = ""
    sessions: int = 1

    def where(self) -> str:
        """Which session of the folder was read, where it holds several (else empty)."""
        if self.sessions < 2:
            return ""
        return (
            f"read session {self.session}, the newest of the {self.sessions} under "
            f"{self.path} (give a session's folder to read another)"
        )

    def modules(self) -> Counter[str]:
        """Events per HLO module (the program an event's instruction belongs to)."""
        return Counter(e.module for e in self.events)


def trace_files(path: str | os.PathLike[str]) -> tuple[tuple[str, ...], str, int]:
    """The ``*.xplane.pb`` files of the newest profiling session under ``path`` (or ``path``
    itself when it is one): one per host that took part; the session's folder name, and how
    many sessions ``path`` holds.

    Raises:
        ProfileError: ``path`` does not exist, or holds no trace.
    """
    p = Path(path)
    if p.is_file():
        if not p.name.endswith(TRACE_SUFFIX):
            raise ProfileError(
                f"trace {str(p)!r} is not a profile JAX wrote (a {TRACE_SUFFIX} file); give "
                f"the folder jax.profiler.trace(DIR) wrote, or one of its {TRACE_SUFFIX} files"
            )
        return (str(p),), p.parent.name, 1
    if not p.is_dir():
        raise ProfileError(f"trace folder {str(p)!r} does not exist")
    found = sorted(p.rglob(f"*{TRACE_SUFFIX}"))
    if not found:
        raise ProfileError(
            f"trace folder {str(p)!r} holds no trace (no {TRACE_SUFFIX} file under it); give "
            f"the folder jax.profiler.trace(DIR) wrote"
        )
    # jax.profiler names each session's folder by its start time (YYYY_MM_DD_HH_MM_SS): a
    # folder traced twice holds two sessions, and the newest is the one just taken.
    sessions = {f.parent for f in found}
    newest = max(sessions)
    return tuple(str(f) for f in found if f.parent == newest), newest.name, len(sessions)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """The instruction events of the trace at ``path`` (a folder ``jax.profiler.trace``
    wrote, or one of its ``.xplane.pb`` files), read with ``jax.profiler.ProfileData``.

    Raises:
        ProfileError: no trace there, a file that is not one, or a trace whose events name no
            HLO instruction (no device ran a program while it was taken).
    """
    from jax.profiler import ProfileData

    files, session, sessions = trace_files(path)
    events: list[OpEvent] = []
    sources = set()
    planes: list[str] = []
    offset = 0
    for file in files:
        try:
            data = ProfileData.from_file(file)
        except Exception as e:  # the reader raises its own runtime errors on a bad file
            raise ProfileError(
                f"trace file {file!r} cannot be read as a profile ({type(e).__name__}: "
                f"{str(e).strip()[:200]}); give a {TRACE_SUFFIX} file jax.profiler wrote"
            ) from None
        found, source, names = _host_events(data, offset)
        planes += names
        if found:
            sources.add(source)
            offset = max(e.device for e in found) + 1
            events += found
    if not events:
        read = f" ({session}, the newest of {sessions} sessions)" if sessions > 1 else ""
        raise ProfileError(
            f"trace {os.fspath(path)!r}{read} holds no device events: no event names an HLO "
            f"instruction (an hlo_op stat) on a /device: plane or the {_HOST_PLANE} plane "
            f"(its planes: {', '.join(sorted(set(planes))) or 'none'}); trace the step's runs "
            f"inside jax.profiler.trace and wait for them (jax.block_until_ready)"
        )
    source = "device" if "device" in sources else "host"
    return Trace(os.fspath(path), files, tuple(events), source, session, sessions)


def _host_events(data: Any, offset: int) -> tuple[list[OpEvent], str, list[str]]:
    """The instruction events of one host's XSpace, its devices numbered from ``offset``:
    its device planes' when they have any, else its CPU plane's; and its planes' names."""
    names = [p.name for p in data.planes]
    device: list[OpEvent] = []
    host: list[OpEvent] = []
    for plane in data.planes:
        m = _DEVICE_PLANE.match(plane.name)
        if m is not None:
            device += _plane_events(plane, offset + int(m.group(1)))
        elif plane.name == _HOST_PLANE and not device:
            host += _plane_events(plane, None, offset)
    if device:
        return device, "device", names
    return host, "host", names


def _plane_events(plane: Any, device: int | None, offset: int = 0) -> list[OpEvent]:
    """The events of ``plane`` that name an instruction of a module: on a device plane all
    are that device's; on the host plane each says its device (``device_ordinal``)."""
    out = []
    for line in plane.lines:
        for e in line.events:
            stats = dict(e.stats)
            op = stats.get("hlo_op")
            module = stats.get("hlo_module")
            if op is None or module is None:
                continue
            where = device
            if where is None:
                ordinal = stats.get("device_ordinal")
                if ordinal is None:
                    continue
                where = offset + int(ordinal)
            run = stats.get("run_id")
            start = e.start_ns * 1e-9
            out.append(
                OpEvent(
                    where,
                    str(module),
                    str(op),
                    start,
                    start + e.duration_ns * 1e-9,
                    None if run is None else int(run),
                )
            )
    return out
