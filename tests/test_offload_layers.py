"""Megatron-Core's activation offloading by layer (``cpu_offloading_num_layers``,
Transformer Engine's ``get_cpu_offload_context``): what the first ``N`` layers keep for
their backward lives in host memory from their forward to their backward, copied over the
host link beside the compute; never the last layer, never with pipeline stages."""

import pytest

from shardscope import PlanError, PlanRequest
from shardscope._src.model.config import ModelConfig
from shardscope._src.plan.estimates import Schedule, estimate_memory
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.targets.hardware import hardware
from shardscope._src.train.candidates import estimate, screen_all
from shardscope._src.train.types import Candidate

LAYERS = 6
CONFIG = ModelConfig(
    d_model=64, heads=4, ff=256, layers=LAYERS, batch=64, seq=32, vocab=128, dtype="bfloat16"
)
MESH = (("data", 2),)


def _memory(layers: int, remat: str, offload_layers: int = 0):
    config = ModelConfig(
        d_model=64, heads=4, ff=256, layers=layers, batch=64, seq=32, vocab=128, dtype="bfloat16"
    )
    placement = get_strategy("dp").place(config, abstract_mesh("data=2"))
    schedule = Schedule(1, remat, offload_layers=offload_layers)
    return estimate_memory(placement, schedule=schedule)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_the_offloaded_layers_keep_their_activations_on_the_host(remat):
    n = 4
    # one layer's kept activations: what a model one layer deeper keeps more
    one_layer = _memory(LAYERS, remat).activations - _memory(LAYERS - 1, remat).activations
    before, after = _memory(LAYERS, remat), _memory(LAYERS, remat, offload_layers=n)
    assert before.activations - after.activations == n * one_layer
    assert after.host - before.host == n * one_layer
    if remat == "full":
        # full recomputation keeps each layer's input: 32 sequences of 32 tokens a device
        # (64 over data=2), 64 wide, 2 bytes
        assert one_layer == 32 * 32 * 64 * 2


def test_the_copies_are_priced_over_the_host_link():
    n = 3
    hw = hardware("h100")
    cand = Candidate("dp", MESH, microbatches=2, remat="full", offload_layers=n)
    s = estimate(cand, CONFIG, hw)
    # each micro-batch's n layer inputs (16 sequences of 32 tokens, 64 wide, 2 bytes) go
    # out in its forward and back in its backward
    per_pass = n * 16 * 32 * 64 * 2 / hw.host_bandwidth
    assert s.time.offload_s == pytest.approx(2 * 2 * per_pass, rel=1e-12)
    assert s.to_dict()["offload_layers"] == n
    assert "offload_layers" not in estimate(Candidate("dp", MESH), CONFIG, hw).to_dict()


@pytest.mark.parametrize(
    ("offload_layers", "stages", "match"),
    [
        (-1, None, r"offload_layers=-1: a count of layers cannot be negative"),
        (LAYERS, None, rf"offload_layers={LAYERS}: at most the {LAYERS - 1} layers before"),
        (2, 2, r"offload_layers=2 with 2 pipeline stages: .* give stages=1"),
    ],
    ids=["negative", "every-layer", "pipeline"],
)
def test_an_offload_the_run_cannot_take_is_refused_with_the_value(offload_layers, stages, match):
    with pytest.raises(PlanError, match=match):
        screen_all(
            CONFIG, 4, hardware("h100"), ["dp"], stages=stages, offload_layers=offload_layers
        )


def test_a_request_refuses_a_negative_count():
    with pytest.raises(PlanError, match=r"offload_layers=-2: a count of layers, 0 or more"):
        PlanRequest(model="tiny", devices=8, offload_layers=-2)
