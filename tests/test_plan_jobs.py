"""Plans for real jobs: published model shapes, config.json, grouped-query attention under
tensor parallelism, recomputation, micro-batches, ZeRO, pipeline stages, memory-efficient
attention, and the time model against published step times."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from helpers import assert_usage_error
from shardscope._src.base.errors import ModelConfigError, ShardscopeError, StrategyError
from shardscope._src.bounds import transformer
from shardscope._src.bounds.terms import Bound, Term, TermRole
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.compute import matmul_seconds
from shardscope._src.cost.links import group_bandwidth, held_share
from shardscope._src.model import config as model_config
from shardscope._src.model.config import ModelConfig, param_shapes
from shardscope._src.model.presets import MODEL_PRESETS, load_hf_config, model_preset
from shardscope._src.model.transformer import init_batch, init_params, loss
from shardscope._src.plan import notes as plan_notes
from shardscope._src.plan.collectives import PlanCollective, bound_time, collective_time
from shardscope._src.plan.estimates import (
    Schedule,
    estimate_memory,
    stored_activation_bytes_per_layer,
)
from shardscope._src.plan.notes import PlanNote
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.capabilities import CPU_COMPILER, GPU_COMPILER
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, screen_all
from shardscope._src.train.timing import (
    CRITICAL,
    PER_STEP_BWD,
    CommItem,
    StepWork,
    compiled_step,
    step_time,
)
from shardscope._src.train.types import Candidate
from shardscope._src.train.validate import all_reduce_formula, jit_formula

SMALL = ModelConfig(
    d_model=32, heads=4, kv_heads=2, ff=48, layers=2, batch=8, seq=16, vocab=32, mlp="swiglu"
)


def _run(fn, *args):
    """Compiles ``fn`` for ``args`` the fast way the planner does, and runs it."""
    import jax

    from shardscope._src.plan.compile import COMPILE_OPTIONS

    return jax.jit(fn).lower(*args).compile(compiler_options=dict(COMPILE_OPTIONS))(*args)


# -- shapes and presets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", [n for n, p in MODEL_PRESETS.items() if p.published_params is not None]
)
def test_presets_hold_the_published_parameter_counts(name):
    preset = MODEL_PRESETS[name]
    if preset.published_extra is not None:  # the published total counts more than the decoder
        assert preset.param_count() < preset.published_params
        return
    assert abs(preset.param_count() / preset.published_params - 1) <= 0.005


def test_llama_presets_count_every_weight_of_the_published_checkpoints():
    # The exact counts of the published checkpoints (their safetensors indexes).
    assert model_preset("llama2-7b").param_count() == 6_738_415_616
    assert model_preset("llama2-70b").param_count() == 68_976_648_192
    assert model_preset("llama3-8b").param_count() == 8_030_261_248
    assert model_preset("70b") is model_preset("llama2-70b")


def test_grouped_query_attention_and_swiglu_shapes():
    c = model_preset("llama2-70b").config(batch=1)
    assert (c.kv_heads, c.q_per_kv, c.head_dim) == (8, 8, 128)
    from shardscope._src.model.config import param_shapes

    shapes = param_shapes(c)
    assert shapes["wqkv"] == (80, 8192, 8, 10, 128)  # 8 query heads, a key and a value per group
    assert shapes["w_gate_up"] == (80, 8192, 2, 28672)
    assert "w_up" not in shapes and "unembed" in shapes
    gpt = param_shapes(model_preset("gpt3-175b").config(batch=1))
    assert "unembed" not in gpt and gpt["w_up"] == (96, 12288, 49152)


def test_head_dim_may_differ_from_d_model_over_heads():
    c = ModelConfig(d_model=48, heads=4, head_dim=16, ff=64)
    assert c.head_dim == 16
    from shardscope._src.model.config import param_shapes

    assert param_shapes(c)["wo"] == (2, 4, 16, 48)


def test_inconsistent_shapes_are_one_clear_error():
    with pytest.raises(ModelConfigError, match="heads=8 is not divisible by kv_heads=3"):
        ModelConfig(d_model=64, heads=8, kv_heads=3)
    with pytest.raises(ModelConfigError, match="mlp='relu'"):
        ModelConfig(mlp="relu")


LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


def test_a_config_json_gives_the_model_it_describes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    preset = load_hf_config(path)
    assert preset.param_count() == model_preset("llama3-8b").param_count()
    assert preset.seq == 8192  # 131072 allowed; longer contexts are a --seq choice
    assert model_preset(str(path)).kv_heads == 8


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_size": None}, "lacks hidden_size"),
        # another architecture's config is named by its model_type
        ({"model_type": "mamba", "num_attention_heads": None}, "(model_type 'mamba') lacks"),
        ({"num_key_value_heads": 5}, "not divisible by kv_heads=5"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"vocab_size": "big"}, "vocab_size='big' must be a positive integer"),
    ],
)
def test_a_bad_config_json_is_one_clear_error(tmp_path, change, words):
    data = dict(LLAMA3_8B)
    for k, v in change.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelConfigError, match=re.escape(words)):
        load_hf_config(path)


def test_plan_command_names_a_bad_config_json(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert_usage_error(["plan", "--model", str(path), "--devices", "8"], "as JSON", capsys)
    assert_usage_error(["plan", "--model", "llama9", "--devices", "8"], "unknown model", capsys)


def test_tensor_parallelism_refuses_to_split_key_value_heads():
    c = model_preset("llama2-70b").config(batch=16)
    get_strategy("tp").place(c, abstract_mesh("model=8"))
    with pytest.raises(StrategyError, match="refuses to replicate key/value heads"):
        get_strategy("tp").place(c, abstract_mesh("model=16"))


# -- the compiled program computes the same thing every way -----------------------------------


def _loss_and_grads(config):
    import jax

    params, batch = init_params(config), init_batch(config)
    return _run(lambda p, b: jax.value_and_grad(loss)(p, b, config), params, batch)


def _close(a, b, tol=1e-5):
    import jax

    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def test_blocked_attention_and_recomputation_compute_the_same_loss_and_gradients():
    base = replace(SMALL, attention="dense")
    want = _loss_and_grads(base)
    cases = (
        ("dense", "selective"),
        ("dense", "matmuls"),
        ("dense", "offload"),
        ("blocked", "none"),
        ("blocked", "full"),
    )
    for attention, remat in cases:
        got = _loss_and_grads(replace(base, attention=attention, attention_block=4, remat=remat))
        _close(got, want)


def test_tied_embeddings_unembed_with_the_embedding():
    tied = replace(SMALL, tie_embeddings=True)
    assert tied.param_count() == SMALL.param_count() - 32 * 32
    value, grads = _loss_and_grads(tied)
    assert np.isfinite(float(value)) and "unembed" not in grads


@pytest.mark.parametrize(
    "strategy, mesh",
    [
        ("zero2", "data=4"),
        ("fsdp_tp", "data=2,model=2"),
        ("dp", "data=4"),
        ("zero1", "data=4"),
        ("dp_tp", "data=2,model=2"),
        ("dp_sp", "data=2,model=2"),
    ],
)
def test_micro_batches_accumulate_the_gradients_of_the_whole_batch(strategy, mesh):
    import jax

    from shardscope._src.mesh import make_mesh
    from shardscope._src.sharding.programs import UPDATE_STEP, build_reference_program

    config = replace(SMALL, attention="blocked", attention_block=8, remat="full")
    bound = get_strategy(strategy).place(config, make_mesh(mesh, devices=jax.devices()[:4]))
    whole = build_reference_program(bound, mode="train")
    split = build_reference_program(bound, mode="train", microbatches=2)
    args = whole.example_args()
    (l1, out1), (l2, out2) = _run(whole.fn, *args), _run(split.fn, *args)
    np.testing.assert_allclose(float(l1), float(l2), rtol=1e-5)
    _close(out1, out2)
    if bound.strategy.updates_shards:  # ZeRO: the new parameters, p - step * grad
        ref = build_reference_program(get_strategy("dp").place(config, bound.mesh), mode="train")
        _, grads = _run(ref.fn, *args)
        want = jax.tree.map(lambda p, g: p - UPDATE_STEP * g, args[0], grads)
        _close(out1, want)


@pytest.mark.parametrize("strategy", ["dp", "zero1"])
def test_replicated_gradients_are_reduced_once_however_many_micro_batches(strategy):
    from shardscope import audit
    from shardscope._src.sharding.programs import build_reference_program

    config = replace(SMALL, batch=32, attention="blocked", attention_block=8, remat="full")

    def data_all_reduce(m):
        program = build_reference_program(strategy, config, "data=8", mode="train", microbatches=m)
        sent = [c for c in audit(program.lower()).collectives if c.kind == "all-reduce"]
        return sum(c.count * c.traffic_bytes for c in sent)

    # Four micro-batches send one step's gradients and float32 loss (each shard adds up its
    # own over the micro-batches), not four steps' of either.
    assert data_all_reduce(4) == data_all_reduce(1)
    # and the step's price reduces them once too (ZeRO-1's as a reduce-scatter)
    assert _priced_gradient_bytes(strategy, config, 4) == _priced_gradient_bytes(
        strategy, config, 1
    )


def _priced_gradient_bytes(strategy, config, microbatches):
    """The bytes of gradient reductions a train step on ``data=8`` is priced at."""
    from shardscope._src.train.timing import Schedule, step_bound

    placement = get_strategy(strategy).place(config, "data=8")
    schedule = Schedule(microbatches, "full", 1, False, 1)
    roles = (TermRole.GRADIENT_SUM, TermRole.GRADIENT_SCATTER)
    return sum(
        t.count * t.payload_bytes for t in step_bound(placement, schedule).terms if t.role in roles
    )


def test_gradients_stored_sharded_are_priced_reduced_every_micro_batch():
    # ZeRO-2 keeps only its shard of each gradient: each micro-batch's is reduce-scattered
    config = replace(SMALL, batch=32, attention="blocked", attention_block=8, remat="full")
    assert _priced_gradient_bytes("zero2", config, 4) == 4 * _priced_gradient_bytes(
        "zero2", config, 1
    )


def test_micro_batches_must_divide_the_sequences_of_a_data_shard():
    from shardscope._src.sharding.programs import build_reference_program

    bound = get_strategy("dp").place(SMALL, abstract_mesh("data=4"))
    with pytest.raises(StrategyError, match="choose microbatches from 1, 2"):
        build_reference_program(bound, mode="train", microbatches=4)


# -- memory ------------------------------------------------------------------------------------


def test_zero_model_state_is_exact():
    # Every weight divides by 4, so ZeRO's per-device bytes are exact integers.
    c = replace(SMALL, dtype="bfloat16")
    P = c.param_count()
    mesh = abstract_mesh("data=4")
    mem = {
        s: estimate_memory(get_strategy(s).place(c, mesh)).model_state
        for s in ("dp", "zero1", "zero2", "fsdp")
    }
    assert mem["dp"] == 16 * P
    assert mem["zero1"] == 4 * P + 12 * P // 4
    assert mem["zero2"] == 2 * P + 14 * P // 4
    assert mem["fsdp"] == 16 * P // 4


def test_recomputation_micro_batches_and_stages_set_the_activations():
    c = replace(model_preset("7b").config(batch=8, seq=2048), vocab=None)
    bound = get_strategy("dp").place(c, abstract_mesh("data=2"))  # 4 sequences per device
    full = stored_activation_bytes_per_layer(bound, Schedule(remat="full"))
    assert full == 2 * 2048 * 4 * 4096  # the layer input, 2sbh (Korthikanti Table 2)
    assert stored_activation_bytes_per_layer(bound, Schedule(2, "full")) == full // 2
    one = estimate_memory(bound, schedule=Schedule(4, "full", 1)).activations
    piped = estimate_memory(bound, schedule=Schedule(4, "full", 2)).activations
    working = estimate_memory(bound, schedule=Schedule(4, "none", 1)).activations // c.layers
    # 1F1B's first stage holds min(stages, micro-batches) micro-batches at once.
    assert piped - one == c.layers * (full // 4)
    assert working > 0


def test_keeping_the_matmul_outputs_stores_them_and_the_layer_input():
    # A Llama-3-8B layer (d 4096, 32 heads, 8 key/value heads of 128, SwiGLU ff 14336).
    c = ModelConfig(
        d_model=4096, heads=32, kv_heads=8, ff=14336, layers=2, batch=8, seq=2048,
        vocab=None, dtype="bfloat16", mlp="swiglu",
    )  # fmt: skip
    # Per token: the input, the out-projection's and the down-projection's outputs (4096
    # each), the query, key and value (4096 + 2 x 1024) and SwiGLU's gate and up (2 x 14336).
    per_token = 3 * 4096 + 4096 + 2 * 1024 + 2 * 14336
    dp = get_strategy("dp").place(c, abstract_mesh("data=2"))  # 4 sequences per device
    kept = stored_activation_bytes_per_layer(dp, Schedule(remat="matmuls"))
    assert kept == 2048 * 4 * per_token * 2
    # Tensor parallel over 4: the projections' and the MLP's outputs split, the summed
    # outputs and the input whole; all 8 sequences on each device.
    tp = get_strategy("tp").place(c, abstract_mesh("model=4"))
    split = stored_activation_bytes_per_layer(tp, Schedule(remat="matmuls"))
    assert split == 2048 * 8 * (3 * 4096 + (4096 + 2 * 1024 + 2 * 14336) // 4) * 2
    # Between full recomputation (the input alone) and none.
    full = stored_activation_bytes_per_layer(dp, Schedule(remat="full"))
    none = stored_activation_bytes_per_layer(dp, Schedule(remat="none"))
    assert full < kept < none


# -- the time model ----------------------------------------------------------------------------


#: One device's step of four micro-batches, compute only (``_work`` changes fields).
WORK = StepWork(
    microbatches=4,
    stages=1,
    fwd_flops=1e15,
    recompute_flops=0.0,
    act_bytes=0.0,
    recompute_act_bytes=0.0,
    p2p_bytes=0.0,
    p2p_bandwidth=1e10,
    optimizer_params=0,
    model_flops=3e15 * 4,
    devices=1,
)


def _work(**kw):
    return replace(WORK, **kw)


def test_the_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    hw = hardware("h100")
    flat = step_time(hw, _work(), [])
    piped = step_time(hw, _work(stages=4, p2p_bandwidth=1e30), [])
    assert piped.bubble_fraction == pytest.approx(3 / 7)
    assert piped.step_s == pytest.approx(flat.step_s * 7 / 4, rel=1e-4)


def test_tensor_parallel_collectives_are_exposed_on_gpus_and_hidden_on_tpus():
    tp = [CommItem("tp", CRITICAL, 0.5)]
    gpu = hardware("h100")
    assert step_time(gpu, _work(), tp).step_s == pytest.approx(
        step_time(gpu, _work(), []).step_s + 0.5
    )
    tpu = hardware("tpu-v5p")
    assert step_time(tpu, _work(), tp).step_s == pytest.approx(step_time(tpu, _work(), []).step_s)


def test_a_gpu_set_to_overlap_tensor_parallel_collectives_pays_the_multiprocessors_they_hold():
    # Transformer Engine's userbuffers (tp_overlap=True): 0.5 s of tensor-parallel collectives
    # over four micro-batches, each micro-batch's share beside its forward and backward, which
    # go at the rest of their rate while the collectives hold 32 of the 132 multiprocessors
    tp = [CommItem("tp", CRITICAL, 0.5, 32 / 132)]
    gpu = hardware("h100", tp_overlap=True)
    base = step_time(gpu, _work(), []).step_s
    assert step_time(gpu, _work(), tp).step_s == pytest.approx(base + 0.5 * 32 / 132, rel=1e-12)
    # twice the compute: they outlast it even slowed (base + 2 base x 32/132), so the step is
    # theirs, a micro-batch's share at a time
    slow = [CommItem("tp", CRITICAL, 2 * base, 32 / 132)]
    assert step_time(gpu, _work(), slow).step_s == pytest.approx(2 * base, rel=1e-12)
    # the preset keeps them on the critical path, whole
    plain = hardware("h100")
    assert step_time(plain, _work(), tp).step_s == pytest.approx(base + 0.5, rel=1e-12)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_tp_overlap_is_true_or_false(value):
    with pytest.raises(ShardscopeError, match=f"tp_overlap={value!r}.*True or False"):
        hardware("h100", tp_overlap=value)


def test_a_gradient_reduction_hides_behind_the_last_backward_up_to_its_length():
    hw = hardware("h100")
    base = step_time(hw, _work(), []).step_s
    backward = 2 * 1e15 / (hw.peak_flops * hw.matmul_fraction)
    short = step_time(hw, _work(), [CommItem("dp", PER_STEP_BWD, backward / 2)])
    long = step_time(hw, _work(), [CommItem("dp", PER_STEP_BWD, backward + 1.0)])
    assert short.step_s == pytest.approx(base)
    assert long.step_s == pytest.approx(base + 1.0)


def test_a_hidden_collective_slows_the_compute_beside_it_by_the_multiprocessors_it_holds():
    # Half a backward of gradient reduction over two nodes: hidden, but on an H100 its
    # channels hold 16 of the 132 multiprocessors while it runs, and the backward beside it
    # goes at the rest of its rate. On a TPU the same costs its compute alone.
    across = {"data": 16}
    for name, share in (("h100", 16 / 132), ("tpu-v5p", 0.0)):
        hw = hardware(name)
        backward = 2 * 1e15 / (hw.peak_flops * hw.matmul_fraction)
        held = held_share(hw, across, ("data",))
        assert held == share
        base = step_time(hw, _work(), []).step_s
        got = step_time(hw, _work(), [CommItem("dp", PER_STEP_BWD, backward / 2, held)])
        assert got.data_exposed_s == 0.0
        assert got.contention_s == pytest.approx(backward / 2 * share, rel=1e-12, abs=0)
        assert got.step_s == pytest.approx(base + backward / 2 * share, rel=1e-12)
        # one that outlasts the slowed backward is exposed for what the backward leaves
        long = step_time(hw, _work(), [CommItem("dp", PER_STEP_BWD, backward + 1.0, held)])
        assert long.step_s == pytest.approx(base + 1.0, rel=1e-12)
        assert long.contention_s == pytest.approx(0.0, abs=1e-12)


def test_a_collective_holds_two_multiprocessors_a_link_inside_a_node_and_a_card_across():
    h100 = hardware("h100")
    assert held_share(h100, {"data": 8}, ("data",)) == 32 / 132
    assert held_share(h100, {"data": 2, "model": 8}, ("model",)) == 32 / 132
    assert held_share(h100, {"data": 2, "model": 8}, ("data",)) == 16 / 132


def test_the_reductions_of_one_step_share_the_last_backward():
    # Two gradient all-reductions of 0.6 backward each: each would hide alone, together
    # they take 1.2 backwards on the same links, and 0.2 of one is exposed.
    hw = hardware("h100")
    base = step_time(hw, _work(), []).step_s
    backward = 2 * 1e15 / (hw.peak_flops * hw.matmul_fraction)
    two = [CommItem("a", PER_STEP_BWD, 0.6 * backward), CommItem("b", PER_STEP_BWD, 0.6 * backward)]
    got = step_time(hw, _work(), two)
    assert got.data_exposed_s == pytest.approx(0.2 * backward, rel=1e-12)
    assert got.step_s == pytest.approx(base + 0.2 * backward, rel=1e-12)


def test_the_words_of_a_bound_change_no_estimate(monkeypatch):
    # The schedule reads each term's role; its words are for people. Reworded terms must give
    # the same step times, memory and bound for every candidate, micro-batched ones included.
    config = replace(SMALL, batch=32)

    def numbers():
        ranked, skipped, _ = screen_all(config, 8, hardware("h100"), stages=1)
        return [
            (
                s.candidate.label,
                s.time.to_dict(),
                s.memory.total,
                s.bound.traffic_bytes,
                # the formulas a compiled plan is validated against
                jit_formula(s.bound, s.candidate.microbatches).traffic_bytes,
                all_reduce_formula(s.bound).traffic_bytes,
            )
            for s in ranked
        ], [(s.strategy, s.mesh, s.reason) for s in skipped]

    before = numbers()
    assert any(label.endswith("micro-batches)") for label, *_ in before[0])
    original = transformer._term
    monkeypatch.setattr(
        transformer,
        "_term",
        lambda kind, axes, n, payload, count, what, *rest, **kw: original(
            kind, axes, n, payload, count, "reworded", *rest, **kw
        ),
    )
    placement = get_strategy("zero1").place(config, abstract_mesh("data=8"))
    assert {t.what for t in transformer.transformer_bound(placement, "train").terms} == {"reworded"}
    assert numbers() == before


def test_every_plan_note_has_words():
    assert set(plan_notes._TEXTS) == set(plan_notes._VALUES) == set(PlanNote)
    note = PlanNote.PIPELINE_STAGE.describe({"stages": 4, "layers": 8, "devices": 16})
    assert note.startswith("one of 4 pipeline stages compiled (8 layers, on 16 devices")


def test_a_group_spanning_nodes_shares_their_network_cards():
    hw = hardware("a100")
    sizes = {"data": 32, "model": 8}  # 256 GPUs, 32 nodes
    inside = group_bandwidth(hw, sizes, ("model",))
    one_card = group_bandwidth(hw, sizes, ("data",))  # one member per node
    sizes = {"data": 64, "model": 4}
    two_cards = group_bandwidth(hw, sizes, ("data",))  # two members per node
    assert inside == pytest.approx(300e9 * 0.8)
    assert one_card == pytest.approx(25e9 * 0.8)
    assert two_cards == pytest.approx(2 * 25e9 * 0.8)


def test_a_compiled_collective_and_a_bound_term_are_priced_alike():
    # An all-gather over data=32 of a 32 x 8 mesh of A100s: one member per node, so one
    # 25 GB/s card at the achieved 80%; 31 ring steps of 5 us. The compiled collective and
    # the bound's term of the same traffic cost the same (one pricing for both).
    hw = hardware("a100")
    sizes = {"data": 32, "model": 8}
    traffic = 31 * 2**20  # 31/32 of a 32 MiB gathered buffer
    expected = 31 * 5e-6 + traffic / (25e9 * 0.8)
    compiled = PlanCollective(
        "all-gather", ("data",), 32, 1, True, False, "bfloat16", 2**25, 2**25, traffic,
        traffic, None, None,
    )  # fmt: skip
    assert collective_time(hw, sizes, compiled) == pytest.approx(expected, rel=1e-12)
    term = Term("all-gather", ("data",), 32, 2**25, 1, "weights", role=TermRole.WEIGHT_GATHER)
    assert term.traffic_bytes == traffic
    assert bound_time(hw, sizes, Bound("fsdp", (term,))) == pytest.approx(expected, rel=1e-12)


# Narayanan et al. 2021, Table 1, rows without pipelining (CALIBRATION.md): heads, hidden,
# layers, tensor-parallel size, GPUs, global batch, measured TFLOP/s per GPU.
CALIBRATION_ROWS = [
    (24, 2304, 24, 1, 32, 512, 137),
    (32, 3072, 30, 2, 64, 512, 138),
    (32, 4096, 36, 4, 128, 512, 142),
    (48, 6144, 40, 8, 256, 1024, 135),
]


@pytest.mark.parametrize("row", CALIBRATION_ROWS, ids=lambda r: f"h{r[1]}-t{r[3]}")
def test_published_step_times_within_25_percent(row):
    a, h, layers, t, gpus, batch, tflops = row
    s, v = 2048, 51200
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    measured = flops / (gpus * tflops * 1e12)
    config = ModelConfig(
        d_model=h,
        heads=a,
        ff=4 * h,
        layers=layers,
        batch=batch,
        seq=s,
        vocab=v,
        dtype="bfloat16",
        mlp="gelu",
        tie_embeddings=True,
    )
    d = gpus // t
    mesh = (("data", d), ("model", t)) if t > 1 else (("data", d),)
    strategy = "dp_tp" if t > 1 else "dp"
    # Micro-batches are not in the table: the planner's fastest that fits.
    options = [
        estimate(Candidate(strategy, mesh, m, "full"), config, "a100", flash_attention=False)
        for m in range(1, batch // d + 1)
        if (batch // d) % m == 0
    ]
    best = min((o for o in options if o.fits), key=lambda o: o.time.step_s)
    assert best.time.step_s == pytest.approx(measured, rel=0.25)


# -- jobs people run ---------------------------------------------------------------------------


def test_llama2_70b_on_64_h100s_and_gpt3_on_768_a100s_have_plans_that_fit():
    ranked, _, _ = screen_all(
        model_preset("llama2-70b").config(batch=64, seq=4096), 64, hardware("h100")
    )
    assert ranked[0].fits
    ranked, _, _ = screen_all(
        model_preset("gpt3-175b").config(batch=1536, seq=2048), 768, hardware("a100")
    )
    assert ranked[0].fits


def test_a_model_that_fits_nowhere_says_what_comes_closest():
    result = __import__("shardscope._src.train.sweep", fromlist=["plan"]).plan(
        "llama3-405b",
        8,
        hardware="h100",
        batch=8,
        seq=4096,
        workers=0,
        compile_top=0,
        strategies=["fsdp"],
        compiler="cpu",
    )
    assert result.best is None and result.closest is not None
    assert result.fit_note.kind == "no-fit"
    assert "over" in result.fit_note.text and "closest" in result.fit_note.text


def _as_compiled(term):
    """A bound's term as the collective a compiler would emit for it."""
    return PlanCollective(
        term.kind, term.axes, term.group_size, term.count, True, False, "bfloat16",
        term.payload_bytes, term.payload_bytes, term.traffic_bytes, term.traffic_bytes,
        term.what, None,
    )  # fmt: skip


