"""The collective audit: what a compiled JAX program communicates, by kind, axis and line.

``audit(f, *args)`` compiles (or takes) a program, parses its optimized HLO once
(:mod:`shardscope._src.hlo.parse`), finds every collective, however deeply it sits in called, fused,
async-wrapped, looped or branched computations, names the user's mesh axes it runs over
(:mod:`~shardscope._src.hlo.groups`) and prices it (:mod:`~shardscope._src.base.comm`).
The result is plain
data: :class:`Collective` records inside an :class:`Audit`.

Example (needs 8 simulated devices, so not run as a doctest)::

    mesh = shardscope.make_mesh("model=8")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32,
                             sharding=NamedSharding(mesh, P("model", None)))
    a = shardscope.audit(jax.jit(lambda x, w: x @ w), x, w)
    a.counts()["all-reduce"], a.collectives[0].axes     # (1, ('model',))
    a.expect(all_reduce=1, all_gather=0)                # raises AssertionError if not
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax

from shardscope._src.audit.analysis import analyze
from shardscope._src.audit.names import carried_names
from shardscope._src.audit.overlap import program_cost
from shardscope._src.audit.pricing import priced
from shardscope._src.audit.ragged import dense_ragged_dots
from shardscope._src.audit.records import (
    Audit,
    AuditedProgram,
    MemoryPressure,
    Rematerialization,
)
from shardscope._src.audit.stages import lower_step_traced, lower_traced, unwrap_stage
from shardscope._src.audit.width import widened_dtype
from shardscope._src.base.errors import (
    DeviceMemoryError,
    HloParseError,
    MeshSpecError,
    ShardscopeError,
    TargetError,
)
from shardscope._src.base.stderr import capture_stderr
from shardscope._src.base.text import format_spec
from shardscope._src.cost.memory import CompiledMemory
from shardscope._src.hlo.cost import Cost
from shardscope._src.hlo.parse import MAIN_THREAD, HloModule, parse_hlo, parse_metadata
from shardscope._src.mesh import (
    axis_types_name,
    axis_types_of,
    first_devices_mesh,
    format_mesh_spec,
    make_mesh,
    mesh_axes,
    parse_mesh_spec,
)
from shardscope._src.sharding.rules import (
    Rules,
    choose_rule_set,
    find_rule_sets,
    refused_axis,
    rules_for_mesh,
    rules_unmapped_error,
    unused_rules,
)
from shardscope._src.targets.devices import target_of_device
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.mesh import check_mesh_target, target_mesh
from shardscope._src.targets.specs import TARGETS, get_target

# --------------------------------------------------------------------------------------
# Front door: audit(program, ...)
# --------------------------------------------------------------------------------------


def _mesh_from(mesh: Any) -> dict[str, int] | None:
    if mesh is None:
        return None
    if isinstance(mesh, str | Mapping):
        return parse_mesh_spec(mesh)
    if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
        return mesh_axes(mesh)
    raise MeshSpecError(
        f"mesh must be a jax.sharding.Mesh or a description such as 'dp=2,mp=4', "
        f"got {type(mesh).__name__}"
    )


def _shardings_in(tree: Any) -> list[Any]:
    """The shardings in a pytree of them (``compiled.input_shardings``): its leaves that have a
    ``device_set``."""

    return jax.tree.leaves(tree, is_leaf=lambda x: hasattr(x, "device_set"))


def _format_sharding(s: Any) -> str:
    spec = getattr(s, "spec", None)
    if spec is not None:
        return format_spec(tuple(spec))
    return str(s)


def _mesh_of_shardings(shardings: list[Any]) -> dict[str, int] | None:
    for s in shardings:
        m = getattr(s, "mesh", None)
        if m is not None and hasattr(m, "axis_names"):
            return mesh_axes(m)
    return None


def _flops(compiled: Any) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not isinstance(cost, Mapping):
        return None
    flops = cost.get("flops")
    return float(flops) if isinstance(flops, int | float) and math.isfinite(flops) else None


#: The one axis an audit names when neither the caller nor the program's shardings give a mesh.
#: XLA options for compiles whose program is audited or checked, not timed: without LLVM's
#: optimisations and the CPU fusion emitters a program compiles several times faster (a 7B
#: train step 3 to 6 times), with the same collectives and arguments and outputs; the
#: planner's programs' temporaries within 0.01% (tests/test_plan.py checks it), a train step
#: that keeps FSDP's gathered weights within 1%. The planner compiles with them, and
#: ``shardscope lab``.
FAST_COMPILE_OPTIONS: Mapping[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
}

_FALLBACK_AXIS = "devices"

_REMAT_MARK = "Involuntary full rematerialization"
#: XLA's rematerialization pass, when it cannot bring a program under the memory it has.
_PRESSURE_MARK = "Can't reduce memory use below"
#: The compiler's log lines an audit reads into records (the partitioner's
#: rematerializations, the memory the rematerialization pass could not reach): a caller
#: that shows those records as notes drops the lines from the terminal
#: (``capture_stderr(drop=RECORDED_LOG_LINES)``), where an audit of the user's own program
#: passes them on.
RECORDED_LOG_LINES = (_REMAT_MARK, _PRESSURE_MARK)
_BYTES = r"[\d.]+\s*[KMGT]?i?B\s*\((\d+) bytes\)"


def parse_memory_pressure(log: str) -> MemoryPressure | None:
    """The rematerialization pass's "Can't reduce memory use below X by rematerialization;
    only reduced to Y, down from Z originally" in a compile log (None: not logged)."""
    for line in log.splitlines():
        if _PRESSURE_MARK not in line:
            continue
        m = re.search(
            rf"below {_BYTES} by rematerialization; only reduced to {_BYTES}, down from {_BYTES}",
            line,
        )
        if m is not None:
            limit, reached, original = (int(g) for g in m.groups())
            return MemoryPressure(limit, reached, original)
    return None


