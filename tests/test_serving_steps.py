"""The reference decoder's serving steps: prefill and decode with a KV cache against the
training forward pass, and a tensor-parallel decode step's all-reduces on the H100 compiler."""

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.audit.overlap import kernel_costs
from shardscope._src.base.errors import ModelConfigError
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.serving import (
    ATTENTION_CORE,
    abstract_cache,
    abstract_quantized,
    abstract_serving_params,
    decode,
    prefill,
    quantize_weights,
    serving_params,
    serving_specs,
)
from shardscope._src.model.transformer import forward, init_params
from shardscope._src.sharding.programs import JitHooks

CONFIG = ModelConfig(
    d_model=64, heads=8, kv_heads=2, ff=128, layers=3, vocab=256, mlp="swiglu", seq=12, batch=2
)


def _tokens(n, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (2, n)), jnp.int32)


@functools.cache
def _forward_logits(config):
    """The training forward pass's logits of the last of :func:`_tokens` (12), ``config``'s
    initial weights: what the serving steps of each test below must give (computed once a
    config: a ``ModelConfig`` is hashable)."""
    return np.asarray(forward(init_params(config), _tokens(12), config)[:, -1])


def test_prefill_gives_the_forward_pass_last_logits_and_the_prompts_cache():
    params = init_params(CONFIG)
    tokens = _tokens(12)
    logits, cache = jax.jit(lambda p, t: prefill(p, t, CONFIG, 16))(params, tokens)
    want = _forward_logits(CONFIG)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert len(cache) == 3  # one per layer
    assert cache[0]["k"].shape == (2, 2, 16, 8)  # batch, kv heads, context, head dim
    assert not any(np.asarray(c["k"][:, :, 12:]).any() for c in cache)  # nothing beyond yet


def test_decode_continues_the_prompt_as_the_forward_pass_of_one_more_token():
    params = serving_params(init_params(CONFIG))
    tokens = _tokens(12)
    _, cache = prefill(params, tokens[:, :11], CONFIG, 16)
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, CONFIG), donate_argnums=1)
    logits, cache = step(params, cache, tokens[:, 11], jnp.int32(11))
    want = _forward_logits(CONFIG)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=2e-5, atol=2e-5)
    _, whole = prefill(params, tokens, CONFIG, 16)
    for got, full in zip(cache, whole, strict=True):
        np.testing.assert_allclose(
            np.asarray(got["v"][:, :, :12]), np.asarray(full["v"][:, :, :12]), rtol=2e-5, atol=2e-5
        )


@pytest.mark.parametrize("fmt, within", [("int8", 0.04), ("fp8", 0.1)])
def test_8_bit_weights_and_cache_decode_as_the_forward_pass_within_their_rounding(fmt, within):
    # one scale per weight matrix and per layer's keys and values: int8 rounds each to
    # 1/254 of its largest magnitude, fp8 (3 mantissa bits) to about 1/16 of itself;
    # measured 2.1% and 7% of the largest logit
    error, eight, cache = _eight_bit_error(CONFIG, fmt)
    assert cache[0]["k"].values.dtype == eight["layers"][0]["wo"].values.dtype
    assert error < within


def _eight_bit_error(config, fmt):
    """``(error, weights, cache)``: the largest error of the 12th token's logits decoded
    with 8-bit weights and cache (over the largest logit of the forward pass in the
    model's dtype), the 8-bit weights, and the cache of the 11 tokens before it."""
    params = init_params(config)
    tokens = _tokens(12)
    eight = quantize_weights(params, fmt)
    _, cache = jax.jit(lambda p, t: prefill(p, t, config, 16, cache=fmt))(eight, tokens[:, :11])
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config))
    logits, _ = step(eight, cache, tokens[:, 11], jnp.int32(11))
    want = _forward_logits(config)
    return np.max(np.abs(np.asarray(logits) - want)) / np.max(np.abs(want)), eight, cache


