"""The planner prices a mixture of experts: expert parallelism among the strategies it
searches, the dispatch and combine all-to-alls in its bound and its time, the experts'
weights in its memory, the routed experts' FLOPs at the capacity they are padded to; and
what it cannot price yet is refused by name."""

import math
from dataclasses import replace

import pytest

import shardscope
from helpers import layer_growth
from shardscope._src.base.comm import ALL_GATHER, ALL_TO_ALL
from shardscope._src.base.errors import ModelConfigError, PlanError
from shardscope._src.model.config import Mode, ModelConfig
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.estimates import estimate_memory, model_flops
from shardscope._src.plan.notes import ExpertsUnsplitValues, Note, PlanNote
from shardscope._src.render.plan import ASKED_NOTES
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.timing import comm_items

SMALL = ModelConfig(
    d_model=64,
    heads=4,
    kv_heads=2,
    ff=128,
    layers=2,
    batch=16,
    seq=32,
    vocab=256,
    mlp="swiglu",
    experts=8,
    top_k=2,
    expert_ff=64,
    capacity_factor=1.0,
    dtype="bfloat16",
)


def test_model_flops_count_the_experts_each_token_goes_to():
    c = model_preset("mixtral-8x7b").config(batch=2, seq=4096)
    d, kv, ff, layers, vocab = 4096, 8 * 128, 14336, 32, 32000
    per_token = (
        layers * (d * (2 * d + 2 * kv) + d * 8 + 2 * 3 * d * ff)  # attention, router, 2 experts
        + 2 * layers * 4096 * d  # the attention core, non-causal
        + d * vocab
    )
    assert model_flops(c) == 6 * 2 * 4096 * per_token


def test_the_bound_moves_each_replicas_tokens_to_its_experts_and_back():
    placement = get_strategy("fsdp_ep").place(SMALL, abstract_mesh("data=2,expert=4"))
    terms = shardscope.transformer_bound(placement, Mode.TRAIN).terms
    a2a = [t for t in terms if t.kind == ALL_TO_ALL]
    # each replica's 8 sequences x 32 tokens x top-2 x d_model in bfloat16, dispatch and
    # combine, forward and backward, in both layers
    assert {t.payload_bytes for t in a2a} == {8 * 32 * 2 * 64 * 2}
    assert sum(t.count for t in a2a) == 2 * 2 * 2
    # a layer's routed experts are gathered over 'data' alone: the 2 of 8 on each device
    gathers = {t.what: t for t in terms if t.kind == ALL_GATHER and t.axes == ("data",)}
    gate_up = gathers["expert_gate_up gathered at use"]
    assert gate_up.payload_bytes == 2 * 64 * 2 * 64 * 2 and gate_up.count == 2


