"""How long hostile HLO text takes to be audited or refused, and how much memory it takes.

Each case runs in a fresh process (so its peak memory is its own) and prints the outcome,
the seconds the audit took (wall clock and CPU) and the process's peak memory. The cases are
the kinds of text that once took seconds to minutes or gigabytes: device counts and replica
groups far past any program, ninety-six kilobytes of unclosed comments, the largest
dimensions and trip counts, and many collectives sharing one grouping of 65,536 devices. The
target is under 2 s and 500 MB each.

Then 10,000 fuzz cases (``tests/hlo_fuzz.py``: seeded mutations of real compiler output; the
suite runs 1,000 of them), two seeds in two processes: per seed, the audits, refusals and
crashes (a crash: anything but an audit whose every instruction line parsed, or a one-line
refusal), the slowest case's CPU seconds and its number, the slowest case's wall-clock
seconds, and the most memory one case took. It exits with status 1 if a case crashed.

    .venv/bin/python benchmarks/hostile_hlo.py [--fuzz-cases 5000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[1] / "tests" / "hlo_fuzz.py"
TARGET_S = 2.0
TARGET_MB = 500

HEADER = "HloModule m, num_partitions={p}{extra}\n\n"
ADD = (
    "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n"
    "  ROOT %s = f32[] add(%x, %y)\n}\n\n"
)


def module(body: str, p: int = 8, extra: str = "", comps: str = "") -> str:
    return (
        HEADER.format(p=p, extra=extra)
        + ADD
        + comps
        + "ENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
        + body
        + "  ROOT %r = f32[8]{0} copy(%p)\n}\n"
    )


def gathers(groups: str, n: int) -> str:
    return "".join(
        f"  %ag{i} = f32[64]{{0}} all-gather(%p), channel_id={i + 1}, replica_groups={groups}, "
        "dimensions={0}, use_global_device_ids=true\n"
        for i in range(n)
    )


def loop(trips: str) -> str:
    comps = (
        "%cond (c: f32[8]) -> pred[] {\n  %c = f32[8]{0} parameter(0)\n"
        "  ROOT %k = pred[] constant(true)\n}\n\n"
        "%body (t: f32[8]) -> f32[8] {\n  %t = f32[8]{0} parameter(0)\n"
        "  ROOT %ar = f32[8]{0} all-reduce(%t), channel_id=1, "
        "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add\n}\n\n"
    )
    call = (
        "  %w = f32[8]{0} while(%p), condition=%cond, body=%body, "
        f'backend_config={{"known_trip_count":{{"n":"{trips}"}}}}\n'
    )
    return module(call, comps=comps)


CASES = {
    "replica_count=100000000": module(gathers("{}", 1), extra=", replica_count=100000000"),
    "40 x [1,1048576]<=[1048576] on 8 devices": module(gathers("[1,1048576]<=[1048576]", 40)),
    "40 x mesh 1024x1024 on 8 devices": module(gathers("mesh['a'=1024,'b'=1024] {'b'}", 40)),
    "96 KB of unclosed /* after a shape": module(
        "  %c = f32[8]{0}" + "/*x" * 32_000 + " copy(%p)\n"
    ),
    "400-digit dimension": module(f"  %c = f32[{'9' * 400}]{{0}} copy(%p)\n"),
    "4,000-digit trip count": loop("9" * 4000),
    "trip count 2**62 (audits)": loop(str(2**62)),
    "200 collectives, one grouping of 65,536": module(gathers("[32768,2]<=[65536]", 200), p=65536),
    "4 groupings of 65,536 (over the budget)": module(
        "".join(
            gathers(f"[{65536 // s},{s}]<=[65536]", 1).replace("ag0", f"ag{s}")
            for s in (2, 4, 8, 16)
        ),
        p=65536,
    ),
}

RUN = """
import io, json, resource, sys, time
import jax  # imports are not the case's time
import shardscope
from rich.console import Console
from shardscope._src.base.errors import ShardscopeError
from shardscope._src.render.audit import render_audit
text = sys.stdin.read()
t, c = time.perf_counter(), time.process_time()
try:
    a = shardscope.audit(text)
    render_audit(a, console=Console(file=io.StringIO(), width=120))
    outcome = "audit"
except ShardscopeError as e:
    outcome = "refused: " + str(e)[:90]
seconds, cpu = time.perf_counter() - t, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": seconds, "cpu": cpu, "mb": peak, "outcome": outcome}))
"""


def fuzz(cases: int) -> bool:
    """The fuzz cases of seeds 0 and 1, one process each; whether none crashed."""
    runs = [
        subprocess.Popen(
            [sys.executable, str(FUZZ), "--seed", str(seed), "--cases", str(cases)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    print(
        f"\n{'fuzz seed':10s} {'cases':>6s} {'audit':>6s} {'error':>6s} {'crash':>6s} "
        f"{'CPU s':>8s} {'of case':>8s} {'s':>8s} {'MB':>8s}"
    )
    worst_s = worst_mb = 0.0
    crashes: list[dict] = []
    for p in runs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{FUZZ.name} exited with {p.returncode}")
        r = json.loads(out)
        mb = r["largest_bytes"] / 2**20
        worst_s, worst_mb = max(worst_s, r["cpu_s"]), max(worst_mb, mb)
        crashes += [{"seed": r["seed"], **c} for c in r["crashes"]]
        print(
            f"{r['seed']:<10d} {r['cases']:6d} {r['audit']:6d} {r['error']:6d} {r['crash']:6d} "
            f"{r['cpu_s']:8.3f} {r['cpu_case']:8d} {r['slowest_s']:8.3f} {mb:8.0f}"
        )
    within = worst_s < TARGET_S and worst_mb < TARGET_MB
    print(
        f"slowest case {worst_s:.3f} CPU s, largest {worst_mb:.0f} MB "
        f"(target under {TARGET_S:g} s and {TARGET_MB} MB: {'met' if within else 'MISSED'})"
    )
    for c in crashes[:3]:
        print(f"crash: seed {c['seed']} case {c['case']} at {c['at']}: {c['error']}")
    return not crashes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz-cases", type=int, default=5000, help="cases per seed (2 seeds)")
    args = parser.parse_args(argv)
    print(f"{'case':44s} {'seconds':>8s} {'CPU s':>8s} {'peak MB':>8s}  outcome")
    for name, text in CASES.items():
        p = subprocess.run(
            [sys.executable, "-c", RUN], input=text, capture_output=True, text=True, check=True
        )
        r = json.loads(p.stdout)
        print(f"{name:44s} {r['s']:8.3f} {r['cpu']:8.3f} {r['mb']:8.0f}  {r['outcome'][:70]}")
    return 0 if fuzz(args.fuzz_cases) else 1


if __name__ == "__main__":
    sys.exit(main())
