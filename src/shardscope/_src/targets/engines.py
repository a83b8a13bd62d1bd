"""Serving engines: what the host costs a serving step beside the device's own time.

A decode step on the device (the weights' and cache's reads, the matmuls, the all-reduces,
the kernels' launches) is not the whole of an iteration: the engine around it schedules the
batch, prepares its inputs, samples and processes the outputs on the host, and an API server
parses and tokenizes each request before it is queued. How much of that a step pays depends
on the engine: a synchronous Python step loop adds it to every iteration; an engine that
prepares step ``n + 1`` while the device runs step ``n`` (SGLang's overlap scheduler, vLLM's
``--async-scheduling``) pays only what the device does not cover.

Each preset (:data:`ENGINES`) is a host cost an iteration (``step_s``) and a sequence of it
(``sequence_s``), whether the engine overlaps it with the device's step, and a cost each
request pays before its first token that does not hold up the device (``request_s``: the API
server and tokenization); :data:`ENGINE_SOURCES` says where each number comes from. An engine
with no published measurement of its host cost has none here, and says so.

>>> engine("vllm").step_seconds(0.010, 4) == 0.010 + 126e-6 + 4 * 4e-6
True
>>> engine("vllm-async").step_seconds(0.010, 4)
0.01
>>> engine("TGI")
Traceback (most recent call last):
...
shardscope._src.targets.engines.EngineError: engine='TGI': choose one of vllm, ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from shardscope._src.base.errors import PlanError
from shardscope._src.targets.hardware import GIB, Hardware, attention_forward_flops


class EngineError(PlanError):
    """A serving engine that is not one of the presets (a :class:`PlanError`: the serving
    planner's callers catch it with its other errors)."""


class MemoryOf(StrEnum):
    """What an engine's memory fraction is a fraction of (:class:`MemoryRule`)."""

    #: the device's memory as its runtime reports it: the weights, the cache and the step's
    #: temporaries within the share (vLLM's ``gpu_memory_utilization``, SGLang's
    #: ``mem_fraction_static``)
    DEVICE = "device"
    #: what the weights leave of it: the cache and the temporaries within the share
    #: (TensorRT-LLM's ``free_gpu_memory_fraction``, LMDeploy's ``cache_max_entry_count``)
    FREE = "free"


@dataclass(frozen=True)
class MemoryRule:
    """How much of a device's memory an engine lets a plan hold, as it starts by default: a
    ``share`` of the memory the device's runtime reports (:attr:`~shardscope._src.targets.
    hardware.Hardware.runtime_memory`), or of what the weights leave of it (``of``), set by
    the engine's option named ``setting``; ``share`` is a fraction, or the engine's rule for
    it by the device and the tensor parallelism of a replica.

    The plan's temporaries (its decode step's, a prefill's) are held within the share under
    either kind: where the engine keeps its activations in the rest (SGLang) or sizes the
    cache after a profiled step (TensorRT-LLM, LMDeploy), the limit is that much lower than
    the engine's own.

    >>> from shardscope._src.targets.hardware import hardware
    >>> h = hardware("h100")
    >>> round(MemoryRule("gpu_memory_utilization", MemoryOf.DEVICE, 0.9).limit(h, 1, 0) / GIB, 3)
    71.199
    >>> free = MemoryRule("free_gpu_memory_fraction", MemoryOf.FREE, 0.9)
    >>> free.limit(h, 1, 20 * GIB) / GIB == 20 + 0.9 * (79.11 - 20)
    True
    """

    setting: str
    of: MemoryOf
    share: float | Callable[[Hardware, int], float]

    def fraction(self, hw: Hardware, t: int) -> float:
        """The share on ``hw`` for a replica of tensor parallelism over ``t`` devices."""
        return self.share(hw, t) if callable(self.share) else self.share

    def limit(self, hw: Hardware, t: int, weights: float, share: float | None = None) -> float:
        """The bytes a device of ``hw`` may hold (weights, cache and temporaries) where a
        replica's tensor parallelism is over ``t`` devices and its weights take
        ``weights`` bytes of each; ``share`` in place of the engine's own (its setting
        given)."""
        whole = hw.runtime_memory
        f = self.fraction(hw, t) if share is None else share
        return f * whole if self.of is MemoryOf.DEVICE else weights + f * (whole - weights)

    def about(self, share: float | None = None) -> str:
        """The rule in words, on no device in particular (at ``share`` where given).

        >>> _VLLM_MEMORY.about(), _VLLM_MEMORY.about(0.95)
        ('gpu_memory_utilization 0.9 of the device', 'gpu_memory_utilization 0.95 of the device')
        """
        if share is None:
            share = None if callable(self.share) else self.share
        share_words = "by its rule" if share is None else f"{share:g}"
        of = "the device" if self.of is MemoryOf.DEVICE else "what the weights leave"
        return f"{self.setting} {share_words} of {of}"

    def words(self, hw: Hardware, t: int, share: float | None = None) -> str:
        """The rule in words on ``hw`` at ``t`` (at ``share`` where given)."""
        whole = f"the {hw.runtime_memory / GIB:.2f} GiB its runtime reports"
        of = whole if self.of is MemoryOf.DEVICE else f"what the weights leave of {whole}"
        f = self.fraction(hw, t) if share is None else share
        return f"{self.setting} {f:g} of {of}"


#: MiB, as SGLang counts a device's memory.
_MIB = 2**20


def _sglang_share(hw: Hardware, t: int) -> float:
    """SGLang's default ``mem_fraction_static`` on ``hw`` for tensor parallelism over ``t``:
    the device's memory less a reserve for its activations (its chunked prefill's tokens at
    1.5 MiB each), its CUDA graphs (2 MiB a sequence of their largest batch, 256 under
    tensor parallelism of 4 and 512 from it), metadata (512 MiB) and tensor parallelism's
    buffers (``t / 8`` GiB), at least 10 GiB on a device of more than 60 GiB, as a share of
    the device's memory, rounded to three places (:data:`ENGINE_SOURCES`).

    >>> from shardscope._src.targets.hardware import hardware
    >>> [_sglang_share(hardware("h100"), t) for t in (1, 2, 4, 8)]
    [0.834, 0.833, 0.823, 0.817]
    """
    mib = hw.runtime_memory / _MIB
    graphs = 256 if t < 4 else 512
    reserve = 512 + max(_sglang_chunk(hw), 2048) * 1.5 + graphs * 2 + t / 8 * 1024
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return round((mib - reserve) / mib, 3)


class SequenceCap(NamedTuple):
    """The most sequences a replica's engine runs at once, as it starts: its option's name
    (``setting``) and its value by the device (``count``)."""

    setting: str
    count: Callable[[Hardware], int]


class PrefillAttention(NamedTuple):
    """The fused causal attention kernel a prefill's attention core runs as: its name and its
    measured causal forward FLOP/s (:data:`~shardscope._src.targets.hardware.
    ATTENTION_FORWARD`)."""

    kernel: str
    flops: float


#: The fused attention kernels the presets name (:data:`~shardscope._src.targets.hardware.
#: ATTENTION_FORWARD`'s).
FA2, FA3 = "flash-attention-2", "flash-attention-3"

#: FlashAttention-3 on the Hopper GPUs, where an engine runs it.
_HOPPER_FA3 = (("h100", FA3), ("h200", FA3))


@dataclass(frozen=True)
class Engine:
    """A serving engine's host costs.

    Attributes:
      name: the preset's name (``"vllm"``).
      step_s: seconds of host work an iteration pays whatever its batch (scheduling, input
        preparation, sampling's launch, synchronisation).
      sequence_s: seconds of host work each sequence of an iteration adds.
      overlapped: the engine prepares the next iteration while the device runs this one: an
        iteration takes the longer of the device's step and the host's work, not their sum.
      request_s: seconds each request spends in the engine before it is queued (the API
        server, its parsing and tokenization), added to its time to first token; the device
        serves other requests meanwhile.
      about: the engine and version the numbers describe, in words.
      chunk: the tokens an iteration carries where the engine chunks its prefills by default
        (the running sequences' decodes among them), by the device it runs on; None: it
        prefills each prompt whole (:meth:`chunk_tokens`).
      custom_all_reduce: the engine all-reduces tensor parallelism's outputs inside a node
        with its own one-shot and two-shot kernels, not NCCL's
        (:func:`~shardscope._src.cost.links.engine_all_reduce_seconds`).
      attention: the fused causal attention kernel its prefills run (or the measured kernel
        nearest it, :data:`ENGINE_SOURCES`), ``attention_on`` the GPU presets on which it runs
        another (``(gpu, kernel)`` pairs; :meth:`prefill_attention`).
      sequences: the most sequences a replica's engine runs at once by default, by the
        device it runs on, and the option that sets it (:class:`SequenceCap`: vLLM's
        ``max_num_seqs``; :meth:`max_sequences`); None: as many as its memory holds (no
        published default, or none).
      memory: how much of a device's memory it lets a plan hold by default
        (:class:`MemoryRule`; :meth:`memory_limit`); None: all of the memory the device's
        runtime reports (the hardware's ``runtime_memory``).
    """

    name: str
    step_s: float
    sequence_s: float
    overlapped: bool
    request_s: float
    about: str
    chunk: Callable[[Hardware], int] | None = None
    custom_all_reduce: bool = False
    attention: str = FA2
    attention_on: tuple[tuple[str, str], ...] = ()
    memory: MemoryRule | None = None
    sequences: SequenceCap | None = None

    def max_sequences(self, hw: Hardware) -> int | None:
        """The most sequences a replica runs at once on ``hw`` (None: no cap but its memory).

        >>> from shardscope._src.targets.hardware import hardware
        >>> [engine("vllm").max_sequences(hardware(n)) for n in ("h100", "a100")]
        [1024, 256]
        >>> engine("sglang").max_sequences(hardware("h100")) is None
        True
        """
        return None if self.sequences is None else self.sequences.count(hw)

    def memory_limit(
        self, hw: Hardware, t: int, weights: float, share: float | None = None
    ) -> float:
        """The bytes a device of ``hw`` may hold serving under this engine, where a replica's
        tensor parallelism is over ``t`` devices and its weights take ``weights`` bytes of
        each (:class:`MemoryRule`; ``share`` in place of its own), or all the memory the
        device's runtime reports where the engine has no rule.

        >>> from shardscope._src.targets.hardware import hardware
        >>> h = hardware("h100")
        >>> engine("none").memory_limit(h, 1, 0) == h.runtime_memory
        True
        >>> engine("vllm").memory_limit(h, 8, 0) == 0.9 * h.runtime_memory
        True
        """
        if self.memory is None:
            return hw.runtime_memory
        return self.memory.limit(hw, t, weights, share)

    def memory_fraction(self, hw: Hardware, t: int, share: float | None = None) -> float | None:
        """The value of this engine's memory setting (:attr:`MemoryRule.setting`) that
        :meth:`memory_limit` holds a device of ``hw`` to, where a replica's tensor
        parallelism is over ``t`` devices: ``share`` where given, else the engine's own (by
        the device and ``t`` where its rule is one); None where the engine has no rule.

        >>> from shardscope._src.targets.hardware import hardware
        >>> h = hardware("h100")
        >>> [engine("sglang").memory_fraction(h, t) for t in (1, 8)]
        [0.834, 0.817]
        >>> engine("vllm").memory_fraction(h, 8, 0.95), engine("none").memory_fraction(h, 8)
        (0.95, None)
        """
        if self.memory is None:
            return None
        return self.memory.fraction(hw, t) if share is None else share

    def prefill_attention(self, hw: Hardware) -> PrefillAttention | None:
        """The fused causal kernel this engine's prefills run on ``hw`` and its measured
        forward rate there (None where none is published for that device: a B200, a TPU).

        >>> from shardscope._src.targets.hardware import hardware
        >>> [engine("vllm").prefill_attention(hardware(n)).kernel for n in ("h100", "a100")]
        ['flash-attention-3', 'flash-attention-2']
        >>> engine("lmdeploy").prefill_attention(hardware("h100")).flops
        319000000000000.0
        >>> engine("vllm").prefill_attention(hardware("b200")) is None
        True
        """
        kernel = dict(self.attention_on).get(hw.name, self.attention)
        rate = attention_forward_flops(hw.name, kernel)
        return None if rate is None else PrefillAttention(kernel, rate)

    def chunk_tokens(self, hw: Hardware) -> int | None:
        """The tokens an iteration of a chunked prefill carries on ``hw`` by default (None:
        each prompt prefilled whole).

        >>> from shardscope._src.targets.hardware import hardware
        >>> [engine("vllm").chunk_tokens(hardware(n)) for n in ("h100", "a100")]
        [8192, 2048]
        >>> engine("sglang").chunk_tokens(hardware("b200")), engine("lmdeploy").chunk_tokens(
        ...     hardware("h100"))
        (16384, None)
        """
        return None if self.chunk is None else self.chunk(hw)

    def host_seconds(self, sequences: float) -> float:
        """The host's work for an iteration of ``sequences`` sequences."""
        return self.step_s + self.sequence_s * sequences

    def step_seconds(self, device_s: float, sequences: float) -> float:
        """An iteration of ``sequences`` sequences whose device time is ``device_s``: the
        host's work after it, or beside it where the engine overlaps the two."""
        host = self.host_seconds(sequences)
        return max(device_s, host) if self.overlapped else device_s + host

    def exposed_seconds(self, device_s: float, sequences: float) -> float:
        """What the host adds to an iteration of ``device_s`` on the device."""
        return self.step_seconds(device_s, sequences) - device_s


#: What a request on vLLM's V1 engine pays per iteration and before its first token, as the
#: BLIS simulator's coefficients trained on measured vLLM runs put it (:data:`ENGINE_SOURCES`).
_VLLM_STEP_S = 126e-6
_VLLM_SEQUENCE_S = 4e-6
_VLLM_REQUEST_S = 15.563e-3

#: Vidur's CPU operators of its vLLM-derived engine, Llama 2 7B on one A100, medians at
#: batches 8 and 64 (ms): schedule, sampler (end to end), input preparation (end to end) and
#: the model outputs' processing, summed (:data:`ENGINE_SOURCES`).
_VIDUR_BATCH_8_MS = sum((0.16513349025318164, 0.8878073216415597, 0.2931705055545493,
                         0.6243771681952621))  # fmt: skip
_VIDUR_BATCH_64_MS = sum((0.9521806380555277, 1.3702587697044193, 1.1629961351208513,
                          4.108261601388884))  # fmt: skip
_VIDUR_SEQUENCE_S = (_VIDUR_BATCH_64_MS - _VIDUR_BATCH_8_MS) / (64 - 8) * 1e-3
_VIDUR_STEP_S = _VIDUR_BATCH_8_MS * 1e-3 - 8 * _VIDUR_SEQUENCE_S


#: vLLM's ``gpu_memory_utilization`` as it starts (:data:`ENGINE_SOURCES`).
_VLLM_MEMORY = MemoryRule("gpu_memory_utilization", MemoryOf.DEVICE, 0.9)


def _vllm_large(hw: Hardware) -> bool:
    """Whether vLLM's V1 engine takes its larger defaults on ``hw``: a device of 70 GiB or
    more other than an A100 (:data:`ENGINE_SOURCES`)."""
    return hw.memory_bytes >= 70 * GIB and not hw.name.startswith("a100")


def _vllm_chunk(hw: Hardware) -> int:
    """vLLM's V1 engine's token budget an iteration (``max_num_batched_tokens``) as its
    OpenAI server starts: 8192 on :func:`_vllm_large` devices, 2048 on the rest."""
    return 8192 if _vllm_large(hw) else 2048


def _vllm_sequences(hw: Hardware) -> int:
    """vLLM's V1 engine's most sequences an iteration (``max_num_seqs``) as its OpenAI
    server starts: 1024 on :func:`_vllm_large` devices, 256 on the rest."""
    return 1024 if _vllm_large(hw) else 256


def _sglang_chunk(hw: Hardware) -> int:
    """SGLang's ``chunked_prefill_size`` by the device's memory: 2048 under 35 GiB, 8192
    under 160 GiB, 16384 above (:data:`ENGINE_SOURCES`)."""
    gib = hw.memory_bytes / GIB
    return 2048 if gib < 35 else 8192 if gib < 160 else 16384


#: The presets by name, the default (:data:`DEFAULT_ENGINE`) first.
ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "vllm",
            _VLLM_STEP_S,
            _VLLM_SEQUENCE_S,
            overlapped=False,
            request_s=_VLLM_REQUEST_S,
            about="vLLM's V1 engine as it starts (0.8 and later, synchronous scheduling)",
            chunk=_vllm_chunk,
            sequences=SequenceCap("max_num_seqs", _vllm_sequences),
            custom_all_reduce=True,
            attention_on=_HOPPER_FA3,
            memory=_VLLM_MEMORY,
        ),
        Engine(
            "vllm-async",
            _VLLM_STEP_S,
            _VLLM_SEQUENCE_S,
            overlapped=True,
            request_s=_VLLM_REQUEST_S,
            about="vLLM's V1 engine with --async-scheduling",
            chunk=_vllm_chunk,
            sequences=SequenceCap("max_num_seqs", _vllm_sequences),
            custom_all_reduce=True,
            attention_on=_HOPPER_FA3,
            memory=_VLLM_MEMORY,
        ),
        Engine(
            "vllm-v0",
            _VIDUR_STEP_S,
            _VIDUR_SEQUENCE_S,
            overlapped=False,
            request_s=0.0,
            about="vLLM's V0 engine before 0.6 (Vidur's profile of its vLLM-derived engine)",
            custom_all_reduce=True,
            memory=_VLLM_MEMORY,
        ),
        Engine(
            "sglang",
            0.0,
            0.0,
            overlapped=True,
            request_s=0.0,
            about="SGLang 0.4 and later, its overlap scheduler on",
            chunk=_sglang_chunk,
            custom_all_reduce=True,
            attention_on=_HOPPER_FA3,
            memory=MemoryRule("mem_fraction_static", MemoryOf.DEVICE, _sglang_share),
        ),
        Engine(
            "tensorrt-llm",
            0.0,
            0.0,
            overlapped=True,
            request_s=0.0,
            about="TensorRT-LLM's C++ runtime and its PyTorch executor (NVIDIA NIM runs it)",
            custom_all_reduce=True,
            attention_on=_HOPPER_FA3,
            memory=MemoryRule("free_gpu_memory_fraction", MemoryOf.FREE, 0.9),
        ),
        Engine(
            "lmdeploy",
            0.0,
            0.0,
            overlapped=False,
            request_s=0.0,
            about="LMDeploy's TurboMind engine (C++)",
            memory=MemoryRule("cache_max_entry_count", MemoryOf.FREE, 0.8),
        ),
        Engine(
            "gpt-fast",
            0.0,
            0.0,
            overlapped=False,
            request_s=0.0,
            about="gpt-fast and torchao's generate.py: torch.compile, the step one CUDA graph",
        ),
        Engine(
            "none",
            0.0,
            0.0,
            overlapped=False,
            request_s=0.0,
            about="no engine: the device's time alone",
        ),
    )
}

