"""Compiling a plan with the target's own compiler (deviceless GPU or TPU), for its memory.

The sweep screens the candidates analytically and compiles the leaders on the CPU compiler
(fast, and what the estimates were built on); the leading plans are then compiled again for
the target's compile-only devices.
What comes back is the target's own buffer assignment (memory per device), its collectives
(its reduce-scatters, its 16-bit payloads), its matmul FLOPs counted from its HLO (both priced
in the plan's step), and on TPU the compiler's own FLOP count and time estimate. A TPU program
that does not fit fails to compile; its words are kept as the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax

from shardscope._src.audit.records import MemoryPressure
from shardscope._src.base.errors import DeviceMemoryError, PlanError, is_int
from shardscope._src.base.notes import Note
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.plan.collectives import PlanCollective, axis_comm
from shardscope._src.plan.compile import Progress, compile_plan
from shardscope._src.plan.estimates import Schedule
from shardscope._src.plan.notes import PlanNote
from shardscope._src.targets.devices import compiler_installed, require_compiler
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.mesh import target_mesh
from shardscope._src.targets.specs import CPU_TARGET, TARGETS, Family, Target, get_target
from shardscope._src.train.timing import compiled_step
from shardscope._src.train.types import Plan, StageProgram
from shardscope._src.train.validate import compiled_flops, flops_note, reduce_scatter_note


@dataclass(frozen=True)
class TargetFacts:
    """One plan as the target's compiler built it. ``error`` holds the compiler's words when
    it found the program does not fit (then ``memory`` is empty)."""

    target: str
    memory: CompiledMemory = field(default_factory=CompiledMemory)
    collectives: tuple[PlanCollective, ...] = ()
    flops: float | None = None
    #: the program's matmul FLOPs per device counted from its HLO (the CPU program's measure)
    hlo_flops: int | None = None
    optimal_seconds: float | None = None
    error: str | None = None
    #: the compiler's first line where it failed on the program (not a verdict on its fit)
    failure: str | None = None
    exact: bool = True
    compile_s: float = 0.0
    #: where the partitioner replicated whole arrays (the compile log's words)
    rematerializations: tuple[str, ...] = ()
    #: the compiler's rematerialization could not bring the program under its memory
    memory_pressure: MemoryPressure | None = None

    @property
    def memory_bytes_per_device(self) -> int:
        """What the target's program holds at once
        (:attr:`~shardscope._src.cost.memory.CompiledMemory.held_bytes`)."""
        return self.memory.held_bytes


def target_facts(
    program: StageProgram,
    target: str | Target,
    memory_bytes: float | None = None,
) -> TargetFacts:
    """Builds a plan's ``program`` on ``target``'s compile-only devices, compiles it with the
    target's compiler and audits it; a GPU's compiler told the program may hold
    ``memory_bytes`` (:func:`~shardscope._src.targets.mesh.target_mesh`)."""

    name = get_target(target).name
    mesh = target_mesh(name, program.mesh, axis_types="auto", memory_bytes=memory_bytes)
    lowered = program.lower(mesh)
    t0 = time.perf_counter()
    try:
        # Its log is read (rematerializations, memory pressure, which the plan's notes say:
        # their raw lines stay off the terminal).
        compiled = compile_plan(lowered)
    except DeviceMemoryError as e:
        return TargetFacts(name, error=str(e), compile_s=time.perf_counter() - t0)
    except jax.errors.JaxRuntimeError as e:
        # A compiler's own failure (an internal error on one fusion, say) says nothing of the
        # plan: it keeps its CPU compile, and a note says why.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return TargetFacts(name, failure=first[:300], compile_s=time.perf_counter() - t0)
    return TargetFacts(
        target=name,
        memory=compiled.memory,
        # Payloads as the target sends them: it keeps 16-bit collectives 16-bit.
        collectives=compiled.plan_collectives(),
        flops=compiled.flops,
        hlo_flops=compiled.hlo_flops,
        optimal_seconds=compiled.optimal_seconds,
        exact=compiled.exact,
        compile_s=compiled.compile_s,
        rematerializations=tuple(
            sorted({r.source or r.op_name or "?" for r in compiled.rematerializations})
        ),
        memory_pressure=compiled.memory_pressure,
    )


def default_compiler(hw: Hardware) -> Target:
    """The hardware preset's own compiler (an ``h100`` plan compiles for H100s) when it is
    installed; else the CPU backend alone, and the plan's notes say how to add it."""
    own = TARGETS.get(hw.name)
    if own is not None and own.is_accelerator and compiler_installed(own):
        return own
    return CPU_TARGET


