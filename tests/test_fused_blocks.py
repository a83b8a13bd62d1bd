"""The reference decoder's element-wise blocks (norms, activations) run as fused kernels do:
the same values and gradients, and a train step without recomputation keeps per layer what
the memory estimate counts, on the H100 compiler, with FSDP and with context parallelism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import layer_growth
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.fused import fused, gate_and_up, rms_norm, swiglu

#: 8 sequences over data, each a quarter over context: 2048 tokens a device, as data=8 has.
MESH_CP = "data=2,context=4"


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (rms_norm, [(2, 16, 32), (32,)]),
        (jax.nn.gelu, [(2, 16, 64)]),
        (swiglu, [(2, 16, 64), (2, 16, 64)]),
    ],
    ids=["rms_norm", "gelu", "swiglu"],
)
def test_a_fused_block_computes_and_differentiates_as_the_plain_one(fn, shapes):
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s), dtype=jnp.float32) for s in shapes]

    def loss(f):
        return lambda *a: jnp.sum(jnp.sin(f(*a)))

    np.testing.assert_array_equal(fused(fn)(*args), fn(*args))
    got = jax.grad(loss(fused(fn)), argnums=tuple(range(len(args))))(*args)
    want = jax.grad(loss(fn), argnums=tuple(range(len(args))))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "equation, shapes",
    [("bsd,dtf->bstf", [(2, 16, 8), (8, 2, 32)]), ("ecd,edtf->ectf", [(4, 6, 8), (4, 8, 2, 32)])],
    ids=["mlp", "experts"],
)
def test_the_gate_and_up_compute_and_differentiate_as_two_matmuls(equation, shapes):
    rng = np.random.default_rng(0)
    x, w = (jnp.asarray(rng.standard_normal(s), dtype=jnp.float32) for s in shapes)
    axis = equation.split("->")[0].split(",")[1].index("t")

    def plain(x, w):
        halves = (jax.lax.index_in_dim(w, i, axis, keepdims=False) for i in (0, 1))
        single = equation.replace("t", "")
        return tuple(jnp.einsum(single, x, h) for h in halves)

    def loss(f):
        return lambda x, w: sum(jnp.sum(jnp.sin(o) * (i + 1)) for i, o in enumerate(f(x, w)))

    for got, want in zip(gate_and_up(equation, x, w), plain(x, w), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    def split(x, w):
        return gate_and_up(equation, x, w)

    got = jax.grad(loss(split), argnums=(0, 1))(x, w)
    want = jax.grad(loss(plain), argnums=(0, 1))(x, w)
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)


@pytest.mark.compiler
@pytest.mark.parametrize(
    "strategy, mesh_spec, mlp",
    [("fsdp", "data=8", "gelu"), ("fsdp", "data=8", "swiglu"), ("fsdp_cp", MESH_CP, "swiglu")],
)
def test_a_layer_without_recomputation_keeps_what_the_estimate_counts(strategy, mesh_spec, mlp):
    # The H100 compiler's temporaries grow by one layer's kept activations per layer of the
    # scan. Without the fused blocks JAX keeps each block's intermediates too (the norm's
    # float32 copy, each factor of the tanh GELU): about twice as much. Under context
    # parallelism each device keeps its own shard of the keys and values and the backward
    # gathers them again, where keeping every layer's whole-sequence copy holds more.
    def config_of(layers):
        return ModelConfig(
            layers=layers,
            d_model=128,
            heads=2,
            ff=512,
            mlp=mlp,
            seq=2048,
            batch=8,
            dtype="bfloat16",
            attention="blocked",
            attention_block=256,
        )

    estimate, kept = layer_growth(strategy, mesh_spec, config_of)
    # 2048 tokens a device (one sequence, or a quarter of four), bf16: the residual stream's
    # four tensors, the queries, keys, values and attention output (10 h and 8 h in
    # Korthikanti's Table 2), and the MLP's: GELU's input and output (4 ff), SwiGLU's gate,
    # up and product (6 ff).
    mlp_bytes = 4 * 512 if mlp == "gelu" else 6 * 512
    assert estimate == 2048 * (10 * 128 + 8 * 128 + mlp_bytes)
    assert kept == pytest.approx(estimate, rel=0.02)
