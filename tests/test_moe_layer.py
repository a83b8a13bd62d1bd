"""The mixture-of-experts MLP: routing, both dispatches against a token-by-token reference,
and its all-to-alls over an expert axis against the bound, on CPU, H100 and TPU v5p."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.base.errors import ModelConfigError
from shardscope._src.bounds.moe import moe_layer_terms
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.moe import capacity, moe_capacity, moe_dropless
from shardscope._src.render.verdict import verdict_lines

T, D, F, E, K = 64, 16, 24, 4, 2


def _weights(swiglu=True, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, D), dtype=np.float32)
    router = rng.standard_normal((D, E), dtype=np.float32)
    w_in = rng.standard_normal((E, D, 2, F) if swiglu else (E, D, F), dtype=np.float32) / 4
    w_down = rng.standard_normal((E, F, D), dtype=np.float32) / 5
    return x, router, w_in, w_down


def _reference(x, router, w_in, w_down, kept=None):
    """Token by token: the sum over its top-k experts (by logit) of the softmax weight times
    that expert's MLP; ``kept[t, j]`` False leaves an assignment out."""
    out = np.zeros_like(x)
    logits = x @ router
    for t in range(T):
        order = sorted(range(E), key=lambda e: (-logits[t, e], e))[:K]
        top = np.array([logits[t, e] for e in order])
        w = np.exp(top - top.max()) / np.exp(top - top.max()).sum()
        for j, e in enumerate(order):
            if kept is not None and not kept[t, j]:
                continue
            if w_in.ndim == 4:
                g, u = x[t] @ w_in[e, :, 0], x[t] @ w_in[e, :, 1]
                h = g / (1 + np.exp(-g)) * u
            else:
                h = np.asarray(jax.nn.gelu(jnp.asarray(x[t] @ w_in[e])))
            out[t] += w[j] * (h @ w_down[e])
    return out, logits


@pytest.mark.parametrize("swiglu", [True, False], ids=["swiglu", "gelu"])
def test_dropless_dispatch_is_the_token_by_token_sum(swiglu):
    args = _weights(swiglu)
    want, _ = _reference(*args)
    got = jax.jit(lambda *a: moe_dropless(*a, K))(*args)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_capacity_dispatch_with_room_for_every_token_drops_none():
    args = _weights()
    want, _ = _reference(*args)
    # E / K x the even share is every token: no expert can overflow
    got, dropped = jax.jit(lambda *a: moe_capacity(*a, K, E / K))(*args)
    assert int(dropped) == 0
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_capacity_dispatch_drops_what_overflows_in_token_order():
    args = _weights()
    factor = 0.5
    slots = capacity(T, E, K, factor)
    assert slots == math.ceil(0.5 * T * K / E)
    _, logits = _reference(*args)
    # each expert takes its first `slots` assignments, token by token, in rank order
    taken = dict.fromkeys(range(E), 0)
    kept = np.zeros((T, K), bool)
    for t in range(T):
        order = sorted(range(E), key=lambda e: (-logits[t, e], e))[:K]
        for j, e in enumerate(order):
            kept[t, j] = taken[e] < slots
            taken[e] += 1
    want, _ = _reference(*args, kept=kept)
    got, dropped = jax.jit(lambda *a: moe_capacity(*a, K, factor))(*args)
    assert int(dropped) == int((~kept).sum()) > 0
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_groups_route_each_share_of_the_tokens_alone():
    args = _weights()
    factor = E / K  # room for all: the groups change where, not what
    one, _ = jax.jit(lambda *a: moe_capacity(*a, K, factor))(*args)
    four, _ = jax.jit(lambda *a: moe_capacity(*a, K, factor, groups=4))(*args)
    np.testing.assert_allclose(np.asarray(four), np.asarray(one), rtol=2e-5, atol=2e-5)


