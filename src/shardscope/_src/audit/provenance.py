"""Where a collective comes from: its Python stack, the user's own line, its scope and pass.

JAX records two things about each operation it lowers, and XLA keeps both through
optimization in an instruction's ``metadata``:

* ``op_name``, JAX's name stack joined by ``/``: ``jit(step)/transpose(jvp(Model))/block_1/
  Dense_0/dot_general``. Its parts are the jitted function (``jit(step)``), named scopes
  (``jax.named_scope``, Flax module paths such as ``Model/block_1/Dense_0``), structure that
  JAX itself adds (``while/body``, ``closed_call``, ``shard_map``, ``cond/branch_0_fun``) and,
  last, the primitive. Transformations wrap the first scope after them (``jvp(Model)``;
  ``jvp()`` when none follows): ``transpose(...)`` marks the backward pass of a gradient, a
  ``jvp(...)`` outside any ``transpose`` the forward pass.
* ``stack_frame_id``, a frame of the module's ``StackFrames`` table: the Python call stack,
  innermost first (:meth:`HloModule.stack`). JAX drops its own frames; a library's
  (``flax/linen/linear.py``) stay, so the user's line is the first frame outside libraries.

A collective the partitioner or a combiner made may carry no ``op_name`` of its own; its
parts then get theirs from the operations that produce (reductions) or use (gathers) them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardscope._src.hlo.parse import Computation, HloModule, Instruction, SourceLocation

# Libraries of the JAX ecosystem: a frame in one of them is not the user's line, wherever the
# library is installed (site-packages or a source checkout).
LIBRARY_PACKAGES = frozenset(
    """jax jaxlib flax equinox optax haiku chex orbax penzai praxis paxml trax objax
    treescope jraph distrax lineax optimistix diffrax jaxtyping numpyro blackjax
    tensorflow_probability keras ml_collections absl""".split()
)
_INSTALLED = ("site-packages", "dist-packages")
# shardscope's own frame around a module's call while it names its scope (audit/scopes.py)
_SCOPE_WRAPPER = ("shardscope", "_src", "audit", "scopes.py")

# Parts of an op_name that JAX adds for program structure, not scopes the user named.
_STRUCTURAL = frozenset(
    """while body cond closed_call core_call shard_map pjit remat checkpoint
    rematted_computation custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr
    custom_lin scan xla_call xla_pmap pmap""".split()
)
_BRANCH = re.compile(r"branch_\d+_fun")
_CALL = re.compile(r"[\w.<>\-]+\((.*)\)", re.S)
_TRANSFORMS = ("transpose", "jvp", "vmap")
_MAX_TRANSFORMS = 16  # nested transformations read from one part of an op_name

FORWARD = "forward"
BACKWARD = "backward"


def is_library_file(path: str) -> bool:
    """True for a file of an installed package, of a JAX ecosystem library or of Python."""
    parts = re.split(r"[\\/]+", path)
    if any(p in _INSTALLED for p in parts) or tuple(parts[-4:]) == _SCOPE_WRAPPER:
        return True
    if any(p in LIBRARY_PACKAGES for p in parts[:-1]):
        return True
    # The standard library: .../lib/python3.X/<module>.py (not inside site-packages).
    return any(
        parts[i] == "lib" and re.fullmatch(r"python\d+(\.\d+)?", parts[i + 1] or "") is not None
        for i in range(len(parts) - 1)
    ) or path.startswith("<")


def user_frame(stack: tuple[SourceLocation, ...]) -> SourceLocation | None:
    """The innermost frame of the user's own code (outside libraries), if any."""
    for loc in stack:
        if not is_library_file(loc.file):
            return loc
    return None


def _split_op_name(op_name: str) -> list[str]:
    """``op_name`` split at ``/`` outside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(op_name):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif ch == "/" and depth == 0:
            parts.append(op_name[start:i])
            start = i + 1
    parts.append(op_name[start:])
    return parts


def _unwrap(part: str) -> tuple[str, tuple[str, ...]]:
    """``transpose(jvp(Model))`` -> ``("Model", ("transpose", "jvp"))``."""
    transforms: list[str] = []
    while len(transforms) < _MAX_TRANSFORMS:
        for t in _TRANSFORMS:
            if part.startswith(t + "(") and part.endswith(")"):
                transforms.append(t)
                part = part[len(t) + 1 : -1]
                break
        else:
            break
    return part, tuple(transforms)


@dataclass(frozen=True)
class OpName:
    """What an ``op_name`` says: the user's scope path and the pass it belongs to."""

    scope: str
    phase: str | None
    primitive: str | None


