"""What a compiler does differently: one record per compiler a compile target builds with.

The verdict and the planner judge a compiled program against formulas written for the
collectives a bandwidth-optimal schedule needs. Where a compiler departs from them on its own
(it widens 16-bit collectives, it does not turn an all-reduce and a slice into a
reduce-scatter), the code asks this record of the compiler that built the program, never
which platform it was. Each record's ``source`` says how its facts were measured (JAX 0.10.2,
the compilers of ``tests/fixtures/hlo_targets/VERSION``); re-measure them when a compiler
changes (``tests/test_targets.py`` holds the canaries).

>>> compiler_capabilities("cpu").widens_16bit, compiler_capabilities("gpu").widens_16bit
(True, False)
>>> compiler_capabilities("tpu").forms_reduce_scatter
<Support.SOMETIMES: 'sometimes'>
>>> compiler_capabilities(None) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Support(StrEnum):
    """How dependably a compiler does something."""

    #: in every program measured, as its passes are written to
    ALWAYS = "always"
    #: in some programs and not others: the compiler decides per step
    SOMETIMES = "sometimes"
    #: never: the compiler has no pass that does it
    NEVER = "never"


@dataclass(frozen=True)
class Capabilities:
    """What one compiler does to a sharded program that the formulas do not assume.

    Attributes:
      compiler: the compiler's name in words (``"XLA:CPU"``).
      forms_reduce_scatter: whether, under ``jax.jit``, it turns the all-reduce and slice
        the partitioner writes into a reduce-scatter (half the bytes). An explicit
        ``psum_scatter`` in ``shard_map`` is a reduce-scatter on every compiler.
      widens_16bit: whether a 16-bit (bfloat16, float16) program's collectives move float32
        (twice the bytes).
      source: how these facts were measured.
    """

    compiler: str
    forms_reduce_scatter: Support
    widens_16bit: bool
    source: str

    @property
    def reduce_scatter_words(self) -> str:
        """What it does with a reduce-scatter, in words (``"XLA:CPU forms no ..."``)."""
        return reduce_scatter_words(self.compiler, self.forms_reduce_scatter)

    @property
    def may_all_reduce_for_reduce_scatter(self) -> bool:
        """Whether an all-reduce where a reduce-scatter suffices may be this compiler's own
        choice, rather than what the program asked for."""
        return self.forms_reduce_scatter is not Support.ALWAYS


def reduce_scatter_words(compiler: str, forms: Support | str) -> str:
    """``compiler``'s way with reduce-scatters under jit, in words, from its
    :attr:`Capabilities.forms_reduce_scatter`.

    >>> reduce_scatter_words("XLA:TPU", "sometimes")
    'XLA:TPU forms a reduce-scatter under jit for some steps and all-reduces and slices for others'
    """
    match Support(forms):
        case Support.ALWAYS:
            return f"{compiler} forms reduce-scatters under jit"
        case Support.SOMETIMES:
            return (
                f"{compiler} forms a reduce-scatter under jit for some steps and all-reduces "
                f"and slices for others"
            )
    return f"{compiler} forms no reduce-scatter under jit: it all-reduces and slices"


#: The CPU backend over simulated devices.
CPU_COMPILER = Capabilities(
    compiler="XLA:CPU",
    forms_reduce_scatter=Support.NEVER,
    widens_16bit=True,
    source=(
        "jaxlib 0.10.2 on 8 simulated devices: a matmul contracting over the sharded axis "
        "with its output sharded, and an FSDP gradient, compile to all-reduce + slice in f32 "
        "and bf16 (tests/fixtures/hlo/seq_parallel.hlo: all-gather + all-reduce where "
        "sequence parallelism reduce-scatters); bf16 programs run their dots in f32 and move "
        "f32 through every collective"
    ),
)

#: The XLA GPU compiler (JAX's CUDA plugin, deviceless).
GPU_COMPILER = Capabilities(
    compiler="XLA:GPU",
    forms_reduce_scatter=Support.ALWAYS,
    widens_16bit=False,
    source=(
        "jax-cuda12-plugin 0.10.2 for 8 and 64 H100s: the same matmuls (4096x1024 and "
        "16384x8192 bf16) and FSDP gradients compile to reduce-scatter "
        "(tests/fixtures/hlo_targets/h100x8/fsdp_step.hlo); bf16 collectives stay bf16"
    ),
)

#: The XLA TPU compiler (libtpu, deviceless).
TPU_COMPILER = Capabilities(
    compiler="XLA:TPU",
    forms_reduce_scatter=Support.SOMETIMES,
    widens_16bit=False,
    source=(
        "libtpu 0.0.42.1 for TPU v5p: FSDP gradients on 8 and 64 chips "
        "(tests/fixtures/hlo_targets/v5px8/fsdp_step.hlo, v5px64/fsdp_step.hlo) and a "
        "4096x1024 bf16 matmul contracting over the sharded axis compile to all-reduce + "
        "slice; a 16384x8192 one on 8 chips to a ring of collective-permutes; a "
        "psum_scatter to a reduce-scatter (v5px8/shard_map_collectives.hlo); bf16 "
        "collectives stay bf16"
    ),
)

#: Each compiler by the platform (``Target.family``, ``Audit.backend``) it compiles for.
BY_PLATFORM: dict[str, Capabilities] = {
    "cpu": CPU_COMPILER,
    "gpu": GPU_COMPILER,
    "tpu": TPU_COMPILER,
}


def compiler_capabilities(platform: str | None) -> Capabilities | None:
    """The record of the compiler for ``platform`` (``"cpu"``, ``"gpu"``, ``"tpu"``; JAX's
    ``"cuda"`` and ``"rocm"`` are ``"gpu"``); None for None (HLO text, compiler unknown) or
    a platform without a record."""
    if platform is None:
        return None
    name = platform.lower()
    return BY_PLATFORM.get("gpu" if name in ("cuda", "rocm") else name)
