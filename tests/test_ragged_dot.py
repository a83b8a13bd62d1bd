"""A user's program with ``jax.lax.ragged_dot`` (a dropless mixture of experts' experts): its
plans say that the compiler computes each ragged dot as one dense matmul over every group,
and price it so."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.targets.devices import compiler_installed

#: experts (the groups), tokens, model width, expert width
E, M, K, N = 4, 64, 32, 16
#: the FLOPs of one ragged dot, each token's row through its own expert alone
USEFUL = 2 * M * K * N


def _args(mesh, lhs=(M, K), rhs=(E, K, N), groups=E):
    rep = NamedSharding(mesh, P())
    return (
        jax.ShapeDtypeStruct(lhs, jnp.bfloat16, sharding=rep),
        jax.ShapeDtypeStruct(rhs, jnp.bfloat16, sharding=rep),
        jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=rep),
    )


def _ragged_step(mesh):
    """The experts' matmul and its gradients: three ragged dots (the forward, whose output
    the gradient reads, the input's gradient and the weights' gradient, ragged over the
    contracted tokens)."""

    def loss(x, w, sizes):
        return jnp.square(jax.lax.ragged_dot(x, w, sizes).astype(jnp.float32)).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1))), _args(mesh)


def _dense_step(mesh):
    """The same shapes through one expert's plain matmul: nothing ragged."""

    def loss(x, w, sizes):
        return jnp.square((x @ w[0]).astype(jnp.float32)).sum() + sizes.sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1))), _args(mesh)


def _ragged_batch_step(mesh):
    """A ragged dot whose ragged dimension is a batch dimension (E groups of the 8 batch
    rows): a batched matmul as it stands, computed without waste."""
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((2,), (1,)), ((0,), (0,))),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )

    def step(x, w, sizes):
        return jax.lax.ragged_dot_general(x, w, sizes, numbers)

    return jax.jit(step), _args(mesh, lhs=(8, M, K), rhs=(8, K, N))


def _plan(make_step, devices=1, **kwargs):
    return shardscope.plan_program(
        make_step,
        devices,
        axes=("data",),
        meshes=[f"data={devices}"],
        axis_types="auto",
        **kwargs,
    )


def _notes(notes):
    return [n for n in notes if n.kind == "ragged-dot-dense"]


@pytest.fixture(scope="module")
def cpu_plans():
    return _plan(_ragged_step)


def test_a_ragged_dot_is_noted_as_the_cpu_compiles_it_once_per_group(cpu_plans):
    r = cpu_plans
    (plan,) = r.plans
    (note,) = _notes(r.notes)
    # said once for the sweep, and by the plan whose program it is (its JSON too)
    assert _notes(plan.notes) == [note]
    data = json.loads(json.dumps(r.to_dict()))
    values = {"compiler": "XLA:CPU", "count": 3, "groups": [E]}
    assert [n["values"] for n in data["notes"] if n["kind"] == "ragged-dot-dense"] == [values]
    assert [n["values"] for n in data["plans"][0]["notes"]] == [values]
    assert note.text.startswith("JAX lowers jax.lax.ragged_dot for the CPU as one dense matmul")
    assert f"compute {E} times their useful FLOPs" in note.text
    assert "xla_gpu_experimental_use_ragged_dot_fusion" in note.text


def test_the_terminal_prints_the_note_whole(cpu_plans):
    import io

    from rich.console import Console

    from shardscope._src.render.program_plan import render_program_plan

    # the command line's default, which cuts the other notes to a line each
    console = Console(record=True, width=100, file=io.StringIO())
    render_program_plan(cpu_plans, console=console, verbose=False)
    (note,) = _notes(cpu_plans.notes)
    printed = " ".join(console.export_text().split())
    assert f"note: {note.text}" in printed


def test_the_cpu_program_computes_every_group_of_each_ragged_dot():
    from shardscope._src.audit.ragged import RaggedDots
    from shardscope._src.program.program import compile_candidate

    auto = (jax.sharding.AxisType.Auto,)
    devices = jax.devices("cpu")[:1]
    program, *_ = compile_candidate(
        _ragged_step, (), {"data": 1}, devices, where="ragged", axis_types=auto
    )
    assert program.ragged_dots == RaggedDots(count=3, groups=(E,))
    # the three dots' matmul FLOPs in the compiled HLO: each computes all E groups
    assert program.hlo_flops == 3 * E * USEFUL


@pytest.mark.parametrize("make_step", [_dense_step, _ragged_batch_step], ids=["dense", "batch"])
def test_a_program_without_a_dense_ragged_dot_has_no_such_note(make_step):
    r = _plan(make_step)
    (plan,) = r.plans
    assert not _notes(r.notes) and not _notes(plan.notes)


@pytest.mark.skipif(not compiler_installed("h100"), reason="needs the gpu-compile extra")
def test_the_gpu_compiler_rewrites_a_ragged_dot_into_a_dense_one_and_it_is_noted():
    r = _plan(_ragged_step, target="h100")
    (plan,) = r.plans
    (note,) = _notes(r.notes)
    assert note.values.to_dict() == {"compiler": "XLA:GPU", "count": 3, "groups": [E]}
    assert note.text.startswith("XLA:GPU rewrites jax.lax.ragged_dot (XLA's RaggedDotRewriter)")
    # the GPU compiler counts no FLOPs, the HLO does: every group of each of the three dots
    assert plan.flops_per_device == 3 * E * USEFUL


