"""A mixture whose experts weight their activations (``weight_activations``: each slot's router
weight goes to its expert with the slot and scales its activation before the down-projection,
and the outputs are summed unweighted, as Megatron-Core's grouped experts do under its
all-to-all dispatcher): the same step as a combine that weights the outputs, whose backward
keeps the outputs; this one keeps none."""

import contextlib
import io
import json
from collections import Counter
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console

import shardscope
from helpers import assert_one_device_step, assert_usage_error, max_error, small_mixture
from shardscope import ModelConfigError, PlanRequest
from shardscope._src.base.comm import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER, traffic_bytes
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.cost.links import collective_seconds
from shardscope._src.model import transformer
from shardscope._src.model.moe import moe_capacity, moe_capacity_local, moe_dropless
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.estimates import Schedule
from shardscope._src.render.serve import render_serve
from shardscope._src.serve.estimate import estimate_plan
from shardscope._src.serve.types import Layout, ServeLayout
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.sharding.strategies import abstract_mesh, get_strategy
from shardscope._src.train.candidates import estimate
from shardscope._src.train.sweep import resolve_config
from shardscope._src.train.timing import step_bound
from shardscope._src.train.types import Candidate

#: 8 SwiGLU experts of 256, 2 a token; one sequence of 512 tokens, d 128, in bfloat16.
RESIDUALS = small_mixture(
    d_model=128, heads=2, ff=384, seq=512, batch=1, vocab=None, dtype="bfloat16",
    expert_ff=256, shared_experts=0,
)  # fmt: skip