def test_the_experts_state_is_divided_where_they_are_split():
    mesh = abstract_mesh("data=2,expert=4")
    fsdp_ep = estimate_memory(get_strategy("fsdp_ep").place(SMALL, mesh))
    dp_ep = estimate_memory(get_strategy("dp_ep").place(SMALL, mesh))
    expert = 2 * (8 * 64 * 2 * 64 + 8 * 64 * 64)  # gate_up and down of 8 experts, 2 layers
    dense = SMALL.param_count() - expert
    assert dp_ep.params == (dense + expert // 4) * 2  # experts over 'expert', the rest whole
    assert fsdp_ep.params == (dense // 8 + expert // 8) * 2
    # the distributed optimizer: the dense weights' state over data x expert, the experts'
    # over data (their replicas); ZeRO-2 their gradients too
    zero1_ep = estimate_memory(get_strategy("zero1_ep").place(SMALL, mesh))
    zero2_ep = estimate_memory(get_strategy("zero2_ep").place(SMALL, mesh))
    per_param = dp_ep.optimizer // (dense + expert // 4)
    assert zero1_ep.params == dp_ep.params and zero1_ep.grads == dp_ep.grads
    assert zero1_ep.optimizer == per_param * (dense // 8 + expert // 8)
    assert zero2_ep.grads == (dense // 8 + expert // 8) * 2


def test_plan_searches_expert_parallelism_and_its_screen_counts_what_compiles():
    result = shardscope.plan(SMALL, 8, hardware="h100", compiler="cpu", compile_top=2)
    compiled = {p.strategy for p in result.plans}
    assert compiled & {"ep", "dp_ep", "fsdp_ep", "ep_tp", "zero1_ep_tp"}
    for p in result.plans:
        # the formula's matmul FLOPs are the compiled program's, experts and router included
        assert p.matmul_flops_per_device == pytest.approx(
            p.estimated_matmul_flops_per_device, rel=0.03
        ), p.label
    # the compiled collectives are the formula's (XLA:CPU's all-reduce where the formula has
    # a reduce-scatter counted as it sends)
    checked = [v for v in result.validations if get_strategy(v.strategy).expert_parallel]
    assert checked
    for v in checked:
        assert v.cpu_ratio == pytest.approx(1.0, abs=0.05), v.explanation


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"remat": "matmuls"}, "remat=matmuls"),
        ({"strategies": ["fsdp_sp"]}, "fsdp_sp"),
    ],
)
def test_what_a_mixture_cannot_be_planned_with_is_refused(kwargs, match):
    with pytest.raises(PlanError, match=match):
        shardscope.plan(SMALL, 8, hardware="h100", compiler="cpu", compile_top=0, **kwargs)


# four layers, the first dense (an MLP half as wide as a token's two experts): two
# pipeline stages of two layers, the last with experts only
STAGED = replace(SMALL, layers=4, dense_layers=1, ff=64)


