"""A mixture whose experts weight their activations (``weight_activations``: each slot's router
weight goes to its expert with the slot and scales its activation before the down-projection,
and the outputs are summed unweighted, as Megatron-Core's grouped experts do under its
all-to-all dispatcher): the same step as a combine that weights the outputs, whose backward
keeps the outputs; this one keeps none."""

import contextlib
import io
from collections import Counter
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import print_saved_residuals

from helpers import assert_one_device_step, max_error, small_mixture
from shardscope._src.model import transformer
from shardscope._src.model.moe import moe_capacity, moe_dropless
from shardscope._src.sharding.programs import build_reference_program

#: 8 SwiGLU experts of 256, 2 a token; one sequence of 512 tokens, d 128, in bfloat16.
RESIDUALS = small_mixture(
    d_model=128, heads=2, ff=384, seq=512, batch=1, vocab=None, dtype="bfloat16",
    expert_ff=256, shared_experts=0,
)  # fmt: skip


def _residual_shapes(config):
    """The shapes (and dtypes) of what one layer with experts keeps for the backward."""
    layer = jax.tree.map(
        lambda w: jax.ShapeDtypeStruct(w.shape[1:], w.dtype),
        transformer.abstract_params(config)["moe_layers"],
    )
    x = jax.ShapeDtypeStruct((1, config.seq, config.d_model), config.dtype)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(lambda p, x: transformer.moe_layer(p, x, config), layer, x)
    return [line.split(" ")[0] for line in out.getvalue().splitlines()]


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
