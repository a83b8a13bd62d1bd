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
        default=(
            "7b:64,70b:1024,llama2-70b:64:h100:64:4096,gpt3-175b:768:a100:1536:2048,1b:8,"
            "mixtral-8x7b:64:h100,deepseek-v3:1024:h100"
        ),
        help="comma-separated model:devices[:hardware[:batch[:seq]]] (default: the speed "
        "targets 7b:64 and 70b:1024, the two published jobs, and 1b:8, which has DP, FSDP "
        "and TP plans that fit, for the validation)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the command's own choice)",
    )
    parser.add_argument("extra", nargs="*", help="more arguments for `shardscope plan`")
    args = parser.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    for case in args.cases.split(","):
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
