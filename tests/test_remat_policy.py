"""Recomputation by named tensor: MaxText's and JAX's policies read name for name, what each
keeps and recomputes from the named tensors, the compiled program following the policy, and
the planner taking a policy by name."""

import json
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest

from helpers import assert_usage_error
from shardscope import PlanError, ShardscopeError
from shardscope._src.base.errors import ModelConfigError, RecordError
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.flops import attention_core_flops
from shardscope._src.hlo.cost import dot_flops
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.remat import Place, RematPolicy, remat_policy, split_policies
from shardscope._src.model.transformer import NO_HOOKS, mlp
from shardscope._src.model.transformer import remat_policy as decoder_remat_policy
from shardscope._src.plan.estimates import (
    Schedule,
    estimate_memory,
    stored_activation_bytes_per_layer,
)
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import remat_options, screen_all
from shardscope._src.train.timing import reruns_forward_collectives, step_work

#: A Llama-3-8B layer: d 4096, 32 heads and 8 key/value heads of 128, SwiGLU ff 14336.
LAYER = ModelConfig(
    d_model=4096, heads=32, kv_heads=8, ff=14336, layers=2, batch=8, seq=2048,
    vocab=None, dtype="bfloat16", mlp="swiglu",
)  # fmt: skip
QKV = ("query_proj", "key_proj", "value_proj")
#: The MLP's gate and up, which MaxText's fused name mlpwi stands for.
MLPWI = ("mlpwi_0", "mlpwi_1")


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, device",
    [
        # MaxText's Decoder.get_remat_policy: the names each policy saves
        ("maxtext:minimal", (*QKV, "out_proj", *MLPWI, "mlpwo")),
        ("maxtext:minimal_with_context", (*QKV, "context", "out_proj", *MLPWI, "mlpwo")),
        ("minimal_flash", (*QKV, "context", "out_proj", *MLPWI, "mlpwo")),
        ("save_dot_with_context_except_mlp", (*QKV, "context", "out_proj")),
        ("maxtext:save_dot_except_mlpwi", (*QKV, "out_proj", "mlpwo")),
        ("maxtext:save_dot_except_mlp", (*QKV, "out_proj")),
        ("save_qkv_proj", QKV),
        ("maxtext:save_out_proj", ("out_proj",)),
        ("maxtext:full", ()),
        ("matmuls", (*QKV, "out_proj", *MLPWI, "mlpwo")),
    ],
)
def test_maxtexts_policies_keep_the_tensors_it_names(name, device):
    p = remat_policy(name)
    # the layer's input is the layer loop's checkpoint: kept by every policy that does not
    # offload it
    assert set(p.on_device) == {"decoder_layer_input", *device}
    assert p.offloaded == ()
    assert remat_policy(p.name) == p  # the canonical name reads back as itself


def test_offloading_policies_move_what_they_name_to_the_host():
    assert remat_policy("qkv_proj_offloaded").offloaded == QKV
    assert set(remat_policy("maxtext:minimal_offloaded").offloaded) == {
        *QKV, "out_proj", *MLPWI, "mlpwo"
    }  # fmt: skip
    assert remat_policy("offload").offloaded == ("decoder_layer_input", *QKV)
    # JAX's policies that are a preset are read as it
    assert remat_policy("jax:nothing_saveable") == remat_policy("full")
    assert remat_policy("jax:checkpoint_dots_with_no_batch_dims").name == "matmuls"


def test_a_custom_policy_is_written_tensor_by_tensor_as_maxtext_configures_it():
    p = remat_policy("custom:decoder_layer_input=offload, qkv_proj=device,out_proj=remat")
    assert p.place("decoder_layer_input") == Place.OFFLOAD
    assert [p.place(t) for t in QKV] == [Place.DEVICE] * 3
    # left out: recomputed; its canonical name lists what is not the default
    assert p.place("mlpwo") == Place.RECOMPUTE
    assert p.name == "custom:decoder_layer_input=offload,query_proj=device,key_proj=device," \
        "value_proj=device"  # fmt: skip
    # its commas are its own in a list of policies
    assert split_policies("full, custom:query_proj=offload,key_proj=remat,offload") == [
        "full", "custom:query_proj=offload,key_proj=remat", "offload"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name, says",
    [
        ("save_everything", "choose one of none, selective"),
        ("custom:mla_q=device", "no tensor 'mla_q'; it names decoder_layer_input"),
        ("custom:query_proj=host", "query_proj='host': place it on device, offload or"),
        ("custom:decoder_layer_input=remat", "decoder_layer_input cannot be recomputed"),
        ("custom:mlpwi=device,mlpwi_1=offload", "mlpwi_1 is placed twice, device and offload"),
        ("custom:query_proj", "is not TENSOR=PLACE"),
    ],
)
def test_a_policy_the_decoder_cannot_run_is_refused_by_name(name, says):
    with pytest.raises(ShardscopeError, match=re.escape(says)) as e:
        remat_policy(name)
    assert e.value.params == ("remat",) and repr(name) in str(e.value)
    with pytest.raises(ModelConfigError, match=re.escape(says)):
        replace(LAYER, remat=name)
    with pytest.raises(PlanError, match=re.escape(says)):
        remat_options("train", ["full", name], True)


