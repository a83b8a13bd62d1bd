"""The models' error table as data: every published run that ``calibration.py``,
``training_heldout.py`` and ``moe_heldout.py`` (training; a mixture of experts' step its own
metric) and ``serving_accuracy.py`` (serving) judge, predicted
against measured, one record a run and a summary per split, source and metric, as JSON for the
docs' accuracy page.

A run's ``split`` is ``calibration`` (a row the constants were fitted to) or ``held-out`` (a
run nothing was fitted to; the dense runs on Blackwell GPUs apart, :data:`BLACKWELL`); its
``source`` is who published it. The summaries count the runs
and give the median and worst absolute error, the signed median (a model that is always fast
is wrong even where its median error looks small) and how many land within 25%; a run the
plans call a misfit (one that does not fit the hardware it ran on) is counted apart: a serving
run so called has no plan, and is not judged; a training run is judged all the same, as
``calibration.py`` judges it. The rows themselves, their sources and how each is
planned are the benchmarks' own: this script imports them and changes nothing.

Run: ``python benchmarks/accuracy.py --json benchmarks/results/serving_compiled.json`` (the
serving runs compiled with their hardware's own compiler, deviceless: minutes; its output is
committed and the docs render it), or ``--estimates`` for the screening estimates of both
models (seconds: the docs build computes these itself).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import calibration  # noqa: E402
import moe_heldout  # noqa: E402
import serving_accuracy  # noqa: E402
import training_heldout  # noqa: E402

from shardscope import PlanError, ShardscopeError  # noqa: E402
from shardscope._src.base.records import result_header  # noqa: E402

GIB = 2**30
WITHIN = 0.25  # the share of runs within this error is reported too


def _load(run: serving_accuracy.Run) -> str:
    """How ``run`` loaded its server, in words."""
    if run.rate is not None:
        return f"{run.rate:g} requests/s"
    if run.closed:
        return f"{run.batch} client{'s' * (run.batch > 1)} in a closed loop"
    return f"batch {run.batch}"


def _source(name: str, *, training: bool) -> str:
    """Who published a run, from its name: a training row's first word (``"torchtitan Llama
    3.1 8B, ..."``), a serving run's words before the first comma (``"NIM 1.8, 1 client"``)."""
    return name.split()[0] if training else name.split(",")[0]


def _misfit(s: Any) -> str | None:
    # Judged all the same, as calibration.py judges it, and counted as a misfit.
    if s.fits:
        return None
    return (
        f"the estimate holds {s.memory.total / GIB:.1f} GiB a device, over the "
        f"{s.memory_limit_bytes / GIB:.1f} GiB it has"
    )


#: The metric of a mixture of experts' training step, judged apart from a dense model's.
MOE_STEP = "mixture-of-experts step time"


def _training_records(
    common: dict[str, Any],
    s: Any,
    measured_s: float,
    peak_gib: float | None = None,
    *,
    moe: bool = False,
) -> list[dict[str, Any]]:
    """A training run's step-time record (a mixture's, ``moe``, as :data:`MOE_STEP`), and
    its peak-memory record where the source published one."""
    out = [
        {
            **common,
            "metric": MOE_STEP if moe else "step time",
            "unit": "s",
            "predicted": s.time.step_s,
            "measured": measured_s,
        }
    ]
    if peak_gib:
        out.append(
            {
                **common,
                "metric": "peak memory",
                "unit": "GiB",
                "predicted": s.memory.total / GIB,
                "measured": peak_gib,
            }
        )
    return out


#: The split of the held-out dense runs on Blackwell GPUs (B200 and GB200), judged apart from
#: the H100 ones.
BLACKWELL = "held-out on Blackwell"


def training_runs() -> list[dict[str, Any]]:
    """Every training run of ``calibration.py``, ``training_heldout.py`` and
    ``moe_heldout.py`` (its runs as written), as the planner's screening estimate predicts it
    at the published configuration: the step time (a mixture of experts' apart), and the
    peak memory where the source published one. A held-out run the planner cannot write is
    not judged (the benchmark lists it and says why)."""
    out: list[dict[str, Any]] = []
    for split, rows in (("calibration", [*calibration.ROWS, *calibration.MOE_ROWS]),):
        for row in rows:
            s, microbatches = calibration._estimate(row)
            common = {
                "split": split,
                "source": _source(row.name, training=True),
                "run": row.name,
                "hardware": row.hardware,
                "by": "estimate",
                "microbatches": microbatches,
                "instead": row.instead or None,
                "misfit": _misfit(s),
            }
            out.extend(
                _training_records(common, s, row.measured_s, row.peak_gib, moe=row.config.is_moe)
            )
    for split, dense in (
        ("held-out", training_heldout.RUNS),
        (BLACKWELL, training_heldout.BLACKWELL_RUNS),
    ):
        for judged in training_heldout.judge(dense):
            run, s = judged.run, judged.screened
            if s is None:
                continue
            out.extend(_training_records(_held_out(split, run, s), s, run.measured_s, run.peak_gib))
    for run in moe_heldout.RUNS:
        try:
            s, _ = moe_heldout.estimate_run(run)
        except ShardscopeError:  # a layout the planner cannot write: listed there, not judged
            continue
        out.extend(_training_records(_held_out("held-out", run, s), s, run.measured_s, moe=True))
    return out


