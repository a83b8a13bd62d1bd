"""The serving engine's host: its work an iteration and a sequence, after the device's step
or beside it, and its API server's time before a request's first token
(shardscope._src.targets.engines)."""

import json
import re

import pytest

from helpers import assert_usage_error
from shardscope._src.base.errors import PlanError
from shardscope._src.cli.main import main
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.request import ServeRequest
from shardscope._src.serve.estimate import estimate_plan
from shardscope._src.serve.search import serve
from shardscope._src.serve.types import Layout
from shardscope._src.targets.engines import ENGINES, EngineError
from shardscope._src.targets.hardware import h100_attention, hardware

#: vLLM V1's host as BLIS's coefficients put it: 126 us an iteration, 4 us a sequence of it,
#: 15.563 ms a request before it is queued
VLLM_STEP, VLLM_SEQUENCE, VLLM_REQUEST = 126e-6, 4e-6, 15.563e-3

#: An H100 that names its attention kernel's rates (FlashAttention-3's): every engine's
#: prefill then runs the same kernel, and two engines' times differ by their hosts alone
#: (on the preset, vLLM prefills with FlashAttention-3 and ``none`` with FlashAttention-2).
H100 = hardware("h100", **h100_attention("flash-attention-3"))


def _decode_plans(model, batch, *engines):
    """``model`` on one H100 at ``batch``, estimated on each of ``engines``."""
    config = model_preset(model).config(batch=1)
    return [
        estimate_plan(
            config,
            H100,
            Layout("tp", 1, 1),
            batch,
            64,
            80,
            "bfloat16",
            "bfloat16",
            engine=e,
        )  # fmt: skip
        for e in engines
    ]


def test_vllm_v0s_host_is_vidurs_profile_at_the_batches_it_measured():
    # Vidur's medians (ms), Llama 2 7B on an A100: schedule, sampler, input preparation and
    # the outputs' processing, at batch 8 and at batch 64
    v0 = ENGINES["vllm-v0"]
    assert v0.host_seconds(8) == pytest.approx((0.165 + 0.888 + 0.293 + 0.624) * 1e-3, rel=1e-3)
    assert v0.host_seconds(64) == pytest.approx((0.952 + 1.370 + 1.163 + 4.108) * 1e-3, rel=1e-3)


def test_a_host_that_follows_the_device_lengthens_each_step_by_its_work():
    none, vllm = _decode_plans("llama3-8b", 4, "none", "vllm")
    host = VLLM_STEP + 4 * VLLM_SEQUENCE
    assert vllm.decode_step_s - none.decode_step_s == pytest.approx(host, rel=1e-9)
    assert vllm.decode_host_s == pytest.approx(host, rel=1e-12)
    assert vllm.tokens_per_s_per_chip == pytest.approx(4 / vllm.decode_step_s, rel=1e-12)
    # the prefill is an iteration of one sequence
    prefill_host = VLLM_STEP + VLLM_SEQUENCE
    assert vllm.first_token_s - none.first_token_s == pytest.approx(prefill_host, rel=1e-9)


def test_a_host_that_overlaps_the_device_costs_only_what_the_step_does_not_cover():
    # Llama 3 8B's step (milliseconds) covers vLLM's host work: the step is the device's
    none, overlapped = _decode_plans("llama3-8b", 4, "none", "vllm-async")
    assert overlapped.decode_step_s == none.decode_step_s and overlapped.decode_host_s == 0
    # the tiny model's (a few dozen kernels of microseconds) does not cover 32 sequences'
    # host work: the step is the host's
    none, overlapped = _decode_plans("tiny", 32, "none", "vllm-async")
    host = VLLM_STEP + 32 * VLLM_SEQUENCE
    assert none.decode_step_s < host
    assert overlapped.decode_step_s == pytest.approx(host, rel=1e-12)


