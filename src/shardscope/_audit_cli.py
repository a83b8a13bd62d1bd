"""``shardscope audit``: the CLI's work as one library function (argparse lives in cli.py)."""

from __future__ import annotations

import math
from typing import Any

from shardscope._errors import MeshSpecError
from shardscope._mesh import parse_mesh_spec


def _ensure_devices(mesh_spec: str | None) -> None:
    """Simulates enough CPU devices for the mesh when JAX has not started yet."""
    from shardscope._demos import DEFAULT_MESH
    from shardscope._devices import DEFAULT_CPU_DEVICES, _backends_started, use_cpu_devices

    need = math.prod(parse_mesh_spec(mesh_spec or DEFAULT_MESH).values())
    if not _backends_started():
        use_cpu_devices(max(need, DEFAULT_CPU_DEVICES))


def run_audit_command(
    demo: str,
    mesh_spec: str | None = None,
    json_path: str | None = None,
    *,
    console: Any = None,
) -> int:
    """Audits a built-in demo, prints its table, optionally writes JSON; returns 0.

    Args:
        demo: a name from ``shardscope._demos.DEMOS`` (``"matmul"``, ``"reshard"``).
        mesh_spec: a mesh description such as ``"model=8"`` or ``"dp=2,model=4"``;
            None for the demo's default (``model=8``).
        json_path: where to write ``Audit.to_dict()`` as JSON (atomically), or None.
        console: a rich Console to print to (default: stdout).

    Raises:
        ShardscopeError: an unknown demo or a bad mesh (MeshSpecError); the CLI turns it into
            one line on stderr and exit status 2.
    """
    from shardscope._audit import audit
    from shardscope._demos import get_demo
    from shardscope._io import write_json_atomic
    from shardscope._render_audit import render_audit

    if mesh_spec is not None and not mesh_spec.strip():
        raise MeshSpecError("--mesh is empty; write axes as name=size, e.g. 'dp=2,model=4'")
    _ensure_devices(mesh_spec)
    program = get_demo(demo, mesh_spec)
    result = audit(program)
    render_audit(result, console=console, title=f"{program.name}: {program.description}")
    if json_path is not None:
        data = {"demo": program.name, "description": program.description, **result.to_dict()}
        write_json_atomic(json_path, data)
    return 0
