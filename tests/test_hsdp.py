"""Hybrid sharded data parallelism (``hsdp``): weights sharded over ``data`` (inside a node),
replicated over ``replica`` (across nodes), the batch over both. Its placement, bad input, its
bound against the compiled program, its memory, and the planner's meshes and link pricing."""

import shardscope

shardscope.use_cpu_devices(8)

import math  # noqa: E402
from dataclasses import replace  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from shardscope._src.audit.compile import audit  # noqa: E402
from shardscope._src.base.errors import StrategyError  # noqa: E402
from shardscope._src.bounds.transformer import transformer_bound  # noqa: E402
from shardscope._src.model.config import ModelConfig  # noqa: E402
from shardscope._src.model.presets import model_preset  # noqa: E402
from shardscope._src.plan.estimates import Schedule, estimate_memory  # noqa: E402
from shardscope._src.sharding.numerics import compare_numerics  # noqa: E402
from shardscope._src.sharding.programs import build_reference_program  # noqa: E402
from shardscope._src.sharding.strategies import (  # noqa: E402
    abstract_mesh,
    get_strategy,
    mesh_spec_for,
)
from shardscope._src.targets.hardware import hardware  # noqa: E402
from shardscope._src.train.candidates import candidates, estimate, screen_all  # noqa: E402
from shardscope._src.train.timing import (  # noqa: E402
    PER_MICROBATCH_FWD_BWD,
    PER_STEP_BWD,
    comm_items,
    step_bound,
)
from shardscope._src.train.types import Candidate  # noqa: E402

TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
MESH = "replica=2,data=4"
# TINY's weights in float32: per layer two norm gains (32), wqkv 32 x 96, wo 32 x 32, w_up and
# w_down 32 x 64.
TINY_PARAM_BYTES = 2 * (32 + 32 * 96 + 32 * 32 + 32 + 2 * 32 * 64) * 4


def _sent(pairs):
    """``{(axes, kind): (executions, bytes sent per device)}`` of (axes, kind, count, bytes)."""
    out = {}
    for axes, kind, count, sent in pairs:
        n, total = out.get((axes, kind), (0, 0))
        out[(axes, kind)] = (n + count, total + sent)
    return out


def _audited(program):
    result = audit(program.lower())
    return _sent((c.axes, c.kind, c.count, c.count * c.traffic_bytes) for c in result.collectives)


def _bounded(bound):
    return _sent((t.axes, t.kind, t.count, t.traffic_bytes) for t in bound.terms)


# -- placement -----------------------------------------------------------------------------------


def test_weights_shard_over_data_and_the_batch_over_replica_and_data():
    placement = get_strategy("hsdp").place(TINY, MESH)
    assert placement.axes == {"replica": ("replica",), "data": ("data",)}
    layers = placement.param_specs()["layers"]
    assert layers["w_up"] == P(None, "data", None)
    assert layers["wo"] == P(None, None, None, "data")
    assert placement.use_spec("w_up") == P(None, None)  # used whole: gathered over data
    assert placement.batch_specs()[0] == P(("replica", "data"), None, None)
    assert placement.grad_specs() == placement.param_specs()


@pytest.mark.parametrize(
    "shape, expect",
    [
        ((2, 4), "replica=2,data=4"),
        ((8, 8), "replica=8,data=8"),
        ((2, 2, 2), "replica=2,pod=2,data=2"),
    ],
    ids=["2x4", "8x8", "2x2x2"],
)
def test_mesh_spec_puts_replica_first_and_data_last(shape, expect):
    assert mesh_spec_for("hsdp", shape) == expect


def test_a_third_axis_joins_the_inner_shards():
    placement = get_strategy("hsdp").place(TINY, "replica=2,pod=2,data=2")
    assert placement.axes == {"replica": ("replica",), "data": ("pod", "data")}


def test_the_inner_axis_alone_has_to_divide_the_weights():
    # d_model=40 divides by the 8 devices of data but not by the 32 of replica x data: HSDP
    # places it where FSDP over the same devices cannot.
    config = ModelConfig(d_model=40, heads=8, ff=64, batch=32, seq=8)
    get_strategy("hsdp").place(config, abstract_mesh("replica=4,data=8"))
    with pytest.raises(StrategyError, match=r"d_model=40 .* not divisible by 32"):
        get_strategy("fsdp").place(config, abstract_mesh("replica=4,data=8"))


# -- bad input -----------------------------------------------------------------------------------