def _issued(terms):
    """The bound's terms as FSDP issues them, in their order: the weights of a layer (the
    model's LAYER_PARAMS, named first in each term's words) gathered, and their gradients
    reduce-scattered, in one collective a pass over each group, and so the model's other
    weights (the embedding, the final norm, the unembedding: FSDP's root unit); the rest one
    a term."""
    issued = {}
    for i, t in enumerate(terms):
        name = t.what.split(" ")[0]
        if t.kind in ("all-gather", "reduce-scatter") and name in param_shapes(PRESET_7B):
            key = (t.kind, t.axes, "again" in t.what, name in model_config.LAYER_PARAMS)
            if key in issued:
                first = issued[key]
                t = replace(first, payload_bytes=first.payload_bytes + t.payload_bytes)
        else:
            key = i
        issued[key] = t
    return [_as_compiled(t) for t in issued.values()]


PRESET_7B = model_preset("7b").config(batch=64, seq=256)


def test_a_compiled_step_is_priced_as_its_formula_and_costs_more_with_more_traffic():
    # One short sequence per A100 across 8 nodes: FSDP's traffic is not all hidden.
    s = estimate(Candidate("fsdp", (("data", 64),), 1, "none"), PRESET_7B, "a100")
    hw = hardware("a100")
    assert s.time.data_exposed_s > 0
    as_formula = _issued(s.bound.terms)
    # Collectives that are the formula's terms, a layer's weights gathered together, give
    # the estimate's step exactly.
    same = compiled_step(hw, s.pricing, as_formula, s.bound, GPU_COMPILER)
    assert same.step_s == pytest.approx(s.time.step_s, rel=1e-12)
    # Gathered one weight at a time, they pay the latency of each: a slower step.
    one_by_one = [_as_compiled(t) for t in s.bound.terms]
    apart = compiled_step(hw, s.pricing, one_by_one, s.bound, GPU_COMPILER)
    assert apart.data_comm_s > same.data_comm_s
    # A program that gathers the weights twice over (the compiler re-gathered them for the
    # backward) pays for it: a slower step.
    doubled = [
        replace(c, count=2 * c.count, traffic_bytes=2 * c.traffic_bytes)
        if c.kind == "all-gather"
        else c
        for c in as_formula
    ]
    more = compiled_step(hw, s.pricing, doubled, s.bound, GPU_COMPILER)
    assert more.step_s > same.step_s and more.data_comm_s > same.data_comm_s


