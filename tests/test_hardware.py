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
    # XLA's GPU cost model: an H100 kernel moving 8 MiB reaches 1,069.98 GiB/s, one moving
    # 16 MiB 1,583.95; between them the line through the two
    mib, gib = 2**20, 2**30
    h100 = hardware("h100")
    assert matmul_read_seconds(h100, 8 * mib) == pytest.approx(8 * mib / (1069.98 * gib))
    halfway = (1069.98 + 1583.95) / 2
    assert matmul_read_seconds(h100, 12 * mib) == pytest.approx(12 * mib / (halfway * gib))
    # a hundred kernels of 8 MiB each take a hundred times one
    assert matmul_read_seconds(h100, 800 * mib, 8 * mib) == pytest.approx(
        100 * 8 * mib / (1069.98 * gib)
    )
    # from a GiB up (3,126 GiB/s, past the datasheet's 3.35e12 B/s) the datasheet's
    assert matmul_read_seconds(h100, 3.35e12) == pytest.approx(1.0)
    # measured on an H100 only: the others at 0.8 of their bandwidth, whatever the size
    assert matmul_read_seconds(hardware("a100"), 2.039e12 * 0.8) == pytest.approx(1.0)
    assert matmul_read_seconds(hardware("h200"), 4.8e12 * 0.8, 8 * mib) == pytest.approx(1.0)
    # a fraction given is the fraction at every size
    assert matmul_read_seconds(hardware("h100", hbm_fraction=0.5), 8 * mib) == pytest.approx(
        8 * mib / (0.5 * 3.35e12)
    )
    assert hardware("h100", hbm_fraction=0.5, hbm_by_size=True).hbm_by_size
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
        (("h100",), {"hbm_by_size": "yes"}, "hbm_by_size='yes' says whether .* True or False"),
        (("h100",), {"sms": 0}, r"sms=0 is the GPU's streaming multiprocessors \(132 on h100"),
        (("a100",), {"sms": 10.5}, r"sms=10.5 .* give a whole number of at least 1"),
        (("h100",), {"tile_m": -128}, r"tile_m=-128 is the side of the output tile .*at least 1"),
        (("tpu-v5e",), {"tile_n": 256}, "tile_n=256 on tpu-v5e: it has no streaming"),
        (("h100",), {"comm_sms": -2}, r"comm_sms=-2 is the multiprocessors a collective holds"),
        (("a100",), {"comm_sms_net": 200}, r"comm_sms_net=200 is more .* a100 has \(108\)"),
        (("tpu-v5p",), {"comm_sms": 4}, "a TPU's collectives hold none of its cores"),
        (("h100",), {"exchange_sms": -2}, r"exchange_sms=-2 is the multiprocessors a mixture's"),
        (("h100",), {"exchange_sms": 2.5}, r"exchange_sms=2.5 .* a whole number of at least 0"),
        (("h100",), {"exchange_sms": True}, r"exchange_sms=True .* a whole number of at least 0"),
        (("h100",), {"exchange_sms": 133}, r"exchange_sms=133 is more .* h100 has \(132\); give"),
        (("tpu-v5p",), {"exchange_sms": 8}, r"exchange_sms=8 .*a TPU's collectives hold none"),
    ],
)
def test_bad_presets(args, kw, words):
    with pytest.raises(ValueError, match=words):
        hardware(*args, **kw)


def test_a_launch_of_a_millisecond_is_still_taken():
    assert hardware("h100", kernel_launch_s=1e-3).kernel_launch_s == 1e-3