def check_compiler(
    compiler: str | Target | None, hw: Hardware, devices: int, target_plans: int
) -> Target:
    """The compiler's target (None: :func:`default_compiler`), once it can compile for
    ``devices`` of ``hw``."""

    t = get_target(default_compiler(hw) if compiler is None else compiler)
    if not t.is_accelerator:
        return t
    if t.hardware != hw.name:
        raise PlanError(
            f"compiler {t.name!r} compiles for {t.hardware} devices but the plan is for "
            f"{hw.name}; use compiler={hw.name!r} or 'cpu'",
            param="compiler",
        )
    if not is_int(target_plans, 1):
        raise PlanError(
            f"target_plans={target_plans!r}: must be a positive whole number", param="target_plans"
        )
    require_compiler(t, devices)  # also refuses a device count it is not built with
    return t


#: The most target compiles that follow the leading plans' while a plan the target's compiler
#: has not compiled ranks first.
TARGET_LEADER_COMPILES = 3


def recompile_on_target(
    order: list[Plan],
    hw: Hardware,
    target: Target,
    leading: int,
    progress: Progress | None,
    rank: Callable[[Plan], Any],
) -> list[Plan]:
    """The plans ranked by ``rank`` once the target's compiler has compiled the leading ones
    again, in the screening's order, until ``leading`` of them fit the device memory by what
    its programs hold (or ``3 x leading`` are compiled, or the list ends), the rest kept as
    screened; then, while a plan it has not compiled ranks first, that one too (at most
    :data:`TARGET_LEADER_COMPILES`), so that the best plan is the target's program. A plan whose
    compile failed is not tried again."""

    out: list[Plan] = []
    fitting = 0
    budget = min(len(order), 3 * leading)
    for i, p in enumerate(order[:budget], start=1):
        if fitting >= leading:
            break
        q = on_target(p, hw, target)
        out.append(q)
        fitting += q.compiled_by == target and q.fits  # a failed compile is not counted
        if progress:
            progress(i, budget, f"{p.label} on {target.name}")
    ranked = sorted(out + order[len(out) :], key=rank)
    for _ in range(TARGET_LEADER_COMPILES):
        first = ranked[0] if ranked else None
        if first is None or first.compiled_by == target:
            break
        if any(n.kind == PlanNote.TARGET_COMPILE_FAILED for n in first.notes):
            break
        compiled = on_target(first, hw, target)
        ranked = sorted([compiled, *ranked[1:]], key=rank)
    return ranked


