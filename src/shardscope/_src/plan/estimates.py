"""Analytic estimates for a strategy's placement: memory per device, model FLOPs, which links a
collective's groups use. Pure arithmetic on the config and the strategy's rules; no compiling.

Memory (per device, bytes):

* model state (ZeRO, arXiv 1910.02054): parameters and gradients at the model's dtype, and
  ``bytes_per_param - 2 x itemsize`` bytes of optimizer state per parameter (16 by default:
  bf16 params and grads, fp32 master copy, Adam m and v). Each parameter is divided by the
  number of devices its storage spec shards it over, so DP holds everything, FSDP ``1/d``,
  tensor parallelism ``1/t`` of the sharded matrices (norm gains stay whole).
* activations kept for the backward pass (Korthikanti et al., arXiv 2205.05198, Table 2,
  16-bit activations), per layer with ``s`` sequence, ``b`` sequences per data shard, ``h``
  d_model, ``a`` heads, ``f`` ff and ``t`` the tensor-parallel degree:
  ``sbh (10 + (8 + 4f/h)/t + 5as/(ht))`` and, with sequence parallelism,
  ``sbh ((18 + 4f/h)/t + 5as/(ht))``. With ``f = 4h`` these are the paper's
  ``sbh (10 + 24/t + 5as/(ht))`` and ``sbh (34/t + 5as/(ht))``. Flash attention drops the
  ``5as/(ht)`` term (the default). Plus the logits, ``bsv`` at the model dtype and in fp32 for
  the loss. Scaled by ``itemsize / 2`` for 32-bit models. A forward pass keeps one layer's.
* FSDP's gathered weights: one layer's full weights (divided by ``t``), alive while it runs.

Model FLOPs per step (the same paper's Eq. 7, generalised to an MLP of width ``f``): forward
``2 T (L (4h^2 + 2hf) + 2 L s h + h v)`` for ``T = batch x seq`` tokens (non-causal attention,
as the paper counts it), train 3x forward (no recomputation). With ``f = 4h`` this is
``72 B L s h^2 (1 + s/(6h) + v/(12hL))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardscope._src.base.errors import PlanError
from shardscope._src.base.io import record_dict
from shardscope._src.model.config import LAYER_PARAMS, ModelConfig, param_shapes
from shardscope._src.sharding.strategies import Placement

#: Mixed-precision Adam: bf16 params (2) + bf16 grads (2) + fp32 master, m, v (12).
DEFAULT_BYTES_PER_PARAM = 16

FLOPS_CONVENTION = (
    "model FLOPs (Korthikanti et al. 2022, Eq. 7, MLP width ff): forward 2 x tokens x "
    "(L(4h^2 + 2h ff) + 2Lsh + hv), non-causal attention; train = 3 x forward, no recompute"
)
ACTIVATION_CONVENTION = (
    "activations: Korthikanti et al. 2022, Table 2, MLP terms scaled from 4h to ff, "
    "16-bit, stored for the backward pass"
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Analytic bytes per device, by what they hold."""

    params: int
    grads: int
    optimizer: int
    activations: int
    gathered_weights: int

    @property
    def model_state(self) -> int:
        """Parameters, gradients and optimizer state: what no recomputation can shrink."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_state + self.activations + self.gathered_weights

    def to_dict(self) -> dict[str, int]:
        return record_dict(self, extra=("model_state", "total"))


def data_ways(placement: Placement) -> int:
    """How many ways the batch is split (1 when the strategy replicates it)."""
    return placement.role_size("data") if placement.strategy.batch_role == "data" else 1


def model_ways(placement: Placement) -> int:
    return placement.role_size("model") if "model" in placement.strategy.roles else 1


def param_elements_per_device(placement: Placement) -> int:
    """Parameter elements one device stores, by each parameter's storage spec."""
    rules = placement.strategy.param_rules()
    total = 0
    for name, shape in param_shapes(placement.config).items():
        ways = math.prod(placement.role_size(r) for r in rules[name] if r is not None)
        total += math.prod(shape) // ways
    return total