def test_a_loaded_server_pays_its_engine_each_iteration_and_its_api_server_each_request():
    kw = dict(hardware=H100, prompt=64, output=16, compiler="cpu")
    # a lone client: each token is a decode step of one sequence, and the first its prefill
    # iteration after the API server
    none, vllm = (serve("llama3-8b", 1, clients=1, engine=e, **kw).best for e in ("none", "vllm"))
    one = VLLM_STEP + VLLM_SEQUENCE
    assert vllm.decode_step_s - none.decode_step_s == pytest.approx(one, rel=1e-9)
    assert vllm.first_token_s - none.first_token_s == pytest.approx(one + VLLM_REQUEST, rel=1e-9)
    # at a rate, a prefill batched in flight is an iteration of the engine too
    none, vllm = (serve("llama3-8b", 1, rate=2, engine=e, **kw).best for e in ("none", "vllm"))
    assert vllm.prefill_s - none.prefill_s == pytest.approx(one, rel=1e-9)


def test_an_unknown_engine_is_refused_naming_it_and_the_choices():
    with pytest.raises(EngineError) as err:
        ServeRequest("llama3-8b", 1, prompt=64, output=8, engine="tgi")
    assert isinstance(err.value, PlanError)
    assert "engine='tgi'" in str(err.value) and "vllm, vllm-async, vllm-v0" in str(err.value)
    assert err.value.params == ("engine",)


def test_the_engine_is_set_from_the_command_line(tmp_path, capsys):
    argv = ["serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "64", "--output", "8",
            "--batch", "4", "--compiler", "cpu"]  # fmt: skip
    out = tmp_path / "serve.json"
    assert main([*argv, "--engine", "vllm-v0", "--json", str(out)]) == 0
    assert "on vllm-v0" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["engine"] == "vllm-v0" and {p["engine"] for p in data["plans"]} == {"vllm-v0"}
    line = assert_usage_error([*argv, "--engine", "tgi"], "--engine", capsys)
    assert "tgi" in line


def test_an_engine_that_chunks_its_prefills_plans_the_load_with_its_chunks():
    # 25 clients with prompts of 5,000 tokens on two H100s: TensorRT-LLM prefills each whole
    # unless told; vLLM's V1 engine chunks by 8,192 tokens on an 80 GB H100 (a prompt of
    # 5,000 in one iteration beside the 24 others' decodes), and 2,048 when told, three
    # iterations a prompt: each of its tokens stretched less by the others' prompts
    kw = dict(hardware="h100", weights="fp8", prompt=5000, output=500, clients=25,
              compiler="cpu")  # fmt: skip
    whole = serve("llama3-70b", 2, engine="tensorrt-llm", **kw)
    told = serve("llama3-70b", 2, engine="tensorrt-llm", chunked_prefill=2048, **kw)
    vllm = serve("llama3-70b", 2, engine="vllm", **kw)
    assert (whole.chunked_prefill, told.chunked_prefill, vllm.chunked_prefill) == (
        None, 2048, 8192)  # fmt: skip
    assert told.best.decode_step_s < whole.best.decode_step_s
    # a budget that holds every prompt whole changes nothing
    held = serve("llama3-70b", 2, engine="tensorrt-llm", chunked_prefill=8192, **kw)
    assert held.best.decode_step_s == whole.best.decode_step_s


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_chunked_prefill_is_a_whole_number_of_tokens(bad):
    with pytest.raises(PlanError, match=f"chunked_prefill={bad!r}"):
        ServeRequest("llama3-8b", 1, prompt=512, output=128, clients=2, chunked_prefill=bad)


#: What the CUDA runtime reports of an H100 80GB HBM3 (vLLM issue 27508's log).
H100_RUNTIME = 79.11 * 2**30


