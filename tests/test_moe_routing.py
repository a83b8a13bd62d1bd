"""A dropless mixture's routing beyond its matmuls: the router's scores, the permutation of
each token's top_k copies into expert order and back (and the sort of the chunks an expert
axis delivers), each pass, and the host's wait for the tokens' counts on a GPU; a dense
model and a capacity-padded mixture pay none of it."""

from dataclasses import replace

import pytest

from shardscope._src.base.errors import ModelConfigError
from shardscope._src.cost.routing import HOST_SYNC_S
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import expert_routing
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate
from shardscope._src.train.types import Candidate

# 64 experts of 2 a token; 32 sequences of 256 tokens over 8 devices: 1,024 tokens a device
MOE = ModelConfig(
    d_model=512, heads=8, kv_heads=4, ff=1024, layers=2, batch=32, seq=256, vocab=None,
    mlp="swiglu", experts=64, top_k=2, expert_ff=768, dtype="bfloat16",
)  # fmt: skip
DENSE = replace(MOE, experts=0, top_k=0, expert_ff=None)
ROW = 512 * 2  # a token's row of d_model at 2 bytes
TOKENS, SLOTS = 1024, 1024 * 2


@pytest.mark.parametrize(
    "strategy, mesh, sorted_rows",
    [
        ("fsdp", "data=8", 0),  # every expert on each device: the permutation orders them
        ("ep", "expert=8", SLOTS),  # 8 experts a device: each device's chunk sorted by expert
    ],
    ids=["fsdp-8", "ep-8"],
)
def test_each_pass_moves_every_token_and_its_top_k_copies(strategy, mesh, sorted_rows):
    r = expert_routing(get_strategy(strategy).place(MOE, abstract_mesh(mesh)))
    # permute: each token read once, its 2 copies written; un-permute: the copies read,
    # the token written; sort and unsort: each slot read and written
    rows = (TOKENS + SLOTS) + (SLOTS + TOKENS) + 2 * 2 * sorted_rows
    # the kept activations already write the experts' input once and read the weighted
    # outputs once (and the router's logits): those moves are theirs
    kept = SLOTS + SLOTS
    # the router: float32 probabilities and a byte map out, per expert
    assert r.forward_bytes() == (rows - kept) * ROW + TOKENS * 64 * (4 + 1)
    # backward: the same moves for the gradients, the weighted outputs read again for the
    # router weights' gradient; the router's: probabilities and their gradient in
    assert r.backward_bytes() == (rows + SLOTS - kept) * ROW + TOKENS * 64 * (4 + 4)


def test_dispatched_once_the_receiver_permutes_the_rows_it_received():
    once = replace(MOE, dispatch_once=True)
    r = expert_routing(get_strategy("ep").place(once, abstract_mesh("expert=8")))
    # a token reaches a device unless neither of its 2 experts is among the device's 8:
    # 1 - C(56, 2) / C(64, 2) of the tokens, from each of the 8 devices
    received = 8 * TOKENS * (1 - (56 * 55) / (64 * 63))
    assert r.tokens == pytest.approx(received, rel=1e-12)
    # the experts' input written is a kept activation's; no weighted output is kept
    assert r.forward_bytes() == pytest.approx(
        (2 * (received + SLOTS) - SLOTS) * ROW + TOKENS * 64 * 5, rel=1e-12
    )
    # the router weights scale the activations: no output read again in the backward
    assert r.backward_bytes() == pytest.approx(
        (2 * (received + SLOTS) - SLOTS) * ROW + TOKENS * 64 * 8, rel=1e-12
    )


def test_experts_that_weight_their_activations_keep_and_reread_no_output():
    # Megatron-Core's grouped experts scale each slot's activation by its router weight
    # (sent once per expert, as its all-to-all dispatcher sends): no weighted output is kept
    # for the backward, and none is read again for the router weights' gradient
    from shardscope._src.plan.estimates import moe_activation_bytes_per_layer

    ep = get_strategy("ep")
    mesh = abstract_mesh("expert=8")
    per_output = ep.place(MOE, mesh)
    per_activation = ep.place(replace(MOE, weight_activations=True), mesh)
    # 4 sequences of 256 tokens a device, 2 slots a token, each a row of d_model at 2 bytes
    kept = moe_activation_bytes_per_layer(per_output, b=4)
    assert kept - moe_activation_bytes_per_layer(per_activation, b=4) == 4 * 256 * 2 * ROW
    r, w = expert_routing(per_output), expert_routing(per_activation)
    # the routing's moves as sent once per expert; the un-permutation's read of the outputs
    # is the routing's own, no kept activation's, and the backward's, no longer reading
    # them for the weights' gradient, reads as much as before
    assert (w.tokens, w.slots, w.sorted) == (r.tokens, r.slots, r.sorted) == (1024, 2048, 2048)
    assert w.forward_bytes() - r.forward_bytes() == SLOTS * ROW
    assert w.backward_bytes() == r.backward_bytes()
    with pytest.raises(ModelConfigError, match="weight_activations=True: this model has no"):
        replace(DENSE, weight_activations=True)