def _balanced_after(text: str, marker: str) -> str | None:
    i = text.find(marker)
    if i < 0:
        return None
    i += len(marker)
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i : j + 1]
    return None


def parse_rematerializations(log: str, module: HloModule | None) -> tuple[Rematerialization, ...]:
    """The partitioner's rematerialization warnings in a compile log, with source lines."""
    out = []
    for line in log.splitlines():
        if _REMAT_MARK not in line:
            continue
        frm = _balanced_after(line, "from sharding ")
        to = None
        if frm is not None:
            rest = line[line.find(frm) + len(frm) :]
            to = _balanced_after(rest, " to ")
        name = None
        m = re.search(r"HLO operation:?\s*%?([\w.\-]+)\s*=", line)
        if m:
            name = m.group(1)
        op_name = None
        source = None
        md = _balanced_after(line, "metadata=")
        if md is not None:
            try:
                meta = parse_metadata(md)
            except HloParseError:
                meta = None
            if meta is not None:
                op_name = meta.op_name
                if module is not None:
                    stack = module.stack(meta.stack_frame_id)
                    source = str(stack[0]) if stack else None
        out.append(Rematerialization(name, frm, to, op_name, source, line.strip()))
    return tuple(out)


def audit(
    program: Any,
    /,
    *args: Any,
    mesh: Any = None,
    target: Any = None,
    compiler_options: Mapping[str, Any] | None = None,
    axis_types: Any = None,
    **jit_kwargs: Any,
) -> Audit:
    """Audits the collectives of a compiled JAX program.

    Args:
        program: a jitted function (give its example arguments: arrays or
            ``jax.ShapeDtypeStruct`` with shardings, so nothing is allocated), a plain
            function (``in_shardings`` / ``out_shardings`` go in ``jit_kwargs``), a
            ``jax.stages.Lowered``, a ``jax.stages.Compiled``, or the text of
            ``compiled.as_text()`` (a ``pathlib.Path`` to a file of it, such as XLA's
            ``*after_optimizations.txt`` dump, is read).
        *args: example arguments when ``program`` is a function.
        mesh: a ``jax.sharding.Mesh`` or a description such as ``"dp=2,mp=4"`` (devices in
            iota order) naming the axes. Optional when the program's shardings carry a mesh;
            for HLO text without one, the axis is called ``devices``.
        target: a compile target (``"h100"``, ``"tpu-v5p"``, ``"cpu"``; see
            ``shardscope.TARGETS``) to compile a function for: with a mesh description the
            mesh is made of that target's compile-only devices
            (:func:`shardscope.target_mesh`); with a ``Mesh``, or none (then the mesh the
            arguments are sharded over, else the one ``jax.set_mesh`` set), its devices must
            be the target's. The audit then shows what that target's own compiler inserts.
        compiler_options: XLA options for compiling a function or a ``Lowered``
            (``lowered.compile(compiler_options=...)``), e.g.
            ``{"xla_backend_optimization_level": 0}``.
        axis_types: the axes' type of the mesh built from a description, as in
            :func:`shardscope.make_mesh` (default: JAX's, Explicit; ``"auto"`` for a program
            that steers the compiler with ``with_sharding_constraint``).
        **jit_kwargs: options for ``jax.jit`` when ``program`` is a function.

    Returns:
        An :class:`Audit`.

    Raises:
        HloParseError: the text is not optimized HLO (or is the name of a file: give it as a
            ``Path``).
        DeviceMemoryError: the compiler ran out of device memory (the TPU's does).
        MeshSpecError: the mesh does not hold the program's number of partitions.
        TargetError: an unknown target, its compiler not installed, a device count it is
            not built with, or a mesh of other devices.
    """

    given_axes = _mesh_from(mesh)  # a bad mesh is refused before anything is compiled
    if isinstance(program, os.PathLike):
        program = _read_hlo_file(program)
    elif isinstance(program, str):
        _refuse_a_file_name(program)
    if axis_types is not None and not isinstance(mesh, str | Mapping):
        raise MeshSpecError(
            f"axis_types={axis_types!r} is for a mesh built from a description (mesh='data=8'); "
            f"a Mesh has its own axis types: drop axis_types",
            param="axis_types",
        )
    if isinstance(mesh, str | Mapping):
        axis_types_of(axis_types, tuple(given_axes or ()))  # refused before compiling too
    if target is not None:
        mesh = _target_mesh_for(program, mesh, target, args, jit_kwargs, axis_types)
    if isinstance(program, str):
        _refuse_options_for_text(args, jit_kwargs, compiler_options)
        return _audit_text(program, given_axes)
    compiled, log, jaxpr = _compile(program, args, jit_kwargs, mesh, compiler_options, axis_types)
    return _audit_compiled(compiled, log, given_axes, target, jaxpr)


