"""The communication formulas (bandwidth-optimal bytes per device), on exact integers."""

import pytest

from shardscope import comm
from shardscope._src.base.errors import ShardscopeError

S = 4096 * 1024 * 2  # the scaling book's worked example: M=4096, K=1024, bf16


@pytest.mark.parametrize(
    "kind, payload, n, sent",
    [
        ("all-reduce", 16 * 1024 * 4, 8, 2 * 7 * 16 * 1024 * 4 // 8),
        ("all-gather", S, 8, 7 * S // 8),  # case d of the worked example: 7 MiB
        ("reduce-scatter", S, 8, 7 * S // 8),
        ("all-to-all", S, 8, 7 * S // 64),  # case d': 0.875 MiB
        ("ragged-all-to-all", S, 8, 7 * S // 64),
        ("collective-permute", 1000, 8, 1000),
        ("collective-broadcast", 1000, 4, 1000),
        ("all-reduce", 12345, 1, 0),
        ("collective-permute", 12345, 1, 0),
    ],
)
def test_traffic_bytes(kind, payload, n, sent):
    assert comm.traffic_bytes(kind, payload, n) == sent


def test_worked_example_in_mebibytes():
    mib = 2**20
    assert comm.traffic_bytes("all-reduce", 4096 * 1024 * 2, 8) == 14 * mib
    assert comm.traffic_bytes("all-gather", 4096 * 1024 * 2, 8) == 7 * mib
    assert comm.traffic_bytes("all-to-all", 4096 * 1024 * 2, 8) * 8 == 7 * mib


def test_fractions_round_up():
    # 2 * 2 / 3 * 10 = 13.33 bytes: a device cannot send a third of a byte.
    assert comm.traffic_bytes("all-reduce", 10, 3) == 14


def test_alpha_beta_time():
    t = comm.alpha_beta_time("all-reduce", 8_000, 8, bandwidth_bytes_per_s=1000.0, alpha_s=0.5)
    assert t == pytest.approx(2 * 7 * 0.5 + 2 * 7 * 8_000 / (8 * 1000.0), rel=1e-12)
    t = comm.alpha_beta_time("all-to-all", 64_000, 8, bandwidth_bytes_per_s=1000.0)
    assert t == pytest.approx(7 * 64_000 / (64 * 1000.0), rel=1e-12)
    assert comm.alpha_beta_time(
        "collective-permute", 10, 2, bandwidth_bytes_per_s=5.0, alpha_s=1.0
    ) == pytest.approx(3.0, rel=1e-12)
    assert comm.latency_steps("all-gather", 1) == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: comm.traffic_bytes("all-sum", 1, 2),
        lambda: comm.traffic_bytes("all-reduce", -1, 2),
        lambda: comm.traffic_bytes("all-reduce", 1.5, 2),
        lambda: comm.traffic_bytes("all-reduce", 1, 0),
        lambda: comm.alpha_beta_time("all-reduce", 1, 2, bandwidth_bytes_per_s=0),
        lambda: comm.alpha_beta_time("all-reduce", 1, 2, bandwidth_bytes_per_s=1, alpha_s=-1),
    ],
)
def test_bad_input_is_a_clear_error(call):
    with pytest.raises(ShardscopeError):
        call()


def test_format_bytes():
    assert comm.format_bytes(0) == "0 B"
    assert comm.format_bytes(1023) == "1023 B"
    assert comm.format_bytes(65536) == "64 KiB"
    assert comm.format_bytes(14 * 2**20) == "14 MiB"
