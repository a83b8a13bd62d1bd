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

import shardscope
from helpers import assert_one_device_step, assert_usage_error, max_error, small_mixture
from shardscope import ModelConfigError, PlanRequest
from shardscope._src.cli.main import build_parser, command_config
from shardscope._src.model import transformer
from shardscope._src.model.moe import moe_capacity, moe_capacity_local, moe_dropless
from shardscope._src.sharding.programs import build_reference_program
from shardscope._src.train.candidates import estimate
from shardscope._src.train.sweep import resolve_config
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


def test_the_weights_travel_with_the_slots_to_their_experts_and_the_step_is_the_same():
    # expert parallelism under sequence parallelism unfolded: each device of 'model' routes
    # its slice of the sequence, the slots (and their weights) go over 'expert' and are
    # gathered over 'model'; nothing dropped, in slices or whole
    config = small_mixture(capacity_factor=8 / 2)
    weighted = replace(config, weight_activations=True)
    prog = build_reference_program("dp_ep_sp", weighted, "data=2,expert=2,model=2", mode="train")
    loss, grads = prog.fn(*prog.example_args())
    assert_one_device_step(loss, grads, config)


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