def audit_program(
    make_step: Any,
    mesh: Any,
    *,
    rules: Any = None,
    rule_set: str | None = None,
    axis_types: Any = None,
    target: Any = None,
    where: str | None = None,
) -> Audit:
    """Audits the step ``make_step(mesh)`` (or ``make_step(mesh, rules)``) builds for a mesh:
    what ``shardscope audit FILE.py:FUNCTION`` runs.

    Args:
        make_step: returns ``(jitted step, its arguments)`` for the mesh it is given, or the
            step's ``jax.stages.Lowered`` or ``Compiled``. It runs with no mesh set; the step
            is lowered inside ``with jax.set_mesh(mesh):``, Flax's logical-axis rules in force
            through both when there are rules.
        mesh: a ``jax.sharding.Mesh``, or a description (``"data=2,model=4"``) built of the
            first simulated CPU devices, or of ``target``'s compile-only devices.
        rules: logical-axis rules, as ``shardscope audit FILE.py:FUNCTION --rules`` takes
            them: ``(logical name, mesh axes)`` pairs or a ``{logical name: mesh axes}``
            mapping (one set), ``{name: pairs}`` (named sets), or the path of a rules file
            (JSON, ``{"rules": {name: [[logical, mesh axes], ...]}}``). None (the default):
            the ``RULES`` of ``make_step``'s module when it defines them, else no rules.
        rule_set: the set to use when there are several (``--rule-set``).
        axis_types: the axes' type when ``mesh`` is a description, as in
            :func:`shardscope.make_mesh` (default: JAX's, Explicit).
        target: compile for this target with its own compiler (see ``shardscope.TARGETS``).
        where: what to call ``make_step`` in errors (default: its name).

    Raises:
        ProgramError: ``make_step`` returned something else than a step and its arguments.
        AxisTypeError: the program's shardings do not fit the mesh's axis types (names the
            one they fit).
        MissingMeshError: ``make_step`` needs a mesh set while it runs.
        RulesError: rules that are not pairs, name an axis the mesh lacks or cannot be read,
            several sets and no ``rule_set`` naming one of them, or a set that does not map
            logical names the program uses (naming every one, and a close one the set maps
            where the program does not use it).

    With rules, the audit's :attr:`~shardscope.Audit.unused_rules` are those that shard a
    logical name no array of the program carries (found by building the program once more,
    on one device).
    """
    mesh, pairs = step_mesh(make_step, mesh, rules, rule_set, axis_types, target)
    name = where or getattr(make_step, "__qualname__", None) or "make_step"
    kinds = getattr(mesh, "axis_types", None) or (None,)
    mapped = [n for n, _ in pairs]
    try:
        stage, jaxpr = lower_step_traced(make_step, mesh, pairs, where=name)
    except ValueError as e:  # a logical name the rules lack reached JAX as a mesh axis
        explained = None
        if pairs and refused_axis(e) is not None:
            # JAX names the first; the names the program carries give every one at once
            used = carried_names(make_step, mapped, axis_type=kinds[0], where=name)
            explained = rules_unmapped_error(
                e,
                rules,
                rule_set,
                make_step,
                program=name,
                used=used,
                mesh_axes=tuple(map(str, mesh.axis_names)),
            )
        if explained is not None:
            raise explained from e
        raise
    compiled, log, _ = _compile(stage, (), {}, mesh, None)
    result = _audit_compiled(compiled, log, _mesh_from(mesh), None, jaxpr)
    if not any(axes is not None for _, axes in pairs):
        return result
    used = carried_names(make_step, mapped, axis_type=kinds[0], where=name)
    chosen = choose_rule_set(find_rule_sets(rules, make_step), rule_set)
    unused = () if used is None or chosen is None else unused_rules({chosen[0]: pairs}, used)
    if not unused:
        return result
    program = result.program
    result = dataclasses.replace(result, unused_rules=unused[0])
    return result if program is None else result.with_program(program)


