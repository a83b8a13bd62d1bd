"""What an instruction of a compiled program computes and moves, counted from its shapes.

Two figures per instruction, the ones a roofline reads:

- **FLOPs** of its matrix products: a ``dot`` is ``2 x (result elements) x (contracted
  elements)``; a ``convolution`` (the TPU compiler writes its matmuls as ones) is twice each
  output element's multiply-adds, its kernel's input features times the kernel taps that land
  on the input, read from its ``window`` (the TPU compiler writes a matmul's batch dimensions
  as spatial ones, padded so that one tap of each window meets the input: the padding is no
  work); a cuBLAS ``custom-call`` reads its contracting dimensions from its
  ``backend_config``. A fusion or call counts what its computation does. Element-wise
  arithmetic is not counted: it is bound by memory. Each product's FLOPs are also counted by
  the arithmetic its HLO states (:class:`DotArithmetic`: its operands' element type and its
  ``operand_precision``), which the time model prices at its own rate.
- **Bytes** it reads and writes in device memory: its operands and its result as the device
  runs it, at the boundary of a fusion (what is fused stays on chip). A dynamic-update-slice,
  fused or not, writes into its buffer in place: only the update is read and written. A
  slice, dynamic-slice or gather reads only what it takes, and so does a fusion of an operand
  that only such instructions read (a loop's layer of stacked weights, an embedding's rows).

The compilers' own counts (``cost_analysis()``) exist for the CPU and TPU compilers but not for
the GPU one; these counts need nothing but the text, so every target is counted the same way.
Collectives, control flow (``while``, ``conditional``) and data movement that costs nothing
(``bitcast``, ``get-tuple-element``, ``tuple``, parameters, constants) count zero here: the
caller walks loops with their trip counts and prices collectives by the communication model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from shardscope._src.base import comm
from shardscope._src.base.errors import HloParseError
from shardscope._src.hlo.parse import (
    DTYPE_BITS,
    Computation,
    HloModule,
    Instruction,
    Shape,
    read_int,
)

#: Instructions that move no data through device memory and compute nothing.
FREE = frozenset(
    """parameter constant get-tuple-element tuple bitcast after-all partition-id replica-id
    opt-barrier add-dependency domain iota""".split()
)

#: Instructions that run other computations: their cost is their callees', walked by the caller.
CONTROL = frozenset({"while", "conditional", "call", "async-start", "async-update", "async-done"})

_IN_PLACE = "dynamic-update-slice"

#: Instructions that read only the part of their first operand they produce.
_TAKES = frozenset({"slice", "dynamic-slice", "gather"})


class DotArithmetic(StrEnum):
    """The arithmetic a matrix product's HLO states: its operands' element type and, for
    ``f32`` operands, its ``operand_precision`` (``{high,high}``, ``{highest,highest}``;
    none written: DEFAULT). Where a device runs each, and at what rate, is the time model's
    (:func:`~shardscope._src.cost.compute.dot_seconds`): on a GPU JAX's DEFAULT and HIGH f32
    products run as TF32 and HIGHEST as f32, on a TPU as one, three and six bf16 passes."""

    #: 16-bit float operands (bf16, f16), and every type not named below: the peak's rate.
    NARROW = "16-bit"
    F32 = "f32"
    F32_HIGH = "f32 high"
    F32_HIGHEST = "f32 highest"
    #: 8-bit float operands (f8e4m3fn, f8e5m2, ...).
    F8 = "f8"


@dataclass(frozen=True)
class Cost:
    """FLOPs of matrix products and bytes through device memory (both per device);
    ``matmul_bytes``: those of the bytes the instructions that multiply matrices move (a
    dot, a convolution, a matmul's library call, a fusion with one in it). ``f32_flops``,
    ``f32_high_flops``, ``f32_highest_flops`` and ``f8_flops`` are those of the FLOPs whose
    products state that arithmetic (:class:`DotArithmetic`); the rest are 16-bit's."""

    flops: int = 0
    bytes: int = 0
    matmul_bytes: int = 0
    f32_flops: int = 0
    f32_high_flops: int = 0
    f32_highest_flops: int = 0
    f8_flops: int = 0

    @classmethod
    def of_dot(cls, flops: int, arithmetic: DotArithmetic) -> Cost:
        """``flops`` of products of ``arithmetic``, nothing moved."""
        field = _ARITHMETIC_FIELD.get(arithmetic)
        return cls(flops, **({field: flops} if field else {}))

    def flops_of(self, arithmetic: DotArithmetic) -> int:
        """Those of the FLOPs whose products state ``arithmetic``."""
        field = _ARITHMETIC_FIELD.get(arithmetic)
        if field is None:
            return self.flops - sum(int(getattr(self, f)) for f in _ARITHMETIC_FIELD.values())
        return int(getattr(self, field))

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.matmul_bytes + other.matmul_bytes,
            self.f32_flops + other.f32_flops,
            self.f32_high_flops + other.f32_high_flops,
            self.f32_highest_flops + other.f32_highest_flops,
            self.f8_flops + other.f8_flops,
        )

    def __mul__(self, times: int) -> Cost:
        return Cost(
            self.flops * times,
            self.bytes * times,
            self.matmul_bytes * times,
            self.f32_flops * times,
            self.f32_high_flops * times,
            self.f32_highest_flops * times,
            self.f8_flops * times,
        )

    @property
    def matmuls(self) -> Cost:
        """Its FLOPs alone, by arithmetic, nothing moved."""
        return replace(self, bytes=0, matmul_bytes=0)


