"""Element-wise blocks differentiated as fused kernels are: the reference decoder's norms
and activation functions, and its experts'; and SwiGLU's gate and up projections, two
matmuls differentiated as the one of their stacked weight."""

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


def swiglu(gate: Any, up: Any) -> Any:
    """SwiGLU's gating, ``silu(gate) * up``, of the gate and up projections ``[..., ff]``."""
    return jax.nn.silu(gate) * up


def weighted_swiglu(gate: Any, up: Any, weight: Any) -> Any:
    """:func:`swiglu` of each row scaled by its router weight ``weight`` ``[...]``: the
    expert activation of Megatron-Core's grouped MLP (``weighted_bias_swiglu_impl``) and NeMo
    AutoModel's DeepEP experts (``WeightedSwiGLUFunction``), which weight a token's expert
    output before the down-projection, so the combine sums the outputs unweighted."""
    return swiglu(gate, up) * weight[..., None].astype(up.dtype)


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gate_and_up(equation: str, x: Any, w: Any) -> tuple[Any, Any]:
    """SwiGLU's gate and up projections of ``x`` by their stacked weight ``w`` (its axis
    ``t`` in ``equation``, ``"bsd,dtf->bstf"``).

    Differentiated (a training step), the two halves of ``w`` are two matmuls, so that a
    recomputation policy that keeps one output runs the other's matmul alone again; and
    their gradients are the one matmul's of the stacked weight: the two stacked, then that
    matmul's transposes. Two matmuls' transposes would each reduce their partial sums of
    ``x``'s gradient over the axes the hidden is split over (tensor parallelism), where the
    compiler does not always add them first; the one matmul reduces their sum once (and
    the weight's gradient once, FSDP's reduce-scatter). A forward alone (serving) runs the
    one matmul of the stacked weight: nothing is recomputed there, and an 8-bit weight's
    conversion stays in it.

    >>> x, w = jnp.ones((1, 2, 3)), jnp.arange(12.0).reshape(3, 2, 2)
    >>> gate, up = gate_and_up("bsd,dtf->bstf", x, w)
    >>> gate[0, 0].tolist(), up[0, 0].tolist()
    ([12.0, 15.0], [18.0, 21.0])
    """
    both = jnp.einsum(equation, x, w)
    axis = equation.split("->")[1].index("t")
    gate, up = (jax.lax.index_in_dim(both, i, axis, keepdims=False) for i in (0, 1))
    return gate, up


def _halves(equation: str, x: Any, w: Any) -> tuple[Any, Any]:
    ins, out = equation.split("->")
    lhs, rhs = ins.split(",")
    half = f"{lhs},{rhs.replace('t', '')}->{out.replace('t', '')}"
    axis = rhs.index("t")
    gate, up = (jax.lax.index_in_dim(w, i, axis, keepdims=False) for i in (0, 1))
    return jnp.einsum(half, x, gate), jnp.einsum(half, x, up)


def _gate_and_up_forward(equation: str, x: Any, w: Any) -> tuple[Any, Any]:
    return _halves(equation, x, w), (x, w)


def _gate_and_up_backward(equation: str, res: Any, grads: Any) -> tuple[Any, Any]:
    x, w = res
    stacked = jnp.stack(grads, axis=equation.split("->")[1].index("t"))
    (dx,) = jax.linear_transpose(lambda x_: jnp.einsum(equation, x_, w), x)(stacked)
    (dw,) = jax.linear_transpose(lambda w_: jnp.einsum(equation, x, w_), w)(stacked)
    return dx, dw


gate_and_up.defvjp(_gate_and_up_forward, _gate_and_up_backward)
