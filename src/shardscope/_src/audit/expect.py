"""Communication budgets for a test suite: audit a program and fail the test when it breaks one.

``expect_collectives(step, *args, all_gather=0, bytes_per_axis={"model": 2**20})`` audits and
checks exact counts and byte budgets. With ``baseline="tests/collectives/step.json"`` it also
compares with the audit stored there: by default any change of count or bytes per axis and
kind fails; ``max_bytes_increase`` and ``no_new`` allow growth within a budget instead. A
missing baseline is written; ``SHARDSCOPE_UPDATE_BASELINES=1`` (or ``update=True``) rewrites
it after an intended change. Failures are ``AssertionError`` with a table, as pytest shows them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardscope._src.audit.compile import audit
from shardscope._src.audit.diff import diff_audits
from shardscope._src.base.records import write_result

UPDATE_ENV = "SHARDSCOPE_UPDATE_BASELINES"


def expect_collectives(
    program: Any,
    /,
    *args: Any,
    mesh: Any = None,
    baseline: str | os.PathLike[str] | None = None,
    max_bytes_increase: str | int | None = None,
    no_new: Sequence[str] | str = (),
    bytes_per_axis: Mapping[str, int | str] | None = None,
    traffic_bytes: int | str | None = None,
    update: bool | None = None,
    **counts: int,
) -> Any:
    """Audits ``program(*args)`` and checks it against budgets; returns the :class:`Audit`.

    Args:
        program, args, mesh: as :func:`shardscope.audit`.
        baseline: a JSON file holding an earlier audit of the same program (written when
            missing or when updating).
        max_bytes_increase: with a baseline, how much the bytes each device sends may grow
            (bytes, ``"64MiB"`` or ``"5%"``); no_new: kinds whose count must not grow (one
            kind, ``"all-gather"``, or several).
            Without either, any change from the baseline fails.
        bytes_per_axis, traffic_bytes, counts: as :meth:`Audit.expect`
            (``all_gather=0, all_reduce=2``).
        update: rewrite the baseline (default: the environment variable
            ``SHARDSCOPE_UPDATE_BASELINES=1``).

    Raises:
        AssertionError: a budget is broken (the message has the table of differences).

    >>> shardscope.expect_collectives(step, params, batch, all_gather=0,
    ...                               baseline="tests/collectives/step.json")  # doctest: +SKIP
    """

    result = audit(program, *args, mesh=mesh)
    result.expect(bytes_per_axis=bytes_per_axis, traffic_bytes=traffic_bytes, **counts)
    if baseline is None:
        if max_bytes_increase is not None or no_new:
            raise TypeError(
                "expect_collectives(): max_bytes_increase and no_new compare with a baseline; "
                "pass baseline='path/to/audit.json'"
            )
        return result
    if update is None:
        update = os.environ.get(UPDATE_ENV, "") not in ("", "0")
    if update or not os.path.exists(baseline):
        write_result(baseline, result)
        return result
    diff = diff_audits(baseline, result, max_bytes_increase=max_bytes_increase, no_new=no_new)
    strict = max_bytes_increase is None and not no_new
    if diff.ok and not (strict and diff.changed):
        return result
    why = list(diff.violations) or [
        f"{len(diff.changed)} (axes, kind) rows differ from the baseline and no budget "
        f"(max_bytes_increase, no_new) allows a change"
    ]
    raise AssertionError(
        f"collectives of {result.module_name} differ from {os.fspath(baseline)}:\n"
        + diff.text()
        + "\n"
        + "\n".join(f"budget broken: {v}" for v in why)
        + f"\nif the change is intended, rerun with {UPDATE_ENV}=1 to rewrite the baseline"
    )