def _saved(fn, *args):
    """The shapes (and dtypes) of what ``fn`` keeps for the backward of ``args``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    return [line.split(" ")[0] for line in out.getvalue().splitlines()]


def _residual_shapes(config):
    """The shapes (and dtypes) of what one layer with experts keeps for the backward."""
    layer = jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape[1:], w.dtype),
        transformer.abstract_params(config)["moe_layers"],
    )
    x = jax.ShapeDtypeStruct((1, config.seq, config.d_model), config.dtype)
    return _saved(lambda p, x: transformer.moe_layer(p, x, config), layer, x)


@pytest.mark.parametrize(
    "capacity_factor, gone, added",
    [
        # 8 experts x 128 slots (512 tokens x 2 / 8, capacity 1) of one group: their outputs
        # gone, each slot's weight kept for its activation's backward
        (1.0, ["bf16[1,1024,128]"], ["bf16[8,128]"]),
        # dropless, the 1,024 rows in expert order: their outputs and their weights as the
        # combine took them gone, each row's weight kept for its activation's backward
        (None, ["bf16[1024,128]", "bf16[1024,1]"], ["bf16[1024]"]),
    ],
    ids=["capacity", "dropless"],
)
def test_weighting_the_activations_keeps_no_expert_output(capacity_factor, gone, added):
    config = replace(RESIDUALS, capacity_factor=capacity_factor)
    outputs = Counter(_residual_shapes(config))
    activations = Counter(_residual_shapes(replace(config, weight_activations=True)))
    assert outputs - activations == Counter(gone)
    assert activations - outputs == Counter(added)


def test_the_twins_experts_weighting_their_activations_keep_no_output():
    # the shard_map twin over expert=8, as the strategies call it: each device routes its
    # 512 tokens as one group into 8 experts x 128 slots (capacity 1), sends them to their
    # experts and takes the outputs back; what its body keeps, traced where its axis is bound
    mesh = jax.make_mesh((8,), ("expert",))
    specs = (P("expert"), P(), P("expert"), P("expert"))
    shapes = ((8 * 512, 128), (128, 8), (8, 128, 2, 256), (8, 256, 128))
    args = [
        jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
        for shape, spec in zip(shapes, specs, strict=True)
    ]

    def kept(weighted):
        saved = []

        def body(*a):
            def twin(*a):
                return moe_capacity_local(*a, 2, 1.0, "expert", weight_activations=weighted)

            saved.extend(shape.split("{")[0] for shape in _saved(twin, *a))
            return twin(*a)

        jax.eval_shape(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs[0]), *args)
        return Counter(saved)

    outputs, activations = kept(False), kept(True)
    # the group's 8 x 128 slot outputs, back from their experts, gone; the weights of the
    # device's one expert's 128 slots from each of the 8 devices kept for its activation's
    # backward
    assert outputs - activations == Counter([f"bf16[1,{8 * 128},128]"])
    assert activations - outputs == Counter([f"bf16[1,{8 * 128}]"])


@pytest.mark.parametrize("capacity_factor", [1.0, None], ids=["capacity", "dropless"])
def test_the_layers_output_and_gradients_are_the_same_whichever_is_weighted(capacity_factor):
    # 64 tokens, 4 SwiGLU experts of 24, 2 a token; capacity-padded in 4 groups, 2 slices
    # of 2 sequences (the slices' groups reordered on their way to the experts and back),
    # at capacity 1 some dropped, the same either way
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (64, 16))
    router = jax.random.normal(keys[1], (16, 4))
    w_in = jax.random.normal(keys[2], (4, 16, 2, 24)) / 4
    w_down = jax.random.normal(keys[3], (4, 24, 16)) / 5

    def layer(weighted):
        def loss(*args):
            if capacity_factor is None:
                y = moe_dropless(*args, 2, weight_activations=weighted)
            else:
                y, _ = moe_capacity(
                    *args, 2, capacity_factor, groups=4, slices=2, weight_activations=weighted
                )
            return jnp.sum(jnp.sin(y)), y

        grad = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
        return jax.jit(grad)(x, router, w_in, w_down)

    (grads, y), (want_grads, want_y) = layer(True), layer(False)
    assert float(jnp.max(jnp.abs(want_y))) > 0.1  # the experts' outputs are not nothing
    assert max_error(y, want_y) < 1e-5
    assert max_error(grads, want_grads) < 1e-5


#: Expert parallelism under sequence parallelism unfolded: each device of 'model' routes its
#: slice of the sequence, the slots (and their weights) go over 'expert' and are gathered
#: over 'model'; nothing dropped, in slices or whole (capacity 8 / 2).
SP_MESH = "data=2,expert=2,model=2"
SP_CONFIG = small_mixture(capacity_factor=8 / 2)


@pytest.fixture(scope="module")
def sp_weighted():
    """The jit program of ``dp_ep_sp`` whose experts weight their activations."""
    weighted = replace(SP_CONFIG, weight_activations=True)
    return build_reference_program("dp_ep_sp", weighted, SP_MESH, mode="train")


def _moved(items, kinds):
    """``(count, bytes)`` of each ``(kind, axes, scope)`` of the dispatch and combine among
    ``items`` (collectives or a bound's terms: counts times payloads), of ``kinds``."""
    out = {}
    for c in items:
        if c.kind in kinds and c.scope in ("moe/dispatch", "moe/combine"):
            key = (c.kind, c.axes, c.scope)
            count, sent = out.get(key, (0, 0))
            out[key] = (count + c.count, sent + c.count * c.payload_bytes)
    return out


def test_the_weights_travel_with_the_slots_to_their_experts_and_the_step_is_the_same(
    sp_weighted,
):
    loss, grads = sp_weighted.fn(*sp_weighted.example_args())
    assert_one_device_step(loss, grads, SP_CONFIG)


def test_the_twin_sends_the_weights_with_the_slots_as_the_jit_program_and_the_bound_do(
    sp_weighted,
):
    weighted = replace(SP_CONFIG, weight_activations=True)
    twin = build_reference_program("dp_ep_sp", weighted, SP_MESH, mode="train", impl="shard_map")
    loss, grads = twin.fn(*twin.example_args())
    assert_one_device_step(loss, grads, SP_CONFIG)
    # an all-to-all over 'expert' (at one data and model rank) moves its 2 devices' slices,
    # each of 2 sequences' 16 tokens / model 2, x top-2 at capacity 4: d_model 64 float32
    # rows and one float32 weight each, there and back (the weights' gradient back in the
    # backward); a device's slots and their weights gathered over 'model' (its 2 sequences'
    # 16 tokens x top-2 x 4) in the dispatch (the gather's backward a reduce-scatter), the
    # outputs' partial sums scattered in the combine; the weights a collective of their
    # own each way, as Megatron-Core's dispatcher sends the probabilities beside the tokens
    a2a = 2 * (2 * 16 // 2) * 2 * 4
    gathered = 2 * 16 * 2 * 4
    want = {
        (ALL_TO_ALL, ("expert",), "moe/dispatch"): (4, 2 * (a2a * 64 * 4 + a2a * 4)),
        (ALL_TO_ALL, ("expert",), "moe/combine"): (2, 2 * a2a * 64 * 4),
        **{(k, ("model",), "moe/dispatch"): (2, gathered * 64 * 4 + gathered * 4)
           for k in (ALL_GATHER, REDUCE_SCATTER)},
        **{(k, ("model",), "moe/combine"): (1, gathered * 64 * 4)
           for k in (ALL_GATHER, REDUCE_SCATTER)},
    }  # fmt: skip
    kinds = (ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER)
    assert _moved(shardscope.audit(twin).collectives, kinds) == want
    for prog in (twin, sp_weighted):
        assert _moved(shardscope.transformer_bound(prog.placement, "train").terms, kinds) == want
    # the jit program's the same, but for its reduce-scatters, which XLA's CPU compiler
    # emulates with all-reduces
    assert _moved(shardscope.audit(sp_weighted).collectives, kinds[:2]) == {
        k: v for k, v in want.items() if k[0] != REDUCE_SCATTER
    }


def test_a_step_prices_the_weights_sent_with_the_slots_each_micro_batch():
    # ep over expert=8, 2 layers with experts, 2 micro-batches of 8 sequences of 16 tokens:
    # each slot's float32 router weight goes with it (capacity 1, top-2: the micro-batch's
    # 8 x 16 x 2 slots), and its gradient comes back in the backward
    config = small_mixture(layers=2, batch=16)
    ep, mesh = get_strategy("ep"), abstract_mesh("expert=8")

    def sent(c):
        bound = step_bound(ep.place(c, mesh), Schedule(microbatches=2))
        return sum(t.count * t.payload_bytes for t in bound.terms if t.kind == ALL_TO_ALL)

    extra = sent(replace(config, weight_activations=True)) - sent(config)
    assert extra == 2 * 2 * 2 * (16 // 2 * 16 * 2) * 4


def test_serving_prices_the_weights_sent_with_each_steps_slots():
    # Mixtral 8x7B decoding 64 sequences over expert=8 on H100s: each of its 32 layers'
    # dispatch sends the 64 tokens' 2 slots' bfloat16 router weights with them, one
    # all-to-all more a layer, forward only
    config = model_preset("mixtral-8x7b").config(batch=1)
    layout = Layout(ServeLayout.EP_TP, 1, 8)
    h100 = shardscope.hardware("h100")

    def comm_s(c):
        plan = estimate_plan(c, h100, layout, 64, 64, 80, "bfloat16", "bfloat16")
        return plan.decode_comm_s

    weights = collective_seconds(
        h100, layout.mesh.sizes, ALL_TO_ALL, ("expert",), 8,
        32 * traffic_bytes(ALL_TO_ALL, 64 * 2 * 2, 8), 32,
    )  # fmt: skip
    extra = comm_s(replace(config, weight_activations=True)) - comm_s(config)
    assert weights > 0
    assert extra == pytest.approx(weights, rel=1e-9)


def _config(*flags):
    """The model ``shardscope plan`` plans with ``flags``: Mixtral 8x7B, 8 sequences of 512
    on 8 devices."""
    argv = ["plan", "--model", "mixtral-8x7b", "--devices", "8", "--batch", "8", "--seq", "512"]
    return resolve_config(command_config(build_parser().parse_args([*argv, *flags])).request())[1]


def test_the_command_line_asks_a_mixture_to_weight_its_activations_and_the_plan_keeps_less():
    given = {flags: _config(*flags) for flags in ((), ("--weight-activations",))}
    assert _config("--no-weight-activations").weight_activations is False
    assert [c.weight_activations for c in given.values()] == [False, True]
    ep = Candidate("ep", (("expert", 8),), microbatches=1, remat="none")
    kept = [estimate(ep, c, "h100").memory.activations for c in given.values()]
    # each of the 32 layers keeps no output of its 512 tokens' 2 experts, a row of 4096 in
    # bfloat16 each
    assert kept[0] - kept[1] == 32 * 512 * 2 * 4096 * 2


def test_a_plan_records_that_its_experts_weight_their_activations():
    config = small_mixture(layers=1, shared_experts=0)
    kw = dict(compiler="cpu", compile_top=0, strategies=["ep"], mesh="expert=8", workers=0)
    result = shardscope.plan(config, 8, microbatches=1, remat="none", weight_activations=True, **kw)
    assert json.loads(json.dumps(result.to_dict()))["settings"]["weight_activations"] is True
    assert result.config.weight_activations


def test_a_dense_model_cannot_weight_its_experts_activations(capsys):
    for command in (["plan"], ["serve", "--prompt", "64", "--output", "16"]):
        argv = [*command, "--model", "tiny", "--devices", "8", "--weight-activations"]
        assert_usage_error(argv, "weight_activations=True: this model has no experts", capsys)
    with pytest.raises(ModelConfigError, match="weight_activations='yes': give True or False"):
        resolve_config(PlanRequest("mixtral-8x7b", 8, weight_activations="yes"))


def test_a_serving_result_records_that_its_experts_weight_their_activations():
    # the serving estimate prices the weights sent with the slots (above), so its result says
    # it asked for them, reads back with it, and its table's title says so
    config = small_mixture(layers=1, shared_experts=0)
    kw = dict(prompt=16, output=4, compiler="cpu")
    weighted, plain = (
        shardscope.serve(config, 8, weight_activations=flag, **kw) for flag in (True, False)
    )
    assert (weighted.weight_activations, plain.weight_activations) == (True, False)
    data = json.loads(json.dumps(weighted.to_dict()))
    assert data["weight_activations"] is True
    assert shardscope.ServeResult.from_dict(data).weight_activations is True
    said = "each slot's router weight sent with it to its expert"
    titles = []
    for result in (weighted, plain):
        out = io.StringIO()
        Console(file=out, width=400).print(render_serve(result))
        titles.append(said in " ".join(out.getvalue().split()))
    assert titles == [True, False]
