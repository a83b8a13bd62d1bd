"""Hardware presets for time and memory estimates, from vendor datasheets and the scaling book.

Every number is an estimate input a user can override; ``source`` says where it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from shardscope._src.base.errors import ShardscopeError
from shardscope._src.base.records import Record

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Hardware(Record):
    """One accelerator, as the planner's alpha-beta and roofline estimates see it.

    Attributes:
      name: preset name (``"h100"``).
      peak_flops: dense bf16 FLOP/s per device.
      memory_bytes: device memory (HBM) in bytes.
      link_bandwidth: bytes/s one device can send in a collective over one mesh axis (the
        ``B`` of the alpha-beta model).
      latency_s: per-step latency of a collective (the ``alpha``).
      cross_node_bandwidth: bytes/s per device once a collective leaves a node or slice.
      node_size: devices in one node (GPU) or one slice (TPU) with the fast links.
      source: where the numbers come from.
      hbm_bandwidth: bytes/s between the device and its memory (datasheet).
      hbm_fraction: the fraction of ``hbm_bandwidth`` matmuls reach reading their operands
        from HBM (a decode step's weights and cache, a mixture's experts; see
        :data:`TIME_MODEL_SOURCES`), whatever a kernel's size, where ``hbm_by_size`` is off;
        element-wise work streams at the full bandwidth.
      hbm_by_size: a matmul kernel moves its bytes at ``hbm_bandwidth`` plus the start and
        ramp measured for a transfer of its size
        (:func:`~shardscope._src.cost.compute.read_seconds_per_byte`: a few MiB at about a
        third of the bandwidth, a GiB at all of it) instead of at ``hbm_fraction`` of it; on
        by default on GPUs, off where ``hbm_fraction`` is given (see
        :data:`TIME_MODEL_SOURCES`).
      matmul_fraction: the fraction of ``peak_flops`` a transformer layer's matmuls reach
        (see :data:`TIME_MODEL_SOURCES`).
      matmul_by_shape: a mixture's routed experts' matmuls (a layer's experts on a device,
        each a matmul of its own tokens) run at ``matmul_fraction`` times the share of a large
        matmul's throughput measured on an H100 for their shape
        (:func:`~shardscope._src.cost.compute.measured_efficiency`: a few hundred tokens an
        expert at about half); on the H100 and the H200 (the H100's die), whose compiler
        target the measurements are of; off elsewhere: at ``matmul_fraction`` whatever their
        shape (see :data:`TIME_MODEL_SOURCES`).
      comm_fraction: achieved collective bandwidth over the link's (bus bandwidth measured
        by nccl-tests over the line rate).
      tp_overlap: the program overlaps tensor-parallel collectives with the matmuls they
        feed (TPU: XLA's collective matmuls, "windowed einsums", scaling book part 3); on
        GPUs they stay on the critical path unless set (Transformer Engine's
        ``ub_tp_comm_overlap``, as NeMo's recipes run: see :data:`TIME_MODEL_SOURCES`), and
        then hold their share of the multiprocessors while they run.
      pp_overlap: the program sends a pipeline stage's activations and gradients on while
        it computes the next chunk in the steady 1F1B phase (Megatron's
        ``overlap_p2p_comm``), so only the transfers of the pipeline's fill and flush are
        on the critical path; off unless set, on every device: each transfer then waits
        for its chunk (see :data:`TIME_MODEL_SOURCES`).
      ep_overlap: the program runs a mixture's expert all-to-alls (its dispatch and
        combine) beside another micro-batch's compute: Megatron's combined 1F1B schedule
        (``overlap_moe_expert_parallel_comm``) pairs each forward chunk of the steady
        phase with another micro-batch's backward chunk, each all-to-all of a layer
        beside the one sub-module of the other the schedule pairs it with (what it
        outlasts that by is on the critical path), and the all-to-alls of the chunks that
        run alone (a pipeline's fill and flush; without one, the first forward and the
        last backward) wait; off unless set, on every device (see
        :data:`TIME_MODEL_SOURCES`).
      fsdp_overlap: the program gathers a layer's FSDP-sharded weights and reduce-scatters
        their gradients beside compute (frameworks prefetch the next layer's gathers and
        reduce the last layer's gradients during the next one's backward), so they add
        only what the micro-batch's forward and backward do not cover; on unless unset,
        on every device. Unset: they run alone, on the critical path, as a JAX program's
        scanned layers run them under XLA's default GPU flags (see
        :data:`TIME_MODEL_SOURCES`).
      host_memory_bytes: the host's memory per device (the host's DRAM over its devices),
        where activations offloaded by ``remat="offload"`` live; 0: no offload.
      host_bandwidth: bytes/s one device moves to or from host memory, each way (PCIe).
      fp8_peak_flops: dense fp8 (E4M3) FLOP/s per device (datasheet); 0: the device has no
        fp8 matmul units, and a plan with ``matmul_dtype="fp8"`` is refused.
      fp8_matmul_fraction: the fraction of ``fp8_peak_flops`` a transformer layer's fp8
        matmuls reach (see :data:`TIME_MODEL_SOURCES`).
      attention_fwd_flops, attention_bwd_flops: the FLOP/s a fused causal attention
        kernel's forward and backward reach, counted as FlashAttention counts them (causal
        FLOPs, half the non-causal; the backward 2.5 times the forward's), for a program
        that runs that kernel (:data:`H100_ATTENTION_KERNELS` lists measured ones); 0: the
        attention core at the matmul rate, counted non-causal, as ``matmul_fraction`` was
        calibrated (on an H100 about a FlashAttention-2 kernel's rate).
      kernel_launch_s: seconds a compiled serving step pays for each kernel it launches,
        beside its traffic and its matmuls (a decode step of a few milliseconds launches
        hundreds); 0 on a TPU, which runs a compiled program as one executable.
      kernel_floor_s: the least a GPU kernel runs however little it does (a norm, a
        rotary embedding, an activation of a few tokens): a kernel takes the longer of its
        work and this, beside its launch; 0 on a TPU (see :data:`TIME_MODEL_SOURCES`).
      sms: the streaming multiprocessors of a GPU (datasheet), over which a matmul's output
        tiles run one a multiprocessor in waves (:func:`~shardscope._src.cost.compute.
        gemm_efficiency`); 0 on a TPU, whose matmuls are priced at ``matmul_fraction``
        whatever their shape.
      tile_m, tile_n: the output tile one multiprocessor computes of a GPU matmul (rows of
        its tokens by columns of its weights; see :data:`TIME_MODEL_SOURCES`).
      comm_sms, comm_sms_net: the multiprocessors a large collective holds while it runs
        (NCCL's channels, one thread block and one multiprocessor each), inside a node and
        across nodes: compute running beside it has the rest
        (:func:`~shardscope._src.cost.compute.overlap_seconds`; see
        :data:`TIME_MODEL_SOURCES`). 0 on a TPU, whose transfers are DMAs beside its cores.
      runtime_memory_bytes: the device memory its runtime reports as the whole
        (``torch.cuda.mem_get_info``'s total: what a serving engine takes its share of,
        :class:`~shardscope._src.targets.engines.MemoryRule`); 0: ``memory_bytes`` (a TPU,
        or a preset whose ``memory_bytes`` is overridden; see
        :data:`~shardscope._src.targets.engines.ENGINE_SOURCES`).
      exchange_sms: the multiprocessors a mixture's dispatch and combine (its all-to-alls)
        hold while they run beside compute, where DeepEP or HybridEP runs them with the
        multiprocessors it is configured to take rather than NCCL's channels; 0: NCCL's
        (``comm_sms``, ``comm_sms_net``), as every other collective (see
        :data:`TIME_MODEL_SOURCES`). 0 on a TPU.
      tf32_peak_flops: dense TF32 tensor-core FLOP/s per device (datasheet), the rate of a
        compiled program's f32 matmuls at JAX's DEFAULT or HIGH precision on a GPU, which
        reach ``matmul_fraction`` of it as 16-bit ones of ``peak_flops``; 0: f32 matmuls
        as a TPU runs them (passes of bf16 at ``peak_flops``), or, on a GPU, at
        ``peak_flops`` (see :data:`TIME_MODEL_SOURCES`).
      fp32_peak_flops: dense fp32 FLOP/s per device, without tensor cores (datasheet), the
        rate of a GPU's f32 matmuls at precision HIGHEST, at ``matmul_fraction`` of it; 0:
        at ``tf32_peak_flops``'s rate (a TPU: six bf16 passes).
    """

    name: str
    peak_flops: float
    memory_bytes: float
    link_bandwidth: float
    latency_s: float
    cross_node_bandwidth: float
    node_size: int
    source: str
    hbm_bandwidth: float = 3.35e12
    matmul_fraction: float = 0.585
    comm_fraction: float = 0.8
    tp_overlap: bool = False
    pp_overlap: bool = False
    ep_overlap: bool = False
    fsdp_overlap: bool = True
    host_memory_bytes: float = 0.0
    host_bandwidth: float = 0.0
    fp8_peak_flops: float = 0.0
    fp8_matmul_fraction: float = 0.0
    attention_fwd_flops: float = 0.0
    attention_bwd_flops: float = 0.0
    kernel_launch_s: float = 0.0
    kernel_floor_s: float = 0.0
    hbm_fraction: float = 1.0
    hbm_by_size: bool = False
    matmul_by_shape: bool = False
    sms: int = 0
    tile_m: int = 128
    tile_n: int = 128
    comm_sms: int = 0
    comm_sms_net: int = 0
    exchange_sms: int = 0
    runtime_memory_bytes: float = 0.0
    tf32_peak_flops: float = 0.0
    fp32_peak_flops: float = 0.0

    @property
    def runtime_memory(self) -> float:
        """The device memory its runtime reports (``runtime_memory_bytes``, or
        ``memory_bytes`` where that is 0).

        >>> hardware("h100").runtime_memory / GIB
        79.11
        >>> hardware("h100", memory_bytes=40e9).runtime_memory
        40000000000.0
        """
        return self.runtime_memory_bytes or self.memory_bytes

    @property
    def has_fp8(self) -> bool:
        """Whether the device runs fp8 matmuls (it has an fp8 rate and a fraction of it)."""
        return self.fp8_peak_flops > 0 and self.fp8_matmul_fraction > 0


#: Where the time model's constants come from (the same for every preset of a family).
TIME_MODEL_SOURCES = {
    "matmul_fraction (A100) 0.585": (
        "calibrated on Narayanan et al. 2021 (arXiv 2104.04473) Table 1, the four A100 GPT "
        "runs without pipelining (137-142 of 312 TFLOP/s per GPU with recomputation, "
        "communication and element-wise work included), each planned at its configuration: "
        "the value at which the screening estimate's mean error over the four is zero "
        "(-2.7%, -1.2%, +2.5%, +1.5%); 0.673 of the A100's best matmul (271.2 of 312 "
        "TFLOP/s, 86.9%). Fitted before the multiprocessors a hidden collective holds were "
        "priced (comm_sms): with them the four are -2.4%, -0.7%, +3.5%, +2.3% (mean +0.7%), "
        "not fitted again"
    ),
    "matmul_fraction (H100, H200) 0.54, (B200) 0.52": (
        "the A100's 0.585 scaled by each GPU's maximum achievable matmul FLOPS against its "
        "datasheet peak, measured by one benchmark on all of them (stas00/ml-engineering, "
        "compute/accelerator, MAMF table, bf16: A100 SXM 86.9%, H100 SXM 80.3% with 'H200 "
        "is the same', B200 SXM 77.6%): 0.585 x 80.3 / 86.9 and 0.585 x 77.6 / 86.9"
    ),
    "matmul_fraction (TPU) 0.75": (
        "MaxText (github.com/AI-Hypercomputer/maxtext) reports 55-70% model FLOPs "
        "utilization for dense LLM training on v5p and v6e, communication and element-wise "
        "work included"
    ),
    "fp8_peak_flops": (
        "dense fp8 (E4M3) tensor-core FLOP/s from the datasheets (without sparsity): H100 and "
        "H200 SXM 1979 TFLOP/s, HGX B200 4500; the A100 has no fp8 tensor cores (0); the "
        "Cloud TPU docs list bf16 and int8 rates for v5e (int8 393 TOPs), v5p (bf16 459) and "
        "v6e (int8 1836 TOPs) and no fp8 rate (0)"
    ),
    "tf32_peak_flops (A100 156, H100 and H200 494.5, B200 1100 TFLOP/s), fp32_peak_flops "
    "(A100 19.5, H100 and H200 67, B200 75)": (
        "what a compiled program's f32 matmuls run as: JAX's 'Matmul precision' page "
        "(jax-ml/jax docs/201/precision.md@151feb1): 'float32 dot products may be computed "
        "with reduced-precision arithmetic internally (bfloat16 on TPU, TF32 on recent "
        "GPUs)'; Precision.DEFAULT 'On TPU, computes in bfloat16; on GPU, uses TF32 where "
        "available', HIGH 'On TPU, three bfloat16 passes; on GPU, TF32', HIGHEST 'On TPU, "
        "six bfloat16 passes; on GPU, true float32' (an HLO dot's operand_precision). The "
        "rates, dense (without sparsity), from NVIDIA's datasheets: A100 SXM 'TF32 156 | "
        "312' (dense | sparse) and FP32 19.5 TFLOP/s (the A100 datasheet's table as "
        "glennklockwood.com/garden/processors/A100 copies it); H100 SXM 'TF32 Tensor Core "
        "989 TFLOPS*', 'FP32 67 TFLOPS', '* Shown with sparsity. Specifications 1/2 lower "
        "without sparsity' (NVIDIA's H100 table as archive-lib.hpctech.co.jp/gpuproduct/"
        "nvidia-h100.html copies it: 494.5 dense); the H200 the H100's die and clocks "
        "(FP32 66.91 TFLOP/s, hmc-tech.com); HGX B200 'TF32 Tensor Core ... 2.2 PFLOPS' "
        "(with sparsity) and 'FP32 ... 75 TFLOPS' a GPU (NVIDIA's HGX table as "
        "zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html copies it; "
        "glennklockwood.com/garden/processors/B200 gives the HGX B200 'TF32 | 1100 | "
        "2200', dense and sparse, and FP32 80). Each at matmul_fraction of it, as 16-bit "
        "matmuls of peak_flops: no published TF32 or FP32 layer measurement was found to "
        "calibrate a fraction of its own. TPUs 0: an f32 matmul there is one, three or six "
        "bf16 passes at peak_flops x matmul_fraction (DEFAULT, HIGH, HIGHEST; the page's "
        "dot algorithms, 'BF16_BF16_F32_X3, _X6, _X9 ... that many bfloat16 operations ... "
        "at proportionally higher cost'). A product given a dot algorithm (the HLO's "
        "algorithm=) is priced by its operands and precision alone"
    ),
    "fp8_matmul_fraction (H100) 0.48, (H200) 0.49, (B200) 0.51": (
        "the bf16 calibration carried over: 0.673 (= 0.585 / 0.869, the A100's layer "
        "matmuls over its best matmul) times each GPU's fp8 maximum achievable matmul FLOPS "
        "over its datasheet fp8 peak (stas00/ml-engineering, compute/accelerator, MAMF "
        "table, FP8 float8_e4m3fn: H100 SXM 1402.6 of 1979, 70.9%; H200 SXM 1453.4 of 1979, "
        "73.4%; B200 SXM 3432.5 of 4500, 76.3%): 0.585 x 70.9 / 86.9, 0.585 x 73.4 / 86.9, "
        "0.585 x 76.3 / 86.9"
    ),
    "fp8 weights cast once a step with Transformer Engine (fp8_saved_inputs='fp8')": (
        "TransformerEngine transformer_engine/pytorch/module/linear.py@3ec8787, Linear.forward: "
        "is_first_microbatch 'allows caching of the FP8 versions of the weights' (2.x: "
        "get_weight_workspace(cache_name='weight', update_workspace=is_first_microbatch)), the "
        "backward reading the cached transpose; Megatron-Core's TELinear.forward passes "
        "is_first_microbatch unless disable_parameter_transpose_cache, and its schedules' "
        "forward_step calls model.set_is_first_microbatch() on each model chunk's first "
        "micro-batch. The cast (csrc/quantizer.cpp@0064fbd, "
        "Float8CurrentScalingQuantizer::quantize_impl): an amax kernel reading the 16-bit "
        "weight, then one cast reading it again and writing the fp8 copy and, on Hopper (no "
        "non-TN fp8 matmul: need_transpose), its transpose: 2 x 2 + 2 bytes an element once "
        "a step, where torchao's Float8Linear (torchtitan) casts the weights in every "
        "forward and backward (2 x 2 + 1 bytes each)"
    ),
    "comm_fraction 0.8": (
        "nccl-tests all-reduce bus bandwidth ~370 GB/s on NVLink 4's 450 (NCCL issue 1264), "
        "~230-240 GB/s on A100 NVLink 3's 300; the same fraction for the network and ICI"
    ),
    "an all-to-all across nodes at each device's own card (cost.links.exchange_bandwidth)": (
        "DeepEP (deepseek-ai/DeepEP docs/legacy.md@0297fc8, V1 normal kernels on H800, each GPU "
        "with a CX7 InfiniBand 400 Gb/s card, ~50 GB/s): internode dispatch and combine reach a "
        "bottleneck RDMA bandwidth of 43 GB/s at EP 16, 58 and 57 at EP 32, 51 and 50 at EP 64 "
        "a GPU, the card's rate, not a node's 8 cards (intranode EP 8: 153 and 158 GB/s of "
        "~160 over NVLink): each device's bytes for other nodes leave through its own card, at "
        "cross_node_bandwidth x comm_fraction (40 GB/s on a DGX-H100's 50)"
    ),
    "hbm_bandwidth": "vendor datasheets (NVIDIA A100/H100/H200/B200; Cloud TPU v5e/v5p/v6e)",
    "hbm_by_size (GPUs): cost.compute.H100_HBM_BY_SIZE": (
        "XLA's GPU cost model for matmuls (openxla/xla xla/service/gpu/model/"
        "gpu_dot_fusion_cost_model.cc@06815fa, GetEffectiveHbmBandwidth and CalculateHbmTime): "
        "a matmul's reads and writes move at the bandwidth measured on an H100 for that many "
        "bytes, 18 sizes from 8 KiB (1.42 GiB/s) through 1 MiB (179), 8 MiB (1,070), 32 MiB "
        "(1,975), 128 MiB (2,633) to 1 GiB (3,126 GiB/s), interpolated linearly and held at "
        "the ends. XLA applies the H100's table to every GPU; here the time it adds beyond "
        "the H100's datasheet 3.35 TB/s (a transfer's start and ramp, about 5 us) is taken "
        "to last as long on every GPU, each byte otherwise at the GPU's own bandwidth. A "
        "Llama 3 70B decode step's fp8 weight matrices on H100s, split 8 ways (8 to 56 MiB), "
        "reach 0.59 of the bandwidth, split 2 ways 0.81"
    ),
    "hbm_fraction (GPUs) 0.8, where hbm_by_size is off": (
        "XLA's GPU cost model for matmuls priced a matmul's HBM traffic at 0.8 of the memory "
        "bandwidth (hbm_bandwidth_utilization_rate) before it read it by size; a hand-tuned "
        "decoding kernel reaches 0.9 (FlashMLA: up to 3000 GB/s on an H800 SXM5). TPUs 1 (the "
        "datasheet's): no measurement or compiler figure found"
    ),
    "a mixture's grouped expert matmuls at a batched matmul's rate": (
        "MegaBlocks (Gale et al. 2022, arXiv 2211.15841) measures its block-sparse expert "
        "kernels at 98.6% of cuBLAS batched matmul throughput on average (91-104% over its "
        "problem sizes): a batched matmul's rate for the shape (matmul_by_shape where it is "
        "measured, else matmul_fraction), no faster than reading the experts' weights "
        "through HBM where they get fewer tokens than the rate over the bandwidth. Held "
        "against grouped kernels measured on an H100 at Qwen3-30B-A3B's up-projection, 128 "
        "experts of 512 rows (K 2,048, N 1,536), forward and backward (tgale96/grouped_gemm "
        "pull request 37; its log, Knarf04/grouped_gemm run.log@514ad86, 'Fwd+Bwd TFLOPs "
        "(est)', a few element-wise kernels included): CUTLASS's SM90 grouped kernel 481.62 "
        "TFLOP/s, a loop of cuBLAS matmuls 388.49, cuBLAS's grouped API 255.67; the H100's "
        "table prices the same three matmuls at about 370 (393 forward, 384 and 337 for the "
        "two gradients), at the loop of cuBLAS's matmuls, as Transformer Engine's "
        "GroupedLinear runs them (NVIDIA/TransformerEngine pull request 853, 'Grouped GEMM "
        "for fp32/bf16/fp16/fp8 via multi-stream cuBLAS'; issue 1386, 2024-12-31: cuBLAS's "
        "grouped API's 'performance is not as good as the multi-stream implementation')"
    ),
    "a dropless mixture's routing in bytes (cost.routing.Routing)": (
        "what the kernels move, counted, not fitted: NVIDIA/Megatron-LM megatron/core/"
        "transformer/moe/token_dispatcher.py@0014f13, MoEAlltoAllTokenDispatcher: "
        "'permute->A2A(EP)->AG(TP)->sort_chunk(if num_local_experts>1)' and back "
        "'sort_chunk(if num_local_experts>1)->RS(TP)->A2A(EP)->unpermute'; with "
        "moe_permute_fusion the permutation and un-permutation are Transformer Engine's fused "
        "moe_permute / moe_unpermute kernels (transformer_engine/common/permutation: 'Each "
        "block corresponds to one source token', its row loaded once and stored to each of its "
        "topK destinations; the un-permutation sums a token's rows with their probabilities), "
        "and sort_chunks_by_idxs a fused copy of every received row; the router's scores are "
        "one fused kernel (moe_router_fusion: float32 logits in, float32 probabilities and a "
        "bool routing map out, experts wide a token; DeepEP takes float32 probabilities only). "
        "The flex (DeepEP) dispatcher permutes on the receiving device the rows it received "
        "(get_permuted_hidden_states_by_experts) and sorts nothing. MaxText's sparse path "
        "sorts a group's top-k assignments (argsort) and gathers the rows, and after its "
        "ragged all-to-all permutes locally again: the same rows moved. Rows of d_model at "
        "the activations' dtype, through HBM at the element-wise bandwidth, less the one write "
        "and one read the kept activations already price for the experts' input, the weighted "
        "outputs and the router's logits; the probabilities' 4 bytes a slot and the "
        "all-to-all's own reads and writes are not counted"
    ),
    "HOST_SYNC_S 26e-6 (cost.routing, GPUs; 0 elsewhere)": (
        "that the wait exists: Megatron-LM megatron/core/transformer/moe/token_dispatcher.py"
        "@0014f13, MoEAlltoAllTokenDispatcher.preprocess: dropless, 'A synchronization is "
        "needed before expert parallel AlltoAll communication to get the `input_splits` and "
        "`output_splits` CPU values' (without expert or tensor parallelism 'before_finish', "
        "for the grouped matmul's tokens per expert); _maybe_dtoh_and_synchronize copies them "
        "to the host and waits (d2h_event.synchronize()) once a forward, never with "
        "moe_pad_expert_input_to_capacity (drop_and_pad). Megatron-Core's MoE README: 'when "
        "--moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity are not set, "
        "the resulting dynamic shapes make MoE layers uncapturable' by CUDA graphs. NeMo "
        "AutoModel pull request 3931 (sync-free HybridEP dispatch): HybridEP's blocking "
        "dispatch drains the compute stream 'on every MoE layer, forward and "
        "activation-checkpoint recompute'. What a wait costs: the device idles from the end "
        "of its queued work until the host has read the counts and launched the next kernel, "
        "a device-to-host round trip, measured at 26.11 us on bare-metal Linux (and 116 us "
        "under WSL2) beside a 9.02 us launch (jingyaogong/minimind pull request 837, "
        "'device->host round trip', RTX 3090; no data-center GPU measurement found: the "
        "bare-metal figure stands for every GPU). A TPU's (and any XLA) program has static "
        "shapes and waits for nothing: 0"
    ),
    "matmul_by_shape (H100, H200): cost.compute.H100_MATMUL_TFLOPS": (
        "XLA's GPU cost model for matmuls (tensorflow/tensorflow third_party/xla/xla/service/"
        "gpu/model/matmul_interpolator_data.h@372d578, kDefaultMatmulPTable, key sm_90, "
        "'bf16xbf16->bf16'; read by matmul_interpolator.cc): an H100's measured throughput "
        "of b matmuls of m by n over k in one kernel, b 1, 2, 4 and each of m, n, k 256 to "
        "4,096 in powers of two (375 shapes), from 6.45 TFLOP/s (1 x 256 cubed) to 793 (4 x "
        "4,096 cubed; 809 the most, at 4 x 4,096 x 2,048 x 4,096). XLA weighs the 16 "
        "measured shapes around a matmul by inverse squared distance, its sizes clamped to "
        "the table (b to 4, m, n, k to 256-4,096); here they are interpolated linearly in "
        "the logarithm of each size, which gives each measured shape exactly and is "
        "monotone wherever the table is, held at the same edges. A layer's routed experts "
        "on a device run as one batched kernel (b its experts, held at 4: the table "
        "measures no more, so a kernel of many experts is priced as four, which fill the "
        "multiprocessors less), each expert's matmul of the tokens routed to it (held at "
        "256 below: fewer rows run no faster a FLOP in the table's trend, so this prices "
        "them optimistically); a share of the largest shape's rate (at most 1), times "
        "matmul_fraction, which was calibrated on dense layers whose matmuls the table "
        "measures at about that rate. fp8 expert matmuls take the bf16 share of the fp8 "
        "rate: the sm_90 table of that commit has no fp8 entries, and the later one "
        "(xla/backends/gpu/cost_model/matmul_interpolator_data.h@a305421, key sm_90, "
        "'f8e4m3fnxf8e4m3fn->bf16') measures four of 4,096 cubed at 2,593 TFLOP/s, above "
        "the H100's 1,979 dense fp8 peak, and is not read. Its B200 table (key sm_100) "
        "measures fp8 small shapes at a lower share of fp8's large-shape rate than bf16's: "
        "the bf16 share understates their slowdown. The H200 is the H100's die and compiler target "
        "(sm_90); the A100 and B200 (sm_80 and sm_100, not in the sm_90 table) and TPUs "
        "keep matmul_fraction whatever the shape"
    ),
    "attention_fwd_flops, attention_bwd_flops (H100_ATTENTION_KERNELS)": (
        "Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), Figures 5 and 6: BF16 "
        "attention on an H100 80GB SXM5, head dimension 128, sequence 4k (16k tokens a "
        "batch): causal forward FlashAttention-2 319, cuDNN 518, FlashAttention-3 579 "
        "TFLOP/s; backward 310, 499 and 542 (the paper measures the backward without the "
        "causal mask; it stands for the causal one). Transformer Engine's FusedAttention "
        "backend is cuDNN's kernel, as is JAX's dot_product_attention(implementation="
        "'cudnn')"
    ),
    "ATTENTION_FORWARD: a serving prefill's fused causal kernel, forward, head dimension 128, "
    "sequence 4k (A100 198 TFLOP/s; H100 and H200 as H100_ATTENTION_KERNELS; B200 none)": (
        "A100 (FlashAttention-2): Dao 2023, FlashAttention-2 (arXiv 2307.08691), Figure 5(d), "
        "'Attention forward speed on A100 GPU', with causal mask, head dimension 128, A100 80GB "
        "SXM4, 16k tokens a batch: FlashAttention-2 198 TFLOP/s at sequence 4k (132, 164, 187, "
        "198, 200, 197 from 512 to 16k), its bar labels as a public transcription reads them; a "
        "second transcription reads 148, but only 198 agrees with the backward of Figure 6(d) "
        "(165, both read so) and the forward and backward of Figure 4(d) (173 in the first): "
        "3.5 / (1 / 198 + 2.5 / 165) = 173. At 4k, as the H100's figures. H100: Shah et al. 2024, "
        "FlashAttention-3 (arXiv 2407.08608), Figure 5, as H100_ATTENTION_KERNELS (causal "
        "forward, head dimension 128, sequence 4k: FlashAttention-2 319, cuDNN 518, "
        "FlashAttention-3 579 TFLOP/s). H200: the H100's (the same GH100 die, multiprocessors "
        "and clocks; the paper measures the H100 alone). B200: FlashAttention-4 (arXiv "
        "2603.05451) publishes its best rate over its settings ('up to 1613 TFLOPs/s'), not a "
        "causal head-dimension-128 figure at a sequence length: none, and a B200 prefill's "
        "attention stays at the matmul rate, counted non-causal. The rate at 4k stands for "
        "every prompt and head dimension (a 2k prompt's is 187 on the A100, an 8k one's 200)"
    ),
    "KERNEL_OVERLAP 0.95 (GPUs: a compiled step's kernels one after another)": (
        "XLA's GPU performance model (xla/service/gpu/model/gpu_performance_model_base.h and "
        ".cc): a GPU runs a program's kernels one after another, and each takes its compute "
        "time plus its memory time less 0.95 of the shorter "
        "(GpuPerformanceModelOptions::memory_compute_parallelism, 'chosen empirically ... "
        "close to 1, but not quite 1'; CombineComputeAndMemoryAccessTime). The training "
        "model likewise adds the element-wise work's traffic to the matmuls' time, as "
        "matmul_fraction was calibrated"
    ),
    "H100_ENGINE_ALL_REDUCE (serving engines' all-reduce on H100s, cost/links.py)": (
        "SGLang pull 2904 ('optimize custom allreduce kernel', 2025-01-15), 'unit test "
        "performance in H100 (without cuda graph)', its custom all-reduce (TensorRT-LLM's "
        "one-shot and two-shot kernels, reading the input in place: one kernel an execution) "
        "at tensor parallelism 2/4/8, in ms: 512 B 0.0037/0.0048/0.0059, 4 KiB "
        "0.0039/0.0037/0.0057, 32 KiB 0.0045/0.0048/0.0078, 256 KiB 0.0079/0.0139/0.0167, 512 "
        "KiB 0.0125/0.0202/0.0221, 1 MiB 0.0199/0.0311/0.0338. vLLM's own kernel measured "
        "beside it takes 8.5-10 us up to 32 KiB, for it copies its input into the shared "
        "buffer first (a second kernel), which vLLM's CUDA graphs spare it by registering "
        "their buffers: the one-kernel figures stand for both. NCCL's price stands beyond 1 "
        "MiB (vLLM picks NCCL or symmetric memory above a few MiB) and across nodes"
    ),
    "LOW_LATENCY (GPUs: NCCL's LL protocol, cost/links.py)": (
        "NCCL's tuning model (src/graph/tuning.cc, ncclTopoTuneModel), from which NCCL picks "
        "each collective's algorithm and protocol by message size: a ring in the LL protocol "
        "starts in 6.6 us (baseLat) and takes 0.6 us a step over NVLink, 2.7 us across the "
        "network (hwLat), at a quarter of the bus bandwidth (busBw x 1/4, LL's flag with "
        "every 8 bytes); nccl-tests' all_reduce_perf measures 8 GPUs over NVLink at 10-25 us "
        "for 8 B to 64 KB. The bandwidth protocol keeps latency_s a step. Serving engines' "
        "own one-shot all-reduces (vLLM's and TensorRT-LLM's custom all-reduce) are faster "
        "still for the smallest messages and are not modelled"
    ),
    "latency_s (TPUs) 1e-6, an ICI ring's hops and their latency (cost/links.py)": (
        "the scaling book (jax-ml/scaling-book, part 3 'Sharding', 'A note on ICI latency'): "
        "'Each hop over an ICI link has some intrinsic overhead regardless of the data "
        "volume. This is typically around 1us'; a bidirectional ring's all-gather takes "
        "|X| / 2 hops and T_total = max[T_min x X / 2, V / W_ici]: each hop the longer of "
        "its latency and its transfer, so the latency and the traffic do not add"
    ),
    "tp_overlap (GPUs: off unless set)": (
        "Transformer Engine's userbuffers overlap a tensor-parallel layer's all-gathers and "
        "reduce-scatters with its matmuls (NeMo's ub_tp_comm_overlap: true in its Llama 3.1, "
        "Nemotron-4 and GPT-3 recipes, NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/"
        "training, and NVIDIA/dgxc-benchmarking nemo_megatron/gpt3_175b_hydra.yaml); their "
        "configurations (tp_overlap/ub_cfg_h100_h8192_tp4_mbs1_seqlen8192.yaml) give the "
        "all-gathers to the copy engines (method: ring_exchange) and the reduce-scatters and "
        "bulk overlaps 2-24 multiprocessors each (num_sm); a hidden collective here holds "
        "comm_sms, NCCL's, an upper bound on those. Off by default: an XLA program on GPUs "
        "runs them on the critical path unless its flags ask for collective matmuls"
    ),
    "ep_overlap (off unless set)": (
        "Megatron-Core's combined 1F1B schedule (--overlap-moe-expert-parallel-comm, MCore "
        "v0.14: 'batch-level overlapping to hide EP-A2A communication'; megatron/core/"
        "pipeline_parallel/combined_1f1b.py, combined_1f1b_schedule_for_no_pipelining and "
        "for interleaving): a forward chunk of one micro-batch and a backward chunk of "
        "another run together, the one's dispatch and combine beside the other's compute; "
        "the interleaved schedule's warm-up forwards and cool-down backwards run alone. "
        "Megatron-Bridge's H100 Qwen3-235B recipes set it (moe_a2a_overlap=True, "
        "scripts/performance/configs/qwen/qwen3_workload_base_configs.py@01b2977), and the "
        "Megatron MoE model zoo's Qwen3-235B table lists the same layout with and without "
        "it (19.7 and 17.6 s, best_practice/Qwen3/readme.md@c1ad0b5), its launcher setting "
        "--delay-wgrad-compute beside it (sbatch_benchmarking.sh@38ce2ed, A2A_OVERLAP=1). "
        "Layer by layer (megatron/core/models/gpt/fine_grained_schedule.py "
        "schedule_layer_1f1b@01415c4, sub-modules from fine_grained_callables.py@3e55583; "
        "pipeline_parallel/utils.py ScheduleNode: each sub-module, on the compute or the "
        "communication stream, waits for the one before it of its own micro-batch) a "
        "layer is four pairs: the backward's combine beside the forward's attention and "
        "router (and the previous layer's delayed attention weight gradients), the "
        "forward's dispatch beside the experts' backward input gradients, the backward's "
        "dispatch beside the experts' delayed weight gradients and the forward's experts, "
        "the forward's combine beside the attention's backward; each pair as long as the "
        "longer of the two, a hidden all-to-all holding its share of the multiprocessors "
        "as the other collectives do. Off by default: each chunk waits for its "
        "all-to-alls. Not to be trusted far: on that one published pair the estimate's "
        "step falls 30% (21.1 to 14.8 s) where the measured one fell 11%. The pairing "
        "does not explain it: each of the layout's all-to-alls (15.5 ms a micro-batch on "
        "its slowest stage) is about as long as the sub-module beside it (13-26 ms), so "
        "pricing them pair by pair rather than beside the whole chunk moves the step "
        "0.1 s; what the measured schedule loses beyond that is not priced"
    ),
    "fsdp_overlap (on unless unset)": (
        "Frameworks gather the next layer's FSDP-sharded weights while a layer computes and"
        " reduce-scatter a layer's gradients during the next one's backward (PyTorch FSDP's"
        " forward and backward prefetch; MaxText's GPU recipes through XLA's flags, "
        "AI-Hypercomputer/maxtext MaxText/configs/a3_plus/llama_2/7b/16vm.sh@814fb0d: "
        "'--xla_gpu_enable_pipelined_all_gather=true', "
        "'--xla_gpu_enable_pipelined_reduce_scatter=true'), so they hide behind the "
        "micro-batch's compute as far as it lasts, each behind its own pass: a layer's "
        "forward waits for its weights, so the forward's gathers hide behind the forward "
        "alone, and what they take beyond it is exposed however much the backward leaves "
        "free (the backward's gathers and the gradients' reduce-scatters hide behind the "
        "backward: gathered during the forward, a layer's weights would stay whole until "
        "its backward, which FSDP's sharding exists to avoid). XLA's GPU compiler "
        "pipelines a scanned layer's all-gathers across the loop's iterations only when "
        "asked: openxla/xla xla/debug_options_flags.cc@1ff3f7d sets "
        "xla_gpu_enable_pipelined_all_gather(false) and "
        "xla_gpu_enable_pipelined_reduce_scatter(true) by default. Compiled by this "
        "build (jaxlib 0.10.2, deviceless for the H100 and the B200), the planner's own "
        "FSDP step of a scanned decoder has every collective 'is_pipelined':false, each "
        "layer's attention weights gathered back to back at the start of its loop body and "
        "its gradients reduce-scattered as one combined collective at the end of its "
        "backward, nothing scheduled between start and done; the audit of that schedule "
        "leaves about half of the FSDP traffic exposed where the estimate hides all of it. "
        "Marin's JAX FSDP run of a 360B mixture on one GB200 rack measured it at its worst "
        "(marin-community/marin issues 8053 and 8054, 2026-08-07, from its XPlane "
        "timeline): 'compute-stream NCCL = 2153.1 ms, overlapped by compute = 0.2 ms "
        "(0.01%)' beside 0.91 s of side-stream collectives running alone, about the 3.0 s "
        "of FSDP traffic the estimate prices. Unset, they run alone: the step pays each in "
        "full"
    ),
    "pp_overlap (off unless set)": (
        "NeMo's communication overlap guide (docs.nvidia.com/nemo-framework/user-guide/24.12/"
        "nemotoolkit/features/optimizations/communication_overlap.html, 'Pipeline-parallel "
        "Communication Overlap'): with interleaved pipelining, overlap_p2p_comm overlaps the "
        "stages' sends and receives 'with non-dependent computations in the 1F1B stage', "
        "while 'the PP communications in pipeline fill and flush are still exposed'; "
        "NVIDIA's launcher configurations set it (NeMo-Framework-Launcher launcher_scripts/"
        "conf/training/llama/llama3_1_70b.yaml@1ab2c78 and llama3_1_405b.yaml@072ecc4, "
        "dgxc-benchmarking nemo_megatron/gpt3_175b_hydra.yaml@35a9aec: overlap_p2p_comm: "
        "true, batch_p2p_comm: false; nemotron/nemotron4-340b-synth.yaml@8f5cbb3: false). A "
        "hidden transfer holds its share of the multiprocessors as the other collectives "
        "do (comm_sms, comm_sms_net). Off by default: a transfer then waits for its chunk "
        "and the next chunk for it"
    ),
    "kernel_launch_s (GPUs) 1e-6": (
        "XLA's GPU cost model, which prices each kernel's launch at 1 us (xla/service/gpu/"
        "model/gpu_performance_model_base.h, kKernelLaunchOverhead); TPUs 0: the TPU runs a "
        "compiled program as one executable, with no launch per kernel"
    ),
    "kernel_floor_s (GPUs) 2e-6": (
        "the least a kernel runs on a Hopper GPU when it does almost nothing, measured inside "
        "a replayed CUDA graph (serving engines capture their decode steps): vLLM's layerwise "
        "profile of a decode step of an fp8 Llama 3 8B (its embedding bfloat16[128256, 4096], "
        "its matmuls sm90_xmma_gemm_e4m3bf16 kernels; neuralmagic/nm-vllm pull request 332, "
        "the kernels under CUDAGraphRunner, each its time on the device) times "
        "'vllm::scaled_fp8_quant_kernel' at 256.00 us over 128.00 invocations (2 us each, "
        "quantizing a token's activations before each fp8 matmul), 'vllm::rms_norm_kernel' "
        "at 4.00 us for 1 and 'indexSelectSmallIndex' at 2.00 us for 1. A kernel's time on "
        "the device does not hold the gap between one kernel's end and the next's start, "
        "which the launch (kernel_launch_s) prices: Hazy Research's Llama-1B megakernel study "
        "(hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles: 'Each kernel comes with a "
        "setup and teardown period and during this time no useful work gets done') measured "
        "that gap on an H100 with CUDA graphs at about 1.3 us a kernel (as its summary at "
        "mlops.substack.com/p/one-megakernel-to-rule-llama-1b puts it: 'Even with NVIDIA's "
        "CUDA graphs ... measurements on an H100 showed launch costs of about 1.3 "
        "microseconds per kernel'), near XLA's 1 us. The A100's and B200's taken as the "
        "H100's (no published measurement apart); TPUs 0, as kernel_launch_s"
    ),
    "sms (A100 108, H100 and H200 132, B200 148), tile_m x tile_n 128 x 128, MIN_TILE_M 16, "
    "TILE_K 64 (GPUs)": (
        "a GPU matmul's output is cut into tiles, one thread block a tile on each streaming "
        "multiprocessor, the tiles running in waves of as many as there are multiprocessors "
        "(NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication Background User's "
        "Guide': tile quantization, a dimension not a multiple of the tile, and wave "
        "quantization, tiles not a multiple of the SMs, its example the A100's 108 SMs). XLA's "
        "GPU dot cost model prices a matmul so (xla/service/gpu/model/"
        "gpu_dot_fusion_cost_model.cc, CalculateComputeTimeWithTileAndWaveQuantization: "
        "ceil(m / tile_m) x ceil(n / tile_n) thread blocks, ceil(blocks / core_count) waves, "
        "waves x core_count x a tile's 2 tile_m tile_n k FLOPs at the rate; on Hopper a "
        "tile_m under 64, which cannot use wgmma, at 0.63 of it). SMs from the datasheets and "
        "architecture whitepapers (the GPU compile targets' core_count); the tile: cuBLAS "
        "names its kernels by theirs, and an H100's transformer projections run "
        "sm90_xmma_gemm_..._tilesize128x128x64 most (beside 128x256x64 and 64x128x64 in "
        "published profiles). Fewer rows than a tile: tiles of the least power of two from "
        "16 that holds them (MIN_TILE_M: PTX's mma.m16n8k16, the least block_m of XLA's "
        "Triton tilings; the 0.63 of Hopper's under 64 not taken). Fewer tiles than SMs: k "
        "split over the idle ones, at least 64 deep a part (TILE_K: the k step of "
        "tilesize128x128x64), as cuBLAS's split-k kernels (execute_segment_k_on) and XLA's "
        "Triton split_k do, the partial sums' reduction not priced. Not modelled: cuBLAS's "
        "choice among tile sizes (128x256 for large shapes), CUTLASS's stream-K balancing "
        "the last of many waves. TPUs 0: the MXU "
        "multiplies a bf16[8,128] block of rows by a stationary bf16[128,128] weight tile "
        "every 8 cycles (scaling book part 2), so a few tokens' rows are not padded to 128; "
        "their matmuls run at matmul_fraction whatever their shape"
    ),
    "comm_sms (A100 24, H100, H200 and B200 32), comm_sms_net 16 (GPUs); TPUs 0": (
        "a collective running beside compute holds some of the GPU's multiprocessors and the "
        "compute runs on the rest: NCCL runs each channel as one thread block on its own "
        "multiprocessor (NVIDIA/nccl issue 689, sjeaugey: 'NCCL CTAs won't share an SM with "
        "compute kernels'; 'NCCL uses the minimal number of SMs to achieve the performance of "
        "the platform ... If you are on DGX with 8 NICs and a top speed of 190 GB/s, then it "
        "would use 16 SMs': comm_sms_net, across nodes), and over NVLink two a link (issue "
        "1703, AddyLaddy: 'we need to launch 2 CTAs per NVLink in order to saturate the BW "
        "for large messages'): the A100's 12 links 24 channels (nccl-tests issue 100, an HGX "
        "A100's log: 'Channel 23/24'), Hopper's 18 ('Hopper generation GPUs have 18 NVLink "
        "channels between the GPU and NVSwitch and the number of NCCL channels is directly "
        "related to that', issue 1429) 32, NCCL's most ('MAXCHANNELS:32 definded by NCCL', "
        "the same issue); the B200's NVLink 5 taken as Hopper's (18 links of 50 GB/s make "
        "its 900). The share "
        "of the SMs is a floor of the slowdown measured: Lee et al. 2025 (arXiv 2507.03114, "
        "4 A100s, H100s, MI250s, MI210s, GPT and Llama layers) 'overlapping computation and "
        "communication can result in an average computational slowdown of 18.9%, with a "
        "maximum of 40.0% slowdown'; what is not priced: the memory bandwidth the "
        "collective reads and writes (issue 1433, sjeaugey: 'You may not compete for SMs but "
        "still compete for memory bandwidth') and a matmul's last wave pushed past the SMs "
        "left (forums.developer.nvidia.com, 'Compute-Communication Overlap Causes Severe GEMM "
        "Performance Degradation because of Tail Effect': an H100 GEMM of 132 blocks beside "
        "an all-gather of 24, 'the gemm kernel's execution time nearly doubles'). TPUs 0: "
        "a TPU's transfers are DMAs its TensorCore issues and computes beside (JAX's Pallas "
        "TPU docs: 'communication using the remote DMA primitive'; 'Pallas Async "
        "Operations': 'z = x + 1  # happens at the same time as ppermute'), a reduction's "
        "additions not priced"
    ),
    "exchange_sms (GPUs: 0 unless set, NCCL's channels)": (
        "a mixture's dispatch and combine run by DeepEP or HybridEP (Megatron-Core's flex "
        "dispatcher) hold the multiprocessors the library is configured with, not NCCL's "
        "channels: Megatron-Core's TransformerConfig (NVIDIA/Megatron-LM megatron/core/"
        "transformer/transformer_config.py@002526d) has moe_flex_dispatcher_num_sms, 'Number "
        "of SMs for the flex token dispatcher's dispatch/combine communication, for all "
        "backends (deepep, hybridep, ncclep). None lets each backend use its own default', "
        "beside the deprecated moe_deepep_num_sms ('Number of SMs to use for DeepEP "
        "(historical default 20)') and moe_hybridep_num_sms ('None uses the default from "
        "DeepEP'). Megatron-Bridge's 16-H100 recipes set their own: pull 5123 (merged "
        "2026-07-27, Qwen3-30B-A3B BF16) 'Extend the recipe unit test to cover the tuned "
        "knobs and inherited 32-SM HybridEP setting'; pull 5266 (merged, 2026-08-03, "
        "Nemotron 3.5 Nano) 'Retune HybridEP to 32 dispatcher SMs'; pull 5098 (open, "
        "2026-07-26, Qwen3.5-35B-A3B) '16 dispatcher SMs'. Set, each all-to-all holds "
        "min(exchange_sms, sms) of sms while it runs beside compute, inside a node or across "
        "nodes alike; every other collective keeps NCCL's. Not priced: the multiprocessors "
        "Transformer Engine's norms leave free for the communication (pull 5123: '10-SM "
        "forward/backward LayerNorm margins'). 0 by default: few sources state a run's "
        "dispatcher SMs, and Megatron's alltoall dispatcher runs NCCL's all-to-all, which "
        "holds NCCL's channels; TPUs 0"
    ),
    "host_memory_bytes, host_bandwidth": (
        "GPUs: the DGX system's memory over its 8 GPUs (DGX A100 and H100/H200: 2 TB, DGX "
        "B200: 4 TB) and one PCIe x16 link each way (Gen4 32 GB/s on the A100, Gen5 64 GB/s "
        "after it); TPUs: Cloud TPU docs' DRAM per host over its chips (v5e 512 GiB / 8, v5p "
        "448 GB / 4, v6e 1536 GiB / 8) and the scaling book's PCIe per chip (1.5e10 B/s, "
        "v6e 3.2e10)"
    ),
}

_A100_SRC = (
    "NVIDIA A100 SXM4 80GB datasheet: 312 TFLOP/s dense bf16, 2.039 TB/s HBM2e, NVLink 3 "
    "300 GB/s per direction; DGX A100: 8 GPUs, 8 x 200 Gb/s HDR InfiniBand (25 GB/s per GPU)"
)
_NVLINK_SRC = (
    "NVIDIA: NVLink 4 450 GB/s per direction, ~989 TFLOP/s dense bf16, 1979 dense fp8; NDR "
    "8x400 Gb/s per node"
)

PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            "a100",
            312e12,
            80 * GB,
            300 * GB,
            5e-6,
            25 * GB,
            8,
            _A100_SRC,
            2.039e12,
            host_memory_bytes=2000 * GB / 8,
            host_bandwidth=32 * GB,
            kernel_launch_s=1e-6,
            kernel_floor_s=2e-6,
            hbm_fraction=0.8,
            sms=108,
            comm_sms=24,
            comm_sms_net=16,
            runtime_memory_bytes=79.25 * GIB,
            tf32_peak_flops=156e12,
            fp32_peak_flops=19.5e12,
        ),
        Hardware(
            "h100",
            989e12,
            80 * GB,
            450 * GB,
            5e-6,
            50 * GB,
            8,
            _NVLINK_SRC,
            3.35e12,
            0.54,
            host_memory_bytes=2000 * GB / 8,
            host_bandwidth=64 * GB,
            fp8_peak_flops=1979e12,
            fp8_matmul_fraction=0.48,
            kernel_launch_s=1e-6,
            kernel_floor_s=2e-6,
            hbm_fraction=0.8,
            hbm_by_size=True,
            matmul_by_shape=True,
            sms=132,
            comm_sms=32,
            comm_sms_net=16,
            runtime_memory_bytes=79.11 * GIB,
            tf32_peak_flops=494.5e12,
            fp32_peak_flops=67e12,
        ),
        Hardware(
            "h200",
            989e12,
            141 * GB,
            450 * GB,
            5e-6,
            50 * GB,
            8,
            _NVLINK_SRC,
            4.8e12,
            0.54,
            host_memory_bytes=2000 * GB / 8,
            host_bandwidth=64 * GB,
            fp8_peak_flops=1979e12,
            fp8_matmul_fraction=0.49,
            kernel_launch_s=1e-6,
            kernel_floor_s=2e-6,
            hbm_fraction=0.8,
            matmul_by_shape=True,
            sms=132,
            comm_sms=32,
            comm_sms_net=16,
            runtime_memory_bytes=139.81 * GIB,
            tf32_peak_flops=494.5e12,
            fp32_peak_flops=67e12,
        ),
        Hardware(
            "b200",
            2250e12,
            180 * GB,
            900 * GB,
            5e-6,
            50 * GB,
            8,
            "NVIDIA HGX B200 datasheet: NVLink 5 900 GB/s, dense bf16 and fp8, 8 TB/s HBM3e",
            8e12,
            0.52,
            host_memory_bytes=4000 * GB / 8,
            host_bandwidth=64 * GB,
            fp8_peak_flops=4500e12,
            fp8_matmul_fraction=0.51,
            kernel_launch_s=1e-6,
            kernel_floor_s=2e-6,
            hbm_fraction=0.8,
            sms=148,
            comm_sms=32,
            comm_sms_net=16,
            runtime_memory_bytes=178.35 * GIB,
            tf32_peak_flops=1100e12,
            fp32_peak_flops=75e12,
        ),
        # TPU ICI: a ring along one torus axis uses both directions of a link.
        Hardware(
            "tpu-v5e",
            197e12,
            16 * GIB,
            2 * 4.5e10,
            1e-6,
            6.25e9,
            256,
            "scaling book part 2: 4.5e10 B/s per ICI link each way, 2-D 16x16 torus, 197 TFLOP/s; "
            "Cloud TPU docs: 819 GB/s HBM",
            8.19e11,
            0.75,
            tp_overlap=True,
            host_memory_bytes=512 * GIB / 8,
            host_bandwidth=1.5e10,
        ),
        Hardware(
            "tpu-v5p",
            459e12,
            95 * GIB,
            2 * 9e10,
            1e-6,
            6.25e9,
            8960,
            "scaling book part 2: 9e10 B/s per ICI link each way, 3-D torus, DCN 6.25e9 B/s; "
            "Cloud TPU docs: 2,765 GB/s HBM",
            2.765e12,
            0.75,
            tp_overlap=True,
            host_memory_bytes=448 * GB / 4,
            host_bandwidth=1.5e10,
        ),
        Hardware(
            "tpu-v6e",
            918e12,
            32 * GIB,
            2 * 9e10,
            1e-6,
            12.5e9,
            256,
            "scaling book part 2: 9e10 B/s per ICI link each way, 2-D torus, DCN 12.5e9 B/s; "
            "Cloud TPU docs: 1,640 GB/s HBM",
            1.64e12,
            0.75,
            tp_overlap=True,
            host_memory_bytes=1536 * GIB / 8,
            host_bandwidth=3.2e10,
        ),
    )
}


#: The most a kernel's least time may be set to: as a launch's (:data:`MAX_KERNEL_LAUNCH_S`).
MAX_KERNEL_FLOOR_S = 1e-3

#: The most a kernel's launch may be set to: a millisecond, a thousand times XLA's estimate
#: and more than a small model's whole decode step (a 1B model's weights read from an H100's
#: HBM take under a millisecond); a value above it is a unit mistaken.
MAX_KERNEL_LAUNCH_S = 1e-3


#: The settings of a GPU matmul's tiling: its multiprocessors and the output tile each runs.
GEMM_TILING = ("sms", "tile_m", "tile_n")

#: The multiprocessors a collective holds while it runs, inside a node and across nodes, and
#: those a mixture's dispatch and combine hold where their library is configured with its own.
COMM_SMS = ("comm_sms", "comm_sms_net", "exchange_sms")

#: What each of :data:`COMM_SMS` is, as its errors say it.
_HELD = {
    "comm_sms": "the multiprocessors a collective holds while it runs",
    "comm_sms_net": "the multiprocessors a collective holds while it runs",
    "exchange_sms": (
        "the multiprocessors a mixture's all-to-alls hold while they run (DeepEP's or "
        "HybridEP's configured count; 0: NCCL's channels)"
    ),
}


def _tiling(base: Hardware, key: str, value: Any) -> int:
    """``value`` of the tiling setting ``key`` on ``base``, checked: a whole positive number,
    on a GPU (a preset with multiprocessors)."""
    if not base.sms:
        raise ShardscopeError(
            f"hardware setting {key}={value!r} on {base.name}: it has no streaming "
            f"multiprocessors, and its matmuls run at matmul_fraction whatever their shape; "
            f"leave {key} out, or set matmul_fraction"
        )
    whole = isinstance(value, int | float) and not isinstance(value, bool)
    if not whole or not math.isfinite(value) or value != int(value) or value < 1:
        what = (
            f"the GPU's streaming multiprocessors ({base.sms} on {base.name}, its datasheet's)"
            if key == "sms"
            else f"the side of the output tile a multiprocessor computes ({getattr(base, key)} "
            f"on {base.name})"
        )
        raise ShardscopeError(
            f"hardware setting {key}={value!r} is {what}: give a whole number of at least 1"
        )
    return int(value)


#: The settings that are switches (True or False), each with what it says.
SWITCHES = {
    "tp_overlap": "tensor-parallel collectives run beside their matmuls",
    "ep_overlap": "a mixture's expert all-to-alls run beside another micro-batch's compute",
    "fsdp_overlap": "FSDP's weight gathers and gradient reduce-scatters run beside compute",
    "pp_overlap": "pipeline stages' transfers run beside the steady phase's compute",
    "hbm_by_size": "a matmul reaches the HBM bandwidth measured for its size",
    "matmul_by_shape": (
        "a mixture's expert matmuls run at the share of the rate measured for their shape"
    ),
}


def hardware(name: str | Hardware, **overrides: Any) -> Hardware:
    """A preset by name (``a100``, ``h100``, ``h200``, ``b200``, ``tpu-v5e``, ``tpu-v5p``,
    ``tpu-v6e``), with any field overridden, e.g. ``hardware("h100", link_bandwidth=370e9)``.

    >>> hardware("h100", memory_bytes=40e9).memory_bytes
    40000000000.0
    """
    base = name if isinstance(name, Hardware) else PRESETS.get(str(name).lower())
    if base is None:
        raise ShardscopeError(
            f"unknown hardware preset {name!r}; choose one of {', '.join(PRESETS)}"
        )
    known = {f.name for f in fields(Hardware)} - {"name", "source"}
    for key, value in overrides.items():
        if key not in known:
            raise ShardscopeError(
                f"unknown hardware setting {key!r}; settable: {', '.join(sorted(known))}"
            )
        if key in SWITCHES:
            if not isinstance(value, bool):
                raise ShardscopeError(
                    f"hardware setting {key}={value!r} says whether {SWITCHES[key]}: give True "
                    f"or False"
                )
            if key == "matmul_by_shape" and value and not base.sms:
                raise ShardscopeError(
                    f"hardware setting matmul_by_shape=True on {base.name}: its matmuls' "
                    f"throughput by shape was measured on an H100's multiprocessors, and "
                    f"{base.name} has none; leave it out, or set matmul_fraction"
                )
            continue
        if key in GEMM_TILING:
            overrides[key] = _tiling(base, key, value)
            continue
        if key in COMM_SMS:
            whole = isinstance(value, int | float) and not isinstance(value, bool)
            if not whole or not math.isfinite(value) or value != int(value) or value < 0:
                raise ShardscopeError(
                    f"hardware setting {key}={value!r} is {_HELD[key]} ({getattr(base, key)} on "
                    f"{base.name}): give a whole number of at least 0"
                )
            overrides[key] = int(value)
            continue
        # No host memory (0) is a hardware that cannot offload, no fp8 rate (0) one without
        # fp8 matmuls, no attention rates (0) attention at the matmul rate, no launch time
        # (0) kernels launched for free, no runtime memory (0) the device memory, no TF32 or
        # fp32 rate (0) f32 matmuls as bf16 ones; every other value is positive.
        zero_ok = key in (
            "host_memory_bytes",
            "fp8_peak_flops",
            "fp8_matmul_fraction",
            "attention_fwd_flops",
            "attention_bwd_flops",
            "kernel_launch_s",
            "kernel_floor_s",
            "runtime_memory_bytes",
            "tf32_peak_flops",
            "fp32_peak_flops",
        )
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            what = "0 or a finite positive number" if zero_ok else "a finite positive number"
            raise ShardscopeError(f"hardware setting {key}={value!r} must be {what}")
        if key == "kernel_launch_s" and value > MAX_KERNEL_LAUNCH_S:
            raise ShardscopeError(
                f"hardware setting kernel_launch_s={value!r} is a kernel's launch, which costs "
                f"microseconds (XLA's GPU cost model: 1e-6); above {MAX_KERNEL_LAUNCH_S:g} s "
                f"it passes a small model's whole decode step: give seconds, at most "
                f"{MAX_KERNEL_LAUNCH_S:g}"
            )
        if key == "kernel_floor_s" and value > MAX_KERNEL_FLOOR_S:
            raise ShardscopeError(
                f"hardware setting kernel_floor_s={value!r} is the least a kernel runs, which "
                f"is microseconds (an H100's: 2e-6); above {MAX_KERNEL_FLOOR_S:g} s it passes a "
                f"small model's whole decode step: give seconds, at most {MAX_KERNEL_FLOOR_S:g}"
            )
        fractions = ("matmul_fraction", "comm_fraction", "fp8_matmul_fraction", "hbm_fraction")
        if key in fractions and value > 1:
            raise ShardscopeError(
                f"hardware setting {key}={value!r} is a fraction of the "
                f"{'bandwidth' if key in ('comm_fraction', 'hbm_fraction') else 'peak'}: give "
                f"a number in (0, 1]"
            )
    if not overrides:
        return base
    # a fraction given is the fraction a matmul reaches, whatever its size
    by_size: dict[str, Any] = {"hbm_by_size": False} if "hbm_fraction" in overrides else {}
    # a memory given is the whole the runtime reports too, unless that is given
    if "memory_bytes" in overrides and "runtime_memory_bytes" not in overrides:
        by_size["runtime_memory_bytes"] = 0.0
    hw = replace(
        base,
        **{**by_size, **overrides},
        source=base.source
        + " (overridden: "
        + ", ".join(
            f"{k}={v}" if isinstance(v, bool) else f"{k}={v:g}" for k, v in overrides.items()
        )
        + ")",
    )
    for key in COMM_SMS:
        if key in overrides and getattr(hw, key) > hw.sms:
            raise ShardscopeError(
                f"hardware setting {key}={getattr(hw, key)} is more multiprocessors than "
                f"{hw.name} has ({hw.sms}); give at most {hw.sms}"
                + ("" if hw.sms else " (a TPU's collectives hold none of its cores)")
            )
    rates = (hw.attention_fwd_flops, hw.attention_bwd_flops)
    if (rates[0] > 0) != (rates[1] > 0):
        raise ShardscopeError(
            f"hardware settings attention_fwd_flops={rates[0]:g} and attention_bwd_flops="
            f"{rates[1]:g}: a fused attention kernel is priced by both its forward's and "
            f"its backward's rate; give both, or neither (0: the matmul rate)"
        )
    if max(rates) > hw.peak_flops:
        raise ShardscopeError(
            f"hardware settings attention_fwd_flops={rates[0]:g} and attention_bwd_flops="
            f"{rates[1]:g}: no kernel runs above the peak ({hw.peak_flops:g} FLOP/s); give "
            f"its measured FLOP/s"
        )
    return hw


#: Fused attention kernels' measured rates on an H100 SXM5 (bf16, head dimension 128,
#: sequences of 4,096): ``{kernel: (forward, backward)}`` FLOP/s, counted as FlashAttention
#: counts them (causal FLOPs, the backward 2.5 times the forward's). Pass them as
#: ``attention_fwd_flops`` and ``attention_bwd_flops`` (``--attention-fwd-flops``,
#: ``--attention-bwd-flops``) to plan a program that runs that kernel.
H100_ATTENTION_KERNELS: dict[str, tuple[float, float]] = {
    "flash-attention-2": (319e12, 310e12),
    "cudnn": (518e12, 499e12),
    "flash-attention-3": (579e12, 542e12),
}


_H100_FORWARD = {k: fwd for k, (fwd, _) in H100_ATTENTION_KERNELS.items()}

#: Fused causal attention kernels' measured forward rates by GPU preset (bf16, head dimension
#: 128, sequences of 4,096, counted as FlashAttention counts them: the causal FLOPs, half the
#: non-causal): ``{gpu: {kernel: FLOP/s}}``. A serving engine's prefill runs its attention core
#: as one of them (:meth:`~shardscope._src.targets.engines.Engine.prefill_attention`); a GPU
#: not listed (the B200: no published figure of this kind) has none (sources in
#: :data:`TIME_MODEL_SOURCES`).
ATTENTION_FORWARD: dict[str, dict[str, float]] = {
    "a100": {"flash-attention-2": 198e12},
    "h100": _H100_FORWARD,
    # the H100's die, multiprocessors and clocks, more memory
    "h200": _H100_FORWARD,
}


def attention_forward_flops(gpu: str, kernel: str) -> float | None:
    """The measured causal forward FLOP/s of the fused attention ``kernel`` on the ``gpu``
    preset (:data:`ATTENTION_FORWARD`; None where none is published).

    >>> attention_forward_flops("a100", "flash-attention-2"), attention_forward_flops(
    ...     "b200", "flash-attention-3")
    (198000000000000.0, None)
    """
    return ATTENTION_FORWARD.get(gpu, {}).get(kernel)


def h100_attention(kernel: str) -> dict[str, float]:
    """The hardware settings of ``kernel``'s measured H100 rates
    (:data:`H100_ATTENTION_KERNELS`), for :func:`hardware`'s overrides.

    >>> hardware("h100", **h100_attention("cudnn")).attention_fwd_flops
    518000000000000.0
    """
    if kernel not in H100_ATTENTION_KERNELS:
        raise ShardscopeError(
            f"attention kernel {kernel!r} has no measured H100 rates here; choose one of "
            f"{', '.join(H100_ATTENTION_KERNELS)}, or give attention_fwd_flops and "
            f"attention_bwd_flops"
        )
    fwd, bwd = H100_ATTENTION_KERNELS[kernel]
    return {"attention_fwd_flops": fwd, "attention_bwd_flops": bwd}