@pytest.mark.parametrize("remat, forwards", [("none", 1), ("full", 2)], ids=["none", "full"])
def test_a_mixtures_step_pays_its_routing_each_pass(remat, forwards):
    c = Candidate("ep", (("expert", 8),), microbatches=2, remat=remat)
    h100 = hardware("h100")
    t = estimate(c, MOE, h100).time
    r = expert_routing(get_strategy("ep").place(MOE, abstract_mesh("expert=8")), 2)
    # every layer, every micro-batch: its forwards' and backward's bytes at the bandwidth,
    # and one wait of the host a layer for each forward (the recomputed one too)
    per_microbatch = MOE.layers * (forwards * r.forward_bytes() + r.backward_bytes())
    waits = 2 * MOE.layers * forwards
    assert t.routing_s == pytest.approx(
        2 * per_microbatch / h100.hbm_bandwidth + waits * HOST_SYNC_S, rel=1e-12
    )
    # on a TPU (a compiled program of static shapes) the bytes alone
    v5p = hardware("tpu-v5p")
    on_tpu = estimate(c, MOE, v5p).time.routing_s
    assert on_tpu == pytest.approx(2 * per_microbatch / v5p.hbm_bandwidth, rel=1e-12)


def test_the_routing_is_on_the_critical_path():
    c = Candidate("ep", (("expert", 8),), microbatches=2, remat="full")
    t = estimate(c, MOE, "h100").time
    # no collective or memory-bound matmul hides it: the step is that much longer than
    # the same step with a capacity (no routing priced) and the same slots
    padded = estimate(c, replace(MOE, capacity_factor=1.0), "h100").time
    assert padded.routing_s == 0.0
    assert t.step_s - padded.step_s == pytest.approx(t.routing_s, rel=1e-9)


def test_a_dense_step_pays_no_routing():
    for strategy, mesh in (("fsdp", (("data", 8),)), ("tp", (("data", 2), ("model", 4)))):
        t = estimate(Candidate(strategy, mesh, remat="full"), DENSE, "h100").time
        assert t.routing_s == 0.0
    assert expert_routing(get_strategy("fsdp").place(DENSE, abstract_mesh("data=8"))) is None


def test_a_group_limited_router_keeps_each_token_in_its_groups():
    # 16 experts in 4 groups of 4, a token's 3 from 2 of them: on random logits no token's
    # experts span more than 2 groups, and many span 2 (unlimited, most would span 3)
    import jax
    import numpy as np

    from shardscope._src.model.moe import route

    logits = jax.random.normal(jax.random.key(0), (4096, 16))
    eye = np.eye(16, dtype=np.float32)
    spans = [len(set(row // 4)) for row in np.asarray(route(logits, eye, 3, group_limit=(4, 2))[1])]
    assert max(spans) == 2 and spans.count(2) > len(spans) // 2
    unlimited = [len(set(row // 4)) for row in np.asarray(route(logits, eye, 3)[1])]
    assert unlimited.count(3) > len(unlimited) // 4


@pytest.mark.parametrize("devices", [16, 8, 4, 2, 3])
def test_the_share_of_tokens_a_device_receives_within_a_group_limit(devices):
    # device_share's model of a group-limited routing: a token's 2 groups any 2 of the 4
    # alike, its 3 experts any 3 of their 8 alike; counted over draws of that model, a
    # device's share of the tokens (a device of 1, 2, 4 or 8 experts in order, or over 3
    # devices of 5, which lie across groups: 15 of the 16 experts placed)
    import numpy as np

    from shardscope._src.model.moe import device_share

    rng = np.random.default_rng(0)
    experts, top_k, groups, chosen, n = 16, 3, 4, 2, 40000
    picked_groups = np.argsort(rng.random((n, groups)), axis=1)[:, :chosen]
    pool = (picked_groups[:, :, None] * 4 + np.arange(4)).reshape(n, chosen * 4)
    order = np.argsort(rng.random((n, chosen * 4)), axis=1)[:, :top_k]
    picked = np.take_along_axis(pool, order, axis=1)
    local = experts // devices
    hit = [len({e // local for e in row if e < local * devices}) for row in picked]
    counted = sum(hit) / (n * devices)
    assert device_share(experts, devices, top_k, (groups, chosen)) == pytest.approx(
        counted, abs=0.01
    )
    if devices == 8:  # by hand: the device's group chosen with probability 1/2, and then
        # 1 - C(8 - 2, 3) / C(8, 3) of the tokens reach its 2 experts
        assert device_share(experts, 8, top_k, (4, 2)) == pytest.approx(0.5 * (1 - 20 / 56))