def test_a_mixture_is_pipelined_by_its_last_stage_of_layers_with_experts():
    mesh = "stage=2,data=2,expert=2"
    staged = shardscope.plan(
        STAGED, 8, hardware="h100", compiler="cpu", strategies=["fsdp_ep"], mesh=mesh,
        microbatches=2, compile_top=1,
    )  # fmt: skip
    # the same two layers with experts, unstaged, on the stage's devices
    alone = shardscope.plan(
        replace(STAGED, layers=2, dense_layers=0), 4, hardware="h100", compiler="cpu",
        strategies=["fsdp_ep"], mesh="data=2,expert=2", microbatches=2, compile_top=1,
    )  # fmt: skip
    (p,), (q,) = staged.plans, alone.plans
    assert (p.stages, p.mesh_spec) == (2, mesh)
    assert p.compiled_by.name == "cpu" and q.compiled_by.name == "cpu"
    # the stage compiled is the last one's program: its matmuls and its collectives
    assert p.matmul_flops_per_device == pytest.approx(q.matmul_flops_per_device, rel=1e-6)
    assert p.matmul_flops_per_device == pytest.approx(p.estimated_matmul_flops_per_device, rel=0.03)
    a2a = [c for c in p.comm if c.kind == ALL_TO_ALL]
    assert {c.axes for c in a2a} == {"expert"}
    # each data shard's 8 sequences over 2 micro-batches, split over 'expert': 2 sequences
    # x 32 tokens x top-2 x d_model in bfloat16 a dispatch or combine, sent 1/2 away;
    # dispatch and combine, forward and backward, 2 layers, 2 micro-batches
    assert sum(c.traffic_bytes for c in a2a) == (2 * 32 * 2 * 64 * 2 // 2) * 2 * 2 * 2 * 2


def test_a_mixture_whose_dense_layers_outweigh_its_experts_is_not_staged():
    heavy = replace(STAGED, ff=512)
    with pytest.raises(PlanError, match="dense layers compute more"):
        shardscope.plan(heavy, 8, hardware="h100", compiler="cpu", compile_top=0, stages=2)
    # whether a mixture is staged is the model's (stage_options), whatever the strategy: a
    # dense one and one splitting the experts (each strategy's best plan is compiled)
    kw = dict(hardware="h100", compiler="cpu", compile_top=0, strategies=["dp", "fsdp_ep"])
    result = shardscope.plan(heavy, 8, **kw)
    assert {p.strategy for p in result.plans} == {"dp", "fsdp_ep"}
    assert {p.stages for p in result.plans} == {1}
    staged = shardscope.plan(STAGED, 8, **kw)
    assert {p.strategy for p in staged.plans if p.stages > 1} == {"dp", "fsdp_ep"}


@pytest.fixture(scope="module")
def noted() -> dict[str, shardscope.PlanResult]:
    """Plans of SMALL without and with an expert axis, the latter in fp8 too, its forward step
    and a dense twin's training step (both in fp8): their result notes."""
    kw = dict(hardware="h100", compiler="cpu", compile_top=0)
    split = dict(strategies=["fsdp_ep"], mesh="data=2,expert=4")
    plain = replace(SMALL, experts=0, top_k=0, expert_ff=None, capacity_factor=None)
    fp8 = dict(matmul_dtype="fp8")
    return {
        "unsplit": shardscope.plan(SMALL, 8, strategies=["fsdp", "fsdp_ep"], **kw),
        "split": shardscope.plan(SMALL, 8, **split, **kw),
        "split-fp8": shardscope.plan(SMALL, 8, **split, **fp8, **kw),
        "forward": shardscope.plan(SMALL, 8, **split, mode="forward", **fp8, **kw),
        "dense": shardscope.plan(plain, 8, strategies=["fsdp"], **fp8, **kw),
    }


def _kinds(result: shardscope.PlanResult) -> list[str]:
    return [n.kind for n in result.notes]


def test_a_mixture_planned_without_an_expert_axis_says_its_estimate_is_not_borne_out(noted):
    unsplit = noted["unsplit"]
    (note,) = [n for n in unsplit.notes if n.kind == "experts-unsplit"]
    split = [p for p in unsplit.plans if p.mesh.get("expert", 1) > 1]
    assert split and [p.strategy for p in split] == ["fsdp_ep"] * len(split)
    best = min(split, key=lambda p: p.step_time_s)
    # it names the plans without an expert axis that rank above the best with one
    fsdp = [p for p in unsplit.plans if p.strategy == "fsdp" and p.rank < best.rank]
    assert fsdp and note.values.labels == tuple(p.label for p in fsdp)
    assert "Marin" in note.text and "expert axis" in note.text
    # beside plans with one, it names the best of them and its rank
    assert (note.values.split, note.values.split_rank) == (best.label, best.rank)
    assert note.text.endswith(f"with an expert axis: {best.label}, ranked {best.rank}")
    # with none among the plans, it says how to get one
    alone = Note(PlanNote.EXPERTS_UNSPLIT, ExpertsUnsplitValues(labels=note.values.labels))
    assert alone.text.endswith(
        "(none is among these plans: plan again with --strategies naming one, fsdp_ep or ep)"
    )
    for other in ("split", "dense"):
        assert noted[other].plans and "experts-unsplit" not in _kinds(noted[other])


def test_no_layout_without_an_expert_axis_above_the_best_with_one_needs_the_note(noted):
    from shardscope._src.train.sweep import experts_unsplit_note

    plans = noted["unsplit"].plans
    split = min((p for p in plans if p.mesh.get("expert", 1) > 1), key=lambda p: p.rank)
    unsplit = [p for p in plans if p.mesh.get("expert", 1) == 1]
    # ranked below the best plan with an expert axis, the layouts without one go unnamed
    reranked = [replace(p, rank=k + 1) for k, p in enumerate([split, *unsplit])]
    assert experts_unsplit_note(reranked) is None
    # one of them above it is named, and it alone
    above = [replace(unsplit[0], rank=1), replace(split, rank=2)]
    above += [replace(p, rank=k + 3) for k, p in enumerate(unsplit[1:])]
    note = experts_unsplit_note(above)
    assert note.values.labels == (unsplit[0].label,)
    assert (note.values.split, note.values.split_rank) == (split.label, 2)


def test_a_mixtures_training_plans_say_how_far_their_step_has_been_from_measured(noted):
    (note,) = [n for n in noted["split"].notes if n.kind == "mixture-step"]
    # the held-out figures it quotes, each a share of the measured step, in words: which
    # way and by how much
    v = note.values
    assert v.runs >= v.within_25 > 0 and v.fastest <= v.signed_median <= v.slowest
    assert f"{v.runs} published mixture runs" in note.text
    assert f"{-v.signed_median:.0%} faster than measured at the median" in note.text
    assert f"from {-v.fastest:.0%} faster to {v.slowest:.0%} slower" in note.text
    assert "moe_heldout.py" in note.text and "accuracy" in note.text
    # a record of other figures reads as they are: a slow median is "slower"
    slow = PlanNote.MIXTURE_STEP.describe({**v.to_dict(), "signed_median": 0.05})
    assert "came out 5% slower than measured at the median" in slow
    # a forward step and a dense model's training steps carry no such note
    for other in ("forward", "dense"):
        assert noted[other].plans and "mixture-step" not in _kinds(noted[other])


def test_a_mixtures_fp8_training_plans_say_the_fp8_saving_is_not_borne_out(noted):
    (note,) = [n for n in noted["split-fp8"].notes if n.kind == "mixture-fp8"]
    assert "Qwen3-30B-A3B" in note.text and 'matmul_dtype="bfloat16"' in note.text
    assert note.params == ("matmul_dtype",)
    # the terminal prints it whole, as the fp8 choice asked for it
    assert note.kind in ASKED_NOTES
    # not on its bfloat16 plans, its fp8 forward step, nor a dense model's fp8 plans
    assert "fp8-matmuls" in _kinds(noted["forward"]) and "fp8-matmuls" in _kinds(noted["dense"])
    for other in ("split", "forward", "dense", "unsplit"):
        assert noted[other].plans and "mixture-fp8" not in _kinds(noted[other])


def test_expert_parallelism_for_a_dense_model_is_refused():
    with pytest.raises(PlanError, match="has none"):
        shardscope.plan("tiny", 8, strategies=["ep"], compile_top=0)


@pytest.mark.compiler
@pytest.mark.parametrize(
    "strategy, mesh_spec, once, weighted",
    [
        ("fsdp_ep", "data=2,expert=4", False, False),
        ("ep", "expert=8", False, False),
        ("ep", "expert=8", False, True),
        ("fsdp_ep", "data=2,expert=4", True, False),
    ],
)
def test_a_layer_with_experts_keeps_what_the_estimate_counts(strategy, mesh_spec, once, weighted):
    # The H100 compiler's temporaries grow per layer of the scan by what one layer keeps for
    # the backward; the experts' activation keeps only its input, as a fused kernel does.
    def config_of(layers):
        return ModelConfig(
            layers=layers,
            d_model=128,
            heads=2,
            ff=512,
            mlp="swiglu",
            seq=2048,
            batch=8,
            dtype="bfloat16",
            attention="blocked",
            attention_block=256,
            experts=8,
            top_k=2,
            expert_ff=256,
            capacity_factor=1.0,
            dispatch_once=once,
            weight_activations=weighted,
        )

    # sent once to each device of its experts, a token's rows are gathered into its experts'
    # slots there: the backward keeps the slots, as it does sent once per expert; there the
    # router weight scales the experts' activation, so their outputs are not kept, nor are
    # they sent once per expert with weight_activations (each slot's weight sent with it)
    estimate, kept = layer_growth(strategy, mesh_spec, config_of)
    # one sequence of 2048 tokens a device, bf16: the attention's and the norms' as a dense
    # layer's (10 h + 8 h), the slots sent to the 2 experts (2 h) and, weighted in the
    # combine, their outputs (2 h more), the experts' gate, up and product (2 x 3 x 256),
    # and the router's float32 logits (4 x 8)
    slots = 2 * 128 if once or weighted else 2 * 2 * 128
    assert estimate == 2048 * (18 * 128 + 2 * (slots + 2 * 768) + 32)
    assert kept == pytest.approx(estimate, rel=0.03)


def test_a_plan_sending_each_token_once_per_device_prices_what_compiles():
    kw = dict(
        hardware="h100", compiler="cpu", strategies=["fsdp_ep"], mesh="data=2,expert=4",
        microbatches=1, remat="none", compile_top=1,
    )  # fmt: skip
    once = shardscope.plan(SMALL, 8, dispatch_once=True, **kw)
    per_expert = shardscope.plan(SMALL, 8, **kw)

    def moved(result):
        (p,) = result.plans
        return sum(c.traffic_bytes for c in p.collectives if c.kind == ALL_TO_ALL)

    # two experts a device: a token with both of them there is sent once (its 2 slots of
    # each replica's 8 x 32 tokens: 13 / 28 of them reach each of the 4 devices, not 2 / 4)
    assert moved(once) < moved(per_expert)
    # the compiled all-to-alls are the formula's, up to each sequence's capacity rounded up
    (v,) = [v for v in once.validations if v.strategy == "fsdp_ep"]
    assert v.cpu_ratio == pytest.approx(1.0, abs=0.05), v.explanation


def test_a_step_prices_the_dispatch_sent_once_a_device_once_a_node_across_nodes():
    # 64 experts over 64 H100s on 8 nodes, 8 a token: DeepEP sends a token's row once to
    # each node holding one of its experts, not once to each such device
    config = replace(SMALL, experts=64, top_k=8, batch=64, seq=4096, dispatch_once=True)
    placement = get_strategy("ep").place(config, abstract_mesh("expert=64"))
    terms = shardscope.transformer_bound(placement, Mode.TRAIN).terms
    rows = [t for t in terms if t.kind == ALL_TO_ALL and t.once_per_node]
    assert {t.scope for t in rows} == {"moe/dispatch", "moe/combine"}
    assert {t.once_per_node for t in rows} == {(64, 8)}
    hw = shardscope.hardware("h100")
    once = comm_items(hw, placement, terms)
    flat = comm_items(hw, placement, [replace(t, once_per_node=()) for t in terms])
    per_device = 56 * (8 / 64)  # the other nodes' devices, each holding one of 64 experts
    per_node = 7 * (1 - math.comb(56, 8) / math.comb(64, 8))
    for t in rows:
        (a,) = [i.seconds for i in once if i.what == t.what]
        (b,) = [i.seconds for i in flat if i.what == t.what]
        latency = t.count * 63 * hw.latency_s
        assert (a - latency) / (b - latency) == pytest.approx(per_node / per_device, rel=1e-6)


def test_a_dropless_mixtures_imbalance_sizes_the_busiest_experts_work():
    dropless = replace(SMALL, capacity_factor=None)
    mesh = abstract_mesh("data=2,expert=4")

    def a2a_payloads(config):
        terms = shardscope.transformer_bound(get_strategy("fsdp_ep").place(config, mesh)).terms
        return {t.payload_bytes for t in terms if t.kind == ALL_TO_ALL}

    # uniform routing moves each replica's tokens x top-2; the busiest expert at 1.5 x its
    # share needs buffers that large on every device
    assert a2a_payloads(dropless) == {8 * 32 * 2 * 64 * 2}
    assert a2a_payloads(replace(dropless, imbalance=1.5)) == {3 * 8 * 32 * 64 * 2}
    with pytest.raises(ModelConfigError, match="imbalance=0.5"):
        replace(dropless, imbalance=0.5)
    with pytest.raises(ModelConfigError, match="imbalance=1.5.*capacity-padded"):
        replace(SMALL, imbalance=1.5)


def test_a_dropless_mixture_is_planned_and_compiled_at_its_imbalance():
    dropless = replace(SMALL, capacity_factor=None)

    def compiled_a2a(**kwargs):
        result = shardscope.plan(
            dropless, 8, hardware="h100", compiler="cpu", strategies=["fsdp_ep"],
            mesh="data=2,expert=4", remat="none", compile_top=1, **kwargs,
        )  # fmt: skip
        (p,) = result.plans
        return sum(c.traffic_bytes for c in p.comm if c.kind == ALL_TO_ALL)

    # a device's 2 sequences (of its replica's 8, over 4 expert devices) x 32 tokens x top-2
    # x d_model in bfloat16, 3/4 of it sent away; at 1.5 the buffers of the busiest expert;
    # dispatch and combine, forward and backward, 2 layers
    uniform = 2 * 32 * 2 * 64 * 2 * 3 // 4 * 2 * 2 * 2
    assert compiled_a2a() == uniform
    assert compiled_a2a(imbalance=1.5) == uniform * 3 // 2


@pytest.mark.parametrize("strategy, mesh", [("fsdp", "data=8"), ("ep", "expert=8")])
def test_a_dropless_program_under_jit_sends_every_slot_to_every_device(strategy, mesh):
    # Its routing sorts the whole batch's assignments at once: the partitioner all-reduces
    # every one of the batch's 16 x 32 tokens x top-2 rows of d_model (float32 here) in the
    # combine, forward and backward, whatever the strategy (why the planner compiles a
    # dropless mixture capacity-padded)
    config = replace(SMALL, capacity_factor=None, dtype="float32")
    audit = shardscope.audit(build_reference_program(strategy, config, mesh, mode="train"))
    combine = [
        (c.kind, c.payload_bytes, c.count) for c in audit.collectives if c.scope == "moe/combine"
    ]
    assert ("all-reduce", 16 * 32 * 2 * 64 * 4, 2) in combine


def test_the_fsdp_plan_of_a_dropless_mixture_keeps_each_devices_tokens_on_it():
    # FSDP gathers every expert to each device's own sequences: no slot leaves its device
    # (the program is compiled capacity-padded, whichever compiler compiles it)
    result = shardscope.plan(
        replace(SMALL, capacity_factor=None), 8, hardware="h100", compiler="cpu",
        strategies=["fsdp"], mesh="data=8", remat="none", compile_top=1, microbatches=1,
    )  # fmt: skip
    (p,) = result.plans
    assert p.collectives
    moved = [c for c in p.collectives if "moe/dispatch" in (c.op_name or "")]
    moved += [c for c in p.collectives if "moe/combine" in (c.op_name or "")]
    assert moved == []


@pytest.mark.parametrize(
    "strategy, mesh, local_experts",
    [("ep", "expert=8", 64 // 8), ("fsdp_ep", "data=2,expert=4", 64 // 4)],
)
def test_the_routed_experts_read_their_own_weights_as_they_are_used(strategy, mesh, local_experts):
    from shardscope._src.plan.estimates import routed_expert_work

    c = replace(SMALL, experts=64, d_model=256, expert_ff=512, batch=8, seq=16)
    placement = get_strategy(strategy).place(c, abstract_mesh(mesh))
    flops, elements = routed_expert_work(placement)
    # each device's experts (fsdp_ep's gathered over 'data'), SwiGLU's gate, up and down, in
    # both layers with experts
    assert elements == 2 * local_experts * 3 * 256 * 512
    # each device's sequence (the batch of 8 over all 8 devices), 16 tokens, two experts a
    # token at capacity factor 1: two FLOPs a weight
    tokens = 8 * 16 // 8
    assert flops == 2 * tokens * 2 * 2 * 3 * 256 * 512


def test_with_few_tokens_an_expert_the_step_waits_for_the_experts_weights():
    from shardscope._src.targets.hardware import hardware
    from shardscope._src.train.candidates import estimate
    from shardscope._src.train.types import Candidate

    hw = hardware("h100")
    # 64 experts over 8 devices, one sequence of 16 tokens each: 4 tokens an expert
    few = replace(SMALL, experts=64, d_model=1024, expert_ff=2048, batch=8, seq=16, vocab=None)
    step = estimate(Candidate("ep", (("expert", 8),)), few, hw).time
    weights = 2 * 8 * 3 * 1024 * 2048 * 2  # 8 experts a device, both layers, bf16
    expert_flops = 2 * 16 * 2 * 2 * 3 * 1024 * 2048
    assert weights / hw.hbm_bandwidth > 10 * expert_flops / (hw.peak_flops * hw.matmul_fraction)
    # read once by the forward and twice by the backward, at the 80% of the bandwidth
    # matmuls reach: at least that, whatever the FLOPs
    read = weights / (3.35e12 * 0.8)
    assert step.compute_s >= 3 * read
    # full recomputation runs the forward again: a fourth read
    again = estimate(Candidate("ep", (("expert", 8),), 1, "full"), few, hw).time
    assert again.compute_s >= 4 * read
    # and 16 times the tokens (64 an expert, still below the H100's ridge) take about as long
    many = estimate(Candidate("ep", (("expert", 8),)), replace(few, seq=256), hw).time
    assert many.compute_s < 2 * step.compute_s


def test_a_size_one_axis_names_no_row_of_the_communication_table():
    # FSDP over 'data' and 'expert' with data=1: the formula's weight gathers are named by
    # both axes, the compiled ones by 'expert' alone (its groups never vary over 'data');
    # they are one row, not a compiled row without a bound beside a bound without traffic.
    from shardscope._src.bounds.terms import Bound, Term, TermRole
    from shardscope._src.plan.collectives import PlanCollective, axis_comm

    payload = 8 * 1024 * 1024
    gathers = Term(
        ALL_GATHER, ("data", "expert"), 8, payload, 3, "weights", role=TermRole.WEIGHT_GATHER
    )
    compiled = PlanCollective(
        kind=ALL_GATHER,
        axes=("expert",),
        group_size=8,
        count=3,
        count_exact=True,
        irregular=False,
        dtype="bf16",
        payload_bytes=payload,
        cpu_payload_bytes=payload,
        traffic_bytes=3 * 7 * payload // 8,
        cpu_traffic_bytes=3 * 7 * payload // 8,
        op_name=None,
        source=None,
    )
    sizes = {"data": 1, "expert": 8}
    (row,) = axis_comm(shardscope.hardware("h100"), sizes, [compiled], Bound("b", (gathers,)))
    assert (row.axes, row.kind, row.count) == ("expert", ALL_GATHER, 3)
    assert row.traffic_bytes == row.bound_bytes == 3 * 7 * payload // 8


def test_a_jit_expert_parallel_program_reduces_over_expert_per_micro_batch_and_says_so():
    # dp_ep on data=2 x expert=2, 2 micro-batches: the jit program sums each layer's
    # replicated gradients (the attention's q 64 x 64, k and v 64 x 32, out 64 x 64, two norm
    # gains of 64, the router 64 x 8) over 'expert' inside the accumulation loop, once a
    # layer and a micro-batch, and over 'data' once a step, with the experts' own gradients
    # (4 local experts of SwiGLU's 3 x 64 x 64 in each of 2 layers) and the embedding, the
    # unembedding (256 x 64 each) and the final norm's, and each data shard's float32 loss.
    result = shardscope.plan(
        SMALL, 4, hardware="h100", compiler="cpu", strategies=["dp_ep"], mesh="data=2,expert=2",
        microbatches=2, remat="none", compile_top=1,
    )  # fmt: skip
    (p,) = result.plans
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 64 + 64 * 8
    rest = 2 * 256 * 64 + 64
    experts = 2 * 4 * 3 * 64 * 64
    reduced = [c for c in p.collectives if c.kind == "all-reduce" and c.payload_bytes > 8]
    per_layer = [c for c in reduced if c.axes == ("expert",) and c.payload_bytes == layer * 2]
    assert [c.count for c in per_layer] == [2 * 2]  # 2 layers x 2 micro-batches
    (once,) = [c for c in reduced if c.axes == ("data",)]
    assert (once.count, once.payload_bytes) == (1, (2 * layer + rest + experts) * 2 + 4)
    (v,) = result.validations
    assert "over 'expert' after each of the 2 micro-batches" in v.explanation


def test_a_mixtures_headline_names_its_experts(noted):
    from shardscope._src.render.plan import headline

    assert f", {SMALL.experts} experts, {SMALL.top_k} a token, vocab" in headline(noted["split"])
    assert " experts" not in headline(noted["dense"])


def _refusal(**kwargs):
    with pytest.raises(PlanError) as info:
        shardscope.plan(SMALL, 8, compiler="cpu", compile_top=0, workers=0, **kwargs)
    return info.value


def test_a_mixtures_mesh_refusal_names_the_axis_missing_and_what_a_mixture_runs_on_it():
    from shardscope._src.train.candidates import MOE_PRICED

    e = _refusal(mesh="data=4,model=2", strategies=["ep"])
    # ep splits the experts over 'expert' alone: on 8 devices its one mesh is expert=8
    assert "mesh='data=4,model=2': ep needs an 'expert' axis, e.g. mesh='expert=8'" in str(e)
    # of what runs on data x model, a mixture is planned under dp_tp and fsdp_tp alone (not
    # zero1_tp, zero2_tp or the sp ones, which are refused for it)
    ran = str(e).split("that run on it: ")[1].split(", ")
    assert ran == ["dp_tp", "fsdp_tp"] and set(ran) <= set(MOE_PRICED)
    assert e.params == ("mesh", "strategies")
    e = _refusal(mesh="data=2,expert=4", strategies=["ep"])
    assert "ep takes no 'data' axis, e.g. mesh='expert=8'" in str(e)


def test_a_mixtures_mesh_without_the_data_axis_of_size_one_is_read_with_it():
    result = shardscope.plan(
        SMALL, 8, mesh="expert=8", strategies=["fsdp_ep"], compiler="cpu", compile_top=0,
        workers=0,
    )  # fmt: skip
    assert {p.mesh_spec for p in result.plans} == {"data=1,expert=8"}
    (read,) = [n for n in result.notes if n.kind == "mesh-read"]
    assert "mesh 'expert=8' planned as data=1,expert=8 (the strategy's axes written out" in str(
        read
    )


@pytest.mark.parametrize(
    "strategy, why, nearest",
    [
        ("hsdp", "a mixture of experts is not planned under HSDP", "fsdp_ep or fsdp"),
        ("zero1_sp_cp", "without expert parallelism", "zero1_ep_sp_cp"),
        ("hsdp_tp", "not planned under HSDP", "fsdp_ep_tp or fsdp_tp"),
    ],
)
def test_a_strategy_refused_for_a_mixture_says_why_and_names_the_nearest_priced(
    strategy, why, nearest
):
    from shardscope._src.train.candidates import MOE_PRICED

    text = str(_refusal(strategies=[strategy]))
    assert text.startswith(f"{strategy}: ") and why in text
    assert text.endswith(f"; nearest: {nearest}")
    assert all(n in MOE_PRICED for n in nearest.split(" or "))
    # one reason and a few names, not every priced strategy
    assert "zero2_ep_tp_cp_ring" not in text


def test_a_presets_expert_count_the_mesh_does_not_divide_names_the_mesh_to_choose(capsys):
    from helpers import assert_usage_error

    with pytest.raises(PlanError) as info:
        shardscope.plan("mixtral-8x7b", 64, mesh="data=4,expert=16", compiler="cpu", workers=0)
    text = str(info.value)
    # Mixtral's 8 experts over expert=16; the mesh of 64 nearest it whose expert axis
    # divides 8 is data=8,expert=8, and the preset's expert count is no knob of the planner
    assert "splits the 8 experts of mixtral-8x7b over mesh axes expert=16 (16 ways)" in text
    assert "e.g. mesh='data=8,expert=8'" in text and "config.json" in text
    assert "experts=16" not in text and info.value.params == ("mesh",)
    argv = ["plan", "--model", "mixtral-8x7b", "--devices", "64", "--mesh", "data=4,expert=16"]
    line = assert_usage_error([*argv, "--compiler", "cpu"], "e.g. mesh='data=8,expert=8'", capsys)
    assert line.endswith("(flag --mesh)\n")
