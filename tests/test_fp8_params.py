"""The layers' linear weights kept in fp8 (``fp8_params``, Megatron's ``fp8_param_gather``):
the weights a device stores drop by one byte for each element of the fp8 layers' linear
weights, counted here from the model's shape; the layers kept 16-bit at each end; ZeRO's
gather of updated parameters moving those at one byte; the refusals. No compile."""

import pytest

from helpers import assert_usage_error
from shardscope import PlanError, PlanRequest
from shardscope._src.model.config import ModelConfig
from shardscope._src.train.candidates import estimate
from shardscope._src.train.timing import ALL_GATHER, PER_STEP_FWD, gathered_bytes
from shardscope._src.train.types import Candidate

#: d 256, 8 query and 4 key/value heads of 32, SwiGLU ff 512, 4 layers, 8 sequences of 128
#: tokens, in bfloat16 (2 bytes an element), vocabulary 1024 (untied).
CONFIG = ModelConfig(
    d_model=256, heads=8, kv_heads=4, ff=512, layers=4, batch=8, seq=128, vocab=1024,
    mlp="swiglu", dtype="bfloat16",
)  # fmt: skip
H, Q, KV, FF, LAYERS = 256, 8 * 32, 4 * 32, 512, 4
#: one layer's linear weights: the query, key and value projection, the out-projection and
#: SwiGLU's gate, up and down (no norm gains)
LINEAR = H * (Q + 2 * KV) + Q * H + 3 * H * FF
FP8 = {"matmul_dtype": "fp8", "fp8_saved_inputs": "fp8"}


def _screened(cand, **kw):
    return estimate(cand, CONFIG, "h100", **FP8, **kw)


@pytest.mark.parametrize(
    ("strategy", "mesh", "microbatches", "fp8_layers", "split"),
    [
        # no stages: both ends on the device, n = 1 of them at each end
        ("zero1_sp", (("data", 2), ("model", 4)), 1, LAYERS - 2, 4),
        # two stages: the planned (last) stage's 2 layers, its last one 16-bit
        ("zero1", (("stage", 2), ("data", 4)), 2, LAYERS // 2 - 1, 1),
        # FSDP: every weight over the 8 devices
        ("fsdp", (("data", 8),), 1, LAYERS - 2, 8),
    ],
    ids=["tp4", "pp2", "fsdp8"],
)
def test_weights_drop_one_byte_for_each_fp8_linear_element(
    strategy, mesh, microbatches, fp8_layers, split
):
    cand = Candidate(strategy, mesh, microbatches, "none")
    bf16 = _screened(cand)
    kept = _screened(cand, fp8_params=1)
    every = _screened(cand, fp8_params=0)
    assert bf16.memory.params - kept.memory.params == fp8_layers * LINEAR // split
    # with no layer kept 16-bit, every layer's (the planned stage's)
    layers = LAYERS // 2 if strategy == "zero1" else LAYERS
    assert bf16.memory.params - every.memory.params == layers * LINEAR // split
    # gradients, master weights and optimizer state unchanged
    assert kept.memory.grads == bf16.memory.grads
    assert kept.memory.optimizer == bf16.memory.optimizer
    if strategy == "fsdp":
        # the layer FSDP gathers holds its linear weights at one byte
        assert bf16.memory.gathered_weights - kept.memory.gathered_weights == LINEAR


def test_zero_gathers_the_fp8_weights_at_one_byte_an_element():
    # ZeRO-1 over 8: the all-gather of updated parameters moves every parameter; under
    # fp8_params=0 the 4 layers' linear weights at 1 byte, the norms and the embedding and
    # output layer at 2.
    cand = Candidate("zero1", (("data", 8),), 1, "none")
    s = _screened(cand, fp8_params=0)
    norms = LAYERS * 2 * H + H
    every = LAYERS * LINEAR + norms + 2 * 1024 * H
    sixteen = 2.0 * every  # the 16-bit bytes of every parameter
    share = s.pricing.fp8_param_share
    moved = gathered_bytes(ALL_GATHER, PER_STEP_FWD, sixteen, s.pricing.placement, True, share)
    assert moved == pytest.approx(LAYERS * LINEAR * 1 + (every - LAYERS * LINEAR) * 2, rel=1e-12)


def test_bad_values_are_refused_naming_the_value_and_the_fix(capsys):
    with pytest.raises(PlanError, match=r"fp8_params=True: the layers at each end.*give a count"):
        PlanRequest("tiny", 8, **FP8, fp8_params=True)
    with pytest.raises(PlanError, match=r"fp8_params=-1: the layers at each end"):
        PlanRequest("tiny", 8, **FP8, fp8_params=-1)
    with pytest.raises(
        PlanError, match=r"fp8_params=1: .*give matmul_dtype='fp8' and fp8_saved_inputs='fp8'"
    ):
        PlanRequest("tiny", 8, matmul_dtype="fp8", fp8_params=1)
    with pytest.raises(PlanError, match=r"fp8_params=0: .*matmul_dtype='bfloat16'"):
        estimate(Candidate("dp", (("data", 8),), 1, "none"), CONFIG, fp8_params=0)
    argv = ["plan", "--devices", "8", "--model", "tiny", "--fp8-params", "1"]
    assert_usage_error(argv, "fp8_params=1", capsys)
