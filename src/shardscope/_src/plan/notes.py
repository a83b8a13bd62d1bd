"""What a plan or a sweep notes: the kinds (:class:`PlanNote`) and their words, one template
or one small function per kind, written from a note's values when it is shown."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardscope._src.audit.records import MemoryPressure
from shardscope._src.base.comm import format_bytes, format_flops
from shardscope._src.base.notes import NoteKind
from shardscope._src.targets.capabilities import reduce_scatter_words
from shardscope._src.targets.hardware import TIME_MODEL_SOURCES


class PlanNote(NoteKind):
    """What a plan or a sweep notes (its :class:`~shardscope._src.base.notes.Note` kinds)."""

    # -- a plan's notes
    #: the compiler all-reduced and sliced where the bound reduce-scatters, its own choice
    #: (values: ``compiler``, ``forms``: its ``Capabilities.forms_reduce_scatter``)
    ALL_REDUCE_FOR_REDUCE_SCATTER = "all-reduce-for-reduce-scatter"
    #: the former name of :attr:`ALL_REDUCE_FOR_REDUCE_SCATTER`
    CPU_ALL_REDUCE_FOR_REDUCE_SCATTER = "all-reduce-for-reduce-scatter"
    #: the partitioner replicated a whole array then sliced it (values: ``sites``)
    REMATERIALIZATION = "rematerialization"
    #: some collective counts are not exact (unknown trip count or a branch)
    INEXACT = "inexact"
    #: the jit program reduces replicated gradients after every micro-batch
    PER_MICROBATCH_REDUCTION = "per-microbatch-reduction"
    #: one pipeline stage was compiled (values: ``stages``, ``layers``, ``devices``, the
    #: model's ``of_layers``; and ``virtual_stages`` when interleaved)
    PIPELINE_STAGE = "pipeline-stage"
    #: compiled again by a target's compiler (values: ``target``, ``memory_bytes``,
    #: ``estimate_bytes``, and ``room_bytes`` where a GPU's compiler was told the program
    #: may hold less than the device, ``optimizer_bytes`` the state beside it; or
    #: ``target`` and ``error`` when it failed)
    COMPILED_BY_TARGET = "compiled-by-target"
    #: the target's compiler failed on the plan, which keeps its CPU compile (values:
    #: ``target``, ``error``: the compiler's first line)
    TARGET_COMPILE_FAILED = "target-compile-failed"
    #: the compiler's rematerialization could not bring the program under its memory
    #: (values: ``compiler``, ``limit_bytes``, ``reached_bytes``, ``original_bytes``)
    MEMORY_PRESSURE = "memory-pressure"
    #: the compiled program's matmul FLOPs differ from the time model's, or were not counted
    #: (values: ``compiler``, ``formula``: the time model's per device and step, ``compiled``:
    #: the program's, None when not counted)
    COMPILED_FLOPS = "compiled-flops"
    # -- a sweep's notes
    #: memory is the analytic estimate, the CPU compiler's beside it
    ANALYTIC_MEMORY = "analytic-memory"
    #: memory is a compiler's buffer assignment (values: ``target``, None for the CPU)
    COMPILED_MEMORY = "compiled-memory"
    #: what the communication column counts
    COMMUNICATION = "communication"
    #: the planner's time model and its sources (values: the hardware's fields)
    TIME_MODEL = "time-model"
    #: a user's program's time model (values: the hardware's fields)
    PROGRAM_TIME_MODEL = "program-time-model"
    #: the time model runs the layers' matmuls in fp8 while the compiled program is 16-bit
    #: (values: ``name``, ``fp8_peak_flops``, ``fp8_matmul_fraction``, ``dtype``)
    FP8_MATMULS = "fp8-matmuls"
    #: 16-bit collectives moved as f32 by a compiler that widens them (values: ``dtype``,
    #: ``itemsize``, ``compiler``)
    WIDENED = "widened"
    #: the former name of :attr:`WIDENED`
    CPU_WIDENED = "widened"
    #: a compiler formed no reduce-scatter where plans need one; they are charged its
    #: all-reduce (values: ``compiler``, ``forms``)
    NO_REDUCE_SCATTER = "no-reduce-scatter"
    #: the former name of :attr:`NO_REDUCE_SCATTER`
    CPU_NO_REDUCE_SCATTER = "no-reduce-scatter"
    #: the hardware's own compiler is not installed (values: ``target``, ``extra``)
    TARGET_COMPILER_MISSING = "target-compiler-missing"
    #: the leading plans were compiled again (values: ``target``, ``ranks``)
    RECOMPILED_BY_TARGET = "recompiled-by-target"
    #: the compiler gave no FLOP count for some plans
    NO_FLOP_COUNT = "no-flop-count"
    #: rule sets that compiled to the same program (values: ``same``: label, same as, mesh)
    IDENTICAL_PROGRAMS = "identical-programs"
    # -- why a sweep has no plan that fits, or none at all
    #: none fits (values: ``label``, ``need``, ``have``, ``hardware``, ``searched``: whether
    #: every recomputation, micro-batch and stage choice was searched)
    NO_FIT = "no-fit"
    #: the target's compiler ran out of memory on every plan (values: ``target``, ``count``,
    #: ``label``, ``error``)
    TARGET_OUT_OF_MEMORY = "target-out-of-memory"
    #: none the target compiled fits (values: ``target``, ``label``, ``need``, ``have``,
    #: ``hardware``)
    NO_TARGET_FIT = "no-target-fit"
    #: no plan at all (values: ``what``, ``devices``, ``skipped``: count per reason,
    #: ``example``: one skipped candidate's message, ``limit``/``hardware`` when the model
    #: state alone does not fit)
    NO_PLAN = "no-plan"

    @classmethod
    def _missing_(cls, value: object) -> PlanNote | None:
        # Values written by earlier versions, read back.
        return _FORMER_VALUES.get(str(value))

    def describe(self, values: Mapping[str, Any]) -> str:
        """The note's words: its template filled with ``values``, or its function of them."""
        text = _TEXTS[self]
        return text.format_map(values) if isinstance(text, str) else text(values)