def _decode_on_one_h100(config, params, cache, batch):
    """The audit of ``config``'s decode step compiled for one H100 (deviceless), its
    arguments whole on it."""
    mesh = shardscope.target_mesh("h100", "model=1", axis_types="auto")
    whole = NamedSharding(mesh, P())

    def placed(tree):
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=whole), tree)

    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config), donate_argnums=1)
    tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=whole)
    pos = jax.ShapeDtypeStruct((), jnp.int32, sharding=whole)
    return shardscope.audit(step, placed(params), placed(cache), tokens, pos)


def _in_16_and_8_bits_on_one_h100(config, batch, context):
    """:func:`_decode_on_one_h100` of ``config`` in bfloat16 and with int8 weights and
    cache, by format."""
    audits = {}
    for fmt in ("bfloat16", "int8"):
        params = abstract_serving_params(config)
        if fmt == "int8":
            params = abstract_quantized(params, fmt)
        cache = abstract_cache(config, batch, context, fmt if fmt == "int8" else None)
        audits[fmt] = _decode_on_one_h100(config, params, cache, batch)
    return audits


#: A small decoder whose decode step is compiled for one H100, at 16 sequences over a cache
#: of 1,024 tokens.
SMALL = ModelConfig(
    d_model=512, heads=8, kv_heads=8, ff=2048, layers=2, vocab=1024, mlp="swiglu",
    dtype="bfloat16", batch=16, seq=1,
)  # fmt: skip


@pytest.mark.compiler
def test_an_8_bit_decode_step_holds_and_reads_8_bits_a_weight_on_the_h100_compiler():
    batch, context = 16, 1024
    audits = _in_16_and_8_bits_on_one_h100(SMALL, batch, context)
    # the arguments: each matrix's elements in one byte and its float32 scale, the norms'
    # gains in bfloat16, the cache in one byte and a scale for each layer's keys and values
    d, ff, v, layers = 512, 2048, 1024, 2
    matrices = d * 8 * (1 + 2) * 64 + 8 * 64 * d + d * 2 * ff + ff * d  # wqkv wo w_gate_up w_down
    weights = layers * (matrices + 4 * 4) + 2 * (v * d + 4)  # embed, unembed
    gains = (layers * 2 + 1) * d * 2
    cache = layers * 2 * (batch * 8 * context * 64 + 4)
    assert audits["int8"].memory["argument_size_in_bytes"] == (
        weights + gains + cache + batch * 4 + 4
    )
    # the values are converted where the matmuls read them: half the bf16 step's traffic,
    # not a dequantized copy of every weight written and read again
    assert audits["int8"].hlo_bytes < 0.55 * audits["bfloat16"].hlo_bytes


#: :data:`SMALL` with latent attention: each token's latent (128) and rotary key (32) cached.
SMALL_LATENT = replace(
    SMALL, head_dim=64, kv_lora_rank=128, q_lora_rank=96, rope_head_dim=32, v_head_dim=64
)


@pytest.mark.parametrize(
    "config, cached", [(SMALL, 2 * 8 * 64), (SMALL_LATENT, 128 + 32)], ids=["heads", "latent"]
)
@pytest.mark.parametrize("fmt, itemsize", [("bfloat16", 2), ("int8", 1)])
def test_a_decode_steps_attention_core_is_one_kernel_a_layer_reading_its_cache_once(
    config, cached, fmt, itemsize
):
    # on the H100 compiler the core runs as several kernels (the scores' matmul, the
    # softmax's reductions, the weighted values' matmul; latent attention's scores and
    # weighted sum each read the latents); as the one kernel a server runs it reads each
    # layer's cache once (8-bit as it is held, converted on chip: a token's keys and
    # values, or its latent and rotary key), and beside it the sequences' queries and
    # outputs, less than its float32 scores (8 heads a token of each context), which it
    # keeps on chip
    batch, context = 16, 1024
    cache = abstract_cache(config, batch, context, fmt if fmt == "int8" else None)
    audit = _decode_on_one_h100(config, abstract_serving_params(config), cache, batch)
    kernels = kernel_costs(audit.program.module, ATTENTION_CORE)
    cores = {k.cost: n for k, n in kernels.items() if k.fused}
    assert sum(cores.values()) == config.layers
    per_layer, scores = batch * context * cached * itemsize, batch * 8 * context * 4
    assert all(per_layer <= c.bytes < per_layer + scores for c in cores)


