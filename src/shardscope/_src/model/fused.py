"""Element-wise blocks differentiated as fused kernels are: the reference decoder's norms
and activation functions, and its experts'."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

_EPS = 1e-6


def rms_norm(x: Any, gain: Any) -> Any:

    x32 = x.astype(jnp.float32)
    scale = jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + _EPS))
    return (x32 * scale).astype(x.dtype) * gain


def swiglu(gate_up: Any) -> Any:
    """SwiGLU's gating, ``silu(gate) * up``, of the stacked ``[..., 2, ff]`` projections."""
    return jax.nn.silu(gate_up[..., 0, :]) * gate_up[..., 1, :]


def weighted_swiglu(gate_up: Any, weight: Any) -> Any:
    """:func:`swiglu` of each row scaled by its router weight ``weight`` ``[...]``: the
    expert activation of Megatron-Core's grouped MLP (``weighted_bias_swiglu_impl``) and NeMo
    AutoModel's DeepEP experts (``WeightedSwiGLUFunction``), which weight a token's expert
    output before the down-projection, so the combine sums the outputs unweighted."""
    return swiglu(gate_up) * weight[..., None].astype(gate_up.dtype)


def weighted_gelu(x: Any, weight: Any) -> Any:
    """GELU of each row scaled by its router weight (:func:`weighted_swiglu`'s GELU twin)."""
    return jax.nn.gelu(x) * weight[..., None].astype(x.dtype)


def fused(fn: Any) -> Any:
    """``fn`` (element-wise: a norm, an activation) differentiated as one fused kernel is: the
    backward keeps its inputs alone and recomputes what lies between them and its output.

    JAX's autodiff on its own keeps every intermediate of such a block (the norm's float32
    copy, each factor of the tanh GELU, the sigmoid of SiLU): over twice a layer's activations
    without recomputation, more than PyTorch, Megatron-LM or MaxText keep for the same model.
    A ``custom_vjp``, so that no enclosing ``jax.checkpoint`` policy saves the intermediates
    again (a nested ``jax.checkpoint`` would be overruled by the outer policy).
    """

    @jax.custom_vjp
    def run(*args: Any) -> Any:
        return fn(*args)

    def forward(*args: Any) -> tuple[Any, Any]:
        return fn(*args), args

    def backward(args: Any, grad: Any) -> Any:
        return jax.vjp(fn, *args)[1](grad)

    run.defvjp(forward, backward)
    return functools.wraps(fn)(run)


#: RMSNorm, GELU and SwiGLU's gating, each keeping only its inputs for the backward
fused_norm = fused(rms_norm)
fused_gelu = fused(jax.nn.gelu)
fused_swiglu = fused(swiglu)
#: SwiGLU and GELU scaled by each row's router weight, keeping only their inputs and the
#: weights for the backward
fused_weighted_swiglu = fused(weighted_swiglu)
fused_weighted_gelu = fused(weighted_gelu)
