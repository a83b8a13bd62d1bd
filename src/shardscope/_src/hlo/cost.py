"""What an instruction of a compiled program computes and moves, counted from its shapes.

Two figures per instruction, the ones a roofline reads:

- **FLOPs** of its matrix products: a ``dot`` is ``2 x (result elements) x (contracted
  elements)``; a ``convolution`` (the TPU compiler writes its matmuls as ones) is ``2 x (result
  elements) x (kernel elements per output feature)``; a cuBLAS ``custom-call`` reads its
  contracting dimensions from its ``backend_config``. A fusion or call counts what its
  computation does. Element-wise arithmetic is not counted: it is bound by memory.
- **Bytes** it reads and writes in device memory: its operands and its result as the device
  runs it, at the boundary of a fusion (what is fused stays on chip). A dynamic-update-slice,
  fused or not, writes into its buffer in place: only the update is read and written.

The compilers' own counts (``cost_analysis()``) exist for the CPU and TPU compilers but not for
the GPU one; these counts need nothing but the text, so every target is counted the same way.
Collectives, control flow (``while``, ``conditional``) and data movement that costs nothing
(``bitcast``, ``get-tuple-element``, ``tuple``, parameters, constants) count zero here: the
caller walks loops with their trip counts and prices collectives by the communication model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shardscope._src.base import comm
from shardscope._src.hlo.parse import Computation, HloModule, Instruction, Shape

#: Instructions that move no data through device memory and compute nothing.
FREE = frozenset(
    """parameter constant get-tuple-element tuple bitcast after-all partition-id replica-id
    opt-barrier add-dependency domain iota""".split()
)

#: Instructions that run other computations: their cost is their callees', walked by the caller.
CONTROL = frozenset({"while", "conditional", "call", "async-start", "async-update", "async-done"})

_IN_PLACE = "dynamic-update-slice"


@dataclass(frozen=True)
class Cost:
    """FLOPs of matrix products and bytes through device memory (both per device)."""

    flops: int = 0
    bytes: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, times: int) -> Cost:
        return Cost(self.flops * times, self.bytes * times)

    def seconds(self, flops_per_s: float, bytes_per_s: float) -> float:
        """The roofline: the longer of the arithmetic and the memory traffic."""
        return max(self.flops / flops_per_s, self.bytes / bytes_per_s)


def total(costs: Iterable[Cost]) -> Cost:
    out = Cost()
    for c in costs:
        out += c
    return out


def _dims(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(d) for d in text.strip("{}").split(",") if d.strip())


def _bytes(shape: Shape) -> int:
    return shape.byte_size or 0


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


def convolution_flops(comp: Computation, ins: Instruction) -> int:
    """``2 x result elements x kernel elements per output feature`` of a ``convolution``."""
    kernel = _operand(comp, ins, 1)
    labels = ins.attributes.get("dim_labels", "")
    if kernel is None or "_" not in labels:
        return 0
    rhs = labels.split("_", 1)[1].split("->", 1)[0]
    if len(rhs) != len(kernel.shape.dims) or "o" not in rhs:
        return 0
    per_output = kernel.shape.element_count // max(1, kernel.shape.dims[rhs.index("o")])
    return 2 * _result(ins.shape).element_count * per_output


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


class CostCounter:
    """Counts one module's instructions, each computation's FLOPs computed once (a
    computation that many fusions call counts once, however deep it nests)."""

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self._flops: dict[str, int] = {}

    def computation_flops(self, name: str, _seen: frozenset[str] = frozenset()) -> int:
        """FLOPs of the matrix products a computation (a fusion's) does once."""
        if name in self._flops:
            return self._flops[name]
        comp = self.module.computations.get(name)
        if comp is None or name in _seen:  # a call cycle (the audit's analysis refuses one)
            return 0
        inner = _seen | {name}
        got = sum(self._instruction_flops(comp, ins, inner) for ins in comp.instructions)
        self._flops[name] = got
        return got

    def _instruction_flops(
        self, comp: Computation, ins: Instruction, seen: frozenset[str] = frozenset()
    ) -> int:
        if ins.opcode == "dot":
            return dot_flops(comp, ins)
        if ins.opcode == "convolution":
            return convolution_flops(comp, ins)
        if ins.opcode == "custom-call":
            return gemm_flops(comp, ins)
        if ins.opcode == "fusion":
            return sum(self.computation_flops(c, seen) for _, c in ins.called_computations)
        return 0

    def instruction(self, comp: Computation, ins: Instruction) -> Cost:
        """What ``ins`` computes and moves each time it runs, as the device runs it (a
        fusion at its boundary). Control flow, communication (collectives, send and
        receive, the asynchronous copies between memory spaces) and free instructions cost
        nothing here."""
        if ins.opcode in FREE or ins.opcode in CONTROL or _is_communication(ins.opcode):
            return Cost()
        return Cost(self._instruction_flops(comp, ins), _memory_bytes(self.module, comp, ins))


def _root(module: HloModule, ins: Instruction) -> Instruction | None:
    for _, name in ins.called_computations:
        comp = module.computations.get(name)
        if comp is not None:
            return next((i for i in comp.instructions if i.is_root), None)
    return None


def _memory_bytes(module: HloModule, comp: Computation, ins: Instruction) -> int:
    operands = [comp.by_name.get(op) for op in ins.operands]
    read = [_bytes(op.shape) for op in operands if op is not None and op.opcode != "constant"]
    written = _bytes(ins.shape)
    root = _root(module, ins) if ins.opcode == "fusion" else ins
    if root is not None and root.opcode == _IN_PLACE:
        # The buffer is updated where it lies: the update is read and written, the rest not.
        buffer = written
        update = _update_bytes(module, ins, root)
        return max(0, sum(read) - buffer) + update
    return sum(read) + written


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


def instruction_cost(module: HloModule, comp: Computation, ins: Instruction) -> Cost:
    """:meth:`CostCounter.instruction` of one instruction."""
    return CostCounter(module).instruction(comp, ins)