#: What earlier versions wrote for kinds since renamed.
_FORMER_VALUES = {
    "cpu-all-reduce-for-reduce-scatter": PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER,
    "cpu-widened": PlanNote.WIDENED,
    "cpu-no-reduce-scatter": PlanNote.NO_REDUCE_SCATTER,
}


def _all_reduce_for_reduce_scatter(v: Mapping[str, Any]) -> str:
    return (
        f"{reduce_scatter_words(v['compiler'], v['forms'])}; it did so where the bound "
        f"reduce-scatters, so the compiled bytes exceed the bound"
    )


def _widened(v: Mapping[str, Any]) -> str:
    return (
        f"{v['compiler']} runs {v['dtype']} arithmetic in f32 and moves f32 through the "
        f"collectives; they are counted at {v['itemsize']} bytes per element, as compilers "
        f"that keep 16 bits send them (cpu_comm_bytes_per_device has the bytes it sends)"
    )


def _no_reduce_scatter(v: Mapping[str, Any]) -> str:
    return (
        f"{reduce_scatter_words(v['compiler'], v['forms'])} (twice the bytes): plans that "
        f"need one (FSDP gradients, sequence parallelism) are charged the compiled all-reduce; "
        f"bound_comm_time_s is the time at the lower bound"
    )


def _rematerialization(v: Mapping[str, Any]) -> str:
    return (
        "the partitioner replicated a whole array then sliced it (involuntary full "
        f"rematerialization) at {', '.join(v['sites'])}"
    )