#: The :class:`Cost` field that holds each arithmetic's FLOPs (16-bit's: the rest).
_ARITHMETIC_FIELD = {
    DotArithmetic.F32: "f32_flops",
    DotArithmetic.F32_HIGH: "f32_high_flops",
    DotArithmetic.F32_HIGHEST: "f32_highest_flops",
    DotArithmetic.F8: "f8_flops",
}


def total(costs: Iterable[Cost]) -> Cost:
    out = Cost()
    for c in costs:
        out += c
    return out


def _dims(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    dims = []
    for d in text.strip("{}").split(","):
        if not d.strip():
            continue
        n = read_int(d)
        if n is None:
            raise HloParseError(
                f"dimension list {text[:40]!r}: {d.strip()[:40]!r} is not a dimension"
            )
        dims.append(n)
    return tuple(dims)


def _bytes(shape: Shape) -> int:
    return shape.byte_size or 0


#: Memory spaces that are not device memory: the TPU's on-chip memory (1) and scalar memory
#: (2), and host memory (5). Their reads and writes are not device-memory traffic.
_HOST = 5
_OFF_DEVICE_MEMORY = frozenset({1, 2, _HOST})


def _hbm_bytes(shape: Shape) -> int:
    """Bytes of ``shape``'s arrays that lie in device memory (HBM): those of the default
    memory space, not the TPU's on-chip or scalar memory nor the host's."""
    return sum(
        leaf.byte_size or 0
        for leaf in shape.leaves()
        if leaf.memory_space not in _OFF_DEVICE_MEMORY
    )


#: Asynchronous moves between memory spaces, and the element of their result that is the
#: destination: a copy's (destination, source, context), a slice's ((source), slice, context).
_ASYNC_MOVES = {"copy-start": 0, "slice-start": 1}
_ASYNC_ENDS = frozenset({"copy-done", "slice-done"})


def _moved_bytes(comp: Computation, ins: Instruction) -> int:
    """Device-memory traffic of an asynchronous move between memory spaces (a TPU's
    prefetch of a weight, or of a slice of it, into on-chip memory, and back): the bytes it
    reads where its source lies in device memory and writes where its destination does.
    Moves to and from the host are transfers over its link, priced as communication."""
    shapes = ins.shape.tuple_shapes or ()
    at = _ASYNC_MOVES[ins.opcode]
    src = comp.by_name.get(ins.operands[0]) if ins.operands else None
    if len(shapes) <= at or src is None:
        return 0
    dest = shapes[at]
    spaces = {leaf.memory_space for leaf in (*dest.leaves(), *src.shape.leaves())}
    if _HOST in spaces:
        return 0
    moved = _bytes(dest)
    return (moved if _hbm_bytes(src.shape) else 0) + (moved if _hbm_bytes(dest) else 0)


def _operand(comp: Computation, ins: Instruction, i: int) -> Instruction | None:
    if i >= len(ins.operands):
        return None
    return comp.by_name.get(ins.operands[i])


def _elements(shape: Shape, dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= shape.dims[d] if 0 <= d < len(shape.dims) else 1
    return n


def dot_flops(comp: Computation, ins: Instruction) -> int:
    """``2 x result elements x contracted elements`` of a ``dot``."""
    lhs = _operand(comp, ins, 0)
    if lhs is None:
        return 0
    contracted = _elements(lhs.shape, _dims(ins.attributes.get("lhs_contracting_dims")))
    return 2 * ins.shape.element_count * contracted


@dataclass(frozen=True)
class ConvWindow:
    """A convolution's ``window={...}``, one entry per spatial dimension (in the order of
    the ``dim_labels`` digits): what XLA's ``window_util`` writes, ``size``, ``stride``,
    ``pad`` (low and high, negative to crop), ``lhs_dilate``, ``rhs_dilate`` and
    ``rhs_reversal`` (which changes no count)."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    pad_low: tuple[int, ...]
    pad_high: tuple[int, ...]
    lhs_dilate: tuple[int, ...]
    rhs_dilate: tuple[int, ...]

    @classmethod
    def parse(cls, text: str, rank: int | None = None) -> ConvWindow:
        """``{size=2x4 pad=1_1x3_3 rhs_reversal=1x1}`` (braces optional); an empty text
        (no ``window`` attribute) is ``rank`` dimensions of size 1.

        >>> w = ConvWindow.parse("{size=2x4 pad=1_1x3_3 lhs_dilate=2x1 rhs_reversal=1x1}")
        >>> w.size, w.pad_low, w.pad_high, w.lhs_dilate, w.stride
        ((2, 4), (1, 3), (1, 3), (2, 1), (1, 1))
        """
        fields: dict[str, list[str]] = {}
        for item in text.strip().removeprefix("{").removesuffix("}").split():
            key, eq, value = item.partition("=")
            if not eq or key not in _WINDOW_KEYS or key in fields:
                raise HloParseError(
                    f"convolution window {text!r}: {item!r} is not one of "
                    f"{', '.join(k + '=' for k in _WINDOW_KEYS)} (once each)"
                )
            fields[key] = value.split("x")
        n = len(fields["size"]) if "size" in fields else (rank or 0)
        if rank is not None and n != rank:
            raise HloParseError(
                f"convolution window {text!r} has {n} dimension(s) and dim_labels {rank}"
            )

        def ints(key: str, default: int) -> tuple[int, ...]:
            if key not in fields:
                return (default,) * n
            got = tuple(_window_int(v, text) for v in fields[key])
            if len(got) != n or (key != "pad" and min(got, default=1) < 1):
                raise HloParseError(
                    f"convolution window {text!r}: {key}= needs {n} positive value(s)"
                )
            return got

        pads = fields.get("pad", ["0_0"] * n)
        if len(pads) != n or any(p.count("_") != 1 for p in pads):
            raise HloParseError(f"convolution window {text!r}: pad= needs {n} low_high pair(s)")
        return cls(
            size=ints("size", 1),
            stride=ints("stride", 1),
            pad_low=tuple(_window_int(p.split("_")[0], text) for p in pads),
            pad_high=tuple(_window_int(p.split("_")[1], text) for p in pads),
            lhs_dilate=ints("lhs_dilate", 1),
            rhs_dilate=ints("rhs_dilate", 1),
        )

    def taps(self, dim: int, inputs: int, outputs: int) -> int:
        """How many (output position, kernel tap) pairs of spatial dimension ``dim`` read an
        element of the input (``inputs`` long) rather than its padding or a hole its
        dilation leaves: each such pair is one multiply-add per input feature."""
        stride, dilate = self.stride[dim], self.lhs_dilate[dim]
        last = (inputs - 1) * dilate  # the last input element in the dilated input
        total = 0
        for k in range(self.size[dim]):
            # Output o reads position o * stride + offset of the dilated input.
            offset = k * self.rhs_dilate[dim] - self.pad_low[dim]
            lo = max(0, -(offset // stride))  # ceil(-offset / stride)
            hi = min(outputs - 1, (last - offset) // stride)
            if hi >= lo:
                total += _congruent(lo, hi, stride, offset, dilate)
        return total


_WINDOW_KEYS = ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal")


def _window_int(text: str, window: str) -> int:
    value = read_int(text.removeprefix("-"))
    if value is None:
        raise HloParseError(f"convolution window {window!r}: {text!r} is not a whole number")
    return -value if text.startswith("-") else value


def _congruent(lo: int, hi: int, stride: int, offset: int, modulus: int) -> int:
    """How many ``o`` in ``[lo, hi]`` have ``o * stride + offset`` divisible by ``modulus``."""
    if modulus == 1:
        return hi - lo + 1
    g = math.gcd(stride, modulus)
    if offset % g:
        return 0
    period = modulus // g
    # o = first (mod period) solves (stride / g) o = -offset / g (mod period).
    first = (-offset // g) * pow(stride // g, -1, period) % period if period > 1 else 0
    start = lo + (first - lo) % period
    return 0 if start > hi else (hi - start) // period + 1


def convolution_flops(comp: Computation, ins: Instruction) -> int:
    """``2 x result elements x kernel input features x kernel taps on the input`` of a
    ``convolution`` (:meth:`ConvWindow.taps`, summed over its output positions)."""
    lhs, kernel = _operand(comp, ins, 0), _operand(comp, ins, 1)
    labels = ins.attributes.get("dim_labels", "")
    if lhs is None or kernel is None or labels.count("_") != 1 or "->" not in labels:
        return 0
    lhs_labels, rest = labels.split("_", 1)
    rhs, out = rest.split("->", 1)
    result = _result(ins.shape)
    shapes = ((lhs_labels, lhs.shape), (rhs, kernel.shape), (out, result))
    if any(len(names) != len(shape.dims) for names, shape in shapes) or "i" not in rhs:
        return 0
    spatial = sorted(c for c in out if c.isdigit())
    if any(sorted(c for c in names if c.isdigit()) != spatial for names, _ in shapes):
        return 0
    window = ConvWindow.parse(ins.attributes.get("window", ""), len(spatial))
    per_row = result.element_count  # result elements per output position
    taps = 1
    for d, c in enumerate(spatial):
        outputs = result.dims[out.index(c)]
        per_row //= max(1, outputs)
        taps *= window.taps(d, lhs.shape.dims[lhs_labels.index(c)], outputs)
    return 2 * per_row * kernel.shape.dims[rhs.index("i")] * taps


def _result(shape: Shape) -> Shape:
    """A custom call's result: the first array of a tuple (the rest is its workspace)."""
    return next(shape.leaves()) if shape.is_tuple else shape


def gemm_flops(comp: Computation, ins: Instruction) -> int:
    """A cuBLAS ``custom-call``'s FLOPs, from the contracting dimensions its
    ``backend_config`` gives (0 for any other custom call)."""
    config = ins.backend_config
    if not isinstance(config, dict):
        return 0
    gemm = config.get("gemm_backend_config")
    if not isinstance(gemm, dict):
        return 0
    numbers = gemm.get("dot_dimension_numbers") or {}
    lhs = _operand(comp, ins, 0)
    if lhs is None:
        return 0
    contracting = [int(d) for d in numbers.get("lhs_contracting_dimensions", ())]
    return 2 * _result(ins.shape).element_count * _elements(lhs.shape, contracting)


#: Instructions whose result holds values of their first operand, rearranged or in part.
_SAME_VALUES = frozenset({"bitcast", "copy", "transpose", "reshape", "broadcast", "slice"})
#: The most instructions a widened value's chain is followed back through (a bound, not a
#: length any compiled chain reaches).
_LONGEST_CHAIN = 256

#: ``operand_precision`` levels, least first (PrecisionConfig's DEFAULT, HIGH, HIGHEST).
_PRECISIONS = ("default", "high", "highest")


def _is_float(dtype: str | None) -> bool:
    return dtype is not None and dtype in DTYPE_BITS and dtype.startswith(("f", "bf"))


def _widens_float(src: str | None, dst: str | None) -> bool:
    """Whether converting ``src`` to ``dst`` widens a float (bf16 to f32), its values
    unchanged."""
    return _is_float(src) and _is_float(dst) and DTYPE_BITS[src or ""] < DTYPE_BITS[dst or ""]


def _precision(levels: Iterable[str]) -> str:
    """The highest of a product's operand precisions (``DEFAULT``, ``high``, ...; none:
    DEFAULT)."""
    got = [p.strip().lower() for p in levels if p.strip().lower() in _PRECISIONS]
    return max(got, key=_PRECISIONS.index, default="default")


def dot_arithmetic(types: Iterable[str | None], precision: str) -> DotArithmetic:
    """The :class:`DotArithmetic` of a product of operands of element ``types`` at
    ``operand_precision`` ``precision``: f32 where an operand is f32 (the other is converted
    to it), f8 where both are 8-bit floats, else 16-bit's.

    >>> dot_arithmetic(("f32", "f32"), "highest"), dot_arithmetic(("bf16", "bf16"), "default")
    (<DotArithmetic.F32_HIGHEST: 'f32 highest'>, <DotArithmetic.NARROW: '16-bit'>)
    """
    kinds = tuple(types)
    if "f32" in kinds:
        return {"high": DotArithmetic.F32_HIGH, "highest": DotArithmetic.F32_HIGHEST}.get(
            precision, DotArithmetic.F32
        )
    if kinds and all(t is not None and t.startswith("f8") for t in kinds):
        return DotArithmetic.F8
    return DotArithmetic.NARROW


class CostCounter:
    """Counts one module's instructions, each computation's FLOPs computed once (a
    computation that many fusions call counts once, however deep it nests).

    ``widened``: the compiler widened the program's 16-bit products to f32 (XLA:CPU's does:
    a bf16 ``x @ w`` is an f32 dot of converted operands there), so an f32 operand converted
    from a narrower float, directly or through a fusion or a rearrangement, is counted at
    that float's arithmetic; a product the program itself wrote in f32 of converted 16-bit
    values is then counted as 16-bit's too. A GPU's or TPU's compiler keeps the program's
    types, and there an operand's type is the product's."""

    def __init__(self, module: HloModule, *, widened: bool = False) -> None:
        self.module = module
        self.widened = widened
        self._flops: dict[tuple[str, tuple[str | None, ...]], Cost] = {}

    def computation_flops(self, name: str, _seen: frozenset[str] = frozenset()) -> int:
        """FLOPs of the matrix products a computation (a fusion's) does once."""
        return self.computation_matmuls(name, _seen).flops

    def computation_matmuls(
        self,
        name: str,
        _seen: frozenset[str] = frozenset(),
        params: tuple[str | None, ...] = (),
    ) -> Cost:
        """The matrix products' FLOPs, by arithmetic, a computation does once; ``params``:
        the element types its parameters' values have where the compiler widened them."""
        key = (name, params)
        if key in self._flops:
            return self._flops[key]
        comp = self.module.computations.get(name)
        if comp is None or name in _seen:  # a call cycle (the audit's analysis refuses one)
            return Cost()
        inner = _seen | {name}
        got = total(self._instruction_flops(comp, ins, inner, params) for ins in comp.instructions)
        self._flops[key] = got
        return got

    def _stored(self, comp: Computation, name: str, params: tuple[str | None, ...]) -> str | None:
        """The element type of the values ``name`` holds: its own, or where the compiler
        widened them (``widened``), the narrower float's they were converted from.

        One chain of values is followed back: through widening converts and value-keeping
        instructions, into a fusion at its root, and out of it again at a parameter to the
        fusion's operand, never into more than that one chain (so the walk is as long as the
        chain, whatever the program's size)."""
        ins = comp.by_name.get(name)
        here = comp
        callers: list[tuple[Computation, Instruction]] = []  # the fusions walked into
        for _ in range(_LONGEST_CHAIN):
            if ins is None or not self.widened:
                break
            if ins.opcode == "parameter":
                i = read_int(ins.literal or "")
                if not callers:
                    given = params[i] if i is not None and i < len(params) else None
                    return given or ins.shape.dtype
                here, fusion = callers.pop()
                if i is None or i >= len(fusion.operands):
                    return ins.shape.dtype
                ins = here.by_name.get(fusion.operands[i])
                continue
            if ins.opcode == "fusion":
                callee = next(
                    (self.module.computations.get(c) for _, c in ins.called_computations), None
                )
                root = callee.root if callee is not None else None
                if callee is None or root is None:
                    break
                callers.append((here, ins))
                here, ins = callee, root
                continue
            src = _operand(here, ins, 0)
            if src is None:
                break
            if (ins.opcode == "convert" and _widens_float(src.shape.dtype, ins.shape.dtype)) or (
                ins.opcode in _SAME_VALUES and src.shape.dtype == ins.shape.dtype
            ):
                ins = src
                continue
            break
        return None if ins is None else ins.shape.dtype

    def _arithmetic(
        self,
        comp: Computation,
        ins: Instruction,
        params: tuple[str | None, ...],
        precision: str,
    ) -> DotArithmetic:
        types = (self._stored(comp, op, params) for op in ins.operands[:2])
        return dot_arithmetic(types, precision)

    def _instruction_flops(
        self,
        comp: Computation,
        ins: Instruction,
        seen: frozenset[str] = frozenset(),
        params: tuple[str | None, ...] = (),
    ) -> Cost:
        if ins.opcode in ("dot", "convolution"):
            flops = dot_flops(comp, ins) if ins.opcode == "dot" else convolution_flops(comp, ins)
            levels = ins.attributes.get("operand_precision", "").strip("{}").split(",")
            return Cost.of_dot(flops, self._arithmetic(comp, ins, params, _precision(levels)))
        if ins.opcode == "custom-call":
            flops = gemm_flops(comp, ins)
            if not flops:
                return Cost()
            return Cost.of_dot(flops, self._arithmetic(comp, ins, params, _gemm_precision(ins)))
        if ins.opcode == "fusion":
            got = total(self.computation_matmuls(c, seen) for _, c in ins.called_computations)
            if not self.widened or not got.flops:
                return got
            # its products' operands may be the caller's widened values: read them through
            inner = tuple(self._stored(comp, op, params) for op in ins.operands)
            return total(
                self.computation_matmuls(c, seen, inner) for _, c in ins.called_computations
            )
        return Cost()

    def instruction(self, comp: Computation, ins: Instruction) -> Cost:
        """What ``ins`` computes and moves each time it runs, as the device runs it (a
        fusion at its boundary). Control flow, communication (collectives, send and
        receive, copies to and from the host) and free instructions cost nothing here. An
        asynchronous move between device memory and a TPU's on-chip memory moves its bytes
        through device memory once (:func:`_moved_bytes`), and what reads or writes on-chip
        memory moves nothing through it."""
        if ins.opcode in _ASYNC_MOVES:
            return Cost(0, _moved_bytes(comp, ins))
        if ins.opcode in _ASYNC_ENDS:
            return Cost()
        if ins.opcode in FREE or ins.opcode in CONTROL or _is_communication(ins.opcode):
            return Cost()
        matmuls = self._instruction_flops(comp, ins)
        moved = _memory_bytes(self.module, comp, ins)
        return matmuls + Cost(0, moved, moved if matmuls.flops else 0)


def _gemm_precision(ins: Instruction) -> str:
    """A cuBLAS call's operand precision, from its ``backend_config``'s
    ``precision_config`` (``"operand_precision": ["HIGHEST", "HIGHEST"]``)."""
    config = ins.backend_config
    gemm = config.get("gemm_backend_config") if isinstance(config, dict) else None
    precision = gemm.get("precision_config") if isinstance(gemm, dict) else None
    levels = precision.get("operand_precision") if isinstance(precision, dict) else None
    return _precision(str(p) for p in levels) if isinstance(levels, list) else "default"


def _root(module: HloModule, ins: Instruction) -> Instruction | None:
    for _, name in ins.called_computations:
        comp = module.computations.get(name)
        if comp is not None:
            return next((i for i in comp.instructions if i.is_root), None)
    return None


def _in_place(module: HloModule, ins: Instruction) -> Instruction | None:
    """The dynamic-update-slice that updates ``ins``'s buffer where it lies (``ins`` itself,
    or its fusion's root), or None."""
    root = _root(module, ins) if ins.opcode == "fusion" else ins
    return root if root is not None and root.opcode == _IN_PLACE else None


def _memory_bytes(module: HloModule, comp: Computation, ins: Instruction) -> int:
    read = sum(nbytes for _, nbytes in operand_reads(module, comp, ins))
    written = result_bytes(ins)
    root = _in_place(module, ins)
    if root is not None:
        # The buffer is updated where it lies: the update is read and written, the rest not.
        buffer = written
        update = _update_bytes(module, ins, root)
        return max(0, read - buffer) + update
    return read + written


def _read_bytes(module: HloModule, ins: Instruction, i: int, operand: Instruction) -> int:
    """Bytes ``ins`` reads of its ``i``-th operand: all of it, or what a slice, dynamic
    slice or gather takes of it (unfused, or every reader of it inside a fusion)."""
    whole = _hbm_bytes(operand.shape)
    if not whole:  # in on-chip memory, or none
        return 0
    if ins.opcode in _TAKES:
        return _bytes(ins.shape) if i == 0 else whole
    if ins.opcode != "fusion":
        return whole
    fused = next((module.computations.get(name) for _, name in ins.called_computations), None)
    if fused is None:
        return whole
    param = next(
        (p for p in fused.instructions if p.opcode == "parameter" and p.literal == str(i)), None
    )
    if param is None:
        return whole
    readers = [u for u in fused.instructions if param.name in u.operands]
    if not readers or any(u.opcode not in _TAKES or u.operands[0] != param.name for u in readers):
        return whole
    return min(whole, sum(_bytes(u.shape) for u in readers))


def _update_bytes(module: HloModule, ins: Instruction, root: Instruction) -> int:
    """Bytes of the update a dynamic-update-slice writes (its second operand)."""
    if len(root.operands) < 2:
        return 0
    home = module.computations.get(root.computation)
    src = home.by_name.get(root.operands[1]) if home is not None else None
    return _bytes(src.shape) if src is not None else 0


def _is_communication(opcode: str) -> bool:
    base = opcode.removesuffix("-start").removesuffix("-done").removesuffix("-update")
    return base in comm.KINDS or base in ("send", "recv", "copy") and opcode != "copy"


def fusible(module: HloModule, ins: Instruction) -> bool:
    """Whether ``ins`` may run inside one kernel with others: it computes on values in
    device memory, reading its operands and writing its result (not control flow, a
    transfer, an asynchronous move or an update in place, which :class:`CostCounter` prices
    by their own rules)."""
    if ins.opcode in CONTROL or ins.opcode in _ASYNC_MOVES or ins.opcode in _ASYNC_ENDS:
        return False
    return not _is_communication(ins.opcode) and _in_place(module, ins) is None


def operand_reads(module: HloModule, comp: Computation, ins: Instruction) -> list[tuple[str, int]]:
    """Each operand ``ins`` reads from device memory, by name, and the bytes it reads of it
    (all of it, or what a slice takes; an update in place reads its buffer here, which
    :class:`CostCounter` takes off); constants are no traffic."""
    out = []
    for i, name in enumerate(ins.operands):
        op = comp.by_name.get(name)
        if op is not None and op.opcode != "constant":
            out.append((name, _read_bytes(module, ins, i, op)))
    return out


def result_bytes(ins: Instruction) -> int:
    """The bytes of ``ins``'s result in device memory."""
    return _hbm_bytes(ins.shape)


def instruction_cost(module: HloModule, comp: Computation, ins: Instruction) -> Cost:
    """:meth:`CostCounter.instruction` of one instruction."""
    return CostCounter(module).instruction(comp, ins)