@pytest.mark.compiler
@pytest.mark.parametrize(
    "strategy, mesh_spec", [("tp", "model=8"), ("dp_tp", "data=2,model=4")], ids=["tp", "dp_tp"]
)
def test_a_tensor_parallel_decode_step_all_reduces_twice_a_layer_on_the_h100_compiler(
    strategy, mesh_spec
):
    config = ModelConfig(
        d_model=512,
        heads=8,
        kv_heads=8,
        ff=2048,
        layers=4,
        vocab=1024,
        mlp="swiglu",
        dtype="bfloat16",
        batch=16,
        seq=1,
    )
    batch, context = 16, 1024
    mesh = shardscope.target_mesh("h100", mesh_spec, axis_types="auto")
    placement = shardscope.get_strategy(strategy).place(config, mesh)
    replicas = mesh.shape.get("data", 1)
    rows = "data" if replicas > 1 else None  # the batch over data-parallel replicas
    args = _placed(config, mesh, placement, batch, context, rows)
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config), donate_argnums=1)
    audit = shardscope.audit(step, *args)
    # after the attention's output projection and the MLP's down projection, in every layer:
    # each replica's tokens' activations, (batch / replicas) x d_model in bfloat16; the
    # replicas share nothing
    assert {tuple(c.axes) for c in audit.collectives} == {("model",)}
    assert all(c.kind == "all-reduce" for c in audit.collectives)
    by_scope = {}
    for c in audit.collectives:
        by_scope[c.scope] = by_scope.get(c.scope, 0) + c.count
    assert by_scope == {"attention": config.layers, "mlp": config.layers}
    assert {c.payload_bytes for c in audit.collectives} == {batch // replicas * 512 * 2}


MOE = ModelConfig(
    d_model=64, heads=8, kv_heads=2, ff=128, layers=3, vocab=256, mlp="swiglu", seq=12, batch=2,
    experts=4, top_k=2, dense_layers=1, shared_experts=1, expert_ff=32,
)  # fmt: skip


@pytest.mark.parametrize("capacity", [None, 2.0], ids=["dropless", "capacity"])
def test_a_mixtures_prefill_and_decode_give_the_forward_pass_logits(capacity):
    # a dense layer, then two with experts (4, top 2, and a shared one); at capacity
    # factor 2 (experts / top_k) no assignment is dropped, so the grouping does not matter
    config = replace(MOE, capacity_factor=capacity)
    params = init_params(config)
    tokens = _tokens(12)
    want = _forward_logits(config)
    logits, _ = jax.jit(lambda p, t: prefill(p, t, config, 16, groups=2))(params, tokens)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=2e-5, atol=2e-5)
    served = serving_params(params)
    assert len(served["layers"]) == 1 and len(served["moe_layers"]) == 2
    _, cache = jax.jit(lambda p, t: prefill(p, t, config, 16))(served, tokens[:, :11])
    assert len(cache) == 3  # one per layer, with experts or not
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config), donate_argnums=1)
    logits, _ = step(served, cache, tokens[:, 11], jnp.int32(11))
    np.testing.assert_allclose(np.asarray(logits), want, rtol=2e-5, atol=2e-5)


def _placed(config, mesh, placement, batch, context, rows):
    """The served weights, the cache (split by sequence over ``rows`` and by key/value head
    over ``model``), the tokens and the position, as placed shapes."""

    def sds(tree, specs):
        return jax.tree.map(
            lambda s, spec: jax.ShapeDtypeStruct(
                s.shape, s.dtype, sharding=NamedSharding(mesh, spec)
            ),
            tree,
            specs,
        )

    params = sds(abstract_serving_params(config), serving_specs(placement.param_specs(), config))
    cache_spec = P(rows, "model", None, None)
    cache = sds(
        abstract_cache(config, batch, context),
        tuple({"k": cache_spec, "v": cache_spec} for _ in range(config.layers)),
    )
    tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=NamedSharding(mesh, P(rows)))
    pos = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
    return params, cache, tokens, pos