def test_a_mesh_without_the_outer_axis_names_it_and_a_mesh_that_has_it():
    with pytest.raises(StrategyError) as err:
        get_strategy("hsdp").place(TINY, abstract_mesh("data=8"))
    msg = str(err.value)
    assert "mesh 'data=8' has no 'replica' axis" in msg
    assert "e.g. mesh 'replica=2,data=4'" in msg and "or use fsdp" in msg


def test_a_mesh_without_the_inner_axis():
    with pytest.raises(StrategyError) as err:
        get_strategy("hsdp").place(TINY, abstract_mesh("replica=8"))
    msg = str(err.value)
    assert "needs a mesh axis for role 'data'" in msg
    assert "e.g. mesh 'replica=2,data=4'" in msg


def test_an_inner_axis_that_does_not_divide_the_weights():
    config = ModelConfig(d_model=36, heads=6, ff=64, batch=32, seq=8)
    with pytest.raises(StrategyError) as err:
        get_strategy("hsdp").place(config, abstract_mesh("replica=4,data=8"))
    msg = str(err.value)
    assert "d_model=36" in msg and "data=8 (8 ways)" in msg and "not divisible by 8" in msg
    assert "choose d_model a multiple of 8 (e.g. d_model=32)" in msg


def test_a_batch_that_the_two_axes_do_not_divide():
    with pytest.raises(StrategyError) as err:
        get_strategy("hsdp").place(replace(TINY, batch=4), MESH)
    msg = str(err.value)
    assert "batch=4" in msg and "replica=2, data=4 (8 ways)" in msg
    assert "replica+data axes multiply to a divisor of 4" in msg


# -- the bound -----------------------------------------------------------------------------------


