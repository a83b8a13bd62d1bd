"""``shardscope.profile``: run a jitted step on the devices it has, trace its runs with JAX's
profiler, and join the trace to the audit of the program that ran (:mod:`.join`).

The program is compiled once, through the planner's compile step (which audits it); a step of
JAX's own ``jax.jit`` then runs that very executable, a library's wrapper (``flax.nnx.jit``,
``equinox.filter_jit``) runs itself, and the join refuses any instruction the audited program
lacks. The trace is taken in a temporary folder and copied where asked only once it has been
read and joined, so that a step that fails leaves no half-written trace behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from shardscope._src.audit.compile import audit_program, step_mesh
from shardscope._src.audit.pricing import priced
from shardscope._src.audit.records import Audit
from shardscope._src.audit.stages import (
    build_step,
    check_step_pair,
    lower,
    program_stage,
    unwrap_stage,
)
from shardscope._src.base.errors import ProfileError, ShardscopeError, is_int, one_line
from shardscope._src.base.records import read_json
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.plan.compile import CompiledProgram, compile_plan
from shardscope._src.profile.join import join
from shardscope._src.profile.records import PredictedStep, Profile
from shardscope._src.profile.trace import read_trace
from shardscope._src.program.program import compiled_plan
from shardscope._src.sharding.rules import rules_context
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.hardware import hardware as get_hardware
from shardscope._src.targets.specs import TARGETS, get_target


def profile(
    step: Any,
    /,
    *args: Any,
    steps: int = 3,
    warmup: int = 1,
    hardware: str | Hardware | None = None,
    trace_dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
) -> Profile:
    """Runs ``step(*args)`` ``steps`` times under JAX's profiler (after ``warmup`` runs) and
    joins the trace to the audit of the compiled step.

    Args:
        step: the jitted step (``jax.jit``, ``flax.nnx.jit``, ``equinox.filter_jit``), or its
            ``jax.stages.Compiled``.
        *args: its arguments: arrays, or ``jax.ShapeDtypeStruct`` with shardings, which are
            made into arrays (small random floats, zero integers) on those shardings.
        steps: runs to trace (each a step of the result).
        warmup: runs before the trace (the first compiles; later ones settle caches).
        hardware: a preset (``"h100"``) or :class:`~shardscope.Hardware` to price the
            predictions on; default the one of the devices the program was compiled for
            (none for the CPU backend: then nothing is predicted).
        trace_dir: keep the trace here (the folder ``jax.profiler.trace`` writes); default a
            temporary folder, removed.
        name: what to call the program (default: the step's name).

    Returns:
        A :class:`~shardscope._src.profile.records.Profile`: per collective, measured beside
        predicted; per step, the measured figures beside the planner's.

    Raises:
        ProfileError: ``steps`` or ``warmup`` not counts, a step that fails to run, or a
            trace that does not join (see :func:`profile_trace`).

    Example (needs 8 simulated devices, so not run as a doctest)::

        step = jax.jit(lambda x, w: x @ w)
        result = shardscope.profile(step, x, w, steps=3)
        result.coverage        # (collectives in the audit, found in the trace, whole)
    """
    if not is_int(steps, 1):
        raise ProfileError(
            f"steps={steps!r}: give how many runs to trace, at least 1", param="steps"
        )
    if not is_int(warmup, 0):
        raise ProfileError(
            f"warmup={warmup!r}: give how many runs come first, 0 or more", param="warmup"
        )
    label = name or getattr(step, "__name__", None) or "step"
    compiled = unwrap_stage(step, jax.stages.Compiled)
    if compiled is None:
        compiled = lower(step, args, {})
    program = compile_plan(compiled)
    concrete = _concrete(args)
    if _is_jax_own(step) or unwrap_stage(step, jax.stages.Compiled) is not None:
        executable = program.audit.compiled
        assert executable is not None  # an audit of a Compiled holds it

        def run() -> Any:
            return executable(*concrete)
    else:

        def run() -> Any:
            return step(*concrete)

    audit, hw = _priced_on(program.audit, hardware)
    with tempfile.TemporaryDirectory(prefix="shardscope-profile-") as tmp:
        _trace_runs(run, warmup, steps, tmp, label)
        result = join(
            read_trace(tmp),
            audit,
            program=str(label),
            predicted=_predicted(audit, program, hw),
            keep_trace=False,
            joined_by="run",
        )
        if trace_dir is None:
            return result
        _keep(tmp, trace_dir)
    return replace(result, trace=os.fspath(trace_dir)).with_audit(audit)


def profile_program(
    make_step: Callable[..., Any],
    mesh: Any,
    *,
    rules: Any = None,
    rule_set: str | None = None,
    axis_types: Any = None,
    where: str | None = None,
    **options: Any,
) -> Profile:
    """Profiles the step ``make_step(mesh)`` (or ``make_step(mesh, rules)``) builds, as
    :func:`shardscope.audit_program` audits it: what ``shardscope profile FILE.py:FUNCTION``
    runs. ``options`` are :func:`profile`'s (``steps``, ``warmup``, ``hardware``,
    ``trace_dir``).

    Raises:
        ProgramError: ``make_step`` returned something else than a step and its arguments
            (a ``Lowered`` or ``Compiled`` cannot be run without them).
    """
    mesh, pairs = step_mesh(make_step, mesh, rules, rule_set, axis_types, None)
    label = where or getattr(make_step, "__qualname__", None) or "make_step"
    got = build_step(make_step, mesh, pairs, where=label)
    if program_stage(got) is not None:
        raise ProfileError(
            f"{label} returned a compiled or lowered step, which cannot run without its "
            f"arguments; return the jitted step and its arguments, `return jax.jit(step), "
            f"(params, batch)`, to profile it"
        )
    step, args = check_step_pair(got, label)
    with jax.set_mesh(mesh), rules_context(pairs):
        return profile(step, *args, name=options.pop("name", label), **options)


def profile_trace(
    trace: str | os.PathLike[str],
    audit: Audit | str | os.PathLike[str],
    *,
    hardware: str | Hardware | None = None,
    name: str | None = None,
) -> Profile:
    """Joins a trace taken elsewhere (the folder ``jax.profiler.trace`` wrote on a GPU or TPU
    cluster, or one of its ``.xplane.pb`` files) to the audit of the program it ran: an
    :class:`~shardscope.Audit`, or the path of one written by ``shardscope audit --json``
    (compile it for the trace's target: ``shardscope.audit(step, *args, target="h100")``).

    Raises:
        ProfileError: no trace there, a trace without device events, or a trace of another
            program (no event of the audit's module, or events of instructions it lacks).
    """
    if not isinstance(audit, Audit):
        path = os.fspath(audit)
        data = read_json(
            path, "audit file", ProfileError, hint="give a file shardscope audit --json wrote"
        )
        try:
            audit = Audit.from_dict(data)
        except ShardscopeError as e:
            raise ProfileError(f"audit file {path!r} is not an audit: {e}") from None
    audit, hw = _priced_on(audit, hardware)
    return join(
        read_trace(trace),
        audit,
        program=name or audit.module_name,
        predicted=_predicted(audit, _compiled_program(audit), hw),
    )


def profile_program_trace(
    trace: str | os.PathLike[str],
    make_step: Callable[..., Any],
    mesh: Any,
    *,
    target: Any = None,
    hardware: str | Hardware | None = None,
    name: str | None = None,
    **audit_options: Any,
) -> Profile:
    """:func:`profile_trace` of the audit of ``make_step``'s program, compiled for
    ``target`` (the devices the trace ran on; None: simulated CPU devices)."""
    found = audit_program(make_step, mesh, target=target, where=name, **audit_options)
    return profile_trace(trace, found, hardware=hardware, name=name)


def _is_jax_own(step: Any) -> bool:
    return type(step).__module__.split(".")[0] in ("jax", "jaxlib")


def _concrete(args: Any) -> Any:
    """``args`` with each ``jax.ShapeDtypeStruct`` made an array on its sharding: small
    random floats (seeded), zeros of other types (valid indices, false flags)."""
    rng = np.random.default_rng(0)

    def make(leaf: Any) -> Any:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        dtype = np.dtype(leaf.dtype)
        if np.issubdtype(dtype, np.floating) or dtype.name in ("bfloat16", "float16"):
            host = (rng.standard_normal(leaf.shape) * 0.02).astype(dtype)
        else:
            host = np.zeros(leaf.shape, dtype)
        sharding = getattr(leaf, "sharding", None)
        return jax.device_put(host, sharding) if sharding is not None else jax.device_put(host)

    return jax.tree.map(make, args)


def _trace_runs(run: Callable[[], Any], warmup: int, steps: int, folder: str, label: str) -> None:
    """``warmup`` runs, then ``steps`` runs under JAX's profiler writing into ``folder``;
    a :class:`ProfileError` when a run fails."""
    done = 0
    try:
        for _ in range(warmup):
            jax.block_until_ready(run())
            done += 1
        with jax.profiler.trace(folder):
            for _ in range(steps):
                jax.block_until_ready(run())
                done += 1
    except ShardscopeError:
        raise
    except Exception as e:
        which = f"warm-up run {done + 1}" if done < warmup else f"traced run {done - warmup + 1}"
        raise ProfileError(
            f"{label} failed to run (in its {which} of {warmup} + {steps}): {one_line(e)}; "
            f"nothing was written"
        ) from e


def _keep(tmp: str, trace_dir: str | os.PathLike[str]) -> None:
    """Copies the trace taken in ``tmp`` into ``trace_dir`` (beside any trace already there,
    as ``jax.profiler.trace`` itself adds sessions)."""
    target = Path(trace_dir)
    if target.exists() and not target.is_dir():
        raise ProfileError(
            f"trace_dir {str(target)!r} is a file; give a folder to keep the trace in"
        )
    shutil.copytree(tmp, target, dirs_exist_ok=True)


def _hardware_for(audit: Audit, hardware: str | Hardware | None) -> Hardware | None:
    """The hardware to predict on: the one asked for, else the preset of the target the
    program was compiled for (None: the CPU backend's, which has none)."""
    if hardware is not None:
        return get_hardware(hardware)
    if audit.target in TARGETS:
        return get_target(audit.target).preset
    return None


def _priced_on(audit: Audit, hardware: str | Hardware | None) -> tuple[Audit, Hardware | None]:
    """``audit`` with its collectives priced on the hardware to predict on (as it is when
    there is none, or it is priced there already and no other settings were asked for), and
    that hardware."""
    hw = _hardware_for(audit, hardware)
    if hw is None or (audit.priced_on == hw.name and not isinstance(hardware, Hardware)):
        return audit, hw
    module = audit.module
    if module is None:
        raise ProfileError(
            f"hardware={hw.name!r}: an audit read from JSON is priced on "
            f"{audit.priced_on or 'nothing'} and holds no program to price again; join the "
            f"trace to the program instead, compiled here as it ran and priced on "
            f"{hw.name} (profile_program_trace), or drop hardware",
            param="hardware",
            shell=(
                f"--hardware {hw.name}: an audit read from JSON (--audit) is priced on "
                f"{audit.priced_on or 'nothing'} and holds no program to price again; give the "
                f"program in place of --audit, compiled here as it ran: profile --trace DIR "
                f"FILE.py:FUNCTION --mesh SPEC --hardware {hw.name}; or drop --hardware"
            ),
        )
    collectives = priced(audit.collectives, module, audit.mesh_axes, hw)
    again = replace(audit, collectives=collectives, priced_on=hw.name)
    return (again if audit.program is None else again.with_program(audit.program)), hw


def _compiled_program(audit: Audit) -> CompiledProgram:
    """The planner's record of an audited program (no compile: its facts are the audit's)."""
    return CompiledProgram(
        audit=audit,
        memory=audit.memory or CompiledMemory(),
        flops=audit.flops,
        hlo_flops=audit.hlo_flops,
        rematerializations=audit.rematerializations or (),
        memory_pressure=audit.memory_pressure,
        compile_s=0.0,
    )


def _predicted(audit: Audit, program: CompiledProgram, hw: Hardware | None) -> PredictedStep | None:
    """The planner's figures for the program on ``hw`` (None: no hardware to predict on)."""
    if hw is None:
        return None
    plan = compiled_plan(program, hw)
    exposure = audit.exposure()
    return PredictedStep(
        hardware=hw.name,
        compute_s=plan.compute_time_s,
        comm_s=plan.comm_time_s,
        exposed_s=None if exposure is None else exposure.exposed_s,
        step_s=plan.step_time_s,
        step_overlap_s=plan.step_time_overlap_s,
    )