def test_mlpwi_stands_for_the_gate_and_the_up_and_a_record_written_before_reads_as_both():
    p = remat_policy("custom:context=device,mlpwi=offload")
    assert [p.place(t) for t in MLPWI] == [Place.OFFLOAD] * 2
    # written as the group where the two share a place, and tensor by tensor where not
    assert remat_policy("custom:context=device,mlpwi_0=offload,mlpwi_1=offload") == p
    assert p.name == "custom:context=device,mlpwi=offload"
    apart = remat_policy("custom:mlpwi_0=device")
    assert apart.name == "custom:mlpwi_0=device"
    assert (apart.place("mlpwi_0"), apart.place("mlpwi_1")) == (Place.DEVICE, Place.RECOMPUTE)
    assert apart.rerun_producers()[-2:] == ("mlp_in_1", "mlp_out")
    # as the record was written when the gate and up were one tensor, mlpwi
    old = [
        "decoder_layer_input", "pre_self_attention_norm", *QKV, "context", "out_proj",
        "post_self_attention_norm", "expert_input", "mlpwi", "mlp_act", "expert_act", "mlpwo",
    ]  # fmt: skip
    kept = {"decoder_layer_input": "device", "context": "device", "mlpwi": "offload"}
    record = {
        "name": "custom:context=device,mlpwi=offload",
        "places": [[t, kept.get(t, "recompute")] for t in old],
        "compiled_as": "save_and_offload_only_these_names",
        "source": p.source,
    }
    assert RematPolicy.from_dict(record) == p
    assert RematPolicy.from_dict(json.loads(json.dumps(apart.to_dict()))) == apart
    with pytest.raises(RecordError, match="places none of mlpwi_0, mlpwi_1"):
        RematPolicy.from_dict({**record, "places": [pl for pl in record["places"][:-4]]})


def test_a_gelu_mlp_has_no_up_projection_apart_to_place():
    gelu = replace(LAYER, mlp="gelu")
    says = "mlpwi_1=device: a GELU MLP has no up projection apart from its one up-projection"
    with pytest.raises(ModelConfigError, match=re.escape(says)) as e:
        replace(gelu, remat="custom:mlpwi_1=device")
    assert e.value.params == ("remat",)
    with pytest.raises(PlanError, match=re.escape(says)):
        screen_all(gelu, 8, hardware("h100"), ["fsdp"], remat="custom:mlpwi_1=device")
    # its one up-projection is mlpwi_0, which mlpwi (MaxText's name of it) places too
    for name in ("custom:mlpwi_0=device", "custom:mlpwi=offload", "maxtext:minimal"):
        assert replace(gelu, remat=name).remat == name


# -- memory and recomputation from the named tensors -------------------------------------------


