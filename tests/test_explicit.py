"""Programs written the way JAX is written today: Explicit mesh axes (sharding in types), a
``make_step`` that returns its own Lowered or Compiled, the context ``make_step`` runs in, Linen
and NNX programs as their projects write them, PRNG keys in layouts, and meshes of a target's
devices taken from the arguments."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, reshard
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import PROGRAMS, assert_usage_error, run_doc_example
from helpers import program_module as load_program_module
from shardscope._src.cli.main import main

LLAMA = f"{PROGRAMS / 'explicit_llama.py'}:make_step"


@pytest.fixture(scope="module")
def llama():
    return load_program_module("explicit_llama")


def _line(module, words):
    """``file:line`` of the first line of ``module``'s source holding ``words``."""
    path = Path(module.__file__)
    for i, text in enumerate(path.read_text().splitlines(), start=1):
        if words in text:
            return f"{path}:{i}"
    raise AssertionError(f"{words!r} is not in {path}")


# -- an explicit-axis Llama-like model ------------------------------------------------------


def test_an_explicit_axis_model_is_audited_under_jax_make_mesh(llama):
    mesh = jax.make_mesh((2, 4), ("data", "model"))  # Explicit: JAX's default
    step, args = llama.make_step(mesh)
    with jax.set_mesh(mesh):
        a = shardscope.audit(step, *args)
    forward = {c.user_source: c for c in a.collectives if c.phase == "forward"}
    # The attention output and the MLP's down projection sum over 'model' once a layer, each
    # on this device's half of the batch: (8 / 2) x 16 x 64 f32.
    for words in ("attn_out", 'w["w2"]'):
        c = forward[_line(llama, words)]
        assert (c.kind, c.axes, c.count) == ("all-reduce", ("model",), llama.LAYERS)
        assert c.payload_bytes == (llama.BATCH // 2) * llama.SEQ * llama.D * 4


def test_an_explicit_axis_model_is_planned_with_the_default_axis_types(llama):
    meshes = ["data=2,model=4", "data=4,model=2"]
    r = shardscope.plan_program(llama.make_step, 8, axes=("data", "model"), meshes=meshes)
    assert r.axis_types == "explicit" and not r.skipped
    assert sorted(p.mesh_spec for p in r.plans) == sorted(meshes)
    assert all(p.collectives for p in r.plans)
    for p in r.plans:
        # the CPU compiler's memory holds the arguments and the temporaries (its own
        # peak_memory_in_bytes counts the arguments and outputs alone)
        m = p.compiled_memory
        held = m["argument_size_in_bytes"] + m["temp_size_in_bytes"] - m["alias_size_in_bytes"]
        assert m["temp_size_in_bytes"] > 0 and p.memory_bytes_per_device >= held


def test_auto_axes_for_an_explicit_program_name_the_fix(llama):
    with pytest.raises(shardscope.AxisTypeError, match="axis_types='explicit'") as info:
        shardscope.plan_program(
            llama.make_step, 8, axes=("data", "model"), meshes=["data=2,model=4"], axis_types="auto"
        )
    assert info.value.params == ("axis_types",)
    assert "has Auto axes" in str(info.value)


def test_explicit_axes_for_an_auto_program_name_the_fix():
    def make_step(mesh):
        x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P()))
        step = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P("data")))
        return step, (x,)

    with pytest.raises(shardscope.AxisTypeError, match="axis_types='auto'"):
        shardscope.audit_program(make_step, "data=8")
    a = shardscope.audit_program(make_step, "data=8", axis_types="auto")
    assert a.mesh_axes == {"data": 8}


