"""Serving at a request rate (``serve(..., rate=)``, ``plan --serve --rate``): the latencies
its requests see with prefills batched in flight, the sequences in flight the cache holds,
the most a layout sustains; and the kernels a compiled serving step launches, each priced at
the hardware's launch time."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import assert_usage_error
from shardscope._src.audit.overlap import program_kernels
from shardscope._src.base.errors import PlanError
from shardscope._src.cli.main import main
from shardscope._src.hlo.parse import parse_hlo
from shardscope._src.model.presets import model_preset
from shardscope._src.serve.compiled import compile_decode
from shardscope._src.serve.online import poisson_quantile, under_load
from shardscope._src.serve.search import serve
from shardscope._src.targets.hardware import PRESETS, hardware

#: A scheduled module written by hand (as ``test_cost`` reads it).
HANDWRITTEN = (Path(__file__).parent / "fixtures" / "hlo_handwritten" / "costs.hlo").read_text()


def _poisson_cdf(mean, k):
    term = total = math.exp(-mean)
    for j in range(1, k + 1):
        term *= mean / j
        total += term
    return total


@pytest.mark.parametrize("mean", [0.3, 2.5, 17.0, 240.0])
def test_the_cache_holds_the_99th_percentile_of_a_poisson_count(mean):
    k = poisson_quantile(mean)
    assert _poisson_cdf(mean, k) >= 0.99 > _poisson_cdf(mean, k - 1)


def test_prefills_interleaved_stretch_the_decode_step_by_the_time_they_take():
    # no cache (the step is the same at any load): a 5 ms decode step, a 15 ms prefill, 10
    # requests a second. A second of the replica's life runs 10 prefills (0.15 s), each
    # giving the running sequences a token too, and 0.85 s / 5 ms = 170 decode steps: 180
    # tokens a sequence
    load = under_load(
        rate=10, output=101, decode_s=5e-3, sequences=1, sequence_s=0.0, prefill_s=15e-3
    )
    assert load.token_s == pytest.approx(1 / 180, rel=1e-12)
    # a new request waits for the rest of the iteration under way, at a random moment
    # sum(T^2) / 2 over the time: 10 prefills of 15 ms a second, and 5 ms decode steps the
    # rest of the time the replica is busy; then, prefills going first (Cobham's
    # non-preemptive priority queue), for the prompts queued before it: / (1 - 10 x 15 ms)
    busy = 1 - math.exp(-load.in_flight)
    residual = 10 * 15e-3**2 / 2 + (busy - 10 * 15e-3) * 5e-3 / 2
    assert load.first_token_s == pytest.approx(15e-3 + residual / (1 - 0.15), rel=1e-9)
    # Little's law: what arrives a second times how long each stays
    stay = load.first_token_s + 100 * load.token_s
    assert load.in_flight == pytest.approx(10 * stay, rel=1e-6)


def test_a_lone_request_sees_the_decode_step_of_its_own_cache_and_no_wait():
    # the step was timed at 4 sequences, each cache 0.1 ms of it
    load = under_load(
        rate=1e-9, output=64, decode_s=5e-3, sequences=4, sequence_s=1e-4, prefill_s=20e-3
    )
    assert load.token_s == pytest.approx(5e-3 - 3e-4, rel=1e-6)
    assert load.first_token_s == pytest.approx(20e-3, rel=1e-6)


def test_a_replica_whose_prefills_fill_its_time_does_not_sustain_the_rate():
    # 20 ms prefills: 50 a second fill the replica's time
    def at(rate):
        return under_load(
            rate=rate, output=8, decode_s=5e-3, sequences=1, sequence_s=0.0, prefill_s=20e-3
        )

    assert at(49) is not None
    assert at(51) is None


def test_a_load_whose_caches_slow_each_step_nearly_as_fast_as_they_arrive_is_sustained():
    # each sequence adds 0.95 ms to a 10 ms step, and a request stays for 1,000 of them: a
    # sequence more in flight keeps about 0.96 more in flight, and the mean settles near 280
    load = under_load(
        rate=1, output=1000, decode_s=10e-3 + 8 * 0.95e-3, sequences=8, sequence_s=0.95e-3,
        prefill_s=20e-3,
    )  # fmt: skip
    assert load is not None
    stay = load.first_token_s + 999 * load.token_s
    assert load.in_flight == pytest.approx(stay, rel=1e-6)
    # its step reads the caches of the sequence and of those in flight beside it
    assert load.token_s > 10e-3 + (1 + load.in_flight) * 0.95e-3


def test_a_rate_plans_the_sequences_in_flight_and_the_latencies_they_see():
    rate = 20.0
    result = serve("llama3-8b", 2, hardware="h100", prompt=512, output=128, rate=rate,
                   compiler="cpu")  # fmt: skip
    assert result.rate == rate
    # every layout serves the same requests: best is the fastest per output token
    steps = [p.decode_step_s for p in result.plans]
    assert steps == sorted(steps)
    for p in result.plans:
        assert p.tokens_per_s_per_chip == pytest.approx(rate * 128 / 2, rel=1e-12)
        r = p.replicas
        assert p.batch == r * poisson_quantile(p.in_flight / r)
        assert p.first_token_s > p.prefill_s
        assert p.in_flight == pytest.approx(
            rate * (p.first_token_s + 127 * p.decode_step_s), rel=1e-6
        )
    # a busier server: more in flight, slower tokens, a longer wait for the first
    busier = serve("llama3-8b", 2, hardware="h100", prompt=512, output=128, rate=2 * rate,
                   compiler="cpu")  # fmt: skip
    for p in result.plans:
        q = next(q for q in busier.plans if q.mesh == p.mesh)
        assert q.in_flight > p.in_flight
        assert q.decode_step_s > p.decode_step_s
        assert q.first_token_s > p.first_token_s


@pytest.mark.parametrize("prompt, output", [(2048, 128), (128, 2048)])
def test_a_rate_no_layout_sustains_names_the_most_one_does(prompt, output):
    def at(rate):
        return serve("llama3-8b", 1, hardware="h100", prompt=prompt, output=output, rate=rate,
                     compiler="cpu")  # fmt: skip

    with pytest.raises(PlanError, match=r"give rate=([\d.]+) or less") as err:
        at(1000)
    assert err.value.params == ("rate",)
    most = float(re.search(r"give rate=([\d.]+) or less", str(err.value)).group(1))
    at(most)  # three figures, rounded down: met
    with pytest.raises(PlanError, match="sustains it"):
        at(most * 1.01)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, "2"])
def test_a_rate_that_is_no_positive_number_is_refused(bad):
    with pytest.raises(PlanError, match="requests a second") as err:
        serve("llama3-8b", 1, hardware="h100", prompt=64, output=8, rate=bad, compiler="cpu")
    assert err.value.params == ("rate",)


def test_a_rate_and_a_batch_together_are_refused():
    with pytest.raises(PlanError, match="give one of them") as err:
        serve("llama3-8b", 1, prompt=64, output=8, rate=2, batch=4, compiler="cpu")
    assert err.value.params == ("batch",)


def test_plan_serve_at_a_rate_prints_the_sequences_in_flight(capsys):
    argv = ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "467",
            "--output", "256", "--compiler", "cpu"]  # fmt: skip
    assert main([*argv, "--rate", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 requests/s" in out and "in flight" in out
    line = assert_usage_error([*argv, "--rate", "2", "--batch", "4"], "--batch", capsys)
    assert "give one of them" in line


def test_a_program_launches_each_instruction_that_computes_or_moves_data():
    # the entry's two fusions and the update, take, slice, gather and convolution (its
    # collectives are priced apart); the loop's matmul fusion and counter add on each of its
    # 5 trips, and its condition's compare on each of the 6 tests
    assert program_kernels(parse_hlo(HANDWRITTEN)) == 7 + 5 * 2 + 6


def test_the_kernel_launch_is_set_from_the_command_line(capsys):
    argv = ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "64",
            "--output", "8", "--compiler", "cpu"]  # fmt: skip
    assert main([*argv, "--kernel-launch", "0"]) == 0
    capsys.readouterr()
    for bad in ("-1e-6", "inf"):
        assert_usage_error([*argv, "--kernel-launch", bad], "--kernel-launch", capsys)


def test_a_compiled_decode_step_pays_each_kernels_launch():
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    plan = serve(two, 1, hardware="h100", prompt=64, output=16, batch=4, compiler="cpu").best
    free = compile_decode(plan, two, hardware("h100", kernel_launch_s=0))
    paid = compile_decode(plan, two, PRESETS["h100"])
    # at least each layer's four weight matmuls (the query, key and value projections
    # perhaps as one; the output projection, the MLP's gate and up, its down)
    assert paid.decode_kernels == free.decode_kernels >= 4 * 2
    launches = paid.decode_kernels * 1e-6
    assert paid.decode_step_s - free.decode_step_s == pytest.approx(launches, rel=1e-9)


def test_a_compiled_decode_steps_matmuls_read_at_their_bandwidth_and_the_rest_at_the_whole():
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    plan = serve(two, 1, hardware="h100", prompt=64, output=16, batch=4, compiler="cpu").best
    whole = compile_decode(plan, two, hardware("h100", hbm_fraction=1))
    half = compile_decode(plan, two, hardware("h100", hbm_fraction=0.5))
    # at half the bandwidth the matmuls' bytes take their time once more: the weights but
    # the embedding table, whose lookup reads 4 rows of it (element-wise, with the norms and
    # the cache's update), and a few MB of activations, cache and logits besides
    embedding = 128256 * 4096 * 2
    read = (plan.weight_bytes_per_device - embedding) / 3.35e12
    again = half.decode_memory_s - whole.decode_memory_s
    assert read <= again <= 1.01 * read
    assert again < whole.decode_memory_s


def test_the_hbm_fraction_is_set_from_the_command_line(capsys, tmp_path):
    argv = ["plan", "--serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "64",
            "--output", "8", "--compiler", "cpu", "--batch", "1"]  # fmt: skip
    for fraction in ("0.5", "1"):
        out = str(tmp_path / f"{fraction}.json")
        assert main([*argv, "--hbm-fraction", fraction, "--json", out]) == 0
    capsys.readouterr()
    slow, fast = (json.loads((tmp_path / f"{f}.json").read_text()) for f in ("0.5", "1"))
    # one sequence on one H100: its weights and cache read by matmuls, twice as long at half
    got = [r["plans"][0]["decode_memory_s"] for r in (slow, fast)]
    assert got[0] == pytest.approx(2 * got[1], rel=1e-12)
    for bad in ("1.5", "0", "x"):
        assert_usage_error([*argv, "--hbm-fraction", bad], "hbm", capsys)


@pytest.mark.compiler
def test_a_layouts_estimated_plans_launch_its_compiled_steps_kernels():
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    compiled = serve(two, 1, hardware="h100", prompt=64, output=16)
    estimated = serve(two, 1, hardware="h100", prompt=64, output=16, compiler="cpu")
    (step,) = [p for p in compiled.plans if p.compiled_by]
    assert step.decode_kernels >= 4 * 2
    others = [p for p in compiled.plans if not p.compiled_by]
    assert others
    for p in others:
        alone = next(q for q in estimated.plans if q.batch == p.batch)
        assert p.decode_kernels == step.decode_kernels
        launches = step.decode_kernels * 1e-6
        assert p.decode_step_s == pytest.approx(alone.decode_step_s + launches, rel=1e-12)


def test_replicas_in_lockstep_each_stall_for_every_prefill():
    # 5 requests a second a replica, but 10 prefills a second stall it (its partner's too):
    # a second runs 10 prefills of 15 ms and 0.85 s / 5 ms = 170 decode steps, 180 tokens
    load = under_load(
        rate=5, output=101, decode_s=5e-3, sequences=1, sequence_s=0.0, prefill_s=15e-3,
        prefill_rate=10,
    )  # fmt: skip
    assert load.token_s == pytest.approx(1 / 180, rel=1e-12)
    alone = under_load(
        rate=5, output=101, decode_s=5e-3, sequences=1, sequence_s=0.0, prefill_s=15e-3
    )
    assert alone.token_s == pytest.approx(1 / (5 + 0.925 / 5e-3), rel=1e-12)
