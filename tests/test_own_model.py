"""A user's own model: Flax NNX and Equinox programs through audit, layout and abstract.

The programs live in tests/programs/ (a small Flax NNX train step with logical axis names,
and an Equinox train step with optax), written as a user would write them.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import program_module as load_program_module
from helpers import run_doc_example
from shardscope._src.audit.stages import lower_step


@pytest.fixture(scope="module")
def flax_mlp():
    return load_program_module("flax_mlp")


@pytest.fixture(scope="module")
def eqx_mlp():
    return load_program_module("eqx_mlp")


@pytest.fixture(scope="module")
def mesh():
    return shardscope.make_mesh("data=2,model=4", axis_types="auto")


def _flax_args(flax_mlp, mesh, rules):
    from flax import nnx

    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        return flax_mlp.make_step(mesh, rules)


# -- audit: any jit-like callable -----------------------------------------------------------


def test_flax_nnx_jit_its_lowered_and_compiled_audit_alike(flax_mlp, mesh):
    from flax import nnx

    rules = flax_mlp.RULES["dp_tp"]
    step, args = _flax_args(flax_mlp, mesh, rules)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        by_call = shardscope.audit(step, *args)
        lowered = step.lower(*args)
    assert type(lowered).__module__.startswith("flax")  # the library's own wrapper
    by_lowered = shardscope.audit(lowered)
    by_compiled = shardscope.audit(lowered.compile())
    # Data parallel over 'data' (gradients) and tensor parallel over 'model' (the MLP).
    axes = sorted({c.axes for c in by_call.collectives})
    assert axes == [("data",), ("model",)]
    for other in (by_lowered, by_compiled):
        assert other.counts() == by_call.counts()
        assert other.total() == by_call.total()


def test_equinox_filter_jit_on_abstract_arguments(eqx_mlp, mesh):
    with jax.set_mesh(mesh):
        step, args = eqx_mlp.make_step(mesh, eqx_mlp.RULES["dp_tp"])
        a = shardscope.audit(step, *args)  # equinox treats ShapeDtypeStruct as static
    assert {c.kind for c in a.collectives} == {"all-reduce"}
    assert sorted({c.axes for c in a.collectives}) == [("data",), ("model",)]
    assert a.memory is not None and a.flops is not None


def test_equinox_lowered_and_compiled_on_arrays():
    import equinox as eqx

    mesh = shardscope.make_mesh("data=8", axis_types="auto")
    data = NamedSharding(mesh, P("data"))
    model = eqx.filter_shard(
        eqx.nn.MLP(16, 16, 32, 1, key=jax.random.key(0)), NamedSharding(mesh, P())
    )

    @eqx.filter_jit
    def grads(model, x):
        x = eqx.filter_shard(x, data)
        return eqx.filter_grad(lambda m: jnp.mean(jax.vmap(m)(x) ** 2))(model)

    x = jax.device_put(jnp.ones((16, 16)), data)
    lowered = grads.lower(model, x)
    assert not isinstance(lowered, jax.stages.Lowered)  # equinox's own
    compiled = lowered.compile()
    audits = [shardscope.audit(grads, model, x), shardscope.audit(lowered)]
    audits.append(shardscope.audit(compiled))
    # The four parameter gradients, summed over 'data' in one combined all-reduce.
    for a in audits:
        assert a.counts()["all-reduce"] == 1
        (c,) = a.collectives
        assert c.axes == ("data",) and len(c.shapes) == 4
        assert c.payload_bytes == (16 * 32 + 32 + 32 * 16 + 16) * 4


def test_something_not_jit_like_is_refused():
    with pytest.raises(shardscope.ShardscopeError, match="jitted function.*got int"):
        shardscope.audit(42)


def test_a_bare_partition_spec_without_a_mesh_is_explained():
    mesh = shardscope.make_mesh("data=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P()))
    step = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P("data")))
    with pytest.raises(shardscope.MissingMeshError) as info:
        shardscope.audit(step, x)
    text = str(info.value)
    assert "mesh=" in text and "jax.set_mesh(mesh)" in text and "'data=8'" in text
    assert shardscope.audit(step, x, mesh=mesh).counts()["all-reduce"] == 0


def test_lower_step_gives_make_step_its_mesh_and_rules(flax_mlp, mesh):
    rules = flax_mlp.RULES["tp"]
    lowered = lower_step(flax_mlp.make_step, mesh, rules)
    a = shardscope.audit(lowered)
    assert {c.axes for c in a.collectives} == {("model",)}


@pytest.mark.parametrize(
    "returned, words",
    [
        (None, "returned NoneType; it must return a pair"),
        ((1, 2, 3), "tuple of 3 items"),
        ((jax.jit(lambda x: x), 5), "a tuple of the step's arguments"),
        ((5, ()), "int as the step"),
    ],
)
def test_make_step_must_return_step_and_args(mesh, returned, words):
    with pytest.raises(shardscope.ProgramError, match=words):
        lower_step(lambda mesh: returned, mesh)


# -- layouts of whole pytrees ---------------------------------------------------------------


def test_layout_of_a_flax_model_and_its_adam_state(flax_mlp, mesh):
    _, (model, optimizer, x, _) = _flax_args(flax_mlp, mesh, flax_mlp.RULES["dp_tp"])
    lay = shardscope.layout((model, optimizer))
    assert isinstance(lay, shardscope.TreeLayout)
    rows = {leaf.path: leaf for leaf in lay.leaves}
    up = rows["0.up.kernel"]  # a Flax variable is named without its ".value"
    assert up.shape == (64, 256) and up.spec_str == "P(None, 'model')"
    assert up.max_device_bytes == 64 * 256 * 4 // 4 and up.replication == 2
    assert rows["1.opt_state.0.mu.down.kernel"].spec_str == "P('model', None)"
    assert rows["1.opt_state.0.count"].replication == 8
    # Two kernels and their two Adam moments, each a quarter per device, plus two scalars.
    assert lay.max_device_bytes == lay.min_device_bytes == 6 * 64 * 256 + 4 + 4
    assert lay.nbytes == 6 * 64 * 256 * 4 + 8
    assert set(lay.device_bytes) == {d.id for d in mesh.devices.flat}
    assert lay.to_dict()["leaves"][0]["path"] == "0.down.kernel"


def test_layout_of_an_equinox_module_skips_its_functions(eqx_mlp, mesh):
    with jax.set_mesh(mesh):
        _, (model, opt_state, x, _) = eqx_mlp.make_step(mesh, eqx_mlp.RULES["dp"])
    lay = shardscope.layout(model)
    assert [leaf.path for leaf in lay.leaves] == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ]
    assert lay.other_leaves == 2  # the activation functions
    assert all(leaf.replication == 8 for leaf in lay.leaves)  # dp: replicated
    assert lay.max_device_bytes == (64 * 256 * 2 + 256 + 64) * 4
    assert shardscope.layout(opt_state).nbytes == 2 * lay.nbytes + 4  # m, v and the count


def test_layout_of_shape_dtype_structs_on_an_abstract_mesh():
    big = AbstractMesh((4, 16), ("data", "model"))
    tree = {
        "w": jax.ShapeDtypeStruct(
            (1024, 4096), jnp.bfloat16, sharding=NamedSharding(big, P(None, "model"))
        ),
        "b": jax.ShapeDtypeStruct((4096,), jnp.float32),
    }
    lay = shardscope.layout(tree)
    assert lay.mesh_axes == {"data": 4, "model": 16}
    assert lay["w"].max_device_bytes == 1024 * 4096 * 2 // 16 and lay["w"].replication == 4
    assert lay["b"].layout is None and lay["b"].spec_str == "unplaced"
    assert sorted(lay.device_bytes) == list(range(64))
    assert lay.max_device_bytes == 1024 * 256 * 2 + 4096 * 4


def test_layout_of_a_tree_without_arrays_is_refused():
    with pytest.raises(shardscope.ShardscopeError, match="a pytree holding arrays"):
        shardscope.layout({"f": print})
    with pytest.raises(shardscope.ShardscopeError, match="holds no arrays"):
        shardscope.tree_layout({"f": print})


def test_tree_layout_renders_paths_and_totals(mesh):
    import io

    from rich.console import Console

    tree = shardscope.abstract({"w": jnp.zeros((8, 8))}, P("data", "model"), mesh=mesh)
    console = Console(width=100, file=io.StringIO())
    console.print(shardscope.layout(tree))
    text = console.file.getvalue()
    assert "P('data', 'model')" in text and "total" in text and "32 B" in text


# -- abstract ---------------------------------------------------------------------------------


def test_abstract_keeps_structure_and_applies_specs(mesh):
    params = {"w": jnp.zeros((8, 4)), "b": np.zeros((4,), np.float32)}
    one = shardscope.abstract(params, P(), mesh=mesh)
    assert one["w"].sharding == NamedSharding(mesh, P()) and one["b"].shape == (4,)
    by_prefix = shardscope.abstract(params, {"w": P("data"), "b": None}, mesh=mesh)
    assert by_prefix["w"].sharding.spec == P("data") and by_prefix["b"].sharding is None
    by_path = shardscope.abstract(
        params, lambda path, x: P("model") if path == "b" else P(), mesh=mesh
    )
    assert by_path["b"].sharding.spec == P("model")
    with jax.set_mesh(mesh):  # the mesh of the context
        assert shardscope.abstract(params, P("data"))["w"].sharding.mesh == mesh
    kept = shardscope.abstract({"x": jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("data")))})
    assert kept["x"].sharding.spec == P("data")


@pytest.mark.parametrize(
    "shardings, words",
    [
        (P("data", "model", None), "v: PartitionSpec .* has 3 entries"),
        (P("pipe"), "names axis 'pipe'"),
        ({"w": P()}, "not shaped like the tree"),
        ("data", "give a jax.sharding.Sharding"),
    ],
)
def test_abstract_refuses_specs_that_do_not_fit(mesh, shardings, words):
    with pytest.raises(shardscope.LayoutError, match=words):
        shardscope.abstract({"w": jnp.zeros((8, 4)), "v": jnp.zeros(2)}, shardings, mesh=mesh)


def test_abstract_names_the_leaf_a_mesh_does_not_divide(mesh):
    with pytest.raises(shardscope.LayoutError, match="layers.0: dimension 0 of shape"):
        shardscope.abstract({"layers": [jnp.zeros((6, 4))]}, P("model"), mesh=mesh)


def test_a_partition_spec_needs_a_mesh():
    with pytest.raises(shardscope.LayoutError, match="no mesh is known; pass mesh="):
        shardscope.abstract({"w": jnp.zeros(8)}, P("data"))


def test_logical_to_spec_follows_flax_rules():
    rules = [("batch", "data"), ("embed", None), ("heads", ("model", "data"))]
    assert shardscope.logical_to_spec(("batch", "embed"), rules) == P("data", None)
    assert shardscope.logical_to_spec(("batch", "unknown", None), rules) == P("data", None, None)
    # A mesh axis already used by an earlier dimension is not used again.
    assert shardscope.logical_to_spec(("heads", "batch"), rules) == P(("model", "data"), None)
    assert shardscope.logical_to_spec(("batch",), {"batch": ["data"]}) == P("data")


@pytest.mark.parametrize(
    "rules, words",
    [
        ([("batch", 3)], "rule 'batch': mesh axes 3 must be a mesh axis name"),
        (["batch"], "rule 'batch' is not a pair"),
        ({"batch": [1, 2]}, r"rule 'batch': mesh axes \[1, 2\]"),
    ],
)
def test_logical_to_spec_refuses_a_rule_it_cannot_read(rules, words):
    with pytest.raises(shardscope.RulesError, match=words):
        shardscope.logical_to_spec(("batch",), rules)


def test_the_guides_flax_example_runs_as_written(tmp_path):
    out = run_doc_example("docs/guides/own_program.md", "## Your own model", tmp_path)
    max_bytes, all_reduces = out.split("\n")[0].split()
    # Two (64, 256) kernels and their Adam moments, a quarter per device, and two scalars.
    assert int(max_bytes) == 6 * 64 * 256 + 8 and int(all_reduces) == 2
    assert out.split("\n")[1].split()[0] in ("dp", "tp", "dp_tp")
    # suggest's best is no slower than the best of the hand-written rules, and its file reads
    own = out.split("\n")[1].split()[0]
    label, ratio = out.split("\n")[2].rsplit(" ", 1)
    assert label.startswith("suggested-1 ") and float(ratio) <= 1.0
    # where it is no faster either, the answer is to keep yours, and the file holds your set
    keep = out.split("\n")[3] == "True"
    assert keep == (float(ratio) == 1.0)
    rules = json.loads((tmp_path / "suggested-rules.json").read_text())
    assert rules["axes"] == ["data", "model"]
    assert list(rules["rules"]) == ([own] if keep else ["suggested"])