def test_the_command_line_takes_axis_types(llama, tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--program", LLAMA, "--devices", "8", "--axes", "data,model"]
    code = main([*argv, "--meshes", "data=2,model=4", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["axis_types"] == "explicit" and len(data["plans"]) == 1
    capsys.readouterr()
    assert main(["audit", LLAMA, "--mesh", "data=2,model=4", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["all-reduce"] > 0
    line = assert_usage_error(
        ["audit", LLAMA, "--mesh", "data=2,model=4", "--axis-types", "auto"], "explicit", capsys
    )
    assert "--axis-types" in line
    assert_usage_error(
        ["audit", LLAMA, "--mesh", "data=8", "--axis-types", "manual"], "invalid choice", capsys
    )
    assert_usage_error(
        ["plan", "--model", "tiny", "--devices", "8", "--axis-types", "auto"],
        "--axis-types plan your own program",
        capsys,
    )


def test_reshard_and_auto_axes_inside_an_explicit_program():
    def make_step(mesh):
        x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))

        @jax.jit
        def step(x):
            y = reshard(x, P(None, "data"))  # an all-to-all moves the rows into columns
            z = jax.sharding.auto_axes(lambda y: y * 2, out_sharding=P(None, "data"))(y)
            return z.sum(0)

        return step, (x,)

    a = shardscope.audit_program(make_step, "data=8")
    assert [(c.kind, c.axes) for c in a.collectives if c.kind == "all-to-all"] == [
        ("all-to-all", ("data",))
    ]
    (a2a,) = [c for c in a.collectives if c.kind == "all-to-all"]
    assert a2a.payload_bytes == 16 * 64 * 4  # the whole array changes hands


# -- make_step's own stages and its context -------------------------------------------------


@pytest.mark.parametrize("stage", ["pair", "lowered", "compiled"])
def test_make_step_may_return_its_lowered_or_compiled(llama, stage):
    def make_step(mesh):
        step, args = llama.make_step(mesh)
        if stage == "pair":
            return step, args
        with jax.set_mesh(mesh):
            lowered = step.lower(*args)
        return lowered if stage == "lowered" else lowered.compile()

    r = shardscope.plan_program(make_step, 8, axes=("data", "model"), meshes=["data=2,model=4"])
    (p,) = r.plans
    pair = shardscope.plan_program(
        llama.make_step, 8, axes=("data", "model"), meshes=["data=2,model=4"]
    )
    assert p.comm_bytes_per_device == pair.plans[0].comm_bytes_per_device


def test_make_step_runs_without_a_mesh_and_its_step_with_one():
    seen = {}

    def make_step(mesh):
        seen["make_step"] = jax.sharding.get_abstract_mesh().empty
        x = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(mesh, P("data")))

        @jax.jit
        def step(x):
            seen["step"] = dict(jax.sharding.get_abstract_mesh().shape)
            return reshard(x, P())  # a bare spec: the mesh set around the lowering names it

        return step, (x,)

    a = shardscope.audit_program(make_step, "data=8")
    assert seen == {"make_step": True, "step": {"data": 8}}
    assert a.counts()["all-gather"] == 1


def test_a_make_step_that_needs_a_mesh_set_is_told_how():
    def make_step(mesh):
        x = jax.device_put(jnp.zeros(16), P("data"))  # a bare spec needs a mesh set
        return jax.jit(lambda x: x), (x,)

    with pytest.raises(shardscope.MissingMeshError, match=r"with jax.set_mesh\(mesh\):"):
        shardscope.audit_program(make_step, "data=8")


def test_a_make_step_for_other_devices_is_refused():
    cpu = shardscope.make_mesh("data=8")

    def make_step(mesh):
        x = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(cpu, P("data")))
        return jax.jit(lambda x: x * 2).lower(x)

    with pytest.raises(shardscope.ProgramError, match="not h100"):
        shardscope.plan_program(make_step, 8, axes=("data",), target="h100")


# -- Flax, as its projects write it ---------------------------------------------------------


def test_a_linen_model_unboxed_with_its_own_helper_is_planned():
    linen = load_program_module("linen_lm")
    r = shardscope.plan_program(
        linen.make_step,
        8,
        rules=linen.RULES,
        meshes=["data=2,model=4", "data=8,model=1"],
        axis_types="auto",
    )
    assert not r.skipped and len(r.plans) == 4
    tp = next(p for p in r.plans if p.label == "dp_tp data=2,model=4")
    assert {c.axes for c in tp.collectives} >= {("model",), ("data",)}


def test_an_nnx_model_with_dropout_is_laid_out_and_audited():
    nnx_dropout = load_program_module("nnx_dropout")
    from flax import nnx

    mesh = shardscope.make_mesh("data=2,model=4", axis_types="auto")
    with jax.set_mesh(mesh):
        model, optimizer = nnx.eval_shape(nnx_dropout.create)
    lay = shardscope.layout(nnx.state(model))
    rows = {leaf.path: leaf for leaf in lay.leaves}
    key = rows["drop.rngs.key"]
    # A threefry key is two uint32 words.
    assert key.dtype == jax.random.key(0).dtype.name and key.nbytes == 2 * 4
    assert rows["up.kernel"].max_device_bytes == 32 * 128 * 4 // 4
    abstract = shardscope.abstract((model, optimizer))
    x = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        a = shardscope.audit(nnx_dropout.train_step, *abstract, x)
    assert ("model",) in {c.axes for c in a.collectives}


def test_a_sharded_key_array_is_laid_out_by_its_key_data():
    mesh = shardscope.make_mesh("x=8")
    keys = jax.ShapeDtypeStruct(
        (16,), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P("x"))
    )
    lay = shardscope.layout(keys)
    assert lay.nbytes == 16 * 2 * 4
    assert lay.max_device_bytes == 2 * 2 * 4 and lay.replication == 1