def test_the_cpu_compilers_all_reduce_is_priced_as_the_reduce_scatter_the_gpu_forms():
    # One short sequence per A100 across 8 nodes: FSDP's traffic is not all hidden.
    s = estimate(Candidate("fsdp", (("data", 64),), 1, "none"), PRESET_7B, "a100")
    hw = hardware("a100")
    assert s.time.data_exposed_s > 0
    # The CPU compiler's program: each gradient reduce-scatter as an all-reduce of the
    # whole gradient (twice the bytes), then a slice.
    cpu = [
        replace(
            c,
            kind="all-reduce",
            traffic_bytes=2 * c.traffic_bytes,
            cpu_traffic_bytes=2 * c.traffic_bytes,
        )
        if c.kind == "reduce-scatter"
        else c
        for c in _issued(s.bound.terms)
    ]
    priced = compiled_step(hw, s.pricing, cpu, s.bound, CPU_COMPILER)
    assert priced.step_s == pytest.approx(s.time.step_s, rel=1e-9)
    # As the GPU's own program it would be an all-reduce, and cost more.
    as_is = compiled_step(hw, s.pricing, cpu, s.bound, GPU_COMPILER)
    assert as_is.step_s > priced.step_s


@pytest.mark.parametrize("hw", ["h100", "tpu-v5p"])
def test_the_note_on_the_missing_reduce_scatter_says_how_the_step_priced_it(hw):
    from shardscope._src.train.sweep import plan

    result = plan(
        SMALL, 2, hardware=hw, strategies=["fsdp"], mesh="data=2", remat="none", microbatches=1,
        offload_optimizer=False, workers=0, compiler="cpu",
    )  # fmt: skip
    (p,) = result.plans
    (note,) = [n for n in result.notes if n.kind == PlanNote.NO_REDUCE_SCATTER]
    # the CPU program's gradient all-reduces, each twice a reduce-scatter's bytes
    sent = sum(c.traffic_bytes for c in p.collectives if c.kind == "all-reduce")
    assert sent > 0 and not [c for c in p.collectives if c.kind == "reduce-scatter"]
    # the step as the plan prices it (its compiler's), and with every all-reduce charged as
    # compiled (a compiler that forms reduce-scatters has none to stand in for)
    priced = compiled_step(result.hardware, p.pricing, p.collectives, p.bound, CPU_COMPILER)
    as_compiled = compiled_step(result.hardware, p.pricing, p.collectives, p.bound, GPU_COMPILER)
    assert p.step_time_s == pytest.approx(priced.step_s, rel=1e-12)
    if hw == "h100":
        # the H100's compiler forms them: the step prices them as its reduce-scatters, for
        # less than as compiled, and the note says so
        assert priced.data_comm_s < as_compiled.data_comm_s
        assert note.values.priced_as == "h100"
        assert "as the reduce-scatters the h100's own compiler forms" in note.text
    else:
        # the TPU's forms them only sometimes: the step is charged the compiled all-reduces
        assert priced.data_comm_s == as_compiled.data_comm_s
        assert note.values.priced_as is None and "priced_as" not in note.values.to_dict()
        assert "are charged the compiled all-reduce" in note.text