def test_each_engine_lets_a_device_hold_what_it_keeps_for_the_weights_and_the_cache():
    weights = 20 * 2**30
    h100 = hardware("h100")
    limit = {name: e.memory_limit(h100, 1, weights) for name, e in ENGINES.items()}
    # vLLM: gpu_memory_utilization 0.9 of the device, the weights within it
    assert limit["vllm"] == limit["vllm-async"] == limit["vllm-v0"] == 0.9 * H100_RUNTIME
    # TensorRT-LLM and LMDeploy: 0.9 and 0.8 of what the weights leave
    assert limit["tensorrt-llm"] == pytest.approx(weights + 0.9 * (H100_RUNTIME - weights))
    assert limit["lmdeploy"] == pytest.approx(weights + 0.8 * (H100_RUNTIME - weights))
    # SGLang at tensor parallelism 1 keeps back 512 MiB, 8,192 prefill tokens at 1.5 MiB,
    # 256 graph sequences at 2 MiB and 1/8 GiB: 13,440 MiB of the device's MiB
    mib = H100_RUNTIME / 2**20
    assert limit["sglang"] == round((mib - 13440) / mib, 3) * H100_RUNTIME
    # a device alone (and gpt-fast's static cache) hold all the runtime reports, as much as
    # any engine's share of it
    assert limit["none"] == limit["gpt-fast"] == H100_RUNTIME
    assert max(limit.values()) == H100_RUNTIME
    # a memory given is the whole the runtime reports too
    small = hardware("h100", memory_bytes=40e9)
    assert ENGINES["vllm"].memory_limit(small, 1, weights) == 0.9 * 40e9


