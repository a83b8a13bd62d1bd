"""Numerics: a sharded program against the unsharded reference on one device.

The error of a scope is ``max |sharded - reference| / max |reference|`` over the scope's
values: the attention and MLP sublayer outputs of every layer and the model output (forward),
or the loss and the gradients of each scope's weights (train step). Sharding changes only the
order of floating-point sums (partial matmul sums, all-reduce trees), so the tolerance is a
small multiple of the dtype's rounding unit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from shardscope._src.base.devices import host_value
from shardscope._src.base.records import record_dict
from shardscope._src.mesh import mesh_axes
from shardscope._src.model.config import MLA_PARAMS, Mode, ModelConfig, flat_params
from shardscope._src.model.transformer import forward, train_step
from shardscope._src.sharding.programs import build_reference_program

# Max relative error allowed per dtype. float32: reordered sums over a few hundred terms stay
# near 1e-6, and 1e-5 is the usual bar for a module of this size. 16-bit types: 4 machine
# epsilons (4 * 2^-7 for bfloat16, 4 * 2^-10 for float16), since partial sums are rounded to
# the storage type before they are reduced across devices, and both sides round independently.
TOLERANCES = {"float32": 1e-5, "bfloat16": 4 * 2.0**-7, "float16": 4 * 2.0**-10}

# Weights belonging to each named scope, for per-scope gradient errors.
SCOPE_PARAMS = {
    "attention": ("attn_norm", "wqkv", *MLA_PARAMS, "wo"),
    "mlp": ("mlp_norm", "w_up", "w_gate_up", "w_down"),
    "embedding": ("embed", "final_norm", "unembed"),
}


@dataclass(frozen=True)
class NumericsReport:
    """Largest relative error per scope of one program against the one-device reference."""

    strategy: str
    impl: str
    mode: str
    mesh: dict[str, int]
    dtype: str
    errors: dict[str, float]
    tolerance: float

    @property
    def worst(self) -> float:
        return max(self.errors.values())

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, extra=("ok",))


def relative_error(actual: Any, expected: Any) -> float:
    """``max |actual - expected| / max |expected|`` in float64 (absolute if expected is 0)."""

    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {e.shape}")
    diff = float(np.max(np.abs(a - e))) if a.size else 0.0
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    return diff / scale if scale else diff


def reference_outputs(config: ModelConfig, args: tuple[Any, ...], mode: str) -> Any:
    """The unsharded reference on this process's first device: forward with sublayer
    captures, or ``(loss, grads)``."""

    local = jax.device_put(host_value(args), jax.local_devices()[0])
    return _reference_fn(config, mode)(*local)


@functools.lru_cache(maxsize=32)
def _reference_fn(config: ModelConfig, mode: str) -> Any:
    # One compiled reference per config and mode, shared by every strategy compared to it.

    if mode == Mode.FORWARD:
        return jax.jit(lambda p, x: forward(p, x, config, capture=True))
    return jax.jit(lambda p, b: train_step(p, b, config))


def compare_numerics(
    strategy: Any,
    config: ModelConfig | None = None,
    mesh: Any = None,
    *,
    impl: str = "jit",
    mode: str = Mode.FORWARD,
    seed: int = 0,
    tolerance: float | None = None,
) -> NumericsReport:
    """Runs ``strategy`` and the unsharded reference on the same random inputs.

    ``strategy`` is anything
    :func:`shardscope._src.sharding.programs.build_reference_program` accepts.

    Not run as a doctest (it runs two models; the strategy tests run it for every strategy):

    >>> compare_numerics("tp", ModelConfig(layers=1), "model=8").ok  # doctest: +SKIP
    True
    """

    program = build_reference_program(
        strategy, config, mesh, mode=mode, impl=impl, capture=mode == Mode.FORWARD
    )
    config = program.config

    args = program.example_args(seed)
    actual = host_value(program.fn(*args))
    expected = reference_outputs(config, args, mode)

    errors: dict[str, float] = {}
    if mode == Mode.FORWARD:
        (out, caps), (ref_out, ref_caps) = actual, expected
        for scope in ("attention", "mlp"):
            errors[scope] = relative_error(caps[scope], ref_caps[scope])
        errors["output"] = relative_error(out, ref_out)
    else:
        (loss, grads), (ref_loss, ref_grads) = actual, expected
        errors["loss"] = relative_error(loss, ref_loss)
        g, rg = flat_params(grads), flat_params(ref_grads)
        for scope, names in SCOPE_PARAMS.items():
            present = [n for n in names if n in g]
            if present:
                errors[scope] = max(relative_error(g[n], rg[n]) for n in present)
    return NumericsReport(
        strategy=program.placement.name,
        impl=impl,
        mode=mode,
        mesh=mesh_axes(program.mesh),
        dtype=config.dtype,
        errors=errors,
        tolerance=TOLERANCES[config.dtype] if tolerance is None else tolerance,
    )