def parse_op_name(op_name: str | None) -> OpName:
    """Reads JAX's ``op_name``.

    ``scope`` joins the named scopes and module paths with ``/`` (``""`` when there are none);
    ``phase`` is ``"backward"`` inside a ``transpose(...)``, ``"forward"`` inside a ``jvp(...)``
    only, None for an operation outside differentiation (an optimizer update; the audit calls
    every operation of a program without gradients ``"forward"``).

    >>> parse_op_name("jit(step)/transpose(jvp(Model))/block_1/Dense_0/dot_general")
    OpName(scope='Model/block_1/Dense_0', phase='backward', primitive='dot_general')
    >>> parse_op_name("jit(step)/jvp()/while/body/closed_call/mlp/dot_general").scope
    'mlp'
    """
    if not op_name:
        return OpName("", None, None)
    parts = _split_op_name(op_name)
    if len(parts) < 2 or not parts[0].startswith(("jit(", "pjit(")):
        # An argument's name ("x", "params['w']") or text JAX did not write.
        return OpName("", None, None)
    scope: list[str] = []
    transforms: set[str] = set()
    for part in parts[1:-1]:
        name, ts = _unwrap(part)
        transforms.update(ts)
        if not name or name in _STRUCTURAL or _BRANCH.fullmatch(name):
            continue
        if _CALL.fullmatch(name) and name.split("(", 1)[0] in ("jit", "pjit"):
            continue  # a nested jitted function, not a scope
        if "->" in name:
            continue  # the subscripts jnp.einsum names its operations with
        scope.append(name)
    last, ts = _unwrap(parts[-1])
    transforms.update(ts)
    phase = BACKWARD if "transpose" in transforms else FORWARD if "jvp" in transforms else None
    return OpName("/".join(scope), phase, last or None)


@dataclass(frozen=True)
class Origin:
    """The instruction whose metadata names where (part of) a collective came from."""

    instruction: str
    op_name: str | None
    stack: tuple[SourceLocation, ...]

    @property
    def source(self) -> str | None:
        return str(self.stack[0]) if self.stack else None

    @property
    def user_source(self) -> str | None:
        loc = user_frame(self.stack)
        return str(loc) if loc is not None else None


def origin_of(module: HloModule, ins: Instruction) -> Origin | None:
    """``ins``'s own origin, when its metadata has an op_name or a stack frame."""
    md = ins.metadata
    stack = module.stack(md.stack_frame_id)
    if not stack and md.source_file:
        stack = (SourceLocation(md.source_file, "?", md.source_line or 0),)
    if not md.op_name and not stack:
        return None
    return Origin(ins.name, md.op_name, stack)


# Instructions that pass data through unchanged in meaning: an origin is looked for past them.
_PASS_THROUGH = frozenset(
    """bitcast copy copy-start copy-done reshape convert transpose get-tuple-element tuple
    all-gather-done all-reduce-done collective-permute-done async-done""".split()
)


def _users(comp: Computation) -> dict[str, list[Instruction]]:
    out: dict[str, list[Instruction]] = {}
    for ins in comp.instructions:
        for op in ins.operands:
            out.setdefault(op, []).append(ins)
    return out


class Tracer:
    """Finds the origins of a computation's values, looking at producers or users."""

    LIMIT = 64  # instructions visited per search

    def __init__(self, module: HloModule, comp: Computation) -> None:
        self.module = module
        self.comp = comp
        self._users: dict[str, list[Instruction]] | None = None

    def users(self, name: str) -> list[Instruction]:
        if self._users is None:
            self._users = _users(self.comp)
        return self._users.get(name, [])

    def producer_origin(self, name: str) -> Origin | None:
        """The nearest producer of value ``name`` (itself first) that has an origin."""
        seen: set[str] = set()
        todo = [name]
        while todo and len(seen) < self.LIMIT:
            n = todo.pop(0)
            if n in seen:
                continue
            seen.add(n)
            ins = self.comp.by_name.get(n)
            if ins is None:
                continue
            found = origin_of(self.module, ins)
            if found is not None:
                return found
            todo.extend(ins.operands)
        return None

    def user_origin(
        self, name: str, index: int | None = None, *, own_elements: bool = False
    ) -> Origin | None:
        """The nearest user of value ``name`` (element ``index`` of a tuple) with an origin;
        with ``own_elements``, the element's own metadata first (the compiler keeps a
        combined permute's metadata on each element it takes out)."""
        seen: set[tuple[str, int | None]] = set()
        todo: list[tuple[str, int | None]] = [(name, index)]
        while todo and len(seen) < self.LIMIT:
            n, idx = todo.pop(0)
            if (n, idx) in seen:
                continue
            seen.add((n, idx))
            for user in self.users(n):
                if idx is not None and user.opcode == "get-tuple-element":
                    if user.attributes.get("index") != str(idx):
                        continue
                    found = origin_of(self.module, user) if own_elements else None
                    if found is not None and found.stack:
                        return found
                    todo.append((user.name, None))
                    continue
                if idx is not None and user.opcode.endswith("-done"):
                    todo.append((user.name, idx))
                    continue
                found = origin_of(self.module, user)
                if found is not None:
                    return found
                if user.opcode in _PASS_THROUGH:
                    todo.append((user.name, None))
        return None
