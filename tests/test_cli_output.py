"""What ``plan``, ``serve``, ``shard`` and ``audit`` print: by default the answer on one screen
(the table, the best plans' communication, the skipped candidates a line a reason, each note on
one line, a closing line naming where the rest is); with ``--verbose``, everything."""

import contextlib
import io
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import shardscope
from helpers import sub_parser
from shardscope._src.cli.main import main
from shardscope._src.cli.options import MODELS_PAGE
from shardscope._src.plan.notes import PlanNote
from shardscope._src.plan.types import Skipped, SkipReason

ROOT = Path(__file__).resolve().parent.parent
PLAN = ["plan", "--model", "tiny", "--devices", "8", "--compiler", "cpu"]
SERVE = ["serve", "--model", "tiny", "--devices", "8", "--prompt", "64", "--output", "16"]
SERVE += ["--compiler", "cpu"]


@pytest.fixture(scope="module")
def planned():
    """Tiny on 8 devices at batch 2: the data axes of 8 and of 4 do not divide it, so four
    candidates are skipped for divisibility; one record skipped for memory is put among them,
    so that the lines group by reason, not by neighbours."""
    result = shardscope.plan(
        "tiny",
        8,
        batch=2,
        strategies=["dp", "fsdp", "zero1", "tp", "dp_tp"],
        workers=0,
        stages=1,
        microbatches=1,
        remat="none",
        compile_top=1,
        compiler="cpu",
    )
    memory = Skipped("dp", "data=2,model=4", SkipReason.MEMORY, "the model state does not fit")
    skipped = (*result.skipped[:1], memory, *result.skipped[1:])
    return replace(result, skipped=skipped)


@pytest.fixture(scope="module")
def printed(planned):
    """What ``plan`` prints by default and with ``--verbose``, of the planned result."""
    out = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr("shardscope._src.cli.plan.plan_request", lambda request, progress: planned)
        for argv in (PLAN, [*PLAN, "--verbose"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                assert main(argv) == 0
            out.append(buf.getvalue())
    return tuple(out)


def test_every_command_takes_the_one_verbose_option():
    for command in (("plan",), ("serve",), ("shard",), ("audit", "program"), ("audit", "hlo")):
        parser = sub_parser(command)
        action = parser._option_string_actions["--verbose"]
        assert action.dest == "verbose" and action.default is False, command


def test_the_default_groups_the_skipped_candidates_by_reason(planned, printed):
    default, _ = printed
    records = planned.skipped
    counts = Counter(str(s.reason) for s in records)
    assert counts == {"divisibility": 4, "memory": 1}
    lines = [line for line in default.splitlines() if line.startswith("skipped for ")]
    assert len(lines) == len(counts)  # one line a reason, in the order they first appear
    for line, (reason, n) in zip(lines, counts.items(), strict=True):
        named = [f"{s.strategy} {s.mesh}" for s in records if s.reason == reason][:3]
        more = f" and {n - 3} more" if n > 3 else ""
        assert line == f"skipped for {reason}: {n} ({', '.join(named)}{more})"
    # no candidate's own message, and no table of them
    assert not any(s.message[:40] in default for s in records)
    assert not re.search(r"^\s*Skipped\s*$", default, re.M)


def test_verbose_prints_what_the_default_leaves_out(planned, printed):
    default, verbose = printed
    # the table of every skipped candidate, the validation table, the time model's sources
    assert re.search(r"^\s*Skipped\s*$", verbose, re.M)
    assert all(f"{s.strategy} " in verbose and s.mesh in verbose for s in planned.skipped)
    for words in ("Compiled communication vs the analytic formula (", "Sources: ", "MFU: model"):
        assert words in _words(verbose) and words not in _words(default), words
    # the default says it in a line each, and where the rest is; verbose has no such line
    ok = sum(v.ok for v in planned.validations)
    assert f"{ok} of {len(planned.validations)} strategies' best plans within 5%" in default
    (more,) = [line for line in default.splitlines() if line.startswith("more: ")]
    assert "--verbose" in more and "--report FILE" in more and MODELS_PAGE in more
    assert "more: " not in verbose
    # both show every plan and the best plans' communication
    for text in (default, verbose):
        assert all(p.label.split()[0] in text for p in planned.plans)
        assert "Communication of the best" in text


def test_the_default_fits_one_screen(planned, printed):
    default, verbose = printed
    lines = default.splitlines()
    assert len(lines) <= 40 and len(lines) < len(verbose.splitlines())
    # a line a note, the time model's constants and sources left out, then the closing line
    shown = [n for n in planned.notes if n.kind != PlanNote.TIME_MODEL]
    first = next(i for i, line in enumerate(lines) if line.startswith("note: "))
    assert lines[first : first + len(shown) + 1] == [
        *(line for line in lines[first:] if line.startswith("note: ")),
        next(line for line in lines if line.startswith("more: ")),
    ]
    assert len(shown) == len(planned.notes) - 1


def test_serve_explains_its_columns_only_when_verbose(capsys):
    assert main(SERVE) == 0
    default = capsys.readouterr().out
    assert main([*SERVE, "--verbose"]) == 0
    verbose = capsys.readouterr().out
    explained = "Per token: the decode step's traffic through HBM"
    assert explained in _words(verbose) and explained not in _words(default)
    assert "the latency-throughput front." in default
    assert default.rstrip().splitlines()[-1].startswith("more: --verbose, --json FILE;")
    assert len(default.splitlines()) <= 40 and "more: " not in verbose


def test_the_closing_line_names_the_page_of_the_constants_and_their_sources():
    page = ROOT / MODELS_PAGE
    assert "## The constants and their sources" in page.read_text()


def _words(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as one space (a caption wraps)."""
    return " ".join(text.split())
