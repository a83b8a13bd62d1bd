"""How long `shardscope plan` takes, per sweep and per plan, and how much memory it holds.

Runs the command as a user would (a fresh process), samples the resident memory of that
process and its workers together every 50 ms, and prints for each case: the wall time, the
plans compiled and skipped, the per-plan analysis time (lower + compile + audit) as
median / max, and the peak resident memory of the whole process tree. Targets:
7b on 64 devices in at most 60 s on 2 cores; 70b on 1024 devices in at most 120 s; peak memory
under 2 GB; one plan's analysis in at most 3 s. Each case also prints the best plan (its
schedule, step time and MFU) and its validation: compiled communication over the formula for
the best plan of each strategy.

A case is ``model:devices[:hardware[:batch[:seq]]]``; the defaults add the two published jobs
the planner must fit: Llama 2 70B on 64 H100s (batch 64 x 4096) and GPT-3 175B on 768 A100s
(batch 1536 x 2048), and two mixtures of experts: Mixtral 8x7B on 64 H100s (at most 60 s)
and DeepSeek-V3 on 1,024 H100s.

    .venv/bin/python benchmarks/plan_speed.py [--cases 7b:64,70b:1024] [--workers N]

``--screen`` times the analytic screen alone instead (``screen_all``: every strategy, mesh,
micro-batch count, recomputation and pipeline schedule estimated, nothing compiled) of the
planner's default strategies (a mixture's for a mixture), each case in ``--repeat`` fresh
processes (a screen keeps what it worked out for the next in the same process, which the
first screen of ``shardscope plan`` does not have), and prints the median wall and CPU
seconds and how many candidates it estimated. Its default cases: the two published jobs, a
mixture of experts (Qwen3-235B-A22B on 256 H100s) and a TPU pod slice (Llama 2 7B on 128
TPU v5p chips).

    .venv/bin/python benchmarks/plan_speed.py --screen [--cases ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_measured(cmd: list[str]) -> tuple[int, float, int, str]:
    """Runs ``cmd``, sampling its process tree's resident memory every 50 ms: (exit status,
    wall seconds, peak resident bytes, stderr)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_bytes(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return proc.returncode, wall, peak, err.decode(errors="replace")


#: The screens ``--screen`` times unless told.
SCREEN_CASES = (
    "llama2-70b:64:h100:64:4096,gpt3-175b:768:a100:1536:2048,"
    "qwen3-235b-a22b:256:h100:2048:4096,llama2-7b:128:tpu-v5p:256:4096"
)


def screen_once(case: str) -> dict:
    """One screen of ``case`` in this process: ``screen_all`` of the model the planner
    resolves (batch and sequence as given, else its defaults) on the case's devices and
    hardware, over the planner's default strategies; its wall and CPU seconds and what it
    estimated and skipped."""
    from shardscope._src.plan.request import PlanRequest
    from shardscope._src.targets.hardware import hardware
    from shardscope._src.train.candidates import moe_strategies, screen_all
    from shardscope._src.train.sweep import resolve_config

    model, devices, *rest = case.split(":")
    knobs: dict[str, str | int] = dict(zip(("hardware", "batch", "seq"), rest, strict=False))
    for name in ("batch", "seq"):
        if name in knobs:
            knobs[name] = int(knobs[name])
    request = PlanRequest(model, int(devices), **knobs)
    _, config = resolve_config(request)
    names = request.strategy_names
    if config.is_moe or config.is_mla:
        names = moe_strategies(names, asked=False)
    hw = hardware(request.hardware)
    wall, cpu = time.perf_counter(), time.process_time()
    ranked, skipped, pairs = screen_all(config, request.devices, hw, names)
    return {
        "case": case,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "screened": len(ranked),
        "skipped": len(skipped),
        "pairs": pairs,
    }


def time_screen(case: str, repeat: int) -> dict:
    """:func:`screen_once` of ``case`` in ``repeat`` fresh processes: the medians, and each
    run's wall seconds."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, __file__, "--screen-once", case],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return {"case": case, "error": done.stderr[-400:]}
        runs.append(json.loads(done.stdout))
    return {
        **runs[0],
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "walls": [r["wall_s"] for r in runs],
    }


def run_case(case: str, workers: int | None, extra: list[str]) -> dict:
    model, devices, *rest = case.split(":")
    extra = list(extra)
    for flag, value in zip(("--hardware", "--batch", "--seq"), rest, strict=False):
        extra += [flag, value]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = [
            sys.executable,
            "-m",
            "shardscope",
            "plan",
            "--model",
            model,
            "--devices",
            str(devices),
            "--compiler",
            "cpu",
            "--json",
            str(out),
            *extra,
        ]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        code, wall, peak, err = run_measured(cmd)
        if code != 0:
            return {"case": case, "error": err[-400:]}
        data = json.loads(out.read_text())
    per_plan = [p["analysis_s"] for p in data["plans"]]
    best = next((p for p in data["plans"] if p["fits"]), None)
    return {
        "case": case,
        "wall_s": wall,
        "plans": len(data["plans"]),
        "skipped": len(data["skipped"]),
        "workers": data["workers"],
        "per_plan_median_s": statistics.median(per_plan) if per_plan else None,
        "per_plan_max_s": max(per_plan) if per_plan else None,
        "peak_rss_mb": peak / 2**20,
        "best": (
            f"{best['strategy']} {best['mesh']} (m={best['microbatches']}, {best['remat']}"
            f" recompute): step {best['step_time_s']:.3g} s, MFU {best['mfu']:.0%}"
            if best
            else "none fits the device memory"
        ),
        "screened": data["screened"],
        "validations": [
            (v["strategy"], v["mesh"], v["ratio"], v["ok"], v["cpu_ratio"])
            for v in data["validations"]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=None,
        help="comma-separated model:devices[:hardware[:batch[:seq]]] (default: the speed "
        "targets 7b:64 and 70b:1024, the two published jobs, and 1b:8, which has DP, FSDP "
        "and TP plans that fit, for the validation; with --screen, the screens of "
        "SCREEN_CASES)",
    )
    parser.add_argument(
        "--screen",
        action="store_true",
        help="time the analytic screen alone (nothing compiled), in fresh processes",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="--screen: runs of each case (the median)"
    )
    parser.add_argument("--screen-once", metavar="CASE", help=argparse.SUPPRESS)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the command's own choice)",
    )
    parser.add_argument("extra", nargs="*", help="more arguments for `shardscope plan`")
    args = parser.parse_args()
    if args.screen_once:
        print(json.dumps(screen_once(args.screen_once)))
        return
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    if args.screen:
        for case in (args.cases or SCREEN_CASES).split(","):
            r = time_screen(case, args.repeat)
            if "error" in r:
                print(f"{r['case']}: FAILED {r['error']}")
                continue
            print(
                f"{r['case']}: screen median {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU "
                f"(of {args.repeat} runs: {', '.join(f'{w:.2f}' for w in r['walls'])} s), "
                f"{r['screened']} estimated, {r['skipped']} strategy-and-mesh pairs skipped "
                f"of {r['pairs']}"
            )
        return
    cases = args.cases or (
        "7b:64,70b:1024,llama2-70b:64:h100:64:4096,gpt3-175b:768:a100:1536:2048,1b:8,"
        "mixtral-8x7b:64:h100,deepseek-v3:1024:h100"
    )
    for case in cases.split(","):
        r = run_case(case, args.workers, args.extra)
        if "error" in r:
            print(f"{r['case']}: FAILED {r['error']}")
            continue
        print(
            f"{r['case']}: wall {r['wall_s']:.1f} s, {r['screened']} estimated, {r['plans']} "
            f"compiled + {r['skipped']} skipped, {r['workers']} workers, per plan median "
            f"{r['per_plan_median_s']:.2f} s / max {r['per_plan_max_s']:.2f} s, peak RSS "
            f"(all processes) {r['peak_rss_mb']:.0f} MB; best {r['best']}"
        )
        checks = ", ".join(
            f"{s} {m} {ratio:.3f}x"
            + ("" if ok else f" (CPU all-reduce for reduce-scatter: {cpu:.3f}x)")
            for s, m, ratio, ok, cpu in r["validations"]
            if ratio is not None
        )
        print(f"{'':>12}compiled / formula: {checks}")


if __name__ == "__main__":
    main()