def test_what_a_policy_keeps_and_offloads_is_the_sum_of_its_tensors():
    dp = get_strategy("dp").place(LAYER, abstract_mesh("data=2"))  # 4 sequences per device
    tokens, h, q, kv, ff = 4 * 2048, 4096, 32 * 128, 8 * 128, 14336
    kept = {
        "full": h,
        "matmuls": h + q + 2 * kv + h + 2 * ff + h,
        "maxtext:save_dot_except_mlpwi": h + q + 2 * kv + h + h,
        "maxtext:save_qkv_proj": h + q + 2 * kv,
        "custom:context=device,mlpwi=offload": h + q,
    }
    for name, per_token in kept.items():
        got = stored_activation_bytes_per_layer(dp, Schedule(remat=name))
        assert got == tokens * per_token * 2, name
    mem = estimate_memory(dp, schedule=Schedule(remat="custom:context=device,mlpwi=offload"))
    assert mem.host == LAYER.layers * tokens * 2 * ff * 2
    # tensor parallelism over 4 splits the heads and the MLP's hidden, not the residual
    tp = get_strategy("dp_tp").place(LAYER, abstract_mesh("data=2,model=4"))
    got = stored_activation_bytes_per_layer(tp, Schedule(remat="maxtext:save_dot_except_mlpwi"))
    assert got == tokens * (h + (q + 2 * kv) // 4 + h + h) * 2


def test_a_policy_recomputes_the_matmuls_whose_outputs_it_drops():
    dp = get_strategy("dp").place(LAYER, abstract_mesh("data=2"))
    hw = hardware("h100")

    def again(name):
        return step_work(dp, Schedule(remat=name), LAYER, 2, hw, flash_attention=True)

    tokens, h, q, ff = 4 * 2048, 4096, 32 * 128, 14336
    core = attention_core_flops(LAYER, tokens, 2048)
    flash = LAYER.layers * core / 2  # the blocked backward's scores, under every policy
    # saving every projection but the MLP's up-projections: the attention core and the
    # gate and up projection run again
    mlpwi = 2 * tokens * h * 2 * ff
    got = again("maxtext:save_dot_except_mlpwi").recompute_flops
    assert got == pytest.approx(LAYER.layers * (mlpwi + core) + flash, rel=1e-12)
    # keeping the query, key and value only: every other matmul runs again
    rest = 2 * tokens * (q * h + 3 * h * ff)
    got = again("maxtext:save_qkv_proj").recompute_flops
    assert got == pytest.approx(LAYER.layers * (rest + core) + flash, rel=1e-12)
    # keeping the attention's output as well as the projections: nothing but the scores
    assert again("maxtext:minimal_with_context").recompute_flops == pytest.approx(flash)
    # and all of them but the MLP's up: its matmul alone runs again, not the gate's
    up_only = "custom:" + ",".join(f"{t}=device" for t in (*QKV, "context", "out_proj",
                                                          "mlpwi_0", "mlpwo"))  # fmt: skip
    up = 2 * tokens * h * ff
    got = again(up_only).recompute_flops
    assert got == pytest.approx(LAYER.layers * up + flash, rel=1e-12)
    # the forward's tensor-parallel reductions run again where the out-projection or the
    # MLP's down-projection does
    assert reruns_forward_collectives("maxtext:save_qkv_proj")
    assert not reruns_forward_collectives("maxtext:save_dot_except_mlpwi")


# -- the compiled program ----------------------------------------------------------------------

#: A small layer, compiled on the 8 simulated CPU devices.
SMALL = ModelConfig(
    d_model=64, heads=4, kv_heads=2, ff=128, layers=2, batch=8, seq=64, vocab=None,
    dtype="bfloat16", mlp="swiglu", attention="blocked", scan=True,
)  # fmt: skip


def test_the_compiled_programs_memory_orders_as_the_policies_keep():
    if jax.device_count() < 8:
        pytest.skip(f"needs 8 devices, found {jax.device_count()}")
    mesh = jax.make_mesh((8,), ("data",))

    def compiled(name):
        prog = build_reference_program("dp", replace(SMALL, remat=name), mesh, mode="train")
        c = prog.lower().compile()
        return c.memory_analysis().temp_size_in_bytes, c.cost_analysis()["flops"]

    # each keeps less than the one before: the projections' outputs and the attention's,
    # the projections', the query, key and value, the layer's input
    order = ["maxtext:minimal_with_context", "maxtext:minimal", "maxtext:save_qkv_proj", "full"]
    temp, flops = zip(*(compiled(name) for name in order), strict=True)
    assert list(temp) == sorted(temp, reverse=True) and len(set(temp)) == len(temp), temp
    # and computes more again: keeping the attention's output (and its log-sum-exp, named
    # with it) spares the backward the attention's forward
    assert list(flops) == sorted(flops) and len(set(flops)) == len(flops), flops


def test_a_policy_keeps_the_gate_and_recomputes_the_up_as_it_names_them(capsys):
    """The residuals JAX saves for the backward of a SwiGLU MLP under each policy: the gate
    and the up, each one where it is kept, beside the arguments."""
    d, ff, tokens = 8, 16, (2, 4)
    params = {
        "mlp_norm": jnp.ones(d),
        "w_gate_up": jnp.full((d, 2, ff), 0.1),
        "w_down": jnp.full((ff, d), 0.1),
    }
    x = jnp.ones((*tokens, d))

    def saved(name):
        policy = decoder_remat_policy(name)
        fn = jax.checkpoint(lambda p, x: mlp(p, x, NO_HOOKS), policy=policy)
        jax.ad_checkpoint.print_saved_residuals(fn, params, x)
        lines = capsys.readouterr().out.splitlines()
        return sorted(re.findall(r"f32\[([0-9,]+)\] named '(\w+)'", "\n".join(lines)))

    hidden = f"{tokens[0]},{tokens[1]},{ff}"
    assert saved("custom:mlpwi_0=device") == [(hidden, "mlpwi_0")]
    assert saved("custom:mlpwi_1=device") == [(hidden, "mlpwi_1")]
    assert saved("custom:mlpwi=device") == [(hidden, "mlpwi_0"), (hidden, "mlpwi_1")]
    assert saved("full") == []


def test_recomputing_the_up_alone_runs_its_matmul_alone_again():
    """The compiled backward of 3 SwiGLU MLPs in a scan (as the decoder's layers) runs, per
    layer, the matmuls of what the policy recomputes again: the up's alone where the gate is
    kept, both where neither is (each 2 x tokens x d x ff FLOPs)."""
    d, ff, layers, tokens = 64, 256, 3, 64
    params = {
        "mlp_norm": jnp.ones((layers, d)),
        "w_gate_up": jnp.full((layers, d, 2, ff), 0.1),
        "w_down": jnp.full((layers, ff, d), 0.1),
    }
    x = jnp.ones((2, tokens // 2, d))

    def dot_flops_of(name):
        layer = jax.checkpoint(
            lambda x, p: (x + mlp(p, x, NO_HOOKS), None), policy=decoder_remat_policy(name)
        )

        def loss(params, x):
            return jnp.sum(jax.lax.scan(layer, x, params)[0] ** 2)

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        hlo = parse_hlo(step.lower(params, x).compile().as_text())
        return sum(
            dot_flops(c, i) for c in hlo.computations.values() for i in c.instructions
            if i.opcode == "dot"
        )  # fmt: skip

    kept = dot_flops_of("custom:mlpwi=device")
    one = 2 * tokens * d * ff  # one projection's matmul, once (the scan's body, once)
    assert dot_flops_of("custom:mlpwi_0=device") - kept == one
    assert dot_flops_of("full") - kept == 2 * one


@pytest.mark.compiler
def test_the_tpu_compiler_offloads_the_tensors_a_custom_policy_names():
    """Deviceless TPU v6e: the buffers in host memory (S(5)) are the query part of the fused
    projection and the out-projection's output, each layer's, and nothing else."""
    from shardscope._src.plan.compile import COMPILE_OPTIONS
    from shardscope._src.targets.mesh import target_mesh

    config = replace(SMALL, d_model=256, head_dim=64, seq=128)
    stage = replace(config, remat="custom:query_proj=offload,out_proj=offload")
    prog = build_reference_program("fsdp", stage, target_mesh("tpu-v6e", "data=8"), mode="train")
    text = prog.lower().compile(compiler_options=dict(COMPILE_OPTIONS)).as_text()
    on_host = set(re.findall(r"bf16\[([0-9,]+)\]\{[^}]*S\(5\)", text))
    # one sequence per device: 2 key/value groups of 2 queries of 64, and d_model 256
    assert on_host == {"2,1,128,2,2,64", "2,1,128,256"}


# -- the planner -------------------------------------------------------------------------------


def test_a_pinned_policy_is_planned_as_written_and_the_sweep_keeps_its_five_words():
    c = replace(LAYER, layers=4, batch=16)
    hw = hardware("h100")
    pinned, _, _ = screen_all(
        c, 8, hw, ["fsdp"], remat="save_dot_except_mlpwi", microbatches=1, stages=1
    )
    assert {s.candidate.remat for s in pinned} == {"maxtext:save_dot_except_mlpwi"}
    swept, _, _ = screen_all(c, 8, hw, ["fsdp"], microbatches=1, stages=1)
    assert {s.candidate.remat for s in swept} == {"none", "matmuls", "full", "offload"}
    # it keeps less than keeping the matmuls' outputs, and more than the full recomputation
    by = {s.candidate.remat: s for s in [*pinned, *swept] if not s.candidate.offload_optimizer}
    mem = {r: by[r].memory.activations for r in ("matmuls", "maxtext:save_dot_except_mlpwi")}
    assert by["full"].memory.activations < mem["maxtext:save_dot_except_mlpwi"] < mem["matmuls"]


def test_the_command_line_takes_policies_by_name(capsys):
    args = build_parser().parse_args(
        ["plan", "--devices", "8", "--remat", "full,custom:query_proj=offload,key_proj=offload"]
    )
    request = command_config(args).request()
    assert request.remat == ("full", "custom:query_proj=offload,key_proj=offload")
    argv = ["plan", "--model", "tiny", "--devices", "8", "--remat", "custom:mla_kv=device"]
    assert_usage_error(argv, "--remat", capsys)
