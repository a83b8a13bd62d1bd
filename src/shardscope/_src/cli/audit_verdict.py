"""``shardscope audit transformer`` and ``shardscope audit matmul``: the CLI's work as library
functions (their options live in cli/audit.py). Each prints the audit table, then the verdict table
ending with the verdict line, and optionally writes the JSON: the audit's dict plus
``verdict`` (``bound_bytes``, ``actual_bytes``, ``ratio``, ``hints`` with the change and the
``traffic_bytes`` it compiled to).
"""

from __future__ import annotations

from typing import Any

from shardscope._src.base.errors import MeshSpecError, ModelConfigError
from shardscope._src.base.records import write_result
from shardscope._src.bounds.matmul import matmul_problem
from shardscope._src.cli.audit_program import check_devices_for
from shardscope._src.cli.options import print_more
from shardscope._src.mesh import ensure_devices_for, parse_mesh_spec
from shardscope._src.model.config import Mode, ModelConfig
from shardscope._src.render.audit import render_audit
from shardscope._src.render.console import output_console
from shardscope._src.render.verdict import render_verdict
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy, mesh_spec_for
from shardscope._src.targets.mesh import target_mesh
from shardscope._src.targets.specs import Family, get_target
from shardscope._src.verdict import matmul_verdict, moe_verdict, transformer_verdict


def _check_mesh(mesh_spec: str | None) -> None:
    if mesh_spec is not None and not mesh_spec.strip():
        raise MeshSpecError("--mesh is empty; write axes as name=size, e.g. 'data=2,model=4'")


def _console(console: Any) -> Any:

    return console or output_console()


def check_transformer_command(
    strategy: str, mesh_spec: str | None = None, **sizes: Any
) -> tuple[Any, Any, str]:
    """Refuses, before anything is compiled, a strategy, mesh or size that does not fit:
    the ``(strategy, config, mesh_spec)`` to run. ``sizes``: ModelConfig fields, None unset."""

    _check_mesh(mesh_spec)
    s = get_strategy(strategy)
    if mesh_spec is None:
        mesh_spec = mesh_spec_for(s, (2, 4) if len(s.roles) > 1 else (8,))
    config = ModelConfig(**{k: v for k, v in sizes.items() if v is not None})
    s.place(config, abstract_mesh(mesh_spec))  # a strategy that does not fit fails first
    return s, config, mesh_spec


def run_transformer_command(
    strategy: str,
    mesh_spec: str | None = None,
    layers: int | None = None,
    json_path: str | None = None,
    *,
    mode: str = Mode.FORWARD,
    impl: str = "jit",
    constraints: bool = True,
    d_model: int | None = None,
    heads: int | None = None,
    ff: int | None = None,
    batch: int | None = None,
    seq: int | None = None,
    dtype: str | None = None,
    hints: bool = True,
    console: Any = None,
    target: str | None = None,
    by_scope: bool = False,
    verbose: bool = False,
) -> int:
    """Audits the reference transformer under ``strategy`` and prints its verdict; returns 0.

    Args:
        strategy: a built-in strategy name (``tp``, ``dp_tp``, ``sp``, ``fsdp``, ...).
        mesh_spec: e.g. ``"model=8"`` or ``"data=2,model=4"``; None: the strategy's axes
            over 8 devices (``model=8``, ``data=8`` or ``data=2,model=4``).
        layers: decoder layers (default 2); the other sizes default to
            :class:`~shardscope._src.model.config.ModelConfig`'s.
        json_path: where to write the report as JSON (atomically), or None.
        mode: ``"forward"`` or ``"train"``; impl: ``"jit"`` or ``"shard_map"``.
        constraints: keep the strategy's activation constraints (False shows their worth).
        target: compile for this target's devices with its own compiler (``"h100"``,
            ``"tpu-v5p"``); None or ``"cpu"``: simulated CPU devices.

    Raises:
        ShardscopeError: unknown strategy, bad mesh, or a strategy that does not fit the
            config (the CLI turns it into one line on stderr and exit status 2).
    """

    s, config, mesh_spec = check_transformer_command(
        strategy,
        mesh_spec,
        layers=layers,
        d_model=d_model,
        heads=heads,
        ff=ff,
        batch=batch,
        seq=seq,
        dtype=dtype,
    )
    mesh = _mesh_for(mesh_spec, target)
    report = transformer_verdict(
        s, config, mesh, mode=mode, impl=impl, constraints=constraints, hints=hints
    )
    title = f"{report.program.name} on mesh {mesh_spec}: collectives"
    return _show_verdict(report, title, json_path, console, by_scope, verbose)


def check_matmul_command(
    mesh_spec: str | None,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: str,
    b_spec: str,
    out_spec: str,
) -> None:
    """Refuses, before anything is compiled, a mesh, size, dtype or spec that does not fit."""

    _check_mesh(mesh_spec)
    if mesh_spec is None:
        raise MeshSpecError("--mesh is required, e.g. --mesh model=8")
    matmul_problem(mesh_spec, m, k, n, dtype, a_spec, b_spec, out_spec)


