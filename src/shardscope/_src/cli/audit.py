"""``shardscope audit PROGRAM``: the checks of its input and its run (its options are in
parsers.py); the built-in demos' audit as one library call. The user's programs and
dumps are audited in audit_program.py, the matmul and the transformer in audit_verdict.py."""

from __future__ import annotations

import math
from typing import Any

import jax

from shardscope._src.audit.compile import audit
from shardscope._src.audit.user_program import check_program_ref
from shardscope._src.base.errors import MeshSpecError, TargetError
from shardscope._src.base.records import STDOUT, write_result
from shardscope._src.cli.audit_program import (
    check_devices_for,
    hlo_file,
    mesh_needed,
    run_audit_hlo,
    run_audit_program,
)
from shardscope._src.cli.audit_verdict import (
    check_matmul_command,
    check_moe_command,
    check_transformer_command,
    run_matmul_command,
    run_moe_command,
    run_transformer_command,
)
from shardscope._src.cli.config import (
    AuditConfig,
    AuditHloConfig,
    AuditMatmulConfig,
    AuditMoEConfig,
    AuditProgramConfig,
    AuditReshardConfig,
    AuditTransformerConfig,
)
from shardscope._src.cli.options import print_more
from shardscope._src.cli.paths import check_output_paths
from shardscope._src.mesh import ensure_devices_for, parse_mesh_spec
from shardscope._src.render.audit import render_audit
from shardscope._src.render.console import output_console
from shardscope._src.sharding.demos import DEFAULT_MESH, check_demo, get_demo
from shardscope._src.targets.mesh import target_mesh
from shardscope._src.targets.specs import Family, get_target
from shardscope._src.targets.topology import topology


def run_audit_command(
    demo: str,
    mesh_spec: str | None = None,
    json_path: str | None = None,
    *,
    devices: int | None = None,
    console: Any = None,
    target: str | None = None,
    by_scope: bool = False,
    verbose: bool = False,
) -> int:
    """Audits a built-in demo, prints its table, optionally writes JSON; returns 0.

    Args:
        demo: a name from ``shardscope._src.sharding.demos.DEMOS`` (``"matmul"``, ``"reshard"``).
        mesh_spec: a mesh description such as ``"model=8"`` or ``"dp=2,model=4"``;
            None for the demo's default (``model=8``).
        json_path: where to write ``Audit.to_dict()`` as JSON (atomically), or None.
        devices: simulated CPU devices to ask for (per process in a multi-process run);
            None: enough for the mesh, at least 8, if JAX has not started yet.
        console: a rich Console to print to (default: stdout).
        target: compile for this target's devices with its own compiler (``"h100"``);
            None or ``"cpu"``: simulated CPU devices.
        by_scope: print the totals per scope (``Audit.by_scope``) instead of one row per
            collective.
        verbose: print everything (else the answer on one screen and a line saying where
            the rest is).

    Raises:
        ShardscopeError: an unknown demo or a bad mesh (MeshSpecError); the CLI turns it into
            one line on stderr and exit status 2.
    """

    if mesh_spec is not None and not mesh_spec.strip():
        raise MeshSpecError("--mesh is empty; write axes as name=size, e.g. 'dp=2,model=4'")

    mesh: Any = mesh_spec
    if target is not None and get_target(target).family != Family.CPU:
        mesh = target_mesh(target, mesh_spec or DEFAULT_MESH, axis_types="auto")
    else:
        ensure_devices_for(mesh_spec, devices)
        check_devices_for(mesh_spec or DEFAULT_MESH)

    program = get_demo(demo, mesh)
    result = audit(program)
    if jax.process_index() != 0:
        return 0  # every process compiles the same program; process 0 reports it
    console = console or output_console()
    render_audit(
        result,
        console=console,
        title=f"{program.name}: {program.description}",
        by_scope=by_scope,
        verbose=verbose,
    )
    if not verbose:
        print_more(console, report=False)
    if json_path is not None:
        leading = {"demo": program.name, "description": program.description}
        write_result(json_path, result, leading=leading)
    return 0


def check_audit(c: AuditConfig) -> None:
    """Everything ``audit`` can refuse before JAX starts (also run by ``launch``, once)."""

    target = _audit_target(c)  # a target that cannot take these options
    hlo = c.hlo if isinstance(c, AuditHloConfig) else None
    check_output_paths({"--json": c.json}, {"--hlo": hlo})
    mesh = c.mesh_or_default
    if mesh and c.devices and not c.multiprocess.detect and target is None:
        _check_mesh_fits(mesh, c.devices, c.multiprocess.num_processes)
    if target is not None and mesh:
        topology(target, math.prod(parse_mesh_spec(mesh).values()))  # a count it comes in
    if isinstance(c, AuditProgramConfig):
        mesh_needed(c.mesh, f"auditing {c.program_ref}")
        check_program_ref(c.program_ref)
    elif isinstance(c, AuditHloConfig):
        mesh_needed(c.mesh, f"auditing --hlo {c.hlo}")
        hlo_file(c.hlo)
    elif isinstance(c, AuditReshardConfig):
        check_demo("reshard", mesh)
    elif isinstance(c, AuditMatmulConfig):
        check_matmul_command(mesh, c.m, c.k, c.n, c.dtype, c.a_spec, c.b_spec, c.out_spec)
    elif isinstance(c, AuditMoEConfig):
        check_moe_command(mesh, c.tokens, c.experts, c.top_k, c.capacity_factor, c.dtype)
    elif isinstance(c, AuditTransformerConfig):
        check_transformer_command(c.strategy, c.mesh, **c.sizes)


