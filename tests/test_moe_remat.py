"""A mixture of experts planned with the recomputation and the matmul precision it ran with:
policies by named tensor (host offload included) over its experts' tensors, in the estimate
and in the compiled program; its experts' matmuls in fp8, its router in 16 bits; and the
policies its layers cannot run refused by name."""

import re
from dataclasses import replace

import pytest

import shardscope
from shardscope._src.audit.compile import audit
from shardscope._src.base.errors import ModelConfigError, PlanError
from shardscope._src.cost.flops import attention_core_flops
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.model.remat import remat_policy
from shardscope._src.plan.estimates import OFFLOAD_BUFFERS, named_tensor_bytes
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, screen_all
from shardscope._src.train.types import Candidate

#: Every layer with experts: d 128, 2 heads of 64 (their own keys and values), 8 SwiGLU
#: experts of 256, 2 a token, padded to capacity 1; one sequence of 2048 tokens a device
#: under expert parallelism over 8.
MOE = ModelConfig(
    layers=2, d_model=128, heads=2, ff=384, mlp="swiglu", seq=2048, batch=8, vocab=None,
    dtype="bfloat16", attention="blocked", attention_block=256, experts=8, top_k=2,
    expert_ff=256, capacity_factor=1.0,
)  # fmt: skip
TOKENS, H, F, SLOTS = 2048, 128, 256, 2
MAXTEXT = "custom:decoder_layer_input=offload,out_proj=offload,mlpwi=device"


def test_a_mixtures_offload_policy_holds_its_experts_tensors_and_sends_the_rest_to_the_host():
    c = Candidate("ep", (("expert", 8),), 1, MAXTEXT)
    s = estimate(c, MOE, "h100")
    # on the device, each layer's experts' gate and up over the 2 slots a token fills
    kept = TOKENS * SLOTS * 2 * F * 2
    # in host memory, each layer's input and the out-projection's output
    offloaded = TOKENS * (H + H) * 2
    # while a layer is recomputed it holds what a layer with experts keeps (the attention's
    # and the norms' 18 h bytes, the 2 slots' inputs and weighted outputs, the experts'
    # gate, up and product, the router's float32 logits), and two layers' offloaded
    # tensors are on their way to or from the host
    working = TOKENS * (18 * H + 2 * (2 * SLOTS * H + SLOTS * 3 * F) + 4 * 8)
    assert s.memory.host == MOE.layers * offloaded
    assert s.pricing.work.host_bytes == MOE.layers * offloaded
    assert s.memory.activations == MOE.layers * kept + working + OFFLOAD_BUFFERS * offloaded
    # the backward runs again the query, key and value projection, the attention core, the
    # experts' down-projections and the router (its logits are named by none), not the
    # out-projection or the experts' gate and up
    core = attention_core_flops(MOE, TOKENS, 2048)
    rerun = 2 * TOKENS * (H * 3 * H + SLOTS * F * H + H * 8) + core
    flash = core / 2  # the blocked backward's scores
    assert s.pricing.work.recompute_flops == pytest.approx(MOE.layers * (rerun + flash), rel=1e-12)
    # of the routed experts' forward (gate, up and down, d x f each over the 2 slots), the
    # down-projection alone runs again
    experts = MOE.layers * 2 * TOKENS * SLOTS * 3 * H * F
    assert s.pricing.work.expert_recompute_flops == pytest.approx(experts / 3, rel=1e-12)
    # keeping every projection's output but the attention's: the attention core and the
    # router run again
    minimal = estimate(Candidate("ep", (("expert", 8),), 1, "maxtext:minimal"), MOE, "h100")
    again = minimal.pricing.work.recompute_flops
    assert again == pytest.approx(MOE.layers * (2 * TOKENS * H * 8 + core + flash), rel=1e-12)