# -- the compiled program's matmul FLOPs -----------------------------------------------------

#: SMALL on 2 devices, data parallel: 8 / 2 sequences of 16 tokens per device.
TOKENS = 8 // 2 * 16
#: Per layer, the weights' parameters: q, k and v (32 x 2 x (2 + 2) x 8), the output
#: projection (4 x 8 x 32), the gate and up projections (32 x 2 x 48) and the down one (48 x 32).
LAYER_PARAMS = 32 * 2 * 4 * 8 + 4 * 8 * 32 + 32 * 2 * 48 + 48 * 32
#: Per layer, QK^T and PV: 2 x 16 keys x 32 query dimensions per token each (the dense scores
#: are all computed, masked after).
CORE = 2 * 2 * TOKENS * 16 * 32
#: The forward: 2 FLOPs per parameter per token in each of the 2 layers, their attention core,
#: and the unembedding (32 x 32).
FORWARD = 2 * (2 * TOKENS * LAYER_PARAMS + CORE) + 2 * TOKENS * 32 * 32


def _small_plan(mode="train", remat="none"):
    from shardscope._src.train.sweep import plan

    result = plan(
        SMALL, 2, mode=mode, strategies=["dp"], mesh="data=2", remat=remat, microbatches=1,
        offload_optimizer=False, flash_attention=False, workers=0, compiler="cpu",
    )  # fmt: skip
    (p,) = result.plans
    return result, p