def _held_out(split: str, run: Any, s: Any) -> dict[str, Any]:
    """What every record of a held-out run ``run`` (a dense or a mixture's benchmark row)
    planned as ``s`` carries."""
    return {
        "split": split,
        "source": _source(run.name, training=True),
        "run": run.name,
        "hardware": run.hardware,
        "by": "estimate",
        "microbatches": run.microbatches,
        "instead": "; ".join(run.instead) or None,
        "misfit": _misfit(s),
    }


def unjudged_training_runs() -> list[dict[str, Any]]:
    """The published training runs the benchmarks list and do not judge, and why: a run the
    planner cannot write as it ran (its ``cannot``), and the rows of a judged table left out
    (``BRIDGE_LEFT_OUT``, ``BLACKWELL_LEFT_OUT``), each with its measured step where it has
    one."""
    out: list[dict[str, Any]] = []
    for run in [*training_heldout.RUNS, *training_heldout.BLACKWELL_RUNS]:
        if run.cannot:
            out.append({"run": run.name, "measured": run.measured_s, "why": run.cannot})
    for what, why in (*training_heldout.BRIDGE_LEFT_OUT, *training_heldout.BLACKWELL_LEFT_OUT):
        out.append({"run": what, "measured": None, "why": why})
    for run in moe_heldout.RUNS:
        if run.cannot:  # not judged, its nearest layout written or not
            out.append({"run": run.name, "measured": run.measured_s, "why": run.cannot})
    return out


_METRICS = {"token": "time per output token", "first": "time to first token"}


def serving_runs(compiler: str | None) -> list[dict[str, Any]]:
    """Every serving run of ``serving_accuracy.py``, planned as it ran: ``compiler="cpu"`` the
    estimates alone, None each run's hardware's own compiler (deviceless)."""
    out: list[dict[str, Any]] = []
    for split, runs in (
        ("calibration", serving_accuracy.CALIBRATION),
        ("held-out", serving_accuracy.HELD_OUT),
    ):
        for run in runs:
            record: dict[str, Any] = {
                "split": split,
                "source": _source(run.source, training=False),
                "run": (
                    f"{run.source}: {run.model} TP {run.tp} {run.weights} "
                    f"{run.prompt}+{run.output}, {_load(run)}"
                ),
                "hardware": run.hardware,
                "engine": run.engine,
                "metric": _METRICS[run.metric],
                "unit": "ms",
                "measured": run.given,
            }
            try:
                got, by = serving_accuracy.predicted_ms(run, compiler)
            except PlanError as e:
                out.append({**record, "predicted": None, "by": None, "misfit": str(e)})
                continue
            out.append({**record, "predicted": got, "by": by, "misfit": None})
    return out


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per split, source and metric (and per split and metric over every source, ``source``
    ``"all"``): the runs judged (those with a prediction), their median, worst and signed
    median error, how many within :data:`WITHIN`, and how many were called misfits."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        for source in (r["source"], "all"):
            groups.setdefault((r["split"], source, r["metric"]), []).append(r)
    out = []
    order = sorted(
        groups,
        key=lambda k: (k[0] != "calibration", k[2], k[1] != "all", k[1].lower()),
    )
    for split, source, metric in order:
        members = groups[split, source, metric]
        errors = [r["predicted"] / r["measured"] - 1 for r in members if r["predicted"] is not None]
        size = sorted(abs(e) for e in errors)
        out.append(
            {
                "split": split,
                "source": source,
                "metric": metric,
                "count": len(errors),
                "misfits": sum(bool(r.get("misfit")) for r in members),
                "median": statistics.median(size) if size else None,
                "worst": size[-1] if size else None,
                "signed_median": statistics.median(errors) if errors else None,
                "within": sum(e <= WITHIN for e in size),
            }
        )
    return out


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def report(model: str, runs: list[dict[str, Any]], compiler: str) -> dict[str, Any]:
    """One model's runs and summaries, with what made them."""
    return {
        **result_header(None),
        "model": model,
        "compiler": compiler,
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "within": WITHIN,
        "runs": runs,
        "summary": summarize(runs),
    }


def _print(data: dict[str, Any]) -> None:
    print(f"{data['model']} ({data['compiler']}):")
    for s in data["summary"]:
        if s["count"]:
            print(
                f"  {s['split']:11} {s['source']:20} {s['metric']:22} {s['count']:3} runs, "
                f"median {s['median']:6.1%}, worst {s['worst']:6.1%}, signed "
                f"{s['signed_median']:+6.1%}, {s['within']} within {WITHIN:.0%}"
                + (f", {s['misfits']} misfits" if s["misfits"] else "")
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", metavar="PATH", help="write the serving runs, compiled, as JSON to PATH"
    )
    parser.add_argument(
        "--estimates", action="store_true", help="print the estimates of both models alone"
    )
    args = parser.parse_args()
    if args.estimates or not args.json:
        _print(report("training", training_runs(), "estimate"))
        _print(report("serving", serving_runs("cpu"), "estimate"))
    if args.json:
        data = report("serving", serving_runs(None), "the hardware's own")
        _print(data)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
