"""What a device's arithmetic and memory traffic cost: the one home of every kernel and step
price from FLOPs and bytes.

* **matmuls** run at the fraction of the peak a transformer's matmuls reach
  (:func:`matmul_seconds`: ``peak_flops x matmul_fraction``, the fp8 ones at ``fp8_peak_flops x
  fp8_matmul_fraction``); a compiled program's each at the rate of the arithmetic its HLO
  states (:func:`dot_seconds`: f32 ones on a GPU as TF32, ``tf32_peak_flops``, or at
  precision HIGHEST ``fp32_peak_flops``, on a TPU as one, three or six bf16 passes); on a
  GPU a matmul of a known shape at the share of that its tiles fill of the waves they run in
  (:func:`gemm_efficiency`, :func:`gemm_seconds`: a few tokens' rows leave most of each tile,
  and few tiles most multiprocessors, idle); and
  they read their operands from HBM at the fraction of its bandwidth they reach
  (:func:`matmul_read_seconds`: ``hbm_bandwidth x hbm_fraction``).
* **element-wise work** streams through HBM at the whole bandwidth (:func:`stream_seconds`).
* **a fused causal attention kernel** runs its causal half at its own measured rates
  (:func:`fused_attention_seconds`); a serving prefill's attention core runs as the kernel
  its engine runs on that GPU (:func:`prefill_attention`).
* **a kernel**, on a device that runs a program kernel by kernel (a GPU, by its target's
  :class:`~shardscope._src.targets.specs.Family`: :func:`by_kernel`), takes its arithmetic's
  time plus its traffic's, less :data:`KERNEL_OVERLAP` of the shorter
  (:func:`kernel_seconds`) and never less than the least a kernel runs, ``kernel_floor_s``
  (:func:`floor_seconds`: a norm of a few tokens takes microseconds, not nanoseconds), and
  the kernels run one after another, each launched at ``kernel_launch_s``
  (:func:`launch_seconds`); elsewhere (a TPU, one program whose copies
  into on-chip memory run beside its matmuls) a step takes the slower of its arithmetic and
  its traffic, the :func:`roofline` (:func:`work_seconds` applies the rule of the family).
* **collectives beside compute** (hidden behind it) add what the compute does not cover, or
  what they take from it, whichever is more (:func:`overlap_seconds`): on a GPU a collective
  holds some of the multiprocessors while it runs (NCCL's channels, one each), and the
  compute goes at the rest of its rate.

Each constant's source is in :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from shardscope._src.cost.flops import ATTENTION_BACKWARD, Gemm, causal_flops
from shardscope._src.hlo.cost import Cost, DotArithmetic
from shardscope._src.targets import specs
from shardscope._src.targets.engines import Engine, PrefillAttention
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import Family

#: The share of the shorter of a GPU kernel's arithmetic and memory traffic that runs beside
#: the longer (:func:`kernel_seconds`; its source in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
KERNEL_OVERLAP = 0.95


class Roofline(Protocol):
    """The device figures a roofline reads (a hardware preset has them)."""

    @property
    def peak_flops(self) -> float: ...
    @property
    def matmul_fraction(self) -> float: ...
    @property
    def hbm_bandwidth(self) -> float: ...


class Run(Protocol):
    """One kernel of a compiled program as it is priced: what it computes and moves a run,
    and whether it is a fused attention core (an audit's
    :class:`~shardscope._src.audit.overlap.Kernel`)."""

    @property
    def cost(self) -> Cost: ...
    @property
    def fused(self) -> bool: ...


_R = TypeVar("_R", bound=Run)


def matmul_seconds(hw: Hardware, flops: float, fp8_flops: float = 0.0) -> float:
    """The time of ``flops`` of matmuls at the achievable rate: ``fp8_flops`` of them at
    the fp8 one (``fp8_peak_flops x fp8_matmul_fraction``), the rest at 16 bits
    (``peak_flops x matmul_fraction``).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> round(matmul_seconds(h, 1e15) / matmul_seconds(h, 1e15, fp8_flops=1e15), 2)
    1.78
    """
    rest = (flops - fp8_flops) / (hw.peak_flops * hw.matmul_fraction)
    if not fp8_flops:
        return rest
    return rest + fp8_flops / (hw.fp8_peak_flops * hw.fp8_matmul_fraction)


#: The bf16 passes a TPU makes of an f32 matmul at the precision its HLO states (JAX's
#: "Matmul precision" page: DEFAULT one, HIGH three, HIGHEST six; its source in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
TPU_F32_PASSES = {
    DotArithmetic.F32: 1,
    DotArithmetic.F32_HIGH: 3,
    DotArithmetic.F32_HIGHEST: 6,
}


def dot_flop_seconds(hw: Hardware) -> dict[DotArithmetic, float]:
    """The seconds a FLOP of a compiled program's matmuls takes on ``hw`` by the arithmetic
    its HLO states: 16-bit at ``peak_flops x matmul_fraction`` (:func:`matmul_seconds`);
    f8 at the fp8 rate where the device has one (else the 16-bit); f32 at DEFAULT or HIGH
    precision at ``tf32_peak_flops x matmul_fraction`` and at HIGHEST at
    ``fp32_peak_flops x matmul_fraction`` where the device has those rates (a GPU), else,
    on a GPU, at the 16-bit rate, and on a TPU as :data:`TPU_F32_PASSES` bf16 passes. A
    32-bit product runs no faster than a 16-bit one: with ``peak_flops`` set below those
    rates (a slower device), they take its rate.

    >>> from shardscope._src.targets.hardware import hardware
    >>> s = dot_flop_seconds(hardware("h100"))
    >>> round(s[DotArithmetic.F32] / s[DotArithmetic.NARROW], 3)
    2.0
    >>> s = dot_flop_seconds(hardware("h100", peak_flops=1e9))
    >>> s[DotArithmetic.F32] == s[DotArithmetic.NARROW] == s[DotArithmetic.F32_HIGHEST]
    True
    >>> s = dot_flop_seconds(hardware("tpu-v5e"))
    >>> s[DotArithmetic.F32_HIGHEST] / s[DotArithmetic.NARROW]
    6.0
    """
    narrow = matmul_seconds(hw, 1.0)
    fp8 = matmul_seconds(hw, 1.0, 1.0) if hw.has_fp8 else narrow
    if hw.tf32_peak_flops > 0:
        tf32_rate = min(hw.tf32_peak_flops, hw.peak_flops)
        fp32_rate = min(hw.fp32_peak_flops or tf32_rate, tf32_rate)
        tf32 = 1.0 / (tf32_rate * hw.matmul_fraction)
        fp32 = 1.0 / (fp32_rate * hw.matmul_fraction)
        f32 = {
            DotArithmetic.F32: tf32,
            DotArithmetic.F32_HIGH: tf32,
            DotArithmetic.F32_HIGHEST: fp32,
        }
    elif by_kernel(hw):
        f32 = dict.fromkeys(TPU_F32_PASSES, narrow)
    else:
        f32 = {a: narrow * passes for a, passes in TPU_F32_PASSES.items()}
    return {DotArithmetic.NARROW: narrow, DotArithmetic.F8: fp8, **f32}


def dot_seconds(hw: Hardware, cost: Cost) -> float:
    """The time of ``cost``'s matmul FLOPs on ``hw``, each at the rate of its arithmetic
    (:func:`dot_flop_seconds`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> dot_seconds(h, Cost(10**15)) == 10**15 * matmul_seconds(h, 1.0)
    True
    >>> round(dot_seconds(h, Cost(10**15, f32_flops=10**15)), 3)  # 494.5e12 x 0.54
    3.745
    """
    return _dots_at(cost, dot_flop_seconds(hw))


def _dots_at(cost: Cost, per_flop: Mapping[DotArithmetic, float]) -> float:
    """``cost``'s matmul FLOPs, each arithmetic's at its seconds a FLOP."""
    return sum(n * per_flop[a] for a in DotArithmetic if (n := cost.flops_of(a)))


def counted_matmul_seconds(hw: Hardware, flops: float, counted: Cost) -> float:
    """The time of ``flops`` of matmuls (a compiler's count of a program) in the mix of
    arithmetic ``counted`` from its HLO: :func:`matmul_seconds` where every counted FLOP is
    16-bit's (or none is counted), else that times the counted FLOPs' :func:`dot_seconds`
    over their time at the 16-bit rate.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("a100")
    >>> round(counted_matmul_seconds(h, 1e15, Cost(10, f32_flops=10)), 3)  # 156e12 x 0.585
    10.958
    """
    narrow = counted.flops_of(DotArithmetic.NARROW)
    if not counted.flops or narrow == counted.flops:
        return matmul_seconds(hw, flops)
    return matmul_seconds(hw, flops) * dot_seconds(hw, counted) / matmul_seconds(hw, counted.flops)


#: The fewest rows a GPU matmul's tile has: a tensor-core instruction's (PTX's
#: ``mma.m16n8k16``), the least ``block_m`` of XLA's Triton tilings; a matmul of fewer rows
#: than ``tile_m`` runs tiles of the least power of two from it that holds them (sources in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
MIN_TILE_M = 16


def tile_rows(hw: Hardware, m: float) -> int:
    """The rows of the tiles a GPU matmul of ``m`` rows runs: ``tile_m``, or for fewer rows
    the least power of two of at least :data:`MIN_TILE_M` that holds them.

    >>> from shardscope._src.targets.hardware import hardware
    >>> [tile_rows(hardware("h100"), m) for m in (1, 16, 17, 100, 128, 5000)]
    [16, 16, 32, 128, 128, 128]
    """
    if m >= hw.tile_m:
        return hw.tile_m
    return min(hw.tile_m, max(MIN_TILE_M, 1 << math.ceil(math.log2(max(m, 1)))))


#: The depth of ``k`` a GPU matmul's tile takes a step (cuBLAS's ``tilesize128x128x64``):
#: the least part of ``k`` a split gives a multiprocessor.
TILE_K = 64


def gemm_efficiency(hw: Hardware, m: float, n: int, k: float) -> float:
    """The share of the flat rate (:func:`matmul_seconds`'s) a GPU matmul of ``m`` rows by
    ``n`` columns of output over ``k`` reaches: its output is cut into tiles of
    :func:`tile_rows` by ``tile_n``, each computed by one multiprocessor, in waves of
    ``sms``; where there are fewer tiles than multiprocessors, each tile's ``k`` is split
    into as many parts as the wave holds (at least :data:`TILE_K` deep), as cuBLAS's
    split-k kernels do; the useful work over that of the whole waves it takes, ``m x n x
    splits / (waves x sms x rows x tile_n)`` with ``waves = ceil(ceil(m / rows) x ceil(n /
    tile_n) x splits / sms)``: tile and wave quantization, as XLA's GPU dot cost model
    prices a matmul (sources in :data:`~shardscope._src.targets.hardware.
    TIME_MODEL_SOURCES`). 1 on a device without multiprocessors (a TPU: its MXU streams the
    rows).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> gemm_efficiency(h, 12 * 128, 11 * 128, 4096)  # 132 whole tiles: one whole wave
    1.0
    >>> gemm_efficiency(h, 1, 132 * 128, 4096) == 1 / 16  # a row of each least tile
    True
    >>> gemm_efficiency(h, 128, 33 * 128, 4096)  # 33 tiles, k split 4 ways: 132
    1.0
    >>> gemm_efficiency(hardware("tpu-v5e"), 1, 128, 128)
    1.0
    """
    if not hw.sms:
        return 1.0
    rows = tile_rows(hw, m)
    tiles = math.ceil(m / rows) * math.ceil(n / hw.tile_n)
    splits = max(1, min(hw.sms // tiles, k // TILE_K))
    waves = math.ceil(tiles * splits / hw.sms)
    return m * n * splits / (waves * hw.sms * rows * hw.tile_n)


def gemm_seconds(hw: Hardware, gemm: Gemm, *, fp8: bool = False) -> float:
    """The time of ``gemm`` (its ``times`` matmuls one after another): its FLOPs at the
    flat rate (:func:`matmul_seconds`; the fp8 one where ``fp8``) over the share of it its
    shape reaches (:func:`gemm_efficiency`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("a100")
    >>> wave = Gemm(128, 108 * 128, 4096)  # a row of tiles filling the 108 SMs once
    >>> gemm_seconds(h, wave) == matmul_seconds(h, wave.flops)
    True
    >>> row = wave._replace(m=1)  # a row of each of the least tiles: 16 rows
    >>> round(gemm_seconds(h, row) / matmul_seconds(h, row.flops))
    16
    """
    flops = gemm.flops
    return matmul_seconds(hw, flops, flops if fp8 else 0.0) / gemm_efficiency(
        hw, gemm.m, gemm.n, gemm.k
    )


def gemms_efficiency(hw: Hardware, gemms: Iterable[Gemm], *, measured: bool = False) -> float:
    """The share of the flat rate ``gemms`` reach together: their FLOPs over the FLOPs the
    flat rate would run in the time their shapes take (:func:`gemm_efficiency`; with
    ``measured``, each a batched kernel at its measured share, :func:`measured_efficiency`;
    1 where there are none).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> round(gemms_efficiency(h, [Gemm(128, 132 * 128, 64), Gemm(1, 132 * 128, 64)]) * 144, 9)
    129.0
    """
    flops = slow = 0.0
    for g in gemms:
        flops += g.flops
        share = measured_efficiency(hw, g) if measured else gemm_efficiency(hw, g.m, g.n, g.k)
        slow += g.flops / share
    return flops / slow if slow else 1.0


#: The sizes :data:`H100_MATMUL_TFLOPS` measures: the matmuls one kernel runs together
#: (``b``, a batched matmul's batch) and each of ``m``, ``n`` and ``k``.
MATMUL_BATCHES = (1, 2, 4)
MATMUL_SIZES = (256, 512, 1024, 2048, 4096)

#: An H100's bf16 matmul throughput by shape, as XLA's GPU cost model measured it:
#: ``{(b, m, n): TFLOP/s at each k of MATMUL_SIZES}`` for ``b`` matmuls of ``m`` rows by ``n``
#: columns over ``k`` in one kernel, from 6.45 TFLOP/s (one of 256 x 256 x 256: a few
#: microseconds whatever its size) to 808.70 (the table's largest shape, four of 4,096 cubed,
#: 793.13) (its source in :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
H100_MATMUL_TFLOPS: dict[tuple[int, int, int], tuple[float, ...]] = {
    (1, 256, 256): (6.45, 11.46, 19.46, 31.13, 84.31),
    (1, 256, 512): (11.46, 21.96, 39.11, 62.37, 91.68),
    (1, 256, 1024): (22.67, 41.84, 72.47, 118.99, 172.29),
    (1, 256, 2048): (41.84, 78.22, 138.08, 215.78, 285.87),
    (1, 256, 4096): (78.03, 138.08, 225.20, 324.59, 412.03),
    (1, 512, 256): (11.46, 21.79, 39.29, 60.13, 91.06),
    (1, 512, 512): (21.62, 40.72, 71.24, 114.72, 174.54),
    (1, 512, 1024): (43.46, 80.47, 138.65, 216.48, 309.61),
    (1, 512, 2048): (79.32, 143.40, 232.61, 342.39, 430.53),
    (1, 512, 4096): (134.22, 236.30, 373.35, 522.25, 644.12),
    (1, 1024, 256): (21.96, 40.92, 68.34, 113.17, 169.68),
    (1, 1024, 512): (42.91, 82.24, 141.28, 220.03, 298.93),
    (1, 1024, 1024): (82.04, 145.57, 236.30, 349.98, 470.11),
    (1, 1024, 2048): (139.52, 237.55, 373.35, 524.29, 653.53),
    (1, 1024, 4096): (209.72, 338.93, 490.29, 634.22, 738.47),
    (1, 2048, 256): (43.58, 77.31, 135.85, 216.13, 307.49),
    (1, 2048, 512): (83.89, 142.78, 235.88, 347.71, 451.15),
    (1, 2048, 1024): (141.58, 238.40, 373.35, 523.27, 653.13),
    (1, 2048, 2048): (213.04, 345.48, 493.90, 631.98, 737.97),
    (1, 2048, 4096): (299.26, 450.40, 594.21, 715.35, 753.64),
    (1, 4096, 256): (82.24, 137.24, 217.18, 304.69, 376.22),
    (1, 4096, 512): (142.48, 238.82, 370.77, 521.74, 649.96),
    (1, 4096, 1024): (216.48, 343.71, 488.06, 631.98, 738.47),
    (1, 4096, 2048): (304.00, 447.02, 593.23, 716.07, 758.43),
    (1, 4096, 4096): (392.16, 543.12, 677.44, 738.74, 783.33),
    (2, 256, 256): (11.55, 21.56, 36.95, 60.35, 91.30),
    (2, 256, 512): (22.31, 42.05, 72.94, 119.62, 175.22),
    (2, 256, 1024): (43.02, 80.66, 138.65, 216.13, 295.31),
    (2, 256, 2048): (81.84, 142.18, 226.34, 332.25, 418.78),
    (2, 256, 4096): (142.48, 228.26, 358.39, 462.82, 587.71),
    (2, 512, 256): (21.73, 40.33, 66.58, 112.60, 168.62),
    (2, 512, 512): (43.35, 81.05, 139.81, 216.48, 312.13),
    (2, 512, 1024): (82.04, 141.28, 235.06, 349.53, 461.23),
    (2, 512, 2048): (138.65, 235.47, 371.28, 525.31, 644.12),
    (2, 512, 4096): (206.81, 335.54, 486.74, 627.19, 734.68),
    (2, 1024, 256): (43.69, 76.43, 136.40, 209.72, 306.43),
    (2, 1024, 512): (81.44, 146.21, 237.55, 347.71, 449.64),
    (2, 1024, 1024): (140.40, 238.40, 373.87, 519.22, 649.57),
    (2, 1024, 2048): (211.70, 339.79, 493.45, 631.24, 739.00),
    (2, 1024, 4096): (298.26, 445.91, 596.52, 714.64, 747.74),
    (2, 2048, 256): (78.77, 139.23, 217.18, 309.97, 378.63),
    (2, 2048, 512): (141.88, 234.24, 371.79, 518.72, 645.28),
    (2, 2048, 1024): (215.78, 342.39, 488.95, 629.39, 737.21),
    (2, 2048, 2048): (299.59, 447.02, 600.19, 717.74, 756.70),
    (2, 2048, 4096): (393.89, 542.29, 678.72, 729.08, 779.35),
    (2, 4096, 256): (135.03, 234.65, 366.21, 508.40, 584.19),
    (2, 4096, 512): (211.03, 340.65, 487.18, 622.82, 729.69),
    (2, 4096, 1024): (301.61, 445.54, 598.18, 713.45, 750.61),
    (2, 4096, 2048): (394.47, 546.43, 680.88, 733.30, 783.19),
    (2, 4096, 4096): (464.02, 607.67, 692.97, 763.01, 807.67),
    (4, 256, 256): (22.55, 41.22, 71.39, 117.73, 171.63),
    (4, 256, 512): (43.13, 80.66, 135.03, 204.60, 286.48),
    (4, 256, 1024): (81.44, 140.10, 228.26, 327.76, 430.53),
    (4, 256, 2048): (140.40, 228.65, 358.87, 478.49, 588.03),
    (4, 256, 4096): (206.49, 335.13, 481.93, 602.89, 664.03),
    (4, 512, 256): (42.37, 77.85, 132.36, 210.37, 293.05),
    (4, 512, 512): (77.49, 142.18, 237.13, 343.27, 442.23),
    (4, 512, 1024): (139.23, 236.30, 375.43, 518.22, 641.81),
    (4, 512, 2048): (209.06, 336.39, 487.18, 629.39, 737.48),
    (4, 512, 4096): (294.98, 442.23, 592.25, 699.73, 730.06),
    (4, 1024, 256): (80.85, 135.85, 218.24, 313.96, 384.05),
    (4, 1024, 512): (134.49, 236.72, 371.79, 514.24, 642.19),
    (4, 1024, 1024): (214.75, 337.65, 489.85, 626.09, 735.94),
    (4, 1024, 2048): (300.28, 442.23, 598.18, 712.74, 743.59),
    (4, 1024, 4096): (391.31, 541.75, 674.88, 718.70, 773.53),
    (4, 2048, 256): (136.12, 235.47, 368.22, 493.90, 561.87),
    (4, 2048, 512): (213.38, 335.54, 487.18, 621.38, 730.44),
    (4, 2048, 1024): (300.94, 443.33, 596.54, 710.62, 745.02),
    (4, 2048, 2048): (394.76, 542.29, 674.04, 725.75, 779.14),
    (4, 2048, 4096): (458.86, 607.32, 688.63, 752.46, 801.94),
    (4, 4096, 256): (206.49, 335.13, 477.64, 588.67, 622.46),
    (4, 4096, 512): (298.59, 441.51, 589.00, 703.63, 728.59),
    (4, 4096, 1024): (393.31, 542.04, 673.84, 720.52, 777.59),
    (4, 4096, 2048): (458.47, 607.49, 687.86, 759.30, 808.70),
    (4, 4096, 4096): (503.87, 619.86, 725.51, 764.58, 793.13),
}


def _between(grid: tuple[int, ...], x: float) -> tuple[int, float]:
    """The index ``i`` of the measured size at or below ``x`` on ``grid`` and ``x``'s share
    of the way from it to the next in the logarithm of the size; held at the grid's ends
    (``(0, 0.0)`` below it, the last index above)."""
    if x <= grid[0]:
        return 0, 0.0
    if x >= grid[-1]:
        return len(grid) - 1, 0.0
    i = bisect.bisect_right(grid, x) - 1
    return i, math.log(x / grid[i]) / math.log(grid[i + 1] / grid[i])


@functools.cache
def measured_tflops(b: float, m: float, n: float, k: float) -> float:
    """An H100's bf16 throughput (TFLOP/s) for ``b`` matmuls of ``m`` by ``n`` over ``k`` in
    one kernel, from :data:`H100_MATMUL_TFLOPS`: at a measured shape as measured; between
    them interpolated linearly in the logarithm of each of ``b``, ``m``, ``n`` and ``k`` (the
    16 measured shapes around it, as XLA's model weighs the same 16); beyond the measured
    sizes held at the nearest (a batch of more than 4 as 4, fewer than 256 rows as 256).

    >>> measured_tflops(1, 256, 256, 256), measured_tflops(4, 4096, 4096, 4096)
    (6.45, 793.13)
    >>> measured_tflops(64, 16, 8192, 4096)  # held at the edges: four of 256 by 4,096
    664.03
    >>> measured_tflops(1, 256, 256, 256 * 2**0.5)  # halfway from k 256 to 512, in log size
    8.955
    """
    at = [_between(MATMUL_BATCHES, b), *(_between(MATMUL_SIZES, x) for x in (m, n, k))]
    total = 0.0
    for up in itertools.product((0, 1), repeat=4):
        weight = math.prod(w if u else 1 - w for u, (_, w) in zip(up, at, strict=True))
        if weight:
            bi, mi, ni, ki = (i + u for u, (i, _) in zip(up, at, strict=True))
            row = H100_MATMUL_TFLOPS[MATMUL_BATCHES[bi], MATMUL_SIZES[mi], MATMUL_SIZES[ni]]
            total += weight * row[ki]
    return total


#: The throughput :func:`measured_efficiency` is a share of: the table's at its largest
#: shape, four matmuls of 4,096 cubed.
H100_LARGE_MATMUL_TFLOPS = H100_MATMUL_TFLOPS[4, 4096, 4096][-1]


def measured_efficiency(hw: Hardware, gemm: Gemm) -> float:
    """The share of the flat rate (:func:`matmul_seconds`'s) ``gemm``'s ``times`` matmuls
    reach run as one batched kernel (a layer's experts on a device, each its own tokens), on
    a GPU whose preset measures matmuls by shape (``matmul_by_shape``): the H100's measured
    throughput at that shape (:func:`measured_tflops`) over its throughput at the table's
    largest (:data:`H100_LARGE_MATMUL_TFLOPS`), at most 1 (the few shapes measured above it,
    by up to 2%, are a saturated kernel's noise); 1 elsewhere. The flat rate was calibrated
    on dense layers' large matmuls, which the table measures at about its largest shape's
    rate: a matmul of the shape it names runs that much slower than they do.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> measured_efficiency(h, Gemm(4096, 4096, 4096, times=4))
    1.0
    >>> round(measured_efficiency(h, Gemm(256, 1536, 2048, times=32)), 3)  # 32 experts' 256 rows
    0.524
    >>> measured_efficiency(hardware("a100"), Gemm(256, 1536, 2048, times=32))
    1.0
    """
    if not hw.matmul_by_shape:
        return 1.0
    rate = measured_tflops(gemm.times, gemm.m, gemm.n, gemm.k)
    return min(1.0, rate / H100_LARGE_MATMUL_TFLOPS)


#: An H100's HBM bandwidth by the bytes one kernel moves, as XLA's GPU matmul cost model
#: measured it: ``(bytes, GiB/s)``, from 8 KiB (1.42 GiB/s: a few microseconds whatever
#: the size) to 1 GiB (3,126 GiB/s: the datasheet's 3.35 TB/s) (its source in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
H100_HBM_BY_SIZE: tuple[tuple[int, float], ...] = (
    (8192, 1.42),
    (16384, 3.03),
    (32768, 6.02),
    (65536, 11.77),
    (131072, 23.68),
    (262144, 47.35),
    (524288, 92.56),
    (1048576, 179.06),
    (2097152, 346.75),
    (4194304, 639.38),
    (8388608, 1069.98),
    (16777216, 1583.95),
    (33554432, 1974.72),
    (67108864, 2343.19),
    (134217728, 2632.96),
    (268435456, 2766.69),
    (536870912, 2968.89),
    (1073741824, 3126.0),
)

#: The H100 SXM's datasheet HBM bandwidth, which :data:`H100_HBM_BY_SIZE` is a share of.
H100_HBM_BANDWIDTH = 3.35e12


def read_seconds_per_byte(hw: Hardware, size: float) -> float:
    """The seconds a byte of a matmul kernel that moves ``size`` bytes through HBM takes:
    on a GPU whose preset measures it by size (``hbm_by_size``), a byte at the device's
    ``hbm_bandwidth`` plus what a byte of a transfer of that size took on an H100 beyond
    its datasheet bandwidth (:data:`H100_HBM_BY_SIZE`, interpolated linearly between its
    sizes and held at its ends, as XLA's model holds it): the transfer's start and ramp, a
    few microseconds whatever its size, taken to last as long on every GPU; elsewhere a
    byte at ``hbm_bandwidth x hbm_fraction``, whatever the size.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> round(1 / read_seconds_per_byte(h, 8 * 2**20) / 2**30, 2)  # 8 MiB: as measured
    1069.98
    >>> 1 / read_seconds_per_byte(h, 2**31) == h.hbm_bandwidth  # 2 GiB: the datasheet's
    True
    >>> 1 / read_seconds_per_byte(hardware("h100", hbm_fraction=0.8), 1) == 0.8 * 3.35e12
    True
    """
    if not hw.hbm_by_size:
        return 1 / (hw.hbm_bandwidth * hw.hbm_fraction)
    table = H100_HBM_BY_SIZE
    i = bisect.bisect_left(table, size, key=lambda e: e[0])
    if i == 0:
        gib_s = table[0][1]
    elif i == len(table):
        gib_s = table[-1][1]
    else:
        (s0, b0), (s1, b1) = table[i - 1], table[i]
        gib_s = b0 + (size - s0) / (s1 - s0) * (b1 - b0)
    beyond = max(0.0, 1 / (gib_s * 2**30) - 1 / H100_HBM_BANDWIDTH)
    return 1 / hw.hbm_bandwidth + beyond


def matmul_read_seconds(hw: Hardware, nbytes: float, size: float | None = None) -> float:
    """The time matmuls take to move ``nbytes`` of their operands through HBM, each kernel
    ``size`` of them (all of them in one where None; :func:`read_seconds_per_byte`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> round(matmul_read_seconds(hardware("h100"), 16e9) * 1e3, 2)  # one large read
    4.78
    >>> round(matmul_read_seconds(hardware("h100"), 16e9, 8 * 2**20) * 1e3, 2)  # 8 MiB each
    13.93
    """
    return nbytes * read_seconds_per_byte(hw, nbytes if size is None else size)


def stream_seconds(hw: Hardware, nbytes: float) -> float:
    """The time element-wise work takes to move ``nbytes`` through HBM, at the whole
    bandwidth (``hbm_bandwidth``).

    >>> from shardscope._src.targets.hardware import hardware
    >>> stream_seconds(hardware("tpu-v5e"), 8.19e11)
    1.0
    """
    return nbytes / hw.hbm_bandwidth


def fused_attention_seconds(
    hw: Hardware, flops: float, *, backward: bool = False, rate: float | None = None
) -> float:
    """The time of a fused causal attention kernel over a core of ``flops`` (counted whole,
    :func:`~shardscope._src.cost.flops.attention_core_flops`): its forward's causal half at
    ``rate`` (the hardware's ``attention_fwd_flops`` where None), or its backward's
    (:data:`~shardscope._src.cost.flops.ATTENTION_BACKWARD` times the forward's) at
    ``attention_bwd_flops``.

    >>> from shardscope._src.targets.hardware import hardware
    >>> fused_attention_seconds(hardware("h100", attention_fwd_flops=5e14,
    ...                                  attention_bwd_flops=5e14), 1e15)
    1.0
    >>> fused_attention_seconds(hardware("h100"), 1e15, rate=2.5e14)
    2.0
    """
    if backward:
        return causal_flops(ATTENTION_BACKWARD * flops) / hw.attention_bwd_flops
    return causal_flops(flops) / (hw.attention_fwd_flops if rate is None else rate)


def prefill_attention(hw: Hardware, engine: Engine) -> PrefillAttention | None:
    """The fused causal kernel a serving prefill's attention core runs as on ``hw`` under
    ``engine``, and its forward rate: the hardware's own (``attention_fwd_flops``, named
    ``"attention_fwd_flops"``) where it gives one, else the kernel the engine runs on that
    GPU at its published rate (:meth:`~shardscope._src.targets.engines.Engine.
    prefill_attention`); None where neither is known (a B200, a TPU): the core at the
    matmul rate, counted non-causal. The one choice both the estimated and the compiled
    prefill price by; a decode step's attention, one query a sequence against its cache,
    reads the cache and is not priced so.

    >>> from shardscope._src.targets.engines import engine
    >>> from shardscope._src.targets.hardware import hardware, h100_attention
    >>> prefill_attention(hardware("h100"), engine("vllm"))
    PrefillAttention(kernel='flash-attention-3', flops=579000000000000.0)
    >>> prefill_attention(hardware("h100", **h100_attention("cudnn")), engine("vllm")).kernel
    'attention_fwd_flops'
    """
    if hw.attention_fwd_flops > 0:
        return PrefillAttention("attention_fwd_flops", hw.attention_fwd_flops)
    return engine.prefill_attention(hw)


def step_matmul_seconds(
    hw: Hardware,
    flops: float,
    of: tuple[int, int],
    *,
    fp8: bool,
    attention: float = 0.0,
    shape: float = 1.0,
) -> float:
    """The time of ``flops`` of a step's matmuls on one device, of which the weights' and
    the attention core's are in the ratio ``of``: the weights' share at the fp8 rate where
    ``fp8``, the rest at 16 bits, the weights' at the share ``shape`` of the rate their
    shapes reach (:func:`gemms_efficiency`); the attention's share (counted whole) as a fused
    causal kernel's forward at ``attention`` FLOP/s where that is given
    (:func:`prefill_attention`'s rate; 0: at the matmul rate, non-causal).

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> step_matmul_seconds(h, 3e15, (2, 1), fp8=False) == matmul_seconds(h, 3e15)
    True
    >>> slow = step_matmul_seconds(h, 3e15, (2, 1), fp8=False, shape=0.5)
    >>> slow == matmul_seconds(h, 3e15) + matmul_seconds(h, 2e15)
    True
    >>> fused = step_matmul_seconds(h, 3e15, (2, 1), fp8=False, attention=5e14)
    >>> fused == matmul_seconds(h, 2e15) + 1e15 / 2 / 5e14
    True
    """
    w, a = of
    share = flops / (w + a) if w + a else 0.0
    fp8_flops = share * w if fp8 else 0.0
    kernel = share * a if attention > 0 else 0.0
    fused = fused_attention_seconds(hw, kernel, rate=attention) if kernel else 0.0
    # the weights' matmuls' time stretched by their shapes (none: the flat rate exactly)
    stretch = matmul_seconds(hw, share * w, fp8_flops) * (1 / shape - 1) if shape != 1 else 0.0
    return matmul_seconds(hw, flops - kernel, fp8_flops) + fused + stretch


def flop_seconds(
    hw: Hardware, *, fp8: bool, attention: float = 0.0, shape: float = 1.0
) -> tuple[float, float]:
    """The seconds a FLOP of the weights' matmuls (at the share ``shape`` of the rate,
    :func:`step_matmul_seconds`) and one of the attention core's (counted whole; a fused
    causal kernel's at ``attention`` FLOP/s where given) take.

    >>> from shardscope._src.targets.hardware import hardware
    >>> weights, attention = flop_seconds(hardware("h100"), fp8=True)
    >>> round(attention / weights, 2)
    1.78
    """
    return (
        step_matmul_seconds(hw, 1.0, (1, 0), fp8=fp8, attention=attention, shape=shape),
        step_matmul_seconds(hw, 1.0, (0, 1), fp8=fp8, attention=attention),
    )


def roofline(compute_s: float, memory_s: float) -> float:
    """The slower of a piece of work's arithmetic and its memory traffic, each hiding the
    other.

    >>> roofline(1.0, 0.5)
    1.0
    """
    return max(compute_s, memory_s)


def roofline_seconds(cost: Cost, device: Roofline) -> float:
    """The :func:`roofline` time of ``cost`` on ``device``: its matmuls' FLOPs at
    ``peak_flops x matmul_fraction``, its bytes at the whole ``hbm_bandwidth`` (what the
    compute a compiler scheduled beside an asynchronous collective takes).

    >>> from shardscope._src.targets.hardware import hardware
    >>> roofline_seconds(Cost(bytes=8_190), hardware("tpu-v5e")) * 1e8
    1.0
    """
    return roofline(
        cost.flops / (device.peak_flops * device.matmul_fraction),
        cost.bytes / device.hbm_bandwidth,
    )


def kernel_seconds(compute_s: float, memory_s: float) -> float:
    """One GPU kernel's time from its arithmetic's (``compute_s``) and its memory
    traffic's (``memory_s``): the longer, and the share of the shorter that does not
    run beside it (:data:`KERNEL_OVERLAP`).

    >>> round(kernel_seconds(1.0, 0.5), 3)
    1.025
    """
    return compute_s + memory_s - KERNEL_OVERLAP * min(compute_s, memory_s)


def launch_seconds(hw: Hardware, kernels: int) -> float:
    """What launching ``kernels`` kernels costs (``kernel_launch_s`` each; 0 on a TPU).

    >>> from shardscope._src.targets.hardware import hardware
    >>> launch_seconds(hardware("h100"), 1000)
    0.001
    """
    return kernels * hw.kernel_launch_s


def floor_seconds(hw: Hardware, kernels: int) -> float:
    """What ``kernels`` kernels whose own work is under the least a kernel runs take on the
    device: ``kernel_floor_s`` each (0 on a TPU). A kernel timed by its work takes the longer
    of the two (:func:`kernels_seconds`); one whose work is not priced (an estimate's norms,
    rotary embeddings and activations of a few tokens) takes this.

    >>> from shardscope._src.targets.hardware import hardware
    >>> round(floor_seconds(hardware("h100"), 500) * 1e3, 6)
    1.0
    >>> floor_seconds(hardware("tpu-v5e"), 500)
    0.0
    """
    return kernels * hw.kernel_floor_s


def serial_seconds(compute_s: float, comm_s: float) -> float:
    """A step whose communication hides behind none of its compute: the two one after the
    other (a program's plan and ``suggest``'s screen time their steps so, and a training plan
    the time model did not time).

    >>> serial_seconds(2.0, 0.5)
    2.5
    """
    return compute_s + comm_s


def hidden_seconds(compute_s: float, comm_s: float) -> float:
    """A step whose communication hides wholly behind its compute (or the reverse): the
    longer of the two, the least a step of them can take.

    >>> hidden_seconds(2.0, 0.5)
    2.0
    """
    return max(compute_s, comm_s)


def overlap_seconds(compute_s: float, comm_s: float, held_s: float = 0.0) -> float:
    """What collectives of ``comm_s`` seconds add to compute of ``compute_s`` seconds that
    runs beside them: the communication the compute does not cover, or the compute they take
    from it, whichever is more. ``held_s`` is each collective's seconds times the share of
    the device's multiprocessors it holds while it runs
    (:func:`~shardscope._src.cost.links.held_share`; 0 on a TPU, whose transfers are DMAs
    beside its cores). The compute goes at the rest of its rate while they run: where they
    outlast it the two take ``comm_s``, otherwise the compute finishes ``held_s`` late, so
    together they take ``max(comm_s, compute_s + held_s)``. The one overlap rule of the
    training step and of the audit's exposed time.

    >>> overlap_seconds(10.0, 4.0, 4.0 * 0.25)  # hidden: the compute a quarter slower for 4 s
    1.0
    >>> overlap_seconds(2.0, 4.0, 4.0 * 0.25)  # exposed: what the compute does not cover
    2.0
    """
    return max(0.0, comm_s - compute_s, held_s)


def by_kernel(hw: Hardware) -> bool:
    """Whether ``hw`` runs a compiled program kernel by kernel, each reading its operands
    from HBM: a GPU (by its target's family, whether or not its compiler is at hand). A TPU
    runs it as one program whose copies of the weights into on-chip memory run beside its
    matmuls.

    >>> from shardscope._src.targets.hardware import hardware
    >>> by_kernel(hardware("h100")), by_kernel(hardware("tpu-v5e"))
    (True, False)
    """
    return specs.family(hw.name) is Family.GPU


def work_seconds(hw: Hardware, *kernels: tuple[float, float]) -> float:
    """A step's matmuls and traffic, ``kernels`` its kinds of kernel (each its matmuls'
    time and its reads'): where :func:`by_kernel`, one kind after another, each as
    :func:`kernel_seconds` times it; elsewhere the :func:`roofline` of their matmuls and
    their reads.

    >>> from shardscope._src.targets.hardware import hardware
    >>> work_seconds(hardware("tpu-v5e"), (1.0, 0.5), (0.25, 1.0))
    1.5
    """
    if by_kernel(hw):
        return sum(kernel_seconds(compute_s, memory_s) for compute_s, memory_s in kernels)
    return roofline(sum(k[0] for k in kernels), sum(k[1] for k in kernels))


def moved_seconds(hw: Hardware, cost: Cost) -> float:
    """The time of ``cost``'s bytes through HBM: its matmuls' reads and writes at the
    bandwidth they reach (:func:`matmul_read_seconds`), the element-wise work's at the whole
    of it (:func:`stream_seconds`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> moved_seconds(hardware("tpu-v5e"), Cost(bytes=2 * 819, matmul_bytes=819)) * 1e9
    2.0
    """
    rest = cost.bytes - cost.matmul_bytes
    return matmul_read_seconds(hw, cost.matmul_bytes) + stream_seconds(hw, rest)


def kernels_seconds(
    hw: Hardware, runs: Mapping[_R, int], flop_s: tuple[float, float] | None = None
) -> float:
    """A compiled program's kernels one after another, ``runs`` each kernel's launches:
    each :func:`kernel_seconds` of its FLOPs (a FLOP of a matmul taking ``flop_s[0]``
    seconds, one of a fused attention core ``flop_s[1]``; None: each at the rate of the
    arithmetic its HLO states, :func:`dot_seconds`) and its bytes (:func:`moved_seconds`),
    and never less than the least a kernel runs (:func:`floor_seconds`)."""

    per_flop = dot_flop_seconds(hw) if flop_s is None else {}  # once for every kernel

    def compute_s(k: _R) -> float:
        return _dots_at(k.cost, per_flop) if flop_s is None else k.cost.flops * flop_s[k.fused]

    return sum(
        n
        * max(
            kernel_seconds(compute_s(k), moved_seconds(hw, k.cost)),
            floor_seconds(hw, 1),
        )
        for k, n in runs.items()
    )


def compiled_step_seconds(
    hw: Hardware,
    *,
    memory_s: float,
    compute_s: float,
    kernels_s: float | None,
    comm_s: float,
    kernels: int,
    skipped_s: float = 0.0,
) -> float:
    """A compiled step's time: where it runs kernel by kernel its kernels one after another
    (``kernels_s``, :func:`kernels_seconds`) less the reads ``skipped_s`` a server does not
    make (those reads' whole time: the kernels that make them are memory-bound wherever the
    server skips some), and never less than the :func:`roofline` of its traffic
    (``memory_s``, those reads left out) and its matmuls (``compute_s``), which is the
    step's time elsewhere (``kernels_s`` None); then its collectives (``comm_s``) and its
    kernels' launches (:func:`launch_seconds`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> compiled_step_seconds(hardware("tpu-v5e"), memory_s=2.0, compute_s=1.0,
    ...                       kernels_s=None, comm_s=0.5, kernels=10)
    2.5
    """
    work = roofline(compute_s, memory_s)
    if kernels_s is not None:
        work = max(work, kernels_s - skipped_s)
    return work + comm_s + launch_seconds(hw, kernels)