#: The engine a serving plan pays for unless told otherwise: the most deployed open engine,
#: in its default configuration.
DEFAULT_ENGINE = "vllm"

#: Where each engine's constants come from.
ENGINE_SOURCES = {
    "vllm: step_s 126 us, sequence_s 4 us, request_s 15.563 ms, not overlapped": (
        "the BLIS simulator's trained-physics step time, fitted to measured vLLM runs on H100 "
        "(inference-sim/inference-sim, docs/guide/latency-models.md at 00776a83): 'beta7 "
        "(per-step, ~126 us/step): Fixed overhead per step: CUDA synchronization, sampler "
        "invocation', 'beta6 (per-request, ~4 us/request): Scheduling overhead per request: "
        "queue management, attention mask construction', and 'alpha0 (QueueingTime, ~15,563 "
        "us): Fixed per-request API processing (HTTP parsing, request validation, queue "
        "insertion)', which BLIS adds to a request's time before it is queued, not to the "
        "server's steps ('Coefficients were trained on H100 traces'; BLIS's per-model "
        "coefficients name the servers of its runs vLLM 0.8.4 and 0.10.1.1, defaults.yaml at "
        "1a6eb353: the V1 engine). Its per-layer beta5 (~32 us a layer: 'kernel launch, CUDA "
        "graph, residual connections') belongs to the device's step, which pays each "
        "kernel's launch and least time (kernel_launch_s, kernel_floor_s): not taken here, "
        "and its alpha2 (~46 us an output token, streaming and detokenizing) runs in V1's "
        "API server process beside the engine's steps. Not overlapped: vLLM's engine "
        "arguments, '--async-scheduling ... If set to True, perform async scheduling. This "
        "helps to avoid gaps in GPU utilization ... Default: False'"
    ),
    "chunked prefill: vllm and vllm-async 8192 tokens an iteration (70 GiB or more, not an "
    "A100) or 2048; sglang 2048, 8192 or 16384 by memory; the others none": (
        "vLLM's V1 engine always chunks its prefills ('V1 always uses chunked prefills', "
        "vllm/engine/arg_utils.py) and EngineArgs.get_batch_defaults sets "
        "max_num_batched_tokens for its OpenAI API server to 8192 where 'device_memory >= 70 "
        "* GiB_bytes and \"a100\" not in device_name' ('For GPUs like H100 and MI300x, use "
        "larger default values'), else 2048; SGLang's server_args._handle_chunked_prefill_size: "
        "'if gpu_mem < 35 * 1024: # A10, L40, 4090 ... 2048 elif gpu_mem < 160 * 1024: # "
        "H100, H200, A100, H20 ... 8192 else: # B200, MI300 ... 16384'. vLLM's V0, "
        "TensorRT-LLM (enable_chunked_context off unless set), LMDeploy's TurboMind and "
        "gpt-fast prefill each prompt whole"
    ),
    "sequences: vllm and vllm-async 1024 a replica (70 GiB or more, not an A100) or 256; the "
    "others as many as the memory holds": (
        "vLLM's EngineArgs (vllm-project/vllm vllm/engine/arg_utils.py@99d7eb5): 'if "
        'device_memory >= 70 * GiB_bytes and "a100" not in device_name: # For GPUs like H100 '
        "and MI300x, use larger default values', 'default_max_num_seqs = { "
        "UsageContext.LLM_CLASS: 1024, UsageContext.OPENAI_API_SERVER: 1024 }', else 256 each, "
        "the engine's max_num_seqs unless given (and no more than max_num_batched_tokens); each "
        "data-parallel replica runs its own scheduler. vLLM's V0 engine, SGLang, TensorRT-LLM, "
        "LMDeploy and gpt-fast are given none here: their caps by device are not read"
    ),
    "vllm-async: vllm's costs, overlapped": (
        "vLLM's engine arguments, as above: with --async-scheduling the scheduler prepares the "
        "next step while the GPU runs this one, so a step is the longer of the two"
    ),
    "vllm-v0: step_s 1.17 ms, sequence_s 0.100 ms, not overlapped": (
        "Vidur (microsoft/vidur, data/profiling/a100/cpu_overheads.csv at 0633efae), the CPU "
        "operators of its vLLM-derived engine (Sarathi-Serve) profiled with Llama 2 7B on one "
        "A100 at tensor parallelism 1, medians in ms: at batch 8 schedule 0.165, sampler end "
        "to end 0.888, input preparation end to end 0.293, model outputs' processing 0.624 "
        "(1.970 in all); at batch 64 0.952, 1.370, 1.163 and 4.108 (7.593): the line through "
        "the two, 1.167 ms a step and 0.100 ms a sequence. vLLM's own profile of its engine "
        "before 0.6 agrees in kind (blog.vllm.ai, 2024-09-05, 'vLLM v0.6.0: 2.7x Throughput "
        "Improvement and 5x Latency Reduction': for Llama 3 8B on one H100 'The HTTP API "
        "server takes 33% of the total execution time. 29% of the total execution time is "
        "spent on scheduling'); its per-request cost is not measured apart (0)"
    ),
    "sglang: 0, overlapped": (
        "SGLang v0.4's zero-overhead batch scheduler (lmsys.org/blog/2024-12-04-sglang-v0-4): "
        "'The scheduler runs one batch ahead and prepares all the metadata required for the "
        "next batch ... in the figure below, there are 5 consecutive decoding batches, and you "
        "can see there is no single idle time on the GPU': no host time left exposed"
    ),
    "tensorrt-llm: 0, overlapped": (
        "TensorRT-LLM's overlap scheduler, 'Enabled by default' (nvidia.github.io/TensorRT-LLM, "
        "features/overlap-scheduler): 'At step n, the system launches GPU computation for step "
        "n+1 without waiting for CPU tasks (e.g., stop criteria checks) from step n to "
        "complete'; its C++ batch manager's host time a step is not published: none priced"
    ),
    "custom all-reduce: the vllm presets, sglang, tensorrt-llm; not lmdeploy, gpt-fast": (
        "vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py, "
        "on by default unless --disable-custom-all-reduce since vLLM pull 2192, 2023-12, V0 "
        "and V1 alike) for tensor parallelism inside a node; SGLang's (sgl-kernel's custom "
        "all-reduce, pull 2904); TensorRT-LLM's AllReduce plugin's one-shot and two-shot "
        "strategies (AUTO by default). LMDeploy 0.1's TurboMind all-reduced with NCCL; "
        "gpt-fast all-reduces with torch.distributed's functional collectives, NCCL's"
    ),
    "prefill attention: flash-attention-3 on H100 and H200 for vllm, vllm-async, sglang and "
    "tensorrt-llm, flash-attention-2 elsewhere and for vllm-v0, lmdeploy, gpt-fast and none": (
        "vLLM runs its prefills' attention with its FlashAttention backend (vllm-flash-attn), "
        "FlashAttention-3 on Hopper from its V1 engine on (0.8 and later; FlashAttention-2 on "
        "the A100, and on every GPU before 0.6, vllm-v0). SGLang 0.4 and later runs FlashInfer "
        "or FlashAttention-3 on Hopper and FlashInfer on the A100; FlashInfer's prefill has no "
        "published rate at these settings, and the nearest measured kernels stand for it: "
        "FlashAttention-3's on Hopper (FlashInfer's Hopper prefill is built on it), "
        "FlashAttention-2's on the A100. TensorRT-LLM runs its own fused context attention "
        "(context FMHA, 'Flash Attention for context phase' in its attention docs), with no "
        "published rate: FlashAttention-3's stands for it on Hopper (its sm90 kernels, like "
        "FlashAttention-3, warp-specialized over the TMA), FlashAttention-2's on the A100. "
        "LMDeploy's TurboMind runs its own FlashAttention-2-style kernel, with no published "
        "rate: FlashAttention-2's. gpt-fast and torchao call PyTorch's "
        "scaled_dot_product_attention, whose flash backend is FlashAttention-2. none, the "
        "device's time alone, still prefills with a fused causal kernel, as every server does: "
        "FlashAttention-2's, the one every engine above has run, and the slowest of the "
        "measured kernels on Hopper, so that no engine's choice is assumed. A hardware that "
        "names its own rate (attention_fwd_flops) runs that instead; a GPU with no published "
        "rate (the B200) and a TPU keep the attention at the matmul rate, non-causal. The "
        "rates: hardware.ATTENTION_FORWARD"
    ),
    "memory: vllm, vllm-async, vllm-v0 gpu_memory_utilization 0.9 of the device": (
        "vLLM's CacheConfig (vllm-project/vllm vllm/config/cache.py@c1d86421): "
        "'gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)', 'The fraction of "
        "GPU memory to be used for the model executor ... If unspecified, will use the "
        "default value of 0.9'; of the device's total as torch.cuda.mem_get_info reports it "
        "(vllm/utils/mem_utils.py@a6d5c390; vllm/v1/worker/gpu_worker.py@35d5cda1: "
        "'self.requested_memory = (self.init_snapshot.total_memory * "
        "self.cache_config.gpu_memory_utilization)'), the weights, the profiled step's peak "
        "activations and non-torch memory within it ('available_kv_cache_memory_bytes = "
        "(self.requested_memory - profile_result.non_kv_cache_memory)'). From vLLM 0.21 the "
        "default is 0.92 with the CUDA graphs' memory estimated within it (pull 38284, "
        "2026-03-26: 'correspondingly increases the default `--gpu-memory-utilization` to "
        "0.92'); the presets describe the releases before it"
    ),
    "memory: sglang mem_fraction_static by its rule (H100: 0.834 at TP 1 to 0.817 at TP 8)": (
        "SGLang's server_args._handle_gpu_memory_settings (sgl-project/sglang "
        "python/sglang/srt/server_args.py@001067ff, the rule since pull 10975, 2025-09-27): "
        "'reserved_mem = 512', plus max(chunked_prefill_size, 2048) * 1.5 for the "
        "activations, cuda_graph_max_bs * 2 (256 under TP 4, 512 from it, on the H100 and "
        "H200 bands), tp_size * pp_size / 8 * 1024, 'if gpu_mem is not None and gpu_mem > "
        "60 * 1024: reserved_mem = max(reserved_mem, 10 * 1024)', then "
        "'mem_fraction_static = round((gpu_mem - reserved_mem) / gpu_mem, 3)', in MiB; "
        "'mem_fraction_static is defined as (model weights + KV cache pool) / GPU memory "
        "capacity'. gpu_mem is the device's total as nvidia-smi reports it (an H100's 81559 "
        "MiB, NVIDIA/nccl issue 1264), taken here as the runtime's (81,009 MiB: the share "
        "0.001 lower at most); the B200 band's graph batch not read (the H100's taken). "
        "SGLang keeps the activations in the rest: the planner holds them within the share"
    ),
    "memory: tensorrt-llm free_gpu_memory_fraction 0.9, lmdeploy cache_max_entry_count 0.8, "
    "of what the weights leave": (
        "TensorRT-LLM's trtllm-serve (NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py"
        "@00209af1): '--kv_cache_free_gpu_memory_fraction', 'default=0.9', 'Free GPU memory "
        "fraction reserved for KV Cache, after allocating model weights and buffers' (its "
        "PyTorch executor, _torch/pyexecutor/_util.py@00043967: 'available_kv_mem = "
        "(total_gpu_memory - peak_memory + allocated_bytes) * fraction'); LMDeploy "
        "(InternLM/lmdeploy lmdeploy/messages.py@0043859b): 'cache_max_entry_count: float = "
        "0.8', 'the percentage of FREE GPU memory to be reserved for the k/v cache', free "
        "once the model is built. Both size the cache after a profiled step's activations: "
        "the planner holds the temporaries within the share"
    ),
    "memory: gpt-fast and none all the memory the runtime reports": (
        "gpt-fast allocates its cache for the batch and length it is given "
        "(pytorch-labs/gpt-fast model.py@03e10bc2, setup_caches: torch.zeros of "
        "(max_batch_size, n_heads, max_seq_length, head_dim)), no share kept back; none, the "
        "device alone, holds all of it too"
    ),
    "runtime memory: a100 79.25 GiB, h100 79.11 GiB, h200 139.81 GiB, b200 178.35 GiB": (
        "the totals the CUDA runtime reports, which engines take their shares of: an H100 80GB "
        "HBM3 'GPU 0 has a total capacity of 79.11 GiB' (vllm-project/vllm issue 27508, "
        "nvidia-smi '0MiB / 81559MiB' beside it); an H200 'GPU: NVIDIA H200 (139.81 GiB)' "
        "(vllm-project/vllm issue 34553); an A100 80GB '79.25 GiB total capacity' "
        "(levihsu/OOTDiffusion issue 235, 2025-03-17; SXM or PCIe not stated); a B200 "
        "'Total Global Memory: 178.35 GB' (pytorch/ao pull 4002, 2026-03-05: GiB by its value, "
        "nvidia-smi's 183359 MiB being 179.06 GiB). Drivers differ by a few hundredths of a "
        "GiB. TPUs: their memory_bytes"
    ),
    "lmdeploy: 0": (
        "no published measurement of TurboMind's host time a step (its step loop is C++): "
        "none priced"
    ),
    "gpt-fast: 0": (
        "gpt-fast and torchao compile the decode step with torch.compile(mode='reduce-"
        "overhead'), one CUDA graph a step replayed from a Python loop over one batch, with no "
        "scheduler or API server: no host cost beside the graph's launch"
    ),
}


def engine(name: str) -> Engine:
    """The preset of that name.

    Raises:
        EngineError: a name that is not a preset's, naming it and the choices.
    """
    found = ENGINES.get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise EngineError(f"engine={name!r}: choose one of {', '.join(ENGINES)}", param="engine")
    return found
