"""fp8 matmuls as a planner knob (``matmul_dtype="fp8"``): the layers' projections and MLP at
the hardware's fp8 rate, the attention core and the unembedding at 16 bits, the casts' bytes,
FSDP's weight gathers at one byte per element, the refusal where a device has no fp8, and
the command line's flag. Every expected number is derived here from the model's shape and the
presets' sourced constants."""

import json
from dataclasses import replace

import pytest

import shardscope
from helpers import assert_usage_error
from shardscope import PlanError, PlanRequest
from shardscope._src.base.comm import ALL_GATHER
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.links import collective_seconds, group_bandwidth
from shardscope._src.mesh import mesh_axes
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.estimates import Schedule, activation_bytes_per_layer
from shardscope._src.plan.notes import PlanNote
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.capabilities import CPU_COMPILER
from shardscope._src.targets.hardware import PRESETS, TIME_MODEL_SOURCES, hardware
from shardscope._src.train.candidates import estimate
from shardscope._src.train.timing import (
    HBM_PASSES,
    PER_MICROBATCH_FWD_BWD,
    classify,
    comm_items,
    compiled_comm_items,
    step_bound,
    step_time,
    step_work,
    substitutes_reduce_scatter,
)
from shardscope._src.train.types import Candidate

#: A Llama-3-8B-shaped model: d 4096, 32 query and 8 key/value heads of 128, SwiGLU ff 14336,
#: 2 layers, a 32k vocabulary; 8 sequences of 2048.
CONFIG = ModelConfig(
    d_model=4096, heads=32, kv_heads=8, ff=14336, layers=2, batch=8, seq=2048,
    vocab=32768, dtype="bfloat16", mlp="swiglu",
)  # fmt: skip
D, Q, KV, FF, V, S, L = 4096, 32 * 128, 8 * 128, 14336, 32768, 2048, 2


# -- the presets -------------------------------------------------------------------------------