@pytest.mark.compiler
def test_an_expert_parallel_decode_step_dispatches_and_combines_on_the_h100_compiler():
    # 8 experts over expert=4 (two a device), their hidden and the heads over model=2, the
    # 16 sequences over expert (data-parallel attention), each device's 4 routed apart
    config = ModelConfig(
        d_model=512, heads=8, kv_heads=8, ff=1024, layers=2, vocab=1024, mlp="swiglu",
        dtype="bfloat16", batch=16, seq=1, experts=8, top_k=2, capacity_factor=1.0,
    )  # fmt: skip
    mesh = shardscope.target_mesh("h100", "expert=4,model=2", axis_types="auto")
    placement = shardscope.get_strategy("ep_tp").place(config, mesh)
    hooks = JitHooks(placement)
    args = _placed(config, mesh, placement, 16, 1024, "expert")
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config, hooks, groups=4))
    audit = shardscope.audit(step, *args)
    found = {}
    for c in audit.collectives:
        key = (c.kind, c.scope, tuple(c.axes), c.payload_bytes)
        found[key] = found.get(key, 0) + c.count
    # each way, every layer: the 16 tokens' 2 assignments of 512 bf16 elements, the bound
    # for uniform routing at capacity factor 1 (one slot an expert in each group of 4)
    moved = 16 * 2 * 512 * 2
    assert found[("all-to-all", "moe/dispatch", ("expert",), moved)] == 2
    assert found[("all-to-all", "moe/combine", ("expert",), moved)] == 2
    # tensor parallelism over model: the attention's output (a device's 4 tokens) and the
    # routed experts' outputs in their slots (its experts' 2 x 4 slots, one a group), each
    # layer
    assert found[("all-reduce", "attention", ("model",), 4 * 512 * 2)] == 2
    assert found[("all-reduce", "moe/experts", ("model",), 2 * 4 * 512 * 2)] == 2
    assert sum(found.values()) == 8


LATENT = ModelConfig(
    d_model=64, heads=4, head_dim=16, ff=128, layers=3, vocab=256, mlp="swiglu", seq=12,
    batch=2, kv_lora_rank=32, q_lora_rank=24, rope_head_dim=8, v_head_dim=16,
)  # fmt: skip


@pytest.mark.parametrize("experts", [0, 4], ids=["dense", "experts"])
def test_latent_attention_caches_the_latent_and_decodes_as_the_forward_pass(experts):
    # DeepSeek-V2's cache: each token's normed latent (rank 32) and its rotary key (8),
    # shared by the 4 heads; decode attends against them with the up-projections absorbed
    more = dict(experts=4, top_k=2, dense_layers=1, shared_experts=1, expert_ff=32)
    config = replace(LATENT, **more) if experts else LATENT
    params = init_params(config)
    tokens = _tokens(12)
    want = _forward_logits(config)
    logits, cache = jax.jit(lambda p, t: prefill(p, t, config, 16))(params, tokens)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=2e-5, atol=2e-5)
    assert [set(c) for c in cache] == [{"latent", "rope"}] * 3
    assert cache[0]["latent"].shape == (2, 16, 32) and cache[0]["rope"].shape == (2, 16, 8)
    served = serving_params(params)
    step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, config), donate_argnums=1)
    fill = jax.jit(lambda p, t: prefill(p, t, config, 16))
    _, cache = fill(served, tokens[:, :11])
    logits, cache = step(served, cache, tokens[:, 11], jnp.int32(11))
    np.testing.assert_allclose(np.asarray(logits), want, rtol=2e-5, atol=2e-5)
    _, whole = fill(served, tokens)
    for got, full in zip(cache, whole, strict=True):  # the 12th token's latent written
        np.testing.assert_allclose(
            np.asarray(got["latent"][:, :12]), np.asarray(full["latent"][:, :12]), atol=2e-5
        )
    # an int8 latent (one scale a layer): within 2% of the largest logit (measured 0.8%)
    _, eight = jax.jit(lambda p, t: prefill(p, t, config, 16, cache="int8"))(served, tokens[:, :11])
    logits, _ = step(served, eight, tokens[:, 11], jnp.int32(11))
    assert np.max(np.abs(np.asarray(logits) - want)) < 0.02 * np.max(np.abs(want))


