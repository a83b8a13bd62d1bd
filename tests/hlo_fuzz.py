"""Seeded mutations of real compiler output, run through the audit, its table and its JSON.

Each case takes one HLO fixture (``tests/fixtures/hlo*``, GPU and TPU output included),
applies one to three mutations (numbers made huge, zero or non-ASCII; brackets, quotes and
comments inserted or deleted; lines dropped, repeated, swapped or cut; replica groups,
opcodes, element types, trip counts and the module's device count replaced; pieces of other
fixtures spliced in) and audits the text, on the fallback mesh or on a random mesh of the
right size. The allowed outcomes are an audit whose table, notes and JSON can all be
produced, and whose text's every instruction line was parsed as one instruction, or a
``ShardscopeError`` whose message is one line. Anything else is a crash.

Run as a program it prints one JSON summary, measuring its own time and memory per case
(the suite runs 1,000 cases, ``benchmarks/hostile_hlo.py`` 10,000 in two processes):

    python tests/hlo_fuzz.py --seed 0 --cases 5000
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import resource
import sys
import time
import traceback
import warnings
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

_NUMBER = re.compile(r"[0-9]+")
# Values a number in the text is replaced by: limits, past them, and digits Python's int()
# reads but HLO does not have (superscript two, Arabic-Indic three, full-width eight).
_NUMBERS = [
    "0", "00", "1", "2", "3", "7", "-1", str(2**31), str(2**32), str(2**63 - 1), str(2**63),
    "1" + "0" * 30, "9" * 400, "9" * 5000, "65536", "65537", "1048576", "100000000",
    "\u00b2", "\u0663", "\uff18",
]  # fmt: skip
_TOKENS = [
    "/*", "*/", '"', "{", "}", "(", ")", "[", "]", ",", "=", "<=", "T(", "%", "ROOT ",
    "ENTRY ", "\\", "'", " ", "\n", "\t", "{}", "{{0}}", "->", ":", "<=[", "?", "<=8",
    "/*x", "[/]", "[bold]",
]  # fmt: skip
_GROUPS = [
    "[1,1048576]<=[1048576]", "[1048576,1]<=[1048576]", "[2,4]<=[8]", "[4,2]<=[2,4]T(1,0)",
    "[8,1]<=[8]", "[2,4]<=[4,2]T(1,0)", "mesh['a'=1024,'b'=1024] {'b'}",
    "mesh['a'=2,'b'=4] {'b'}", "mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'a'}",
    "mesh['a'=8] {'a':(2)2}", "maximal_mesh[device_id=3] {}", "{{0,1},{2,3},{4,5},{6,7}}",
    "{{0,1,2,3,4,5,6,7,8}}", "{{0,0}}", "{}", "{{}}", "[0,0]<=[0]", "[2,4]<=[8]T(0,0)",
    "[1,65536]<=[65536]", "[" + ",".join(["1"] * 70) + "]<=[1]",
]  # fmt: skip
_OPCODES = [
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "ragged-all-to-all", "collective-broadcast", "all-gather-start", "all-reduce-start",
    "while", "conditional", "call", "fusion", "async-start", "async-done", "no-such-op",
]  # fmt: skip
_DTYPES = ["f32", "bf16", "s4", "pred", "token", "c128", "zz9", "f8e4m3fn", "u1", "opaque"]
_GROUP_ATTR = re.compile(r"replica_groups=(\{\{[^ ]*?\}\}|\{\}|\[[^ ]*|mesh\[[^\]]*\] \{[^}]*\})")


def _number(t: str, rng: random.Random) -> str:
    found = list(_NUMBER.finditer(t))
    if not found:
        return t
    m = rng.choice(found)
    return t[: m.start()] + rng.choice(_NUMBERS + [str(rng.randint(0, 99))]) + t[m.end() :]


def _delete(t: str, rng: random.Random) -> str:
    if not t:
        return t
    i = rng.randrange(len(t))
    return t[:i] + t[i + rng.choice([1, 1, 2, 5, 40]) :]


def _insert(t: str, rng: random.Random) -> str:
    i = rng.randrange(len(t) + 1)
    token = rng.choice(_TOKENS)
    if rng.random() < 0.1:
        token *= rng.choice([100, 3000])  # long runs: unclosed comments, deep nesting
    return t[:i] + token + t[i:]


def _lines(t: str, rng: random.Random) -> str:
    lines = t.split("\n")
    k = rng.randrange(len(lines))
    r = rng.random()
    if r < 0.3:
        del lines[k]
    elif r < 0.6:
        lines.insert(rng.randrange(len(lines) + 1), lines[k])
    elif r < 0.8:
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
    else:
        lines = lines[:k]
    return "\n".join(lines)


def _groups(t: str, rng: random.Random) -> str:
    found = list(_GROUP_ATTR.finditer(t))
    if not found:
        return t
    m = rng.choice(found)
    return t[: m.start(1)] + rng.choice(_GROUPS) + t[m.end(1) :]


def _header(t: str, rng: random.Random) -> str:
    key = rng.choice(["num_partitions", "replica_count"])
    value = rng.choice(_NUMBERS + ["2", "4", "16", "3"])
    first, _, rest = t.partition("\n")
    if key + "=" in first:
        first = re.sub(key + r"=[^,]*", lambda _: f"{key}={value}", first)
    else:
        first += f", {key}={value}"
    return first + "\n" + rest


def _iota(rng: random.Random, total: int) -> str:
    """A random iota form over ``total`` ids (split into factors, transposed, grouped)."""
    factors = []
    rest = total
    while rest > 1:
        f = rng.choice([d for d in (2, 4, 8, 16, 3, 5) if rest % d == 0] or [rest])
        factors.append(f)
        rest //= f
    size = 1
    for f in factors[rng.randrange(len(factors) + 1) :]:
        size *= f
    text = f"[{total // size},{size}]<=[{','.join(map(str, factors))}]"
    if len(factors) > 1 and rng.random() < 0.7:
        perm = list(range(len(factors)))
        rng.shuffle(perm)
        text += f"T({','.join(map(str, perm))})"
    return text


def _many_devices(t: str, rng: random.Random) -> str:
    """The module on up to 2**17 devices, every collective with its own iota groups."""
    total = rng.choice([1024, 4096, 16384, 65536, 65536, 131072])
    first, _, rest = t.partition("\n")
    first = re.sub(r"num_partitions=[0-9]+", f"num_partitions={total}", first)
    if "num_partitions=" not in first:
        first += f", num_partitions={total}"
    rest = _GROUP_ATTR.sub(
        lambda _: "replica_groups=" + (_iota(rng, total) if rng.random() < 0.9 else "{}"), rest
    )
    return first + "\n" + rest


def _replace_one(t: str, rng: random.Random, pattern: str, choices: list[str]) -> str:
    """``t`` with the first group of one match of ``pattern`` (picked at random) replaced by
    one of ``choices``."""
    found = list(re.finditer(pattern, t))
    if not found:
        return t
    m = rng.choice(found)
    return t[: m.start(1)] + rng.choice(choices) + t[m.end(1) :]


def _opcode(t: str, rng: random.Random) -> str:
    return _replace_one(t, rng, r" ([a-z][a-z\-]*)\(", _OPCODES)


def _dtype(t: str, rng: random.Random) -> str:
    return _replace_one(t, rng, r"\b(f32|s32|pred|u32|bf16)\[", _DTYPES)


def _trips(t: str, rng: random.Random) -> str:
    values = _NUMBERS + [str(2**62), "1000000000", "3"]
    return re.sub(r'"n":"([0-9]+)"', lambda _: f'"n":"{rng.choice(values)}"', t)


def _splice(t: str, rng: random.Random) -> str:
    other = rng.choice(TEXTS)
    i = rng.randrange(len(t) + 1)
    a = rng.randrange(len(other))
    return t[:i] + other[a : a + rng.randint(1, 400)] + t[i:]


MUTATIONS = [
    _number, _number, _delete, _insert, _lines, _groups, _groups, _header, _many_devices,
    _opcode, _dtype, _trips, _splice,
]  # fmt: skip
# The CPU compiler's output, the hand-written async forms, and the smallest GPU and TPU
# programs (async pairs, tiled layouts); the larger target fixtures would only make cases slow.
TEXTS = [
    p.read_text()
    for p in sorted(FIXTURES.glob("hlo*/*.hlo"))
    + sorted(FIXTURES.glob("hlo_targets/*/shard_map_collectives.hlo"))
]


def make_case(rng: random.Random) -> tuple[str, str | None]:
    """One mutated fixture, and the mesh to audit it on (None: the fallback axis)."""
    text = rng.choice(TEXTS)
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(MUTATIONS)(text, rng)
    mesh = None
    m = re.search(r"num_partitions=([0-9]+)", text[:2000])
    if m and len(m.group(1)) < 8 and rng.random() < 0.5:
        rest, sizes = int(m.group(1)), []
        while rest > 1:
            f = rng.choice([d for d in (2, 3, 4, 8, 16) if rest % d == 0] or [rest])
            sizes.append(f)
            rest //= f
        mesh = ",".join(f"a{i}={v}" for i, v in enumerate(sizes)) or None
    return text, mesh


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> None:
    """Starts the process's peak resident size afresh (Linux: ``5`` to ``clear_refs`` sets
    ``VmHWM`` to the current size), so the next peak is one case's alone."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check_case(text: str, mesh: str | None) -> str:
    """``"audit"`` or ``"error"``; raises whatever else the audit or its renderers raise."""
    from rich.console import Console

    import shardscope
    from shardscope._src.base.errors import ShardscopeError
    from shardscope._src.render.audit import render_audit

    try:
        result = shardscope.audit(text, mesh=mesh)
    except ShardscopeError as e:
        if "\n" in str(e) or not str(e).strip():
            raise AssertionError(f"an error message that is not one line: {str(e)[:300]!r}") from e
        return "error"
    render_audit(result, console=Console(file=io.StringIO(), width=120))
    json.dumps(result.to_dict(), allow_nan=False)
    return "audit"