@pytest.mark.parametrize("mode", ["train", "forward"])
def test_a_program_that_computes_the_formulas_matmuls_has_the_formulas_compute(mode):
    result, p = _small_plan(mode)
    # Training: the forward and a backward of twice it (the weights' and the inputs'
    # gradients); the first layer's input gradient too, as the scanned layers compute it.
    want = 3 * FORWARD if mode == "train" else FORWARD
    assert p.matmul_flops_per_device == want
    assert p.estimated_matmul_flops_per_device == want
    assert not [n for n in p.notes if n.kind == PlanNote.COMPILED_FLOPS]
    assert p.time.compute_s == pytest.approx(p.estimated_time.compute_s, rel=1e-12)
    # The step is the formula's compute with the compiled collectives.
    formula = compiled_step(result.hardware, p.pricing, p.collectives, p.bound, CPU_COMPILER)
    assert p.step_time_s == pytest.approx(formula.step_s, rel=1e-12)
    data = p.to_dict()
    assert data["matmul_flops_per_device"] == want
    assert data["estimated_matmul_flops_per_device"] == want


def test_a_program_that_recomputes_less_than_the_formula_is_priced_by_what_it_runs():
    # Selective recomputation with dense attention: the formula recomputes QK^T and PV in the
    # backward. The compiled program keeps the masked scores and their softmax (the policy
    # drops the named scores and probabilities, not these) and recomputes no matmul.
    result, p = _small_plan(remat="selective")
    assert p.estimated_matmul_flops_per_device == 3 * FORWARD + 2 * CORE
    assert p.matmul_flops_per_device == 3 * FORWARD
    hw = result.hardware
    rate = hw.peak_flops * hw.matmul_fraction
    saved = p.estimated_time.compute_s - p.time.compute_s
    assert saved == pytest.approx(2 * CORE / rate, rel=1e-9)
    assert p.step_time_s == p.time.step_s < p.estimated_time.step_s
    (note,) = [n for n in p.notes if n.kind == PlanNote.COMPILED_FLOPS]
    assert note.values.compiled == 3 * FORWARD
    assert note.text.startswith("the XLA:CPU program computes 3.6% fewer matmul FLOPs")
    from shardscope._src.render.plan import time_breakdown

    line = "Matmul FLOPs per device in the step: 7.08 MFLOP in the compiled program, 7.34 MFLOP"
    assert any(t.startswith(line) for t in time_breakdown(p))