def _mesh_for(mesh_spec: str, target: str | None) -> Any:
    """The mesh description itself on simulated CPU devices, or a mesh of a target's
    compile-only devices."""

    if target is None or get_target(target).family == Family.CPU:
        ensure_devices_for(mesh_spec)
        check_devices_for(mesh_spec)  # a smaller mesh is built of the first devices
        return mesh_spec
    return target_mesh(target, mesh_spec, axis_types="auto")


def run_matmul_command(
    mesh_spec: str,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: str,
    b_spec: str,
    out_spec: str,
    json_path: str | None = None,
    *,
    hints: bool = True,
    console: Any = None,
    target: str | None = None,
    by_scope: bool = False,
    verbose: bool = False,
) -> int:
    """Audits ``C[m,n] = A[m,k] @ B[k,n]`` with the given specs and prints its verdict.

    Specs are comma-separated per dimension, ``None`` or an axis name (``"None,model"``).
    Returns 0; bad specs raise :class:`~shardscope._src.base.errors.StrategyError` naming the value,
    the rule and the fix.
    """

    check_matmul_command(mesh_spec, m, k, n, dtype, a_spec, b_spec, out_spec)  # bad input first
    mesh = _mesh_for(mesh_spec, target)
    report = matmul_verdict(mesh, m, k, n, dtype, a_spec, b_spec, out_spec, hints=hints)
    title = (
        f"A[{m},{k}] ({a_spec}) @ B[{k},{n}] ({b_spec}) -> C ({out_spec}) on "
        f"mesh {mesh_spec}: collectives"
    )
    return _show_verdict(report, title, json_path, console, by_scope, verbose)


def check_moe_command(
    mesh_spec: str | None,
    tokens: int,
    experts: int,
    top_k: int,
    capacity_factor: float,
    dtype: str,
) -> None:
    """Refuses, before anything is compiled, a layer the mesh cannot split or that routes
    as no layer can."""
    _check_mesh(mesh_spec)
    sizes = parse_mesh_spec(mesh_spec or "expert=8")
    if "expert" not in sizes or set(sizes) - {"expert", "data"}:
        raise MeshSpecError(
            f"--mesh {mesh_spec}: the layer splits its tokens and experts over the axis "
            f"'expert' and may replicate the experts over 'data'; e.g. --mesh expert=8 or "
            f"--mesh data=2,expert=4"
        )
    e, dp = sizes["expert"], sizes.get("data", 1)
    for flag, n, over in (("--tokens", tokens, e * dp), ("--experts", experts, e)):
        if n % over:
            raise ModelConfigError(
                f"{flag} {n} does not split over the {over} devices that share them; give a "
                f"multiple of {over}"
            )
    if not 1 <= top_k <= experts:
        raise ModelConfigError(
            f"--top-k {top_k}: each token goes to 1 to --experts {experts} experts; give a "
            f"top-k in that range"
        )
    if not capacity_factor > 0:
        # the layer dispatches by capacity alone: there is no dropless form to offer here
        raise ModelConfigError(
            f"--capacity-factor {capacity_factor:g}: each expert's slots over its even share "
            f"of the tokens, a number above 0 (1 pads nothing under balanced routing, 1.25 "
            f"pads each expert to 1.25 x its share)"
        )
    ModelConfig(
        d_model=8, heads=1, ff=8, dtype=dtype, experts=experts, top_k=top_k
    )  # a dtype it knows


def run_moe_command(
    mesh_spec: str,
    json_path: str | None = None,
    *,
    tokens: int,
    d_model: int,
    ff: int,
    experts: int,
    top_k: int,
    capacity_factor: float,
    dtype: str,
    mode: str = Mode.FORWARD,
    impl: str = "jit",
    dispatch_once: bool = False,
    weight_activations: bool = False,
    console: Any = None,
    target: str | None = None,
    by_scope: bool = False,
    verbose: bool = False,
) -> int:
    """Audits one expert-parallel MoE layer (:func:`moe_verdict`) and prints its verdict."""
    check_moe_command(mesh_spec, tokens, experts, top_k, capacity_factor, dtype)
    mesh = _mesh_for(mesh_spec, target)
    report = moe_verdict(
        mesh,
        tokens=tokens,
        d_model=d_model,
        ff=ff,
        experts=experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
        dtype=dtype,
        mode=mode,
        impl=impl,
        target=None,
        dispatch_once=dispatch_once,
        weight_activations=weight_activations,
    )
    once = ", each token once a device" if dispatch_once else ""
    once += ", router weights with the slots" if weight_activations else ""
    title = (
        f"MoE layer, {experts} experts top-{top_k}, {tokens} tokens x {d_model} ({dtype}, "
        f"{mode}, {impl}{once}) on mesh {mesh_spec}: collectives"
    )
    return _show_verdict(report, title, json_path, console, by_scope, verbose)


def _show_verdict(
    report: Any, title: str, json_path: str | None, console: Any, by_scope: bool, verbose: bool
) -> int:
    """Prints the audit table, then the verdict table (everything where ``verbose``, else
    the answer on one screen and where the rest is); writes the JSON if asked; 0."""
    out = _console(console)
    render_audit(report.audit, console=out, title=title, by_scope=by_scope, verbose=verbose)
    render_verdict(report.verdict, console=out, verbose=verbose)
    if not verbose:
        print_more(out, report=False)
    if json_path is not None:
        write_result(json_path, report)
    return 0