def test_train_bound_gathers_and_scatters_over_data_and_all_reduces_shards_over_replica():
    config = ModelConfig(d_model=64, heads=8, ff=256, layers=2, batch=16, seq=16)
    params = 2 * (64 + 64 * 3 * 64 + 64 * 64 + 64 + 2 * 64 * 256) * 4
    bound = transformer_bound(get_strategy("hsdp").place(config, abstract_mesh(MESH)), "train")
    by = bound.by_axes_kind()
    assert by == {
        (("data",), "all-gather"): 3 * params // 4,
        (("data",), "reduce-scatter"): 3 * params // 4,
        # a quarter of each gradient, over the 2 replicas: 2 (2 - 1) / 2 of it
        (("replica",), "all-reduce"): 2 * 1 * (params // 4) // 2,
        # the float32 loss over all 8 devices
        (("replica", "data"), "all-reduce"): math.ceil(2 * 7 * 4 / 8),
    }
    assert bound.payload_bytes("all-reduce") == params // 4 + 4


def test_forward_collectives_equal_the_bound():
    program = build_reference_program("hsdp", TINY, MESH)
    actual = _audited(program)
    assert actual == _bounded(transformer_bound(program.placement, "forward"))
    # six weights a layer, two layers, each gathered once: 3/4 of every weight sent
    assert actual == {(("data",), "all-gather"): (12, 3 * TINY_PARAM_BYTES // 4)}


def test_train_step_collectives_against_the_bound():
    program = build_reference_program("hsdp", TINY, MESH, mode="train")
    actual = _audited(program)
    bound = _bounded(transformer_bound(program.placement, "train"))
    params = TINY_PARAM_BYTES
    assert bound == {
        (("data",), "all-gather"): (12, 3 * params // 4),
        (("data",), "reduce-scatter"): (12, 3 * params // 4),
        (("replica",), "all-reduce"): (12, params // 4),
        (("replica", "data"), "all-reduce"): (1, 7),
    }
    # XLA:CPU forms no reduce-scatter: each layer's gradients are all-reduced over data (one
    # combined all-reduce a layer, twice the reduce-scatter's bytes) and sliced. Only the
    # quarter left is summed over replica, all of it in one all-reduce. The loss is summed
    # over data, then over replica (4 float32 bytes each: 2 x 3/4 x 4 and 2 x 1/2 x 4).
    assert actual == {
        (("data",), "all-gather"): (12, 3 * params // 4),
        (("data",), "all-reduce"): (2 + 1, 2 * 3 * params // 4 + 6),
        (("replica",), "all-reduce"): (1, params // 4 + 4),
    }


def test_train_step_matches_one_device():
    report = compare_numerics("hsdp", TINY, MESH, mode="train")
    assert set(report.errors) == {"loss", "attention", "mlp"}
    assert report.ok, report.errors


def test_forward_matches_one_device():
    report = compare_numerics("hsdp", TINY, MESH)
    assert report.ok, report.errors


# -- micro-batches --------------------------------------------------------------------------------


def test_micro_batches_reduce_scatter_each_and_all_reduce_the_shards_once():
    config = replace(TINY, batch=32)

    def sent(m):
        return _audited(build_reference_program("hsdp", config, MESH, mode="train", microbatches=m))

    one, four = sent(1), sent(4)
    params = TINY_PARAM_BYTES
    # Gathers and the (all-reduce-and-slice) reductions over data repeat per micro-batch, the
    # loss with them; the gradient shards cross replica once, with each replica's loss added
    # up over the micro-batches.
    assert four[(("data",), "all-gather")] == (4 * 12, 4 * 3 * params // 4)
    assert four[(("data",), "all-reduce")] == (4 * 3, 4 * (2 * 3 * params // 4 + 6))
    assert four[(("replica",), "all-reduce")][1] == one[(("replica",), "all-reduce")][1]
    assert one[(("replica",), "all-reduce")][1] == params // 4 + 4


def test_micro_batches_compute_the_gradients_of_the_whole_batch():
    config = replace(TINY, batch=16)
    placement = get_strategy("hsdp").place(config, MESH)
    whole = build_reference_program(placement, mode="train")
    split = build_reference_program(placement, mode="train", microbatches=2)
    args = whole.example_args()
    (l1, g1), (l2, g2) = whole.fn(*args), split.fn(*args)
    np.testing.assert_allclose(float(l1), float(l2), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        scale = float(np.max(np.abs(np.asarray(a)))) or 1.0
        assert float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= 1e-5 * scale


# -- memory --------------------------------------------------------------------------------------


def test_model_state_over_data_activations_over_both_and_one_gathered_layer():
    config = model_preset("7b").config(batch=64)  # bf16
    P_ = config.param_count()
    h, q, ff = 4096, 32 * 128, 11008
    layer = h + h * 3 * q + q * h + h + h * 2 * ff + ff * h  # norms, wqkv, wo, SwiGLU, w_down
    hsdp = get_strategy("hsdp").place(config, abstract_mesh("replica=8,data=8"))
    dp = get_strategy("dp").place(config, abstract_mesh("data=64"))
    schedule = Schedule(remat="full")
    mem = estimate_memory(hsdp, schedule=schedule)
    # 16 bytes a parameter (mixed-precision Adam), over the 8 devices of data, not all 64.
    assert mem.model_state == 16 * P_ // 8
    assert (mem.params, mem.grads, mem.optimizer) == (2 * P_ // 8, 2 * P_ // 8, 12 * P_ // 8)
    # One sequence a device, as data parallelism over all 64 devices keeps.
    assert mem.activations == estimate_memory(dp, schedule=schedule).activations
    assert mem.gathered_weights == 2 * layer


# -- planner -------------------------------------------------------------------------------------


def test_candidates_keep_the_inner_axis_inside_a_node():
    labels = [c.label for c in candidates(["hsdp"], 64, node_size=8)]
    assert labels == ["hsdp replica=32,data=2", "hsdp replica=16,data=4", "hsdp replica=8,data=8"]
    every = [c.label for c in candidates(["hsdp"], 64)]
    assert "hsdp replica=4,data=16" in every and "hsdp replica=2,data=32" in every
    # One node (or a TPU slice of 256): nothing crosses, every shape is tried.
    assert len(candidates(["hsdp"], 8, node_size=8)) == len(candidates(["hsdp"], 8))


def test_the_sweep_on_h100_nodes_tries_no_inner_axis_across_nodes():
    config = model_preset("7b").config(batch=64)
    ranked, _, pairs = screen_all(
        config, 64, hardware("h100"), ["hsdp"], remat="full", microbatches=1, stages=1
    )
    assert pairs == 3
    assert {s.candidate.sizes["data"] for s in ranked} == {2, 4, 8}


def test_seventy_b_on_eight_nodes_all_reduces_over_the_network_and_gathers_over_nvlink():
    hw = hardware("h100")
    m = 2
    config = model_preset("70b").config(batch=128)  # bf16, 2 sequences a device, 1 a micro-batch
    c = estimate(
        Candidate("hsdp", (("replica", 8), ("data", 8)), microbatches=m, remat="none"),
        config,
        hw,
    )
    items = comm_items(hw, c.pricing.placement, c.bound.terms)
    # Derived from the preset: data groups are 8 neighbouring GPUs (one node, NVLink); a
    # replica group is one GPU of each of the 8 nodes, so one network card carries it; the
    # loss's group of 64 spans 8 nodes with 8 GPUs (8 cards) on each.
    nvlink = hw.link_bandwidth * hw.comm_fraction
    network = min(hw.link_bandwidth, hw.cross_node_bandwidth) * hw.comm_fraction
    all_cards = min(hw.link_bandwidth, 8 * hw.cross_node_bandwidth) * hw.comm_fraction
    a = hw.latency_s
    h, q, kv, ff, v, L = 8192, 64 * 128, 8 * 128, 28672, 32000, 80
    weights = [(h, L), (h * (q + 2 * kv), L), (q * h, L), (h, L), (h * 2 * ff, L), (ff * h, L)]
    weights += [(v * h, 1), (h, 1), (h * v, 1)]
    assert sum(n * count for n, count in weights) == config.param_count()
    # all-gather at use and reduce-scatter of the gradient, per micro-batch, a layer's
    # weights in one collective a pass (7 steps), the embedding, the final norm and the
    # unembedding in another; the layers' weights gathered again for the backward
    gathers = m * L * 7 * a * 2 + m * 1 * 7 * a
    scatters = m * L * 7 * a + m * 1 * 7 * a
    shards = 0.0
    for n, count in weights:
        size = 2 * n  # bf16 bytes
        # each sends 7/8 of its bytes
        again = 2 if count == L else 1
        gathers += again * m * count * 7 * size / 8 / nvlink
        scatters += m * count * 7 * size / 8 / nvlink
        # the gradient's eighth, all-reduced over the 8 replicas once a step: 14 steps, or
        # where faster (the norms' gains) NCCL's low-latency protocol: 6.6 us and 14 steps
        # all across the network at 2.7 us, a quarter of the bandwidth
        sent = 2 * 7 * (size // 8) / 8
        shards += count * min(14 * a + sent / network, 6.6e-6 + 14 * 2.7e-6 + sent / network * 4)
    # the loss's 4 bytes over 64 GPUs: of 126 steps 2 x 8 cross the network, low-latency
    sent = math.ceil(2 * 63 * 4 / 64)
    loss = min(
        2 * 63 * a + sent / all_cards, 6.6e-6 + 110 * 0.6e-6 + 16 * 2.7e-6 + sent / all_cards * 4
    )
    per_microbatch = sum(i.seconds for i in items if i.cls == PER_MICROBATCH_FWD_BWD)
    per_step = sum(i.seconds for i in items if i.cls == PER_STEP_BWD)
    assert {i.cls for i in items} == {PER_MICROBATCH_FWD_BWD, PER_STEP_BWD}
    assert per_microbatch == pytest.approx(gathers + scatters, rel=1e-12)
    assert per_step == pytest.approx(shards + loss, rel=1e-12)
    assert c.time.data_comm_s == pytest.approx(gathers + scatters + shards + loss, rel=1e-12)
    # The shards' all-reduce is once a step however many micro-batches, as the bound of the
    # step (one micro-batch's, repeated) counts it.
    assert c.bound == step_bound(c.pricing.placement, Schedule(m, "none"))
    replica = [t for t in c.bound.terms if t.axes == ("replica",)]
    gathers_of_w_up = [t for t in c.bound.terms if t.what == "w_gate_up gathered at use"]
    assert {t.count for t in replica} == {L, 1}
    assert [t.count for t in gathers_of_w_up] == [m * L]
    second = "w_gate_up gathered at use (again for the backward)"
    again = [t for t in c.bound.terms if t.what == second]
    assert [t.count for t in again] == [m * L]


@pytest.mark.compiler
def test_on_8_nodes_of_h100s_the_compiler_reaches_the_bound():
    # XLA:GPU (compile-only devices, no GPU needed) forms the reduce-scatters over data and
    # all-reduces only the 16-bit gradient shards over replica, with the loss.
    config = ModelConfig(d_model=256, heads=8, ff=512, layers=2, batch=64, seq=16, dtype="bfloat16")
    params = 2 * (256 + 256 * 768 + 256 * 256 + 256 + 2 * 256 * 512) * 2
    mesh = shardscope.target_mesh("h100", "replica=8,data=8", axis_types="auto")
    program = build_reference_program("hsdp", config, mesh, mode="train")
    sent = {k: v[1] for k, v in _audited(program).items()}
    loss = math.ceil(2 * 7 * 4 / 8)  # float32, over 8 devices
    assert sent == {
        (("data",), "all-gather"): 7 * params // 8,
        (("data",), "reduce-scatter"): 7 * params // 8,
        (("data",), "all-reduce"): loss,
        (("replica",), "all-reduce"): 2 * 7 * (params // 8) // 8 + loss,
    }