def test_a_program_that_computes_more_is_slower_by_that_work_at_the_matmul_rate():
    # Long sequences on one node of H100s: FSDP's collectives hide behind the compute.
    config = model_preset("7b").config(batch=16, seq=4096)
    s = estimate(Candidate("fsdp", (("data", 8),), 2, "none"), config, "h100")
    hw = hardware("h100")
    assert s.time.data_exposed_s == 0
    as_formula = [_as_compiled(t) for t in s.bound.terms]
    own = s.pricing.work.step_matmul_flops
    same = compiled_step(hw, s.pricing, as_formula, s.bound, GPU_COMPILER, own)
    # The same work; the collectives, each its own latency where the formula gathers a
    # layer's weights in one, hold the multiprocessors a little longer beside it.
    assert same.compute_s == pytest.approx(s.time.compute_s, rel=1e-12)
    assert same.step_s - same.contention_s == pytest.approx(
        s.time.step_s - s.time.contention_s, rel=1e-12
    )
    # A matmul the formula does not count, 5% of the step's, in each micro-batch.
    extra = 0.05 * own
    more = compiled_step(hw, s.pricing, as_formula, s.bound, GPU_COMPILER, own + extra)
    rate = hw.peak_flops * hw.matmul_fraction
    assert more.compute_s - same.compute_s == pytest.approx(extra / rate, rel=1e-9)
    assert more.step_s - same.step_s == pytest.approx(extra / rate, rel=1e-9)
    assert more.mfu < same.mfu