def test_keeping_the_experts_gate_runs_their_up_alone_again():
    # every named tensor kept but the experts' up: the backward runs again their up over the
    # 2 slots a token fills (d x f each) and the router (its logits are named by none), and
    # reads again a third of the experts' weights (gate, up and down, d x f each)
    kept = ("decoder_layer_input", "pre_self_attention_norm", "query_proj", "key_proj",
            "value_proj", "context", "out_proj", "post_self_attention_norm", "expert_input",
            "mlpwi_0", "mlp_act", "expert_act", "mlpwo")  # fmt: skip
    policy = "custom:" + ",".join(f"{t}=device" for t in kept)
    work = estimate(Candidate("ep", (("expert", 8),), 1, policy), MOE, "h100").pricing.work
    flash = attention_core_flops(MOE, TOKENS, 2048) / 2  # the blocked backward's scores
    rerun = 2 * TOKENS * (SLOTS * H * F + H * 8)
    assert work.recompute_flops == pytest.approx(MOE.layers * (rerun + flash), rel=1e-12)
    experts = MOE.layers * 2 * TOKENS * SLOTS * 3 * H * F  # the routed experts' forward
    assert work.expert_flops == experts
    assert work.expert_recompute_flops == pytest.approx(experts / 3, rel=1e-12)
    # the gate and the up recomputed, the down-projection kept: two of the experts' three
    # matmuls run again
    both = "custom:" + ",".join(f"{t}=device" for t in kept if t != "mlpwi_0")
    work = estimate(Candidate("ep", (("expert", 8),), 1, both), MOE, "h100").pricing.work
    assert work.expert_recompute_flops == pytest.approx(2 * experts / 3, rel=1e-12)


@pytest.mark.parametrize("dropless", [False, True], ids=["capacity", "dropless"])
def test_the_experts_gate_and_up_are_saved_as_the_policy_names_them(dropless, capsys):
    """The residuals JAX saves for the backward of the routed experts, capacity-padded and
    dropless (ragged): their gate kept, their up recomputed."""
    import jax
    import jax.numpy as jnp

    from shardscope._src.model.moe import moe_capacity, moe_dropless
    from shardscope._src.model.transformer import remat_policy as decoder_remat_policy

    tokens, d, f, experts = 16, 8, 4, 4
    x = jnp.ones((tokens, d))
    router = jnp.arange(d * experts, dtype=jnp.float32).reshape(d, experts) / 100
    w_in, w_down = jnp.full((experts, d, 2, f), 0.1), jnp.full((experts, f, d), 0.1)

    def layer(x, router, w_in, w_down):
        if dropless:
            return moe_dropless(x, router, w_in, w_down, 2)
        return moe_capacity(x, router, w_in, w_down, 2, 1.0)[0]

    policy = decoder_remat_policy("custom:expert_input=device,mlpwi_0=device")
    fn = jax.checkpoint(layer, policy=policy)
    jax.ad_checkpoint.print_saved_residuals(fn, x, router, w_in, w_down)
    named = re.findall(r"f32\[([0-9,]+)\] named '(\w+)'", capsys.readouterr().out)
    # each of the 2 x 16 assignments a row, by expert (dropless) or in 4 experts' 8 slots
    rows = f"{2 * tokens},{d}" if dropless else f"{experts},{2 * tokens // experts},{d}"
    gate = f"{2 * tokens},{f}" if dropless else f"{experts},{2 * tokens // experts},{f}"
    assert sorted(named) == sorted([(rows, "expert_input"), (gate, "mlpwi_0")])


def test_the_compiled_program_keeps_the_experts_tensors_the_policy_names():
    # the H100 compiler's temporaries grow per layer of the scan by what a layer keeps: the
    # experts' gate and up (named mlpwi_0 and mlpwi_1 where they are computed), not the
    # layer's input or the out-projection's output, which are offloaded
    def config_of(layers):
        return replace(MOE, layers=layers, seq=512, remat=MAXTEXT)

    mesh = shardscope.target_mesh("h100", "expert=8", axis_types="auto")
    temp = {}
    for layers in (2, 4):
        placement = get_strategy("ep").place(config_of(layers), mesh)
        program = build_reference_program(placement, mode="train", regather=True)
        temp[layers] = audit(program.lower()).memory["temp_size_in_bytes"]
    kept = 512 * SLOTS * 2 * F * 2
    assert named_tensor_bytes(placement, remat_policy(MAXTEXT).on_device) == kept
    # (beside it the routing's slot indices and weights, 1% of it)
    assert (temp[4] - temp[2]) / 2 == pytest.approx(kept, rel=0.02)


