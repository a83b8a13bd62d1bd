"""The training planner on mixtures of experts, judged on published, measured runs it was never
calibrated on: each run (a) planned as it ran, its layout pinned, and (b) the planner's own
best plan for the same model, devices and global batch, both against the measured step.

The runs are 92 published mixture-of-experts training runs, each row with its source and the
figures it quotes (none is in CALIBRATION.md): NeMo AutoModel's DeepSeek-V3, Kimi K2 and GPT-OSS
on DGX-H100; the Megatron MoE model zoo's Qwen3-235B-A22B in five layouts on 256 H100 (and
Qwen3-Next-80B), at sequence 16384 on 256 H100 (its long-context rows at 32768 to 131072, under
context parallelism, listed) and in one layout on 256 GB200; Marin's 360B mixture under EP 64
and under FSDP on one GB200 rack; Megatron-Bridge's DGX-H100 performance-summary rows of every
release read (25.11 to 26.06: GPT-OSS 120B in four releases at global batch 1280 and one at
512, Qwen3-235B-A22B fp8 in four at 8192 and one at 2048, Qwen3-30B-A3B fp8 in five at 1024
and one at 512), and its
Qwen3-30B-A3B on 16 H100 at global batch 1024 in seven bf16 runs of its pull requests
(all-to-all against HybridEP dispatch, EP overlap on and off, TP 2, two recomputations); the
summary's H100 rows not written (25.09's token-dropping and DeepSeek-V3 rows, Nemotron 3 Nano)
are listed in a comment with why; the same summary's Blackwell BF16 mixture rows, GPT-OSS 120B
on 64 B200 and on 64 GB200 in five releases each (25.11 to 26.04.01) and Qwen3-235B-A22B on
256 GB200 (25.11), with DeepSeek-V3's 25.11 GB200 row listed and not judged, its MXFP8 rows
and the GB300's and B300's in a comment with why, reported under their hardware and apart
from the H100 rows in the Megatron-Bridge lines; MaxText's Mixtral
8x22B on TPU v6e-256, DeepSeek-V3 and Llama 4 on TPU v5p; and two sweeps on TPU, listed and not
judged: Marin's grug MoE trial shape on v5p-256 under EP 16 and EP 32, each by all-to-all and by
ring dispatch (its sequence length, recomputation and optimizer unpublished), and MaxText's
Qwen3.5-35B-A3B on one v7x-8 host in six meshes and MoE kernels (linear attention, no v7x
preset). Three of Marin's GPU sweeps are listed and not judged too: its FSDP-against-EP16
ablation pairs on 16 H100 at two widths (a latent-expert model the decoder cannot write), its
512-expert model on one GB200 rack under expert axes 1, 8, 16 and 64 (heads, expert width and
vocabulary unpublished), and its row-13 benchmark on one B200 node under EP1, ring EP and ragged
all-to-all EP (ring unpriced, the all-to-all XLA's slow default kernel). BioNeMo's Mixtral 8x7B
recipe (PyTorch: FSDP2, Transformer Engine) on one node of 8 B200s and of 8 B300s, in bf16
under FSDP 8, FSDP 4 x EP 2, FSDP 2 x EP 4 and EP 8, is a sweep listed, its B200 ranking
judged by the nearest layouts the planner writes (what a step of its B200 table holds is not
known; the planner has no B300); the same recipe's and NeMo AutoModel's plain-FSDP runs of
that model and batch on 8 B200s, from the recipe's AutoModel comparison, are judged as
written. Every published
benchmark here forces balanced routing (or states dropless routing; Marin's capacity-padded pair
is planned dropless, and says so), which is the planner's uniform routing (``imbalance=1``);
DeepEP's and HybridEP's dispatch is ``dispatch_once`` (each token once to each device of its
experts, across nodes once to each node).

A run as written is priced by the analytic estimate (no compile), its layout in the
planner's words: Megatron's tensor parallel with expert parallelism folded onto the same
devices (MoE parallel folding, ETP 1: attention TP x DP, the experts EP x EDP, each expert
whole), with the distributed optimizer and sequence parallelism as the model zoo's config
sets them, is ``zero1_ep_fold_sp`` on ``stage=P,data=EDP,expert=EP/TP,model=TP`` with
``virtual_stages`` (Megatron FSDP's is ``fsdp_ep_fold_sp``); AutoModel's expert
parallelism inside FSDP is ``fsdp_ep``.
Where a source does not state the recomputation, the run's config does where it is
published (AutoModel's benchmark YAMLs), else the frameworks' default (none) is used, and
said. A run the planner cannot write
is listed with why, never dropped.

The best plan is the estimate's screen over every strategy the planner prices a mixture with
(:data:`~shardscope._src.train.candidates.MOE_STRATEGIES`), every mesh, stage count,
micro-batch count and recomputation, on the run's hardware: the fastest that fits. Where the
best plan is far faster than what ran, either it found a better layout or the layouts it
prefers are underpriced; the published sweeps are the judges of the ranking, printed measured
beside predicted: the Qwen3-235B one (one model, one batch, five layouts on 256 H100), its
GB200 one (the zoo's layout and Megatron-Bridge 25.11's on 256 GB200 at one batch: two programs
as well as two layouts), the
Qwen3-30B-A3B one (one model, one batch on 16 H100: twelve runs, the seven bf16 ones and five
releases' fp8 rows; a layout run in two releases is predicted equal, and said so) and Marin's
EP 64 against its FSDP control (one 360B mixture on one GB200 rack). Megatron-Bridge's releases
of one GPT-OSS 120B or Qwen3-235B-A22B layout are judged run by run, not as a sweep: they rank
software, not layouts. The two TPU
sweeps and Marin's three other GPU sweeps are printed with their measured order, none of their
runs written.

Run: ``python benchmarks/moe_heldout.py`` (a minute or two: the screens of 256- and
1024-device meshes).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import calibration  # noqa: E402
import training_heldout  # noqa: E402

from shardscope import ModelConfig, ShardscopeError, hardware  # noqa: E402
from shardscope._src.model.presets import model_preset  # noqa: E402
from shardscope._src.plan.notes import MixtureStepValues  # noqa: E402
from shardscope._src.train.candidates import MOE_STRATEGIES, estimate, screen_all  # noqa: E402
from shardscope._src.train.sweep import beside_best_note  # noqa: E402
from shardscope._src.train.types import Candidate, Screened  # noqa: E402

GIB = training_heldout.GIB
CUDNN = training_heldout.CUDNN
#: The recomputation of a run whose source does not state one: the frameworks' default
#: (Megatron-LM's ``recompute_granularity`` and NeMo AutoModel's ``activation_checkpointing``
#: are off unless set; AutoModel's GPT-OSS benchmark recipes leave it off).
UNSTATED = "none"

_AUTOMODEL = "NVIDIA-NeMo/Automodel docs/performance-summary.md@01926a5"
#: AutoModel's benchmark configs for its DeepSeek-V3 and Kimi K2 rows set
#: ``activation_checkpointing: true`` (examples/benchmark/configs/deepseek_v3_te_deepep.yaml,
#: kimi_k2_te_deepep.yaml): its MoE parallelizer wraps each decoder layer in torch's
#: ``checkpoint_wrapper``, the whole layer recomputed from its input (``full``). Its GPT-OSS
#: configs set it false.
_AUTOMODEL_AC = "full"
_ZOO = "yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md@c1ad0b5"
_BRIDGE = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md@0a25f91"
_RECIPES = "AI-Hypercomputer/tpu-recipes (MaxText)"


def _offloaded(*tensors: str) -> str:
    """MaxText's ``remat_policy: custom`` of its recipes: the layer's input and ``tensors``
    offloaded to host memory, the rest recomputed (``remat``)."""
    return "custom:" + ",".join(f"{t}=offload" for t in ("decoder_layer_input", *tensors))


@dataclass(frozen=True)
class MoeRun:
    """A published mixture-of-experts run: the model, hardware and layout its source states."""

    name: str
    source: str
    #: its batch is the global batch; None where the planner has no such model
    config: ModelConfig | None
    hardware: str
    devices: int
    measured_s: float
    strategy: str = ""
    mesh: tuple[tuple[str, int], ...] = ()
    microbatches: int = 1
    #: None: the source does not state it (:data:`UNSTATED`)
    remat: str | None = None
    virtual_stages: int = 1
    #: what its pipeline stages split: ``"embedding+loss"`` where Megatron counts the
    #: embedding and the loss as a layer each (``account_for_*_in_pipeline_split``)
    pipeline_split: str = "layers"
    overrides: dict[str, Any] | None = None
    instead: tuple[str, ...] = ()
    #: why the planner cannot write this run as it ran (its best plan is still judged; with
    #: a ``strategy``, that layout is the nearest it writes, printed apart from the errors)
    cannot: str = ""
    #: the layouts of one model's published sweep share a name here
    sweep: str = ""
    #: the layers' matmuls: "fp8" for a run in fp8 (its best plan is screened in fp8 too)
    matmul_dtype: str = "bfloat16"
    #: how an fp8 run keeps its linear layers' inputs: "fp8" for Transformer Engine's
    #: (Megatron's), whose ``Linear`` and ``GroupedLinear`` save the quantized copy
    fp8_saved_inputs: str | None = None
    #: the layers' linear weights kept in fp8 but this many layers at each end (None: 16-bit;
    #: the planner's ``fp8_params``)
    fp8_params: int | None = None
    #: the optimizer state in host memory, streamed in for the update
    offload_optimizer: bool = False

    def hw(self) -> Any:
        return hardware(self.hardware, **(self.overrides or {}))


def _preset(name: str, batch: int, seq: int, **kw: Any) -> ModelConfig:
    return replace(model_preset(name).config(batch=batch, seq=seq), **kw)


def _kimi_k2(batch: int) -> ModelConfig:
    """Kimi K2 (moonshotai/Kimi-K2-Instruct's config.json, DeepSeek-V3's architecture): 61
    layers (the first dense), d 7168, latent attention of 64 heads (q_lora 1536, kv_lora
    512, 128 + 64 query and key dimensions, values of 128), 384 routed experts of 2048 and
    one shared, 8 routed a token, dense FFN 18432, vocabulary 163840: DeepSeek-V3's preset
    with its heads, experts, dense layers and vocabulary, and routed from every expert
    (its ``n_group`` 1 and ``topk_group`` 1, where DeepSeek-V3's are 8 and 4)."""
    return _preset(
        "deepseek-v3",
        batch,
        4096,
        heads=64,
        kv_heads=64,
        experts=384,
        dense_layers=1,
        vocab=163840,
        dispatch_once=True,
        expert_groups=1,
        groups_per_token=1,
    )


def _from_judged(row: calibration.Row, measured_from: str) -> MoeRun:
    """One of ``calibration.py``'s judged GPT-OSS rows (the same AutoModel runs)."""
    devices = 1
    for _, n in row.mesh:
        devices *= n
    return MoeRun(
        row.name,
        measured_from,
        row.config,
        row.hardware,
        devices,
        row.measured_s,
        row.strategy,
        row.mesh,
        row.microbatches or 1,
        row.remat,
        overrides=row.overrides,
    )


#: Megatron-Core's grouped experts (``TEGroupedMLP``) take the router's probabilities into
#: their activation (``weighted_bias_swiglu_impl``, ``weighted_bias_quick_geglu_impl``) for
#: every token dispatcher: the all-to-all one permutes the probabilities with the tokens and
#: un-permutes the outputs without them (NVIDIA/Megatron-LM
#: megatron/core/transformer/moe/token_dispatcher.py@0014f13, ``dispatch_preprocess`` and
#: ``combine_postprocess``), so no expert output is kept for the weights' gradient: the
#: planner's ``weight_activations``, set on every Megatron row.
MEGATRON_WEIGHTING = {"weight_activations": True}

#: The model zoo's "recompute norm, act": Megatron-Core's selective recomputation of the
#: norms' outputs and the experts' activation (``--recompute-granularity selective
#: --recompute-modules layernorm moe_act``).
ZOO_NORM_ACT = "megatron:moe_act,layernorm"


#: How the model zoo's TFLOP/s-only rows become steps: Megatron's own count,
#: ``num_floating_point_operations`` (NVIDIA/Megatron-LM megatron/training/training.py@001b00c,
#: its attention scores halved: "causal mask (only half of the mask is non-zero)"), for
#: Qwen3-235B-A22B (94 layers, d 4096, 64 query heads of 128 and 4 key/value groups, 8 of 128
#: experts of 1536, the vocabulary padded to 151936 by ``--make-vocab-size-divisible-by 1187``)
#: is 148.03 GFLOP a token at sequence 4096, 204.81 at 16384, 280.51 at 32768, 431.91 at 65536
#: and 734.70 at 131072; each step is GBS x sequence x that / (GPUs x TFLOP/s). The count gives
#: back the zoo's own H100 steps from their TFLOP/s (245, 276, 200 and 167: 19.80, 17.58, 24.25
#: and 29.05 s against the table's 19.7, 17.6, 24.2 and 29.0).
#:
#: The long-context table (:data:`_ZOO`, "Long Context": 256 H100 as "NNODES 32", Qwen3-235B-A22B,
#: DeepEP, bf16; its command ``PP=8 VPP=4 TP=${TP} EP=8 CP=${CP} GBS=${GBS} ... PR=bf16 ...
#: --recompute-granularity selective --recompute-modules layernorm moe``, A2A_OVERLAP=0, micro-batch
#: 1 the runtime config's): "H100| 16384 | 32 | 4 | 1 | 256 | 295 (forced balance) / 237
#: (dropless)" is written (256 x 16384 x 204.81e9 / (256 x 295e12) = 11.375 s); the forced-balance
#: rows at CP 2, 4 and 8 ("32768 ... 335", "65536 ... 368", "131072 ... 389": 27.438, 76.917 and
#: 247.554 s) are listed, the planner pricing no context parallelism for a mixture; the dropless
#: figures (237, 277, 320, 357) are not written: their routing's imbalance is not published.
_ZOO_LONG = f"{_ZOO}, Long Context (forced balance)"
#: The zoo's GB200 table (yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md@020b813;
#: NVIDIA/Megatron-LM examples/moe-modelzoo/best_practice/qwen3/readme.md@f13818d the same row):
#: "GB200 | 4096 | 64 | BF16 | 1 | 8 | 1 | 8 | 1 | 8192 | 750" (TP, PP, VPP, EP, MBS, GBS,
#: TFLOPS; "Dispatcher: HybridEP", "NVLink Domain Size: 72"), its command ``DISPATCHER=hybridep
#: SEGMENT=2 PR=bf16 A2A_OVERLAP=0 TP=1 PP=8 VPP=1 EP=8 NNODES=64 MBS=1 GBS=8192 ...
#: --moe-router-force-load-balancing --cuda-graph-impl transformer_engine --cuda-graph-scope attn
#: moe_router moe_preprocess`` (no recomputation set, nor by the model's benchmarking config); the
#: launcher (sbatch_benchmarking.sh@38ce2ed) runs a GB200 cluster's nodes 4 tasks each (64 nodes:
#: 256 GPUs) and HybridEP with ``--moe-hybridep-num-sms 32``: 8192 x 4096 x 148.03e9 / (256 x
#: 750e12) = 25.871 s.
#:
#: The zoo's and Megatron-LM's other published MoE figures, not written, and why:
#: the GB200 table's MXFP8 rows (919 TFLOPS at PP 4, VPP 6, EP 64, MBS 3, GBS 3072 with activation
#: offloading; 1150 at sequence 131072, TP 4, PP 4, VPP 12, CP 4, EP 32) and the GB300 rows (974
#: MXFP8 at 64 nodes, PP 4, EP 32, MBS 2, GBS 8192 in the zoo@020b813, where Megatron-LM@f13818d
#: prints "GB300 | 4096 | 16 | MXFP8 | 1 | 1 | 1 | 1 | 64 | 1 | 8192 | 1055" and lists the 1150
#: long-context row under GB200): MXFP8 is not priced and the GB300 has no preset; Mixtral 8x22B
#: (best_practice/Mixtral/run_mixtral_8x22B.sh@0993e66: "Dropless training, stable performance
#: should be around 455TFLOPS for H100", "Token Drop training, perf should be around 470TFLOPS"):
#: an approximate figure, its dropless run routed by the auxiliary loss on real data (no forced
#: balance), and its layout the runtime config's, whose stored versions differ (Mixtral-8x22B
#: "2 8 8 1 1" TP, PP, EP, CP, VPP at 30631ea, "2 8 8 1 7" at 3a2d8b5); DeepSeek-V3 on GB200
#: (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md
#: @1d9edcf, 494.46 to 970.01 TFLOPS/GPU) is MXFP8 throughout; the zoo's DeepSeek-V3, Qwen3-30B-A3B
#: and Qwen3-33B scripts and Megatron-LM's examples/moe_recipes (README@19d22f5) publish layouts
#: with no measured figure; the Megatron Core MoE report's Table 11 (arXiv 2603.07685) and the MoE
#: Parallel Folding paper's tables (arXiv 2504.14960) are stored only as others' readings of their
#: images, not their figures and layouts.
_ZOO_GB200 = (
    "yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md@020b813, GB200 BF16; "
    "sbatch_benchmarking.sh@38ce2ed (4 GPUs a node, HybridEP on 32 SMs)"
)
#: How the zoo's GB200 run held its router: CUDA graphs the planner does not price.
_ZOO_GRAPHS = (
    "no CUDA graphs (the run: Transformer Engine's, of the attention's, the MoE router's and "
    "preprocess's scopes)"
)


def _zoo_long_cp(seq: int, cp: int, measured_s: float) -> MoeRun:
    """A forced-balance row of the zoo's long-context table run with context parallelism
    (:data:`_ZOO_LONG`): Qwen3-235B-A22B on 256 H100, global batch 256 of ``seq``, TP 4, CP
    ``cp``, PP 8, VPP 4, EP 8, DeepEP, the norms and the MoE layers recomputed. Listed: the
    run folds its EP 8 over the TP 4 (ETP 1: each expert whole), as the 4096-token rows do
    (``zero1_ep_fold_sp``), and the planner's folded expert parallelism takes no context axis;
    its unfolded forms with context (``zero1_ep_sp_cp``) split each expert over the tensor
    axis and hold EP 4 at most beside TP 4 and CP 2 on a 32-device stage, so none is this
    layout."""
    return MoeRun(
        f"Megatron Qwen3-235B TP4 CP{cp} EP8 PP8 VP4, sequence {seq}, 256 H100",
        _ZOO_LONG,
        None,
        "h100",
        256,
        measured_s,
        cannot=f"EP 8 folded over TP 4 (each expert whole) with context parallelism (CP {cp}): "
        "the planner's folded expert parallelism takes no context axis, and its unfolded "
        "forms with one (zero1_ep_sp_cp) split each expert over the tensor axis",
    )


#: The model zoo's Qwen3-235B-A22B layouts on 256 H100 at global batch 2048 of 4096, ranked as
#: one sweep.
ZOO_235B_SWEEP = "Qwen3-235B-A22B on 256 H100"
#: The published runs of Qwen3-235B-A22B in bf16 on 256 GB200 at global batch 8192 of 4096 (the
#: model zoo's and Megatron-Bridge's 25.11 layout), ranked as one sweep: their software differs
#: as well as their layouts.
ZOO_235B_GB200_SWEEP = "Qwen3-235B-A22B on 256 GB200"


def _zoo_235b(
    layout: str,
    measured_s: float,
    *,
    tp: int,
    ep: int,
    pp: int,
    vp: int,
    recompute: str,
    deepep: bool = True,
    note: str = "",
    ep_overlap: bool = False,
    batch: int = 2048,
    seq: int = 4096,
    gpu: str = "H100",
    source: str = _ZOO,
    exchange_sms: int = 0,
    instead: tuple[str, ...] = (),
    sweep: str = ZOO_235B_SWEEP,
) -> MoeRun:
    """Qwen3-235B-A22B on 256 H100 in the model zoo's layout: global batch 2048 of 4096,
    micro-batch 1; a pipeline stage's devices are ``tp x dp`` for the attention and
    ``ep x edp`` (ETP 1) for the experts, over the same devices (Megatron's parallel
    folding), with the distributed optimizer and sequence parallelism (the zoo's
    ``model_configs/benchmarking/Qwen3-235B-A22B.yaml``): ``zero1_ep_fold_sp`` on
    ``stage=pp,data=edp,expert=ep/tp,model=tp``, the dense weights' optimizer state over
    ``data x expert`` (its DP), the experts' over ``data`` (its EDP). The same config sets
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``
    (``pipeline_split="embedding+loss"``: the 94 layers, the embedding and the loss are 96
    pieces, 12 a stage of PP 8, 3 of PP 32). ``recompute`` is the
    readme's column as written: ``"norm, act"`` is Megatron's ``--recompute-modules
    layernorm moe_act`` (:data:`ZOO_NORM_ACT`). ``ep_overlap``: the readme's "+1f1b
    overlap", Megatron's combined 1F1B schedule (the all-to-alls beside the other
    micro-batch's compute). Megatron-Core's grouped experts scale each slot's activation by
    its router weight under either dispatcher (``weight_activations``: DeepEP's flex
    dispatcher and the all-to-all one alike keep no expert output, :data:`MEGATRON_WEIGHTING`).

    ``batch`` and ``seq``: the global batch and sequence where a run states others (its
    micro-batch still 1); with TP 1 the attention is data-parallel over the experts' devices,
    ``zero1_ep`` on ``stage=pp,data=edp,expert=ep`` (the layout of :func:`_bridge_qwen3`).
    ``gpu`` ``"GB200"``: the ``b200`` preset with :data:`GB200_RACK`, the attention at the
    preset's rates (no measured B200 attention kernel); ``deepep`` is then HybridEP's flex
    dispatcher, each token once to each device of its experts all the same. ``source``: the
    table the row is read from; ``exchange_sms``: the multiprocessors HybridEP's dispatch and
    combine hold, where the launcher states them; ``instead``: what else the row is planned
    with; ``sweep``: the sweep the row belongs to (none for a run of another batch or
    sequence)."""
    data = 256 // pp // tp
    edp = data * tp // ep
    said = []
    if note:
        said.append(note)
    if gpu == "H100":
        hw, overrides = "h100", dict(CUDNN)
    else:
        hw, overrides = "b200", dict(GB200_RACK)
        said += [
            "the attention at the preset's matmul rate, counted non-causal (the B200 preset "
            "has no measured attention kernel)",
            "a GB200 rack as 64 B200s on one NVLink domain (GB200_RACK)",
        ]
    said += instead
    if ep_overlap:
        overrides["ep_overlap"] = True
    if exchange_sms:
        overrides["exchange_sms"] = exchange_sms
    if tp == 1:
        strategy, mesh = "zero1_ep", (("stage", pp), ("data", edp), ("expert", ep))
    else:
        strategy = "zero1_ep_fold_sp"
        mesh = (("stage", pp), ("data", edp), ("expert", ep // tp), ("model", tp))
    return MoeRun(
        f"Megatron Qwen3-235B {layout}, 256 {gpu}",
        source,
        _preset("qwen3-235b-a22b", batch, seq, dispatch_once=deepep, **MEGATRON_WEIGHTING),
        hw,
        256,
        measured_s,
        strategy,
        mesh,
        batch // data,
        ZOO_NORM_ACT if recompute == "norm, act" else recompute,
        vp,
        pipeline_split="embedding+loss",
        overrides=overrides,
        instead=tuple(said),
        sweep=sweep,
    )


#: Megatron-Bridge's H100 GPT-OSS 120B perf config, every stored version that runs it on PP 4
#: (scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py,
#: ``GPT_OSS_120B_H100_BF16_BASE_CONFIG`` and its renamed ``..._PRETRAIN_CONFIG_H100_BF16_V1``,
#: @07eea52 among them): ``replace(BASE_GPT_OSS_120B_CONFIG, pipeline_model_parallel_size=4,
#: recompute_modules=["layernorm", "moe_act"])`` over ``num_gpus=64,
#: expert_model_parallel_size=8, expert_tensor_parallel_size=1, global_batch_size=512,
#: micro_batch_size=1``. Megatron-Core recomputes the modules only under
#: ``recompute_granularity == 'selective'`` (its grouped experts' ``activation_recompute``).
#: The perf script's ``_set_recompute_overrides`` (scripts/performance/utils/overrides.py) sets
#: it with them since pull 1653 ("selective granularity recompute", merged 2025-12-09:
#: ``model.recompute_granularity = "selective"``; NVIDIA-NeMo@00538e2, zidanehuang001@8e0fe90,
#: radixark@d063066), so the 26.02 release and later recompute the norms and the experts'
#: activation (:data:`ZOO_NORM_ACT`); the 25.11 release's script set the modules alone (the
#: version without the line), and its row keeps the default (none).
_BRIDGE_GPTOSS_CONFIG = (
    "NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/gpt_oss/"
    "gpt_oss_workload_base_configs.py@07eea52 (H100: PP 4, EP 8, GBS 512, MBS 1)"
)


def _bridge_gptoss(
    version: str,
    batch: int,
    mbs: int,
    measured_s: float,
    *,
    source: str = _BRIDGE,
    gpu: str = "H100",
    pp: int = 4,
    ep: int = 8,
    seq: int = 4096,
    remat: str | None = None,
    dispatch_once: bool = False,
    ep_overlap: bool = False,
    config: str = _BRIDGE_GPTOSS_CONFIG,
) -> MoeRun:
    """Megatron-Bridge's GPT-OSS 120B on 64 H100: PP 4, EP 8, data parallel 16 (the experts
    replicated over 2 of them) with the distributed optimizer, dropless with forced balance;
    ``zero1_ep`` on ``stage=4,data=2,expert=8`` (the optimizer state of the dense weights
    sharded over all 16, the experts' over their 2), the attention Transformer Engine's
    (cuDNN's), the experts Megatron-Core's (:data:`MEGATRON_WEIGHTING`). ``mbs`` is the
    micro-batch the perf config runs (:data:`_BRIDGE_GPTOSS_CONFIG`): 1. The 25.11 table's
    H100 row says MBS 4 and GA 2, which its own GBS 512 and data parallel 16 (64 GPUs over
    PP 4) contradict (16 x 4 x 2 = 128); the config's MBS 1 runs 512 = 16 x 1 x 32, as the
    26.02 row states it (MBS 1). ``source``: the table the row is read from (the archive at
    0a25f91 unless given); ``remat``: the recomputation the perf config sets (None: not
    stated; on H100 the norms' and the experts' activation from 26.02, none at 25.11, as the
    comment of :data:`_BRIDGE_GPTOSS_CONFIG` reads the perf script).

    On Blackwell (``gpu`` ``"B200"``: the ``b200`` preset; ``"GB200"``: it with
    :data:`GB200_RACK`) the rows run PP 1 (``pp``) and EP ``ep`` over the 64 GPUs' data
    parallel 64, ``zero1_ep`` on ``data=64/ep,expert=ep``, at the sequence ``seq`` the table
    states, the attention at the preset's rates (the B200 has no measured attention kernel,
    as ``training_heldout.py``'s Blackwell rows), ``dispatch_once`` for HybridEP's flex
    dispatcher and
    ``ep_overlap`` for ``moe_a2a_overlap`` (Megatron's combined 1F1B, which delays the
    experts' weight gradients: ``_set_moe_a2a_overlap_overrides``, ``delay_wgrad_compute =
    True``); ``config``: the perf config the row is read with."""
    # GPT-OSS's attention has a learnable softmax sink a head (softmax_type="learnable",
    # src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py@12bc34a; "Fused sink attention
    # requires TE >= 2.8", else Megatron-Core's local attention). Transformer Engine runs
    # such a softmax on FusedAttention or UnfusedDotProductAttention, never FlashAttention
    # (get_attention_backend, transformer_engine/pytorch/attention/dot_product_attention/
    # utils.py@002a3e5: "Disabling FlashAttention for softmax_type"), and cuDNN's kernel takes
    # it from cuDNN 9.13.1 ("pre-9.13.1: vanilla; 9.13.1+: vanilla, off-by-one, learnable",
    # nvte_get_fused_attn_backend, transformer_engine/common/fused_attn/fused_attn.cpp
    # @015d346). The run had cuDNN's: an attention that keeps the scores (TE's unfused one
    # or Megatron-Core's local one, 64 heads of 4096 x 4096 a layer) holds 239 GiB a device
    # here by the planner's count (flash_attention=False), over an H100's 80 GB.
    instead = ["the sliding-window layers attend fully (the preset's)"]
    if gpu == "H100":
        instead.append(
            "the attention at cuDNN's rates without sinks for heads of 128 (GPT-OSS's are 64 "
            "wide with a learnable softmax sink each: no published H100 rate of that kernel)"
        )
        hw, overrides = "h100", dict(CUDNN)
    else:
        instead.append(
            "the attention at the preset's matmul rate, counted non-causal and without its "
            "learnable softmax sinks (the B200 preset has no measured attention kernel)"
        )
        hw, overrides = "b200", dict(GB200_RACK) if gpu == "GB200" else {}
        if gpu == "GB200":
            instead.append("a GB200 rack as 64 B200s on one NVLink domain (GB200_RACK)")
    if ep_overlap:
        overrides["ep_overlap"] = True
    if version == "25.11" and gpu == "H100":
        instead.append(
            "micro-batch 1, as the perf config sets it (the table's MBS 4 and GA 2 give 16 x "
            "4 x 2 = 128 sequences a step, not its GBS 512)"
        )
    dp = 64 // pp
    stage = (("stage", pp),) if pp > 1 else ()
    layout = f"PP {pp} x EP {ep}" if pp > 1 else f"EP {ep}"
    once = {"dispatch_once": True} if dispatch_once else {}
    return MoeRun(
        f"Megatron-Bridge {version} GPT-OSS 120B, {layout}, 64 {gpu}",
        f"{source}; {config}",
        _preset("gpt-oss-120b", batch, seq, **once, **MEGATRON_WEIGHTING),
        hw,
        64,
        measured_s,
        "zero1_ep",
        (*stage, ("data", dp // ep), ("expert", ep)),
        batch // (dp * mbs),
        remat,
        overrides=overrides,
        instead=tuple(instead),
    )


def _bridge_qwen3(
    version: str,
    size: str,
    gpus: int,
    batch: int,
    mbs: int,
    measured_s: float,
    *,
    source: str = _BRIDGE,
    dispatch_once: bool = False,
    sweep: str = "",
    gpu: str = "H100",
    precision: str = "FP8",
    ep_overlap: bool | None = None,
    instead: tuple[str, ...] = (),
    **layout: int,
) -> MoeRun:
    """Megatron-Bridge's Qwen3 in fp8 (FP8-CS: tensorwise current scaling, the time model's
    casts) on H100, as its table states the layout (``layout``: tp, pp, vp, ep); dropless,
    forced balance; the attention Transformer Engine's (cuDNN's). With TP 1 the attention
    is data-parallel over the experts' devices and the distributed optimizer shards the
    dense weights' state over all of them, the experts' over their data-parallel copies
    (EDP): ``zero1_ep`` on ``stage=P,data=EDP,expert=E`` (EDP 1 where EP is the data
    ways); with TP 2 (235B) it is the zoo's fold with the distributed optimizer,
    ``zero1_ep_fold_sp`` (the layout of :func:`_zoo_235b`). Qwen3-235B-A22B's pipeline split
    counts the embedding and the loss as a layer each, as the recipe the perf scripts build on
    sets them (``qwen3_235b_a22b_pretrain_config``,
    src/megatron/bridge/recipes/qwen/qwen3_moe.py@2afd2d3:
    ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``).
    The FP8-CS recipe keeps the linear layers' weights in fp8 but the first and the last
    layer's (``fp8_params``: :data:`training_heldout.BRIDGE_FP8_CS_BF16_LAYERS`). The experts
    are Megatron-Core's (:data:`MEGATRON_WEIGHTING`). ``source``: the table the row is read
    from (the archive at 0a25f91 unless given); ``dispatch_once``: the perf config's flex
    dispatcher with HybridEP (each token once to each device of its experts).

    ``gpu`` ``"GB200"``: the ``b200`` preset with :data:`GB200_RACK`, its attention at the
    preset's rates (no measured B200 attention kernel); ``precision`` ``"BF16"``: bf16
    matmuls and weights; ``ep_overlap``: ``moe_a2a_overlap`` (None: the H100 configs', on for
    Qwen3-235B-A22B alone); ``instead``: what else the row is planned with."""
    tp, pp, vp, ep = layout["tp"], layout["pp"], layout["vp"], layout["ep"]
    data = gpus // pp // tp
    # Megatron-Bridge's CommOverlapConfig turns overlap_p2p_comm on under interleaving
    # (src/megatron/bridge/training/comm_overlap.py@0685ff5, "PP overlap": vp_size > 1)
    # and its H100 Qwen3-235B configurations set moe_a2a_overlap (Megatron's combined 1F1B,
    # scripts/performance/configs/qwen/qwen3_workload_base_configs.py@01b2977); its
    # Qwen3-30B ones do not
    if ep_overlap is None:
        ep_overlap = size == "235B-A22B"
    if gpu == "H100":
        hw, overrides = "h100", dict(CUDNN)
    else:
        hw, overrides = "b200", dict(GB200_RACK) if gpu == "GB200" else {}
        rack = ("a GB200 rack as 64 B200s on one NVLink domain (GB200_RACK)",)
        instead = (
            "the attention at the preset's matmul rate, counted non-causal (the B200 preset "
            "has no measured attention kernel)",
            *(rack if gpu == "GB200" else ()),
            *instead,
        )
    overrides.update(pp_overlap=pp > 1 and vp > 1, ep_overlap=ep_overlap)
    fp8 = (
        {
            "matmul_dtype": "fp8",
            "fp8_saved_inputs": "fp8",
            "fp8_params": training_heldout.BRIDGE_FP8_CS_BF16_LAYERS,
        }
        if precision == "FP8"
        else {}
    )
    split = "embedding+loss" if size == "235B-A22B" else "layers"
    name = f"Megatron-Bridge {version} Qwen3-{size} {precision}, {gpus} {gpu}"
    config = _preset(
        f"qwen3-{size.lower()}", batch, 4096, dispatch_once=dispatch_once, **MEGATRON_WEIGHTING
    )
    if tp == 1:
        return MoeRun(
            name, source, config, hw, gpus, measured_s, "zero1_ep",
            (("stage", pp), ("data", data // ep), ("expert", ep)), batch // (data * mbs), None,
            vp, pipeline_split=split, overrides=overrides, instead=instead, sweep=sweep, **fp8,
        )  # fmt: skip
    mesh = (("stage", pp), ("data", data * tp // ep), ("expert", ep // tp), ("model", tp))
    return MoeRun(
        name, source, config, hw, gpus, measured_s, "zero1_ep_fold_sp", mesh,
        batch // (data * mbs), None, vp, pipeline_split=split, overrides=overrides,
        instead=instead, sweep=sweep, **fp8,
    )  # fmt: skip


#: The published runs of Qwen3-30B-A3B on 16 H100 at global batch 1024 (Megatron-Bridge's perf
#: recipe shape), ranked as one sweep.
QWEN30_SWEEP = "Qwen3-30B-A3B on 16 H100"


def _bridge_qwen30_fp8(version: str, step: float, source: str, **layout: Any) -> MoeRun:
    """A Megatron-Bridge release's Qwen3-30B-A3B fp8 row of the sweep (:data:`QWEN30_SWEEP`):
    16 H100s, global batch 1024, micro-batch 1, the ``layout`` its table states."""
    return _bridge_qwen3(
        version, "30B-A3B", 16, 1024, 1, step, source=source, sweep=QWEN30_SWEEP, **layout
    )


_MB = "NVIDIA-NeMo/Megatron-Bridge"
#: The later releases' DGX-H100 tables, read from the NeMo automation account's fork (its
#: archive at 52dfa15 holds the 26.06, 26.04.01, 26.04 and 26.02.01 tables; each release's own
#: page repeats its figures: zidanehuang001/Megatron-Bridge docs/performance-summary.md@8e0fe90
#: for 26.02.01, radixark/Megatron-Bridge docs/performance-summary.md@d063066 for 26.04,
#: basetenlabs/Megatron-Bridge docs/performance-summary.md@c3a4934 for 26.04.01, and
#: okoge-kaz/Megatron-Bridge docs/performance-summary-archive.md@2e09c23 for 26.06). The
#: 26.06.01, 26.08 and 26.08.01 tables (okoge-kaz's archive and page@2e09c23) have no DGX-H100
#: mixture rows. Each step is GBS x 4096 / (GPUs x tokens/s/GPU), and each row's model TFLOP/s
#: over its tokens/s gives the GFLOP a token every release's rows of that model share (GPT-OSS
#: 120B 27.1-27.2, Qwen3-30B-A3B 22.9-23.1, Qwen3-235B-A22B 147.7-148.3).
_BRIDGE_FORK = "svcnemo-autobot/Megatron-Bridge docs/performance-summary-archive.md@52dfa15"
#: The H100 Qwen3 perf configs as stored at 01b2977, the only version read: Qwen3-30B-A3B's
#: ``QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1`` (EP 16, HybridEP, ``moe_a2a_overlap=False``,
#: no CUDA graphs) and Qwen3-235B-A22B's ``QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2``
#: (``replace(..._H100_FP8_CS_V1, global_batch_size=8192)``: TP 2, PP 8, VP 4, EP 32,
#: ``moe_a2a_overlap=True``, ``moe_token_dispatcher_type="alltoall"``); the later tables state
#: the same layouts.
_QWEN3_H100_CONFIGS = (
    f"{_MB} scripts/performance/configs/qwen/qwen3_workload_base_configs.py@01b2977"
)
#: The 26.04 table, read from the NeMo automation account's fork (the only stored copy that
#: has it, as ``training_heldout.py`` reads its 26.04 rows): "DGX-H100 | 16 | FP8 | 1024 | 1 |
#: 4096 | 0 | 1 | 1 | 1 | n/a | 16 | 8901 | 205" (step = 1024 x 4096 / (16 x 8901) = 29.451 s;
#: 205e12 / 8901 = 23.0 GFLOP a token, as the other releases' Qwen3-30B rows). The 26.04
#: layout's perf config, ``QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1`` (@01b2977):
#: ``num_gpus=16, global_batch_size=1024, expert_model_parallel_size=16,
#: moe_a2a_overlap=False, moe_flex_dispatcher_backend="hybridep"``, no ``cuda_graph_impl``
#: (its BF16 sibling sets TE graphs of ``moe_router, moe_preprocess``), micro-batch and TP/PP
#: the ``WorkloadBaseConfig`` defaults (1); ``qwen3_30b_a3b_pretrain_config_h100``
#: (qwen3_llm_pretrain.py@05c0c90) sets ``moe_token_dispatcher_type = "flex"`` and, in
#: ``set_qwen3_common_configs``, ``recompute_granularity = None`` and
#: ``moe_router_force_load_balancing = True``.
_BRIDGE_2604 = (
    f"{_BRIDGE_FORK} (26.04 NeMo Container, DGX-H100); {_QWEN3_H100_CONFIGS} (H100 "
    "FP8_CS_V1: EP 16, HybridEP, no A2A overlap), qwen3_llm_pretrain.py@05c0c90"
)
#: The Megatron-Bridge DGX-H100 mixture rows that are not written, and why:
#: 25.09 (archive@0a25f91; "DeepSeekV3 (dropless) | 1024 | 8192 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 |
#: 64 | 128 | 1297 | 338 (330)"): the 25.09 table has no precision column and prints two
#: TFLOP/s figures (the parenthesized one another quantization granularity's) beside one
#: tokens/s figure (338e12 / 1297 = 260.6 GFLOP a token, 330e12 / 1297 = 254.4), and its
#: Megatron-Bridge layout of DeepSeek-V3 is not written here;
#: 25.09 "Qwen3_30B_a3B (tokendrop) | 16 | 512 | 2 | 4096 | 0 | 1 | 2 | 1 | 24 | 8 | 32 | 10494 |
#: 241" and "Qwen3_235B_a22B (tokendrop) | 256 | 2048 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 | 32 | 128 |
#: 1204 | 178" (22.97 and 147.8 GFLOP a token, as the later rows): token-dropping at a capacity
#: factor the table does not state, and no precision column;
#: Nemotron_3_Nano (26.02.01 14890 tokens/s/GPU, 26.04 14507, 26.04.01 14336, 26.06 14719; 16
#: H100, FP8, GBS 1024, sequence 8192, EP 8; 22.2-22.4 GFLOP a token): a hybrid of Mamba and
#: attention layers, which the decoder cannot write;
#: two stored pages whose repository the index does not name (file ids 55941132558, a 26.04.01
#: page, and 56183476306, a 26.06 page) print figures the fork's archive does not (26.04.01:
#: 1696 tokens/s/GPU for Qwen3-235B, 204 TFLOP/s beside Qwen3-30B's 8960; 26.06: 8960 for
#: Qwen3-30B and a GPT-OSS 120B H100 row of "5824 | 191", 32.8 GFLOP a token against 27.2 in
#: every other GPT-OSS row): the archive's figures are the ones written.
_BRIDGE_FORK_QWEN3 = f"{_BRIDGE_FORK}; {_QWEN3_H100_CONFIGS}"
#: Pull 3862's three arms (merged 2026-05-16; "Steady mean, iters 3-8": "A0 | alltoall, no
#: EP overlap | 41.25s", "A1 | EP overlap | 31.31s", "A2 | EP overlap + delayed wgrad |
#: 31.20s", a "Current-main rerun on the same focused shape"); the shape as the skill it
#: changed states it (skills/perf-moe-comm-overlap/SKILL.md@b17a5c9: "H100 x16 smoke on
#: Qwen3 30B-A3B mock pretraining used `EP=16`, `alltoall`, global batch size 1024, CUDA
#: graphs disabled, and `moe_permute_fusion=false`", run through the perf harness's
#: ``-c bf16 -ng 16 --config_variant v1``, the H100 recipe's TP 1, PP 1, MBS 1). A1 is A2's
#: plan (the planner's ``ep_overlap`` delays the experts' weight gradients) and is not written
#: apart.
_PR3862 = f"{_MB} pull 3862 (merged 2026-05-16); skills/perf-moe-comm-overlap/SKILL.md@b17a5c9"
#: Pull 3880 (closed 2026-05-19; skills at da871ee): its layout sweep
#: (skills/perf-parallelism-strategies/SKILL.md: "on 16 H100 GPUs with BF16, all-to-all
#: dispatch, EP overlap on, CUDA graphs off, GBS=1024, and MBS=1, `TP=1, PP=1, EP=16` and
#: `TP=1, PP=1, EP=8` were effectively tied at about 31 seconds/step after warmup ... `TP=2,
#: PP=1, EP=16` dropped memory but regressed to about 60 seconds/step") and its recompute
#: sweep (skills/perf-activation-recompute/SKILL.md: "Qwen3 30B A3B pretrain on 16x H100,
#: BF16, all-to-all dispatch, CUDA graphs off, EP overlap off, MBS=1": None 42.21 s,
#: [core_attn] 42.92 s, [moe_act] 41.79 s, [mlp] 41.09 s). Not written: TP 1 EP 8 (only
#: "effectively tied" with EP 16 at "about 31", which would order the tie), its TP 1 EP 16
#: (pull 3862's 31.20 s is that layout, two decimals), None (pull 3862's 41.25 s, the same
#: knobs) and [mlp] (the planner refuses ``mlp`` on a mixture, whose MLPs are all experts, and
#: the skill saw "No observed peak-memory win on this MoE shape").
_PR3880_LAYOUT = (
    f"{_MB} pull 3880 (2026-05-19); skills/perf-parallelism-strategies/SKILL.md@da871ee"
)
_PR3880_RECOMPUTE = (
    f"{_MB} pull 3880 (2026-05-19); skills/perf-activation-recompute/SKILL.md@da871ee"
)
#: Pull 5094 (2026-07-25) turned ``overlap_moe_expert_parallel_comm`` on in the H100 BF16
#: recipe ("16×H100, BF16, sequence length 4096, MBS/GBS 1/1024, TP1/PP1/CP1/EP16, mock data,
#: forced load balancing, HybridEP, and Transformer Engine CUDA graph scopes", model-card
#: "240.110 to 287.305 model TFLOPS/GPU"); its controlled step times are quoted by pull 5129
#: (2026-07-27): "Prior controlled 16×H100 evidence in #5094 reduced Qwen step time from
#: 24.714s to 20.992s with this setting" (287.305e12 x 20.992 x 16 / (1024 x 4096) = 23.0
#: GFLOP a token, the tables' figure). The overlap arm is the plan of pull 5123's row (below)
#: and is not written apart.
_PR5094 = f"{_MB} pull 5129 (2026-07-27), quoting pull 5094's controlled A/B"
#: Pull 5123 (merged 2026-07-27): "Enable HybridEP permute fusion for the BF16 benchmark
#: recipe", "64-token HybridEP combine chunks and 10-SM forward/backward LayerNorm margins";
#: "Container: `nvcr.io/nvidia/nemo:26.08.rc2`", "Steps 41-50: 20,147.290 ms average, 299.352
#: model TFLOP/s/GPU"; the recipe it tunes, after pull 5094
#: (src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py, the stored version:
#: ``moe_permute_fusion_into_hybridep = True``, ``overlap_moe_expert_parallel_comm = True``,
#: ``delay_wgrad_compute = False``).
_PR5123 = f"{_MB} pull 5123 (merged 2026-07-27)"
#: How the all-to-all arms of pull 3862 ran their permutation.
_UNFUSED_PERMUTE = (
    "Transformer Engine's fused permutation (the runs: moe_permute_fusion=false, 'because the "
    "fused MoE permutation path failed in prior bring-up')"
)
_TE_GRAPHS = "no CUDA graphs (the run: Transformer Engine's, of the MoE router's scopes)"

#: Megatron-Bridge's Blackwell mixture rows (DGX-B200: the ``b200`` preset; DGX-GB200: it with
#: :data:`GB200_RACK`, as ``training_heldout.py`` plans the dense ones), from the same tables:
#: 25.11 and 26.02 from the archive at 0a25f91 (:data:`_BRIDGE`), 26.02.01, 26.04 and 26.04.01
#: from the NeMo automation account's fork (:data:`_BRIDGE_FORK`); each step GBS x sequence /
#: (64 x tokens/s/GPU), and each row's model TFLOP/s over its tokens/s gives GPT-OSS 120B's
#: 27.1-27.2 GFLOP a token at sequence 4096, as the H100 rows (30.7 at 25.11 GB200's 8192). The
#: BF16 rows are written: GPT-OSS 120B, 64 GPUs, GBS 1280, MBS 4, TP 1, PP 1 ("DGX-B200 | 64 |
#: BF16 | 1280 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 8 | 13568 | 369" at 26.04.01; 26.04 "... |
#: 13045 | 355", 26.02.01 "... | 13722 | 373", 26.02 "... | n/a | 64 | 8047 | 219"; "DGX-GB200 |
#: 64 | BF16 | 1280 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 64 | 16640 | 452" at 26.04.01, 26.04
#: "... | 15938 | 433", 26.02.01 "... | 15754 | 428", 26.02 "... | 15784 | 428"), and 25.11's
#: "GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 2 | 8213 | 223" (B200)
#: and "GPT OSS 120B | 64 | BF16 | 1280 | 1 | 8192 | 0 | 1 | 1 | 1 | 1 | 64 | 20 | 15876 | 488"
#: (GB200), "Qwen3_235B_a22B | 256 | BF16 | 8192 | 1 | 4096 | 0 | 1 | 8 | 1 | 3 | 32 | 256 |
#: 4916 | 728" (GB200, 148.1 GFLOP a token as the H100 rows) and "DeepSeekV3 (w/o MTP) | 256 |
#: BF16 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 | 4 | 64 | 64 | 3139 | 782" (GB200, listed: below).
#:
#: GPT-OSS's perf configs (scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py),
#: each version at the release it matches: @1e7adfa, whose V2 (GBS 1280) runs the B200 at EP 64
#: as the 26.02 row does (``GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2 = replace(..._B200_BF16_V1,
#: global_batch_size=1280)``, V1 ``expert_model_parallel_size=64, micro_batch_size=4,
#: recompute_modules=["layernorm", "moe_act"]``; the GB200's the same), no flex backend and no
#: A2A overlap; zidanehuang001/Megatron-Bridge@8e0fe90 (the 26.02.01 page's commit): the B200's
#: V2 ``expert_model_parallel_size=8, moe_flex_dispatcher_backend="hybridep"``, the GB200's
#: ``moe_flex_dispatcher_backend="hybridep", moe_a2a_overlap=True``; radixark/Megatron-Bridge
#: @d063066 (the 26.04 page's commit; NVIDIA-NeMo@07eea52 the same, no version tied to 26.04.01,
#: whose rows state the 26.04 layout): the B200's ``expert_model_parallel_size=8``, the GB200's
#: ``moe_a2a_overlap=True``, neither a flex backend. The recipe (src/megatron/bridge/recipes/
#: gpt_oss/gpt_oss.py@d063066, ``gpt_oss_120b_pretrain_config``) sets
#: ``moe_token_dispatcher_type = "alltoall"``, ``cuda_graph_impl = "none"``,
#: ``recompute_granularity = None``; the perf script's ``set_workload_base_configs``
#: (scripts/performance/utils/overrides.py, NVIDIA-NeMo@00538e2, zidanehuang001@8e0fe90 and
#: radixark@d063066 alike) passes the config's ``recompute_modules`` to
#: ``_set_recompute_overrides``, which sets ``recompute_granularity = "selective"`` with them
#: (the norms and the experts' activation recomputed, :data:`ZOO_NORM_ACT`), and
#: ``moe_a2a_overlap`` to ``_set_moe_a2a_overlap_overrides`` (``overlap_moe_expert_parallel_comm``
#: and ``delay_wgrad_compute``). No stored config states 25.11's Blackwell GPT-OSS layouts (B200
#: GBS 512 at EP 8, GB200 MBS 1 at sequence 8192): their recomputation is not stated, their
#: dispatcher the recipe's all-to-all. 25.11's Qwen3-235B-A22B GB200 layout (PP 8, VP 3, EP 32 on
#: 256) is in no stored config either (the stored GB200 BF16 V2 configs run PP 8 x EP 8): written
#: with the all-to-all, no A2A overlap and the recomputation not stated.
_BRIDGE_BW_GPTOSS = f"{_MB} scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py"
_BRIDGE_BW_GPTOSS_2602 = (
    f"{_BRIDGE_BW_GPTOSS}@1e7adfa (V2: EP 64, all-to-all), utils/overrides.py@00538e2 "
    "(selective recompute of layernorm, moe_act)"
)
_BRIDGE_BW_GPTOSS_260201 = (
    "zidanehuang001/Megatron-Bridge scripts/performance/configs/gpt_oss/"
    "gpt_oss_workload_base_configs.py@8e0fe90 (V2: HybridEP; GB200 A2A overlap), "
    "utils/overrides.py@8e0fe90 (selective recompute of layernorm, moe_act)"
)
_BRIDGE_BW_GPTOSS_2604 = (
    "radixark/Megatron-Bridge scripts/performance/configs/gpt_oss/"
    "gpt_oss_workload_base_configs.py@d063066 (V2: all-to-all; GB200 A2A overlap), "
    "utils/overrides.py@d063066 (selective recompute of layernorm, moe_act)"
)
_BRIDGE_BW_2511 = "no stored perf config of this layout (the recipe's all-to-all)"
#: The Blackwell mixture rows of the same tables not written, and why:
#: DeepSeek-V3 25.11 GB200 BF16 is listed with ``cannot=`` (RUNS); every other Blackwell mixture
#: row is MXFP8 (FP8-MX), which the planner does not price (its fp8 is tensorwise scaling alone,
#: ``matmul_dtype`` "bfloat16" or "fp8", as ``training_heldout.py`` leaves the dense MXFP8 rows):
#: DGX-B200 Qwen3-30B-A3B (8 GPUs, GBS 512: 26.04.01 27136, 26.04 26859, 26.02.01 26695 at MBS 4,
#: 26.02 9691 at MBS 1, 25.11 9299 tokens/s/GPU), Qwen3-235B-A22B (256 GPUs, PP 8, EP 8: 26.04.01
#: 3776, 26.02 3805; 25.11 64 GPUs, GBS 1024, PP 8, VP 2: 3269) and DeepSeek-V3 (256 GPUs: 26.04.01
#: 3328 at PP 8, VP 2, EP 32; 26.04 2815, 26.02.01 2790, 26.02 2689 at PP 16, EP 8; 25.11 "w/ MTP"
#: GBS 2048: 2139); DGX-GB200 Qwen3-30B-A3B (26.08.01 40960, 26.08 39936, 26.06.01 40960, 26.06
#: 40706, 26.04.01 26112, 26.04 26032, 26.02.01 26373, 26.02 26084, 25.11 23766), Qwen3-235B-A22B
#: (26.08.01 7264, 26.08 7280, 26.06.01 7360, 26.06 7376, 26.04.01 5680, 26.04 5672, 26.02.01
#: 5530, 26.02 5448), DeepSeek-V3 (26.08.01 4912, 26.08 4912, 26.06.01 4928, 26.06 4969, 26.04.01
#: 4256, 26.04 4193, 26.02.01 4021, 26.02 3955, 25.11 4018) and GPT-OSS 120B (26.08.01 28544,
#: 26.08 28672, 26.06.01 18304, 26.06 28947); 25.09's GB200 and B200 rows are token-dropping with
#: no precision column (as its H100 rows); Nemotron 3 Nano, Super, Ultra and 3.5 Lightning
#: (hybrids of Mamba and attention layers, the decoder cannot write them) and DeepSeek-V4 Flash
#: (no preset) are listed nowhere else; the DGX-GB300 and DGX-B300 rows of every release (GPT-OSS
#: 120B BF16 among them) have no preset (as ``training_heldout.py``'s GB300 rows).


def _bw_gptoss(
    gpu: str,
    version: str,
    measured_s: float,
    ep: int,
    config: str,
    *,
    source: str = _BRIDGE_FORK,
    hybridep: bool = False,
    overlap: bool = False,
) -> MoeRun:
    """A Blackwell GPT-OSS 120B row of Megatron-Bridge's tables from 26.02 on (the block above
    :func:`_bridge_qwen30_bf16`): 64 ``gpu``, GBS 1280, MBS 4, PP 1, EP ``ep``, the norms and
    the experts' activation recomputed (selective, :data:`ZOO_NORM_ACT`), HybridEP's flex
    dispatcher where ``hybridep``, ``moe_a2a_overlap`` where ``overlap``; ``config``: the perf
    config read, ``source``: the table (the fork's archive unless given)."""
    return _bridge_gptoss(
        version,
        1280,
        4,
        measured_s,
        source=source,
        gpu=gpu,
        pp=1,
        ep=ep,
        remat=ZOO_NORM_ACT,
        dispatch_once=hybridep,
        ep_overlap=overlap,
        config=config,
    )


def _bridge_qwen30_bf16(
    what: str,
    source: str,
    measured_s: float,
    *,
    hybridep: bool,
    ep_overlap: bool,
    tp: int = 1,
    remat: str = "none",
    instead: tuple[str, ...] = (),
    exchange_sms: int = 0,
) -> MoeRun:
    """Megatron-Bridge's Qwen3-30B-A3B in bf16 on 16 H100 (2 nodes of 8) as its pull requests
    measured it, the H100 perf recipe's shape: global batch 1024 of 4096, micro-batch 1, TP 1
    (``tp`` 2 where given), PP 1, EP 16 with ETP 1, forced balance, the distributed optimizer,
    no recomputation unless ``remat`` (Megatron's ``recompute_modules``) says one. With TP 1 the
    attention is data-parallel over all 16 and each device holds 8 of the 128 experts:
    ``zero1_ep`` on ``data=1,expert=16`` (64 micro-batches); with TP 2 the model zoo's fold
    (:func:`_zoo_235b`), ``zero1_ep_fold_sp`` on ``data=1,expert=8,model=2`` (the attention's
    DP 8, 128 micro-batches). ``hybridep``: the flex dispatcher with HybridEP, each token once
    to each device of its experts (``dispatch_once``), else the all-to-all one; ``ep_overlap``:
    ``overlap_moe_expert_parallel_comm``, Megatron's combined 1F1B, the planner's
    ``ep_overlap`` (whose schedule delays the experts' weight gradients); ``exchange_sms``:
    the multiprocessors HybridEP's dispatch and combine hold, where the source states them
    (0: NCCL's channels). The attention Transformer Engine's (cuDNN's), the experts
    Megatron-Core's (:data:`MEGATRON_WEIGHTING`)."""
    config = _preset("qwen3-30b-a3b", 1024, 4096, dispatch_once=hybridep, **MEGATRON_WEIGHTING)
    overrides = {**CUDNN, "ep_overlap": True} if ep_overlap else dict(CUDNN)
    if exchange_sms:
        overrides["exchange_sms"] = exchange_sms
    if tp == 1:
        strategy, mesh = "zero1_ep", (("data", 1), ("expert", 16))
    else:
        strategy, mesh = "zero1_ep_fold_sp", (("data", 1), ("expert", 16 // tp), ("model", tp))
    return MoeRun(
        f"Megatron-Bridge Qwen3-30B-A3B BF16, {what}, 16 H100",
        source,
        config,
        "h100",
        16,
        measured_s,
        strategy,
        mesh,
        1024 // (16 // tp),
        remat,
        overrides=overrides,
        instead=instead,
        sweep=QWEN30_SWEEP,
    )


_MARIN = (
    "marin-community/marin pull 7981 (2026-08-05); experiments/grug/moe_hero_fsdp/README.md@04add6d"
)
#: One GB200 rack's GPUs as the B200 preset with the rack's datasheet figures (its source and
#: figures in ``training_heldout.py``, whose Blackwell rows plan with it too).
GB200_RACK = training_heldout.GB200_RACK


def _marin_hero(
    arm: str, tokens_per_s: float, strategy: str, mesh: tuple[tuple[str, int], ...]
) -> MoeRun:
    """Marin's 359.6B-total, 20.9B-active grug MoE hero shape on one GB200 rack (64 GPUs):
    d 6144, 48 layers all with experts, 48 heads of 128 with 12 key/value heads, 128 experts
    of 3072 (top 4) and 2 shared ones of 3072, vocabulary 128256; batch 1024 of 4096,
    recompute_all (``full``), the optimizer state on the host; the step from the tokens a
    second of the 25-step pair (the control has no longer run).

    What the control's program does, from its sources, and how the estimate stands to it:
    the parameters are fp32 and cast to bf16 on their shards before the layer scan
    (``mp.cast_to_compute`` in moe_hero_fsdp/train.py), so the expert gathers (a quarter of
    the bank at a time, ``expert_chunks=4``, inside the scanned layer: levanter
    grug/_moe/sonic_cute.py) and their transposed gradient reduce-scatters move bf16, as
    priced; each chunk's grouped matmul runs over ``T k size / E`` rows, the chunks' rows
    summing to ``T k`` (no padded FLOPs); MuonH's Newton-Schulz runs on whole expert
    matrices spread over the 64 devices in both arms (unpriced in both). Marin's profile of
    the control (marin issues 8053 and 8054: 18.0 s a step) has 14.53 s of compute kernels
    on the main stream, 2.15 s of NCCL all-gathers on that stream overlapping nothing and
    0.9-1.0 s of other collectives running alone; the estimate's compute is 10.5 s (its
    attention counted full where 40 of 48 layers attend a 512-token window), its
    collectives 3.0 s, hidden but 0.65 s. The 4 s of compute the estimate lacks is not
    named by the sources.

    Both arms are planned with FSDP's collectives alone on the critical path
    (``fsdp_overlap=False``), as the control's own timeline has them (issue 8054, 2026-08-07:
    "compute-stream NCCL = 2153.1 ms, overlapped by compute = 0.2 ms (0.01%)", beside 0.91 s
    of side-stream collectives running alone), as XLA's GPU compiler schedules a scanned
    layer's by default (the setting's source in ``TIME_MODEL_SOURCES``); the EP arm is the
    same program with its experts split, its dense weights' FSDP traffic a tenth of a
    second."""
    config = ModelConfig(
        d_model=6144, heads=48, kv_heads=12, head_dim=128, ff=3072, layers=48, batch=1024,
        seq=4096, vocab=128256, mlp="swiglu", dtype="bfloat16", experts=128, top_k=4,
        expert_ff=3072, shared_experts=2,
    )  # fmt: skip
    return MoeRun(
        f"Marin 360B-A21B {arm}, 64 GB200 (one rack)",
        _MARIN,
        config,
        "b200",
        64,
        1024 * 4096 / tokens_per_s,
        strategy,
        mesh,
        1,
        "full",
        overrides={**GB200_RACK, "fsdp_overlap": False},
        offload_optimizer=True,
        instead=(
            "a GB200 rack as 64 B200s on one NVLink domain (GB200_RACK)",
            "every layer attends fully (the runs: a 512-token window, every 6th layer global)",
            "dropless routing (the runs capacity-padded, dropping 10.0% of assignments under "
            "EP and 1.9% under FSDP)",
        ),
        sweep="Marin 360B-A21B on 64 GB200",
    )


_MARIN_V5P = (
    "marin-community/marin issue 3096, comment of 2026-03-17 (the v5p-256 trial of issue 3536)"
)
#: Why the v5p trial is listed and not judged.
_MARIN_V5P_CANNOT = (
    "the trial's sequence length, recomputation and optimizer are not published (a bring-up "
    "and profiling thread): written with a guess of each (sequence 4096, no recomputation, as "
    "its v5p-64 perf shape), it holds over three times a v5p chip's 95 GiB, so the guess is "
    "not what ran, and a step priced on it judges the guess, not the planner"
)


def _marin_v5p(transport: str, ep: int, seconds: float) -> MoeRun:
    """Marin's grug MoE trial shape on TPU v5p-256 (128 chips): d 4096, 48 layers, 64 heads of
    128 with 4 key/value heads, 128 routed experts of 3072 (top 4) and a shared expert of
    6144; batch 768; the EP axis 16 or 32 of the 128 chips. ``transport``:
    ``ragged_all_to_all`` (all-to-all dispatch and combine) or ``ring`` (an all-gather of the
    tokens and a psum-scatter back, which the planner does not price). EP 64 of both ran out
    of HBM; no step time was published for it. Listed, not judged: the trial does not publish
    its sequence length, recomputation or optimizer (:data:`_MARIN_V5P_CANNOT`); the measured
    order (EP 16 before EP 32, all-to-all before ring) is printed for a reader who can write
    it."""
    ring = (
        "; and ring expert parallelism, which the planner does not price"
        if transport == "ring"
        else ""
    )
    return MoeRun(
        f"Marin grug MoE d4096 E128 top-4, EP {ep} {transport}, v5p (128 chips)",
        _MARIN_V5P,
        None,
        "tpu-v5p",
        128,
        seconds,
        cannot=_MARIN_V5P_CANNOT + ring,
        sweep="Marin grug MoE d4096 E128 top-4 on v5p-256",
    )


_QWEN35 = (
    "AI-Hypercomputer/maxtext tests/end_to_end/tpu/perf_parity/"
    "RESULTS-qwen35-35b-ep-20260902.md@170776f (PR 5060), section 3, engine column"
)
#: Why none of the Qwen3.5 sweep's layouts can be written (the model's config:
#: src/maxtext/configs/models/qwen3.5-35b-a3b.yml@0c286e8).
_QWEN35_CANNOT = (
    "Gated DeltaNet linear attention in 3 of every 4 layers (decoder_block qwen3_5, "
    "inhomogeneous_layer_cycle_interval 4), 256 experts of 512: no preset, and the decoder "
    "has no linear attention; no TPU v7x (Ironwood) hardware preset; f32 compute and weights "
    "with SGD"
)


def _qwen35(layout: str, ms: float) -> MoeRun:
    """MaxText's Qwen3.5-35B-A3B on one TPU v7x-8 host (4 chips, 8 JAX devices): micro-batch 8
    of 1024, f32 compute and weights, ``remat_policy=none``, ``optax.sgd``; median of the last
    19 of 23 steps. ``layout``: the mesh and MoE kernel flags as the table writes them."""
    return MoeRun(
        f"MaxText Qwen3.5-35B-A3B {layout}, v7x-8",
        _QWEN35,
        None,
        "tpu-v7x",
        8,
        ms / 1000,
        cannot=_QWEN35_CANNOT,
        sweep="Qwen3.5-35B-A3B on TPU v7x-8",
    )


_MARIN_H100_ABL = "marin-community/marin issue 8046 (2026-08-07), its results table"
#: Why the H100 ablation pairs are listed and not judged.
_MARIN_H100_ABL_CANNOT = (
    "the downsized hero shape as its launcher writes it "
    "(experiments/grug/moe_hero_ep/small_scale_abl_launch.py@00d08ae, a later version than the "
    "runs': d768 8 layers of 6 heads, d1024 12 of 8, 128 routed experts top-4 as wide as the "
    "model, 192 from pull 8156, two shared) runs the routed experts in a latent space half the "
    "width with down and up projections (LatentMoE), with a short convolution and separate "
    "local and global key/value heads: no preset, and the decoder has none of them; the "
    "version that ran (branch rav/fsdp-vs-ep-smallabl) is not stored, and neither the issue "
    "nor the launcher sets the recomputation"
)


def _marin_h100_abl(rung: str, arm: str, tokens_per_s: float) -> MoeRun:
    """Marin's FSDP-against-EP ablation ladder on 16 H100 (2 nodes of 8): a rung of the grug
    MoE hero shape downsized to width ``rung``, batch 256 of 4096 (1,048,576 tokens a step,
    the issue's "EP16, batch 256, seq 4096"), capacity factor 2.5, 60x token budget; ``arm``
    ``EP16`` (experts over all 16 GPUs, fixed-capacity all-to-all) or ``FSDP`` (every device
    the whole bank, dropless). The step from the tokens a second. Listed, not judged
    (:data:`_MARIN_H100_ABL_CANNOT`); the measured order (FSDP before EP16 at both rungs) is
    printed for a reader who can write it."""
    return MoeRun(
        f"Marin grug MoE {rung} ablation, {arm}, 16 H100",
        _MARIN_H100_ABL,
        None,
        "h100",
        16,
        256 * 4096 / tokens_per_s,
        cannot=_MARIN_H100_ABL_CANNOT,
        sweep=f"Marin grug MoE {rung} ablation on 16 H100",
    )


_MARIN_E512 = "marin-community/marin issue 7332, comment of 2026-07-17 (EP vs non-EP at E512)"
#: Why the 512-expert sweep is listed and not judged.
_MARIN_E512_CANNOT = (
    "the thread publishes d4096, 32 layers, 512 experts top-8, sequence 8192, batch 128, bf16 "
    "and recompute_all, but not the heads, key/value heads, the experts' width, shared "
    "experts, vocabulary or where the optimizer state lives (no config or logbook of these "
    "runs is stored)"
)


def _marin_e512(arm: str, expert_axis: int, tokens_per_s: float) -> MoeRun:
    """Marin's 512-expert, top-8 grug MoE on one GB200 rack (64 GPUs), batch 128 of 8192
    (1,048,576 tokens a step), ``recompute_all``, bf16; the FSDP-EP spectrum by
    ``expert_axis_size``: EP1 (all 64 on the non-expert axes, the local ``sonic_cute``
    grouped GEMM) and EP 8, 16, 64 (``ragged_all_to_all`` with the QuACK local GEMM). The step
    from the tokens a second (rounded to thousands in the source). Listed, not judged
    (:data:`_MARIN_E512_CANNOT`); the measured order (EP 64, 16, 8, then EP1 2.4x slower) is
    printed for a reader who can write it."""
    return MoeRun(
        f"Marin grug MoE d4096 E512 top-8, {arm} (expert axis {expert_axis}), 64 GB200",
        _MARIN_E512,
        None,
        "b200",
        64,
        128 * 8192 / tokens_per_s,
        overrides=GB200_RACK,
        cannot=_MARIN_E512_CANNOT,
        sweep="Marin grug MoE d4096 E512 top-8 on 64 GB200",
    )


_MARIN_B200 = (
    "marin-community/marin issue 7012, comment of 2026-07-16 (EP backend measurements); "
    ".agents/logbooks/7012-b200-moe-mfu.md@0717914 (the row-13 config, B200MFU-017/-018)"
)
#: Why the single-node B200 sweep is listed and not judged.
_MARIN_B200_CANNOT = (
    "the row-13 config is published as d2560, 26 layers, 64 experts of 1280 (the logbook's "
    "microbenchmark shape) top-4, multi-head attention, MuonH, batch 128 of 4096, "
    "recompute_all, but not the head count, vocabulary, shared experts or where the optimizer "
    "state lives; and its expert-parallel arms move tokens by a ring (an all-gather and a "
    "psum-scatter, which the planner does not price) or by XLA's default one-shot ragged "
    "all-to-all kernel, 297 ms a call (B200MFU-018), not the all-to-all the planner prices"
)


def _marin_b200(arm: str, seconds: float) -> MoeRun:
    """Marin's grug MoE row-13 benchmark on one 8-GPU B200 node: EP1 with FSDP (the local
    ``sonic_cute`` grouped GEMM) against EP 2, 4 and 8 by ``ring`` and by
    ``ragged_all_to_all``, all arms in turn on the same node, 20 steps (8 warm-up), the
    steady median step. Listed, not judged (:data:`_MARIN_B200_CANNOT`); the measured order
    (EP1 first, ring 12-17% slower, ragged all-to-all 5-16x slower) is printed for a reader
    who can write it."""
    return MoeRun(
        f"Marin grug MoE d2560 row-13, {arm}, 8 B200",
        _MARIN_B200,
        None,
        "b200",
        8,
        seconds,
        cannot=_MARIN_B200_CANNOT,
        sweep="Marin grug MoE d2560 row-13 on 8 B200",
    )


_BIONEMO = "NVIDIA-BioNeMo/bionemo-framework recipes/mixtral_native_te/benchmarks"
#: The sweep's B200 and B300 tables, and how they were run (60 steps, each row the mean of the
#: reporting windows at steps 30, 40 and 50; Mixtral's pretrained weights on a pinned DCLM
#: sample, packed into one pack of ``token_micro_batch_size`` tokens a GPU).
_BIONEMO_SWEEP = (
    f"{_BIONEMO}/mixtral_8x7b_8xB200.csv@4fab9a3, mixtral_8x7b_8xB300.csv@f89103b; "
    f"README.md and benchmark_8xB200.sh@7949252"
)
#: Why the B200 sweep's rows are listed, their ranking judged by the nearest layouts, and not
#: counted.
_BIONEMO_B200_CANNOT = (
    "what a step of the table holds is not known: its recomputation and gradient accumulation "
    "are set in hydra_config/L1_8x7B_B200.yaml, which no stored version holds, and its own "
    "tokens a second times its step gives about 5,212 tokens a GPU a step in every row, not "
    "the 4,096 of its token_micro_batch_size (the B300 table's give its 16,384, and the DP 8 "
    "row of the recipe's AutoModel comparison, judged above, its 4,096)"
)
_BIONEMO_B300_CANNOT = "a B300: the planner has no B300 preset"


def _bionemo_mixtral(
    gpus: str, dp: int, ep: int, step_s: float, *, cannot: str = _BIONEMO_B200_CANNOT
) -> MoeRun:
    """BioNeMo's Mixtral 8x7B recipe (native PyTorch: Transformer Engine's layers and fused
    grouped MLP, FSDP2 over ``dp``, its own all-to-all over ``ep``) on one node of 8 GPUs, bf16,
    in the four ``(dp, ep)`` layouts its table runs: the decoder layers ``fully_shard``-ed over
    ``dp`` (the experts split over ``ep`` within them), the dense weights replicated over
    ``ep`` and their gradients all-reduced over it (``train_fsdp2_ep.py@f89103b``); ``dp=8``
    is plain FSDP, ``dp=1`` plain expert parallelism with no FSDP. The step as the table
    states it. The nearest layouts the planner writes: ``fsdp data=8``, ``fsdp_ep`` (its dense
    weights over ``data x expert``) and ``ep expert=8``; one pack of 4,096 a GPU, no
    recomputation. Listed, their ranking judged, not counted (:data:`_BIONEMO_B200_CANNOT`)."""
    if dp == 8:
        strategy, mesh = "fsdp", (("data", 8),)
    elif ep == 8:
        strategy, mesh = "ep", (("expert", 8),)
    else:
        strategy, mesh = "fsdp_ep", (("data", dp), ("expert", ep))
    b200 = gpus == "B200"
    return MoeRun(
        f"BioNeMo Mixtral 8x7B, DP {dp} x EP {ep}, 8 {gpus}",
        _BIONEMO_SWEEP,
        _preset("mixtral-8x7b", 8, 4096) if b200 else None,
        "b200",
        8,
        step_s,
        strategy if b200 else "",
        mesh if b200 else (),
        1,
        "none",
        cannot=cannot,
        sweep=f"Mixtral 8x7B on 8 {gpus}",
    )


def _bionemo_dp8(stack: str, step_s: float) -> MoeRun:
    """Mixtral 8x7B on 8 B200 under plain FSDP (``DP8``): the recipe's own program (``Native
    TE``) and NeMo AutoModel's run of Hugging Face's Mixtral (FlashAttention 2 over the packs,
    Transformers' ``grouped_mm`` experts, FSDP2; AutoModel's expert parallelism does not take
    Hugging Face's Mixtral), bf16, "exactly 32,768 tokens per optimizer step": a pack of 4,096 a
    GPU, "without gradient accumulation". Recomputation is not stated (AutoModel's 120.86 GiB a
    GPU is the planner's 122.7 without recomputation; 92 with it)."""
    return MoeRun(
        f"{stack} Mixtral 8x7B, FSDP 8, 8 B200",
        f"{_BIONEMO}/nemo_automodel/README.md@7b3212e, its measured 8xB200 table",
        _preset("mixtral-8x7b", 8, 4096),
        "b200",
        8,
        step_s,
        "fsdp",
        (("data", 8),),
        1,
        None,
        instead=(
            "uniform routing (the runs: Mixtral's pretrained router on DCLM text)",
            "every pack attends causally over its 4,096 tokens (the runs: the documents "
            "packed, each attending within itself)",
        ),
    )


#: Every held-out mixture-of-experts run, by source.
RUNS = [
    MoeRun(
        "AutoModel DeepSeek-V3, PP 4 x EP 64 x FSDP 256, 1024 H100",
        _AUTOMODEL,
        _preset("deepseek-v3", 8192, 4096, dispatch_once=True),
        "h100",
        1024,
        37.87,
        "fsdp_ep",
        (("stage", 4), ("data", 4), ("expert", 64)),
        32,
        _AUTOMODEL_AC,
        8,
        overrides=CUDNN,
        instead=("32 micro-batches in one pipeline flush (the run: 4 accumulations of 8)",),
    ),
    MoeRun(
        "AutoModel DeepSeek-V3, PP 4 x EP 64, 256 H100",
        _AUTOMODEL,
        _preset("deepseek-v3", 512, 4096, dispatch_once=True),
        "h100",
        256,
        8.18,
        "fsdp_ep",
        (("stage", 4), ("data", 1), ("expert", 64)),
        8,
        _AUTOMODEL_AC,
        8,
        overrides=CUDNN,
    ),
    MoeRun(
        "AutoModel Kimi K2, PP 8 x EP 32, 256 H100",
        _AUTOMODEL,
        _kimi_k2(512),
        "h100",
        256,
        8.86,
        "fsdp_ep",
        (("stage", 8), ("data", 1), ("expert", 32)),
        16,
        _AUTOMODEL_AC,
        4,
        overrides=CUDNN,
        instead=("16 micro-batches in one pipeline flush (the run: 2 accumulations of 8)",),
    ),
    _from_judged(calibration.JUDGED_ROWS[0], _AUTOMODEL),
    _from_judged(calibration.JUDGED_ROWS[1], _AUTOMODEL),
    _zoo_235b("TP2 EP32 PP8 VP4", 19.7, tp=2, ep=32, pp=8, vp=4, recompute="norm, act"),
    _zoo_235b(
        "TP2 EP32 PP8 VP4 +1F1B overlap",
        17.6,
        tp=2,
        ep=32,
        pp=8,
        vp=4,
        recompute="norm, act",
        ep_overlap=True,
    ),
    MoeRun(
        "Megatron Qwen3-235B TP2 EP8 FSDP, 256 H100",
        _ZOO,
        _preset("qwen3-235b-a22b", 2048, 4096, dispatch_once=True),
        "h100",
        256,
        17.6,
        # Megatron FSDP: the dense weights sharded over the attention's DP 128 (data x
        # expert), the experts over their EDP 32 (data), each expert whole over EP 8
        "fsdp_ep_fold_sp",
        (("data", 32), ("expert", 4), ("model", 2)),
        4,
        "full",
        overrides=CUDNN,
        sweep=ZOO_235B_SWEEP,
    ),
    _zoo_235b(
        "TP2 EP8 PP32 VP3 all-to-all",
        24.2,
        tp=2,
        ep=8,
        pp=32,
        vp=3,
        recompute="norm, act",
        deepep=False,
    ),
    _zoo_235b("TP4 EP8 PP8 VP4", 29.0, tp=4, ep=8, pp=8, vp=4, recompute="none"),
    MoeRun(
        "Megatron Qwen3-Next-80B-A3B, PP 4 x EP 32, 128 H100",
        _ZOO,
        None,
        "h100",
        128,
        2.2,
        cannot="Gated DeltaNet linear attention in 3 of 4 layers, 512 experts of 512: no "
        "preset, and the decoder has no linear attention",
    ),
    # the long-context table (:data:`_ZOO_LONG`): sequence 16384 at CP 1, written; CP 2 to 8 listed
    _zoo_235b(
        "TP4 EP8 PP8 VP4, sequence 16384",
        11.375,
        tp=4,
        ep=8,
        pp=8,
        vp=4,
        recompute="megatron:layernorm,moe",
        batch=256,
        seq=16384,
        source=_ZOO_LONG,
        sweep="",
    ),
    _zoo_long_cp(32768, 2, 27.438),
    _zoo_long_cp(65536, 4, 76.917),
    _zoo_long_cp(131072, 8, 247.554),
    # the GB200 table (:data:`_ZOO_GB200`): 8192 x 4096 x 148.03e9 / (256 x 750e12) = 25.871 s
    _zoo_235b(
        "TP1 EP8 PP8",
        25.871,
        tp=1,
        ep=8,
        pp=8,
        vp=1,
        recompute="none",
        batch=8192,
        gpu="GB200",
        source=_ZOO_GB200,
        exchange_sms=32,
        instead=(_ZOO_GRAPHS,),
        sweep=ZOO_235B_GB200_SWEEP,
    ),
    # the 25-step pair (mhep-009, mhep-010): the EP arm's dense weights FSDP over the same
    # 64 GPUs its experts are split over
    _marin_hero("EP 64", 316_473, "fsdp_ep", (("data", 1), ("expert", 64))),
    _marin_hero("FSDP 64 (control)", 235_125, "fsdp", (("data", 64),)),
    _bridge_gptoss("25.11", 512, 1, 5.82, remat="none"),
    _bridge_gptoss("26.02", 1280, 1, 13.669, remat=ZOO_NORM_ACT),
    # the fork's archive: 26.02.01 "DGX-H100 | 64 | BF16 | 1280 | 1 | 4096 | 0 | 1 | 4 | 1 | n/a |
    # 8 | 5984 | 163" (1280 x 4096 / (64 x 5984) = 13.690 s), 26.04 "... | 5810 | 158" (14.100
    # s), 26.04.01 "... | 5824 | 158" (14.066 s); the 26.06 archive has no GPT-OSS H100 row
    _bridge_gptoss("26.02.01", 1280, 1, 13.690, source=_BRIDGE_FORK, remat=ZOO_NORM_ACT),
    _bridge_gptoss("26.04", 1280, 1, 14.100, source=_BRIDGE_FORK, remat=ZOO_NORM_ACT),
    _bridge_gptoss("26.04.01", 1280, 1, 14.066, source=_BRIDGE_FORK, remat=ZOO_NORM_ACT),
    # 1024 x 4096 / (16 x 5113) = 51.27 s: the archive's 26.02 row (5113 tokens/s/GPU, 118
    # TFLOP/s/GPU, 23.1 GFLOP a token as every Qwen3-30B row; the NeMo fork's archive@52dfa15
    # repeats it). The 26.02 release's own page (docs/performance-summary.md@df0289c) printed
    # 2557 tokens/s/GPU beside the same 118 TFLOP/s/GPU (46 GFLOP a token, twice the model's):
    # the later archive's figure is the one the two columns agree on. The fork's archive,
    # 26.02.01: "DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 2 | 1 | 12 | 8 | 9058 | 208"
    # (1024 x 4096 / (16 x 9058) = 28.941 s), the 26.02 layout
    *(
        _bridge_qwen30_fp8(version, step, source, tp=1, pp=2, vp=12, ep=8)
        for version, step, source in (("26.02", 51.27, _BRIDGE), ("26.02.01", 28.941, _BRIDGE_FORK))
    ),
    _bridge_qwen3("25.11", "30B-A3B", 16, 512, 2, 24.848, tp=1, pp=2, vp=24, ep=8),
    _bridge_qwen3(
        "26.02",
        "235B-A22B",
        256,
        8192,
        1,
        80.265,
        tp=2,
        pp=8,
        vp=4,
        ep=32,
    ),
    # the fork's archive: 26.02.01 "DGX-H100 | 256 | FP8 | 8192 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 |
    # 32 | 1611 | 238" (8192 x 4096 / (256 x 1611) = 81.361 s), 26.04 "... | 1686 | 250" (77.741
    # s), 26.04.01 "... | 1712 | 253" (76.561 s): the H100 FP8_CS_V2 config
    # (:data:`_QWEN3_H100_CONFIGS`), all-to-all dispatch with moe_a2a_overlap
    *(
        _bridge_qwen3(
            version,
            "235B-A22B",
            256,
            8192,
            1,
            step,
            source=_BRIDGE_FORK_QWEN3,
            tp=2,
            pp=8,
            vp=4,
            ep=32,
        )
        for version, step in (("26.02.01", 81.361), ("26.04", 77.741), ("26.04.01", 76.561))
    ),
    _bridge_qwen3("25.11", "235B-A22B", 256, 2048, 1, 20.805, tp=2, pp=8, vp=4, ep=32),
    _bridge_qwen30_bf16(
        "all-to-all, no EP overlap",
        _PR3862,
        41.25,
        hybridep=False,
        ep_overlap=False,
        instead=(_UNFUSED_PERMUTE,),
    ),
    _bridge_qwen30_bf16(
        "all-to-all, EP overlap + delayed wgrad",
        _PR3862,
        31.20,
        hybridep=False,
        ep_overlap=True,
        instead=(_UNFUSED_PERMUTE,),
    ),
    _bridge_qwen30_bf16(
        "TP 2, all-to-all, EP overlap (about 60 s)",
        _PR3880_LAYOUT,
        60.0,
        hybridep=False,
        ep_overlap=True,
        tp=2,
        instead=(
            "sequence parallelism beside TP 2 (the source states TP 2 only)",
            "delayed expert weight gradients (the run's wgrad scheduling not stated)",
        ),
    ),
    _bridge_qwen30_bf16(
        "all-to-all, recompute moe_act",
        _PR3880_RECOMPUTE,
        41.79,
        hybridep=False,
        ep_overlap=False,
        remat="megatron:moe_act",
        instead=("TP 1, PP 1, EP 16, GBS 1024: the recipe's (the sweep states MBS 1 only)",),
    ),
    _bridge_qwen30_bf16(
        "all-to-all, recompute core_attn",
        _PR3880_RECOMPUTE,
        42.92,
        hybridep=False,
        ep_overlap=False,
        remat="megatron:core_attn",
        instead=("TP 1, PP 1, EP 16, GBS 1024: the recipe's (the sweep states MBS 1 only)",),
    ),
    _bridge_qwen30_bf16(
        "HybridEP, no EP overlap",
        _PR5094,
        24.714,
        hybridep=True,
        ep_overlap=False,
        instead=(_TE_GRAPHS,),
    ),
    _bridge_qwen30_bf16(
        "HybridEP with fused permute, EP overlap",
        _PR5123,
        20.147,
        hybridep=True,
        ep_overlap=True,
        instead=(
            _TE_GRAPHS,
            "delayed expert weight gradients (the run: delay_wgrad_compute=False)",
        ),
        # pull 5123: "Extend the recipe unit test to cover the tuned knobs and inherited
        # 32-SM HybridEP setting" (its "10-SM forward/backward LayerNorm margins" not priced)
        exchange_sms=32,
    ),
    # 26.04 (:data:`_BRIDGE_2604`, 29.451 s) and, in the fork's archive, its repeats: 26.04.01
    # "DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 1 | 1 | n/a | 16 | 8960 | 206" (1024 x
    # 4096 / (16 x 8960) = 29.257 s) and 26.06 "DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 1 | 1 |
    # 1 | n/a | 16 | 8826 | 203" (29.701 s): the 26.04 layout, its perf config read at 01b2977
    # (:data:`_QWEN3_H100_CONFIGS`: HybridEP, no A2A overlap)
    *(
        _bridge_qwen30_fp8(version, step, source, dispatch_once=True, tp=1, pp=1, vp=1, ep=16)
        for version, step, source in (
            ("26.04", 29.451, _BRIDGE_2604),
            ("26.04.01", 29.257, _BRIDGE_FORK_QWEN3),
            ("26.06", 29.701, _BRIDGE_FORK_QWEN3),
        )
    ),
    # Megatron-Bridge's Blackwell rows (the tables and configs: the block above
    # _bridge_qwen30_bf16): GPT-OSS 120B on 64 B200, then on 64 GB200
    _bridge_gptoss("25.11", 512, 4, 3.990, gpu="B200", pp=1, ep=8, config=_BRIDGE_BW_2511),
    _bw_gptoss("B200", "26.02", 10.180, 64, _BRIDGE_BW_GPTOSS_2602, source=_BRIDGE),
    _bw_gptoss("B200", "26.02.01", 5.970, 8, _BRIDGE_BW_GPTOSS_260201, hybridep=True),
    _bw_gptoss("B200", "26.04", 6.280, 8, _BRIDGE_BW_GPTOSS_2604),
    _bw_gptoss("B200", "26.04.01", 6.038, 8, _BRIDGE_BW_GPTOSS_2604),
    _bridge_gptoss(
        "25.11", 1280, 1, 10.320, gpu="GB200", pp=1, ep=64, seq=8192, config=_BRIDGE_BW_2511
    ),
    _bw_gptoss("GB200", "26.02", 5.190, 64, _BRIDGE_BW_GPTOSS_2602, source=_BRIDGE),
    _bw_gptoss(
        "GB200", "26.02.01", 5.200, 64, _BRIDGE_BW_GPTOSS_260201, hybridep=True, overlap=True
    ),
    _bw_gptoss("GB200", "26.04", 5.140, 64, _BRIDGE_BW_GPTOSS_2604, overlap=True),
    _bw_gptoss("GB200", "26.04.01", 4.923, 64, _BRIDGE_BW_GPTOSS_2604, overlap=True),
    # 8192 x 4096 / (256 x 4916) = 26.662 s
    _bridge_qwen3(
        "25.11",
        "235B-A22B",
        256,
        8192,
        1,
        26.662,
        source=f"{_BRIDGE}; {_BRIDGE_BW_2511}",
        gpu="GB200",
        precision="BF16",
        ep_overlap=False,
        tp=1,
        pp=8,
        vp=3,
        ep=32,
        instead=(
            "the all-to-all dispatcher and no A2A overlap (no stored perf config of this layout)",
        ),
        sweep=ZOO_235B_GB200_SWEEP,
    ),
    # 4096 x 4096 / (256 x 3139) = 20.878 s
    MoeRun(
        "Megatron-Bridge 25.11 DeepSeek-V3 BF16, PP 4 x EP 64, 256 GB200",
        f"{_BRIDGE}; {_BRIDGE_BW_2511}",
        _preset("deepseek-v3", 4096, 4096, **MEGATRON_WEIGHTING),
        "b200",
        256,
        20.878,
        "zero1_ep",
        (("stage", 4), ("data", 1), ("expert", 64)),
        64,
        None,
        4,
        overrides=GB200_RACK,
        cannot="the recipe's PP 4 x VP 4 layout puts the embedding and 4 layers in the first "
        "model chunk, 4 in each of the next 14 and 1 with the loss in the last "
        "(set_deepseek_v3_pipeline_model_parallel_layout, radixark/Megatron-Bridge "
        "src/megatron/bridge/recipes/deepseek/deepseek_v3.py@d063066), which the planner's "
        "split does not write; its optimizer keeps bf16 moments and gradients "
        "(use_precision_aware_optimizer); and no stored perf config states 25.11's dispatcher "
        "or recomputation (the stored GB200 ones, at GBS 2048, set HybridEP with "
        "recompute_modules mla_up_proj or mlp)",
    ),
    MoeRun(
        "MaxText Mixtral 8x22B, FSDP 64 x EP 4, v6e-256",
        f"{_RECIPES} trillium/Mixtral-8x22B-MaxText",
        _preset("mixtral-8x22b", 2048, 4096, capacity_factor=1.25),
        "tpu-v6e",
        256,
        24.706,
        "fsdp_ep",
        (("data", 64), ("expert", 4)),
        1,
        _offloaded("query_proj", "key_proj", "value_proj", "out_proj"),
    ),
    MoeRun(
        "MaxText DeepSeek-V3, FSDP 512, v5p (512 chips)",
        f"{_RECIPES} training/v5p/DeepSeek-v3 (MaxText 3eb77db)",
        _preset("deepseek-v3", 3072, 8192),
        "tpu-v5p",
        512,
        90.668,
        "fsdp",
        (("data", 512),),
        1,
        _offloaded("out_proj"),
    ),
    MoeRun(
        "MaxText Llama 4 Maverick, FSDP 32 x TP 4, v5p (128 chips)",
        f"{_RECIPES} training/v5p/Llama4-Maverick (tpu-recipes-v0.1.3)",
        None,
        "tpu-v5p",
        128,
        24.792,
        cannot="experts in every other layer (interleave_moe_layer_step 2) and 128 routed "
        "experts: no preset, and a mixture's dense layers can only come first",
    ),
    MoeRun(
        "MaxText Llama 4 Scout, FSDP 512, v5p (512 chips, derived)",
        f"{_RECIPES} training/v5p/Llama4-Scout (tpu-recipes-v0.1.3)",
        _preset("llama4-scout", 4096, 8192),
        "tpu-v5p",
        512,
        31.652,
        "fsdp",
        (("data", 512),),
        1,
        _offloaded(),
    ),
    _marin_v5p("ragged_all_to_all", 16, 27.4),
    _marin_v5p("ragged_all_to_all", 32, 30.1),
    _marin_v5p("ring", 16, 34.4),
    _marin_v5p("ring", 32, 39.6),
    _qwen35("fsdp 4 x tp 2", 2313.8),
    _qwen35("tp 2 x ep 4, ring of experts + ragged sort", 1726.9),
    _qwen35("ep 8", 1063.8),
    _qwen35("ep 8, ragged sort", 1047.6),
    _qwen35("ep 8, ring of experts", 720.1),
    _qwen35("ep 8, ring of experts + ragged sort", 670.3),
    _marin_h100_abl("d768", "EP16", 712_104),
    _marin_h100_abl("d768", "FSDP", 1_067_478),
    _marin_h100_abl("d1024", "EP16", 413_356),
    _marin_h100_abl("d1024", "FSDP", 752_313),
    _marin_e512("EP1", 1, 139_000),
    _marin_e512("EP8", 8, 288_000),
    _marin_e512("EP16", 16, 313_000),
    _marin_e512("EP64", 64, 330_000),
    _marin_b200("EP1 sonic_cute", 3.28),
    _marin_b200("EP2 ring", 3.73),
    _marin_b200("EP4 ring", 3.69),
    _marin_b200("EP8 ring", 3.85),
    _marin_b200("EP2 ragged_all_to_all", 51.0),
    _marin_b200("EP4 ragged_all_to_all", 27.3),
    _marin_b200("EP8 ragged_all_to_all", 15.6),
    _bionemo_dp8("BioNeMo", 0.938),
    _bionemo_dp8("AutoModel", 0.956),
    _bionemo_mixtral("B200", 8, 1, 1.237),
    _bionemo_mixtral("B200", 4, 2, 1.013),
    _bionemo_mixtral("B200", 2, 4, 0.962),
    _bionemo_mixtral("B200", 1, 8, 1.083),
    _bionemo_mixtral("B300", 8, 1, 2.083, cannot=_BIONEMO_B300_CANNOT),
    _bionemo_mixtral("B300", 4, 2, 1.890, cannot=_BIONEMO_B300_CANNOT),
    _bionemo_mixtral("B300", 2, 4, 1.897, cannot=_BIONEMO_B300_CANNOT),
    _bionemo_mixtral("B300", 1, 8, 2.457, cannot=_BIONEMO_B300_CANNOT),
]


def estimate_run(run: MoeRun, *, nearest: bool = False) -> tuple[Screened, str]:
    """``run`` as it ran by the analytic estimate (``nearest``: the nearest layout the
    planner writes, for a run it cannot write), with the recomputation it was planned with
    (:data:`UNSTATED` where the source does not state one)."""
    if (run.cannot and not nearest) or run.config is None or not run.strategy:
        raise ShardscopeError(run.cannot)
    remat = run.remat or UNSTATED
    c = Candidate(
        run.strategy,
        run.mesh,
        run.microbatches,
        remat,
        offload_optimizer=run.offload_optimizer,
        virtual_stages=run.virtual_stages,
        pipeline_split=run.pipeline_split,
    )
    return (
        estimate(
            c,
            run.config,
            run.hw(),
            matmul_dtype=run.matmul_dtype,
            fp8_saved_inputs=run.fp8_saved_inputs,
            fp8_params=run.fp8_params,
        ),
        remat,
    )


_BEST: dict[tuple[Any, ...], Screened | None] = {}
#: A best plan faster than the run as written by more than this says why, part by part.
WHY_BEYOND = 0.12


def best_plan(run: MoeRun) -> Screened | None:
    """The planner's fastest plan that fits for ``run``'s model, devices, batch and
    hardware (the estimate's screen); None where nothing fits or there is no model."""
    if run.config is None:
        return None
    key = (
        run.config,
        run.devices,
        run.hardware,
        tuple(sorted((run.overrides or {}).items())),
        run.matmul_dtype,
        run.fp8_saved_inputs,
        run.fp8_params,
    )
    if key not in _BEST:
        ranked, _, _ = screen_all(
            run.config,
            run.devices,
            run.hw(),
            MOE_STRATEGIES,
            matmul_dtype=run.matmul_dtype,
            fp8_saved_inputs=run.fp8_saved_inputs,
            fp8_params=run.fp8_params,
        )
        _BEST[key] = next((s for s in ranked if s.fits), None)
    return _BEST[key]


@dataclass
class Row:
    run: MoeRun
    written: Screened | None
    remat: str
    best: Screened | None
    why_not: str = ""
    #: the nearest layout the planner writes, for a run it cannot write as it ran
    nearest: Screened | None = None

    @property
    def predicted(self) -> Screened | None:
        """The run as written, or else the nearest layout."""
        return self.written or self.nearest

    @property
    def error(self) -> float | None:
        """The run as written: predicted / measured - 1."""
        return None if self.written is None else self.written.time.step_s / self.run.measured_s - 1

    @property
    def best_error(self) -> float | None:
        return None if self.best is None else self.best.time.step_s / self.run.measured_s - 1


def judge(runs: list[MoeRun]) -> list[Row]:
    out = []
    for run in runs:
        best = best_plan(run)
        try:
            written, remat = estimate_run(run)
        except ShardscopeError as e:
            near = None
            if run.config is not None and run.strategy:
                near, remat = estimate_run(run, nearest=True)
            out.append(Row(run, None, "", best, str(e), near))
            continue
        out.append(Row(run, written, remat, best))
    return out


def _layout(s: Screened) -> str:
    c = s.candidate
    v = f" v{c.virtual_stages}" if c.virtual_stages > 1 else ""
    off = " host-optimizer" if c.offload_optimizer else ""
    return f"{c.strategy} {c.mesh_spec} m{c.microbatches} {c.remat}{v}{off}"


def _table(rows: list[Row]) -> None:
    print(
        f"{'run':62} {'measured':>9} {'written':>9} {'error':>7} {'memory':>11}  "
        f"{'best':>8} {'error':>7}  best layout"
    )
    for r in rows:
        run = r.run
        best = (
            f"{r.best.time.step_s:>7.2f}s {r.best_error:>+7.1%}  {_layout(r.best)}"
            if r.best is not None
            else "-"
        )
        if r.written is None:
            print(f"{run.name:62} {run.measured_s:>8.2f}s {'-':>9} {'-':>7} {'-':>11}  {best}")
            print(f"{'':64}not expressible: {r.why_not}")
            if r.nearest is not None:
                n = r.nearest
                print(
                    f"{'':64}nearest written, not counted: {_layout(n)} {n.time.step_s:.2f}s "
                    f"({n.time.step_s / run.measured_s - 1:+.1%})"
                )
            continue
        s = r.written
        print(
            f"{run.name:62} {run.measured_s:>8.2f}s {s.time.step_s:>8.2f}s {r.error:>+7.1%} "
            f"{s.memory.total / GIB:>5.1f}/{s.memory_limit_bytes / GIB:.0f}G{'' if s.fits else '!'}"
            f"  {best}"
        )
        said = list(run.instead)
        if run.remat is None:
            said.append(f"recomputation not stated: {r.remat} (the frameworks' default)")
        for what in said:
            print(f"{'':64}planned with {what}")
        if not s.fits:
            print(f"{'':64}misfit: {training_heldout.misfit_cause(s)}")
        elif r.best is not None and r.best.time.step_s < (1 - WHY_BEYOND) * s.time.step_s:
            print(f"{'':64}why: {beside_best_note(s, r.best)}")


def _stats(errors: list[float]) -> str:
    size = sorted(abs(e) for e in errors)
    within = ", ".join(
        f"{sum(e <= w for e in size)} within {w:.0%}" for w in training_heldout.WITHIN
    )
    return (
        f"{len(errors)} runs, median |error| {statistics.median(size):.1%}, signed median "
        f"{statistics.median(errors):+.1%}, worst {size[-1]:.1%}, {within}"
    )


def _summary(title: str, rows: list[Row]) -> None:
    written = [r.error for r in rows if r.error is not None]
    # the best plan is judged on the runs judged as written: a step whose contents are not
    # known judges neither
    best = [r.best_error for r in rows if r.error is not None and r.best_error is not None]
    misfits = sum(1 for r in rows if r.written is not None and not r.written.fits)
    cannot = sum(1 for r in rows if r.written is None)
    if written:
        print(
            f"{title}, as written: {_stats(written)}; {misfits} called misfits on the "
            f"hardware they ran on; {cannot} not expressible"
        )
    if best:
        print(f"{title}, best plan: {_stats(best)}")


#: The software each run's name opens with ran it: NeMo AutoModel's GPT-OSS rows are named
#: as ``calibration.py`` names them ("NeMo"), the Megatron MoE model zoo's as "Megatron".
_FRAMEWORKS = {
    "AutoModel": "NeMo AutoModel",
    "NeMo": "NeMo AutoModel",
    "Megatron": "Megatron-Core (the MoE model zoo)",
    "Megatron-Bridge": "Megatron-Bridge",
    "Marin": "Marin (JAX)",
    "MaxText": "MaxText",
    "BioNeMo": "BioNeMo's Mixtral recipe (FSDP2, Transformer Engine)",
}


def _framework(run: MoeRun) -> str:
    """The software that ran ``run`` (:data:`_FRAMEWORKS`, by its name's first word);
    Megatron-Bridge's Blackwell rows and the model zoo's GB200 row apart from their H100
    ones."""
    framework = _FRAMEWORKS[run.name.split()[0]]
    if framework == "Megatron-Bridge" and run.hardware == "b200":
        return f"{framework} on Blackwell (B200 and GB200)"
    if framework == _FRAMEWORKS["Megatron"] and run.hardware == "b200":
        return f"{framework} on GB200"
    return framework


def _ranking(rows: list[Row]) -> None:
    """Each published sweep's layouts, ranked as measured beside as predicted."""
    sweeps: dict[str, list[Row]] = {}
    for r in rows:
        if r.run.sweep:
            sweeps.setdefault(r.run.sweep, []).append(r)
    for name, group in sweeps.items():
        print(
            f"\nThe {name} sweep, fastest first (measured | predicted as written, or the "
            f"nearest layout)"
        )
        measured = sorted(group, key=lambda r: r.run.measured_s)
        timed = [(r.predicted.time.step_s, r) for r in group if r.predicted is not None]
        predicted = sorted(timed, key=lambda x: x[0])
        for i in range(len(measured)):
            m = measured[i]
            left = f"{m.run.measured_s:6.1f}s {m.run.name}"
            right = ""
            if i < len(predicted):
                t, p = predicted[i]
                right = f"{t:6.1f}s {p.run.name}" + ("" if p.written else " (nearest)")
            print(f"  {left:62} | {right}")
        # each pair of layouts the measurements order (not tied): ordered alike predicted?
        pairs = [(a, b) for a in timed for b in timed if a[1].run.measured_s < b[1].run.measured_s]
        if not pairs:
            print("  the planner writes none of these runs: no ranking to judge")
            continue
        alike = sum(1 for a, b in pairs if a[0] < b[0])
        # runs the planner writes alike (one layout in two releases) are predicted equal
        tied = sum(1 for a, b in pairs if a[0] == b[0])
        order = "matches" if alike == len(pairs) else "does not match"
        print(
            f"  the ranking {order} the measured one: {alike} of the {len(pairs)} pairs the "
            f"measurements order are ordered alike"
            + (f" ({tied} of them predicted equal)" if tied else "")
        )
        # the planner's best for the fastest run's model (a sweep's rows may differ in what
        # the planner takes as part of the model: a dispatcher, the matmuls' precision)
        best = measured[0].best
        if best is not None:
            fastest = measured[0].run.measured_s
            print(
                f"  the planner's best: {best.time.step_s:.1f}s {_layout(best)}, "
                f"{best.time.step_s / fastest - 1:+.1%} against the fastest that ran "
                f"({fastest:.1f}s)"
            )


def _calibration() -> None:
    """``calibration.py``'s mixtures (set 3) as written and at the planner's best, and the
    judged GPT-OSS rows (the same runs as this table's AutoModel GPT-OSS rows)."""
    for title, rows in (("calibration set 3 (MOE_ROWS)", calibration.MOE_ROWS),):
        written, best = [], []
        for row in rows:
            s, m = calibration._estimate(row)
            written.append(s.time.step_s / row.measured_s - 1)
            run = MoeRun(
                row.name,
                "",
                row.config,
                row.hardware,
                _devices(row.mesh),
                row.measured_s,
                overrides=row.overrides,
            )
            b = best_plan(run)
            best_s = f"{b.time.step_s:.2f}s {_layout(b)}" if b else "nothing fits"
            if b:
                best.append(b.time.step_s / row.measured_s - 1)
            print(
                f"  {row.name:50} measured {row.measured_s:.2f}s written {s.time.step_s:.2f}s "
                f"({written[-1]:+.1%}) best {best_s}" + (f" ({best[-1]:+.1%})" if b else "")
            )
        print(f"{title}, as written: {_stats(written)}")
        if best:
            print(f"{title}, best plan: {_stats(best)}")


def _devices(mesh: tuple[tuple[str, int], ...]) -> int:
    n = 1
    for _, size in mesh:
        n *= size
    return n


def _note_check(rows: list[Row]) -> None:
    """Whether the figures every mixture's plan quotes (its ``mixture-step`` note:
    :class:`~shardscope._src.plan.notes.MixtureStepValues`) are this run's, at the note's
    precision."""
    written = [r.error for r in rows if r.error is not None]
    best = [r.best_error for r in rows if r.error is not None and r.best_error is not None]
    here = MixtureStepValues(
        runs=len(written),
        signed_median=round(statistics.median(written), 3),
        within_25=sum(abs(e) <= 0.25 for e in written),
        fastest=round(min(written), 3),
        slowest=round(max(written), 3),
        best_signed_median=round(statistics.median(best), 3),
    )
    if here == MixtureStepValues():
        print("the plans' mixture-step note quotes these figures")
    else:
        print(
            f"the plans' mixture-step note quotes {MixtureStepValues().to_dict()}, this run "
            f"gives {here.to_dict()}: update MixtureStepValues (shardscope/_src/plan/notes.py)"
        )


def main() -> None:
    t0 = time.perf_counter()
    rows = judge(RUNS)
    print("Held out: mixtures of experts\n")
    _table(rows)
    _ranking(rows)
    print()
    _summary("held out", rows)

    # a GB200 run is a B200 with the rack's figures; the B200 runs are DGX-B200 nodes of 8
    def rack(r: MoeRun) -> bool:
        return (r.overrides or {}).items() >= GB200_RACK.items()

    for title, kept in (
        ("held out, H100", lambda r: r.hardware == "h100"),
        ("held out, GB200", lambda r: r.hardware == "b200" and rack(r)),
        ("held out, B200", lambda r: r.hardware == "b200" and not rack(r)),
        ("held out, TPU", lambda r: r.hardware.startswith("tpu-")),
    ):
        _summary(title, [r for r in rows if kept(r.run)])
    # the software that ran them: one layout's step moves with it (the Qwen3-30B-A3B sweep)
    for framework in dict.fromkeys(_framework(r.run) for r in rows):
        _summary(f"held out, {framework}", [r for r in rows if _framework(r.run) == framework])
    _note_check(rows)
    print("\nCalibration (CALIBRATION.md set 3), apart")
    _calibration()
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