def on_target(p: Plan, hw: Hardware, target: Target) -> Plan:
    """``p`` compiled again by the target's compiler: its collectives, memory, fit and step
    the target program's; where that compiler fails, ``p`` as it was with a note saying so.

    A GPU's compiler is told the program may hold the device's memory less the optimizer
    state, which lives beside it (the step's program does not hold it): its scheduler and
    rematerialization then work under the limit a run's own compiler has. The program
    compiled is the one the plan's CPU compile built (:attr:`Plan.program`), on the target's
    devices."""
    program, bound = p.program, p.bound
    assert program is not None and bound is not None  # every compiled plan carries them
    room = None
    if target.family == Family.GPU:
        room = max(p.memory_limit_bytes - p.memory.device_optimizer, 1)
    facts = target_facts(program, target, room)
    if facts.failure is not None:
        failed = Note(
            PlanNote.TARGET_COMPILE_FAILED, {"target": target.name, "error": facts.failure}
        )
        return replace(p, notes=(failed, *p.notes))  # unverified

    if facts.error is None:
        values = {"target": target.name, "memory_bytes": facts.memory_bytes_per_device}
        values["estimate_bytes"] = p.memory.total
        # what the fit is judged on: the program's buffers and the optimizer state beside
        # them (Plan.fit_memory_bytes_per_device)
        values["fit_bytes"] = facts.memory_bytes_per_device + p.memory.device_optimizer
        cand = p.candidate
        if cand is not None and cand.stages > 1:
            # one stage's program, its micro-batches one after another; 1F1B holds more
            sched = Schedule(cand.microbatches, cand.remat, cand.stages, False, cand.virtual_stages)
            layers = program.config.layers
            values["stage_layers"] = layers
            values["held_layers"] = layers // cand.virtual_stages * sched.in_flight
    else:
        values = {"target": target.name, "error": facts.error}
    if room is not None and p.memory.device_optimizer:
        values.update(room_bytes=room, optimizer_bytes=p.memory.device_optimizer)
    note = Note(PlanNote.COMPILED_BY_TARGET, values)
    # The fit is the target's now (its note says on what), not the estimate's.
    kept = tuple(n for n in p.notes if n.kind != PlanNote.FIT_ON_ESTIMATE)
    if facts.error is None:
        # The plan's collectives become the target's: so does the note on a reduce-scatter
        # left out, which its compiler's record decides.
        # So do its rematerializations and what its compiler says of the memory.
        # So does the note on its matmul FLOPs against the formula's.
        replaced = (
            PlanNote.ALL_REDUCE_FOR_REDUCE_SCATTER,
            PlanNote.REMATERIALIZATION,
            PlanNote.COMPILED_FLOPS,
        )
        kept = tuple(n for n in kept if n.kind not in replaced)
        capabilities = target.capabilities
        rs = reduce_scatter_note(bound, facts.collectives, capabilities)
        kept = kept if rs is None else (rs, *kept)
        if facts.rematerializations:
            sites = list(facts.rematerializations)
            kept = (*kept, Note(PlanNote.REMATERIALIZATION, {"sites": sites}))
        if facts.memory_pressure is not None:
            pressure = {"compiler": capabilities.compiler, **facts.memory_pressure.to_dict()}
            kept = (Note(PlanNote.MEMORY_PRESSURE, pressure), *kept)
    changes: dict[str, Any] = {
        "notes": (note, *kept),
        "compiled_by": target,
        "target_memory": facts.memory if facts.error is None else None,
        "target_error": facts.error,
        "target_optimal_seconds": facts.optimal_seconds,
        "timing": {**p.timing, "target_compile_s": facts.compile_s},
    }
    if facts.error is None:
        comm = axis_comm(hw, program.mesh.sizes, facts.collectives, bound)
        changes.update(
            collectives=facts.collectives,
            comm=comm,
            comm_time_s=sum(a.time_s for a in comm),
            exact=facts.exact,
        )
        if p.pricing is not None:  # the step as the target's program has it
            flops = compiled_flops(facts.hlo_flops, facts.exact)
            step = compiled_step(hw, p.pricing, facts.collectives, bound, capabilities, flops)
            changes.update(time=step, compute_time_s=step.compute_s)
            changes["matmul_flops_per_device"] = flops
            formula = p.pricing.work.step_matmul_flops
            differ = flops_note(formula, flops, capabilities)
            if differ is not None:
                changes["notes"] = (*changes["notes"], differ)
    return replace(p, **changes)


def compiler_notes(compiler: Target, plans: Sequence[Plan], hw: Hardware) -> list[Note]:
    """Which plans the target's compiler compiled again, or, with the CPU compiler alone, the
    extra that installs ``hw``'s own compiler when it is missing."""
    if not compiler.is_accelerator:
        own = TARGETS.get(hw.name)
        if own is not None and own.extra and not compiler_installed(own):
            values = {"target": own.name, "extra": own.extra}
            return [Note(PlanNote.TARGET_COMPILER_MISSING, values, ("compiler",))]
        return []
    ranks = [p.rank for p in plans if p.compiled_by == compiler]
    return [Note(PlanNote.RECOMPILED_BY_TARGET, {"target": compiler.name, "ranks": ranks})]