def _check_mesh_fits(mesh: str, devices: int, num_processes: int | None) -> None:
    """Refuses a mesh larger than the simulated devices of this run."""
    need = math.prod(parse_mesh_spec(mesh).values())
    if num_processes is None and need > devices:
        raise MeshSpecError(
            f"mesh {mesh!r} needs {need} devices but --devices {devices} simulates "
            f"{devices}; give --devices {need} or a smaller mesh"
        )
    if num_processes is not None and need > devices * num_processes:
        have = devices * num_processes
        raise MeshSpecError(
            f"mesh {mesh!r} needs {need} devices but {num_processes} processes of "
            f"{devices} devices hold {have}; give more processes or devices, or a "
            f"smaller mesh"
        )


def audit_command(c: AuditConfig) -> int:

    target = _audit_target(c)
    if target is not None:
        if c.json is not None and c.json == STDOUT:
            return _run_audit_program(c, c.json, output_console(stderr=True), target)
        return _run_audit_program(c, c.json, None, target)
    c.multiprocess.initialize()
    ensure_devices_for(c.mesh_or_default, c.devices)

    json_path, console = c.json, None
    if json_path == STDOUT:  # the JSON owns standard output; tables go to standard error
        console = output_console(stderr=True)
    if jax.process_index() != 0:  # every process compiles the same program; 0 reports it
        from rich.console import Console

        json_path, console = None, Console(quiet=True)
    return _run_audit_program(c, json_path, console, None)


def _audit_target(c: AuditConfig) -> str | None:
    """The GPU/TPU target of ``audit --compiler``, or None for simulated CPU devices."""
    if c.compile_target is None:
        return None

    t = get_target(c.compile_target)
    if t.family == Family.CPU:
        return None
    if c.devices is not None:
        raise TargetError(
            f"--devices simulates CPU devices; with --compiler {t.name} the mesh alone sets the "
            f"device count: drop --devices"
        )
    if c.multiprocess.num_processes is not None or c.multiprocess.detect:
        raise TargetError(
            f"--compiler {t.name} compiles in one process for devices it does not have: drop "
            f"the multi-process options"
        )
    return t.name


def _run_audit_program(
    c: AuditConfig, json_path: str | None, console: Any, target: str | None
) -> int:
    shown = {"console": console, "by_scope": c.by_scope, "verbose": c.verbose}
    if isinstance(c, AuditProgramConfig):
        return run_audit_program(
            c.program_ref,
            c.mesh,
            json_path,
            rules_path=c.rules,
            rule_set=c.rule_set,
            target=target,
            axis_types=c.axis_types,
            **shown,
        )
    if isinstance(c, AuditHloConfig):
        return run_audit_hlo(c.hlo, c.mesh, json_path, **shown)
    if isinstance(c, AuditReshardConfig):
        return run_audit_command("reshard", c.mesh, json_path, target=target, **shown)
    if isinstance(c, AuditMatmulConfig):
        mesh = c.mesh_or_default
        assert mesh is not None  # the matmul's parser gives a default mesh
        return run_matmul_command(
            mesh,
            c.m,
            c.k,
            c.n,
            c.dtype,
            c.a_spec,
            c.b_spec,
            c.out_spec,
            json_path,
            hints=c.hints,
            target=target,
            **shown,
        )
    if isinstance(c, AuditMoEConfig):
        mesh = c.mesh_or_default
        assert mesh is not None  # the parser gives a default mesh
        return run_moe_command(
            mesh,
            json_path,
            tokens=c.tokens,
            d_model=c.d_model,
            ff=c.ff,
            experts=c.experts,
            top_k=c.top_k,
            capacity_factor=c.capacity_factor,
            dtype=c.dtype,
            mode=c.mode,
            impl=c.impl,
            dispatch_once=c.dispatch_once,
            weight_activations=c.weight_activations,
            target=target,
            **shown,
        )
    assert isinstance(c, AuditTransformerConfig)
    return run_transformer_command(
        c.strategy,
        c.mesh,
        c.layers,
        json_path,
        mode=c.mode,
        impl=c.impl,
        constraints=c.constraints,
        d_model=c.d_model,
        heads=c.heads,
        ff=c.ff,
        batch=c.batch,
        seq=c.seq,
        dtype=c.dtype,
        hints=c.hints,
        target=target,
        **shown,
    )
