"""A mixture's dispatch and combine holding the multiprocessors their library is configured
with (``exchange_sms``: DeepEP's or HybridEP's count) while they run beside compute, every
other collective NCCL's channels."""

import pytest

from shardscope import hardware, transformer_bound
from shardscope._src.base.comm import ALL_TO_ALL
from shardscope._src.cli.args import UsageError
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.model.config import Mode, ModelConfig
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.timing import StepWork, comm_items, describe, step_time

M = 8
FLOPS = 1e13  # a micro-batch's forward: far longer than any of its collectives here

#: a mixture over 16 experts, one a device of 16 H100s on 2 nodes (its all-to-alls cross them)
MOE = ModelConfig(
    d_model=1024, heads=8, kv_heads=8, ff=2048, layers=2, batch=128, seq=1024, vocab=1024,
    mlp="swiglu", experts=16, top_k=2, expert_ff=512, dtype="bfloat16",
)  # fmt: skip


def _items(hw):
    placement = get_strategy("zero1_ep").place(MOE, abstract_mesh("data=1,expert=16"))
    return comm_items(hw, placement, transformer_bound(placement, Mode.TRAIN).terms)


def _work() -> StepWork:
    # half the forward is the experts': each of a layer's four all-to-alls has more compute
    # beside it than it takes
    return StepWork(
        microbatches=M, stages=1, fwd_flops=FLOPS, recompute_flops=0.0, act_bytes=0,
        recompute_act_bytes=0, p2p_bytes=0, p2p_bandwidth=1e9, optimizer_params=0,
        model_flops=0, devices=16, expert_flops=FLOPS / 2, expert_layer_share=1.0,
    )  # fmt: skip


def test_the_all_to_alls_hold_the_dispatchers_multiprocessors_the_others_nccls_channels():
    nccl, hybridep = _items(hardware("h100")), _items(hardware("h100", exchange_sms=20))
    assert [i.what for i in nccl] == [i.what for i in hybridep]
    kinds = {i.kind for i in nccl}
    assert ALL_TO_ALL in kinds and len(kinds) > 1
    for a, b in zip(nccl, hybridep, strict=True):
        assert a.seconds == b.seconds
        if a.kind == ALL_TO_ALL:
            # over 16 devices on 2 nodes: NCCL's channels across nodes, 16 of the 132
            assert (a.held, b.held) == (16 / 132, 20 / 132)
        else:
            assert b.held == a.held > 0  # e.g. the gradients' reduce-scatter: NCCL's


def test_a_hidden_all_to_all_slows_the_compute_beside_it_by_its_dispatchers_share():
    # Under ep_overlap M - 1 micro-batches run their all-to-alls beside another's compute,
    # which goes at the multiprocessors left: HybridEP's 32 of the 132 where NCCL's
    # channels across nodes hold 16, the step longer by (M - 1) / M of the all-to-alls'
    # seconds times the 16 more of 132. Every other collective is priced as before.
    nccl = hardware("h100", ep_overlap=True)
    hybridep = hardware("h100", ep_overlap=True, exchange_sms=32)
    before, after = _items(nccl), _items(hybridep)
    exchange = sum(i.seconds for i in before if i.kind == ALL_TO_ALL)
    assert exchange > 0
    t0, t1 = step_time(nccl, _work(), before), step_time(hybridep, _work(), after)
    assert t1.step_s - t0.step_s == pytest.approx(
        (M - 1) / M * exchange * (32 / 132 - 16 / 132), rel=1e-9
    )
    # without the overlap an all-to-all runs alone, beside nothing: no share to pay
    off, off32 = hardware("h100"), hardware("h100", exchange_sms=32)
    assert step_time(off, _work(), before).step_s == step_time(off32, _work(), after).step_s


def test_unset_by_default_and_nothing_held_on_a_tpu():
    assert hardware("h100").exchange_sms == 0
    tpu = hardware("tpu-v5p", exchange_sms=0)
    placement = get_strategy("zero1_ep").place(MOE, abstract_mesh("data=1,expert=16"))
    terms = transformer_bound(placement, Mode.TRAIN).terms
    assert all(i.held == 0 for i in comm_items(tpu, placement, terms))


def test_the_command_line_sets_it_on_the_hardware():
    argv = ["plan", "--model", "tiny", "--devices", "8", "--hardware", "h100"]
    config = command_config(build_parser().parse_args([*argv, "--exchange-sms", "32"]))
    assert dict(config.hardware_overrides) == {"exchange_sms": 32}
    request = config.request()
    assert hardware(request.hardware, **request.hardware_overrides).exchange_sms == 32
    assert "exchange_sms" not in command_config(build_parser().parse_args(argv)).hardware_overrides
    with pytest.raises(UsageError, match="--exchange-sms: -1 must be 0 or more"):
        build_parser().parse_args([*argv, "--exchange-sms", "-1"])


def test_the_time_models_constants_name_it_where_set():
    assert "exchange_sms" not in describe(hardware("h100"))
    assert describe(hardware("h100", exchange_sms=32))["exchange_sms"] == 32