def activation_bytes_per_layer(placement: Placement, *, flash_attention: bool = True) -> int:
    """Bytes of one layer's activations kept for the backward pass, on one device."""
    c = placement.config
    s, h, a, f = c.seq, c.d_model, c.heads, c.ff
    b = c.batch // data_ways(placement)
    t = model_ways(placement)
    attention = 0 if flash_attention else 5 * a * s
    if placement.strategy.sequence_parallel:
        per_token = (18 * h + 4 * f + attention) / t
    else:
        per_token = 10 * h + (8 * h + 4 * f + attention) / t
    return math.ceil(s * b * per_token * c.itemsize / 2)


def estimate_memory(
    placement: Placement,
    mode: str = "train",
    *,
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    flash_attention: bool = True,
) -> MemoryEstimate:
    """Analytic memory per device of ``placement`` (see the module docstring for the formulas).

    >>> from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
    >>> dp, fsdp = (get_strategy(s).place(ModelConfig(), abstract_mesh("data=8"))
    ...             for s in ("dp", "fsdp"))
    >>> estimate_memory(dp).params // estimate_memory(fsdp).params  # FSDP: 1/8 per device
    8
    """
    c = placement.config
    item = c.itemsize
    if mode == "train" and bytes_per_param < 2 * item:
        raise PlanError(
            f"bytes_per_param={bytes_per_param} is less than the parameter and its gradient "
            f"at {c.dtype} ({2 * item} bytes); use at least {2 * item} (16 for mixed-precision "
            f"Adam, 10 for the scaling book's convention)"
        )
    elements = param_elements_per_device(placement)
    params = elements * item
    train = mode == "train"
    grads = params if train else 0
    optimizer = elements * (bytes_per_param - 2 * item) if train else 0
    b = c.batch // data_ways(placement)
    per_layer = activation_bytes_per_layer(placement, flash_attention=flash_attention)
    logits = b * c.seq * c.vocab * (item + 4 if train else item) if c.vocab else 0
    activations = (c.layers if train else 1) * per_layer + logits
    gathered = 0
    if "data" in placement.strategy.roles and any(
        "data" in roles for roles in placement.strategy.param_rules().values()
    ):
        layer = sum(
            math.prod(shape[1:]) for name, shape in param_shapes(c).items() if name in LAYER_PARAMS
        )
        gathered = layer * item // model_ways(placement)
    return MemoryEstimate(params, grads, optimizer, activations, gathered)


def model_flops(config: ModelConfig, mode: str = "train") -> int:
    """FLOPs of one step on all devices together (see :data:`FLOPS_CONVENTION`).

    >>> model_flops(ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=8, seq=16),
    ...             "forward")
    26214400
    """
    c = config
    h, f, L, s = c.d_model, c.ff, c.layers, c.seq
    per_token = L * (4 * h * h + 2 * h * f) + 2 * L * s * h + h * (c.vocab or 0)
    forward = 2 * c.batch * s * per_token
    return 3 * forward if mode == "train" else forward


def crosses_nodes(sizes: Mapping[str, int], axes: Sequence[str], node_size: int) -> bool:
    """Whether a collective over ``axes`` has a group spanning two nodes.

    Devices are numbered in mesh order (the last axis varies fastest) and node ``k`` holds
    devices ``k*node_size`` to ``(k+1)*node_size - 1``. An axis that is not a plain mesh axis
    (a sub-axis, or an irregular group) is taken to cross whenever the mesh does.
    """
    import numpy as np

    total = math.prod(sizes.values())
    if total <= node_size:
        return False
    names = list(sizes)
    if not axes or any(a not in sizes for a in axes):
        return True
    ids = np.arange(total).reshape(tuple(sizes.values()))
    group = [names.index(a) for a in axes]
    rest = [i for i in range(len(names)) if i not in group]
    groups = ids.transpose(rest + group).reshape(-1, math.prod(sizes[a] for a in axes))
    nodes = groups // node_size
    return bool((nodes.min(axis=1) != nodes.max(axis=1)).any())


def settings_dict(bytes_per_param: int, flash_attention: bool) -> dict[str, Any]:
    return {
        "bytes_per_param": bytes_per_param,
        "flash_attention": flash_attention,
        "flops_convention": FLOPS_CONVENTION,
        "activation_convention": ACTIVATION_CONVENTION,
    }
