"""What the docs site is built from stays whole: the accuracy page's committed serving runs are
every run the benchmark judges, the API page lists every public name, and the published runs a
plan's notes quote are the benchmark's. (`make docs` builds the site itself, every guide
executed; CI runs it after the suite.)"""

import json
import re
import sys
from pathlib import Path

import shardscope

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _benchmark(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_committed_serving_runs_are_every_run_the_benchmark_judges():
    accuracy = _benchmark("accuracy")
    judged = accuracy.serving_runs("cpu")  # the estimates: seconds, and the same runs
    committed = json.loads((ROOT / "benchmarks/results/serving_compiled.json").read_text())

    def key(r):
        return r["split"], r["source"], r["run"], r["metric"], r["measured"]

    assert sorted(map(key, committed["runs"])) == sorted(map(key, judged)), (
        "benchmarks/serving_accuracy.py judges other runs than benchmarks/results/"
        "serving_compiled.json holds: run `python benchmarks/accuracy.py --json "
        "benchmarks/results/serving_compiled.json`"
    )
    assert committed["summary"] == accuracy.summarize(committed["runs"])


def test_the_summaries_count_every_run_once_per_split_and_metric():
    accuracy = _benchmark("accuracy")
    runs = accuracy.training_runs()
    summary = accuracy.summarize(runs)
    for s in summary:
        if s["source"] == "all":
            members = [r for r in runs if (r["split"], r["metric"]) == (s["split"], s["metric"])]
            # a training run called a misfit is judged all the same, and counted
            assert s["count"] == len(members)
            assert s["misfits"] == sum(bool(r["misfit"]) for r in members)
    sources = {(s["split"], s["metric"]) for s in summary if s["source"] != "all"}
    assert {(r["split"], r["metric"]) for r in runs} == sources


def test_every_training_run_the_benchmarks_list_is_judged_or_on_the_page_with_its_reason():
    accuracy = _benchmark("accuracy")
    moe_heldout = _benchmark("moe_heldout")
    judged = {r["run"] for r in accuracy.training_runs()}
    unjudged = accuracy.unjudged_training_runs()
    listed = {r["run"] for r in unjudged}
    # every mixture-of-experts run the benchmark reads is on the page, judged or listed
    for run in moe_heldout.RUNS:
        assert run.name in judged or run.name in listed, run.name
    assert all(r["why"] for r in unjudged)
    assert not judged & listed


def test_the_api_page_lists_every_public_name():
    page = (DOCS / "reference/api.rst").read_text()
    listed = set(re.findall(r"shardscope\.(\w+)", page))
    assert set(shardscope.__all__) <= listed, set(shardscope.__all__) - listed


def test_every_guide_sets_the_simulated_devices_first():
    pages = [DOCS / "getting_started.md", *sorted((DOCS / "guides").glob("*.md"))]
    for page in pages:
        cells = page.read_text().split("```{code-cell} ipython3\n")[1:]
        if cells:  # an executed page: its first cell, as a reader runs it, sets the devices
            assert "shardscope.use_cpu_devices(8)" in cells[0].split("```")[0], page.name


def test_the_mixture_fp8_note_quotes_the_runs_the_benchmark_judges():
    from shardscope._src.plan.notes import Note, PlanNote

    moe_heldout = _benchmark("moe_heldout")
    runs = {r.name: r for r in moe_heldout.RUNS}
    fp8 = [
        runs[f"Megatron-Bridge {v} Qwen3-30B-A3B FP8, 16 H100"]
        for v in ("26.04", "26.04.01", "26.06")
    ]
    bf16 = runs["Megatron-Bridge Qwen3-30B-A3B BF16, HybridEP, no EP overlap, 16 H100"]
    fused = runs[
        "Megatron-Bridge Qwen3-30B-A3B BF16, HybridEP with fused permute, EP overlap, 16 H100"
    ]
    text = Note(PlanNote.MIXTURE_FP8).text
    measured = sorted(r.measured_s for r in fp8)
    assert f"{measured[0]:.2f}-{measured[-1]:.2f} s a step in fp8" in text
    assert f"{bf16.measured_s:.2f} s in bf16 ({fused.measured_s:.2f} s with" in text
    # what it says of the estimate holds: it has every fp8 run faster than the bf16 one
    bf16_s = moe_heldout.estimate_run(bf16)[0].time.step_s
    assert all(moe_heldout.estimate_run(r)[0].time.step_s < bf16_s for r in fp8)


def test_the_experts_unsplit_note_quotes_the_marin_pair_and_the_mixtral_sweep_the_benchmark_lists():
    from shardscope._src.plan.notes import ExpertsUnsplitValues, Note, PlanNote

    moe_heldout = _benchmark("moe_heldout")
    runs = {r.name: r for r in moe_heldout.RUNS}
    ep = runs["Marin 360B-A21B EP 64, 64 GB200 (one rack)"]
    fsdp = runs["Marin 360B-A21B FSDP 64 (control), 64 GB200 (one rack)"]
    text = Note(PlanNote.EXPERTS_UNSPLIT, ExpertsUnsplitValues(labels=("fsdp",))).text

    def tokens_per_s(run):
        return round(run.config.batch * run.config.seq / run.measured_s)

    assert f"program: {tokens_per_s(fsdp):,} tokens a second against" in text
    assert f"expert parallelism's {tokens_per_s(ep):,}," in text
    # what it says of the estimate holds: the FSDP run, planned with its collectives on the
    # critical path (the benchmark's overrides), is slower than the estimate
    assert fsdp.overrides["fsdp_overlap"] is False
    assert fsdp.measured_s > moe_heldout.estimate_run(fsdp)[0].time.step_s
    # BioNeMo's Mixtral sweep on one B200 node: plain FSDP the slowest that ran, the figures
    # quoted its and the fastest's, and the estimate's nearest layouts put it last too
    sweep = [r for r in moe_heldout.RUNS if r.sweep == "Mixtral 8x7B on 8 B200"]
    assert len(sweep) == 4
    slowest = max(sweep, key=lambda r: r.measured_s)
    fastest = min(sweep, key=lambda r: r.measured_s)
    assert slowest.strategy == "fsdp" and dict(fastest.mesh)["expert"] == 4
    assert "1.237 s a step against 0.962 s with 4-way expert parallelism" in text
    assert (slowest.measured_s, fastest.measured_s) == (1.237, 0.962)
    nearest = {r.name: moe_heldout.estimate_run(r, nearest=True)[0].time.step_s for r in sweep}
    assert max(nearest, key=nearest.__getitem__) == slowest.name


def test_the_guides_figures_of_engine_memory_and_group_limited_routing_are_the_codes():
    # what plan_serving.md and moe.md write of the engines' memory and of DeepSeek-V3's
    # group-limited routing, computed again from the rules and the share they quote
    from shardscope._src.model.moe import device_share
    from shardscope._src.targets.engines import ENGINES
    from shardscope._src.targets.hardware import GIB, hardware

    serving = " ".join((DOCS / "guides/plan_serving.md").read_text().split())
    h100 = hardware("h100")
    vllm = ENGINES["vllm"].memory_limit(h100, 1, 0)
    assert f"({h100.runtime_memory / GIB:.2f} GiB on an H100: {vllm / GIB:.1f} GiB)" in serving
    sglang = [ENGINES["sglang"].memory.fraction(h100, t) for t in (1, 8)]
    assert f"({sglang[0]:g} of an H100 at tensor parallelism 1, {sglang[1]:g} at 8)" in serving
    moe = " ".join((DOCS / "guides/moe.md").read_text().split())
    nodes = [8 * device_share(256, 8, 8, limit) for limit in ((8, 4), (8, 8))]
    assert f"it reaches {nodes[0]:.1f} nodes where unlimited it would reach {nodes[1]:.1f}" in moe