def test_a_latent_decode_step_attends_against_the_latents_themselves():
    # with the up-projections absorbed, each cached token costs every head a score against
    # its latent and rotary key and a weighted latent: 2 x (2 x 32 + 8) FLOPs a head, a
    # layer, a sequence; made into each head's keys and values it would cost
    # 2 x 32 x (16 + 16) more for the projection alone
    flops = {}
    for context in (16, 48):
        args = (
            abstract_serving_params(LATENT),
            abstract_cache(LATENT, 2, context),
            jax.ShapeDtypeStruct((2,), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32),
        )
        step = jax.jit(lambda p, c, t, i: decode(p, c, t, i, LATENT))
        flops[context] = shardscope.audit(step, *args).hlo_flops
    assert flops[48] - flops[16] == 2 * 3 * 4 * 2 * (2 * 32 + 8) * (48 - 16)


@pytest.mark.parametrize("fmt, within", [("int8", 0.05), ("fp8", 0.12)])
@pytest.mark.parametrize("model", ["experts", "latent", "both"])
def test_8_bit_experts_and_latent_attention_decode_as_the_forward_pass_within_rounding(
    model, fmt, within
):
    # each 8-bit weight's scale moved onto the activations: the experts' tokens enter times
    # their first weight's (the router divided by it), leave times their last's; latent
    # attention's projections scale their outputs. More matmuls in a row than the dense
    # layer's round more: measured 2.3-3.7% (int8) and 8.3-9.5% (fp8) of the largest logit
    experts = dict(experts=4, top_k=2, dense_layers=1, shared_experts=1, expert_ff=32)
    config = {
        "experts": replace(MOE, capacity_factor=2.0),
        "latent": LATENT,
        "both": replace(LATENT, capacity_factor=2.0, **experts),
    }[model]
    assert _eight_bit_error(config, fmt)[0] < within


@pytest.mark.compiler
def test_an_8_bit_mixture_with_latent_attention_reads_8_bits_a_weight_on_the_h100_compiler():
    config = ModelConfig(
        d_model=512, heads=8, head_dim=64, ff=1024, layers=2, vocab=1024, mlp="swiglu",
        dtype="bfloat16", batch=16, seq=1, kv_lora_rank=128, q_lora_rank=96,
        rope_head_dim=32, v_head_dim=64, experts=8, top_k=2, capacity_factor=1.0,
    )  # fmt: skip
    moved = {fmt: a.hlo_bytes for fmt, a in _in_16_and_8_bits_on_one_h100(config, 16, 128).items()}
    # the experts' and the projections' values converted where their matmuls read them: a
    # byte less of each matrix read (a dequantized copy written and read again would move
    # more); the experts' three matrices, then latent attention's wq_a, wq_b, wkv_a, wkv_b
    # and wo, the router, each of 2 layers, and the output projection
    experts = 8 * 3 * 512 * 1024
    attention = 512 * 96 + 96 * 8 * (64 + 32) + 512 * (128 + 32) + 128 * 8 * 128 + 8 * 64 * 512
    matrices = 2 * (experts + attention + 512 * 8) + 512 * 1024
    assert moved["bfloat16"] - moved["int8"] >= matrices


def test_serving_needs_a_vocabulary():
    with pytest.raises(ModelConfigError, match="vocab"):
        prefill({}, jnp.zeros((1, 4), jnp.int32), ModelConfig(), 8)
