"""How an fp8 step keeps its linear layers' inputs for the backward (``fp8_saved_inputs``):
Transformer Engine's fp8 copies (``"fp8"``) against torchao's 16-bit inputs
(``"high-precision"``, the default, as the 16-bit reference program keeps them), the
difference derived here from the model's shape; bf16 steps untouched; the refusals. No
compile."""

import pytest

from helpers import assert_usage_error
from shardscope import PlanError, PlanRequest
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import activation_bytes_per_layer
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.candidates import estimate
from shardscope._src.train.types import Candidate

#: d 256, 8 query and key/value heads of 32, SwiGLU ff 512, 4 layers, 8 sequences
#: of 128 tokens, in bfloat16 (2 bytes an element).
CONFIG = ModelConfig(
    d_model=256, heads=8, kv_heads=8, ff=512, layers=4, batch=8, seq=128, vocab=1024,
    mlp="swiglu", dtype="bfloat16",
)  # fmt: skip
H, Q, FF, LAYERS = 256, 8 * 32, 512, 4


def _activations(strategy, mesh, *, saved, flash=True, dtype="fp8", remat="none"):
    c = Candidate(strategy, mesh, 1, remat)
    kw = {} if saved is None else {"fp8_saved_inputs": saved}
    s = estimate(c, CONFIG, "h100", matmul_dtype=dtype, flash_attention=flash, **kw)
    return s.memory.activations


