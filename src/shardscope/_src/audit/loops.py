"""Trip counts of ``while`` loops: recorded by the compiler, or read from the loop itself.

XLA's GPU and CPU backends record ``backend_config={"known_trip_count":{"n":"32"}}`` on a
loop whose count they proved; the TPU backend does not. A loop that ``lax.scan`` or
``fori_loop`` made still has the shape XLA's own analysis looks for (``while_loop_analysis``):
the state tuple holds an integer induction variable ``i``, the condition computation compares
``i`` with a bound, the body adds a constant step to ``i``, and the tuple that starts the loop
sets ``i`` to a constant. Reading those four gives the count; any other shape gives None (the
count is then unknown, and the audit says so).
"""

from __future__ import annotations

import re

from shardscope._src.hlo.parse import Computation, HloModule, Instruction, parse_int, read_int

_INT = re.compile(r"-?[0-9]+", re.ASCII)
# Instructions that pass an integer through unchanged.
_SAME = frozenset({"copy", "bitcast", "convert", "reshape"})
_LIMIT = 32  # instructions followed through while resolving one value


def _is_int(text: str | None) -> bool:
    """True for a non-negative integer in ASCII digits within int64 (``str.isdigit`` also
    takes ``²``, and ``int()`` refuses 4,300 digits with its own error)."""
    return text is not None and read_int(text) is not None


def known_trip_count(ins: Instruction) -> int | None:
    """The count the compiler recorded in ``backend_config``, if any."""
    cfg = ins.backend_config
    if isinstance(cfg, dict):
        known = cfg.get("known_trip_count")
        if isinstance(known, dict):
            n = known.get("n")
            if isinstance(n, bool) or not isinstance(n, int | str):
                return None
            return parse_int(str(n), f"{ins.name}'s known_trip_count", ins.line, ins.raw)
    return None


def _through(comp: Computation, name: str) -> Instruction | None:
    """The instruction defining ``name``, looking past copies, bitcasts and converts."""
    ins = comp.by_name.get(name)
    for _ in range(_LIMIT):
        if ins is None or ins.opcode not in _SAME or len(ins.operands) != 1:
            return ins
        ins = comp.by_name.get(ins.operands[0])
    return None


def _constant(comp: Computation, name: str) -> int | None:
    ins = _through(comp, name)
    if ins is None or ins.opcode != "constant" or ins.shape.dims:
        return None
    text = (ins.literal or "").strip()
    if not _INT.fullmatch(text):
        return None
    value = read_int(text.removeprefix("-"))
    return None if value is None else -value if text.startswith("-") else value


def _state_index(comp: Computation, name: str) -> int | None:
    """``k`` when ``name`` is element ``k`` of the computation's (only) parameter."""
    ins = _through(comp, name)
    if ins is None or ins.opcode != "get-tuple-element" or len(ins.operands) != 1:
        return None
    src = comp.by_name.get(ins.operands[0])
    if src is None or src.opcode != "parameter":
        return None
    index = ins.attributes.get("index", "")
    return int(index) if _is_int(index) else None


def _compare(module: HloModule, comp: Computation) -> tuple[str, list[tuple[str, int]]] | None:
    """The condition's comparison: direction and both sides as ('elem', k) or ('const', v)."""
    root = comp.root
    inner = comp
    params: dict[int, str] | None = None
    if root is not None and root.opcode == "fusion":
        callee = next((c for a, c in root.called_computations if a == "calls"), None)
        inner = module.computations.get(callee or "")  # type: ignore[assignment]
        if inner is None:
            return None
        params = dict(enumerate(root.operands))
        root = inner.root
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = root.attributes.get("direction", "")
    sides: list[tuple[str, int]] = []
    for op in root.operands:
        where, name = inner, op
        if params is not None:
            p = _through(inner, op)
            if p is None or p.opcode != "parameter" or not _is_int(p.literal):
                return None
            where, name = comp, params.get(int(p.literal or "0"), "")
        k = _state_index(where, name)
        if k is not None:
            sides.append(("elem", k))
            continue
        v = _constant(where, name)
        if v is None:
            return None
        sides.append(("const", v))
    return direction, sides


def _body_step(body: Computation, k: int) -> int | None:
    """The constant the body adds to element ``k`` of the state (negative: subtracts)."""
    root = body.root
    if root is None or root.opcode != "tuple" or k >= len(root.operands):
        return None
    ins = _through(body, root.operands[k])
    if ins is None or ins.opcode not in ("add", "subtract") or len(ins.operands) != 2:
        return None
    a, b = ins.operands
    if _state_index(body, a) == k and (c := _constant(body, b)) is not None:
        return c if ins.opcode == "add" else -c
    if ins.opcode == "add" and _state_index(body, b) == k and (c := _constant(body, a)) is not None:
        return c
    return None


def _unchanged(body: Computation, k: int) -> bool:
    root = body.root
    return (
        root is not None
        and root.opcode == "tuple"
        and k < len(root.operands)
        and _state_index(body, root.operands[k]) == k
    )


def _initial(caller: Computation, loop: Instruction, k: int) -> int | None:
    if len(loop.operands) != 1:
        return None
    init = _through(caller, loop.operands[0])
    if init is None or init.opcode != "tuple" or k >= len(init.operands):
        return None
    return _constant(caller, init.operands[k])


def _count(direction: str, start: int, step: int, bound: int) -> int | None:
    """Iterations of ``i = start; while i <direction> bound: i += step``."""
    if direction == "LT" and step > 0:
        return max(0, -(-(bound - start) // step))
    if direction == "LE" and step > 0:
        return max(0, (bound - start) // step + 1)
    if direction == "GT" and step < 0:
        return max(0, -(-(start - bound) // -step))
    if direction == "GE" and step < 0:
        return max(0, (start - bound) // -step + 1)
    if direction == "NE" and step != 0 and (bound - start) % step == 0:
        n = (bound - start) // step
        return n if n >= 0 else None
    return None


_FLIP = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "NE": "NE", "EQ": "EQ"}


def derived_trip_count(module: HloModule, caller: Computation, loop: Instruction) -> int | None:
    """The trip count of ``loop`` (a ``while`` in ``caller``) read from its condition, body
    and initial state; None when the loop does not have the counted shape."""
    names = dict(loop.called_computations)
    cond = module.computations.get(names.get("condition", ""))
    body = module.computations.get(names.get("body", ""))
    if cond is None or body is None:
        return None
    found = _compare(module, cond)
    if found is None:
        return None
    direction, sides = found
    if sides[0][0] != "elem":
        direction, sides = _FLIP.get(direction, ""), [sides[1], sides[0]]
    (kind_i, k), (kind_b, b) = sides
    if kind_i != "elem":
        return None
    if kind_b == "elem":
        # A bound kept in the state: constant at the start and never changed by the body.
        if not _unchanged(body, b):
            return None
        bound = _initial(caller, loop, b)
    else:
        bound = b
    step = _body_step(body, k)
    start = _initial(caller, loop, k)
    if bound is None or step is None or start is None:
        return None
    return _count(direction, start, step, bound)