def test_fp8_keeps_its_share_of_a_compiled_count():
    # The fp8 share of the matmuls stays at the fp8 rate: twice the FLOPs, twice the matmul
    # seconds of each rate.
    config = model_preset("7b").config(batch=8, seq=4096)
    s = estimate(Candidate("fsdp", (("data", 8),), 1, "none"), config, "h100", matmul_dtype="fp8")
    hw, w = hardware("h100"), s.pricing.work
    assert 0 < w.fp8_flops < w.fwd_flops
    sixteen = (w.step_matmul_flops - 3 * w.fp8_flops) / (hw.peak_flops * hw.matmul_fraction)
    fp8 = 3 * w.fp8_flops / (hw.fp8_peak_flops * hw.fp8_matmul_fraction)
    doubled = s.pricing.step(hw, [], 2 * w.step_matmul_flops)
    assert doubled.compute_s - s.pricing.step(hw, []).compute_s == pytest.approx(
        sixteen + fp8, rel=1e-9
    )


def test_a_program_plans_time_model_note_names_the_rate_it_computes_at():
    # compute is the FLOP count at the achievable matmul rate, not at the peak
    text = PlanNote.PROGRAM_TIME_MODEL.describe(hardware("h100").to_dict())
    assert "at the achievable matmul rate of each matmul's arithmetic" in text
    assert "(bf16 and f16 at 989 TFLOP/s peak x 0.54; " in text
    # an f32 program's matmuls: TF32's dense rate, fp32's at precision highest, the same
    # fraction of each
    assert "f32 at JAX's default or high precision as TF32, 494.5 TFLOP/s x 0.54" in text
    assert "at precision highest as fp32, 67 TFLOP/s x 0.54; fp8 at 1979 TFLOP/s x 0.48)" in text
    tpu = PlanNote.PROGRAM_TIME_MODEL.describe(hardware("tpu-v5e").to_dict())
    assert "f32 as one bf16 pass at that rate, three at precision high, six at highest)" in tpu
    # and what a compiled accelerator program's kernels add: the H100's least kernel and launch
    assert "none under 2 us and each launched at 1 us" in text
    # compiled for the CPU, whose collectives run on their own: compute and communication
    assert text.endswith(
        "step = compute + communication (the CPU's compiler runs each "
        "collective on its own: no overlap) or the larger of the two (perfect "
        "overlap)"
    )
    # compiled by the H100's compiler: what its schedule leaves exposed
    scheduled = PlanNote.PROGRAM_TIME_MODEL.describe(
        {**hardware("h100").to_dict(), "scheduled_by": "XLA:GPU"}
    )
    assert "step = compute + the communication the XLA:GPU compiler's schedule leaves exposed" in (
        scheduled
    )


