"""The taster's exercises as lab checks: a tensor-parallel block, its exact collectives, its
shard_map twin, and the sequence-parallel variant's verdict.

:func:`run_exercise_checks` takes the lab's harness (a :class:`~shardscope.Lab`) and records
one check per claim.
Each predicate does its own work, so a failure in one (an exception included) is recorded
and the others still run.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from shardscope._src.audit.compile import audit
from shardscope._src.base.comm import Totals, group_totals
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.mesh import parse_mesh_spec
from shardscope._src.model.config import ModelConfig
from shardscope._src.sharding.numerics import compare_numerics
from shardscope._src.sharding.programs import build_program
from shardscope._src.verdict import transformer_verdict

#: The names of the checks, in order.
EXERCISE_CHECKS = (
    "tp_block_matches_single_device",
    "tp_forward_minimum_collectives",
    "tp_shard_map_matches_single_device",
    "tp_shard_map_same_collectives",
    "sp_verdict",
)

#: The block the exercises shard: small enough to compile in well under a second.
EXERCISE_CONFIG = ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=8, seq=16)


def _per_axis_kind(audit: Any) -> dict[tuple[tuple[str, ...], str], Totals]:
    return group_totals(audit.collectives, lambda c: (tuple(c.axes), c.kind), lambda c: c.totals)


def _bound_per_axis_kind(bound: Any) -> dict[tuple[tuple[str, ...], str], Totals]:
    return bound.totals_by_axes_kind()


def run_exercise_checks(
    lab: Any,
    *,
    mesh_spec: str = "model=8",
    config: ModelConfig = EXERCISE_CONFIG,
) -> dict[str, Any]:
    """Records the exercise checks on ``lab``; returns the facts measured (plain data).

    Checks, on a Megatron tensor-parallel decoder block over ``mesh_spec``:

    1. its forward matches the unsharded block on one device (per-scope errors in the
       message; tolerance per dtype);
    2. its jitted forward has exactly the minimum collectives: 2 all-reduces per layer over
       ``model``, nothing else, payload and bytes equal to the bound;
    3. the shard_map twin (explicit ``psum``) matches one device;
    4. and communicates exactly what the jitted one does;
    5. the sequence-parallel variant's verdict, with its verified hint reaching the bound.
    """

    need = math.prod(parse_mesh_spec(mesh_spec).values())
    have = len(jax.devices())
    facts: dict[str, Any] = {"mesh": mesh_spec, "config": config.to_dict()}
    if have < need:
        for name in EXERCISE_CHECKS:
            lab.skip(name, f"needs {need} devices, found {have}")
        return facts

    cache: dict[str, Any] = {}

    def once(key: str, make: Any) -> Any:
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def tp_program() -> Any:
        return once("tp_prog", lambda: build_program("tp", config, mesh_spec))

    def tp_audit() -> Any:
        return once("tp_audit", lambda: audit(tp_program().lower()))

    def twin_audit() -> Any:
        return once(
            "twin_audit",
            lambda: audit(build_program("tp", config, mesh_spec, impl="shard_map").lower()),
        )

    def measured(name: str) -> dict[str, Any]:
        """What the check ``name`` measured (empty when it raised first)."""
        return next(r.details for r in lab.results if r.name == name)

    # 1 and 3. numerics against one device
    def numerics_check(name: str, impl: str, fact: str, msg: str) -> None:
        def matches_one_device() -> tuple[bool, dict[str, Any]]:
            report = compare_numerics("tp", config, mesh_spec, impl=impl)
            errors = {**report.errors, "tolerance": report.tolerance}
            return report.ok, {"relative_errors": errors, "numerics": report.to_dict()}

        lab.check(name, matches_one_device, msg)
        if "numerics" in measured(name):
            facts[fact] = measured(name)["numerics"]

    numerics_check(
        EXERCISE_CHECKS[0],
        "jit",
        "tp_numerics",
        f"largest relative error per scope (attention, mlp, output) within the "
        f"{config.dtype} tolerance",
    )

    # 2. exact collectives
    def exact_minimum() -> tuple[bool, dict[str, Any]]:
        result, bound = tp_audit(), transformer_bound(tp_program().placement, "forward")
        counts = {k: v for k, v in result.counts().items() if v}
        want = {"all-reduce": 2 * config.layers}
        if counts != want:
            raise AssertionError(f"collectives {counts}, expected exactly {want}")
        if _per_axis_kind(result) != _bound_per_axis_kind(bound):
            raise AssertionError(
                f"per axis and kind {_per_axis_kind(result)} differ from the bound "
                f"{_bound_per_axis_kind(bound)}"
            )
        return True, {
            "tp_counts": counts,
            "tp_traffic_bytes": result.total().traffic_bytes,
            "tp_bound_bytes": bound.traffic_bytes,
        }

    per_layer = config.batch * config.seq * config.d_model * config.itemsize
    lab.check(
        EXERCISE_CHECKS[1],
        exact_minimum,
        f"2 all-reduces per layer over 'model' of batch x seq x d_model "
        f"({per_layer} bytes each), bytes equal to the bound",
    )
    facts.update(measured(EXERCISE_CHECKS[1]))

    numerics_check(
        EXERCISE_CHECKS[2],
        "shard_map",
        "twin_numerics",
        "explicit psum after the row-parallel matmuls",
    )

    # 4. the twin communicates the same
    def twin_same() -> tuple[bool, dict[str, Any]]:
        jit_side, twin_side = _per_axis_kind(tp_audit()), _per_axis_kind(twin_audit())
        if jit_side != twin_side:
            raise AssertionError(f"shard_map {twin_side} vs jit {jit_side}")
        return True, {"twin_traffic_bytes": twin_audit().total().traffic_bytes}

    lab.check(EXERCISE_CHECKS[3], twin_same, "same kinds, axes, counts and bytes")
    facts.update(measured(EXERCISE_CHECKS[3]))

    # 5. the sequence-parallel verdict
    def sp_verdict() -> tuple[bool, dict[str, Any]]:
        v = transformer_verdict("sp", config, mesh_spec).verdict
        verdict = {
            "summary": v.summary(),
            "ratio": v.ratio,
            "bound_bytes": v.bound_bytes,
            "actual_bytes": v.actual_bytes,
            "hints": [
                {
                    "change": h.change,
                    "traffic_bytes": h.traffic_bytes,
                    "reaches_bound": h.reaches_bound,
                }
                for h in v.hints
            ],
        }
        return v.optimal or any(h.reaches_bound for h in v.hints), {"verdict": verdict}

    lab.check(
        EXERCISE_CHECKS[4],
        sp_verdict,
        "the verdict (ratio to the bound) with a verified hint that reaches it",
    )
    verdict = measured(EXERCISE_CHECKS[4]).get("verdict")
    if verdict is not None:
        facts["sp_verdict"] = verdict
        lab.print(f"  sequence parallel (jit): {verdict['summary']}")
    return facts
