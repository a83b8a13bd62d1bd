"""The ragged dots of a user's program (``jax.lax.ragged_dot``, ``ragged_dot_general`` and
their gradients) that its compiled program computes as dense matmuls over every group.

A ragged dot whose ragged dimension is not a batch dimension (a mixture of experts' forward,
``[tokens, d] x [experts, d, f]``, its input gradient, and its weight gradient, ragged over
the contracted tokens) is computed densely by two compilers in JAX 0.10.2:

* on the CPU, JAX itself lowers it so (its lowering rule for every platform but the GPU and
  the TPU is the reference implementation, ``_ragged_dot_general_impl``): the module the
  compiler gets has no ragged dot left, and its ops are named ``dot_general``, ``select_n``;
* on a GPU, JAX emits the ragged dot and XLA's ``RaggedDotRewriter`` rewrites it
  (``RaggedToDense``) unless a grouped matmul takes it (cuDNN's behind
  ``xla_gpu_experimental_use_ragged_dot_fusion``); the dense dot keeps the ragged dot's
  metadata, so its op name ends in ``ragged_dot_general``.

Either way the operand is broadcast over the groups, every group's rows but its own masked
to zero, and contracted over the groups: one matmul of ``groups`` times the useful FLOPs. The
TPU compiler keeps a ragged dot as a kernel of its own (``tpu_custom_call``), which this
module does not report.

The compiled HLO of the CPU names nothing ragged, so the ragged dots are read from the step's
jaxpr; a GPU's compiled program confirms which of them became dense dots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shardscope._src.base.records import Record, field_of, int_tuple
from shardscope._src.hlo.parse import HloModule

#: The name of the primitive ``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` bind
#: (JAX 0.10.2; the primitive itself is not public API), the last part of its op name.
RAGGED_DOT_PRIMITIVE = "ragged_dot_general"


@dataclass(frozen=True)
class RaggedDots(Record):
    """The ragged dots a compiled program computes as dense matmuls over every group:
    ``count`` of them, ``groups``: their group counts (each one once, ascending), each such
    dot computing that many times its useful FLOPs."""

    count: int
    groups: tuple[int, ...]

    def sentence(self, compiler: str, *, cpu: bool, priced: str) -> str:
        """What the ``compiler`` (in words, ``"XLA:GPU"``; ``cpu``: the CPU's) made of the
        dots, what ``priced`` them so (``"the plans price them so, as compiled"``), and what a
        grouped matmul would take instead.

        >>> said = RaggedDots(3, (8,)).sentence("XLA:CPU", cpu=True, priced="so on")
        >>> said[:41]
        'JAX lowers jax.lax.ragged_dot for the CPU'
        >>> "compute 8 times their useful FLOPs, and so on" in said and "3 ragged dots" in said
        True
        """
        times = " or ".join(str(g) for g in self.groups)
        dots = f"{self.count} ragged dot{'' if self.count == 1 else 's'}"
        if cpu:
            how = "JAX lowers jax.lax.ragged_dot for the CPU"
        else:
            how = f"{compiler} rewrites jax.lax.ragged_dot (XLA's RaggedDotRewriter)"
        return (
            f"{how} as one dense matmul over every group (the ragged operand copied for each "
            f"group, the rows outside it zeroed): the program's {dots}, gradients' included, "
            f"compute {times} times their useful FLOPs, and {priced}. A grouped matmul "
            f"computes each group's rows alone: XLA's cuDNN ragged-dot fusion, on NVIDIA GPUs "
            f"from Ampere on with cuDNN 9.22 or newer "
            f"(XLA_FLAGS=--xla_gpu_experimental_use_ragged_dot_fusion=true; bf16 and f16, "
            f"forward and input gradients, weight gradients with a newer cuDNN; more than 20x "
            f"the dense rewrite's speed in its pull request, openxla/xla#40189), or the TPU "
            f"compiler's own ragged-dot kernel (its cost analysis counts the useful FLOPs "
            f"alone). Capacity-padded dispatch (each expert's tokens gathered into a buffer of "
            f"fixed size, one batched matmul) computes its padding instead of every group, as "
            f"the planner's own mixtures compile"
        )

    @classmethod
    def from_dict(cls, data: Any) -> RaggedDots:
        what = "a ragged dots record"
        return cls(int(field_of(data, "count", what)), int_tuple(field_of(data, "groups", what)))


def traced_ragged_dots(jaxpr: Any) -> list[int]:
    """The group count of each ragged dot in ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``, and
    every jaxpr its equations run: jit, remat, custom derivatives, loop bodies, branches)
    whose ragged dimension is not a batch dimension; a ragged batch dimension is a batched
    matmul as it stands, computed densely without waste."""
    out = []
    for eqn in equations(jaxpr):
        if eqn.primitive.name != RAGGED_DOT_PRIMITIVE:
            continue
        numbers = eqn.params["ragged_dot_dimension_numbers"]
        (_, _), (lhs_batch, _) = numbers.dot_dimension_numbers
        if any(d in lhs_batch for d in numbers.lhs_ragged_dimensions):
            continue
        out.append(int(eqn.invars[2].aval.shape[-1]))
    return out


def equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``) and of every jaxpr its
    equations run (jit, remat, custom derivatives, loop bodies, branches), outer first."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr holds its Jaxpr
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def densified_dots(module: HloModule) -> int:
    """The ``dot`` instructions of a compiled module named for a ragged dot: those XLA's GPU
    compiler made of one (it keeps the ragged dot's metadata)."""
    return sum(
        1
        for ins in module.instructions()
        if ins.opcode == "dot"
        and (ins.metadata.op_name or "").rsplit("/", 1)[-1] == RAGGED_DOT_PRIMITIVE
    )


def dense_ragged_dots(
    jaxpr: Any, backend: str | None, module: HloModule | None
) -> RaggedDots | None:
    """The ragged dots of the step traced as ``jaxpr`` that its program compiled for
    ``backend`` (``"cpu"``, ``"gpu"``, ``"tpu"``), its optimized ``module``, computes densely
    (None: none, or no jaxpr). On the CPU every one the jaxpr holds (JAX lowers them so; one
    whose result nothing reads is counted though the compiler drops it); on a GPU as many as
    the module holds dense dots made of one; on a TPU none. The groups are the jaxpr's."""
    if jaxpr is None:
        return None
    groups = traced_ragged_dots(jaxpr)
    if not groups:
        return None
    if backend == "cpu":
        count = len(groups)
    elif backend == "gpu" and module is not None:
        count = densified_dots(module)
    else:
        return None
    return RaggedDots(count, tuple(sorted(set(groups)))) if count else None
