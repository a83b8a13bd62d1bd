"""All-gathers that the compiler carried out as all-reduces.

XLA's ``all_gather_decomposer`` (used by the TPU backend, e.g. on wrapped tori) replaces an
all-gather with an all-reduce (sum) of a zero-filled buffer of the gathered size into which
each device has written its own shard (a ``dynamic-update-slice`` into
``broadcast(constant(0))``). Summing buffers that are zero everywhere except at each
device's own slot is a gather. The result is the all-gather's; what crosses the links is an
all-reduce's: twice the bytes of a bandwidth-optimal all-gather.

This module recognises such an operand: a ``dynamic-update-slice`` (itself, or the root of
the fusion that produces the operand, seen through copies and bitcasts) whose base is a
broadcast zero and whose update is one ``1/n`` of the buffer, ``n`` the group size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardscope._src.hlo.parse import Computation, HloModule, Instruction, Shape, read_int

_PASS = frozenset({"copy", "copy-done", "copy-start", "bitcast"})
_ZERO = re.compile(r"-?0+(\.0*)?(e[+-]?\d+)?|false", re.I)
_LIMIT = 16


@dataclass(frozen=True)
class ShardInBuffer:
    """An all-reduce operand that is one device's shard written into zeros."""

    shard: Shape
    buffer: Shape
    dimension: int | None  # the gathered dimension, when the shard differs in just one


def _follow(comp: Computation, name: str) -> Instruction | None:
    ins = comp.by_name.get(name)
    for _ in range(_LIMIT):
        if ins is None or ins.opcode not in _PASS or not ins.operands:
            return ins
        ins = comp.by_name.get(ins.operands[0])
    return None


def _is_zero(comp: Computation, name: str, outer: tuple[Computation, Instruction] | None) -> bool:
    ins = _follow(comp, name)
    for _ in range(_LIMIT):
        if ins is None:
            return False
        if ins.opcode == "parameter" and outer is not None:
            caller, fusion = outer
            index = read_int(ins.literal or "")
            if index is None or index >= len(fusion.operands):
                return False
            comp, outer = caller, None
            ins = _follow(comp, fusion.operands[index])
            continue
        if ins.opcode in ("broadcast", "convert") and len(ins.operands) == 1:
            ins = _follow(comp, ins.operands[0])
            continue
        if ins.opcode == "constant":
            return _ZERO.fullmatch((ins.literal or "").strip()) is not None
        return False
    return False


def shard_in_zeros(
    module: HloModule, comp: Computation, operand: str, group_size: int
) -> ShardInBuffer | None:
    """The shard, when all-reduce ``operand`` (in ``comp``) is a zero-padded shard."""
    if group_size < 2:
        return None
    ins = _follow(comp, operand)
    outer: tuple[Computation, Instruction] | None = None
    where = comp
    if ins is not None and ins.opcode == "fusion":
        callee = next((c for a, c in ins.called_computations if a == "calls"), None)
        fused = module.computations.get(callee or "")
        if fused is None or fused.root is None:
            return None
        outer = (comp, ins)
        where = fused
        ins = _follow(fused, fused.root.name)
    if ins is None or ins.opcode != "dynamic-update-slice" or len(ins.operands) < 2:
        return None
    base, update = ins.operands[0], ins.operands[1]
    upd = where.by_name.get(update)
    if upd is None or not _is_zero(where, base, outer):
        return None
    buffer, shard = ins.shape, upd.shape
    if shard.is_tuple or buffer.is_tuple:
        return None
    if shard.element_count * group_size != buffer.element_count:
        return None
    differ = [d for d, (a, b) in enumerate(zip(shard.dims, buffer.dims, strict=False)) if a != b]
    dim = differ[0] if len(differ) == 1 and len(shard.dims) == len(buffer.dims) else None
    return ShardInBuffer(shard=shard, buffer=buffer, dimension=dim)
