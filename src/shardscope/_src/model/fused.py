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