@pytest.mark.skipif(not compiler_installed("tpu-v5e"), reason="needs the tpu-compile extra")
def test_the_tpu_compiler_keeps_a_ragged_dot_and_nothing_is_noted():
    r = _plan(_ragged_step, devices=4, target="tpu-v5e")
    (plan,) = r.plans
    assert not _notes(r.notes) and not _notes(plan.notes)


def test_a_steps_jaxpr_comes_with_its_lowering_where_the_step_traces():
    from jax.extend.core import ClosedJaxpr

    from helpers import program_module
    from shardscope._src.audit.stages import lower_step_traced

    mesh = shardscope.make_mesh("data=8", axis_types="auto")
    flax_mlp, eqx_mlp = program_module("flax_mlp"), program_module("eqx_mlp")
    # Flax NNX's jit traces (its Traced holds JAX's); Equinox's filter_jit does not
    lowered, jaxpr = lower_step_traced(flax_mlp.make_step, mesh, flax_mlp.RULES["dp"])
    assert isinstance(lowered, jax.stages.Lowered) and isinstance(jaxpr, ClosedJaxpr)
    lowered, jaxpr = lower_step_traced(eqx_mlp.make_step, mesh, eqx_mlp.RULES["dp"])
    assert isinstance(lowered, jax.stages.Lowered) and jaxpr is None
    # a stage make_step returns has none
    stage = _ragged_step(mesh)[0].lower(*_ragged_step(mesh)[1])
    assert lower_step_traced(lambda mesh: stage, mesh) == (stage, None)


def _audit_notes(audit):
    from shardscope._src.render.audit import audit_notes

    return [n for n in audit_notes(audit) if "ragged_dot" in n]


def test_the_audit_of_a_function_says_its_ragged_dots_are_dense_and_writes_them():
    from shardscope._src.audit.ragged import RaggedDots

    mesh = shardscope.make_mesh("data=1", devices=jax.devices()[:1], axis_types="auto")
    step, args = _ragged_step(mesh)
    audit = shardscope.audit(step, *args)
    assert audit.ragged_dots == RaggedDots(count=3, groups=(E,))
    (note,) = _audit_notes(audit)
    assert note.startswith("JAX lowers jax.lax.ragged_dot for the CPU as one dense matmul")
    assert f"3 ragged dots, gradients' included, compute {E} times" in note
    # the audit's own FLOPs count every group, as the note says
    assert audit.hlo_flops == 3 * E * USEFUL
    # its JSON keeps them, and reads them back
    data = json.loads(json.dumps(audit.to_dict()))
    assert data["ragged_dots"] == {"count": 3, "groups": [E]}
    assert shardscope.Audit.from_dict(data).ragged_dots == audit.ragged_dots


def test_an_audit_without_the_functions_trace_or_a_dense_ragged_dot_says_nothing_of_them():
    mesh = shardscope.make_mesh("data=1", devices=jax.devices()[:1], axis_types="auto")
    step, args = _ragged_step(mesh)
    lowered = step.lower(*args)
    # a Lowered, its Compiled and its text hold no trace: nothing is read, nothing said
    for program in (lowered, lowered.compile(), lowered.compile().as_text()):
        audit = shardscope.audit(program)
        assert audit.ragged_dots is None and not _audit_notes(audit)
    for make in (_dense_step, _ragged_batch_step):
        step, args = make(mesh)
        audit = shardscope.audit(step, *args)
        assert audit.ragged_dots is None and not _audit_notes(audit)


def test_the_audit_of_a_programs_step_reads_its_trace():
    from shardscope._src.audit.ragged import RaggedDots

    audit = shardscope.audit_program(_ragged_step, "data=1", axis_types="auto")
    assert audit.ragged_dots == RaggedDots(count=3, groups=(E,))


@pytest.mark.skipif(not compiler_installed("h100"), reason="needs the gpu-compile extra")
def test_the_audit_on_the_gpu_compiler_says_xla_rewrote_the_ragged_dots():
    from shardscope._src.audit.ragged import RaggedDots

    mesh = shardscope.target_mesh("h100", {"data": 1}, axis_types="auto")
    step, args = _ragged_step(mesh)
    audit = shardscope.audit(step, *args)
    assert audit.ragged_dots == RaggedDots(count=3, groups=(E,))
    (note,) = _audit_notes(audit)
    assert note.startswith("XLA:GPU rewrites jax.lax.ragged_dot (XLA's RaggedDotRewriter)")
    assert audit.hlo_flops == 3 * E * USEFUL


def test_the_compile_step_given_a_function_counts_its_ragged_dots_from_its_own_trace():
    from shardscope._src.audit.ragged import RaggedDots
    from shardscope._src.plan.compile import compile_plan

    mesh = shardscope.make_mesh("data=1", devices=jax.devices()[:1], axis_types="auto")
    step, args = _ragged_step(mesh)
    assert compile_plan(step, *args).ragged_dots == RaggedDots(count=3, groups=(E,))