#: A line that reads as one instruction: ``[ROOT] %name = ...`` (the parser takes any number of
#: ``%`` and spaces before the ``=``, as the mutations make them).
_INSTRUCTION_LINE = re.compile(r"\s*(ROOT\s+)?%*[A-Za-z_][\w.\-]*\s*=\s")


def instruction_counts(text: str) -> tuple[int, int]:
    """The lines of ``text`` that read as instructions, and the instructions parsed from it
    (an audited text's two are equal: no line dropped, split or joined)."""
    from shardscope._src.hlo.parse import parse_hlo

    parsed = sum(1 for _ in parse_hlo(text).instructions())
    return sum(1 for line in text.splitlines() if _INSTRUCTION_LINE.match(line)), parsed


def run(seed: int, cases: int) -> dict:
    """Runs ``cases`` cases from ``seed``; the figures of the run, and the crashes.

    A crash is anything but an audit or a one-line refusal, or an audit of a text one of
    whose instruction lines was not parsed as one instruction (a line dropped or split)."""
    import shardscope

    shardscope.audit(TEXTS[0])  # imports and first-use costs are not a case's
    warnings.simplefilter("error")  # as in the suite: a warning is a crash
    rng = random.Random(seed)
    outcomes = {"audit": 0, "error": 0, "crash": 0}
    instructions = 0  # parsed from the audited texts
    crashes: list[dict] = []
    slowest = (0.0, -1)  # wall-clock seconds
    busiest = (0.0, -1)  # CPU seconds: what the case costs, whatever else the machine runs
    largest = (0, -1)
    for k in range(cases):
        text, mesh = make_case(rng)
        _reset_peak()
        before = _rss_bytes()
        t0, c0 = time.perf_counter(), time.process_time()
        error: Exception | None = None
        try:
            outcome = check_case(text, mesh)
        except Exception as e:  # a crash: anything but an audit or one of ours
            outcome, error = "crash", e
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        # The case's own peak, less what the process held when it started.
        grew = _peak_bytes() - before
        if outcome == "audit":  # checked after the case's figures are taken
            try:
                lines, parsed = instruction_counts(text)
                assert lines == parsed, f"{lines} instruction lines, {parsed} parsed"
                instructions += parsed
            except Exception as e:
                outcome, error = "crash", e
        outcomes[outcome] += 1
        if error is not None and len(crashes) < 20:
            where = traceback.extract_tb(error.__traceback__)[-1]
            crashes.append(
                {
                    "case": k,
                    "error": f"{type(error).__name__}: {str(error)[:300]}",
                    "at": f"{Path(where.filename).name}:{where.lineno}",
                    "mesh": mesh,
                    "text": text if len(text) < 20000 else text[:20000],
                }
            )
        slowest = max(slowest, (elapsed, k))
        busiest = max(busiest, (cpu, k))
        largest = max(largest, (grew, k))
    return {
        "seed": seed,
        "cases": cases,
        **outcomes,
        "instructions": instructions,
        "slowest_s": round(slowest[0], 4),
        "slowest_case": slowest[1],
        "cpu_s": round(busiest[0], 4),
        "cpu_case": busiest[1],
        "largest_bytes": largest[0],
        "largest_case": largest[1],
        "crashes": crashes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=1000)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.seed, args.cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
