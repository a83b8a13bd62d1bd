"""Model shapes for the planner: published models as this package's reference decoder sees them.

The reference decoder (:mod:`~shardscope._src.model.config`) has multi-head attention and a
two-matrix GELU
MLP. The Llama family has a three-matrix SwiGLU MLP, and the 70B model grouped-query attention
(8 key/value heads). Each preset keeps the published ``d_model``, heads, layers and vocabulary
and picks the MLP width ``ff`` that gives this decoder the published parameter count, so that
memory (parameters, gradients, optimizer state) and matmul FLOPs (2 per parameter per token)
match the original. For the MHA models, ``ff`` is the SwiGLU width times 3/2 (two matrices of
``d x 3f/2`` hold as many weights as three of ``d x f``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardscope._src.base.errors import PlanError
from shardscope._src.model.config import ModelConfig


@dataclass(frozen=True)
class ModelPreset:
    """A named model shape and the batch geometry it is usually trained with.

    ``seq`` is the default sequence length; the default global batch is chosen by the planner
    (one sequence per device) because it depends on the device count.
    """

    name: str
    d_model: int
    heads: int
    ff: int
    layers: int
    vocab: int
    seq: int
    source: str

    def config(
        self, *, batch: int, seq: int | None = None, dtype: str = "bfloat16", **overrides: Any
    ) -> ModelConfig:
        """The :class:`ModelConfig` of this preset, scanned over layers, with overrides."""
        fields = dict(
            d_model=self.d_model,
            heads=self.heads,
            ff=self.ff,
            layers=self.layers,
            vocab=self.vocab,
            batch=batch,
            seq=self.seq if seq is None else seq,
            dtype=dtype,
            scan=True,
        )
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return ModelConfig(**fields)

    def param_count(self) -> int:
        return self.config(batch=1).param_count()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "d_model": self.d_model,
            "heads": self.heads,
            "ff": self.ff,
            "layers": self.layers,
            "vocab": self.vocab,
            "seq": self.seq,
            "params": self.param_count(),
            "source": self.source,
        }


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "tiny",
            256,
            8,
            1024,
            4,
            1024,
            128,
            "test-sized (3.7M parameters), not a published model",
        ),
        ModelPreset(
            "1b",
            2048,
            32,
            6656,
            22,
            32000,
            2048,
            "TinyLlama-1.1B (Zhang et al. 2024): d_model, heads, layers, vocab, context; ff "
            "6656 gives its 1.10B parameters (it has SwiGLU width 5632 and 4 key/value heads)",
        ),
        ModelPreset(
            "7b",
            4096,
            32,
            16512,
            32,
            32000,
            4096,
            "Llama-2-7B (Touvron et al. 2023): d_model, heads, layers, vocab, context; ff = "
            "3/2 x its SwiGLU width 11008, so 6.74B parameters as published",
        ),
        ModelPreset(
            "13b",
            5120,
            40,
            20736,
            40,
            32000,
            4096,
            "Llama-2-13B (Touvron et al. 2023): ff = 3/2 x its SwiGLU width 13824, so 13.0B "
            "parameters as published",
        ),
        ModelPreset(
            "70b",
            8192,
            64,
            35840,
            80,
            32000,
            4096,
            "Llama-2-70B (Touvron et al. 2023): ff 35840 gives its 69.0B parameters (it has "
            "SwiGLU width 28672 and 8 key/value heads, which this decoder does not model)",
        ),
    )
}


def model_preset(name: str) -> ModelPreset:
    """The preset called ``name`` (``tiny``, ``1b``, ``7b``, ``13b``, ``70b``).

    >>> model_preset("7b").param_count()
    6738415616
    """
    preset = MODEL_PRESETS.get(str(name).lower())
    if preset is None:
        raise PlanError(
            f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}, or give "
            f"the shape: d_model, heads, ff, layers (and vocab)",
            param="model",
        )
    return preset