def test_the_fp8_rates_are_the_datasheets_and_the_fractions_the_mamf_scaling():
    # Dense fp8 (E4M3) from the datasheets; none on the A100 and the TPUs.
    assert {n: h.fp8_peak_flops for n, h in PRESETS.items()} == {
        "a100": 0.0, "h100": 1979e12, "h200": 1979e12, "b200": 4500e12,
        "tpu-v5e": 0.0, "tpu-v5p": 0.0, "tpu-v6e": 0.0,
    }  # fmt: skip
    # 0.585 / 0.869 (the A100's bf16 calibration over its MAMF efficiency) times each GPU's
    # MAMF efficiency, bf16 and fp8, kept to two digits.
    assert PRESETS["a100"].matmul_fraction == 0.585
    for name, mamf in (("h100", 0.803), ("h200", 0.803), ("b200", 0.776)):
        assert PRESETS[name].matmul_fraction == round(0.585 / 0.869 * mamf, 2), name
    for name, mamf in (("h100", 0.709), ("h200", 0.734), ("b200", 0.763)):
        assert PRESETS[name].fp8_matmul_fraction == round(0.585 / 0.869 * mamf, 2), name
        assert PRESETS[name].has_fp8
    for name in ("a100", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        assert not PRESETS[name].has_fp8 and PRESETS[name].fp8_matmul_fraction == 0.0
    sources = " ".join(TIME_MODEL_SOURCES)
    assert "fp8_peak_flops" in sources and "fp8_matmul_fraction" in sources


def test_a_device_without_fp8_may_be_given_an_fp8_rate():
    hw = hardware("tpu-v6e", fp8_peak_flops=1e15, fp8_matmul_fraction=0.5)
    assert hw.has_fp8 and hw.fp8_peak_flops == 1e15
    assert not hardware("h100", fp8_peak_flops=0).has_fp8  # 0: no fp8
    with pytest.raises(ValueError, match="fp8_matmul_fraction=2 is a fraction of the peak"):
        hardware("h100", fp8_matmul_fraction=2)


# -- the step's compute ------------------------------------------------------------------------


def _placement(c: ModelConfig = CONFIG):
    return get_strategy("dp").place(c, abstract_mesh("data=2"))  # 4 sequences per device


@pytest.mark.parametrize("remat", ["none", "full"])
def test_the_fp8_step_runs_the_layer_matmuls_at_the_fp8_rate_and_the_rest_at_16_bits(remat):
    hw = hardware("h100")
    dp = _placement()
    work = step_work(dp, Schedule(remat=remat), CONFIG, 2, hw, flash_attention=True,
                     matmul_dtype="fp8")  # fmt: skip
    tokens = 4 * S
    weights = D * (Q + 2 * KV) + Q * D + D * 2 * FF + FF * D  # QKV, out, gate and up, down
    layer = 2 * tokens * weights  # fp8
    core = 2 * tokens * 2 * S * Q  # QK^T and PV, 16-bit
    logits = 2 * tokens * D * V  # the unembedding, 16-bit
    r16 = 989e12 * 0.54
    r8 = 1979e12 * 0.48
    # The casts: two 2-byte reads and a 1-byte write per element; forward the linears'
    # inputs (h, q, h, ff per token) and the weights, backward the gradients entering them
    # (q + 2kv, h, 2ff, h) and the weights again.
    cast_fwd = 5 * L * (tokens * (D + Q + D + FF) + weights)
    cast_bwd = 5 * L * (tokens * (Q + 2 * KV + D + 2 * FF + D) + weights)
    act = L * activation_bytes_per_layer(dp, flash_attention=True) + tokens * V * 2 * 2
    hbm = 3.35e12
    fwd = (L * core + logits) / r16 + L * layer / r8 + 2 * act / hbm + cast_fwd / hbm
    bwd = 2 * (L * core + logits) / r16 + 2 * L * layer / r8 + 2 * act / hbm + cast_bwd / hbm
    bwd += L * core / 2 / r16  # flash attention's backward computes QK^T again
    if remat == "full":  # the layers again: their matmuls in fp8, their casts again
        per_layer = activation_bytes_per_layer(dp, flash_attention=True)
        bwd += L * core / r16 + L * layer / r8 + 2 * L * per_layer / hbm + cast_fwd / hbm
    assert HBM_PASSES == 2
    t = step_time(hw, work, [])
    assert t.compute_s == pytest.approx(fwd + bwd, rel=1e-12)
    # MFU still counts the model's FLOPs against the 16-bit peak.
    assert t.mfu == pytest.approx(work.model_flops / (2 * 989e12 * t.step_s), rel=1e-12)


def test_offload_recomputes_the_fp8_layers_without_their_projections():
    hw = hardware("h100")
    dp = _placement()
    full, off = (
        step_work(dp, Schedule(remat=r), CONFIG, 2, hw, flash_attention=True, matmul_dtype="fp8")
        for r in ("full", "offload")
    )
    tokens = 4 * S
    qkv = D * (Q + 2 * KV)  # the projection weights; their input is h per token
    assert full.fp8_recompute_flops - off.fp8_recompute_flops == pytest.approx(
        L * 2 * tokens * qkv, rel=1e-12
    )
    assert full.cast_recompute_bytes - off.cast_recompute_bytes == pytest.approx(
        5 * L * (tokens * D + qkv), rel=1e-12
    )
    assert full.fp8_flops == off.fp8_flops and full.cast_bytes == off.cast_bytes


def test_the_bfloat16_default_is_the_16_bit_model_exactly():
    hw = hardware("h100")
    dp = _placement()
    default = step_work(dp, Schedule(), CONFIG, 2, hw, flash_attention=True)
    named = step_work(dp, Schedule(), CONFIG, 2, hw, flash_attention=True,
                      matmul_dtype="bfloat16")  # fmt: skip
    assert default == named
    assert (default.fp8_flops, default.fp8_recompute_flops) == (0.0, 0.0)
    assert (default.cast_bytes, default.cast_bwd_bytes, default.cast_recompute_bytes) == (0, 0, 0)
    # The step of the 16-bit model, in the order the time model has always added it.
    rate = hw.peak_flops * hw.matmul_fraction
    w = default
    fwd = w.fwd_flops / rate + 2 * w.act_bytes / hw.hbm_bandwidth
    bwd = 2 * w.fwd_flops / rate + 2 * w.act_bytes / hw.hbm_bandwidth
    bwd += w.recompute_flops / rate + 2 * w.recompute_act_bytes / hw.hbm_bandwidth
    assert step_time(hw, default, []).compute_s == fwd + bwd
    c = Candidate("fsdp", (("data", 64),), microbatches=2, remat="full")
    config = model_preset("7b").config(batch=128)
    assert estimate(c, config).time == estimate(c, config, matmul_dtype="bfloat16").time
    assert estimate(c, config, matmul_dtype="fp8").time.step_s < estimate(c, config).time.step_s


# -- FSDP's weight gathers ---------------------------------------------------------------------


def test_fsdp_gathers_weights_at_one_byte_per_element_and_nothing_else_changes():
    hw = hardware("h100")
    c = replace(CONFIG, batch=16)
    fsdp = get_strategy("fsdp").place(c, abstract_mesh("data=8"))
    bound = step_bound(fsdp, Schedule())
    sizes = mesh_axes(fsdp.mesh)
    bf16 = comm_items(hw, fsdp, bound.terms)
    fp8 = comm_items(hw, fsdp, bound.terms, fp8_gathers=True)
    # the weight gathers of the forward and the backward move half the bytes (one byte an
    # element, not two); every other collective is as it was
    gathered = [
        t
        for t in bound.terms
        if t.kind == ALL_GATHER and classify(t.kind, t.axes, fsdp) == PER_MICROBATCH_FWD_BWD
    ]
    assert gathered
    saved = sum(t.traffic_bytes / 2 / group_bandwidth(hw, sizes, t.axes) for t in gathered)
    total = sum(a.seconds for a in bf16) - sum(b.seconds for b in fp8)
    assert total == pytest.approx(saved, rel=1e-9)
    for a, b in zip(bf16, fp8, strict=True):
        if "gathered at use" in a.what:
            assert b.seconds < a.seconds
        else:
            assert b == a


# -- refusals and the command line ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["a100", "tpu-v5e", "tpu-v5p", "tpu-v6e"])
def test_fp8_on_hardware_without_it_is_one_plan_error(name):
    with pytest.raises(PlanError) as info:
        PlanRequest("tiny", 8, hardware=name, matmul_dtype="fp8")
    text = str(info.value)
    assert text.startswith(f"matmul_dtype='fp8': hardware '{name}' has no fp8 matmuls")
    assert "use matmul_dtype='bfloat16'" in text and "fp8_peak_flops=" in text
    assert info.value.params == ("matmul_dtype",)
    with pytest.raises(PlanError, match="has no fp8 matmuls"):
        estimate(Candidate("dp", (("data", 8),)), replace(CONFIG, batch=8), name,
                 matmul_dtype="fp8")  # fmt: skip


def test_an_unknown_matmul_dtype_names_the_choices():
    with pytest.raises(PlanError, match=r"^matmul_dtype 'int8': choose one of bfloat16, fp8$"):
        PlanRequest("tiny", 8, matmul_dtype="int8")


def test_the_command_line_refuses_fp8_on_an_a100_in_one_line(capsys):
    argv = ["plan", "--model", "tiny", "--devices", "8", "--hardware", "a100",
            "--matmul-dtype", "fp8"]  # fmt: skip
    line = assert_usage_error(argv, "matmul_dtype='fp8': hardware 'a100' has no fp8", capsys)
    assert line.rstrip().endswith("(flag --matmul-dtype)")


def test_the_flag_maps_onto_the_field():
    def request(*argv: str) -> PlanRequest:
        return command_config(build_parser().parse_args(["plan", *argv])).request()

    assert request("--devices", "8").matmul_dtype == "bfloat16"
    fp8 = request("--devices", "8", "--model", "tiny", "--matmul-dtype", "fp8")
    assert fp8 == PlanRequest("tiny", 8, matmul_dtype="fp8")
    assert PlanRequest().matmul_dtype == "bfloat16"


def test_the_flag_is_the_built_in_models_alone(capsys):
    argv = ["plan", "--program", "x.py:make_step", "--devices", "8", "--matmul-dtype", "fp8"]
    assert_usage_error(argv, "--matmul-dtype describes the built-in model", capsys)


# -- a plan ------------------------------------------------------------------------------------


def test_a_plan_says_its_matmul_dtype_and_prices_its_compiled_gathers_in_fp8():
    result = shardscope.plan(
        "tiny", 8, strategies=["fsdp"], mesh="data=8", workers=0, compiler="cpu",
        matmul_dtype="fp8", remat="none", microbatches=1,
    )  # fmt: skip
    data = json.loads(json.dumps(result.to_dict()))
    assert data["settings"]["matmul_dtype"] == "fp8"
    assert data["settings"]["time_model"]["fp8_peak_flops"] == 1979e12
    notes = [n for n in data["notes"] if n["kind"] == PlanNote.FP8_MATMULS]
    assert len(notes) == 1 and notes[0]["params"] == ["matmul_dtype"]
    assert "runs no fp8 matmul" in notes[0]["text"]
    # The compiled program's FSDP all-gathers at half their 16-bit bytes, the others as
    # compiled: the plan's step is priced so.
    p = result.best
    hw = result.hardware
    placement = p.pricing.placement
    sizes = mesh_axes(placement.mesh)
    moved = [c for c in p.collectives if c.traffic_bytes > 0]
    items = compiled_comm_items(hw, placement, moved, p.bound, fp8_gathers=True)
    plain = compiled_comm_items(hw, placement, moved, p.bound)
    halved = 0
    for c, a, b in zip(moved, items, plain, strict=True):
        axes = () if c.irregular else c.axes
        if c.kind == ALL_GATHER and classify(c.kind, axes, placement) == PER_MICROBATCH_FWD_BWD:
            halved += 1
            half = collective_seconds(
                hw, sizes, c.kind, axes, c.group_size, c.traffic_bytes / 2, c.count
            )
            assert a.seconds == pytest.approx(half, rel=1e-12)
        else:
            assert a == b
    assert halved > 0
    # The plan's step: those prices, with the reduce-scatters the GPU's compiler forms where
    # the CPU's all-reduces.
    scatter = substitutes_reduce_scatter(hw, CPU_COMPILER)
    priced = compiled_comm_items(
        hw, placement, p.collectives, p.bound, reduce_scatter_for_all_reduce=scatter,
        fp8_gathers=True,
    )  # fmt: skip
    assert p.time == p.pricing.step(hw, priced, p.matmul_flops_per_device)
    bf16 = shardscope.plan(
        "tiny", 8, strategies=["fsdp"], mesh="data=8", workers=0, compiler="cpu",
        remat="none", microbatches=1,
    )  # fmt: skip
    assert bf16.to_dict()["settings"]["matmul_dtype"] == "bfloat16"
    # the table's headline says it too
    from shardscope._src.render.plan import headline

    assert ", bfloat16, the layers' matmuls in fp8, on 8 x h100" in headline(result)
    assert ", bfloat16, on 8 x h100" in headline(bf16)
    # the device's memory as its datasheet gives it and as a runtime's GiB show it: 80e9 bytes
    # are 74.51 x 2**30
    assert "on 8 x h100, 80 GB (74.51 GiB) and 989 TFLOP/s each" in headline(bf16)
    assert not [n for n in bf16.notes if n.kind == PlanNote.FP8_MATMULS]
    assert "fp8_peak_flops" not in bf16.settings["time_model"]
    # Memory is unchanged by default: fp8 training keeps its 16-bit weights and 32-bit master
    # state, and (fp8_saved_inputs='high-precision') its linear layers' 16-bit inputs.
    assert p.memory == bf16.best.memory
