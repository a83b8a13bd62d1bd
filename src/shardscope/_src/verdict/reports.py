"""The verdict's front doors: :func:`matmul_verdict` and :func:`transformer_verdict` build and
compile the program, audit it, compare it with its bound and, when it exceeds the bound, try
the changes that should reach it (sharding constraints, an explicit shard_map), each compiled
(:mod:`~shardscope._src.verdict.hints`); their reports hold the audit, the bound or schedule,
and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardscope._src.audit.compile import audit
from shardscope._src.audit.records import Audit
from shardscope._src.base.records import json_value, record_dict
from shardscope._src.bounds.matmul import (
    MatmulSchedule,
    best_schedule,
    matmul_problem,
)
from shardscope._src.bounds.terms import Bound
from shardscope._src.bounds.transformer import transformer_bound
from shardscope._src.check.compare import Hint, Verdict, compare
from shardscope._src.mesh import auto_mesh, make_mesh
from shardscope._src.model.config import Mode, param_shapes
from shardscope._src.sharding.programs import Program, build_matmul, build_reference_program
from shardscope._src.verdict.hints import (
    duplicated_compute_note,
    matmul_hints,
    no_hint_note,
    transformer_hints,
)

# -- matmul ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulReport:
    """A sharded matmul: its audit, cheapest schedule, and verdict (with verified hints)."""

    audit: Audit
    schedule: MatmulSchedule
    verdict: Verdict

    @property
    def backend(self) -> str | None:
        """The platform its audit's program was compiled for (``Audit.backend``)."""
        return self.audit.backend

    def to_dict(self) -> dict[str, Any]:
        """The audit's JSON with the problem, the cheapest schedule and the verdict."""
        return {
            **self.audit.to_dict(),
            "problem": json_value(self.schedule.problem),
            **record_dict(self, omit=("audit",)),
        }


def matmul_verdict(
    mesh: Any,
    m: int,
    k: int,
    n: int,
    dtype: str,
    a_spec: Any,
    b_spec: Any,
    out_spec: Any,
    *,
    hints: bool = True,
) -> MatmulReport:
    """Compiles ``C = A @ B`` with the given specs, audits it, and judges it.

    When the compiled program exceeds the bound (by more than ``TOLERANCE``), the hints are the
    cheapest schedule forced with sharding constraints, the same schedule as an explicit
    shard_map when a reduce-scatter is involved, and, when the cheapest schedule duplicates the
    compute, the cheapest one that does not; each compiled and audited. A hint that duplicates
    the compute says so, with its flops per device: fewer bytes are not free.

    >>> report = matmul_verdict("x=8", 4096, 1024, 1024, "float32", "None,x", "None,None",
    ...                         "None,x")
    >>> round(report.verdict.ratio, 2), report.verdict.hints[0].reaches_bound
    (4.0, True)
    """

    problem = matmul_problem(mesh, m, k, n, dtype, a_spec, b_spec, out_spec)
    mesh_obj = auto_mesh(make_mesh(dict(problem.mesh)) if isinstance(mesh, str | dict) else mesh)
    schedule = best_schedule(problem)
    result = audit(build_matmul(problem, mesh_obj).lower())
    bound = schedule.bound()
    verdict = compare(
        result, bound, program_dtype=problem.dtype, label=f"matmul [{m},{k}]x[{k},{n}] {dtype}"
    )
    if hints and not verdict.optimal:
        verdict = verdict.replace(
            hints=matmul_hints(problem, mesh_obj, schedule, bound, verdict.actual_bytes)
        )
    if any(p.duplicated_flops for p in schedule.axes):
        # The byte minimum has every device compute all of C; say so, and where the program
        # stands against the cheapest schedule that keeps the compute split.
        note = duplicated_compute_note(problem, schedule, verdict.actual_bytes)
        verdict = verdict.with_note(note)
    return MatmulReport(result, schedule, verdict)


# -- transformer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerReport:
    """The reference model under a strategy: audit, bound and verdict (with verified hints)."""

    program: Program
    audit: Audit
    bound: Bound
    verdict: Verdict

    @property
    def backend(self) -> str | None:
        """The platform its audit's program was compiled for (``Audit.backend``)."""
        return self.audit.backend

    def to_dict(self) -> dict[str, Any]:
        """The audit's JSON with the program's strategy, config, mode and implementation, the
        bound and the verdict."""
        program = self.program
        return {
            **self.audit.to_dict(),
            "strategy": program.placement.to_dict(),
            "config": program.config.to_dict(),
            "mode": program.mode,
            "impl": program.impl,
            **record_dict(self, omit=("program", "audit")),
        }


def transformer_verdict(
    strategy: Any,
    config: Any,
    mesh: Any,
    *,
    mode: str = Mode.FORWARD,
    impl: str = "jit",
    constraints: bool = True,
    hints: bool = True,
) -> TransformerReport:
    """Compiles the reference model under ``strategy``, audits it and judges it.

    Hints, tried when the program exceeds its bound: the strategy's activation sharding
    constraints (if they were left out), then its shard_map twin with explicit
    ``psum`` / ``all_gather`` / ``psum_scatter`` (if it has one). Each is compiled and
    audited; its traffic is reported whether or not it reaches the bound.
    """

    program = build_reference_program(
        strategy, config, mesh, mode=mode, impl=impl, constraints=constraints
    )
    bound = transformer_bound(program.placement, mode)
    result = audit(program.lower())

    weights = {}
    for name, shape in param_shapes(program.config).items():
        weights[shape] = f"weight {name}{list(shape)}"
        weights.setdefault(shape[1:], f"weight {name}{list(shape[1:])} (one layer)")
    verdict = compare(
        result, bound, program_dtype=program.config.dtype, label=program.name, known_arrays=weights
    )
    found: tuple[Hint, ...] = ()
    if hints and not verdict.optimal:
        found = transformer_hints(program, bound, mode, impl, constraints)
        if not found:
            verdict = verdict.with_note(no_hint_note(verdict))
    return TransformerReport(program, result, bound, verdict.replace(hints=found))
