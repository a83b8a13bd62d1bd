"""The one 16-bit policy: a collective's bytes at the program's own width.

A compiler that widens 16-bit collectives (``Capabilities.widens_16bit``; XLA:CPU runs a
bfloat16 or float16 program's dots in float32) moves float32 through them: twice the bytes
a compiler that keeps 16 bits sends. The verdict and the planner both count such a program's
collectives as a 16-bit compiler sends them, through :class:`Width`:

* only ``f32`` collectives of a 16-bit program are narrowed, to 2 bytes per element;
* scalars stay at 4 bytes: a mixed-precision program keeps its loss (and other scalars) in
  float32 on every backend, and the bounds count the loss at 4 bytes;
* a collective whose payload is not the sum of its arrays at 4 bytes each is left as
  compiled (not the arrays this policy understands).

>>> from shardscope._src.audit.records import Collective
>>> c = Collective("all-reduce", "ar", "main", ("data",), 8, "f32", (64, 8), 64 * 8 * 4 + 4,
...                3591, 1, shapes=((64, 8), ()))
>>> Width("bfloat16").payload(c), Width("bfloat16").traffic(c), Width("float32").traffic(c)
(1028, 1799, 3591)
"""

from __future__ import annotations

import math
from typing import Any

from shardscope._src.audit.records import Collective
from shardscope._src.base import comm as _comm
from shardscope._src.hlo.parse import HloModule
from shardscope._src.targets.capabilities import compiler_capabilities

#: Bytes per element of the program dtypes the models and matmuls are built in.
PROGRAM_ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
#: The program dtype of each 16-bit HLO element type.
_SIXTEEN_BIT = {"bf16": "bfloat16", "f16": "float16"}


def widened_words(compiler: str, dtype: str) -> str:
    """What a compiler that widens 16-bit collectives does to a ``dtype`` program: the words
    the planner's note, the verdict's and the audit's share."""
    return f"{compiler} runs {dtype} arithmetic in f32 and moves f32 through the collectives"


def widened_dtype(
    module: HloModule, backend: str | None, collectives: tuple[Collective, ...]
) -> str | None:
    """The 16-bit dtype (``"bfloat16"``, ``"float16"``) of a program whose compiler moved its
    collectives as float32, or None. The program's dtype is its entry's floating-point
    parameters' where they are all one 16-bit type (as the planner reads a user's program's
    width); it counts where the compiler (``backend``'s) widens 16-bit collectives and some
    of them send fewer bytes at that width (:class:`Width`)."""
    caps = compiler_capabilities(backend)
    if backend is None or caps is None or not caps.widens_16bit:
        return None
    floats = {
        leaf.dtype
        for ins in module.entry.instructions
        if ins.opcode == "parameter"
        for leaf in ins.shape.leaves()
        if leaf.dtype is not None and leaf.dtype.startswith(("f", "bf"))
    }
    dtype = _SIXTEEN_BIT.get(floats.pop(), "") if len(floats) == 1 else ""
    if not dtype:
        return None
    sent = sum(c.traffic_bytes * c.count for c in collectives)
    return dtype if Width(dtype).total(collectives) != sent else None


class Width:
    """Bytes of collectives at a program's width: its dtype (``program_dtype``, e.g.
    ``"bfloat16"``) or the bytes per element of its floating-point values (``itemsize``).
    Neither, or 32/64 bits: every collective as compiled."""

    def __init__(self, program_dtype: str | None = None, *, itemsize: int | None = None) -> None:
        if itemsize is None:
            itemsize = PROGRAM_ITEMSIZE.get(program_dtype or "", 0)
        self.narrow = itemsize == 2

    @classmethod
    def of(
        cls, audit: Any, program_dtype: str | None = None, *, itemsize: int | None = None
    ) -> Width:
        """The width to judge ``audit`` at: a program whose compiler (``audit.backend``)
        keeps 16-bit collectives 16-bit (or has no record) is judged as compiled; one whose
        compiler widens them, or is unknown (HLO text), at the program's width."""
        backend = getattr(audit, "backend", None)
        caps = compiler_capabilities(backend)
        if backend is not None and (caps is None or not caps.widens_16bit):
            return cls()
        return cls(program_dtype, itemsize=itemsize)

    def payload(self, c: Collective) -> int:
        """The payload ``S`` of one execution at the program's width."""
        if not self.narrow or c.dtype != "f32" or not c.shapes:
            return c.payload_bytes
        scale = c.group_size if c.kind in (_comm.ALL_TO_ALL, _comm.RAGGED_ALL_TO_ALL) else 1
        if sum(math.prod(s) * 4 for s in c.shapes) * scale != c.payload_bytes:
            return c.payload_bytes
        return sum(math.prod(s) * (4 if len(s) == 0 else 2) for s in c.shapes) * scale

    def traffic(self, c: Collective) -> int:
        """Bytes each device sends in one execution, at the program's width."""
        payload = self.payload(c)
        if payload == c.payload_bytes or c.traffic_bytes == 0:
            return c.traffic_bytes
        n = 2 if c.kind == _comm.COLLECTIVE_PERMUTE else max(c.group_size, 1)
        # An all-gather the compiler carried out as an all-reduce sends an all-reduce's bytes.
        return _comm.traffic_bytes(c.carried_as or c.kind, payload, n)

    def sent(self, c: Collective) -> int:
        """Bytes each device sends over all of ``c``'s executions."""
        return self.traffic(c) * c.count

    def total(self, collectives: tuple[Collective, ...] | list[Collective]) -> int:
        """Bytes each device sends over all executions of all ``collectives``."""
        return sum(self.sent(c) for c in collectives)
