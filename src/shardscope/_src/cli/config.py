"""What each command line asks for, as a typed record: the parsers (cli/parsers.py) produce an
``argparse.Namespace``, :meth:`CommandConfig.from_args` turns it into one of these, and the
handlers read only these records before they call the library.

A field holds the option whose ``dest`` has its name; ``multiprocess`` holds the
multi-process option group and ``flags`` the command's own flags (for naming the library's
parameters in errors and notes).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

from shardscope._src.cli.args import Flags
from shardscope._src.cli.distributed import DistributedConfig
from shardscope._src.cli.options import given
from shardscope._src.model.remat import split_policies
from shardscope._src.plan.request import MODEL_DIMS, PlanRequest, ServeRequest


@dataclass(frozen=True, kw_only=True)
class CommandConfig:
    """The base of every command's record; ``flags`` names its options."""

    flags: Flags = field(default_factory=Flags, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        """The record of the options ``args`` holds: each field from the ``dest`` of its name."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "flags":
                values[f.name] = Flags.of(args.command_parser)
            elif f.name == "multiprocess":
                values[f.name] = DistributedConfig.from_args(args)
            else:
                values[f.name] = getattr(args, f.name)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class LabConfig(CommandConfig):
    """``shardscope lab``."""

    devices: int | None
    out: str
    multiprocess: DistributedConfig


@dataclass(frozen=True, kw_only=True)
class AuditConfig(CommandConfig):
    """What every ``shardscope audit PROGRAM`` takes; each program's record adds its own."""

    mesh: str | None
    default_mesh: str | None  # the program's mesh when --mesh is not given
    json: str | None
    devices: int | None
    by_scope: bool
    compile_target: str | None  # --compiler (or --target); None: simulated CPU devices
    verbose: bool
    multiprocess: DistributedConfig

    @property
    def mesh_or_default(self) -> str | None:
        return self.mesh or self.default_mesh


@dataclass(frozen=True, kw_only=True)
class AuditProgramConfig(AuditConfig):
    """``shardscope audit FILE.py:FUNCTION``."""

    program_ref: str
    rules: str | None
    rule_set: str | None
    axis_types: str | None


@dataclass(frozen=True, kw_only=True)
class AuditHloConfig(AuditConfig):
    """``shardscope audit --hlo FILE``."""

    hlo: str


@dataclass(frozen=True, kw_only=True)
class AuditReshardConfig(AuditConfig):
    """``shardscope audit reshard``."""


@dataclass(frozen=True, kw_only=True)
class AuditMatmulConfig(AuditConfig):
    """``shardscope audit matmul``."""

    m: int
    k: int
    n: int
    dtype: str
    a_spec: str
    b_spec: str
    out_spec: str
    hints: bool


@dataclass(frozen=True, kw_only=True)
class AuditMoEConfig(AuditConfig):
    """``shardscope audit moe``."""

    tokens: int
    d_model: int
    ff: int
    experts: int
    top_k: int
    capacity_factor: float
    dtype: str
    mode: str
    impl: str
    dispatch_once: bool = False
    weight_activations: bool = False


@dataclass(frozen=True, kw_only=True)
class AuditTransformerConfig(AuditConfig):
    """``shardscope audit transformer``."""

    strategy: str
    layers: int | None
    mode: str
    impl: str
    constraints: bool
    d_model: int | None
    heads: int | None
    ff: int | None
    batch: int | None
    seq: int | None
    dtype: str | None
    hints: bool

    @property
    def sizes(self) -> dict[str, Any]:
        """The model sizes given (None: the default)."""
        return {
            "layers": self.layers,
            "d_model": self.d_model,
            "heads": self.heads,
            "ff": self.ff,
            "batch": self.batch,
            "seq": self.seq,
            "dtype": self.dtype,
        }


@dataclass(frozen=True, kw_only=True)
class DiffConfig(CommandConfig):
    """``shardscope diff OLD.json NEW.json``."""

    old: str
    new: str
    max_bytes_increase: str | None
    no_new: list[str]
    json: str | None
    by_scope: bool


@dataclass(frozen=True, kw_only=True)
class ProfileConfig(CommandConfig):
    """``shardscope profile FILE.py:FUNCTION`` and ``profile --trace DIR``."""

    program_ref: str | None
    mesh: str | None
    trace: str | None
    audit: str | None
    compile_target: str | None  # --compiler, for the audit of a trace taken elsewhere
    steps: int
    warmup: int
    hardware: str | None
    trace_dir: str | None
    json: str | None
    png: str | None
    by_scope: bool
    rules: str | None
    rule_set: str | None
    axis_types: str | None


@dataclass(frozen=True, kw_only=True)
class LaunchConfig(CommandConfig):
    """``shardscope launch -n P -- SUB-COMMAND ...``."""

    num_processes: int
    devices_per_process: int
    timeout: float | None
    command: list[str]

    @property
    def sub_command(self) -> list[str]:
        """The sub-command's words, without the ``--`` that ends the launcher's options."""
        return self.command[1:] if self.command[:1] == ["--"] else list(self.command)


#: The hardware settings ``plan`` takes, by the dest of their options.
HARDWARE_OVERRIDES = (
    "link_bandwidth",
    "cross_node_bandwidth",
    "latency_s",
    "memory_bytes",
    "peak_flops",
    "node_size",
    "hbm_bandwidth",
    "hbm_fraction",
    "matmul_fraction",
    "comm_fraction",
    "fp8_peak_flops",
    "fp8_matmul_fraction",
    "tf32_peak_flops",
    "fp32_peak_flops",
    "attention_fwd_flops",
    "attention_bwd_flops",
    "kernel_launch_s",
    "kernel_floor_s",
    "sms",
    "tile_m",
    "tile_n",
    "exchange_sms",
    "tp_overlap",
    "pp_overlap",
    "ep_overlap",
    "fsdp_overlap",
)


@dataclass(frozen=True, kw_only=True)
class HardwareOptions(CommandConfig):
    """The hardware settings of ``plan`` and ``shard`` (None: the preset's), by the dest of
    their options."""

    link_bandwidth: float | None
    cross_node_bandwidth: float | None
    latency_s: float | None
    memory_bytes: float | None
    peak_flops: float | None
    hbm_bandwidth: float | None
    hbm_fraction: float | None
    matmul_fraction: float | None
    comm_fraction: float | None
    fp8_peak_flops: float | None
    fp8_matmul_fraction: float | None
    tf32_peak_flops: float | None
    fp32_peak_flops: float | None
    attention_fwd_flops: float | None
    attention_bwd_flops: float | None
    kernel_launch_s: float | None
    kernel_floor_s: float | None
    node_size: int | None
    sms: int | None
    tile_m: int | None
    tile_n: int | None
    exchange_sms: int | None
    tp_overlap: bool | None
    pp_overlap: bool | None
    ep_overlap: bool | None
    fsdp_overlap: bool | None

    @property
    def hardware_overrides(self) -> Mapping[str, Any]:
        """The hardware settings given, over the preset's."""
        given = {k: getattr(self, k) for k in HARDWARE_OVERRIDES}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class PlanConfig(HardwareOptions):
    """``shardscope plan``: of a built-in model (``--model`` or its shape) or, with
    ``program``, of the user's own ``make_step``. One record for both, since one parser takes
    both and each refuses the other's options.

    A field named as a :class:`PlanRequest` field holds that knob as given (None: not
    given, the request's default applies); :meth:`request` maps them onto the request.
    """

    model: str | None
    program: str | None
    rules: str | None
    rule_set: str | None
    axis_types: str | None
    axes: str | None
    meshes: str | None
    d_model: int | None
    heads: int | None
    ff: int | None
    layers: int | None
    vocab: int | None
    kv_heads: int | None
    head_dim: int | None
    devices: int
    batch: int | None
    seq: int | None
    mode: str | None
    hardware: str | None
    strategies: str | None
    remat: str | None
    offload_optimizer: bool | None
    vocab_split: bool | None
    imbalance: float | None
    dispatch_once: bool | None
    weight_activations: bool | None
    microbatches: int | None
    stages: int | None
    virtual_stages: int | None
    pipeline_split: str | None
    offload_layers: int | None
    mesh: str | None
    beside_best: bool | None
    compile_top: int | None
    bytes_per_param: int | None
    flash_attention: bool | None  # --no-flash-attention: False
    matmul_dtype: str | None
    fp8_saved_inputs: str | None
    fp8_params: int | None
    workers: int | None
    compiler: str | None
    target_plans: int | None
    top: int | None
    json: str | None
    png: str | None
    report: str | None
    serve: bool = False
    prompt: int | None = None
    output: int | None = None
    context: int | None = None
    weights: str | None = None
    cache: str | None = None
    latency: float | None = None
    rate: float | None = None
    clients: int | None = None
    engine: str | None = None
    chunked_prefill: int | None = None
    memory_share: float | None = None
    verbose: bool = False

    @property
    def dims(self) -> dict[str, int | None]:
        """The model dimensions, None where not given."""
        return {k: getattr(self, k) for k in MODEL_DIMS}

    def request(self) -> PlanRequest:
        """The plan of the built-in model these options ask for: each knob from the field of
        its name, the request's default where the option was not given. The model and the
        devices are always the command line's (``--devices`` is required, and no
        ``--model`` is a model given by its shape); ``--strategies`` and ``--remat`` are
        comma-separated lists."""
        given = {f.name: getattr(self, f.name, None) for f in fields(PlanRequest)}
        remat = None if self.remat is None else split_policies(self.remat)
        given.update(strategies=_names(self.strategies), remat=remat)
        knobs = {k: v for k, v in given.items() if v is not None and k not in ("model", "devices")}
        return PlanRequest(self.model, self.devices, **knobs)

    def serve_request(self) -> ServeRequest:
        """The serving plan ``--serve`` asks for (see :func:`serve_request_of`)."""
        return serve_request_of(self)


def serve_request_of(config: Any) -> ServeRequest:
    """The serving plan a command's record asks for: each knob of :class:`ServeRequest` from
    the field of its name where it was given, the hardware's settings over its preset's."""
    knobs = given(config, ServeRequest, skip=("model", "devices"))
    overrides = dict(config.hardware_overrides)
    return ServeRequest(config.model, config.devices, hardware_overrides=overrides, **knobs)


def _names(text: str | None) -> list[str] | None:
    """The names of a comma-separated list (None: not given)."""
    return None if text is None else [n.strip() for n in text.split(",")]


@dataclass(frozen=True, kw_only=True)
class ShardConfig(HardwareOptions):
    """``shardscope shard FILE.py:FUNCTION --devices N``."""

    program: str
    devices: int
    hardware: str | None
    compiler: str | None  # None: the hardware's own compiler where it has one, else cpu
    rules: str | None
    axes: str | None
    logical_axes: str | None
    axis_types: str | None
    compiles: int | None
    compare: bool | None
    ray: str | None
    workers: int | None
    top: int | None
    out: str | None  # None: the search's default for the program (suggest.default_file)
    json: str | None
    report: str | None
    verbose: bool


@dataclass(frozen=True, kw_only=True)
class ServeConfig(HardwareOptions):
    """``shardscope serve --model NAME --devices N --prompt N --output N``: a field named as
    a :class:`ServeRequest` field holds that knob as given (None: the request's default)."""

    model: str
    devices: int
    prompt: int
    output: int
    hardware: str | None
    batch: int | None
    context: int | None
    weights: str | None
    cache: str | None
    latency: float | None
    compiler: str | None
    imbalance: float | None
    dispatch_once: bool | None
    weight_activations: bool | None
    rate: float | None
    clients: int | None
    engine: str | None
    chunked_prefill: int | None
    memory_share: float | None
    top: int | None
    json: str | None
    png: str | None
    verbose: bool

    def request(self) -> ServeRequest:
        """The serving plan these options ask for (see :func:`serve_request_of`)."""
        return serve_request_of(self)