def _memory_pressure(v: Mapping[str, Any]) -> str:
    said = MemoryPressure.from_dict(v).sentence(f"the {v['compiler']}")
    if v["compiler"] == "XLA:GPU":
        # its limit is not the memory it was told: XLA:GPU takes out the program's
        # arguments and outputs and keeps 5% (gpu_compiler.cc, GetSchedulerMemoryLimit)
        said += (
            " (its limit: 95% of the memory it was told, less the program's arguments and "
            "outputs); it recomputed what it could, and the step is priced with what it runs"
        )
    return said


def _compiled_flops(v: Mapping[str, Any]) -> str:
    formula, compiled = v["formula"], v["compiled"]
    counted = (
        "the forward, the backward at twice the forward, and what the recomputation and the "
        "memory-efficient attention's backward compute again"
    )
    if compiled is None:
        return (
            f"the {v['compiler']} program's matmul FLOPs were not counted from its HLO (a loop "
            f"whose trip count is unknown, or no matmul found): its step is priced with the "
            f"time model's {format_flops(formula)} per device ({counted})"
        )
    more = "more" if compiled > formula else "fewer"
    return (
        f"the {v['compiler']} program computes {abs(compiled / formula - 1):.1%} {more} matmul "
        f"FLOPs than the time model counts ({format_flops(compiled)} against "
        f"{format_flops(formula)} per device per step; the formula counts {counted}): the "
        f"step is priced with the program's count, the estimate keeps the formula's"
    )


def _pipeline_stage(v: Mapping[str, Any]) -> str:
    text = (
        f"one of {v['stages']} pipeline stages compiled ({v['layers']} layers, on "
        f"{v['devices']} devices, holding the embedding and the unembedding of the first and "
        f"last stages); the stage-to-stage transfers and the bubble are in the time model"
    )
    of = v.get("of_layers", v["stages"] * v["layers"])
    if of % v["stages"]:
        text += (
            f"; the {of} layers make stages of {v['layers']} and {v['layers'] - 1}, and the "
            f"pipeline goes at the pace of one of {v['layers']}, the one compiled"
        )
    chunks = v.get("virtual_stages", 1)
    if chunks > 1:
        text += (
            f"; interleaved, each device runs these layers as {chunks} virtual stages of "
            f"{v['layers'] // chunks}, whose collectives are the compiled stage's"
        )
    return text


def _compiled_by_target(v: Mapping[str, Any]) -> str:
    head = f"compiled by the {v['target']} compiler: "
    if v.get("room_bytes") is not None:
        head = (
            f"compiled by the {v['target']} compiler, told the program may hold "
            f"{format_bytes(v['room_bytes'])} (the device less its "
            f"{format_bytes(v['optimizer_bytes'])} of optimizer state): "
        )
    if v.get("error") is not None:
        return head + v["error"]
    return (
        f"{head}{format_bytes(v['memory_bytes'])} per device in its buffer "
        f"assignment (analytic estimate {format_bytes(v['estimate_bytes'])})"
    )


def _compiled_memory(v: Mapping[str, Any]) -> str:
    if v["target"] is not None:
        return (
            f"memory per device is the {v['target']} compiler's own buffer assignment "
            f"(arguments + outputs + temporaries - aliased), compiled deviceless"
        )
    return (
        "memory per device is the compiler's buffer assignment (arguments + outputs + "
        "temporaries - aliased) on the CPU backend, which computes 16-bit arithmetic in f32 and "
        "has no GPU/TPU memory scheduler: compare plans with it, do not read it as a GPU/TPU "
        "prediction"
    )


