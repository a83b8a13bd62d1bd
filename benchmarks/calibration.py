"""The planner's time and memory model against published, measured training runs.

Every row of sets 1 and 2 of the calibration table (Narayanan et al. 2021 Table 1; torchtitan,
MaxText on TPU v6e, llm-foundry): the model, hardware, mesh, batch and recomputation the source
published, estimated by the planner's analytic model at that configuration, beside the measured
step time (and the measured peak memory where the source gives one). Nothing here is fitted:
the hardware presets' constants are the planner's own, with the sources they name; only the
source's stated hardware differences (the torchtitan H100s' 96 GB at 2.4 TB/s and a 500 W
peak between the SXM's and the NVL's) and the attention kernel a recipe names (NeMo
AutoModel's Qwen3 recipe runs Transformer Engine's, cuDNN's, at its measured H100 rates;
where a source does not name its kernel, the attention is at the calibrated matmul rate)
are set.

Where the planner cannot express the published configuration, the row says what it used
instead (``instead``): torchtitan's per-op selective recomputation is written by the tensors it
keeps, but the decoder's query, key and value are one matmul, run again whole for the key;
where the source does not state the micro-batches (Narayanan's Table 1), the planner's
fastest that fits is used.

Run: `python benchmarks/calibration.py` (about a second; no compile).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from shardscope import ModelConfig, hardware
from shardscope._src.model.presets import model_preset
from shardscope._src.targets.hardware import h100_attention
from shardscope._src.train.candidates import estimate
from shardscope._src.train.types import Candidate

GIB = 2**30


@dataclass(frozen=True)
class Row:
    name: str
    config: ModelConfig
    hardware: str
    overrides: dict[str, float]
    strategy: str
    mesh: tuple[tuple[str, int], ...]
    microbatches: int | None  # None: not published (the planner's fastest that fits)
    remat: str
    measured_s: float
    peak_gib: float | None = None
    instead: str = ""
    flash_attention: bool = True  # every set-2 source runs a fused attention kernel
    offload_optimizer: bool = False
    vocab_split: bool = False  # Megatron-LM's vocabulary-parallel embedding and cross entropy


def _narayanan(heads: int, h: int, layers: int, t: int, gpus: int, batch: int, tflops: int) -> Row:
    s, v = 2048, 51200
    # The paper's FLOPs per iteration (forward, backward, recomputed forward) over its
    # measured TFLOP/s per GPU.
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    config = ModelConfig(
        d_model=h,
        heads=heads,
        ff=4 * h,
        layers=layers,
        batch=batch,
        seq=s,
        vocab=v,
        dtype="bfloat16",
        mlp="gelu",
        tie_embeddings=True,
    )
    d = gpus // t
    mesh = (("data", d), ("model", t)) if t > 1 else (("data", d),)
    return Row(
        f"Narayanan h{h} TP{t} on {gpus} A100",
        config,
        "a100",
        {},
        "dp_tp" if t > 1 else "dp",
        mesh,
        None,
        "full",
        flops / (gpus * tflops * 1e12),
        flash_attention=False,  # 2021: attention scores are materialized
        vocab_split=t > 1,
    )


def _llama(layers: int, d: int, heads: int, kv: int, ff: int, batch: int, seq: int, vocab: int):
    return ModelConfig(
        d_model=d,
        heads=heads,
        kv_heads=kv,
        ff=ff,
        layers=layers,
        batch=batch,
        seq=seq,
        vocab=vocab,
        dtype="bfloat16",
        mlp="swiglu",
    )


def _mpt(layers: int, d: int, heads: int, batch: int) -> ModelConfig:
    return ModelConfig(
        d_model=d,
        heads=heads,
        ff=4 * d,
        layers=layers,
        batch=batch,
        seq=2048,
        vocab=50368,
        dtype="bfloat16",
        mlp="gelu",
        tie_embeddings=True,
    )


# The torchtitan H100s as the source states them: 96 GB at 2.4 TB/s, power-limited to 500 W
# with an effective peak "between SXM and NVL" (989 and 835 TFLOP/s dense bf16, NVIDIA's
# datasheets): the middle of that interval.
TITAN_H100 = {"memory_bytes": 96e9, "hbm_bandwidth": 2.4e12, "peak_flops": (989e12 + 835e12) / 2}

#: torchtitan's per-op selective recomputation (pytorch/torchtitan
#: torchtitan/distributed/activation_checkpoint.py@cfb9326, _apply_op_sac): each layer's policy
#: counts its aten.mm calls and saves the outputs of the ops of its save list
#: (torchtitan/models/llama3/infra/parallelize.py, _op_sac_save_list: mm, the SDPA kernels,
#: reduce_scatter, max) but every second mm (the count incremented before its parity is tested:
#: the 1st, 3rd, 5th and 7th kept). A layer's mms run wq, wk, wv, wo, w1 (gate), w3 (up), w2
#: (down): the query, the value, the gate, the down-projection and the attention kernel's
#: output kept with the layer's input; the key, the out-projection, the up, the norms and the
#: element-wise ops recomputed. The benchmarks' "selective activation checkpointing" runs of
#: the 8B (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3) are planned with it.
#: The policy marks what it does not save PREFER_RECOMPUTE, a hint torch.compile's partitioner
#: (these runs compile each layer) may overrule by saving: the estimate's memory is the
#: policy's, the least the run can have kept.
TITAN_OP_SAC = (
    "custom:query_proj=device,value_proj=device,context=device,mlpwi_0=device,mlpwo=device"
)
TITAN_OP_SAC_INSTEAD = (
    "the key recomputed by running the fused query, key and value projection again "
    "(torchtitan runs wk alone again); memory as the policy keeps it (torch.compile may keep "
    "more)"
)

ROWS = [
    _narayanan(24, 2304, 24, 1, 32, 512, 137),
    _narayanan(32, 3072, 30, 2, 64, 512, 138),
    _narayanan(32, 4096, 36, 4, 128, 512, 142),
    _narayanan(48, 6144, 40, 8, 256, 1024, 135),
    Row(
        "torchtitan Llama 3.1 8B, FSDP 8 H100",
        _llama(32, 4096, 32, 8, 14336, 16, 8192, 128256),
        "h100",
        TITAN_H100,
        "fsdp",
        (("data", 8),),
        1,
        TITAN_OP_SAC,
        2.457,
        peak_gib=77.0,
        instead=TITAN_OP_SAC_INSTEAD,
    ),
    Row(
        "torchtitan Llama 3.1 70B, FSDP 32 x TP 8 H100",
        _llama(80, 8192, 64, 8, 28672, 512, 8192, 128256),
        "h100",
        TITAN_H100,
        "fsdp_sp",
        (("data", 32), ("model", 8)),
        1,
        "full",
        27.43,
    ),
    Row(
        "torchtitan Llama 2 13B, FSDP 64 A100",
        _llama(40, 5120, 40, 40, 13824, 128, 4096, 32000),
        "a100",
        {},
        "fsdp",
        (("data", 64),),
        1,
        "none",
        3.789,
    ),
    Row(
        "MaxText Llama 3.1 8B, FSDP 64 v6e",
        _llama(32, 4096, 32, 8, 14336, 320, 8192, 128256),
        "tpu-v6e",
        {},
        "fsdp",
        (("data", 64),),
        1,
        # the recipe's remat_policy custom: the layer's input, the query, key and value and
        # the out-projection offloaded to host memory, the rest recomputed
        "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,"
        "value_proj=offload,out_proj=offload",
        5.652,
    ),
    Row(
        "MaxText Llama 3.1 70B, FSDP 64 v6e",
        _llama(80, 8192, 64, 8, 28672, 128, 8192, 128256),
        "tpu-v6e",
        {},
        "fsdp",
        (("data", 64),),
        1,
        # the recipe's remat_policy custom: the layer's input and the query, key and value
        # offloaded to host memory, the rest recomputed (the ``offload`` preset, by name)
        "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload",
        18.688,
        # MaxText's llama3-70b-8192 Trillium configuration at 2 sequences per chip:
        # optimizer_memory_host_offload=True.
        offload_optimizer=True,
    ),
    Row(
        "llm-foundry MPT 7B, FSDP 8 H100",
        _mpt(32, 4096, 32, 48),
        "h100",
        {},
        "fsdp",
        (("data", 8),),
        1,
        "none",
        1.155,
    ),
    Row(
        "llm-foundry MPT 70B, FSDP 64 A100",
        _mpt(80, 8192, 64, 2048),
        "a100",
        {},
        "fsdp",
        (("data", 64),),
        4,
        "full",
        159.6,
    ),
]


def _preset(name: str, **kw) -> ModelConfig:
    return replace(model_preset(name).config(batch=kw.pop("batch"), seq=kw.pop("seq")), **kw)


# Set 3: mixtures of experts. Published MoE benchmarks force balanced routing; the planner's
# uniform routing is that.
MOE_ROWS = [
    Row(
        "MaxText Mixtral 8x7B, FSDP 256 v6e",
        # capacity-padded at 1.25 (the recipe's), 8 sequences per chip
        _preset("mixtral-8x7b", batch=2048, seq=4096, capacity_factor=1.25),
        "tpu-v6e",
        {},
        "fsdp",
        (("data", 256),),
        1,
        "full",
        8.409,
    ),
    Row(
        "NeMo Qwen3-30B-A3B, EP 8 x FSDP 8 H100",
        # dropless; EP 8 within FSDP 8 on one DGX: the dense weights sharded over all 8,
        # the experts split over them; micro-batch 4, 16 accumulation steps; DeepEP's
        # dispatch (NeMo AutoModel's docs list the run as "TE + DeepEP"): each token once to
        # each device of its experts. Its recipe (qwen3_moe_30b_te_deepep.yaml) runs
        # Transformer Engine's attention (backend attn: te), cuDNN's fused kernel: the
        # attention at that kernel's measured H100 rates (hardware.h100_attention)
        replace(_preset("qwen3-30b-a3b", batch=512, seq=4096), dispatch_once=True),
        "h100",
        h100_attention("cudnn"),
        "fsdp_ep",
        (("data", 1), ("expert", 8)),
        16,
        "full",
        21.773,
    ),
]


# Published runs outside CALIBRATION.md that nothing here was calibrated on: the planner is
# judged on them. NeMo AutoModel's performance summary (docs.nvidia.com/nemo/automodel,
# "Performance Summary", DGX-H100, bf16) with the configurations of its benchmark recipes
# (NVIDIA-NeMo/Automodel examples/benchmark/configs/gptoss_{20,120}b_te_deepep.yaml): expert
# parallelism over every GPU (ep_size 8 and 64) inside FSDP over them, no activation
# checkpointing, DeepEP's dispatch, balanced routing forced (fake_balanced_gate), sequence
# 4096; 20B: 256 sequences, 2 a micro-batch on each of 8 GPUs (16 accumulation steps),
# 10.04 s; 120B: 512, 2 a micro-batch on each of 64 (4 steps), 4.30 s. GPT-OSS alternates
# 128-token sliding-window attention with full attention; the presets attend fully. The
# recipes run PyTorch's FlexAttention (backend attn: flex), whose rates on these masks no
# source measures: the attention at the matmul rate, as calibrated.
JUDGED_ROWS = [
    Row(
        "NeMo GPT-OSS 20B, EP 8 x FSDP 8 H100",
        replace(_preset("gpt-oss-20b", batch=256, seq=4096), dispatch_once=True),
        "h100",
        {},
        "fsdp_ep",
        (("data", 1), ("expert", 8)),
        16,
        "none",
        10.04,
    ),
    Row(
        "NeMo GPT-OSS 120B, EP 64 x FSDP 64 H100",
        replace(_preset("gpt-oss-120b", batch=512, seq=4096), dispatch_once=True),
        "h100",
        {},
        "fsdp_ep",
        (("data", 1), ("expert", 64)),
        4,
        "none",
        4.30,
    ),
]


def _estimate(row: Row):
    hw = hardware(row.hardware, **row.overrides)
    if row.microbatches is not None:
        candidate = Candidate(
            row.strategy,
            row.mesh,
            row.microbatches,
            row.remat,
            row.offload_optimizer,
            row.vocab_split,
        )
        s = estimate(candidate, row.config, hw, flash_attention=row.flash_attention)
        return s, row.microbatches
    data = dict(row.mesh)["data"]
    per_shard = row.config.batch // data
    options = [
        (
            estimate(
                Candidate(row.strategy, row.mesh, m, row.remat, vocab_split=row.vocab_split),
                row.config,
                hw,
                flash_attention=row.flash_attention,
            ),
            m,
        )
        for m in range(1, per_shard + 1)
        if per_shard % m == 0
    ]
    fitting = [o for o in options if o[0].fits] or options
    return min(fitting, key=lambda o: o[0].time.step_s)


def main() -> None:
    header = (
        f"{'run':46} {'m':>3} {'predicted':>10} {'measured':>10} {'error':>7}  "
        f"{'memory':>9} {'limit':>9} {'fits':>4} {'peak':>9}"
    )
    print(header)
    for title, rows in (
        ("Sets 1 and 2: dense", ROWS),
        ("Set 3: mixtures of experts", MOE_ROWS),
        ("Judged, not calibrated on: NeMo AutoModel's mixtures", JUDGED_ROWS),
    ):
        print(f"\n{title}")
        _table(rows)


def _table(rows: list[Row]) -> None:
    errors = []
    misfits = 0
    for row in rows:
        s, m = _estimate(row)
        error = s.time.step_s / row.measured_s - 1
        errors.append(abs(error))
        misfits += not s.fits
        peak = f"{row.peak_gib:.1f} GiB" if row.peak_gib else "-"
        print(
            f"{row.name:46} {m:>3} {s.time.step_s:>9.3f}s {row.measured_s:>9.3f}s "
            f"{error:>+7.1%}  {s.memory.total / GIB:>5.1f} GiB "
            f"{s.memory_limit_bytes / GIB:>5.1f} GiB {'yes' if s.fits else 'NO':>4} {peak:>9}"
        )
        if row.instead:
            print(f"{'':46}     (planned with {row.instead})")
    within = sum(e <= 0.15 for e in errors)
    print(
        f"{len(rows)} published runs: median |error| {statistics.median(errors):.1%}, "
        f"worst {max(errors):.1%}, {within} within 15%; {misfits} called misfits on the "
        f"hardware they ran on"
    )


if __name__ == "__main__":
    main()
