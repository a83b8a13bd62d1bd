"""Multi-head latent attention (DeepSeek-V2 and V3) in the reference decoder: the blocked
kernel equals the dense one, every strategy's train step equals one device's, tensor
parallelism all-reduces once per sublayer, and a layer keeps what the estimate counts on the
H100 compiler."""

from dataclasses import replace

import pytest

import shardscope
from helpers import layer_growth, max_error, one_device_step
from shardscope._src.base.errors import ModelConfigError
from shardscope._src.model.config import ModelConfig
from shardscope._src.sharding.programs import build_reference_program

LATENT = dict(kv_lora_rank=32, q_lora_rank=24, rope_head_dim=8, v_head_dim=12)


def _config(**kw):
    base = dict(
        d_model=64, heads=4, head_dim=16, ff=128, layers=2, batch=8, seq=16, vocab=256,
        mlp="swiglu", **LATENT,
    )  # fmt: skip
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("q_lora_rank", [24, 0], ids=["query-latent", "direct-queries"])
def test_blocked_latent_attention_equals_the_dense_one(q_lora_rank):
    dense = _config(q_lora_rank=q_lora_rank)
    blocked = replace(dense, attention="blocked", attention_block=4)
    want_loss, want = one_device_step(dense)
    got_loss, got = one_device_step(blocked)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert max_error(got, want) < 1e-6


@pytest.mark.parametrize(
    "strategy, mesh, experts",
    [("dp_tp", "data=2,model=4", 0), ("fsdp_ep", "data=2,expert=4", 8)],
)
def test_a_latent_attention_train_step_equalsone_device_step(strategy, mesh, experts):
    moe = dict(experts=8, top_k=2, expert_ff=32, dense_layers=1, capacity_factor=4.0)
    config = _config(**(moe if experts else {}))
    want_loss, want = one_device_step(config)
    prog = build_reference_program(strategy, config, mesh, mode="train")
    got_loss, got = prog.fn(*prog.example_args())
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert max_error(got, want) < 1e-6


def test_tensor_parallel_latent_attention_sums_once_per_sublayer():
    config = _config(vocab=None)
    audit_ = shardscope.audit(build_reference_program("dp_tp", config, "data=2,model=4"))
    # each head's queries, keys and values from the replicated latents, the output
    # projection's partial sums all-reduced, as the MLP's down projection's
    assert audit_.counts()["all-reduce"] == 2 * config.layers


@pytest.mark.compiler
def test_a_latent_attention_layer_keeps_what_the_estimate_counts():
    def config_of(layers):
        return ModelConfig(
            layers=layers, d_model=128, heads=2, head_dim=64, ff=512, mlp="swiglu", seq=2048,
            batch=8, dtype="bfloat16", attention="blocked", attention_block=256,
            kv_lora_rank=64, q_lora_rank=96, rope_head_dim=32, v_head_dim=64,
        )  # fmt: skip

    estimate, kept = layer_growth("fsdp", "data=8", config_of)
    # one sequence of 2048 tokens a device, bf16: the residual stream's and norms' (10 h);
    # the latents and their norms' inputs (2 (64 + 32) + 2 x 64 + 4 x 96); each head's query
    # and key (2 x 96 each), value and output (2 x 64 each); the MLP's (6 ff)
    latents = 2 * (64 + 32) + 2 * 64 + 4 * 96
    heads = 2 * (2 * 2 * 96 + 2 * 2 * 64)
    assert estimate == 2048 * (10 * 128 + latents + heads + 6 * 512)
    assert kept == pytest.approx(estimate, rel=0.03)


def test_latent_attention_settings_name_what_is_wrong():
    with pytest.raises(ModelConfigError, match="q_lora_rank=8 describe multi-head latent"):
        ModelConfig(q_lora_rank=8)
    with pytest.raises(ModelConfigError, match="kv_heads=2 with kv_lora_rank=16"):
        ModelConfig(heads=8, kv_heads=2, kv_lora_rank=16)
