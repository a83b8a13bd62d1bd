import pytest

from shardscope._src.cost.compute import matmul_read_seconds
from shardscope._src.targets.hardware import PRESETS, hardware


def test_presets_named_in_the_planner_exist():
    assert list(PRESETS) == ["a100", "h100", "h200", "b200", "tpu-v5e", "tpu-v5p", "tpu-v6e"]
    assert hardware("H200").memory_bytes == 141e9
    assert hardware("tpu-v5p").link_bandwidth == 2 * 9e10


def test_override_keeps_the_rest_and_says_so():
    h = hardware("h100", link_bandwidth=370e9)
    assert h.link_bandwidth == 370e9
    assert h.peak_flops == PRESETS["h100"].peak_flops
    assert "overridden: link_bandwidth=3.7e+11" in h.source


def test_matmuls_read_their_operands_at_the_bandwidth_the_compiler_prices():
    # XLA's GPU cost model: a matmul reads its operands at 0.8 of the HBM bandwidth
    assert matmul_read_seconds(hardware("h100"), 3.35e12 * 0.8) == pytest.approx(1.0)
    assert matmul_read_seconds(hardware("a100"), 2.039e12 * 0.8) == pytest.approx(1.0)
    # no figure for a TPU: the datasheet's
    assert matmul_read_seconds(hardware("tpu-v5e"), 8.19e11) == 1.0
    assert matmul_read_seconds(hardware("h100", hbm_fraction=1), 3.35e12) == 1.0


@pytest.mark.parametrize(
    "args, kw, words",
    [
        (("v100",), {}, "unknown hardware preset 'v100'; choose one of a100, h100"),
        (("h100",), {"warp_speed": 9}, "unknown hardware setting 'warp_speed'"),
        (("h100",), {"peak_flops": 0}, "must be a finite positive number"),
        (("h100",), {"peak_flops": float("inf")}, "must be a finite positive number"),
        (("h100",), {"kernel_launch_s": float("nan")}, "must be 0 or a finite positive"),
        (("h100",), {"kernel_launch_s": -1e-6}, "must be 0 or a finite positive"),
        # microseconds given as seconds: above a small model's whole decode step
        (("h100",), {"kernel_launch_s": 5.0}, r"kernel_launch_s=5.0 .* at most 0.001"),
        (("h100",), {"kernel_floor_s": float("nan")}, "must be 0 or a finite positive"),
        (("h100",), {"kernel_floor_s": -2e-6}, "must be 0 or a finite positive"),
        (("h100",), {"kernel_floor_s": 2.0}, r"kernel_floor_s=2.0 .* at most 0.001"),
        (("h100",), {"hbm_fraction": 1.2}, "hbm_fraction=1.2 is a fraction of the bandwidth"),
        (("h100",), {"sms": 0}, r"sms=0 is the GPU's streaming multiprocessors \(132 on h100"),
        (("a100",), {"sms": 10.5}, r"sms=10.5 .* give a whole number of at least 1"),
        (("h100",), {"tile_m": -128}, r"tile_m=-128 is the side of the output tile .*at least 1"),
        (("tpu-v5e",), {"tile_n": 256}, "tile_n=256 on tpu-v5e: it has no streaming"),
        (("h100",), {"comm_sms": -2}, r"comm_sms=-2 is the multiprocessors a collective holds"),
        (("a100",), {"comm_sms_net": 200}, r"comm_sms_net=200 is more .* a100 has \(108\)"),
        (("tpu-v5p",), {"comm_sms": 4}, "a TPU's collectives hold none of its cores"),
    ],
)
def test_bad_presets(args, kw, words):
    with pytest.raises(ValueError, match=words):
        hardware(*args, **kw)


def test_a_launch_of_a_millisecond_is_still_taken():
    assert hardware("h100", kernel_launch_s=1e-3).kernel_launch_s == 1e-3
