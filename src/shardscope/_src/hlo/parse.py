"""A parser of optimized HLO text (``compiled.as_text()``) into plain records.

The text has a fixed shape, which this module follows rather than searching it:

    HloModule <name>, <key>=<value>, ...            the module header
    FileNames / FunctionNames / FileLocations / StackFrames
    <id> "<text>" | <id> {<key>=<value> ...}        the source tables
    [ENTRY] %<computation> (<params>) -> <shape> {
      [ROOT] %<name> = <shape> <opcode>(<operands>), <key>=<value>, ...
    }

Values nest brackets, braces, parentheses, quoted strings and ``/*index=5*/`` comments; a
small tokenizer finds their extent, so a comma inside ``{...}`` or ``"..."`` never splits a
value. Attributes are kept as raw text keyed by name (``replica_groups``, ``metadata``, ...);
the few that the audit reads have parsers here or in :mod:`~shardscope._src.hlo.groups`.
Anything this
module does not recognise (an opcode, an attribute, a table) is kept verbatim, never dropped;
text that does not follow the grammar raises :class:`HloParseError` naming the line.

>>> m = parse_hlo('''HloModule m, num_partitions=2
... ENTRY %main (p: f32[4]) -> f32[4] {
...   %p = f32[4]{0} parameter(0)
...   ROOT %ar = f32[4]{0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add
... }''')
>>> m.entry.root.opcode, m.entry.root.operands, m.num_partitions
('all-reduce', ('p',), 2)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shardscope._src.base.errors import HloParseError

# Bits per element of every HLO primitive type (xla_data.proto PrimitiveType).
DTYPE_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4,
    "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8,
    "f8e4m3fnuz": 8, "f8e3m4": 8, "f8e8m0fnu": 8, "f4e2m1fn": 4,
    "token": 0, "opaque": 0,
}  # fmt: skip

# Opcodes of HLO as the XLA in jaxlib 0.10.2 prints them: the names of its HLO_OPCODE_LIST
# (xla/hlo/ir/hlo_opcode.h) whose enum values the installed jaxlib has, 133 in all.
KNOWN_OPCODES: frozenset[str] = frozenset(
    """abs acos acosh add add-dependency after-all all-gather all-gather-done
    all-gather-start all-reduce all-reduce-done all-reduce-start all-to-all and asin asinh
    async-done async-start async-update atan2 atanh batch-norm-grad batch-norm-inference
    batch-norm-training bitcast bitcast-convert broadcast call cbrt ceil cholesky clamp
    collective-broadcast collective-permute collective-permute-done collective-permute-start
    compare complex concatenate conditional constant convert convolution copy copy-done
    copy-start cosh cosine count-leading-zeros custom-call divide domain dot dynamic-reshape
    dynamic-slice dynamic-update-slice erf exponential exponential-minus-one fft floor fusion
    gather get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one
    logistic map maximum minimum mulhi multiply negate not opt-barrier or outfeed pad
    parameter partition-id popcnt power ragged-all-to-all ragged-dot real recv recv-done
    reduce reduce-precision reduce-scatter reduce-window remainder replica-id reshape reverse
    rng rng-bit-generator rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt
    scaled-dot scan scatter select select-and-scatter send send-done set-dimension-size
    shift-left shift-right-arithmetic shift-right-logical sign sine sinh slice sort sqrt
    stochastic-convert subtract tan tanh topk transpose triangular-solve tuple while
    xor""".split()
)

# An asynchronous instruction wrapping one other prints as that opcode with a suffix
# (``reduce-scatter-start``, ``all-to-all-done``, ``fusion-start``); see is_known_opcode.
ASYNC_SUFFIXES = ("-start", "-update", "-done")


def is_known_opcode(opcode: str) -> bool:
    """True for an HLO opcode, including the ``<op>-start/-update/-done`` async forms."""
    if opcode in KNOWN_OPCODES:
        return True
    for suffix in ASYNC_SUFFIXES:
        if opcode.endswith(suffix) and opcode[: -len(suffix)] in KNOWN_OPCODES:
            return True
    return False


#: The execution thread of a computation whose closing brace names none.
MAIN_THREAD = "main"

# Attributes whose value names computations this instruction runs.
CALL_ATTRIBUTES = (
    "calls",
    "to_apply",
    "body",
    "condition",
    "branch_computations",
    "true_computation",
    "false_computation",
    "called_computations",
    "async_execution_thread",
)

_OPEN = {"(": ")", "[": "]", "{": "}"}
_SPECIAL = re.compile(r'["(){}\[\],]|/\*')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*', re.S)
_IDENT = re.compile(r"[A-Za-z_][\w\-.]*")
_OPCODE = re.compile(r"[A-Za-z][\w\-.]*")
_NAME_REF = re.compile(r"%?([\w\-.]+)")
_TILES = re.compile(r"T((?:\([0-9,*\s]*\))+)", re.ASCII)
_MEMORY_SPACE = re.compile(r"S\(([0-9]+)\)", re.ASCII)
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_DIGITS = re.compile(r"[0-9]+")

#: XLA keeps dimensions, byte sizes, trip counts and ids in signed 64-bit integers
#: (``xla_data.proto``, ``ShapeUtil::ValidateShape``): no compiled program holds a larger one.
INT64_MAX = 2**63 - 1

#: Devices one module may run on (``num_partitions`` x ``replica_count``). The largest
#: single-program jobs published run on tens of thousands of accelerators (a TPU v5p pod holds
#: 8,960 chips); replica groups are checked against this before any are expanded.
MAX_MODULE_DEVICES = 2**16


def _error(lineno: int | None, message: str, text: str | None = None) -> HloParseError:
    where = f"line {lineno}: " if lineno is not None else ""
    shown = ""
    if text is not None:
        t = text.strip()
        shown = f" (in {t[:120]!r}{'...' if len(t) > 120 else ''})"
    return HloParseError(f"HLO text {where}{message}{shown}")


def read_int(text: str) -> int | None:
    """``text`` as a whole number if it is one written in ASCII digits within int64, else None.

    Python's ``int()`` also takes ``'²'``-like digits of other scripts, underscores and signs,
    and refuses more than 4,300 digits with its own error; HLO numbers are none of these.
    """
    t = text.strip()
    if not _DIGITS.fullmatch(t):
        return None
    t = t.lstrip("0") or "0"
    if len(t) > 19:
        return None
    value = int(t)
    return value if value <= INT64_MAX else None


def parse_int(
    text: str,
    what: str,
    lineno: int | None,
    raw: str | None = None,
    *,
    limit: int = INT64_MAX,
    why: str = "XLA stores it in a signed 64-bit integer",
) -> int:
    """``text`` as a whole number from 0 to ``limit``; :class:`HloParseError` naming ``what``
    and the line otherwise."""
    t = text.strip()
    if not _DIGITS.fullmatch(t):
        shown = t if len(t) <= 30 else t[:30] + "..."
        raise _error(lineno, f"{what} {shown!r} is not a whole number in ASCII digits", raw)
    value = read_int(t)
    if value is None or value > limit:
        digits = len(t.lstrip("0"))
        shown = f"{what} {t}" if digits <= 30 else f"{what} has {digits} digits, so it"
        raise _error(lineno, f"{shown} is larger than {limit:,} ({why})", raw)
    return value


def _match(s: str, i: int, lineno: int | None) -> int:
    """``s[i]`` opens a bracket; the index just past its matching closer."""
    stack = [_OPEN[s[i]]]
    pos = i + 1
    while True:
        m = _SPECIAL.search(s, pos)
        if m is None:
            raise _error(lineno, f"{s[i]!r} at column {i + 1} is never closed", s)
        j, c = m.start(), m.group()
        if c == '"':
            pos = _skip_string(s, j, lineno)
        elif c == "/*":
            pos = _skip_comment(s, j, lineno)
        elif c in _OPEN:
            stack.append(_OPEN[c])
            pos = j + 1
        elif c == ",":
            pos = j + 1
        else:
            if stack.pop() != c:
                raise _error(lineno, f"{c!r} at column {j + 1} closes the wrong bracket", s)
            if not stack:
                return j + 1
            pos = j + 1


def _field_end(s: str, i: int, lineno: int | None) -> int:
    """Index of the first top-level ``,`` at or after ``i``, or of the end of ``s``."""
    pos = i
    while True:
        m = _SPECIAL.search(s, pos)
        if m is None:
            return len(s)
        j, c = m.start(), m.group()
        if c == ",":
            return j
        if c == '"':
            pos = _skip_string(s, j, lineno)
        elif c == "/*":
            pos = _skip_comment(s, j, lineno)
        elif c in _OPEN:
            pos = _match(s, j, lineno)
        else:
            raise _error(lineno, f"unbalanced {c!r} at column {j + 1}", s)


def _skip_string(s: str, j: int, lineno: int | None) -> int:
    end = _STRING_BODY.match(s, j + 1).end()  # type: ignore[union-attr]
    if end >= len(s) or s[end] != '"':
        raise _error(lineno, f"string starting at column {j + 1} is never closed", s)
    return end + 1


def _skip_comment(s: str, j: int, lineno: int | None) -> int:
    end = s.find("*/", j + 2)
    if end < 0:
        raise _error(lineno, f"comment starting at column {j + 1} is never closed", s)
    return end + 2


def split_top_level(s: str, lineno: int | None = None) -> list[str]:
    """Splits ``s`` at commas outside brackets, strings and comments; strips each piece."""
    out: list[str] = []
    i = 0
    while i <= len(s):
        end = _field_end(s, i, lineno)
        out.append(s[i:end].strip())
        i = end + 1
    if out == [""]:
        return []
    return out


def strip_comments(s: str, lineno: int | None = None) -> str:
    """``s`` without its ``/*...*/`` comments, in one pass (an unclosed one is an error)."""
    start = s.find("/*")
    if start < 0:
        return s
    out = []
    pos = 0
    while start >= 0:
        out.append(s[pos:start])
        pos = _skip_comment(s, start, lineno)
        start = s.find("/*", pos)
    out.append(s[pos:])
    return "".join(out)


def unquote(s: str) -> str:
    """The text of an HLO string literal ``"..."`` (C escapes undone)."""
    body = s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s
    if "\\" not in body:
        return body
    out = []
    i = 0
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(simple.get(nxt, "\\" + nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_key_values(text: str, lineno: int | None = None) -> dict[str, str]:
    """``{a=1 b="x y" c={...}}`` (space-separated, as in ``metadata``) -> raw values.

    Quoted values are unquoted; anything else is returned as written.
    """
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    out: dict[str, str] = {}
    i, n = 0, len(s)
    while i < n:
        while i < n and s[i] in " \t,":
            i += 1
        if i >= n:
            break
        m = _IDENT.match(s, i)
        if m is None or m.end() >= n or s[m.end()] != "=":
            raise _error(lineno, f"expected key=value at {s[i : i + 30]!r}", text)
        key = m.group()
        i = m.end() + 1
        if i < n and s[i] == '"':
            end = _skip_string(s, i, lineno)
            out[key] = unquote(s[i:end])
        elif i < n and s[i] in _OPEN:
            end = _match(s, i, lineno)
            out[key] = s[i:end]
        else:
            end = i
            while end < n and s[end] not in " \t,":
                end += 1
            out[key] = s[i:end]
        i = end
    return out


@dataclass(frozen=True)
class Shape:
    """An HLO shape: an array ``f32[16,1024]{1,0}``, a tuple ``(s32[], f32[8])`` or a token.

    ``dims`` of a dynamic dimension (``<=8``) hold its bound; ``dynamic`` says which are.
    """

    dtype: str | None
    dims: tuple[int, ...] = ()
    layout: str | None = None
    tuple_shapes: tuple[Shape, ...] | None = None
    dynamic: tuple[bool, ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.tuple_shapes is not None

    def leaves(self) -> Iterator[Shape]:
        """The array (and token) shapes inside, depth first."""
        if self.tuple_shapes is None:
            yield self
        else:
            for s in self.tuple_shapes:
                yield from s.leaves()

    @property
    def element_count(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def byte_size(self) -> int | None:
        """Bytes of the data (tuples: sum of elements); None for an unknown dtype."""
        total = 0
        for leaf in self.leaves():
            bits = DTYPE_BITS.get(leaf.dtype or "")
            if bits is None:
                return None
            total += -(-leaf.element_count * bits // 8)
        return total

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        """The layout's dimension order, minor first (``{1,0}`` -> ``(1, 0)``)."""
        order = (self.layout or "").split(":", 1)[0]
        return tuple(v for v in (read_int(d) for d in order.split(",")) if v is not None)

    @property
    def tiles(self) -> tuple[tuple[int, ...], ...]:
        """The layout's tiling, outer tile first: ``{1,0:T(8,128)(2,1)}`` ->
        ``((8, 128), (2, 1))``; a combined dimension ``*`` reads -1. Padding to tiles is
        memory layout only: :attr:`byte_size` counts the data."""
        m = _TILES.search((self.layout or "").partition(":")[2])
        if m is None:
            return ()
        return tuple(
            tuple(-1 if d.strip() == "*" else read_int(d) or 0 for d in t.split(",") if d.strip())
            for t in re.findall(r"\(([^()]*)\)", m.group(1))
        )

    @property
    def memory_space(self) -> int | None:
        """The layout's memory space ``S(n)`` (on TPU, 1 is on-chip memory), if printed."""
        m = _MEMORY_SPACE.search((self.layout or "").partition(":")[2])
        return read_int(m.group(1)) if m else None

    def __str__(self) -> str:
        if self.tuple_shapes is not None:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        dims = ",".join(
            f"<={d}" if dyn else str(d) for d, dyn in zip(self.dims, self.dynamic, strict=False)
        )
        return f"{self.dtype}[{dims}]"