def test_the_compilers_memory_pressure_reads_as_a_note_of_the_plan():
    values = {
        "compiler": "XLA:GPU",
        "limit_bytes": 60570427392,
        "reached_bytes": 93567040840,
        "original_bytes": 93567040840,
    }
    text = PlanNote.MEMORY_PRESSURE.describe(values)
    assert text.startswith("the XLA:GPU compiler could not bring the program under 56.41 GiB")
    assert "it needs 87.14 GiB" in text
    # XLA:GPU's limit is not the memory it was told, and the note says why
    assert "95% of the memory it was told, less the program's arguments and outputs" in text


@pytest.mark.parametrize(("flag", "want"), [(["--tp-overlap"], {"tp_overlap": True}),
                                            (["--no-tp-overlap"], {"tp_overlap": False}),
                                            ([], {})])  # fmt: skip
def test_the_command_line_sets_tp_overlap_over_the_preset(flag, want):
    args = build_parser().parse_args(["plan", "--model", "tiny", "--devices", "8", *flag])
    assert dict(command_config(args).hardware_overrides) == want


def test_a_mixtures_experts_are_read_by_a_grouped_kernel_a_layer_at_its_sizes_bandwidth():
    # 4 micro-batches, one device; 10 layers of experts, each reading two weights of 8 MiB
    # (one grouped kernel each) in a forward: on an H100 each kernel reaches the 1,069.98
    # GiB/s XLA measured for 8 MiB, and the forward's expert matmuls (a million FLOPs:
    # nothing beside the reads) take the reads' time
    mib = 2**20
    hw = hardware("h100")
    work = _work(
        fwd_flops=1e6, expert_flops=1e6, expert_weight_bytes=20 * 8 * mib, expert_weight_kernels=20
    )
    run = matmul_seconds(hw, 1e6)
    read = 20 * 8 * mib / (1069.98 * 2**30)
    # a forward reads each once and a backward twice (the input and the weight gradients)
    per_microbatch = (run + (read - run)) + (2 * run + (2 * read - 2 * run))
    assert step_time(hw, work, []).compute_s == pytest.approx(4 * per_microbatch, rel=1e-9)
    # one kernel for all of them: 160 MiB at the 2,632.96-2,766.69 GiB/s of 128-256 MiB
    whole = step_time(hw, replace(work, expert_weight_kernels=1), []).compute_s
    assert whole < 0.5 * step_time(hw, work, []).compute_s
