"""The training planner judged on published, measured H100 runs it was never calibrated on.

Each row is a run as its source published it: NVIDIA's DGX Cloud Benchmarking recipes (NeMo
Megatron's Llama 3.1 8B / 70B / 405B, Nemotron-4 15B / 340B and GPT-3 175B; MaxText's Llama 2
70B), with the parallelism, recomputation and optimizer of the recipe's own configuration
file, and torchtitan's Llama 3.1 8B on 128 H100s (the calibration holds its 8-GPU run only).
Each is planned as it ran, by the analytic estimate that ``calibration.py`` uses (no compile):
the parallelism as the planner's composable dimensions (Megatron's tensor parallel with
sequence parallelism, context parallel in Transformer Engine's default ring form, pipeline
stages with virtual stages and the distributed optimizer are ``zero1_sp_cp_ring`` on
``stage=P,data=D,context=C,model=T`` with ``virtual_stages``), MaxText's recomputation policy
by name, and the micro-batches as the global batch over the micro-batch times the data-parallel
ways. Nothing here is fitted: the H100 preset's constants are the planner's own; only what a
source states is set (the cuDNN fused attention that Transformer Engine and MaxText's
``cudnn_flash_te`` run, at its measured H100 rates, FlashAttention-2's where a recipe turns
cuDNN's off, and torchtitan's power-limited 96 GB H100s as ``calibration.py`` sets them).

Per row: the predicted step, the measured one, the signed error, and whether the plan fits
the device it ran on; a run that ran and is called a misfit is counted, and its memory
estimate is printed against the device's with what makes it up. Where the planner cannot
write a configuration the row says so and is left out of the median (counted). The summary
gives the held-out rows apart from the calibration rows (``calibration.py``'s, printed beside
them), and the fp8 runs (the planner's ``matmul_dtype="fp8"`` path) apart from the bf16 ones.
The fp8 runs keep their linear layers' inputs for the backward as their framework does
(``fp8_saved_inputs``): Transformer Engine's fp8 copies for NeMo's and Megatron-Bridge's,
torchao's 16-bit inputs for torchtitan's, and the planner's default (16-bit) for MaxText's.

The NeMo runs with tensor parallelism are planned with the vocabulary split over ``model``
(``vocab_split``: Megatron's vocabulary-parallel embedding and output layer under sequence
parallelism), and context parallelism in its ring form (``cp_comm_type: p2p``, Transformer
Engine's default: the keys and values passed around the context ranks, each step beside the
attention of the chunk in hand). Not a configuration but the program's own accumulation: ZeRO-1's
gradients are added up on each device and reduce-scattered once a step, as Megatron's
distributed optimizer does over its data x context group: under context parallelism each
context rank adds up the partial gradients of its part of every sequence over the micro-batches,
and they are reduced over ``context`` with the data ranks' once, after the last micro-batch.

Megatron-Bridge's performance summary adds its own section (``BRIDGE_RUNS``): every dense
DGX-H100 pretraining row of its release tables (26.06 back to 25.09: Llama 3 8B with
Megatron-FSDP, Llama 3 70B and Llama 3.1 405B with TP x PP x VP (x CP), all FP8 current
scaling), each planned by the recipe its scripts/performance configuration builds, the step
derived from the published tokens a second a GPU; its fine-tuning rows are listed, not judged.

The same summary's Blackwell tables are judged apart (``BLACKWELL_RUNS``, their own summary
lines; "held-out, all" stays the H100 runs'): every dense FP8-CS pretraining row on DGX-B200
(the ``b200`` preset as it is: its matmul fractions carried from the A100's by the MAMF
ratio, never judged on a measured B200 before) and on DGX-GB200 (the preset with one NVL72
rack's datasheet figures, ``GB200_RACK``), by the same helpers. The B200 preset has no
measured fused-attention rates (``ATTENTION_FORWARD`` lists none: FlashAttention-4 publishes
no causal head-dimension-128 figure), so these rows run their attention at the matmul rate,
counted non-causal, where the H100 rows run cuDNN's measured rates. MXFP8 and NVFP4 rows, the
GB300's and B300's (no preset) and the fine-tuning rows are listed, not judged.

Run: ``python benchmarks/training_heldout.py`` (a second or two; no compile), or
``--compiled [PREFIX ...]`` to plan the rows whose names start with a prefix by compiling
them with the H100 compiler, deviceless (minutes a row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import calibration  # noqa: E402

from shardscope import ModelConfig, ShardscopeError, hardware, plan  # noqa: E402
from shardscope._src.base.text import format_mesh_spec  # noqa: E402
from shardscope._src.model.presets import model_preset  # noqa: E402
from shardscope._src.plan.estimates import DEFAULT_BYTES_PER_PARAM  # noqa: E402
from shardscope._src.targets.hardware import h100_attention  # noqa: E402
from shardscope._src.train.candidates import estimate  # noqa: E402
from shardscope._src.train.types import Candidate, Screened  # noqa: E402

GIB = 2**30
WITHIN = (0.10, 0.25)

#: Transformer Engine's attention on an H100 (NeMo's ``use_flash_attention``) and MaxText's
#: ``attention=cudnn_flash_te`` both run cuDNN's fused attention: its measured H100 rates.
CUDNN = h100_attention("cudnn")

DGXC = "NVIDIA/dgxc-benchmarking"
LAUNCHER = "NVIDIA/NeMo-Framework-Launcher"
TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md@31a17bf"

#: The axes that replicate the model's batch (the data-parallel ways a micro-batch count
#: divides the global batch by): not the context, model or stage axes.
DATA_AXES = ("replica", "data")

#: One GB200 rack's GPUs as the B200 preset with the rack's datasheet figures (NVIDIA GB200
#: NVL72: 2.5 PFLOP/s dense bf16 and 5 dense fp8 a GPU (its 360 and 720 sparse PFLOP/s over
#: 72 GPUs, halved), 186 GB of HBM3e (13.4 TB over 72), every GPU on one NVLink domain; a
#: Grace CPU's 480 GB of LPDDR5X and 900 GB/s NVLink-C2C, both ways, shared by its two GPUs),
#: the runs' attention Transformer Engine-class (its FA4 kernels unpriced). A run over several
#: racks has 64 GPUs to each NVLink domain (``node_size``) and the preset's network between
#: them. ``moe_heldout.py`` plans its GB200 runs with it too.
GB200_RACK = {
    "peak_flops": 2.5e15,
    "fp8_peak_flops": 5e15,
    "memory_bytes": 186e9,
    "node_size": 64,
    "host_memory_bytes": 240e9,
    "host_bandwidth": 225e9,
}


@dataclass(frozen=True)
class System:
    """A machine a published table names: the word its runs' names carry, the hardware
    preset and the overrides it is planned with, and the attention kernel's rates (an
    :func:`h100_attention` kernel; None: the preset's own, which for the B200 are none, its
    attention at the matmul rate counted non-causal: ``ATTENTION_FORWARD`` has no B200
    figure)."""

    table: str  # as the table's header writes it
    gpu: str
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    attention: str | None = None


DGX_H100 = System("DGX-H100", "H100", "h100", attention="cudnn")
DGX_B200 = System("DGX-B200", "B200", "b200")
DGX_GB200 = System("DGX-GB200", "GB200", "b200", GB200_RACK)


@dataclass(frozen=True)
class Run:
    """A published run: its model, hardware and configuration as the source states them."""

    name: str  # the first word is who published it (accuracy.py's source)
    source: str  # repository, path and commit (or address) where the number was read
    quote: str  # the published figures, as read
    config: ModelConfig  # its batch is the global batch
    strategy: str
    mesh: tuple[tuple[str, int], ...]
    micro_batch: int  # sequences per micro-batch per data-parallel rank
    remat: str
    measured_s: float
    virtual_stages: int = 1
    matmul_dtype: str = "bfloat16"
    #: how its fp8 step keeps its linear layers' inputs for the backward (None: bf16, or
    #: the planner's default, ``high-precision``)
    fp8_saved_inputs: str | None = None
    #: the layers' linear weights kept in fp8 but this many layers at each end (None: 16-bit
    #: weights; the planner's ``fp8_params``)
    fp8_params: int | None = None
    overrides: dict[str, Any] = field(default_factory=lambda: dict(CUDNN))
    peak_gib: float | None = None
    instead: tuple[str, ...] = ()
    #: the embedding, the output layer and the logits split over ``model`` (Megatron's
    #: vocabulary-parallel embedding and output layer)
    vocab_split: bool = False
    #: what its pipeline stages split: ``"embedding+loss"`` where Megatron counts the
    #: embedding and the loss as a layer each (``account_for_*_in_pipeline_split``)
    pipeline_split: str = "layers"
    #: how many of its first layers offload their activations to host memory
    #: (Megatron-Core's ``cpu_offloading_num_layers``)
    offload_layers: int = 0
    #: why the planner cannot write this run (it is then not planned)
    cannot: str = ""
    #: model-state bytes a parameter (the planner's ``bytes_per_param``): 16 for fp32 master
    #: weights and Adam moments beside the 16-bit weights and gradients
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM
    #: the hardware preset it ran on (``overrides`` over it)
    hardware: str = "h100"

    @property
    def devices(self) -> int:
        n = 1
        for _, size in self.mesh:
            n *= size
        return n

    @property
    def data_ways(self) -> int:
        n = 1
        for axis, size in self.mesh:
            if axis in DATA_AXES:
                n *= size
        return n

    @property
    def microbatches(self) -> int:
        """The global batch over the micro-batch times the data-parallel ways."""
        return self.config.batch // (self.micro_batch * self.data_ways)


def _preset(name: str, batch: int, seq: int, **kw: Any) -> ModelConfig:
    return replace(model_preset(name).config(batch=batch, seq=seq), **kw)


def _nemotron_340b(batch: int) -> ModelConfig:
    """Nemotron-4 340B as NeMo's nemotron_340b.yaml writes it: 96 layers, hidden 18432, 96
    heads, 8 query groups, FFN 4 x hidden with squared ReLU (planned as the decoder's GELU
    MLP: the same weights and matmul FLOPs), untied embeddings, vocabulary 256000."""
    return ModelConfig(
        d_model=18432,
        heads=96,
        kv_heads=8,
        ff=4 * 18432,
        layers=96,
        batch=batch,
        seq=4096,
        vocab=256000,
        dtype="bfloat16",
        mlp="gelu",
    )


def _nemo(
    name: str,
    config: ModelConfig,
    gpus: int,
    *,
    tp: int,
    pp: int = 1,
    cp: int = 1,
    vp: int = 1,
    mbs: int = 1,
    measured_s: float,
    source: str,
    quote: str,
    fp8: bool = False,
    remat: str = "none",
    bytes_per_param: int = DEFAULT_BYTES_PER_PARAM,
    attention: str | None = "cudnn",
    tp_overlap: bool = True,
    pp_overlap: bool = False,
    fsdp: bool = False,
    publisher: str = "NeMo",
    system: System | None = None,
    fp8_params: int | None = None,
    instead: tuple[str, ...] = (),
) -> Run:
    """A NeMo Megatron run: tensor parallel with sequence parallelism (the recipes' and
    launcher configs' ``sequence_parallel: true`` where TP > 1), context parallel, pipeline
    stages with virtual stages, the distributed optimizer (``distributed_fused_adam`` /
    ``mcore_distributed_optim``: ZeRO-1) over the data and context ranks, and the
    recomputation (``activations_checkpoint_granularity``: ``null`` is ``remat="none"``) and
    model-state bytes a parameter its configuration writes (fp32 optimizer state unless it
    says otherwise), and Transformer Engine's attention backend (cuDNN's fused attention
    unless the recipe sets ``NVTE_FUSED_ATTN=0``, which leaves TE's FlashAttention-2
    backend), and the tensor-parallel collectives overlapped with their matmuls where the
    configuration sets ``ub_tp_comm_overlap: true`` (``tp_overlap``: Transformer Engine's
    userbuffers; the hardware setting of the same name), and the stages' transfers beside
    the steady 1F1B phase's compute where it sets ``overlap_p2p_comm: true`` (``pp_overlap``,
    the hardware setting of the same name). ``fsdp``: Megatron-FSDP over the data ranks
    instead of the distributed optimizer (``use_megatron_fsdp`` with
    ``data_parallel_sharding_strategy: optim_grads_params``: weights, gradients and optimizer
    state sharded, the planner's ``fsdp``); ``publisher``: the name's first word; ``system``:
    the machine it ran on (:data:`DGX_H100` unless given), whose ``attention`` replaces the
    H100 kernel's rates where it names none (``attention=None``: the preset's own);
    ``fp8_params``: the planner's, where the configuration sets ``fp8_params`` (NeMo builds
    the model under Transformer Engine's ``fp8_model_init``); ``instead``: what the plan
    prices otherwise than the run did."""
    system = system or DGX_H100
    data = gpus // (tp * pp * cp)
    mesh = tuple(
        (a, n) for a, n in (("stage", pp), ("data", data), ("context", cp), ("model", tp)) if n > 1
    )
    strategy = "zero1" + ("_sp" if tp > 1 else "") + ("_cp_ring" if cp > 1 else "")
    dims = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "") + (f" x CP {cp}" if cp > 1 else "")
    dims += f" x VP {vp}" if vp > 1 else ""
    if fsdp:
        strategy, dims = "fsdp" + strategy[len("zero1") :], f"FSDP {data}"
    return Run(
        f"{publisher} {name}, {dims}, {gpus} {system.gpu}" + (" FP8" if fp8 else ""),
        source,
        quote,
        config,
        strategy,
        mesh or (("data", 1),),
        mbs,
        remat,
        measured_s,
        virtual_stages=vp,
        matmul_dtype="fp8" if fp8 else "bfloat16",
        # Transformer Engine's fp8 linears keep their fp8 inputs for the backward
        fp8_saved_inputs="fp8" if fp8 else None,
        overrides={
            **(h100_attention(attention) if attention else {}),
            **system.overrides,
            **({"tp_overlap": tp_overlap} if tp > 1 else {}),
            **({"pp_overlap": pp_overlap} if pp > 1 else {}),
        },
        fp8_params=fp8_params,
        instead=instead,
        vocab_split=tp > 1,
        bytes_per_param=bytes_per_param,
        hardware=system.preset,
    )


def _torchtitan_8b(tokens_per_gpu_s: float, peak_gib: float, quote: str, fp8: bool = False) -> Run:
    """torchtitan's Llama 3.1 8B on 128 H100s (FSDP, 256 sequences of 8192 a step) at its
    published tokens a second a GPU, and the peak memory it measured."""
    return Run(
        "torchtitan Llama 3.1 8B, FSDP 128 H100" + (" FP8" if fp8 else ""),
        TITAN,
        quote,
        _preset("llama3-8b", 256, 8192),
        "fsdp",
        (("data", 128),),
        2,
        calibration.TITAN_OP_SAC,
        256 * 8192 / (tokens_per_gpu_s * 128),
        matmul_dtype="fp8" if fp8 else "bfloat16",
        # torchao's Float8Linear keeps its 16-bit input and casts it again in the backward
        fp8_saved_inputs="high-precision" if fp8 else None,
        overrides=calibration.TITAN_H100,
        peak_gib=peak_gib,
        instead=(calibration.TITAN_OP_SAC_INSTEAD,)
        + (
            # torchao's Float8Linear runs its matmul as aten.mm on its float8 tensor
            # subclass, which the policy's dispatch mode sees and counts as it counts the
            # bf16 ones: read so, not measured
            ("the Float8 linears' matmuls counted by the policy as the bf16 ones are",)
            if fp8
            else ()
        ),
    )


def _maxtext_llama2_70b(gpus: int, measured_s: float, quote: str, fp8: bool = False) -> Run:
    """MaxText's Llama 2 70B as the recipe's configure.sh runs it: FSDP over 8 GPUs a node x
    the nodes (``dcn_fsdp`` 16 and the rest ``dcn_data`` from 64 nodes on), 2 sequences a GPU,
    ``remat_policy=save_qkv_proj``, cuDNN's fused attention, sequence 4096 (the README's
    model FLOPs and its example log: 524288 tokens a step on 64 GPUs)."""
    fsdp = min(gpus, 128)
    mesh = (("replica", gpus // fsdp), ("data", fsdp)) if gpus > fsdp else (("data", fsdp),)
    return Run(
        f"MaxText Llama 2 70B, FSDP {fsdp}"
        + (f" x DP {gpus // fsdp}" if gpus > fsdp else "")
        + f", {gpus} H100"
        + (" FP8" if fp8 else ""),
        f"{DGXC} maxtext/README_70b.md@143b90d; maxtext/configure.sh@0b71cfd",
        quote,
        _preset("llama2-70b", 2 * gpus, 4096),
        "hsdp" if gpus > fsdp else "fsdp",
        mesh,
        2,
        "maxtext:save_qkv_proj",
        measured_s,
        matmul_dtype="fp8" if fp8 else "bfloat16",
    )


_CONF = f"{LAUNCHER} launcher_scripts/conf/training"
_L8 = f"{DGXC} llama3.1/README_8b.md@143b90d; {_CONF}/llama/llama3_1_8b.yaml@2ac7cee"
_L70 = f"{DGXC} llama3.1/README_70b.md@143b90d; {_CONF}/llama/llama3_1_70b.yaml@1ab2c78"
_L405 = (
    f"{DGXC} llama3.1/README_405b.md@143b90d; {_CONF}/llama/llama3_1_405b.yaml@072ecc4 "
    "(num_query_groups: 16; the GPT2BPETokenizer as a proxy: vocabulary 50257, padded to 51200)"
)
_N15 = (
    f"{DGXC} nemotron/README_15b.md@0b71cfd; nemotron/nemotron4-15b-synth.yaml@8f5cbb3 (what "
    "configure.sh runs: TP 4, sequence parallel, micro-batch 4, no recomputation, "
    "mcore_distributed_optim, ub_tp_comm_overlap: True); as "
    f"{_CONF}/nemotron/nemotron_15b.yaml@089b90e"
)
_N340 = (
    f"{DGXC} nemotron/README_340b.md@143b90d; nemotron/configure.sh@35a9aec (runs "
    "--config-name=nemotron4-340b-synth); nemotron/nemotron4-340b-synth.yaml@8f5cbb3"
)
_GPT3 = f"{DGXC} nemo_megatron/README_175b.md@0b71cfd; nemo_megatron/gpt3_175b_hydra.yaml@35a9aec"


def _l405(layers: int, batch: int) -> ModelConfig:
    # The benchmark's 405B: 16 query groups (its launcher config and model-FLOPs note), the
    # GPT-2 BPE tokenizer (51200 after Megatron's padding), and the proxies' fewer layers.
    return _preset("llama3-405b", batch, 8192, layers=layers, kv_heads=16, vocab=51200)


_L8Q = (
    "Llama 3.1 8b 24.09 BF16 (TP=1, PP=1, CP=2, MBS=1, GA=32): step 12.91 (8 GPUs, GBS 128) "
    "... 13.10 (128, GBS 2048)"
)
_L70Q = (
    "Llama 3.1 70b 24.09 BF16 (TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64): step 14.72 (64 GPUs, "
    "GBS 128) ... 14.98 (2048, GBS 4096)"
)
_L405Q = (
    "Llama 3.1 405b 24.09 BF16 (TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63): layers 7/21/126/126, "
    "GBS 126/126/252/1008, PP 1/3/9/9: step 8.85 (32 GPUs), 8.75 (96), 17.20 (576), 17.62 (2304)"
)
_N15Q = (
    "Nemotron4 15b BF16 (TP=4, PP=1, MBS=4, GA=4): step 2.812 (16 GPUs, GBS 64) ... 2.887 "
    "(2048, GBS 8192)"
)
_N340Q = (
    "Nemotron4 340b 24.11 BF16 (TP=8, PP=8, MBS=1, GA=16, VP=12): step 4.61 (128 GPUs, GBS 32) "
    "... 4.84 (2048, GBS 512)"
)
_GPT3Q = (
    "NeMo Megatron BF16 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048): step 8.309 (128 GPUs, GBS 256) ... "
    "8.49 (2048, GBS 4096)"
)
_MTQ = (
    "Maxtext LLama2 70b BF16 (FSDP+DP MBS=2): step 6.999 (64 GPUs, FSDP 64), 7.091 (512, FSDP "
    "128), 7.066 (2048, FSDP 128)"
)
_L8F = "Llama 3.1 8b 24.09 FP8 (TP=1, PP=1, CP=2, MBS=1, GA=32): step 9.67 (8 GPUs, GBS 128)"
_L70F = (
    "Llama 3.1 70b 24.09 FP8 (TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64): step 11.01 (64 GPUs, GBS 128)"
)
_N15F = "Nemotron4 15b FP8 (TP=4, PP=1, MBS=4, GA=4): step 2.039 (16 GPUs, GBS 64)"
_GPT3F = "NeMo Megatron FP8 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048): step 5.626 (128 GPUs, GBS 256)"
_MTF = "Maxtext LLama2 70b FP8 (FSDP+DP MBS=2): step 4.324 (64 GPUs, FSDP 64)"

# Each recipe's configuration, its GPUs and global batch given per run.
_llama8 = partial(_nemo, "Llama 3.1 8B", tp=1, cp=2, source=_L8)
#: The Llama 3.1 and GPT-3 configurations set ``overlap_p2p_comm: true`` (with
#: ``batch_p2p_comm: false``); the 340B's sets it false.
_llama70 = partial(_nemo, "Llama 3.1 70B", tp=4, pp=4, cp=2, vp=5, source=_L70, pp_overlap=True)
_llama405 = partial(_nemo, tp=8, cp=2, source=_L405, quote=_L405Q, pp_overlap=True)
_nemotron15 = partial(_nemo, "Nemotron-4 15B", tp=4, mbs=4, source=_N15)
#: The 340B benchmark runs the recipe's own nemotron4-340b-synth.yaml (configure.sh), not the
#: launcher's nemotron_340b.yaml: ``activations_checkpoint_granularity: selective`` and
#: ``optim: {name: distributed_fused_adam, dtype: bf16, grad_sync_dtype: bf16}``. NeMo's
#: ``MegatronBaseModel.setup_optimization`` passes ``optim.dtype`` to Apex's
#: DistributedFusedAdam ("dtype: datatype for optimizer state") and, as it equals the bf16
#: model's, sets ``store_params=False``: bf16 Adam moments and no master copy, 2 + 2 bytes a
#: parameter beside the bf16 weight and gradient (grad_sync_dtype bf16): 8, not 16. (NeMo
#: releases before it read ``optim.dtype`` forced fp32 moments with 16-bit remainders of the
#: master weights, 14 bytes: 76.6 GiB on the first stage at 128 GPUs, with no room for the
#: run's buffers on an 80 GB H100.) Its configure.sh
#: sets ``NVTE_FUSED_ATTN=0`` for the 340B (1 for the 15B): FlashAttention-2's rates.
NEMOTRON_340B_BYTES_PER_PARAM = 2 + 2 + 2 + 2
_nemotron340 = partial(
    _nemo,
    "Nemotron-4 340B",
    tp=8,
    pp=8,
    vp=12,
    source=_N340,
    quote=_N340Q,
    remat="selective",
    bytes_per_param=NEMOTRON_340B_BYTES_PER_PARAM,
    attention="flash-attention-2",
    tp_overlap=False,  # nemotron4-340b-synth.yaml: ub_tp_comm_overlap: False
    pp_overlap=False,  # and overlap_p2p_comm: False
)
_gpt3 = partial(_nemo, "GPT-3 175B", tp=4, pp=8, vp=12, source=_GPT3, pp_overlap=True)


def _gpt3_175b(batch: int) -> ModelConfig:
    # the GPT-2 BPE tokenizer's 50257 tokens padded by Megatron to a multiple of 128 x TP
    return _preset("gpt3-175b", batch, 2048, vocab=50688)


#: The bf16 runs: NeMo Megatron and MaxText from the DGX Cloud Benchmarking recipes (the
#: smallest and the largest scale of each weak-scaling table, and the 405B's proxies),
#: torchtitan's 8B on 128 GPUs.
BF16_RUNS = [
    _llama8(_preset("llama3-8b", 128, 8192), 8, measured_s=12.91, quote=_L8Q),
    _llama8(_preset("llama3-8b", 2048, 8192), 128, measured_s=13.10, quote=_L8Q),
    _llama70(_preset("llama3-70b", 128, 8192), 64, measured_s=14.72, quote=_L70Q),
    _llama70(_preset("llama3-70b", 4096, 8192), 2048, measured_s=14.98, quote=_L70Q),
    _llama405("Llama 3.1 405B proxy (7 layers)", _l405(7, 126), 32, measured_s=8.85),
    _llama405("Llama 3.1 405B proxy (21 layers)", _l405(21, 126), 96, pp=3, vp=7, measured_s=8.75),
    _llama405("Llama 3.1 405B", _l405(126, 252), 576, pp=9, vp=7, measured_s=17.20),
    _llama405("Llama 3.1 405B", _l405(126, 1008), 2304, pp=9, vp=7, measured_s=17.62),
    _nemotron15(_preset("nemotron4-15b", 64, 4096), 16, measured_s=2.812, quote=_N15Q),
    _nemotron15(_preset("nemotron4-15b", 8192, 4096), 2048, measured_s=2.887, quote=_N15Q),
    _nemotron340(_nemotron_340b(32), 128, measured_s=4.61),
    _nemotron340(_nemotron_340b(512), 2048, measured_s=4.84),
    _gpt3(_gpt3_175b(256), 128, measured_s=8.309, quote=_GPT3Q),
    _gpt3(_gpt3_175b(4096), 2048, measured_s=8.49, quote=_GPT3Q),
    _maxtext_llama2_70b(64, 6.999, _MTQ),
    _maxtext_llama2_70b(512, 7.091, _MTQ),
    _maxtext_llama2_70b(2048, 7.066, _MTQ),
    _torchtitan_8b(
        6514,
        62.0,
        "Table 3, FSDP 128, local batch 2, global 256, selective AC: FSDP + torch.compile "
        "6,514 TPS/GPU, 62.0 GiB (step = 256 x 8192 / (6514 x 128) = 2.515 s)",
    ),
]

#: NeMo 1's fp8 parameters, which every NeMo fp8 row's configuration sets: dgxc-benchmarking
#: llama3.1/configure.sh@143b90d and nemotron/configure.sh@35a9aec pass ``+model.fp8_params=
#: $FP8_ENABLED``, nemo_megatron/gpt3_175b_hydra.yaml@35a9aec (and @8f5cbb3) writes
#: ``fp8_params: true``. NVIDIA/NeMo nemo/collections/nlp/models/language_modeling/
#: megatron_gpt_model.py builds the whole model under Transformer Engine's ``fp8_model_init``
#: where ``fp8`` and ``fp8_params`` are set (each Transformer Engine module's weights
#: Float8Tensors), with no layer at either end kept out of it: ``fp8_params=0``. How the
#: weights reach fp8 depends on the optimizer:
#: - ``mcore_distributed_optim`` (launcher llama/llama3_1_8b.yaml@2ac7cee, nemotron/
#:   nemotron4-15b-synth.yaml@8f5cbb3): the same file passes ``fp8_param_gather=self.cfg.get(
#:   'fp8_params', False)`` to Megatron-Core's DistributedDataParallelConfig, Megatron-Core's
#:   fp8 parameters, as the planner's ``fp8_params`` prices them.
#: - ``distributed_fused_adam`` (launcher llama/llama3_1_70b.yaml@1ab2c78, gpt3_175b_hydra.yaml;
#:   both ``contiguous_param_buffer: true``): megatron_base_model.py's ``setup_optimization``
#:   sets ``store_params = True`` when ``fp8_params`` is set (fp32 master weights), and NeMo's
#:   nemo/core/optim/distributed_adam.py (MegatronDistributedFusedAdam over Apex's
#:   DistributedFusedAdam) initialises the Float8Tensor parameters' buckets with
#:   ``param_sync_dtype=torch.uint8`` (gathered at 1 byte), makes each fp8 weight's data a view
#:   of the contiguous uint8 parameter buffer (1 byte on the device), and in
#:   ``_check_params_shard_dtypes`` casts the updated fp32 shard with ``cast_to_fp8`` into that
#:   buffer ("FP32 values are cast into FP8 using per-param scaling factors") before the
#:   gather, refreshing the transposes after it: what ``fp8_params`` prices but the cast, which
#:   reads the fp32 shard once with the delayed-scaling recipe's scale (5 bytes an element)
#:   where the planner prices Megatron-Core's current-scaling cast (11): 6 bytes on each of a
#:   device's 1.1e9 (70B: 68.5e9 linear weights / TP 4 x PP 4, over DP 2 x CP 2) or 1.4e9
#:   (175B: over TP 4 x PP 8 and DP 4) master elements, 6.4 or 8.2 GB, about 2-3 ms of HBM
#:   time in steps of 11 and 5.6 s (:data:`NEMO_APEX_FP8_CAST`).
NEMO_FP8_PARAMS_BF16_LAYERS = 0
_NEMO_FP8_PARAMS = (
    f"fp8_params: {DGXC} llama3.1/configure.sh@143b90d, nemotron/configure.sh@35a9aec, "
    "nemo_megatron/gpt3_175b_hydra.yaml@35a9aec; NVIDIA/NeMo nemo/collections/nlp/models/"
    "language_modeling/megatron_gpt_model.py (fp8_model_init, fp8_param_gather)"
)
_NEMO_APEX_FP8 = (
    f"{_NEMO_FP8_PARAMS}; nemo/core/optim/distributed_adam.py (param_sync_dtype=torch.uint8, "
    "_check_params_shard_dtypes), megatron_base_model.py (store_params)"
)
NEMO_APEX_FP8_CAST = (
    "the optimizer's fp8 weight cast priced as Megatron-Core's (master shard to bf16, amax "
    "pass, cast: 11 bytes an element) where NeMo's distributed Adam casts the fp32 shard with "
    "the delayed-scaling recipe's scale in one pass (5 bytes)"
)

#: The same recipes' fp8 runs (Transformer Engine's fp8 linear layers; MaxText's
#: ``quantization=fp8``; torchtitan's Float8 linears), planned with ``matmul_dtype="fp8"``.
FP8_RUNS = [
    _llama8(
        _preset("llama3-8b", 128, 8192),
        8,
        measured_s=9.67,
        quote=_L8F,
        fp8=True,
        source=f"{_L8}; {_NEMO_FP8_PARAMS}",
        fp8_params=NEMO_FP8_PARAMS_BF16_LAYERS,
    ),
    _llama70(
        _preset("llama3-70b", 128, 8192),
        64,
        measured_s=11.01,
        quote=_L70F,
        fp8=True,
        source=f"{_L70}; {_NEMO_APEX_FP8}",
        fp8_params=NEMO_FP8_PARAMS_BF16_LAYERS,
        instead=(NEMO_APEX_FP8_CAST,),
    ),
    _nemotron15(
        _preset("nemotron4-15b", 64, 4096),
        16,
        measured_s=2.039,
        quote=_N15F,
        fp8=True,
        source=f"{_N15}; {_NEMO_FP8_PARAMS}",
        fp8_params=NEMO_FP8_PARAMS_BF16_LAYERS,
    ),
    _gpt3(
        _gpt3_175b(256),
        128,
        measured_s=5.626,
        quote=_GPT3F,
        fp8=True,
        source=f"{_GPT3}; {_NEMO_APEX_FP8}",
        fp8_params=NEMO_FP8_PARAMS_BF16_LAYERS,
        instead=(NEMO_APEX_FP8_CAST,),
    ),
    _maxtext_llama2_70b(64, 4.324, _MTF, fp8=True),
    _torchtitan_8b(
        8380,
        61.8,
        "Table 3: FSDP + torch.compile + Float8 8,380 TPS/GPU, 61.8 GiB "
        "(step = 256 x 8192 / (8380 x 128) = 1.955 s)",
        fp8=True,
    ),
]

_MB = "NVIDIA-NeMo/Megatron-Bridge"
#: The performance summary's DGX-H100 tables of the 26.02, 25.11 and 25.09 NeMo containers
#: (the archive at 0a25f91 repeats them); the 26.06, 26.04.01, 26.04 and 26.02.01 tables are
#: read from the NeMo automation account's fork, the only stored copy that has them.
_MB_SUMMARY = f"{_MB} docs/performance-summary.md@df0289c"
_MB_FORK = "svcnemo-autobot/Megatron-Bridge docs/performance-summary-archive.md@52dfa15"
_MB_L3 = (
    f"{_MB} scripts/performance/configs/llama3/workload_base_configs.py@0fa501a, "
    "llama3_llm_pretrain.py@0a0cb29 (H100 FP8_CS: TP 4, PP 8, VP 5; the 8B use_megatron_fsdp); "
    "configs/llama/llama3_workload_base_configs.py@00919dc (the GBS 256 V2); "
    "src/megatron/bridge/recipes/llama/llama3.py (no recompute_granularity, "
    "use_distributed_optimizer, tp_comm_overlap: True)"
)
_MB_L405 = (
    f"{_MB} scripts/performance/configs/llama31/workload_base_configs.py@0fa501a, "
    "llama31_llm_pretrain.py@0a0cb29 (H100 FP8_CS: TP 8, PP 8, CP 2, VP 8, the fp8 "
    "userbuffers' TP overlap; the GBS 1536 V2 the same layout); "
    "src/megatron/bridge/recipes/llama/llama3.py (account_for_embedding_in_pipeline_split and "
    "account_for_loss_in_pipeline_split, no recompute_granularity, use_distributed_optimizer)"
)


#: Megatron-Bridge's FP8-CS recipe (``bf16_with_fp8_current_scaling_mixed``,
#: src/megatron/bridge/training/mixed_precision.py@0509780) sets ``fp8_param_gather = True``
#: (the layers' linear weights kept as Transformer Engine's fp8 tensors) with
#: ``first_last_layers_bf16``: ``num_layers_at_start_in_bf16 = num_layers_at_end_in_bf16 =
#: 1``, the planner's ``fp8_params=1``
BRIDGE_FP8_CS_BF16_LAYERS = 1


def _bridge_step(gbs: int, gpus: int, tokens_per_gpu_s: float) -> float:
    """The step of a run the summary gives as tokens a second a GPU: the global batch's
    tokens (sequence 8192) over the throughput of all the GPUs."""
    return gbs * 8192 / (tokens_per_gpu_s * gpus)


def _bridge(
    release: str,
    model: str,
    gpus: int,
    gbs: int,
    tokens_per_gpu_s: float,
    system: System = DGX_H100,
    mbs: int = 1,
    precision: str = "",
    **kw: Any,
) -> Run:
    """A Megatron-Bridge performance-summary row on ``system`` (DGX-H100 unless given) as
    its perf recipe runs it: FP8-CS (``bf16_with_fp8_current_scaling_mixed``: Transformer
    Engine's tensorwise current scaling, the planner's fp8, its linear layers' weights kept
    in fp8 but the first and the last layer's: ``fp8_params``), micro-batch ``mbs``, sequence
    8192, the distributed optimizer (fp32 master weights and moments), no recomputation,
    Transformer Engine's attention (cuDNN's; on Blackwell the preset's, ``System``), the
    tensor-parallel collectives overlapped by userbuffers where TP > 1 and
    ``overlap_p2p_comm`` where PP > 1 and VP > 1 (comm_overlap.py turns it on under
    interleaving); the step from the published tokens a second a GPU. ``precision``: the
    table's precision cell where it is not the release's usual one (a figure beside it in
    parentheses, FP8-MX's, is quoted and not judged)."""
    source = _MB_FORK if release in ("26.06", "26.04.01", "26.04", "26.02.01") else _MB_SUMMARY
    # the precision as each release's table writes it (25.09's has no precision column)
    precision = precision or {"25.11": "FP8-CS", "25.09": "no precision column"}.get(release, "FP8")
    step = _bridge_step(gbs, gpus, tokens_per_gpu_s)
    quote = (
        f"{release} NeMo Container, {system.table}, {model}: {gpus} GPUs, {precision}, GBS "
        f"{gbs}, MBS {mbs}, sequence 8192, {kw.pop('layout')}: {tokens_per_gpu_s:g} "
        f"tokens/s/GPU{kw.pop('beside', '')} (step = {gbs} x 8192 / ({tokens_per_gpu_s:g} x "
        f"{gpus}) = {step:.3f} s)"
    )
    preset = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b"}.get(model, "llama3-405b")
    name = {"LLAMA3_8B": "Llama 3 8B", "LLAMA3_70B": "Llama 3 70B"}.get(model, "Llama 3.1 405B")
    instead = kw.pop("instead", ())
    split = kw.pop("pipeline_split", "layers")
    offload_layers = kw.pop("offload_layers", 0)
    return replace(
        _nemo(
            f"{release} {name}",
            _preset(preset, gbs, 8192),
            gpus,
            measured_s=step,
            source=f"{source}; {kw.pop('recipe')}",
            quote=quote,
            fp8=True,
            mbs=mbs,
            publisher="Megatron-Bridge",
            attention=system.attention,
            system=system,
            **kw,
        ),
        instead=instead,
        pipeline_split=split,
        offload_layers=offload_layers,
        # the FP8-CS recipe's fp8_param_gather (Megatron-Core's fp8 parameters), the first
        # and the last layer in bf16 (first_last_layers_bf16, one at each end)
        fp8_params=BRIDGE_FP8_CS_BF16_LAYERS,
    )


_bridge70 = partial(
    _bridge, model="LLAMA3_70B", gpus=64, layout="TP 4, PP 8, VP 5", recipe=_MB_L3, tp=4, pp=8,
    vp=5, pp_overlap=True,
)  # fmt: skip
_bridge405 = partial(
    _bridge, model="LLAMA3.1_405B", gpus=1024, layout="TP 8, PP 8, CP 2, VP 8", recipe=_MB_L405,
    tp=8, pp=8, cp=2, vp=8, pp_overlap=True,
    # account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split: the
    # 126 layers, the embedding and the loss are 128 pieces, 16 a stage, 2 a chunk
    pipeline_split="embedding+loss",
)  # fmt: skip
_bridge8 = partial(
    _bridge, model="LLAMA3_8B", gpus=8, gbs=128, layout="FSDP 8 (Megatron-FSDP), TP 1",
    recipe=_MB_L3, tp=1, fsdp=True,
)  # fmt: skip

#: Megatron-Bridge's dense DGX-H100 pretraining rows, every release's table read (all FP8-CS;
#: the 25.09 table gives no precision column, and its rows are the FP8-CS recipes' layouts,
#: the BF16 ones being CP 2 (8B) and TP 4 x PP 4 x CP 2 (70B), at over 70% of the H100's
#: dense bf16 peak in model TFLOP/s). The same layouts recur from release to release.
BRIDGE_RUNS = [
    _bridge70(release="26.04.01", gbs=256, tokens_per_gpu_s=1664),
    _bridge70(release="26.04", gbs=256, tokens_per_gpu_s=1633),
    _bridge70(release="26.02.01", gbs=256, tokens_per_gpu_s=1639),
    _bridge70(release="26.02", gbs=256, tokens_per_gpu_s=1621),
    _bridge70(release="25.11", gbs=128, tokens_per_gpu_s=1602),
    _bridge70(release="25.09", gbs=128, tokens_per_gpu_s=1619),
    _bridge405(release="26.06", gbs=1536, tokens_per_gpu_s=326),
    _bridge405(release="26.04.01", gbs=1536, tokens_per_gpu_s=328),
    _bridge405(release="26.02", gbs=1536, tokens_per_gpu_s=311),
    _bridge405(release="25.11", gbs=512, tokens_per_gpu_s=292),
    _bridge405(release="25.09", gbs=512, tokens_per_gpu_s=302),
    _bridge8(release="25.11", tokens_per_gpu_s=14451),
    _bridge8(release="25.09", tokens_per_gpu_s=14079),
]

#: The dense DGX-H100 rows of the same tables that are not judged, and why.
BRIDGE_LEFT_OUT = (
    (
        "26.06 SFT Llama 3 70B, 32 H100 FP8, GBS 32, sequence 4096, TP 4 x PP 4 x VP 5: 1638 "
        "tokens/s/GPU",
        "fine-tuning, not pretraining: the section judges the pretraining tables",
    ),
    (
        "26.06 LoRA Llama 3 70B, 8 H100 FP8, GBS 32, sequence 4096, TP 2 x PP 4 x VP 20: 2643 "
        "tokens/s/GPU",
        "LoRA: the planner has no frozen base weights with trained adapters",
    ),
)

#: Every held-out run.
RUNS = BF16_RUNS + FP8_RUNS + BRIDGE_RUNS


# Megatron-Bridge's Blackwell rows, judged apart from the H100 ones above.

_MB_BW_L3 = (
    f"{_MB} scripts/performance/configs/llama/llama3_workload_base_configs.py@00919dc (B200 "
    "and GB200 FP8_CS: the 8B micro-batch 2 under cuda_graph_impl local, cuda_graph_scope "
    "full_iteration; the GB200 70B micro-batch 2, use_megatron_fsdp, "
    "cpu_offloading_num_layers 40), llama3_llm_pretrain.py@2a0d46e (fsdp_double_buffer); "
    "src/megatron/bridge/recipes/llama/llama3.py (no recompute_granularity, "
    "use_distributed_optimizer)"
)
_MB_BW_L405 = (
    f"{_MB} scripts/performance/configs/llama/llama31_workload_base_configs.py@0013c9a (B200 "
    "FP8_CS V1: TP 4, PP 8, CP 2, VP 8, GBS 64 on 128; GB200 FP8_CS V2: TP 4, PP 16, VP 4, "
    "GBS 1536 on 256, use_megatron_fsdp False; GB200 FP8_CS V1: TP 2, use_megatron_fsdp, "
    "cpu_offloading_num_layers 92), llama31_llm_pretrain.py@0013c9a (the fp8 userbuffers' TP "
    "overlap, userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192); "
    "src/megatron/bridge/recipes/llama/llama3.py (account_for_embedding_in_pipeline_split and "
    "account_for_loss_in_pipeline_split, no recompute_granularity, use_distributed_optimizer)"
)
#: what the 8B's recipe runs that the planner does not price
_CUDA_GRAPHS = (
    "no CUDA graphs (the recipe captures the whole iteration, cuda_graph_scope full_iteration: "
    "the kernels' launches unpriced either way)"
)


_bw8 = partial(
    _bridge, model="LLAMA3_8B", gpus=8, gbs=128, mbs=2, recipe=_MB_BW_L3, tp=1,
    instead=(_CUDA_GRAPHS,),
)  # fmt: skip
_bw70_fsdp = partial(
    _bridge, model="LLAMA3_70B", gpus=64, mbs=2, system=DGX_GB200,
    layout="FSDP 64 (Megatron-FSDP), TP 1", recipe=_MB_BW_L3, tp=1, fsdp=True,
    offload_layers=40,
)  # fmt: skip
_bw405_b200 = partial(
    _bridge, model="LLAMA3.1_405B", gpus=128, gbs=64, system=DGX_B200,
    layout="TP 4, PP 8, CP 2, VP 8", recipe=_MB_BW_L405, tp=4, pp=8, cp=2, vp=8,
    pp_overlap=True, pipeline_split="embedding+loss",
)  # fmt: skip
_bw405_gb200 = partial(
    _bridge, model="LLAMA3.1_405B", gpus=256, gbs=1536, system=DGX_GB200,
    layout="TP 4, PP 16, CP 1, VP 4", recipe=_MB_BW_L405, tp=4, pp=16, vp=4,
    pp_overlap=True, pipeline_split="embedding+loss",
)  # fmt: skip
_CS_MX = "FP8-CS (FP8-MX)"

#: Megatron-Bridge's dense DGX-B200 and DGX-GB200 pretraining rows at FP8-CS, every release's
#: table read (26.06 back to 25.09; the B200's dense rows end at 25.11). A figure in
#: parentheses beside one is FP8-MX's (quoted, not judged). 25.09's table has no precision
#: column: its figures are the FP8-CS recipes' layouts, its parentheses FP8-MX's.
BLACKWELL_RUNS = [
    _bw8(release="25.11", system=DGX_B200, tokens_per_gpu_s=30624, precision=_CS_MX,
         layout="TP 1, PP 1, CP 1", beside=" (29521)"),
    _bw8(release="25.09", system=DGX_B200, tokens_per_gpu_s=29994, layout="TP 1, PP 1, CP 1",
         beside=" (29388)"),
    _bw405_b200(release="25.11", tokens_per_gpu_s=661, precision=_CS_MX, beside=" (624)"),
    _bw405_b200(release="25.09", tokens_per_gpu_s=664, beside=" (622)"),
    _bw8(release="25.11", system=DGX_GB200, tokens_per_gpu_s=31508, precision=_CS_MX,
         layout="TP 1, PP 1, CP 1", beside=" (29789)"),
    _bw8(release="25.09", system=DGX_GB200, tokens_per_gpu_s=31357, layout="TP 1, PP 1, CP 1",
         beside=" (29925)"),
    _bw70_fsdp(release="26.04.01", gbs=256, tokens_per_gpu_s=4224),
    _bw70_fsdp(release="26.04", gbs=256, tokens_per_gpu_s=4143),
    _bw70_fsdp(release="26.02.01", gbs=256, tokens_per_gpu_s=4357),
    _bw70_fsdp(release="26.02", gbs=256, tokens_per_gpu_s=4040),
    _bw70_fsdp(release="25.11", gbs=256, tokens_per_gpu_s=4312),
    _bw70_fsdp(release="25.09", gbs=128, tokens_per_gpu_s=3986,
               beside=" (3546, FP8-MX at TP 2, PP 4, VP 5)"),
    _bw405_gb200(release="26.06", tokens_per_gpu_s=843),
    _bw405_gb200(release="26.04.01", tokens_per_gpu_s=864),
    _bw405_gb200(release="26.04", tokens_per_gpu_s=842),
    _bw405_gb200(release="26.02.01", tokens_per_gpu_s=818),
    _bw405_gb200(release="26.02", tokens_per_gpu_s=793),
    _bw405_gb200(release="25.11", tokens_per_gpu_s=813),
    _bridge(
        "25.09", "LLAMA3.1_405B", 128, 64, 729, system=DGX_GB200,
        layout="FSDP 64 (Megatron-FSDP), TP 2", beside=" (578, FP8-MX at TP 4, PP 8, CP 2, VP 8)",
        recipe=_MB_BW_L405, tp=2, fsdp=True, offload_layers=92,
        instead=(
            "one Megatron-FSDP group of 64 (the recipe at 0013c9a also sets "
            "num_distributed_optimizer_instances 2 under Megatron-FSDP on the GB200)",
        ),
    ),
]  # fmt: skip

_NOT_PRICED = "not priced: the planner's fp8 is tensorwise scaling (FP8-CS) alone"
_NO_PRESET = "no preset: the planner has no B300 (Blackwell Ultra) figures"

#: The dense Blackwell rows of the same tables that are not judged, and why.
BLACKWELL_LEFT_OUT = (
    (
        "DGX-B200 and DGX-GB200 FP8-MX figures (the parentheses beside the FP8-CS ones "
        "above) and the MXFP8 rows: 26.06 GB200 405B 783; 26.04.01 GB200 70B 3712, 405B 800; "
        "26.04 GB200 70B 3828, 405B 793; 26.02.01 GB200 70B 3837, 405B 775; 26.02 GB200 70B "
        "3613, 405B 786 tokens/s/GPU",
        f"MXFP8, block scaling of 32 elements: {_NOT_PRICED}",
    ),
    (
        "DGX-GB200 NVFP4 rows: 26.06 405B 1166; 26.04.01 70B 4864, 405B 1184; 26.04 70B 4898, "
        "405B 1136; 26.02.01 70B 4557, 405B 1083; 26.02 70B 4458, 405B 1076 tokens/s/GPU",
        f"NVFP4, 4-bit: {_NOT_PRICED}",
    ),
    (
        "DGX-GB300 dense rows: Llama 3 8B (25.11), Llama 3 70B and Llama 3.1 405B (25.11 to "
        "26.06) at FP8, MXFP8 and NVFP4",
        f"GB300: {_NO_PRESET}",
    ),
    (
        "26.06 SFT Llama 3 70B, 32 GB200 FP8 3864 and MXFP8 3593; LoRA Llama 3 70B, 8 GB200 FP8 "
        "6206 and MXFP8 5958 tokens/s/GPU (and the GB300's)",
        "fine-tuning and LoRA, not pretraining (as the H100's)",
    ),
)


def _candidate(run: Run) -> Candidate:
    return Candidate(
        run.strategy,
        run.mesh,
        run.microbatches,
        run.remat,
        vocab_split=run.vocab_split,
        virtual_stages=run.virtual_stages,
        pipeline_split=run.pipeline_split,
        offload_layers=run.offload_layers,
    )


def estimate_run(run: Run) -> Screened:
    """``run`` planned as it ran by the analytic estimate (raises the planner's error where
    it cannot write the configuration)."""
    if run.cannot:
        raise ShardscopeError(run.cannot)
    hw = hardware(run.hardware, **run.overrides)
    return estimate(
        _candidate(run),
        run.config,
        hw,
        matmul_dtype=run.matmul_dtype,
        fp8_saved_inputs=run.fp8_saved_inputs,
        fp8_params=run.fp8_params,
        bytes_per_param=run.bytes_per_param,
    )


def misfit_cause(s: Screened) -> str:
    """What the memory estimate of a run called a misfit is made of, against the device."""
    m = s.memory
    parts = ", ".join(
        f"{k} {v / GIB:.1f}"
        for k, v in (
            ("weights", m.params),
            ("gradients", m.grads),
            ("optimizer", m.optimizer),
            ("activations", m.activations),
            ("gathered weights", m.gathered_weights),
            ("gathered keys/values", m.gathered_kv),
        )
        if v >= 0.05 * GIB
    )
    return (
        f"the estimate holds {m.total / GIB:.1f} GiB a device ({parts} GiB), over the "
        f"{s.memory_limit_bytes / GIB:.1f} GiB it has"
    )


@dataclass
class Judged:
    run: Run
    screened: Screened | None
    error: float | None  # predicted / measured - 1
    why_not: str = ""


def judge(runs: list[Run]) -> list[Judged]:
    out = []
    for run in runs:
        try:
            s = estimate_run(run)
        except ShardscopeError as e:
            out.append(Judged(run, None, None, str(e)))
            continue
        out.append(Judged(run, s, s.time.step_s / run.measured_s - 1))
    return out


def _summary(title: str, judged: list[Judged]) -> None:
    errors = [j.error for j in judged if j.error is not None]
    size = sorted(abs(e) for e in errors)
    misfits = sum(1 for j in judged if j.screened is not None and not j.screened.fits)
    unwritten = sum(1 for j in judged if j.error is None)
    if not errors:
        print(f"{title}: no run planned ({unwritten} could not be written)")
        return
    within = ", ".join(f"{sum(e <= w for e in size)} within {w:.0%}" for w in WITHIN)
    print(
        f"{title}: {len(errors)} runs, median |error| {statistics.median(size):.1%}, signed "
        f"median {statistics.median(errors):+.1%}, worst {size[-1]:.1%}, {within}; "
        f"{misfits} called misfits on the hardware they ran on"
        + (f"; {unwritten} could not be written (left out)" if unwritten else "")
    )


def _table(judged: list[Judged]) -> None:
    for j in judged:
        run = j.run
        head = f"{run.name:58} {run.microbatches:>3}"
        if j.screened is None:
            print(f"{head} {'-':>9} {run.measured_s:>8.3f}s {'-':>7}  cannot be written:")
            print(f"{'':62}{j.why_not}")
            continue
        s = j.screened
        peak = f" (measured peak {run.peak_gib:.1f} GiB)" if run.peak_gib else ""
        print(
            f"{head} {s.time.step_s:>8.3f}s {run.measured_s:>8.3f}s {j.error:>+7.1%}  "
            f"{s.memory.total / GIB:>5.1f}/{s.memory_limit_bytes / GIB:.1f} GiB "
            f"{'fits' if s.fits else 'MISFIT'}{peak}"
        )
        for what in run.instead:
            print(f"{'':62}planned with {what}")
        if not s.fits:
            print(f"{'':62}misfit: {misfit_cause(s)}")


def _calibration_split() -> None:
    """``calibration.py``'s rows, estimated as it estimates them, summarised beside."""
    for title, rows in (
        ("calibration (CALIBRATION.md sets 1-2)", calibration.ROWS),
        ("calibration (set 3, mixtures of experts)", calibration.MOE_ROWS),
    ):
        errors, misfits = [], 0
        for row in rows:
            s, _ = calibration._estimate(row)
            errors.append(s.time.step_s / row.measured_s - 1)
            misfits += not s.fits
        size = sorted(abs(e) for e in errors)
        within = ", ".join(f"{sum(e <= w for e in size)} within {w:.0%}" for w in WITHIN)
        print(
            f"{title}: {len(errors)} runs, median |error| {statistics.median(size):.1%}, "
            f"signed median {statistics.median(errors):+.1%}, worst {size[-1]:.1%}, {within}; "
            f"{misfits} misfits"
        )


def _compiled(prefixes: list[str]) -> None:
    """The runs whose names start with one of ``prefixes`` planned by compiling them with
    the H100 compiler (deviceless), as a user pins them."""
    for run in RUNS:
        if not any(run.name.startswith(p) for p in prefixes):
            continue
        t0 = time.perf_counter()
        try:
            result = _compile_run(run)
        except ShardscopeError as e:  # e.g. interleaving on unequal stages (the 405B's)
            print(f"{run.name:58} cannot be compiled: {e}")
            continue
        p = result.plans[0]
        error = p.step_time_s / run.measured_s - 1
        print(
            f"{run.name:58} compiled {p.step_time_s:8.3f}s (estimate "
            f"{p.estimated_time.step_s:.3f}s) measured {run.measured_s:.3f}s {error:+7.1%}  "
            f"fit memory {p.fit_memory_bytes_per_device / GIB:.1f} GiB "
            f"{'fits' if p.fits else 'MISFIT'} by {p.compiled_by.name}  "
            f"{time.perf_counter() - t0:.0f} s"
        )


def _compile_run(run: Run) -> Any:
    """``run`` planned by the H100 compiler, deviceless, its configuration pinned."""
    if run.cannot:
        raise ShardscopeError(run.cannot)
    return plan(
        run.config,
        run.devices,
        hardware="h100",
        hardware_overrides=run.overrides,
        strategies=[run.strategy],
        mesh=format_mesh_spec(dict(run.mesh)),
        remat=run.remat,
        microbatches=run.microbatches,
        virtual_stages=run.virtual_stages,
        pipeline_split=run.pipeline_split,
        offload_layers=run.offload_layers,
        matmul_dtype=run.matmul_dtype,
        fp8_saved_inputs=run.fp8_saved_inputs,
        fp8_params=run.fp8_params,
        offload_optimizer=False,
        vocab_split=run.vocab_split,
        bytes_per_param=run.bytes_per_param,
        compiler="h100",
        target_plans=1,
        compile_top=1,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compiled",
        nargs="+",
        metavar="PREFIX",
        help="also plan the runs whose names start with PREFIX by the H100 compiler",
    )
    args = parser.parse_args()
    t0 = time.perf_counter()
    print(
        f"{'run':58} {'m':>3} {'predicted':>9} {'measured':>9} {'error':>7}  "
        f"{'memory / device':>15}"
    )
    bf16, fp8, bridge = judge(BF16_RUNS), judge(FP8_RUNS), judge(BRIDGE_RUNS)
    print("\nHeld out, bf16")
    _table(bf16)
    print("\nHeld out, fp8 (matmul_dtype='fp8')")
    _table(fp8)
    print("\nHeld out, Megatron-Bridge's performance summary (DGX-H100, FP8-CS)")
    _table(bridge)
    for row, why in BRIDGE_LEFT_OUT:
        print(f"{'':62}not judged: {row} ({why})")
    blackwell = judge(BLACKWELL_RUNS)
    print(
        "\nHeld out on Blackwell, apart: Megatron-Bridge's performance summary (DGX-B200 as "
        "the b200 preset, DGX-GB200 as it with GB200_RACK; FP8-CS; attention at the preset's "
        "matmul rate, no B200 kernel being measured)"
    )
    _table(blackwell)
    for row, why in BLACKWELL_LEFT_OUT:
        print(f"{'':62}not judged: {row} ({why})")
    print()
    _summary("held-out bf16", bf16)
    _summary("held-out fp8", fp8)
    _summary("held-out Megatron-Bridge", bridge)
    _summary("held-out, all", bf16 + fp8 + bridge)
    _summary("held-out Blackwell (B200 and GB200, not in 'all')", blackwell)
    for gpu in ("B200", "GB200"):
        rows = [j for j in blackwell if j.run.name.endswith(f" {gpu} FP8")]
        _summary(f"held-out Blackwell, {gpu}", rows)
    _calibration_split()
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.compiled:
        print()
        _compiled(args.compiled)


if __name__ == "__main__":
    main()
