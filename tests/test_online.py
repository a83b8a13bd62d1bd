"""Serving at a request rate (``serve(..., rate=)``, ``plan --serve --rate``): the latencies
its requests see with prefills batched in flight, the sequences in flight the cache holds,
the most a layout sustains; and the kernels a compiled serving step launches, each priced at
the hardware's launch time."""

import itertools
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
from shardscope._src.model.serving import cache_bytes_per_token
from shardscope._src.serve.compiled import compile_decode
from shardscope._src.serve.online import closed_loop, poisson_quantile, under_load
from shardscope._src.serve.search import serve
from shardscope._src.targets.engines import engine
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


def test_a_chunked_prefill_stretches_the_tokens_less_and_its_prompt_waits_as_a_whole_ones():
    # the same replica, its 3,000-token prompts prefilled in iterations of 1,024 tokens, a
    # token of each the running sequences' own: 3 iterations, each a third of the 40 ms
    # prefill beside the sequences' decodes (the weights read once for both), so each
    # prompt stretches the sequences' tokens by 3 x (40 / 3 - 10) ms, not 40 - 10
    kw = dict(rate=5, output=101, decode_s=10e-3, sequences=1, sequence_s=0.0, prefill_s=40e-3)
    whole = under_load(**kw)
    load = under_load(**kw, prompt=3000, chunk=1024)
    assert whole.token_s == pytest.approx(10e-3 / (1 - 5 * 30e-3), rel=1e-12)
    assert load.token_s == pytest.approx(10e-3 / (1 - 5 * 3 * (40e-3 / 3 - 10e-3)), rel=1e-12)
    # its first token after its own 3 iterations, and after the rest of the prompt under
    # way when it arrives, all its iterations, as a whole prompt's
    busy = 1 - math.exp(-load.in_flight)
    residual = (5 * 40e-3 * 40e-3 + (busy - 5 * 40e-3) * 10e-3) / 2
    assert load.first_token_s == pytest.approx(40e-3 + residual / (1 - 0.2), rel=1e-9)


def test_chunks_shorter_than_the_weights_read_take_a_read_each():
    # a lone client's 4,096-token prompt in chunks of 512: 8 iterations, each as long as
    # the 10 ms read of the weights however little of the 50 ms prefill it carries
    got = closed_loop(clients=1, output=64, decode_s=10e-3, sequences=1, sequence_s=0.0,
                      prefill_s=50e-3, prompt=4096, chunk=512)  # fmt: skip
    assert got.first_token_s == pytest.approx(8 * 10e-3, rel=1e-12)
    assert got.token_s == pytest.approx(10e-3, rel=1e-12)


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
    rate = 12.0  # twice it is sustained by both layouts of two H100s
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
        # in flight from its place in the queue: the engine's API server holds a request
        # before (the default engine's, vllm's)
        queued = p.first_token_s - engine("vllm").request_s
        assert p.in_flight == pytest.approx(rate * (queued + 127 * p.decode_step_s), rel=1e-6)
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
    assert main([*argv, "--kernel-launch", "0", "--kernel-floor", "0"]) == 0
    capsys.readouterr()
    for flag in ("--kernel-launch", "--kernel-floor"):
        for bad in ("-1e-6", "inf"):
            assert_usage_error([*argv, flag, bad], flag, capsys)


def test_the_matmul_tiles_are_set_from_the_command_line(tmp_path):
    # a GPU of half the multiprocessors and tiles of 64 x 64: the command line's plans are
    # those serve() makes with the same hardware settings, and the prefill is priced anew
    argv = ["serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "64", "--output", "8",
            "--batch", "4", "--compiler", "cpu", "--hardware", "h100"]  # fmt: skip
    tiles = {"sms": 66, "tile_m": 64, "tile_n": 64}
    out = tmp_path / "serve.json"
    assert main([*argv, "--sms", "66", "--tile-m", "64", "--tile-n", "64", "--json", str(out)]) == 0
    kw = dict(prompt=64, output=8, batch=4, compiler="cpu")
    want = serve("llama3-8b", 1, hardware="h100", hardware_overrides=tiles, **kw).best
    plain = serve("llama3-8b", 1, hardware="h100", **kw).best
    (got,) = [p for p in json.loads(out.read_text())["plans"] if p["strategy"] == want.strategy]
    assert got["first_token_s"] == want.first_token_s != plain.first_token_s


def test_a_compiled_decode_step_pays_each_kernels_launch_and_its_engines_host():
    two = replace(model_preset("llama3-8b").config(batch=1), layers=2)
    plan = serve(two, 1, hardware="h100", prompt=64, output=16, batch=4, compiler="cpu").best
    assert plan.engine == "vllm"  # the default
    free = compile_decode(replace(plan, engine="none"), two, hardware("h100", kernel_launch_s=0))
    paid = compile_decode(plan, two, PRESETS["h100"])
    # at least each layer's four weight matmuls (the query, key and value projections
    # perhaps as one; the output projection, the MLP's gate and up, its down)
    assert paid.decode_kernels == free.decode_kernels >= 4 * 2
    launches = paid.decode_kernels * 1e-6
    # vLLM's host after the step: 126 us, and 4 us for each of its 4 sequences
    host = 126e-6 + 4 * 4e-6
    assert paid.decode_host_s == pytest.approx(host, rel=1e-12)
    assert paid.decode_step_s - free.decode_step_s == pytest.approx(launches + host, rel=1e-9)


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
        # the compiled step's launches in place of the estimate's (2 layers of 10 kernels
        # and 4 a step)
        assert alone.decode_kernels == 2 * 10 + 4
        launches = (step.decode_kernels - alone.decode_kernels) * 1e-6
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


# Clients in a closed loop (``serve(..., clients=)``): each sends its next request when its
# last one ends.