def test_the_largest_batch_is_what_the_engines_share_holds():
    # Llama 3.1 8B on one H100, prompts of 512 and 128 tokens out: a sequence's cache is
    # 640 tokens of 32 layers' keys and values, 8 heads of 128, in bfloat16; its decode step
    # holds its float32 logits and a layer's scores (float32) and probabilities over its
    # context for each of 32 heads; a prefill a layer's activations over the prompt (its
    # MLP's residual, normed input, gate, up and their product: 2 x 4,096 + 3 x 14,336
    # bfloat16 elements a token) and the last token's float32 logits
    weights = 8_030_261_248 * 2
    cache = 640 * 32 * 2 * 8 * 128 * 2
    decode = 128_256 * 4 + 32 * 640 * (4 + 2)
    prefill = 512 * (2 * 4096 + 3 * 14336) * 2 + 128_256 * 4

    def most(limit):
        room = limit - weights
        return int(min(room // (cache + decode), (room - prefill) // cache))

    kw = dict(hardware="h100", prompt=512, output=128, compiler="cpu")
    for engine, share, limit in (
        ("vllm", None, 0.9 * H100_RUNTIME),
        ("vllm", 0.95, 0.95 * H100_RUNTIME),  # started with --gpu-memory-utilization 0.95
        ("none", None, H100_RUNTIME),
    ):
        result = serve("llama3-8b", 1, engine=engine, memory_share=share, **kw)
        largest = max(result.plans, key=lambda p: p.batch)
        assert largest.batch == most(limit)
        assert largest.memory_limit_bytes == int(limit)
        assert largest.memory_bytes_per_device <= limit
        assert result.memory_share == share
        assert type(result).from_dict(result.to_dict()).memory_share == share
    assert most(0.9 * H100_RUNTIME) < most(0.95 * H100_RUNTIME)


def test_a_long_prompt_is_prefilled_beside_the_cache_by_the_chunk_without_its_scores():
    # Llama 3 70B on four H100s under vLLM, prompts of 100,000 tokens: each layer's scores
    # over the prompt (16 heads a device, 100,000^2 of them, float32 and bfloat16: 960 GB)
    # are never held, as the fused kernel the prefill is timed by keeps them on chip. What
    # a prefill holds is a layer's activations over vLLM's 8,192-token chunk on an H100, its
    # MLP's widest (2 x 8,192 + 3 x 28,672 / 4 bfloat16 elements a token), and the last
    # token's float32 logits over a quarter of the vocabulary; prefilled whole, over the
    # prompt. Either way, the cache of a few sequences of 100,064 tokens fits beside them.
    kw = dict(hardware="h100", prompt=100_000, output=64, compiler="cpu")
    chunked = serve("llama3-70b", 4, **kw)
    whole = serve("llama3-70b", 4, chunked_prefill=0, **kw)
    for result, tokens in ((chunked, 8192), (whole, 100_000)):
        prefill = tokens * (2 * 8192 + 3 * 28672 // 4) * 2 + 128_256 // 4 * 4
        one = min(result.plans, key=lambda p: p.batch)
        # one sequence's decode temporaries: its logits and 16 heads' scores over its context
        assert one.batch == 1 and prefill > 128_256 // 4 * 4 + 16 * 100_064 * (4 + 2)
        assert one.temp_bytes_per_device == prefill
        assert all(p.fits for p in result.plans)
    assert max(p.batch for p in chunked.plans) >= max(p.batch for p in whole.plans) >= 2


def test_each_plan_names_the_engine_setting_that_holds_it():
    # SGLang's mem_fraction_static by tensor parallelism on an H100: the runtime's MiB less
    # 512 MiB, 8,192 prefill tokens at 1.5 MiB, 2 MiB for each graph sequence (256 below
    # tensor parallelism 4, 512 from it) and t / 8 GiB, at least 10 GiB
    mib = H100_RUNTIME / 2**20

    def sglang(t):
        reserve = max(512 + 8192 * 1.5 + (256 if t < 4 else 512) * 2 + t * 128, 10 * 1024)
        return round((mib - reserve) / mib, 3)

    kw = dict(hardware="h100", prompt=512, output=128, compiler="cpu")
    result = serve("llama3-8b", 4, engine="sglang", **kw)
    by_t = {p.mesh["model"]: p for p in result.plans}
    assert set(by_t) >= {1, 4}
    for t, p in by_t.items():
        assert p.engine_memory_share == sglang(t)
        assert p.memory_limit_bytes == int(sglang(t) * H100_RUNTIME)
    assert by_t[1].engine_memory_share > by_t[4].engine_memory_share
    # vLLM's gpu_memory_utilization, its own or the one given; none on the device alone
    assert {p.engine_memory_share for p in serve("llama3-8b", 1, **kw).plans} == {0.9}
    given = serve("llama3-8b", 1, memory_share=0.95, **kw)
    assert {p.engine_memory_share for p in given.plans} == {0.95}
    alone = serve("llama3-8b", 1, engine="none", **kw)
    assert {p.engine_memory_share for p in alone.plans} == {None}
    # and the JSON keeps it
    assert type(result).from_dict(result.to_dict()) == result


@pytest.mark.parametrize(
    "engine, share, words",
    [
        ("vllm", 1.5, "memory_share=1.5: vllm's gpu_memory_utilization, a fraction above 0"),
        ("vllm", 0, "memory_share=0: vllm's gpu_memory_utilization, a fraction above 0"),
        ("none", 0.9, "engine='none' keeps no share of the device's memory back"),
        ("gpt-fast", 0.9, "engine='gpt-fast' keeps no share"),
    ],
)
def test_a_memory_share_is_a_fraction_of_an_engine_that_keeps_one(engine, share, words):
    with pytest.raises(PlanError, match=words) as err:
        ServeRequest("llama3-8b", 1, prompt=512, output=128, engine=engine, memory_share=share)
    assert err.value.params == ("memory_share",)


def test_a_batch_beyond_the_engines_share_names_its_setting():
    # a batch that fits the device but not vLLM's 0.9 of it: the error names the engine's
    # option to raise
    kw = dict(hardware="h100", prompt=512, output=128, compiler="cpu")
    fits_alone = max(p.batch for p in serve("llama3-8b", 1, engine="none", **kw).plans)
    with pytest.raises(
        PlanError, match="a larger memory_share .start vllm with a larger gpu_memory_u"
    ):
        serve("llama3-8b", 1, batch=fits_alone, engine="vllm", **kw)


def test_a_share_too_small_for_the_weights_is_named_as_what_to_change():
    # Llama 3 70B's bfloat16 weights are 16.4 GiB a device of 8: 1% of an H100 holds none
    # of them, all of it holds sequences; the share is what to change, not the devices
    kw = dict(hardware="h100", prompt=2048, output=256, compiler="cpu")
    with pytest.raises(PlanError, match="give a larger memory_share") as err:
        serve("llama3-70b", 8, memory_share=0.01, **kw)
    assert err.value.params == ("memory_share",)
    assert "gpu_memory_utilization 0.01 of the 79.11 GiB" in str(err.value)
    # one device is too few whatever the share: the devices are what to change
    with pytest.raises(PlanError, match="give more devices") as err:
        serve("llama3-70b", 1, **kw)
    assert err.value.params == ("devices",)


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "1.5", "nan"])
def test_the_command_line_reads_a_memory_share_as_a_fraction(bad, capsys):
    argv = ["serve", "--model", "tiny", "--devices", "1", "--prompt", "8", "--output", "8"]
    line = assert_usage_error([*argv, f"--memory-share={bad}"], "--memory-share", capsys)
    assert ("e.g. 0.95" if bad == "abc" else "a fraction above 0 and at most 1") in line


def test_the_caption_says_what_the_engine_holds_of_a_device(capsys):
    # vLLM started at 0.95 of an H100's 79.11 GiB holds 75.15 GiB of it; on the device alone
    # all 79.11 GiB
    argv = ["serve", "--model", "llama3-8b", "--devices", "1", "--prompt", "512", "--output",
            "128", "--compiler", "cpu", "--verbose"]  # fmt: skip
    assert main([*argv, "--memory-share", "0.95"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"gpu_memory_utilization 0.95 of the device, {0.95 * 79.11:.2f} GiB." in out
    assert main([*argv, "--engine", "none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "all the memory a device's runtime reports, 79.11 GiB." in out


def test_verbose_shows_every_plan_that_fits(capsys):
    # Llama 3 70B on 8 H100s has more plans that fit than the dozen the screen shows
    argv = ["serve", "--model", "llama3-70b", "--devices", "8", "--prompt", "2048", "--output",
            "256", "--compiler", "cpu"]  # fmt: skip
    assert main(argv) == 0
    fit, shown = map(
        int, re.search(r"(\d+) plans fit; (\d+) shown", capsys.readouterr().out).groups()
    )
    assert shown < fit
    assert main([*argv, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert f"{fit} plans fit; {fit} shown" in out


def test_a_replica_runs_no_more_sequences_than_its_engine_does():
    # vLLM's max_num_seqs as it starts: 256 on an A100, whose 0.9 of 79.25 GiB would hold
    # hundreds more of Llama 3.1 8B's 640-token sequences; 1024 on an H100, beyond the 714
    # its memory holds
    kw = dict(prompt=512, output=128, compiler="cpu")
    a100 = serve("llama3-8b", 1, hardware="a100", **kw)
    assert max(p.batch for p in a100.plans) == 256
    assert max(p.batch for p in serve("llama3-8b", 1, hardware="h100", **kw).plans) == 714
    # without a cap (SGLang's is not read) the A100's memory decides
    assert (
        max(p.batch for p in serve("llama3-8b", 1, hardware="a100", engine="sglang", **kw).plans)
        > 256
    )
    with pytest.raises(PlanError, match="at most 256 sequences a replica at once") as err:
        serve("llama3-8b", 1, hardware="a100", batch=300, **kw)
    assert err.value.params == ("batch",)
    # 300 clients in a closed loop: 256 run, the others wait for a place
    closed = serve("llama3-8b", 1, hardware="a100", clients=300, **kw)
    assert {p.batch for p in closed.plans} == {256}
