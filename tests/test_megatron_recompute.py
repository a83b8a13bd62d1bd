"""Megatron's selective recomputation written by name (``megatron:MODULE,...``): each module
mapped onto the decoder's named tensors, its memory and recomputation in the estimate, the
compiled program keeping what the estimate counts, and the modules a model does not have
refused in one line."""

import contextlib
import io
import re
from dataclasses import replace

import jax
import pytest
from jax.ad_checkpoint import print_saved_residuals

from helpers import assert_usage_error
from shardscope._src.base.errors import ModelConfigError, ShardscopeError
from shardscope._src.model import transformer
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.model.remat import remat_policy, split_policies
from shardscope._src.plan.estimates import Schedule, stored_activation_bytes_per_layer
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.timing import step_work

#: A small dense model: d 128, 2 heads of 64, SwiGLU ff 512, 2048 tokens a device over data=8.
DENSE = ModelConfig(
    layers=2, d_model=128, heads=2, ff=512, mlp="swiglu", seq=2048, batch=8, vocab=None,
    dtype="bfloat16", attention="blocked", attention_block=256,
)  # fmt: skip
#: Every layer with experts: 8 SwiGLU experts of 256, 2 a token, capacity 1.
MOE = ModelConfig(
    layers=2, d_model=128, heads=2, ff=384, mlp="swiglu", seq=512, batch=8, vocab=None,
    dtype="bfloat16", attention="blocked", attention_block=256, experts=8, top_k=2,
    expert_ff=256, capacity_factor=1.0,
)  # fmt: skip
NORMS = ("pre_self_attention_norm", "post_self_attention_norm")


def test_megatrons_modules_recompute_their_tensors_and_keep_every_other():
    assert remat_policy("megatron:layernorm").recomputed == NORMS
    # Megatron's default list, and its own order whatever the order written
    assert remat_policy("megatron:selective") == remat_policy("megatron:core_attn")
    p = remat_policy("megatron: layernorm, moe_act")
    assert p.name == "megatron:moe_act,layernorm"
    assert p.recomputed == (*NORMS, "expert_act")
    # the layer's input and every projection kept: no matmul runs again
    assert "decoder_layer_input" in p.on_device and p.rerun_producers() == ()
    assert remat_policy("megatron:moe").rerun_producers() == ("mlp_in_0", "mlp_in_1", "mlp_out")
    # its commas are its own in a list of policies
    assert split_policies("full,megatron:moe_act,layernorm,offload") == [
        "full", "megatron:moe_act,layernorm", "offload"
    ]  # fmt: skip


def test_recomputing_the_norms_keeps_a_dense_layer_less_by_their_outputs():
    dp = get_strategy("dp").place(DENSE, abstract_mesh("data=8"))
    kept = {r: stored_activation_bytes_per_layer(dp, Schedule(remat=r)) for r in
            ("none", "megatron:core_attn", "megatron:layernorm")}  # fmt: skip
    # 2048 tokens a device, d_model 128, the two norms' outputs, bf16
    norms = 2048 * 128 * 2 * 2
    assert kept["none"] - kept["megatron:layernorm"] == norms
    # the blocked attention keeps nothing core_attn would drop: everything is kept
    assert kept["megatron:core_attn"] == kept["none"]
    # the norms run again, element-wise: their outputs written again, no matmul
    work = {
        r: step_work(dp, Schedule(remat=r), DENSE, 8, hardware("h100"), flash_attention=True)
        for r in ("megatron:core_attn", "megatron:layernorm")
    }
    again = {r: w.recompute_act_bytes for r, w in work.items()}
    assert again["megatron:layernorm"] - again["megatron:core_attn"] == DENSE.layers * norms
    flops = {r: w.recompute_flops for r, w in work.items()}
    assert flops["megatron:layernorm"] == flops["megatron:core_attn"]