def parse_shape(text: str, lineno: int | None = None) -> Shape:
    """Parses one HLO shape; raises :class:`HloParseError` if ``text`` is not one."""
    s = strip_comments(text, lineno).strip()
    shape, end = _parse_shape_at(s, 0, lineno, depth=0)
    if s[end:].strip():
        raise _error(lineno, f"unexpected {s[end:].strip()[:30]!r} after shape", text)
    return shape


def _parse_shape_at(s: str, i: int, lineno: int | None, depth: int) -> tuple[Shape, int]:
    if depth > 64:
        raise _error(lineno, "shape nests tuples more than 64 deep", s)
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "(":
        elems: list[Shape] = []
        i += 1
        while True:
            while i < len(s) and s[i] == " ":
                i += 1
            if i < len(s) and s[i] == ")":
                return Shape(dtype=None, tuple_shapes=tuple(elems)), i + 1
            elem, i = _parse_shape_at(s, i, lineno, depth + 1)
            elems.append(elem)
            while i < len(s) and s[i] == " ":
                i += 1
            if i < len(s) and s[i] == ",":
                i += 1
            elif i < len(s) and s[i] == ")":
                continue
            else:
                raise _error(lineno, "tuple shape is not closed by ')'", s)
    m = _ARRAY_SHAPE.match(s, i)
    if m is None:
        raise _error(lineno, f"expected a shape such as f32[8,16] at {s[i : i + 30]!r}", s)
    dtype, dims_text, layout = m.group(1), m.group(2), m.group(3)
    dims: list[int] = []
    dynamic: list[bool] = []
    for d in dims_text.split(",") if dims_text.strip() else []:
        d = d.strip()
        dyn = d.startswith("<=")
        if dyn:
            d = d[2:]
        if d == "?":
            dims.append(0)
            dynamic.append(True)
            continue
        dims.append(parse_int(d, f"{dtype} dimension", lineno, s))
        dynamic.append(dyn)
    elements = 1
    for d in dims:
        elements *= d
    bits = DTYPE_BITS.get(dtype, 8)
    if -(-elements * bits // 8) > INT64_MAX:
        raise _error(
            lineno,
            f"shape {dtype}[{dims_text.strip()[:60]}] holds more than {INT64_MAX:,} bytes, "
            f"more than XLA can address; no compiled program has such an array",
            s,
        )
    return (
        Shape(
            dtype=dtype,
            dims=tuple(dims),
            layout=layout[1:-1] if layout else None,
            dynamic=tuple(dynamic),
        ),
        m.end(),
    )


@dataclass(frozen=True)
class Metadata:
    """An instruction's ``metadata={...}``: JAX's op name and the stack frame it came from."""

    op_name: str | None = None
    op_type: str | None = None
    stack_frame_id: int | None = None
    source_file: str | None = None
    source_line: int | None = None
    raw: Mapping[str, str] = field(default_factory=dict)


def parse_metadata(text: str, lineno: int | None = None) -> Metadata:
    kv = parse_key_values(text, lineno)

    def as_int(key: str) -> int | None:
        v = kv.get(key)
        return None if v is None else read_int(v)

    return Metadata(
        op_name=kv.get("op_name"),
        op_type=kv.get("op_type"),
        stack_frame_id=as_int("stack_frame_id"),
        source_file=kv.get("source_file"),
        source_line=as_int("source_line"),
        raw=kv,
    )


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction, with its attributes as raw text keyed by attribute name."""

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    attributes: Mapping[str, str]
    computation: str
    is_root: bool = False
    line: int | None = None
    raw: str = ""
    literal: str | None = None  # what is inside constant(...) / parameter(...)

    @property
    def known(self) -> bool:
        return is_known_opcode(self.opcode)

    @cached_property
    def metadata(self) -> Metadata:
        text = self.attributes.get("metadata")
        return Metadata() if text is None else parse_metadata(text, self.line)

    @cached_property
    def backend_config(self) -> Any:
        """The ``backend_config`` JSON as Python data; the raw text if it is not JSON."""
        text = self.attributes.get("backend_config")
        if text is None:
            return None
        if text.startswith('"'):
            text = unquote(text)
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            return text

    @cached_property
    def called_computations(self) -> tuple[tuple[str, str], ...]:
        """``(attribute, computation name)`` for every computation this instruction calls."""
        out: list[tuple[str, str]] = []
        for attr in CALL_ATTRIBUTES:
            value = self.attributes.get(attr)
            if value is None or attr == "async_execution_thread":
                continue
            if value.startswith("{"):
                value = value[1:-1]
            for piece in split_top_level(value, self.line):
                m = _NAME_REF.fullmatch(piece.strip())
                if m is None:
                    raise _error(self.line, f"{attr}= names no computation: {piece!r}", self.raw)
                out.append((attr, m.group(1)))
        return tuple(out)


@dataclass(frozen=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    is_entry: bool = False
    header: str = ""
    line: int | None = None
    #: The execution thread the computation runs on: ``"main"``, or another the compiler
    #: names after its closing brace (the TPU's ``}, execution_thread="sparsecore"``).
    execution_thread: str = MAIN_THREAD

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {ins.name: ins for ins in self.instructions}

    @property
    def root(self) -> Instruction | None:
        for ins in self.instructions:
            if ins.is_root:
                return ins
        return self.instructions[-1] if self.instructions else None


@dataclass(frozen=True)
class SourceLocation:
    file: str
    function: str
    line: int
    column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class HloModule:
    """A parsed module: header attributes, source tables and computations (in text order)."""

    name: str
    attributes: Mapping[str, str]
    computations: Mapping[str, Computation]
    entry_name: str
    file_names: Mapping[int, str] = field(default_factory=dict)
    function_names: Mapping[int, str] = field(default_factory=dict)
    file_locations: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    stack_frames: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    other_tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def entry(self) -> Computation:
        return self.computations[self.entry_name]

    def _int_attr(self, key: str, default: int) -> int:
        v = self.attributes.get(key)
        value = None if v is None else read_int(v)
        return default if value is None else value

    @property
    def num_partitions(self) -> int:
        return self._int_attr("num_partitions", 1)

    @property
    def replica_count(self) -> int:
        return self._int_attr("replica_count", 1)

    def instructions(self) -> Iterator[Instruction]:
        for comp in self.computations.values():
            yield from comp.instructions

    def location(self, file_location_id: int) -> SourceLocation | None:
        loc = self.file_locations.get(file_location_id)
        if loc is None:
            return None
        file_id = read_int(loc.get("file_name_id", "0"))
        func_id = read_int(loc.get("function_name_id", "0"))
        line = read_int(loc.get("line", "0"))
        col = read_int(loc["column"]) if "column" in loc else None
        if file_id is None or func_id is None or line is None or ("column" in loc and col is None):
            return None
        file = self.file_names.get(file_id, "?")
        func = self.function_names.get(func_id, "?")
        return SourceLocation(file=file, function=func, line=line, column=col)

    def stack(self, stack_frame_id: int | None) -> tuple[SourceLocation, ...]:
        """Source locations of a stack frame, innermost (the op's own line) first.

        The printed ``parent_frame_id`` is the parent's id plus one, 1 meaning no parent
        (measured on JAX 0.10.2: frame ``k`` of a chain ``f -> g -> h`` prints ``k``).
        """
        out: list[SourceLocation] = []
        seen: set[int] = set()
        frame_id = stack_frame_id
        while frame_id is not None and frame_id not in seen:
            seen.add(frame_id)
            frame = self.stack_frames.get(frame_id)
            if frame is None:
                break
            location_id = read_int(frame.get("file_location_id", "0"))
            parent_id = read_int(frame.get("parent_frame_id", "0"))
            if location_id is None or parent_id is None:
                break
            loc = self.location(location_id)
            parent = parent_id - 1
            # JAX drops its own frames, so consecutive frames can share one location.
            if loc is not None and (not out or out[-1] != loc):
                out.append(loc)
            frame_id = parent if parent >= 1 else None
        return tuple(out)


def parse_hlo(text: str) -> HloModule:
    """Parses the text of one optimized HLO module (what ``compiled.as_text()`` returns).

    Raises:
        HloParseError: if the text is not HLO (e.g. StableHLO/MLIR from ``lowered.as_text()``)
            or breaks the grammar; the message names the line.
    """
    if not isinstance(text, str):
        raise HloParseError(f"HLO text must be a str, got {type(text).__name__}")
    lines = text.splitlines()
    first, name, header_attrs = _module_header(text, lines)
    body = _ModuleBody()
    body.read(lines, first + 1)

    def strings(section: str) -> dict[int, str]:
        return {k: unquote(v) for k, v in body.tables.get(section, {}).items()}

    def records(section: str) -> dict[int, Mapping[str, str]]:
        return {k: parse_key_values(v) for k, v in body.tables.get(section, {}).items()}

    return HloModule(
        name=name,
        attributes=header_attrs,
        computations=body.computations,
        entry_name=body.entry(),
        file_names=strings("FileNames"),
        function_names=strings("FunctionNames"),
        file_locations=records("FileLocations"),
        stack_frames=records("StackFrames"),
        other_tables={k: tuple(v) for k, v in body.other_tables.items()},
    )


def _module_header(text: str, lines: list[str]) -> tuple[int, str, dict[str, str]]:
    """``(index of the header line, module name, header attributes)``, the device counts of
    the attributes checked."""
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise HloParseError("HLO text is empty; pass the text of compiled.as_text()")
    head = lines[first].strip()
    if not head.startswith("HloModule "):
        hint = ""
        if head.startswith("module") or "stablehlo." in text or "func.func" in text:
            hint = (
                " This looks like StableHLO (MLIR) from lowered.as_text(); the audit needs the "
                "optimized HLO of lowered.compile().as_text()."
            )
        raise _error(
            first + 1,
            f"is not HLO: expected the module header 'HloModule <name>, ...', found "
            f"{head[:60]!r}.{hint}",
        )
    name, header_attrs = _parse_header(head, first + 1)
    _check_devices(header_attrs, first + 1)
    return first, name, header_attrs


def _check_devices(header_attrs: Mapping[str, str], lineno: int) -> None:
    devices = 1
    for key in ("num_partitions", "replica_count"):
        if key in header_attrs:
            value = parse_int(
                header_attrs[key],
                key,
                lineno,
                limit=MAX_MODULE_DEVICES,
                why="more devices than any single program runs on",
            )
            if value == 0:
                raise _error(lineno, f"{key}=0: a module runs on at least one device")
            devices *= value
    if devices > MAX_MODULE_DEVICES:
        raise _error(
            lineno,
            f"num_partitions x replica_count = {devices:,} devices, more than the "
            f"{MAX_MODULE_DEVICES:,} this tool audits (more than any single program runs on)",
        )


class _ModuleBody:
    """What follows the module header: computations and source tables, read line by line."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[int, str]] = {}
        self.other_tables: dict[str, list[str]] = {}
        self.computations: dict[str, Computation] = {}
        self.entry_name: str | None = None
        self.section: str | None = None

    def read(self, lines: list[str], start: int) -> None:
        i = start
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if not stripped:
                self.section = None
                i += 1
            elif stripped.endswith("{") and not line[:1].isspace():
                comp, end = _parse_computation(lines, i)
                self._add_computation(comp, i + 1)
                i = end
            elif _IDENT.fullmatch(stripped):
                self.section = stripped
                if stripped not in _TABLES:
                    self.other_tables.setdefault(stripped, [])
                i += 1
            elif self.section is not None:
                self._add_row(self.section, line, i + 1)
                i += 1
            else:
                raise _error(
                    i + 1,
                    "is neither a source table row, a computation header ('... {') nor inside "
                    "a computation",
                    line,
                )

    def _add_computation(self, comp: Computation, lineno: int) -> None:
        if comp.name in self.computations:
            raise _error(lineno, f"computation {comp.name!r} is defined twice")
        self.computations[comp.name] = comp
        if comp.is_entry:
            if self.entry_name is not None:
                raise _error(lineno, "a second ENTRY computation")
            self.entry_name = comp.name
        self.section = None

    def _add_row(self, section: str, line: str, lineno: int) -> None:
        stripped = line.strip()
        id_text, _, value = stripped.partition(" ")
        if not _DIGITS.fullmatch(id_text):
            raise _error(lineno, f"table {section} row does not start with an id", line)
        if section in _TABLES:
            row_id = parse_int(id_text, f"table {section} row id", lineno, line)
            self.tables.setdefault(section, {})[row_id] = value.strip()
        else:
            self.other_tables[section].append(stripped)

    def entry(self) -> str:
        if self.entry_name is None:
            raise HloParseError(
                "HLO text has no ENTRY computation; pass the whole text of compiled.as_text()"
            )
        return self.entry_name


def _parse_header(line: str, lineno: int) -> tuple[str, dict[str, str]]:
    rest = line[len("HloModule ") :].strip()
    end = _field_end(rest, 0, lineno)
    name = rest[:end].strip()
    if not name or " " in name:
        raise _error(lineno, "module header has no module name", line)
    return name, _parse_attributes(rest, end, lineno)


def _parse_attributes(s: str, i: int, lineno: int | None) -> dict[str, str]:
    """``, key=value, key=value`` from ``s[i:]`` into raw values."""
    attrs: dict[str, str] = {}
    last_key: str | None = None
    n = len(s)
    while True:
        while i < n and s[i] == " ":
            i += 1
        if i >= n:
            return attrs
        if s[i] != ",":
            raise _error(lineno, f"expected ',' before {s[i : i + 30]!r}", s)
        i += 1
        while i < n and s[i] == " ":
            i += 1
        end = _field_end(s, i, lineno)
        piece = s[i:end].strip()
        key, eq, value = piece.partition("=")
        key = key.strip()
        if (
            key == "device_ids"
            and last_key is not None
            and attrs[last_key].startswith(("mesh[", "maximal_mesh["))
        ):
            # The mesh form of replica groups prints its device order after a top-level
            # comma: replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'a'}.
            attrs[last_key] = f"{attrs[last_key]}, {piece}"
        elif not eq or not _IDENT.fullmatch(key):
            # Not key=value: keep it whole rather than guess at its meaning.
            attrs[f"<raw {len(attrs)}>"] = piece
        else:
            attrs[key] = value.strip()
            last_key = key
        i = end


def _parse_computation(lines: list[str], start: int) -> tuple[Computation, int]:
    header = lines[start].strip()
    lineno = start + 1
    words = header.split(None, 2)
    is_entry = words[0] == "ENTRY"
    if is_entry:
        words = words[1:]
    if not words or words[0] == "{":
        raise _error(lineno, "computation header has no name", header)
    name = words[0].lstrip("%")
    if name.endswith("{"):
        name = name[:-1].rstrip()
    if not name or not re.fullmatch(r"[\w\-.]+", name):
        raise _error(lineno, f"computation name {name!r} is not an HLO name", header)
    instructions: list[Instruction] = []
    i = start + 1
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped == "}" or stripped.startswith("},"):
            # After the brace, attributes of the computation: `}, execution_thread="sparsecore"`.
            attrs = _parse_attributes(stripped, 1, i + 1)
            thread = attrs.get("execution_thread", MAIN_THREAD).strip('"')
            if not thread:
                raise _error(i + 1, "the computation's execution_thread names no thread", line)
            comp = Computation(
                name=name,
                instructions=tuple(instructions),
                is_entry=is_entry,
                header=header,
                line=lineno,
                execution_thread=thread,
            )
            return comp, i + 1
        if stripped:
            instructions.append(_parse_instruction(stripped, i + 1, name))
        i += 1
    raise _error(lineno, f"computation {name!r} is never closed by '}}'")


def _parse_instruction(s: str, lineno: int, computation: str) -> Instruction:
    raw = s
    is_root = s.startswith("ROOT ")
    if is_root:
        s = s[5:].lstrip()
    eq = s.find(" = ")
    if eq <= 0:
        raise _error(lineno, "expected an instruction '%name = shape opcode(...)'", raw)
    name = s[:eq].strip().lstrip("%")
    if not name or not re.fullmatch(r"[\w\-.]+", name):
        raise _error(lineno, f"instruction name {name!r} is not an HLO name", raw)
    rest = s[eq + 3 :].lstrip()
    if rest.startswith("("):
        shape_end = _match(rest, 0, lineno)
    else:
        shape_end = rest.find(" ")
        if shape_end < 0:
            raise _error(lineno, "instruction has a shape but no opcode", raw)
    shape = parse_shape(rest[:shape_end], lineno)
    p = shape_end
    while p < len(rest) and rest[p] == " ":
        p += 1
    m = _OPCODE.match(rest, p)
    if m is None or m.end() >= len(rest) or rest[m.end()] != "(":
        raise _error(lineno, "expected 'opcode(' after the shape", raw)
    opcode = m.group()
    ops_end = _match(rest, m.end(), lineno)
    inner = rest[m.end() + 1 : ops_end - 1]
    literal: str | None = None
    operands: list[str] = []
    if opcode in ("constant", "parameter"):
        literal = inner.strip()
    else:
        for piece in split_top_level(inner, lineno):
            piece = strip_comments(piece, lineno).strip()
            if not piece:
                continue
            ref = piece.rsplit(None, 1)[-1]
            mref = _NAME_REF.fullmatch(ref)
            if mref is None:
                raise _error(lineno, f"operand {piece!r} is not an instruction name", raw)
            operands.append(mref.group(1))
    attrs = _parse_attributes(rest, ops_end, lineno)
    return Instruction(
        name=name,
        opcode=opcode,
        shape=shape,
        operands=tuple(operands),
        attributes=attrs,
        computation=computation,
        is_root=is_root,
        line=lineno,
        raw=raw,
        literal=literal,
    )