def _layer_audit(mesh, tokens, d, f, experts, top_k, dtype):
    """The audit of a Mixtral-like expert-parallel layer (GShard's groups, one per device)."""
    groups = mesh.shape["expert"]
    specs = {
        "tokens": P("expert", None, None),
        "slots": P(None, "expert", None, None),
        "experts": P("expert", None, None, None),
    }

    def place(name, x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, specs[name]))

    def layer(x, router, w_in, w_down):
        return moe_capacity(x, router, w_in, w_down, top_k, 1.0, groups=groups, place=place)[0]

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    args = (
        sds((tokens, d), P("expert", None)),
        sds((d, experts), P()),
        sds((experts, d, 2, f), P("expert")),
        sds((experts, f, d), P("expert")),
    )
    return shardscope.audit(jax.jit(layer), *args)


@pytest.mark.parametrize("target", [None, "h100", "tpu-v5p"], ids=["cpu", "h100", "tpu-v5p"])
def test_an_expert_parallel_layer_moves_its_tokens_with_the_bound_all_to_alls(target):
    tokens, d, f, experts, top_k, devices = 512, 64, 128, 8, 2, 8
    # bfloat16 on the accelerators; XLA's CPU compiler moves bfloat16 activations as float32,
    # so the CPU program is float32 throughout
    dtype, itemsize = (jnp.float32, 4) if target is None else (jnp.bfloat16, 2)
    if target is None:
        mesh = shardscope.make_mesh("expert=8", axis_types="auto")
    else:
        mesh = shardscope.target_mesh(target, "expert=8", axis_types="auto")
    audit = _layer_audit(mesh, tokens, d, f, experts, top_k, dtype)
    got = sorted((c.kind, c.axes, c.count, c.payload_bytes, c.scope) for c in audit.collectives)
    # capacity factor 1: each expert's slots are its even share, nothing padded; the bound
    # for uniform routing is every token's activations to its 2 experts, and back
    payload = tokens * top_k * d * itemsize
    bound = moe_layer_terms(tokens, d, top_k, experts, "expert", devices, itemsize)
    assert [t.payload_bytes for t in bound] == [payload, payload]
    assert got == sorted((t.kind, t.axes, t.count, t.payload_bytes, t.scope) for t in bound)


def test_the_bound_refuses_what_no_routing_gives():
    with pytest.raises(ModelConfigError, match="imbalance=0.5"):
        moe_layer_terms(256, 64, 2, 8, "expert", 8, 2, imbalance=0.5)
    train = moe_layer_terms(256, 64, 2, 8, "expert", 8, 2, imbalance=1.25, train=True)
    assert [(t.kind, t.count) for t in train] == [
        ("all-to-all", 2),
        ("all-to-all", 2),
        ("all-reduce", 1),
    ]
    assert train[0].payload_bytes == math.ceil(1.25 * 256 * 2) * 64 * 2
    assert train[2].payload_bytes == 64 * 8 * 2  # the router's gradient


def test_a_token_sent_once_to_each_device_of_its_experts_moves_fewer_rows():
    # Qwen3-30B-A3B's routing, 128 experts top-8, over 8 devices (16 experts each): a device
    # is missed by all 8 of a token's experts with probability C(112, 8) / C(128, 8)
    tokens, d = 4096, 2048
    share = 1 - math.comb(112, 8) / math.comb(128, 8)
    once = moe_layer_terms(tokens, d, 8, 128, "expert", 8, 2, once=True, train=True)
    per_expert = moe_layer_terms(tokens, d, 8, 128, "expert", 8, 2, train=True)
    rows = math.ceil(tokens * 8 * share)
    assert [t.payload_bytes for t in once[:2]] == [rows * d * 2, rows * d * 2]
    assert rows < tokens * 8 == per_expert[0].payload_bytes // (d * 2)
    # the slots' routing (an int32 row index, a bfloat16 weight) and the weights' gradient
    assert [(t.payload_bytes, t.count) for t in once[2:5]] == [
        (tokens * 8 * 4, 1),
        (tokens * 8 * 2, 1),
        (tokens * 8 * 2, 1),
    ]
    # one expert a device: a token's experts are on different devices, nothing is saved
    alone = moe_layer_terms(tokens, d, 8, 128, "expert", 128, 2, once=True)
    assert alone[0].payload_bytes == per_expert[0].payload_bytes
    with pytest.raises(ModelConfigError, match="experts=128 do not split over expert_devices=6"):
        moe_layer_terms(tokens, d, 8, 128, "expert", 6, 2, once=True)