def _time_model(v: Mapping[str, Any]) -> str:
    overlap = "overlapped with their matmuls" if v["tp_overlap"] else "on the critical path"
    sources = "; ".join(f"{k}: {s}" for k, s in TIME_MODEL_SOURCES.items())
    return (
        f"time model ({v['name']}): matmuls at {v['matmul_fraction']:.0%} of "
        f"{v['peak_flops'] / 1e12:g} TFLOP/s, activations through HBM at "
        f"{v['hbm_bandwidth'] / 1e12:g} TB/s, collectives at {v['comm_fraction']:.0%} of "
        f"{v['link_bandwidth'] / 1e9:g} GB/s within a node of {v['node_size']} and of "
        f"{v['cross_node_bandwidth'] / 1e9:g} GB/s per device across nodes, "
        f"{v['latency_s'] * 1e6:g} us per ring step; tensor-parallel collectives {overlap}; "
        f"data-parallel, FSDP and ZeRO collectives hidden behind compute as far as the "
        f"schedule allows; 1F1B pipeline bubble; copies to host memory beside the compute; "
        f"the optimizer's pass over its state. Plans rank by this step time with the "
        f"matmul FLOPs (counted from its HLO) and the collectives of the program the compiler "
        f"produced (the formula's screen which to compile). Sources: {sources}"
    )


def _fp8_matmuls(v: Mapping[str, Any]) -> str:
    return (
        f"fp8 matmuls ({v['name']}): the time model runs the layers' projections and MLP in "
        f"fp8 at {v['fp8_matmul_fraction']:.0%} of {v['fp8_peak_flops'] / 1e12:g} TFLOP/s, "
        f"with each operand's scale and cast as HBM bytes, and the attention core and the "
        f"unembedding at {v['dtype']} (torchtitan's float8 training, MaxText's fp8 "
        f"quantization); FSDP's weight all-gathers are priced at one byte per element "
        f"(torchtitan's enable_fsdp_float8_all_gather), the formula's and the compiled "
        f"program's alike. The compiled program is the {v['dtype']} reference program, which "
        f"runs no fp8 matmul: its collectives and memory are {v['dtype']}'s. Memory is "
        f"unchanged: fp8 training keeps {v['dtype']} weights and fp32 master weights and "
        f"optimizer state, and casts copies for the matmuls"
    )


def _program_time_model(v: Mapping[str, Any]) -> str:
    return (
        f"time: alpha-beta per collective ({v['name']}: {v['link_bandwidth'] / 1e9:g} GB/s "
        f"within a node of {v['node_size']}, {v['cross_node_bandwidth'] / 1e9:g} GB/s for "
        f"groups that span nodes, {v['latency_s'] * 1e6:g} us per step); compute = the "
        f"compiler's FLOP count per device at the achievable matmul rate "
        f"({v['peak_flops'] / 1e12:g} TFLOP/s peak x {v['matmul_fraction']:g}); step = "
        f"compute + communication (no overlap) or the larger of the two (perfect overlap)"
    )


def _recompiled_by_target(v: Mapping[str, Any]) -> str:
    return (
        f"plans ranked {', '.join(str(r) for r in v['ranks'])} were compiled again by the "
        f"{v['target']} compiler (deviceless): their fit is judged from its buffer assignment "
        f"and their communication is its collectives; the other plans are the CPU compiler's "
        f"screening"
    )


def _identical_programs(v: Mapping[str, Any]) -> str:
    same = v["same"]
    pairs = "; ".join(f"{label} = {other} {mesh}" for label, other, mesh in same[:6])
    return "identical programs: " + pairs + (" ..." if len(same) > 6 else "")


def _no_fit(v: Mapping[str, Any]) -> str:
    need, have = v["need"], v["have"]
    searched = (
        ", even with full recomputation, micro-batches and pipeline stages" if v["searched"] else ""
    )
    return (
        f"no plan fits{searched}: the closest, {v['label']}, needs {format_bytes(need)} per "
        f"device of the {format_bytes(have)} a {v['hardware']} has ({format_bytes(need - have)}, "
        f"{need / have - 1:.0%} over); use more devices, a smaller batch or sequence, or more "
        f"memory per device"
    )


def _no_target_fit(v: Mapping[str, Any]) -> str:
    return (
        f"no plan the {v['target']} compiler compiled fits: the smallest, {v['label']}, needs "
        f"{format_bytes(v['need'])} per device in its buffer assignment, of the "
        f"{format_bytes(v['have'])} a {v['hardware']} has; use more devices, a smaller batch "
        f"or sequence, or compile more plans on the target"
    )


