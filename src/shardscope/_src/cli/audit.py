"""``shardscope audit``: the CLI's work as one library function (argparse lives in cli/main.py)."""

from __future__ import annotations

from typing import Any

import jax

from shardscope._src.audit.compile import audit
from shardscope._src.base.errors import MeshSpecError
from shardscope._src.base.io import write_result
from shardscope._src.base.targets import CPU, get_target
from shardscope._src.mesh import ensure_devices_for
from shardscope._src.render.audit import render_audit
from shardscope._src.sharding.demos import DEFAULT_MESH, get_demo
from shardscope._src.target_mesh import target_mesh


def run_audit_command(
    demo: str,
    mesh_spec: str | None = None,
    json_path: str | None = None,
    *,
    devices: int | None = None,
    console: Any = None,
    target: str | None = None,
    by_scope: bool = False,
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

    Raises:
        ShardscopeError: an unknown demo or a bad mesh (MeshSpecError); the CLI turns it into
            one line on stderr and exit status 2.
    """

    if mesh_spec is not None and not mesh_spec.strip():
        raise MeshSpecError("--mesh is empty; write axes as name=size, e.g. 'dp=2,model=4'")

    mesh: Any = mesh_spec
    if target is not None and get_target(target).family != CPU:
        mesh = target_mesh(target, mesh_spec or DEFAULT_MESH)
    else:
        ensure_devices_for(mesh_spec, devices)

    program = get_demo(demo, mesh)
    result = audit(program)
    if jax.process_index() != 0:
        return 0  # every process compiles the same program; process 0 reports it
    render_audit(
        result,
        console=console,
        title=f"{program.name}: {program.description}",
        by_scope=by_scope,
    )
    if json_path is not None:
        data = {"demo": program.name, "description": program.description, **result.to_dict()}
        write_result(json_path, data, backend=result.backend or jax.default_backend())
    return 0
