"""FSDP's weight gathers and gradient reduce-scatters beside compute (``fsdp_overlap``, on by
default) or alone on the critical path (unset: a JAX program's scanned layers under XLA's
default GPU flags)."""

import pytest

from shardscope import ShardscopeError, hardware
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.compute import matmul_seconds
from shardscope._src.train.timing import (
    PER_MICROBATCH_FWD_BWD,
    PER_STEP_BWD,
    CommItem,
    StepWork,
    step_time,
)

M = 4
FLOPS = 1e13  # a micro-batch's forward: about 28 ms of forward and backward on an H100
#: the step's FSDP gathers and reduce-scatters (shorter than the compute they hide behind,
#: holding no multiprocessors), and a once-a-step gradient reduction behind the last backward
GATHERS, REDUCTION = 0.04, 0.002


def _work() -> StepWork:
    return StepWork(
        microbatches=M, stages=1, fwd_flops=FLOPS, recompute_flops=0.0, act_bytes=0,
        recompute_act_bytes=0, p2p_bytes=0, p2p_bandwidth=1e9, optimizer_params=0,
        model_flops=0, devices=1,
    )  # fmt: skip


COMM = [
    CommItem("gathers and reduce-scatters", PER_MICROBATCH_FWD_BWD, GATHERS, 0.0, "all-gather"),
    CommItem("gradient reduction", PER_STEP_BWD, REDUCTION, 0.0, "all-reduce"),
]


def test_unset_the_step_pays_fsdps_collectives_in_full_and_hides_the_others_as_before():
    on, off = hardware("h100"), hardware("h100", fsdp_overlap=False)
    compute = matmul_seconds(on, 3 * FLOPS)  # one micro-batch's forward and backward
    assert GATHERS / M < compute and REDUCTION < 2 * compute / 3
    # by default both hide behind the compute they run beside
    assert step_time(on, _work(), COMM).step_s == pytest.approx(M * compute, rel=1e-12)
    # unset, each micro-batch waits for its gathers and reduce-scatters; the step's gradient
    # reduction still hides behind the last backward
    t = step_time(off, _work(), COMM)
    assert t.step_s == pytest.approx(M * compute + GATHERS, rel=1e-12)
    assert t.data_exposed_s == pytest.approx(GATHERS, rel=1e-12)
    assert sum(t.parts().values()) == pytest.approx(t.step_s, rel=1e-12)


def test_fsdp_overlap_is_true_or_false_and_the_command_line_sets_it():
    assert hardware("h100").fsdp_overlap is True
    with pytest.raises(ShardscopeError, match="fsdp_overlap='no'.*True or False"):
        hardware("h100", fsdp_overlap="no")
    for flag, want in (("--fsdp-overlap", True), ("--no-fsdp-overlap", False)):
        args = build_parser().parse_args(["plan", "--model", "tiny", "--devices", "8", flag])
        assert dict(command_config(args).hardware_overrides) == {"fsdp_overlap": want}