def _no_plan(v: Mapping[str, Any]) -> str:
    head = f"no plan for {v['what']} on {v['devices']} device(s)"
    skipped = v["skipped"]
    if not skipped:
        return head + ": no candidate mesh"
    parts = ", ".join(f"{n} skipped for {reason}" for reason, n in skipped.items())
    text = f"{head}: {parts}"
    if v.get("limit") is not None:
        text += (
            f"; the model state alone needs more than the {format_bytes(v['limit'])} of a "
            f"{v['hardware']}: use more devices, a preset with more memory, more memory per "
            f"device, or fewer bytes per parameter"
        )
    if v.get("example"):
        text += f"; e.g. {v['example']}"
    return text


#: Each kind's words: a template (``str.format_map`` of the values) or a function of them.
_TEXTS: dict[PlanNote, str | Callable[[Mapping[str, Any]], str]] = {
    PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER: _all_reduce_for_reduce_scatter,
    PlanNote.REMATERIALIZATION: _rematerialization,
    PlanNote.INEXACT: "some collective counts are not exact (unknown trip count or a branch)",
    PlanNote.PER_MICROBATCH_REDUCTION: (
        "the compiled jit program reduces the replicated gradients after every micro-batch; the "
        "time model reduces them once per step, as Megatron-LM, DeepSpeed and PyTorch DDP do "
        "(shard_map with one psum at the end compiles so)"
    ),
    PlanNote.PIPELINE_STAGE: _pipeline_stage,
    PlanNote.COMPILED_BY_TARGET: _compiled_by_target,
    PlanNote.TARGET_COMPILE_FAILED: (
        "the {target} compiler failed on this plan ({error}); its collectives, step and memory "
        "are the CPU compile's"
    ),
    PlanNote.MEMORY_PRESSURE: _memory_pressure,
    PlanNote.COMPILED_FLOPS: _compiled_flops,
    PlanNote.ANALYTIC_MEMORY: (
        "memory per device is what the fit was judged by: a target compiler's buffer "
        "assignment where it compiled the plan (with the optimizer state beside the step), "
        "else the analytic estimate (ZeRO model state, Korthikanti activations); the CPU "
        "compiler's buffer assignment in the JSON and report (bf16 computed in f32, no GPU/TPU "
        "memory scheduler) is no GPU/TPU prediction"
    ),
    PlanNote.COMPILED_MEMORY: _compiled_memory,
    PlanNote.COMMUNICATION: (
        "communication is the compiled program's collectives, loop trips counted, bytes each "
        "device sends under bandwidth-optimal algorithms"
    ),
    PlanNote.TIME_MODEL: _time_model,
    PlanNote.PROGRAM_TIME_MODEL: _program_time_model,
    PlanNote.FP8_MATMULS: _fp8_matmuls,
    PlanNote.WIDENED: _widened,
    PlanNote.NO_REDUCE_SCATTER: _no_reduce_scatter,
    PlanNote.TARGET_COMPILER_MISSING: (
        "every plan was compiled by the CPU backend; pip install 'shardscope[{extra}]' to "
        "compile the leading plans with the {target} compiler (deviceless) and judge their fit "
        "from its buffer assignment"
    ),
    PlanNote.RECOMPILED_BY_TARGET: _recompiled_by_target,
    PlanNote.NO_FLOP_COUNT: (
        "neither the compiler nor the program's HLO gave a FLOP count for some plans: their "
        "compute time is 0, so they rank by communication alone"
    ),
    PlanNote.IDENTICAL_PROGRAMS: _identical_programs,
    PlanNote.NO_FIT: _no_fit,
    PlanNote.TARGET_OUT_OF_MEMORY: (
        "no plan fits: the {target} compiler ran out of memory on each of the {count} plans it "
        "compiled ({label}: {error}); use more devices or a smaller batch or sequence"
    ),
    PlanNote.NO_TARGET_FIT: _no_target_fit,
    PlanNote.NO_PLAN: _no_plan,
}
