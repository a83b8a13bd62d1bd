"""The taster's exercises as lab checks: a tensor-parallel block, its exact collectives, its
shard_map twin, and the sequence-parallel variant's verdict.

:func:`run_exercise_checks` takes the lab's harness (a :class:`~shardscope.Lab`) and records
one check per claim.
Each predicate does its own work, so a failure in one (an exception included) is recorded
and the others still run.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import jax

from shardscope._src.audit.compile import audit
from shardscope._src.base.comm import CollectiveKind, Totals, group_totals
from shardscope._src.base.errors import StrategyError
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.mesh import parse_mesh_spec
from shardscope._src.model.config import Mode, ModelConfig
from shardscope._src.sharding.numerics import compare_numerics
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
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
#: The strategies the exercises place the block with: tensor parallel (the jitted block, its
#: shard_map twin) and sequence parallel (the verdict).
EXERCISE_STRATEGIES = ("tp", "sp")
#: Why a check of what devices communicate is skipped on one.
ONE_DEVICE = "one device: nothing to communicate"


def exercises_fit(devices: int, config: ModelConfig = EXERCISE_CONFIG) -> bool:
    """Whether the exercises' block splits evenly over a ``model`` axis of ``devices``: each
    of :data:`EXERCISE_STRATEGIES` places it (on an abstract mesh, no device needed)."""
    mesh = abstract_mesh(f"model={devices}")
    try:
        for name in EXERCISE_STRATEGIES:
            get_strategy(name).place(config, mesh)
    except StrategyError:
        return False
    return True


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
    ex = _Exercises(lab, mesh_spec, config, facts)
    ex.numerics_check(
        EXERCISE_CHECKS[0],
        "jit",
        "tp_numerics",
        f"largest relative error per scope (attention, mlp, output) within the "
        f"{config.dtype} tolerance",
    )
    # on one device there are no collectives to count or compare
    if need > 1:
        ex.exact_minimum_check()
    else:
        lab.skip(EXERCISE_CHECKS[1], ONE_DEVICE)
    ex.numerics_check(
        EXERCISE_CHECKS[2],
        "shard_map",
        "twin_numerics",
        "explicit psum after the row-parallel matmuls",
    )
    if need > 1:
        ex.twin_same_check()
    else:
        lab.skip(EXERCISE_CHECKS[3], ONE_DEVICE)
    ex.sp_verdict_check()
    return facts


class _Exercises:
    """The exercises on one mesh and config: the programs and audits they share, compiled
    once (on first use, so a failure is recorded by the check that met it), and one method a
    check, each recording its check on the lab and its facts in ``facts``."""

    def __init__(
        self, lab: Any, mesh_spec: str, config: ModelConfig, facts: dict[str, Any]
    ) -> None:
        self.lab, self.mesh_spec, self.config, self.facts = lab, mesh_spec, config, facts

    @cached_property
    def tp_program(self) -> Any:
        return build_reference_program("tp", self.config, self.mesh_spec)

    @cached_property
    def tp_audit(self) -> Any:
        return audit(self.tp_program.lower())

    @cached_property
    def twin_audit(self) -> Any:
        return audit(
            build_reference_program("tp", self.config, self.mesh_spec, impl="shard_map").lower()
        )

    def measured(self, name: str) -> dict[str, Any]:
        """What the check ``name`` measured (empty when it raised first)."""
        return next(r.details for r in self.lab.results if r.name == name)

    def numerics_check(self, name: str, impl: str, fact: str, msg: str) -> None:
        """1 and 3: the forward matches the unsharded block on one device."""

        def matches_one_device() -> tuple[bool, dict[str, Any]]:
            report = compare_numerics("tp", self.config, self.mesh_spec, impl=impl)
            errors = {**report.errors, "tolerance": report.tolerance}
            return report.ok, {"relative_errors": errors, "numerics": report.to_dict()}

        self.lab.check(name, matches_one_device, msg)
        if "numerics" in self.measured(name):
            self.facts[fact] = self.measured(name)["numerics"]

    def exact_minimum_check(self) -> None:
        """2: the jitted forward has exactly the minimum collectives."""
        config = self.config

        def exact_minimum() -> tuple[bool, dict[str, Any]]:
            result = self.tp_audit
            bound = transformer_bound(self.tp_program.placement, Mode.FORWARD)
            counts = {k: v for k, v in result.counts().items() if v}
            want = {CollectiveKind.ALL_REDUCE: 2 * config.layers}
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
        self.lab.check(
            EXERCISE_CHECKS[1],
            exact_minimum,
            f"2 all-reduces per layer over 'model' of batch x seq x d_model "
            f"({per_layer} bytes each), bytes equal to the bound",
        )
        self.facts.update(self.measured(EXERCISE_CHECKS[1]))

    def twin_same_check(self) -> None:
        """4: the shard_map twin communicates exactly what the jitted block does."""

        def twin_same() -> tuple[bool, dict[str, Any]]:
            jit_side, twin_side = _per_axis_kind(self.tp_audit), _per_axis_kind(self.twin_audit)
            if jit_side != twin_side:
                raise AssertionError(f"shard_map {twin_side} vs jit {jit_side}")
            return True, {"twin_traffic_bytes": self.twin_audit.total().traffic_bytes}

        self.lab.check(EXERCISE_CHECKS[3], twin_same, "same kinds, axes, counts and bytes")
        self.facts.update(self.measured(EXERCISE_CHECKS[3]))

    def sp_verdict_check(self) -> None:
        """5: the sequence-parallel variant's verdict, a verified hint reaching the bound."""

        def sp_verdict() -> tuple[bool, dict[str, Any]]:
            v = transformer_verdict("sp", self.config, self.mesh_spec).verdict
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

        self.lab.check(
            EXERCISE_CHECKS[4],
            sp_verdict,
            "the verdict (ratio to the bound) with a verified hint that reaches it",
        )
        verdict = self.measured(EXERCISE_CHECKS[4]).get("verdict")
        if verdict is not None:
            self.facts["sp_verdict"] = verdict
            self.lab.print(f"  sequence parallel (jit): {verdict['summary']}")
