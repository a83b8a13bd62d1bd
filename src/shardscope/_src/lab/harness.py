"""The lab harness: named checks, a scorecard printed as it goes, and a JSON result file."""

from __future__ import annotations

import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from shardscope._src.base.devices import hardware_summary, use_cpu_devices
from shardscope._src.base.errors import ShardscopeError, is_int
from shardscope._src.base.records import json_value, record_dict, write_result
from shardscope._src.render.console import output_console

_LAB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class CheckResult:
    name: str
    passed: bool
    skipped: bool
    message: str
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self),
            "duration_s": round(self.duration_s, 6),
            "details": json_value(self.details, strict=False),
        }


def _scalar_or_norm(x: Any) -> tuple[float, Any]:

    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        return float(arr), float(arr)
    return float(np.linalg.norm(arr.ravel())), {"shape": list(arr.shape)}


def scorecard_name(lab_id: str) -> str:
    """The name of the scorecard a lab writes in its folder (:meth:`Lab.save`)."""
    return f"{lab_id}.json"


class Lab:
    """A scorecard of named checks. Made by :func:`bootstrap`; see its docstring."""

    def __init__(
        self,
        lab_id: str,
        *,
        seed: int = 0,
        out_dir: str | os.PathLike[str] | None = None,
        verbose: bool = True,
        primary: bool = True,
    ) -> None:
        if not isinstance(lab_id, str) or not _LAB_ID.match(lab_id):
            raise ShardscopeError(
                f"lab id {lab_id!r} must be a non-empty name of letters, digits, '.', '_' or "
                f"'-' (it becomes the result file's name), e.g. 'sharding_taster'"
            )
        self.lab_id = lab_id
        self.seed = seed
        self.out_dir = Path("scores") if out_dir is None else Path(out_dir)
        self.verbose = verbose
        # In a multi-process run every process checks its own shards; one of them reports.
        self.primary = primary
        self.results: list[CheckResult] = []
        self.key: Any = None  # a JAX PRNG key, set by bootstrap()
        self.hardware: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._console: Any = None

    # -- output -----------------------------------------------------------------------------
    @property
    def console(self) -> Any:
        if self._console is None:
            self._console = output_console(highlight=False)
        return self._console

    def print(self, *objects: Any) -> None:
        """Prints text or rich renderables (tables) when this process reports."""
        if self.verbose and self.primary:
            self.console.print(*objects)

    def _record(self, result: CheckResult) -> bool:
        if any(r.name == result.name for r in self.results):
            raise ShardscopeError(
                f"check name {result.name!r} is used twice in lab {self.lab_id!r}; give each "
                f"check its own name"
            )
        self.results.append(result)
        if self.verbose and self.primary:
            from rich.markup import escape

            tag = (
                "[yellow]SKIP[/]"
                if result.skipped
                else "[green]PASS[/]"
                if result.passed
                else "[bold red]FAIL[/]"
            )
            msg = f"  {escape(result.message)}" if result.message else ""
            self.console.print(
                f"{tag} {escape(result.name)}{msg} [dim]({result.duration_s:.3f} s)[/]"
            )
        return result.passed

    # -- checks -----------------------------------------------------------------------------
    def check(
        self,
        name: str,
        predicate: Callable[[], Any] | bool,
        msg: str = "",
        details: dict[str, Any] | None = None,
    ) -> bool:
        """Records whether ``predicate()`` is true. An exception is a failure, never a crash.

        The predicate may return ``(ok, details)``: ``details`` (a dict of what it measured)
        joins the check's details in the scorecard.

        >>> lab = Lab("doc", verbose=False)
        >>> lab.check("even", lambda: (4 % 2 == 0, {"value": 4}))
        True
        >>> lab.results[0].details
        {'value': 4}
        """
        start = time.perf_counter()
        info = dict(details or {})
        try:
            value = predicate() if callable(predicate) else predicate
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
                value, measured = value
                info.update(measured)
            passed = bool(value)
            message = msg
            if value is None:
                message = (msg + ": " if msg else "") + "predicate returned None, not True/False"
        except Exception as e:  # the scorecard records every failure and goes on
            passed = False
            message = f"{type(e).__name__}: {e}"
            info["error_type"] = type(e).__name__
            if msg:
                message = f"{msg}: {message}"
        return self._record(
            CheckResult(name, passed, False, message, time.perf_counter() - start, info)
        )

    def assert_close(self, name: str, actual: Any, expected: Any, rtol: float = 0.05) -> bool:
        """Passes when ``|actual - expected| / |expected| <= rtol`` (norms for arrays)."""

        start = time.perf_counter()
        info: dict[str, Any] = {"rtol": rtol}
        try:
            a = np.asarray(actual, dtype=np.float64)
            e = np.asarray(expected, dtype=np.float64)
            if a.shape != e.shape:
                raise ShardscopeError(f"shapes differ: actual {a.shape}, expected {e.shape}")
            diff = float(np.linalg.norm((a - e).ravel()))
            scale = float(np.linalg.norm(e.ravel()))
            err = diff / scale if scale else diff
            info.update(actual=_scalar_or_norm(a)[1], expected=_scalar_or_norm(e)[1], rel_error=err)
            passed = bool(err <= rtol)
            message = f"relative error {err:.3g} (tolerance {rtol:g})"
        except Exception as ex:
            passed, message = False, f"{type(ex).__name__}: {ex}"
            info["error_type"] = type(ex).__name__
        return self._record(
            CheckResult(name, passed, False, message, time.perf_counter() - start, info)
        )

    def benchmark(
        self,
        name: str,
        measured: float,
        baseline: float | None = None,
        must_beat: float = 1.0,
        unit: str = "",
        higher_is_better: bool = True,
    ) -> bool:
        """Records a measurement; with a baseline, passes when it beats ``must_beat`` x it.

        Higher is better: ``measured >= must_beat * baseline``. Lower is better:
        ``measured * must_beat <= baseline`` (``must_beat=2`` asks for half the baseline).
        """
        measured = float(measured)
        info: dict[str, Any] = {
            "measured": measured,
            "baseline": baseline,
            "must_beat": must_beat,
            "unit": unit,
            "higher_is_better": higher_is_better,
        }
        if not math.isfinite(measured):
            passed, message = False, f"measured {measured} is not a finite number"
        elif baseline is None:
            passed, message = True, f"{measured:.4g} {unit}".rstrip()
        else:
            baseline = float(baseline)
            ratio = measured / baseline if baseline else math.inf
            info["ratio"] = ratio
            if higher_is_better:
                passed = measured >= must_beat * baseline
                goal = (f"{must_beat:g} x " if must_beat != 1 else "") + f"{baseline:.4g}"
                goal = ">= " + goal
            else:
                passed = measured * must_beat <= baseline
                goal = f"<= {baseline:.4g}" + (f" / {must_beat:g}" if must_beat != 1 else "")
            message = f"{measured:.4g} {unit} (goal {goal} {unit})".replace("  ", " ")
        return self._record(CheckResult(name, passed, False, message, 0.0, info))

    def skip(self, name: str, reason: str) -> None:
        """Records a check that did not run, with why; it does not count in the total."""
        self._record(CheckResult(name, False, True, reason, 0.0, {}))

    # -- results ----------------------------------------------------------------------------
    def scorecard(self) -> dict[str, Any]:
        """The scorecard as plain data: counts, score, hardware and every check's result.

        Prints nothing; :meth:`summary` prints its line and returns the same, and :meth:`save`
        writes it.

        >>> lab = Lab("doc", verbose=False)
        >>> lab.check("even", lambda: 4 % 2 == 0)
        True
        >>> card = lab.scorecard()
        >>> card["passed"], card["total"], card["skipped"], card["score"]
        (1, 1, 0, 1.0)
        """
        counted = [r for r in self.results if not r.skipped]
        passed = sum(r.passed for r in counted)
        total = len(counted)
        skipped = len(self.results) - total
        score = passed / total if total else 0.0
        return {
            "lab_id": self.lab_id,
            "passed": passed,
            "total": total,
            "skipped": skipped,
            "score": score,
            "elapsed_s": round(time.perf_counter() - self._start, 6),
            "seed": self.seed,
            "hardware": dict(self.hardware),
            "results": [r.to_dict() for r in self.results],
        }

    def summary(self) -> dict[str, Any]:
        """Prints ``[lab_id] P/T checks passed (x%); skipped=S`` (when this process reports)
        and returns the :meth:`scorecard`."""
        data = self.scorecard()
        if self.verbose and self.primary:
            from rich.markup import escape

            passed, total = data["passed"], data["total"]
            style = "green" if passed == total else "bold red"
            self.console.print(
                f"[{style}]{escape(f'[{self.lab_id}]')} {passed}/{total} checks passed "
                f"({100 * data['score']:.0f}%); skipped={data['skipped']}[/]"
            )
        return data

    def print_summary(self) -> dict[str, Any]:
        """The former name of :meth:`summary`, kept for one release."""
        return self.summary()

    def save(self) -> Path:
        """Writes the :meth:`scorecard` to ``<out_dir>/<lab_id>.json`` atomically; returns the
        path. Prints nothing."""
        path = self.out_dir / scorecard_name(self.lab_id)
        if self.primary:
            write_result(path, self)
        return path

    @property
    def backend(self) -> str:
        """The platform the checks ran on: JAX's default backend (``"cpu"``, ``"gpu"``,
        ``"tpu"``), the ``backend`` of the JSON :meth:`save` writes."""
        return jax.default_backend()

    def to_dict(self) -> dict[str, Any]:
        """The :meth:`scorecard`: what :meth:`save` writes."""
        return self.scorecard()