def test_a_mixtures_experts_run_in_fp8_and_its_router_in_16_bits():
    c = Candidate("ep", (("expert", 8),), 1, "none")
    work = estimate(c, MOE, "h100", matmul_dtype="fp8").pricing.work
    # the attention's projections and each token's 2 experts' gate, up and down in fp8; the
    # router and the attention core at 16 bits
    projections = H * 3 * H + H * H
    experts = SLOTS * 3 * H * F
    assert work.fp8_flops == 2 * TOKENS * MOE.layers * (projections + experts)
    core = attention_core_flops(MOE, TOKENS, 2048)
    assert work.fwd_flops == pytest.approx(
        work.fp8_flops + MOE.layers * (2 * TOKENS * H * 8 + core), rel=1e-12
    )
    # each layer casts the inputs of its projections (h, h) and of its experts (each slot's
    # h, and its hidden f), the attention's weights and the device's one expert's; two
    # reads of the 16-bit tensor and the write of its fp8 copy
    forward = TOKENS * (H + H + SLOTS * H + SLOTS * F) + projections + 3 * H * F
    assert work.cast_bytes == pytest.approx(MOE.layers * forward * (2 * 2 + 1), rel=1e-12)
    # backward: the gradients entering the projections (3h, h) and the experts (each slot's
    # up-projections' 2f and down-projection's h), and the weights again
    backward = TOKENS * (3 * H + H + SLOTS * 2 * F + SLOTS * H) + projections + 3 * H * F
    assert work.cast_bwd_bytes == pytest.approx(MOE.layers * backward * (2 * 2 + 1), rel=1e-12)
    # and the experts' weights are read as their fp8 copies: one expert's a device
    assert work.expert_weight_bytes == MOE.layers * 3 * H * F
    ranked, _, _ = screen_all(MOE, 8, hardware("h100"), ["ep"], matmul_dtype="fp8")
    assert ranked and ranked[0].pricing.work.fp8_flops > 0


@pytest.mark.parametrize(
    "config, remat, says",
    [
        (MOE, "matmuls", "batched over the experts, which dots_with_no_batch_dims_saveable"),
        (
            model_preset("deepseek-v3").config(batch=8, seq=512),
            "custom:decoder_layer_input=offload,query_proj=offload",
            "latent attention names no query_proj (its query, keys and values are made",
        ),
    ],
)
def test_a_policy_a_mixtures_layers_cannot_run_is_refused_by_name(config, remat, says):
    with pytest.raises(ModelConfigError, match=re.escape(says)):
        replace(config, remat=remat)
    with pytest.raises(PlanError, match=re.escape(says)):
        screen_all(config, 8, hardware("h100"), ["ep"], remat=remat)
    # what the MaxText recipes of both write is planned
    planned = "custom:decoder_layer_input=offload,out_proj=offload"
    assert replace(config, remat=planned).remat == planned


def test_latent_attention_in_fp8_is_refused():
    config = model_preset("deepseek-v3").config(batch=8, seq=512)
    with pytest.raises(PlanError, match="latent attention's matmuls in 16 bits"):
        screen_all(config, 8, hardware("h100"), ["ep"], matmul_dtype="fp8")


def test_transformer_engines_expert_weights_are_cast_once_a_step():
    # Transformer Engine's grouped linears cache their fp8 weights like its linears: the
    # passes cast the inputs and gradients alone, the step the attention's weights and the
    # device's one expert's, into a copy and its transpose (2 reads of 2 bytes, 2 writes)
    c = Candidate("ep", (("expert", 8),), 1, "none")
    work = estimate(c, MOE, "h100", matmul_dtype="fp8", fp8_saved_inputs="fp8").pricing.work
    weights = H * 3 * H + H * H + 3 * H * F
    forward = TOKENS * (H + H + SLOTS * H + SLOTS * F)
    backward = TOKENS * (3 * H + H + SLOTS * 2 * F + SLOTS * H)
    assert work.cast_bytes == pytest.approx(MOE.layers * forward * 5, rel=1e-12)
    assert work.cast_bwd_bytes == pytest.approx(MOE.layers * backward * 5, rel=1e-12)
    assert work.cast_step_bytes == pytest.approx(MOE.layers * weights * 6, rel=1e-12)