def test_a_lone_client_waits_for_nothing_and_no_other_prompt_stretches_its_tokens():
    got = closed_loop(clients=1, output=300, decode_s=0.012, sequences=1, sequence_s=0.001,
                      prefill_s=0.2)  # fmt: skip
    assert got.token_s == pytest.approx(0.012, rel=1e-12)
    assert got.first_token_s == pytest.approx(0.2, rel=1e-12)
    assert got.in_flight == 1


def test_a_closed_loops_request_waits_for_the_whole_iteration_under_way():
    # Prompts as short as a decode step (the weights' read): a request arrives as the
    # others' next iteration begins and waits for all of it, then for its own (a random
    # arrival waits for half of one, less where the replica is idle).
    d = 0.01
    got = closed_loop(clients=4, output=500, decode_s=d, sequences=4, sequence_s=0.0,
                      prefill_s=d)  # fmt: skip
    assert got.token_s == pytest.approx(d, rel=1e-12)
    waited = got.first_token_s - d
    assert d < waited < 1.01 * d  # and now and then another's prompt, queued before it


def test_a_closed_loop_is_the_fixed_point_of_its_requests_lives():
    # Two clients, no cost per sequence: the other's prompt comes once a cycle, and the
    # cycle is the request's own life. Found here by plain iteration from a long cycle.
    d, p, out = 0.01, 0.08, 64
    cycle = 1e3
    for _ in range(10_000):
        token = d / (1 - (p - d) / cycle)
        first = (p * p / cycle + (1 - p / cycle) * d) / (1 - p / cycle) + p
        cycle = first + (out - 1) * token
    got = closed_loop(clients=2, output=out, decode_s=d, sequences=2, sequence_s=0.0,
                      prefill_s=p)  # fmt: skip
    assert got.token_s == pytest.approx(token, rel=1e-9)
    assert got.first_token_s == pytest.approx(first, rel=1e-9)
    assert got.token_s > d and got.first_token_s > p + d


def test_more_clients_slow_every_token_and_the_first():
    def at(n):
        return closed_loop(clients=n, output=256, decode_s=0.01 + n * 2e-4, sequences=n,
                           sequence_s=2e-4, prefill_s=0.05)  # fmt: skip

    loads = [at(n) for n in (1, 2, 4, 16, 64)]
    for a, b in itertools.pairwise(loads):
        assert b.token_s > a.token_s and b.first_token_s > a.first_token_s


def test_clients_plan_their_sequences_with_each_cache_at_its_mean_length():
    result = serve("llama3-8b", 2, hardware="h100", prompt=512, output=128, clients=6,
                   compiler="cpu")  # fmt: skip
    assert result.clients == 6 and result.rate is None
    by_batch = serve("llama3-8b", 2, hardware="h100", prompt=512, output=128, batch=6,
                     compiler="cpu")  # fmt: skip
    per_token = cache_bytes_per_token(model_preset("llama3-8b").config(batch=1), "bfloat16")
    for p in result.plans:
        r = p.replicas
        assert p.batch == r * -(-6 // r)  # each replica its share of the clients, rounded up
        assert p.in_flight == min(6, p.batch)
        assert p.context == 512 + 64
        # the cache of the sequences at their mean length, split over the tensor parallelism
        t = p.tensor_parallel // p.kv_replicas
        assert p.cache_bytes_per_device == p.batch // r * (512 + 64) * per_token // t
        q = next((q for q in by_batch.plans if q.mesh == p.mesh), None)
        if q is not None:  # the others' prompts and iterations keep a request waiting
            assert p.first_token_s > q.first_token_s


def test_clients_the_cache_cannot_place_wait_a_whole_request_for_one():
    # A device of 20 GB holds the 8B model's 16 GB of weights and some sequences of 2k
    # tokens (128 KiB of cache a token): the clients beyond them wait for a place.
    knobs = dict(hardware="h100", hardware_overrides={"memory_bytes": 20e9}, prompt=2000,
                 output=192, compiler="cpu")  # fmt: skip
    few = serve("llama3-8b", 1, clients=2, **knobs).best
    many = serve("llama3-8b", 1, clients=64, **knobs).best
    places = many.batch
    assert 2 <= places < 64 and many.in_flight == places
    assert few.batch == 2
    # each client waits for (64 - places) / places requests' lives before its own begins
    held = closed_loop(clients=places, output=192, decode_s=many.decode_iteration_s,
                       sequences=places, sequence_s=0.0, prefill_s=many.prefill_s)  # fmt: skip
    life = held.first_token_s + 191 * held.token_s
    assert many.first_token_s > (64 - places) / places * life


@pytest.mark.parametrize("bad", [0, -2, 2.5, "4", True])
def test_clients_that_are_no_positive_whole_number_are_refused(bad):
    with pytest.raises(PlanError, match="closed loop") as err:
        serve("llama3-8b", 1, hardware="h100", prompt=64, output=8, clients=bad, compiler="cpu")
    assert err.value.params == ("clients",)


@pytest.mark.parametrize("other", [{"batch": 4}, {"rate": 2.0}])
def test_clients_beside_a_batch_or_a_rate_are_refused(other):
    with pytest.raises(PlanError, match="give one of them") as err:
        serve("llama3-8b", 1, prompt=64, output=8, clients=4, compiler="cpu", **other)
    assert err.value.params == ("clients",)


def test_plan_serve_under_clients_prints_them(capsys):
    argv = ["serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "467",
            "--output", "256", "--compiler", "cpu"]  # fmt: skip
    assert main([*argv, "--clients", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 clients in a closed loop" in out and "in flight" in out
    line = assert_usage_error([*argv, "--clients", "4", "--rate", "2"], "--clients", capsys)
    assert "give one of them" in line