def test_sequence_parallel_fp8_copies_are_the_local_shards_and_the_out_projection_adds_one():
    # zero1_sp on data=2 x model=4: 4 sequences of 128 tokens a device, the QKV's and the
    # MLP's normed inputs their 1/4 shards (h/t each) and the down-projection's input
    # (ff/t) 1 byte instead of 2; the attention keeps its 16-bit output and the
    # out-projection an fp8 copy of its q/t beside it; no dropout masks (h/t each, 1 byte
    # an element, two a layer).
    mesh, t, tokens = (("data", 2), ("model", 4)), 4, 4 * 128
    high = _activations("zero1_sp", mesh, saved="high-precision")
    fp8 = _activations("zero1_sp", mesh, saved="fp8")
    per_layer = tokens * (2 * H // t + FF // t) * (2 - 1) - tokens * (Q // t) * 1
    per_layer += tokens * 2 * (H // t) * 1
    assert high - fp8 == LAYERS * per_layer


def test_without_sequence_parallelism_the_normed_inputs_are_whole_and_unfused_keeps_one_copy():
    # tp on model=8: all 8 sequences on each device, the normed inputs whole (h), the
    # down-projection's ff/t; without memory-efficient attention the out-projection's fp8
    # copy is the only one of the attention's output (q/t); no dropout masks (h each).
    mesh, t, tokens = (("model", 8),), 8, 8 * 128
    high = _activations("tp", mesh, saved="high-precision", flash=False)
    fp8 = _activations("tp", mesh, saved="fp8", flash=False)
    masks = 2 * H * 1
    assert high - fp8 == LAYERS * tokens * ((2 * H + Q // t + FF // t) * (2 - 1) + masks)


#: A grouped-query model: 8 query heads of 32, 4 key/value heads, SwiGLU ff 512.
GQA = ModelConfig(
    d_model=256, heads=8, kv_heads=4, ff=512, layers=4, batch=8, seq=128, vocab=1024,
    mlp="swiglu", dtype="bfloat16",
)  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "mesh", "t", "sequences", "local"),
    [("zero1_sp", "data=2,model=4", 4, 4, 4), ("tp", "model=4", 4, 8, 1)],
    ids=["sp", "tp"],
)
def test_a_transformer_engine_layer_keeps_exactly_the_tensors_megatron_core_saves(
    strategy, mesh, t, sequences, local
):
    # What a Llama layer of Megatron-Core with Transformer Engine saves for its backward,
    # bytes a token, at a tensor-parallel degree t (sequence parallelism: the norms'
    # tensors are a device's 1/t of the sequence, ``local``): each LayerNormLinear its
    # norm's 16-bit input and its fp8 output (the QKV's and the MLP's); the fused
    # attention its q, k and v and its 16-bit output; the out-projection an fp8 copy of
    # that output; the SwiGLU its 16-bit input (gate and up); the down-projection an fp8
    # copy of the SwiGLU's output; the bias-dropout-adds at dropout 0 no mask.
    q, kv = 8 * 32, 4 * 32
    norms = 2 * (H * 2 + H * 1) / local
    attention = ((q + 2 * kv) * 2 + q * 2 + q * 1) / t
    mlp = (2 * FF * 2 + FF * 1) / t
    tokens = sequences * 128
    placement = get_strategy(strategy).place(GQA, abstract_mesh(mesh))
    kept = activation_bytes_per_layer(placement, fp8_saved=True)
    assert kept == tokens * (norms + attention + mlp)


def test_the_default_and_bf16_steps_keep_the_16_bit_inputs():
    mesh = (("data", 2), ("model", 4))
    bf16 = _activations("zero1_sp", mesh, saved=None, dtype="bfloat16")
    assert _activations("zero1_sp", mesh, saved=None) == bf16
    assert _activations("zero1_sp", mesh, saved="high-precision") == bf16
    assert PlanRequest("tiny", 8, matmul_dtype="fp8").fp8_saved_inputs == "high-precision"
    assert PlanRequest("tiny", 8).fp8_saved_inputs is None


def test_full_recomputation_changes_only_the_layer_being_recomputed():
    # full recomputation keeps each layer's input, no linear's: only the layer being
    # recomputed holds the fp8 copies (and no dropout masks).
    mesh, t, tokens = (("data", 2), ("model", 4)), 4, 4 * 128
    high = _activations("zero1_sp", mesh, saved="high-precision", remat="full")
    fp8 = _activations("zero1_sp", mesh, saved="fp8", remat="full")
    masks = tokens * 2 * (H // t) * 1
    assert high - fp8 == tokens * (2 * H // t + FF // t) - tokens * (Q // t) + masks


def test_bad_values_are_refused_naming_the_value_and_the_fix(capsys):
    with pytest.raises(PlanError, match=r"fp8_saved_inputs='fp8'.*give matmul_dtype='fp8'"):
        PlanRequest("tiny", 8, fp8_saved_inputs="fp8")
    with pytest.raises(PlanError, match=r"fp8_saved_inputs 'int4': choose one of"):
        PlanRequest("tiny", 8, matmul_dtype="fp8", fp8_saved_inputs="int4")
    with pytest.raises(PlanError, match="matmul_dtype='bfloat16' runs none in fp8"):
        estimate(Candidate("dp", (("data", 8),), 1, "none"), CONFIG, fp8_saved_inputs="fp8")
    argv = ["plan", "--devices", "8", "--model", "tiny", "--fp8-saved-inputs", "fp8"]
    assert_usage_error(argv, "fp8_saved_inputs='fp8'", capsys)


def test_a_mixtures_experts_keep_fp8_copies_of_their_slots_and_their_down_projection_input():
    # Transformer Engine's GroupedLinear saves each expert's quantized input: under ep on
    # expert=8 a device runs one sequence of 128 tokens, each sending 2 slots of h to the
    # up-projections and 2 x expert_ff to the down-projections, 1 byte an element instead
    # of 2; its attention's inputs change as a dense layer's (both normed inputs h, the
    # out-projection's fp8 copy of q beside the attention's output, no dropout masks).
    experts, top_k, expert_ff = 8, 2, 128
    moe = ModelConfig(
        d_model=H, heads=8, kv_heads=8, ff=FF, layers=LAYERS, batch=8, seq=128, vocab=1024,
        mlp="swiglu", dtype="bfloat16", experts=experts, top_k=top_k, expert_ff=expert_ff,
        dispatch_once=True,
    )  # fmt: skip
    tokens = 128

    def activations(saved):
        c = Candidate("ep", (("expert", 8),), 1, "none")
        s = estimate(c, moe, "h100", matmul_dtype="fp8", fp8_saved_inputs=saved)
        return s.memory.activations

    attention = tokens * (2 * H * (2 - 1) - Q * 1 + 2 * H * 1)
    experts_saved = tokens * top_k * (H + expert_ff) * (2 - 1)
    assert activations("high-precision") - activations("fp8") == LAYERS * (
        attention + experts_saved
    )


# -- Transformer Engine's weights: cast once a step ----------------------------------------


@pytest.mark.parametrize("remat", ["none", "full"])
def test_transformer_engines_weights_are_cast_once_a_step_into_a_copy_and_its_transpose(remat):
    # dp on data=2, 4 micro-batches: one sequence of 128 tokens a device a micro-batch.
    # torchao casts each linear's weights in the forward and again in the backward of every
    # micro-batch (2 reads of 2 bytes, 1 write); Transformer Engine casts them on the first
    # micro-batch (2 reads, the copy and its transpose written) and the passes cast only
    # the inputs and the gradients.
    m, tokens = 4, 128
    weights = H * 3 * Q + Q * H + H * 2 * FF + FF * H  # QKV, out, gate and up, down
    c = Candidate("dp", (("data", 2),), m, remat)
    ao, te = (
        estimate(c, CONFIG, "h100", matmul_dtype="fp8", fp8_saved_inputs=s)
        for s in ("high-precision", "fp8")
    )
    forward = LAYERS * tokens * (H + Q + H + FF)  # the linears' inputs
    backward = LAYERS * tokens * (3 * Q + H + 2 * FF + H)  # the gradients entering them
    assert te.pricing.work.cast_bytes == 5 * forward
    assert te.pricing.work.cast_bwd_bytes == 5 * backward
    assert te.pricing.work.cast_recompute_bytes == (5 * forward if remat == "full" else 0)
    assert te.pricing.work.cast_step_bytes == LAYERS * weights * (2 * 2 + 2 * 1)
    assert ao.pricing.work.cast_bytes == 5 * (forward + LAYERS * weights)
    assert ao.pricing.work.cast_step_bytes == 0
    # the compute: m forwards' and backwards' (and recomputations') weight casts out, one
    # in, at the H100's 3.35 TB/s (the step less, though the gradients' all-reduce then
    # has a shorter backward to hide behind)
    per_microbatch = 5 * LAYERS * weights * (3 if remat == "full" else 2)
    saved = (m * per_microbatch - 6 * LAYERS * weights) / 3.35e12
    assert ao.time.compute_s - te.time.compute_s == pytest.approx(saved, rel=1e-9)
    assert 0 < ao.time.step_s - te.time.step_s <= saved