# -- a target's devices, from the arguments -------------------------------------------------


def test_audit_on_a_target_finds_the_mesh_of_its_arguments():
    mesh = shardscope.target_mesh("h100", "data=8")
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
    w = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    step = jax.jit(lambda w, x: jnp.einsum("bd,df->bf", x, w, out_sharding=P("data", None)))
    with jax.set_mesh(mesh):
        a = shardscope.audit(step, w, x, target="h100")
    assert a.target == "h100"
    (gather,) = [c for c in a.collectives if c.kind == "all-gather"]
    assert gather.payload_bytes == 1024 * 512 * 2  # the whole weight, in bf16
    plain = jax.ShapeDtypeStruct((8,), jnp.float32)
    with pytest.raises(shardscope.TargetError, match="mesh='data=8'") as info:
        shardscope.audit(jax.jit(lambda v: v * 2), plain, target="h100")
    assert info.value.params == ("mesh",)


def test_the_guides_explicit_example_runs_as_written(tmp_path):
    out = run_doc_example("docs/guides/own_program.md", "## Explicit sharding", tmp_path)
    first, second = out.splitlines()[:2]
    # One all-reduce of the activations over 'model', one of the gradients over 'data'.
    assert first == "float32[512,2048@model] 2"
    assert second.split()[0] == "explicit" and second.split()[-1].startswith("data=")


def _heads_step(mesh):
    """A projection whose output, split over 'model', is reshaped into 4 heads: a layout
    whose 'model' does not divide the heads cannot type-check (JAX cannot tell where the
    reshaped axis goes)."""

    @jax.jit
    def step(w, x):
        def loss(w):
            h = jnp.einsum("bd,de->be", x, w, out_sharding=P("data", "model"))
            return jnp.sum(h.reshape(x.shape[0], 4, -1) ** 2)

        return jax.grad(loss)(w)

    w = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P(None, "model")))
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    return step, (w, x)


def test_a_layout_that_does_not_type_check_is_skipped_and_the_search_goes_on():
    meshes = ["data=1,model=8", "data=2,model=4"]
    r = shardscope.plan_program(_heads_step, 8, axes=("data", "model"), meshes=meshes)
    assert [p.mesh_spec for p in r.plans] == ["data=2,model=4"]
    (skip,) = r.skipped
    assert skip.mesh == "data=1,model=8" and "do not type-check" in skip.message
    # alone, it leaves no plan, and says why
    alone = shardscope.plan_program(_heads_step, 8, axes=("data", "model"), meshes=meshes[:1])
    assert not alone.plans and "do not type-check" in alone.skipped[0].message