@pytest.mark.compiler
def test_the_compiled_program_keeps_what_the_estimate_counts():
    from helpers import layer_growth

    def config_of(layers):
        return replace(DENSE, layers=layers, remat="megatron:layernorm")

    _, kept = layer_growth("fsdp", "data=8", config_of)
    placement = get_strategy("fsdp").place(config_of(2), abstract_mesh("data=8"))
    estimate = stored_activation_bytes_per_layer(placement, Schedule(remat="megatron:layernorm"))
    # Table 2's 10 h + 8 h + SwiGLU's 6 ff bytes a token (test_fused_blocks), less the norms
    assert estimate == 2048 * (10 * 128 + 8 * 128 + 6 * 512 - 2 * 2 * 128)
    assert kept == pytest.approx(estimate, rel=0.02)


def _residuals(remat):
    c = replace(MOE, layers=1, batch=1, remat=remat)
    layer = jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape[1:], w.dtype),
        transformer.abstract_params(c)["moe_layers"],
    )
    x = jax.ShapeDtypeStruct((1, c.seq, c.d_model), c.dtype)

    def step(p, x):
        return transformer.moe_layer(p, x, c)

    policy = transformer.remat_policy(remat)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(jax.checkpoint(step, policy=policy), layer, x)
    # each residual's shape and what it is, without where in the source it comes from
    return [line.split(" from ")[0] for line in out.getvalue().splitlines()]


def test_recomputing_moe_act_recomputes_the_experts_activation_alone():
    kept = _residuals("megatron:core_attn")
    again = _residuals("megatron:moe_act")
    # one residual fewer: the experts' activation over their slots, 8 experts x 128 slots
    # (512 tokens x 2 / 8) x 256
    gone = list(kept)
    for r in again:
        gone.remove(r)
    assert gone == ["bf16[8,128,256] named 'expert_act'"]
    ep = get_strategy("ep").place(MOE, abstract_mesh("expert=8"))
    stored = {r: stored_activation_bytes_per_layer(ep, Schedule(remat=r))
              for r in ("megatron:core_attn", "megatron:moe_act")}  # fmt: skip
    assert stored["megatron:core_attn"] - stored["megatron:moe_act"] == 512 * 2 * 256 * 2
    work = {
        r: step_work(ep, Schedule(remat=r), MOE, 8, hardware("h100"), flash_attention=True)
        for r in stored
    }
    assert work["megatron:moe_act"].recompute_flops == work["megatron:core_attn"].recompute_flops


@pytest.mark.parametrize(
    "config, remat, says",
    [
        (DENSE, "megatron:moe_act", "moe_act recomputes the routed experts' tensors and the"),
        (DENSE, "megatron:mla_up_proj", "mla_up_proj recomputes latent attention's"),
        (MOE, "megatron:mlp", "write moe or moe_act"),
        (model_preset("deepseek-v3").config(batch=8, seq=512), "megatron:layernorm",
         "add mla_up_proj"),
        (DENSE, "megatron:core_attn,experts", "'experts' is no module Megatron recomputes"),
        (MOE, "megatron:shared_experts", "write moe (the whole MLP"),
    ],
)  # fmt: skip
def test_a_module_the_model_does_not_have_is_refused_in_one_line(config, remat, says):
    with pytest.raises(ShardscopeError, match=re.escape(says)) as e:
        replace(config, remat=remat)
    assert "\n" not in str(e.value) and repr(remat) in str(e.value)
    assert e.value.params == ("remat",)
    if config is MOE:
        return
    with pytest.raises(ModelConfigError):
        replace(config, remat=remat)


def test_the_command_line_takes_megatrons_modules(capsys):
    from shardscope._src.cli.main import build_parser, command_config

    args = build_parser().parse_args(
        ["plan", "--devices", "8", "--remat", "full,megatron:moe_act,layernorm"]
    )
    assert command_config(args).request().remat == ("full", "megatron:moe_act,layernorm")
    argv = ["plan", "--model", "tiny", "--devices", "8", "--remat", "megatron:attn"]
    assert_usage_error(argv, "--remat", capsys)