def step_mesh(
    make_step: Any, mesh: Any, rules: Any, rule_set: str | None, axis_types: Any, target: Any
) -> tuple[Any, Rules]:
    """The mesh ``make_step`` is given (``mesh`` itself, or built from a description of the
    first devices or of ``target``'s compile-only ones) and the logical-axis rules in force,
    as :func:`audit_program` takes them."""
    # The rules are checked against the mesh's axes before any device is asked for.
    described = isinstance(mesh, str | Mapping)
    names = tuple(parse_mesh_spec(mesh)) if described else tuple(map(str, mesh.axis_names))
    pairs = rules_for_mesh(rules, rule_set, make_step, names)
    if described:
        axes = parse_mesh_spec(mesh)
        if target is not None:
            mesh = target_mesh(target, axes, axis_types=axis_types)
        else:
            mesh = first_devices_mesh(axes, axis_types=axis_types)
    elif axis_types is not None:
        raise MeshSpecError(
            f"axis_types={axis_types!r} builds a mesh from a description, but mesh is a Mesh "
            f"(its axes are {axis_types_name(mesh)}): drop axis_types or pass a description",
            param="axis_types",
        )
    return mesh, pairs


def _read_hlo_file(path: os.PathLike[str]) -> str:
    """The HLO text in the file at ``path``."""
    shown = f"Path({os.fspath(path)!r})"
    if not os.path.exists(path):
        raise ShardscopeError(
            f"audit({shown}): no such file; give the path of optimized HLO (XLA's "
            f"*after_optimizations.txt dump) or the text itself"
        )
    if os.path.isdir(path):
        raise ShardscopeError(
            f"audit({shown}) is a folder; give the path of one optimized HLO file in it "
            f"(*after_optimizations.txt)"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ShardscopeError(f"audit({shown}): the file cannot be read: {e}") from None


def _refuse_a_file_name(text: str) -> None:
    """Refuses a one-line string that names an existing file: a path given as text."""
    line = text.strip()
    if not line or "\n" in line or "\0" in line or len(line) > 4096:
        return
    try:
        is_file = os.path.isfile(line)
    except (OSError, ValueError):
        return
    if is_file:
        raise HloParseError(
            f"audit({line!r}): this is a file name, not HLO text; pass "
            f"pathlib.Path({line!r}) to read the file, or its text"
        )


def _refuse_options_for_text(
    args: tuple[Any, ...], jit_kwargs: dict[str, Any], compiler_options: Any
) -> None:
    if args or jit_kwargs:
        raise ShardscopeError(
            "audit(hlo_text, ...) takes no example arguments or jit options; pass only "
            "mesh= (e.g. audit(text, mesh='dp=2,mp=4'))"
        )
    if compiler_options:
        raise ShardscopeError(
            "audit(hlo_text, compiler_options=...): HLO text is already compiled; drop "
            "compiler_options"
        )


def _compile(
    program: Any,
    args: tuple[Any, ...],
    jit_kwargs: dict[str, Any],
    mesh: Any,
    compiler_options: Mapping[str, Any] | None,
    axis_types: Any = None,
) -> tuple[Any, str | None, Any | None]:
    """``(compiled program, the compiler's log, the function's jaxpr)``: a Compiled as it is
    (no log), a Lowered or a function compiled with ``compiler_options``; the jaxpr is the
    trace of a function the audit lowered itself (:func:`_lowered`), else None."""
    # A library's Compiled or Lowered (Flax's, Equinox's) holds JAX's own.
    program = unwrap_stage(program, jax.stages.Compiled) or (
        unwrap_stage(program, jax.stages.Lowered) or program
    )
    if isinstance(program, jax.stages.Compiled):
        if args or jit_kwargs:
            raise ShardscopeError(
                "audit(compiled) takes no example arguments or jit options: the program "
                "is already compiled"
            )
        if compiler_options:
            raise ShardscopeError(
                "audit(compiled, compiler_options=...): the program is already compiled; "
                "pass its Lowered (or the function) to compile it with these options"
            )
        return program, None, None
    lowered, jaxpr = _lowered(program, args, jit_kwargs, mesh, axis_types)
    with capture_stderr() as captured:
        compiled = compile_lowered(lowered, **(compiler_options or {}))
    return compiled, captured[0] if captured else None, jaxpr


def _lowered(
    program: Any, args: tuple[Any, ...], jit_kwargs: dict[str, Any], mesh: Any, axis_types: Any
) -> tuple[Any, Any | None]:
    """A Lowered as it is (no jaxpr); a function lowered on its example arguments, with its
    jaxpr where it has one (:func:`~shardscope._src.audit.stages.lower_traced`)."""
    if isinstance(program, jax.stages.Lowered):
        if args or jit_kwargs:
            raise ShardscopeError(
                "audit(lowered) takes no example arguments or jit options: the "
                "program is already lowered"
            )
        return program, None
    if callable(program) or hasattr(program, "lower"):
        return _lower(program, args, jit_kwargs, mesh, axis_types)
    raise ShardscopeError(
        f"audit() needs a jitted function (jax.jit, flax.nnx.jit, "
        f"equinox.filter_jit or another library's), a plain function, a Lowered "
        f"or Compiled (JAX's or a library's), or HLO text; got "
        f"{type(program).__name__}"
    )


@dataclass(frozen=True)
class ProgramFacts:
    """What a compiled program tells beside its HLO text: the fields of :class:`Audit` that
    an audit of bare text leaves None."""

    memory: CompiledMemory | None
    flops: float | None
    in_shardings: tuple[str, ...]
    out_shardings: tuple[str, ...]
    backend: str | None
    target: str | None


def _audit_text(
    text: str,
    axes: dict[str, int] | None,
    *,
    compiled: jax.stages.Compiled | None = None,
    log: str | None = None,
    facts: ProgramFacts | None = None,
    jaxpr: Any = None,
) -> Audit:
    """The audit of HLO text; of a ``compiled`` program's text with its ``facts`` and, when
    the audit compiled it, the compiler's ``log`` (its rematerializations) and the function's
    ``jaxpr`` (its ragged dots computed densely)."""
    module = parse_hlo(text)
    axes = _axes_of(module, axes)
    collectives, unknown = analyze(module, axes)
    threads = {c.execution_thread for c in module.computations.values()} - {MAIN_THREAD}
    remats = None
    pressure = None
    if log is not None:
        log = _LOGS.read(compiled, log)
        remats = parse_rematerializations(log, module)
        pressure = parse_memory_pressure(log)
    hardware = _hardware_of(None if facts is None else facts.target)
    cost: Cost | None = None
    try:
        cost = program_cost(module)
        if hardware is not None:
            collectives = priced(collectives, module, axes, hardware)
    except RecursionError:  # calls nested deeper than Python's stack: neither is known
        cost, hardware = None, None

    result = Audit(
        collectives=collectives,
        mesh_axes=axes,
        num_partitions=module.num_partitions,
        module_name=module.name,
        memory=None if facts is None else facts.memory,
        flops=None if facts is None else facts.flops,
        in_shardings=None if facts is None else facts.in_shardings,
        out_shardings=None if facts is None else facts.out_shardings,
        rematerializations=remats,
        unknown_instructions=unknown,
        execution_threads=tuple(sorted(threads)),
        backend=None if facts is None else facts.backend,
        target=None if facts is None else facts.target,
        hlo_flops=None if cost is None else cost.flops,
        hlo_bytes=None if cost is None else cost.bytes,
        priced_on=None if hardware is None else hardware.name,
        memory_pressure=pressure,
        ragged_dots=dense_ragged_dots(jaxpr, None if facts is None else facts.backend, module),
        widened_dtype=widened_dtype(module, None if facts is None else facts.backend, collectives),
    )
    return result.with_program(AuditedProgram(text, module, compiled))


def _hardware_of(target: str | None) -> Hardware | None:
    """The hardware preset a compile target prices on (None: the CPU backend, or none)."""
    if target is None or target not in TARGETS:
        return None
    return get_target(target).preset


def _audit_compiled(
    compiled: jax.stages.Compiled,
    log: str | None,
    given_axes: dict[str, int] | None,
    target: Any,
    jaxpr: Any = None,
) -> Audit:
    """The audit of a compiled program: its HLO, shardings, memory, flops, with the
    compiler's log its rematerializations, and with the function's ``jaxpr`` the ragged dots
    it computes densely."""
    in_leaves = _shardings_in(compiled.input_shardings)
    out_leaves = _shardings_in(compiled.output_shardings)
    backend, compiled_for = _compiled_for(in_leaves + out_leaves)
    if target is not None and compiled_for != get_target(target).name:
        raise TargetError(
            f"the program was compiled for {compiled_for or backend} devices, not "
            f"{get_target(target).name}; give its arguments no shardings of their own "
            f"(the target's mesh is set around the program) or build them on "
            f"shardscope.target_mesh({get_target(target).name!r}, ...)"
        )
    facts = ProgramFacts(
        memory=CompiledMemory.from_stats(compiled.memory_analysis()),
        flops=_flops(compiled),
        in_shardings=tuple(_format_sharding(s) for s in in_leaves),
        out_shardings=tuple(_format_sharding(s) for s in out_leaves),
        # a program that takes and returns no array names no devices: JAX's default ones
        backend=backend or jax.default_backend(),
        target=compiled_for,
    )
    axes = given_axes or _mesh_of_shardings(in_leaves + out_leaves)
    text = compiled.as_text()
    if text is None:
        raise HloParseError(
            "JAX gives no HLO text for this compiled program, so there is nothing to audit; "
            "audit the jitted function or its lowering instead"
        )
    return _audit_text(text, axes, compiled=compiled, log=log, facts=facts, jaxpr=jaxpr)


def _axes_of(module: HloModule, axes: dict[str, int] | None) -> dict[str, int]:
    """The mesh axes the audit names (``devices`` for all of them when none are known),
    checked against the program's partition count."""
    n = module.num_partitions
    axes = axes or {_FALLBACK_AXIS: n}
    if math.prod(axes.values()) != n:
        size = math.prod(axes.values())
        shape = " x ".join(str(v) for v in axes.values()) + f" = {size}" if len(axes) > 1 else size
        raise MeshSpecError(
            f"mesh {format_mesh_spec(axes)!r} holds {shape} "
            f"devices but the program is partitioned over {n} "
            f"(num_partitions in the HLO module header); describe a mesh whose sizes "
            f"multiply to {n}, in the order the program's mesh uses"
        )
    return axes


class _CompileLogs:
    """What the compiler logged for each executable, while it lives: the lines the audit
    reads (the partitioner's rematerializations, the rematerialization pass's memory).

    JAX serves a program it compiled before from its cache, and then no compiler runs and
    nothing is logged; the executable it serves is the one compiled then, so the log read
    then is kept with it (a weak reference: forgotten with the executable).
    """

    def __init__(self) -> None:
        self._found: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()

    def read(self, compiled: jax.stages.Compiled | None, log: str) -> str:
        """The lines of ``log`` the audit reads; for a program compiled before (an empty
        log) those its executable's compile logged."""
        kept = "\n".join(
            line for line in log.splitlines() if _REMAT_MARK in line or _PRESSURE_MARK in line
        )
        key = _executable_of(compiled)
        if key is None:
            return kept
        if kept:
            self._found[key] = kept
            return kept
        return self._found.get(key, "")


def _executable_of(compiled: jax.stages.Compiled | None) -> object | None:
    """The executable JAX's compile cache hands out again for the same program, or None.

    ``jax.stages.Compiled`` is a new wrapper on every compile and has no public handle on
    what it wraps (``runtime_executable()`` cannot be weakly referenced); its private
    ``_executable`` is the cached object, used here alone.
    """
    executable: object | None = getattr(compiled, "_executable", None)
    if executable is None:
        return None
    try:
        weakref.ref(executable)
    except TypeError:
        return None
    return executable


_LOGS = _CompileLogs()


def compile_lowered(lowered: Any, **compiler_options: Any) -> Any:
    """``lowered.compile()``; a compiler that runs out of device memory (the TPU's does, at
    compile time) raises :class:`DeviceMemoryError` with its own words."""
    try:
        return lowered.compile(compiler_options=compiler_options or None)
    except jax.errors.JaxRuntimeError as e:
        words = _out_of_memory(e)
        if words is None:
            raise
        raise DeviceMemoryError(
            f"the program does not fit in device memory, says the compiler: {words}; shard "
            f"it over more devices or make it smaller (batch, sequence, rematerialization)"
        ) from None


def _out_of_memory(error: Exception) -> str | None:
    """The compiler's own words when ``error`` says the program does not fit in device
    memory, else None. XLA's status code reaches Python only in the message's text
    (``JaxRuntimeError`` carries no code in JAX 0.10.2), so this one check reads it."""
    words = str(error)
    if "RESOURCE_EXHAUSTED" not in words:
        return None
    rest = words.split("RESOURCE_EXHAUSTED:", 1)[-1].strip().splitlines()
    return rest[0] if rest else ""


def _target_mesh_for(
    program: Any,
    mesh: Any,
    target: Any,
    args: tuple[Any, ...],
    jit_kwargs: dict[str, Any],
    axis_types: Any = None,
) -> Any:
    """The mesh of ``target``'s devices that ``audit(..., target=)`` lowers the program on."""
    t = get_target(target)
    if isinstance(program, str) or not callable(program) and not hasattr(program, "lower"):
        raise TargetError(
            "audit(..., target=) compiles a function for the target; HLO text (and a "
            "Lowered or Compiled program) already has its devices: drop target="
        )
    if mesh is None:
        mesh = _devices_mesh(args)
    if mesh is None:
        raise TargetError(
            f"audit(..., target={t.name!r}) compiles for {t.name} devices but knows no mesh "
            f"of them: give mesh='data=8' (made of the target's compile-only devices), or "
            f"arguments sharded over shardscope.target_mesh({t.name!r}, ...), or audit inside "
            f"`with jax.set_mesh(mesh):` with such a mesh",
            param="mesh",
        )
    if isinstance(mesh, str | Mapping):
        return target_mesh(t, mesh, axis_types=axis_types)
    check_mesh_target(mesh, t)
    return mesh


def _devices_mesh(args: tuple[Any, ...]) -> Any:
    """The mesh of devices the arguments' shardings name, else the one ``jax.set_mesh`` set;
    None when there is neither."""
    for leaf in jax.tree.leaves(args):
        m = getattr(getattr(leaf, "sharding", None), "mesh", None)
        if isinstance(m, jax.sharding.Mesh) and not m.empty:
            return m
    current = jax.sharding.get_mesh()
    return current if isinstance(current, jax.sharding.Mesh) and not current.empty else None


def _compiled_for(shardings: list[Any]) -> tuple[str | None, str | None]:
    """(platform, target name) of the devices a compiled program's shardings name."""
    for s in shardings:
        devices = getattr(s, "device_set", None)
        if devices:
            device = next(iter(devices))
            platform = str(getattr(device, "platform", "")) or None
            name = target_of_device(device)
            if name is None and platform == "cpu":
                name = "cpu"
            return platform, name
    return None, None


def _lower(
    program: Any, args: tuple[Any, ...], jit_kwargs: dict[str, Any], mesh: Any, axis_types: Any
) -> tuple[Any, Any | None]:

    ctx: Any = contextlib.nullcontext()
    if mesh is not None and not isinstance(mesh, str | Mapping):
        ctx = jax.set_mesh(mesh)
    elif mesh is not None:
        # A description names axes for bare PartitionSpecs in the program; one that does not
        # fit the devices is reported against the compiled program's partition count below.
        if math.prod(parse_mesh_spec(mesh).values()) == jax.device_count():
            ctx = jax.set_mesh(make_mesh(mesh, axis_types=axis_types))
    with ctx:
        return lower_traced(program, args, jit_kwargs)