def test_a_capacity_factor_at_or_below_zero_is_refused():
    for bad in (0, -1.0, "1.25", True):
        with pytest.raises(ModelConfigError, match="capacity_factor"):
            ModelConfig(experts=8, top_k=2, capacity_factor=bad)
    assert ModelConfig(experts=8, top_k=2, capacity_factor=1.25).capacity_factor == 1.25
    # the audited layer dispatches by capacity alone: no dropless form is offered for it
    from shardscope._src.verdict import moe_verdict

    for bad in (0, None):
        with pytest.raises(ModelConfigError, match="a number above 0") as info:
            moe_verdict("expert=8", capacity_factor=bad)
        assert "None" not in str(info.value).split(":", 1)[1]


def test_an_expert_mesh_smaller_than_the_devices_is_built_of_the_first_ones():
    from shardscope._src.verdict import moe_verdict

    report = moe_verdict("expert=4", tokens=512, d_model=64, ff=128, experts=8, top_k=2)
    # "expert=4" on the suite's 8 devices: 4 groups of 128 tokens, each sending its 2 x 128
    # slots to 8 experts (32 slots each) of 64 bfloat16 values; the forward's two
    # all-to-alls over 4 devices each send 3/16 of that payload
    payload = 4 * 8 * math.ceil(128 * 2 / 8) * 64 * 2
    assert report.audit.num_partitions == 4
    assert report.verdict.actual_bytes == 2 * (3 * payload // 16)


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_the_verdict_of_an_expert_parallel_layer_is_the_bound(mode):
    from shardscope._src.verdict import moe_verdict

    report = moe_verdict("expert=8", tokens=512, d_model=64, ff=128, experts=8, top_k=2, mode=mode)
    # every token's activations to its 2 experts, each expert's slots its even share:
    # 8 groups x 8 experts x (64 x 2 / 8) slots x 64 x 2 bytes, each way
    payload = 8 * 8 * (64 * 2 // 8) * 64 * 2
    passes = 2 if mode == "train" else 1
    sent = 7 * payload // 64  # an all-to-all over 8 devices sends (8 - 1) / 8**2 of it
    router = 2 * 7 * 64 * 8 * 2 // 8 if mode == "train" else 0  # its gradient's all-reduce
    assert report.verdict.bound_bytes == report.verdict.actual_bytes
    assert report.verdict.actual_bytes == 2 * passes * sent + router
    assert report.verdict.optimal and report.bound.notes == ()
    # by scope, each exchange under its own name, every piece of it (the CPU compiler sends
    # it as one operand a peer, and the buffer it sends is built outside the scope)
    phases = ("forward", "backward") if mode == "train" else ("forward",)
    rows = {(r.scope, r.kind): (r.count, r.phases) for r in report.audit.by_scope()}
    assert rows[("moe/dispatch", "all-to-all")] == (passes, phases)
    assert rows[("moe/combine", "all-to-all")] == (passes, phases)
    assert ("", "all-to-all") not in rows


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_a_capacity_padded_layer_sends_its_padding_beyond_the_bound_of_top_k_routing(mode):
    from shardscope._src.bounds.terms import BoundNote
    from shardscope._src.verdict import moe_verdict

    kw = dict(tokens=512, d_model=64, ff=128, experts=8, top_k=2, mode=mode)
    padded = moe_verdict("expert=8", capacity_factor=1.25, **kw)
    # the bound: top-k routing's 8 groups x 8 experts x (64 x 2 / 8) slots x 64 x 2 bytes;
    # the program pads each expert's slots to ceil(1.25 x 64 x 2 / 8) = 20 and sends them
    bound_payload = 8 * 8 * (64 * 2 // 8) * 64 * 2
    sent_payload = 8 * 8 * math.ceil(1.25 * 64 * 2 / 8) * 64 * 2
    passes = 2 if mode == "train" else 1
    router = 2 * 7 * 64 * 8 * 2 // 8 if mode == "train" else 0
    v = padded.verdict
    assert v.bound_bytes == 2 * passes * (7 * bound_payload // 64) + router
    assert v.actual_bytes == 2 * passes * (7 * sent_payload // 64) + router
    (row,) = [r for r in v.rows if r.kind == "all-to-all"]
    assert row.ratio == 1.25 and not v.optimal
    assert [n.kind for n in padded.bound.notes] == [BoundNote.CAPACITY_PADDED]
    assert "capacity factor 1.25 pads" in str(padded.bound.notes[0])
    assert "padding" in next(line for line in verdict_lines(v) if "capacity factor" in line)
    # at the bound of an unpadded layer: capacity factor 1 sends what its bound allows
    assert padded.bound.traffic_bytes == moe_verdict("expert=8", **kw).verdict.actual_bytes


def test_audit_moe_on_the_command_line(tmp_path, capsys):
    from helpers import assert_usage_error
    from shardscope._src.cli.main import main

    out = tmp_path / "moe.json"
    argv = ["audit", "moe", "--tokens", "512", "--d-model", "64", "--ff", "128"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "verdict: optimal" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["layer"]["experts"] == 8 and data["verdict"]["ratio"] == 1.0
    scopes = sorted(c["scope"] for c in data["collectives"])
    assert scopes == ["moe/combine", "moe/dispatch"]
    assert_usage_error(["audit", "moe", "--mesh", "data=8"], "'expert'", capsys)
    assert_usage_error([*argv, "--mesh", "model=8"], "'expert'", capsys)
    assert_usage_error([*argv, "--tokens", "100"], "--tokens 100", capsys)
    assert_usage_error([*argv, "--mesh", "data=2,expert=4", "--tokens", "36"], "8 devices", capsys)
    # each refusal names the flag the user gave, and offers only what the command can take
    line = assert_usage_error([*argv, "--top-k", "10"], "--top-k 10: ", capsys)
    assert "1 to --experts 8 experts" in line
    line = assert_usage_error([*argv, "--capacity-factor", "0"], "--capacity-factor 0: ", capsys)
    assert "None" not in line and "dropless" not in line
    once = [*argv, "--experts", "16", "--top-k", "4", "--mesh", "data=2,expert=4"]
    assert main([*once, "--dispatch-once"]) == 0
    assert "each token once a device" in capsys.readouterr().out
    assert main([*argv, "--weight-activations"]) == 0
    assert "router weights with the slots" in capsys.readouterr().out


def test_a_layer_sending_each_token_once_a_device_is_judged_by_that_bound():
    from shardscope._src.verdict import moe_verdict

    kw = dict(mesh="data=2,expert=4", tokens=1024, d_model=64, ff=128, experts=16, top_k=4)
    once = moe_verdict(**kw, dispatch_once=True).verdict
    per_expert = moe_verdict(**kw).verdict
    # per replica, 4 groups of 128 tokens send ceil(128 x (1 - C(12, 4) / C(16, 4))) rows to
    # each of the 4 devices (4 experts each), where once per expert they send 128 x 4 / 16
    # to each expert; the bound rounds up once, over the replica's 512 tokens
    share = 1 - math.comb(12, 4) / math.comb(16, 4)
    rows, bound_rows = 4 * 4 * math.ceil(128 * share), math.ceil(512 * 4 * share)
    # each slot's row index (int32) and router weight (bfloat16)
    routing = 4 * 16 * (128 * 4 // 16) * (4 + 2)
    sent = 3 * (2 * rows * 64 * 2 + routing) // 16  # an all-to-all over 4 sends 3 / 4**2
    assert once.actual_bytes == sent
    assert once.bound_bytes == 3 * (2 * bound_rows * 64 * 2 + routing) // 16
    assert per_expert.actual_bytes == 3 * 2 * 4 * 16 * (128 * 4 // 16) * 64 * 2 // 16
    assert once.actual_bytes < per_expert.actual_bytes


def test_a_layer_whose_experts_weight_their_activations_sends_the_weights_with_the_slots():
    from shardscope._src.verdict import moe_verdict

    kw = dict(mesh="expert=8", tokens=512, d_model=64, ff=128, experts=8, top_k=2)
    for impl in ("jit", "shard_map"):
        weighted = moe_verdict(**kw, impl=impl, weight_activations=True).verdict
        plain = moe_verdict(**kw, impl=impl).verdict
        # 8 groups of 64 tokens fill 64 x 2 / 8 = 16 slots of each of the 8 experts; each
        # slot's row goes out and back (bfloat16, d 64) and, weighted, its router weight
        # (bfloat16) goes out too; an all-to-all over 8 sends 7 / 8**2 of its bytes
        slots = 8 * 8 * (64 * 2 // 8)
        assert plain.actual_bytes == 7 * 2 * slots * 64 * 2 // 64
        assert weighted.actual_bytes == 7 * (2 * slots * 64 * 2 + slots * 2) // 64
        assert (weighted.bound_bytes, weighted.ratio) == (weighted.actual_bytes, 1.0)


def test_the_shard_map_twin_computes_the_jit_layer_with_two_explicit_all_to_alls():
    from jax.sharding import PartitionSpec as Spec

    from shardscope._src.model.moe import moe_capacity_local
    from shardscope._src.verdict import moe_verdict

    rng = np.random.default_rng(3)
    tokens, experts = 256, 8
    x = rng.standard_normal((tokens, D), dtype=np.float32)
    router = rng.standard_normal((D, experts), dtype=np.float32)
    w_in = rng.standard_normal((experts, D, 2, F), dtype=np.float32) / 4
    w_down = rng.standard_normal((experts, F, D), dtype=np.float32) / 5
    mesh = shardscope.make_mesh("expert=8", axis_types="auto")
    twin = jax.shard_map(
        lambda *a: moe_capacity_local(*a, K, 1.25, "expert"),
        mesh=mesh,
        in_specs=(Spec("expert"), Spec(), Spec("expert"), Spec("expert")),
        out_specs=Spec("expert"),
    )
    got = jax.jit(twin)(x, router, w_in, w_down)
    want, _ = moe_capacity(x, router, w_in, w_down, K, 1.25, groups=8)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    for mode in ("forward", "train"):
        jit = moe_verdict("expert=8", tokens=512, d_model=64, ff=128, mode=mode)
        explicit = moe_verdict(
            "expert=8", tokens=512, d_model=64, ff=128, mode=mode, impl="shard_map"
        )
        assert (
            explicit.verdict.optimal and explicit.verdict.actual_bytes == jit.verdict.actual_bytes
        )
        kinds = sorted(c.kind for c in explicit.audit.collectives)
        assert kinds == sorted(c.kind for c in jit.audit.collectives)


@pytest.mark.parametrize("impl", ["jit", "shard_map"])
def test_expert_times_data_parallelism_sums_the_experts_gradients_over_data(impl):
    from shardscope._src.verdict import moe_verdict

    tokens, d, f, experts = 512, 64, 128, 8
    forward = moe_verdict("data=2,expert=4", tokens=tokens, d_model=d, ff=f, impl=impl)
    train = moe_verdict("data=2,expert=4", tokens=tokens, d_model=d, ff=f, mode="train", impl=impl)
    # each replica's 256 tokens to their 2 experts, bfloat16, over the 4 devices of `expert`:
    # an all-to-all sends (4 - 1) / 4**2 of its array
    per = 3 * (tokens // 2 * 2 * d * 2) // 16
    assert forward.verdict.actual_bytes == forward.verdict.bound_bytes == 2 * per
    router = 2 * 7 * (d * experts * 2) // 8  # all-reduced over all 8 devices
    grads = 2 * 1 * (experts // 4 * 3 * d * f * 2) // 2  # each device's 2 experts, over data
    assert train.verdict.actual_bytes == train.verdict.bound_bytes == 4 * per + router + grads
    axes = sorted({tuple(c.axes) for c in train.audit.collectives})
    assert axes == [("data",), ("data", "expert"), ("expert",)]