def bootstrap(
    lab_id: str,
    *,
    seed: int = 0,
    out_dir: str | os.PathLike[str] | None = None,
    devices: int | None = None,
    verbose: bool = True,
) -> Lab:
    """Starts a lab: simulated devices, seeded RNGs, a hardware summary, and a :class:`Lab`.

    Call it before JAX's first computation. ``devices=None`` honours a device count already
    set in ``XLA_FLAGS`` or ``JAX_NUM_CPU_DEVICES`` and otherwise simulates 8 CPU devices; on a
    host with accelerators the real ones are used. The lab's ``key`` is a JAX PRNG key made
    from ``seed``; Python's and NumPy's global RNGs are seeded too.

    >>> lab = bootstrap("demo", verbose=False)
    >>> lab.check("two is even", lambda: 2 % 2 == 0)
    True
    """

    if not is_int(seed, 0):
        raise ShardscopeError(f"seed must be a non-negative integer, got {seed!r}")
    lab = Lab(lab_id, seed=seed, out_dir=out_dir, verbose=verbose)
    use_cpu_devices(devices)

    random.seed(seed)
    np.random.seed(seed)
    lab.key = jax.random.key(seed)
    hw = hardware_summary()
    lab.hardware = hw
    lab.primary = hw["process_index"] == 0
    lab.print(
        f"[bold]{lab_id}[/]: JAX {hw['jax_version']}, backend {hw['backend']}, "
        f"{hw['device_count']} x {hw['device_kind']}"
        + (f", {hw['process_count']} processes" if hw["process_count"] > 1 else "")
    )
    return lab
