"""The audit's reading of HLO forms: loops without a recorded trip count, gathers carried as
all-reduces, async wrappers, op names and library frames. Hand-written HLO in XLA's printing
style; real compiler output is in tests/test_audit_targets.py."""

from __future__ import annotations

import pytest

from shardscope._src.audit.compile import audit
from shardscope._src.audit.provenance import is_library_file, parse_op_name
from shardscope._src.hlo.parse import KNOWN_OPCODES, is_known_opcode, parse_hlo

AR = "use_global_device_ids=true, to_apply=%add"
GROUP4 = "channel_id=1, replica_groups={{0,1,2,3}}"
ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""


def loop_module(
    *,
    init: str = "0",
    bound: str = "5",
    direction: str = "LT",
    step: str = "1",
    op: str = "add",
    swap: bool = False,
    trip_config: str = "",
) -> str:
    """A counted loop whose body all-reduces over 4 partitions."""
    cmp = "%b, %i" if swap else "%i, %b"
    return f"""HloModule m, num_partitions=4

{ADD}
%cond (cp: (s32[], f32[8])) -> pred[] {{
  %cp = (s32[], f32[8]{{0}}) parameter(0)
  %i = s32[] get-tuple-element(%cp), index=0
  %b = s32[] constant({bound})
  ROOT %lt = pred[] compare({cmp}), direction={direction}
}}

%body (bp: (s32[], f32[8])) -> (s32[], f32[8]) {{
  %bp = (s32[], f32[8]{{0}}) parameter(0)
  %j = s32[] get-tuple-element(%bp), index=0
  %x = f32[8]{{0}} get-tuple-element(%bp), index=1
  %step = s32[] constant({step})
  %next = s32[] {op}(%j, %step)
  %ar = f32[8]{{0}} all-reduce(%x), channel_id=1, replica_groups={{{{0,1,2,3}}}}, {AR}
  ROOT %t = (s32[], f32[8]{{0}}) tuple(%next, %ar)
}}

ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %zero = s32[] constant({init})
  %start = s32[] copy(%zero)
  %init = (s32[], f32[8]{{0}}) tuple(%start, %p)
  %w = (s32[], f32[8]{{0}}) while(%init), condition=%cond, body=%body{trip_config}
  ROOT %out = f32[8]{{0}} get-tuple-element(%w), index=1
}}
"""


@pytest.mark.parametrize(
    "kwargs, trips",
    [
        ({}, 5),
        ({"init": "2"}, 3),
        ({"step": "2"}, 3),
        ({"direction": "LE"}, 6),
        ({"init": "7", "bound": "0", "direction": "GT", "op": "subtract"}, 7),
        ({"init": "7", "bound": "0", "direction": "GE", "step": "-2"}, 4),
        ({"direction": "NE"}, 5),
        ({"swap": True, "direction": "GT"}, 5),  # 5 > i
        ({"init": "9"}, 0),
    ],
)
def test_trip_count_is_read_from_condition_step_and_start(kwargs, trips):
    (c,) = audit(loop_module(**kwargs), mesh="d=4").collectives
    assert (c.count, c.count_exact) == (trips, True)
    assert [(lp.trip_count, lp.derived) for lp in c.loops] == [(trips, True)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"step": "0"},  # never ends
        {"step": "-1"},  # i < 5 going down: never ends
        {"direction": "NE", "step": "2"},  # 0, 2, 4, 6, ... never equals 5
        {"op": "multiply"},  # not a counted loop
    ],
)
def test_loops_that_are_not_counted_stay_unknown(kwargs):
    (c,) = audit(loop_module(**kwargs), mesh="d=4").collectives
    assert (c.count, c.count_exact) == (1, False)
    assert [(lp.trip_count, lp.derived) for lp in c.loops] == [(None, False)]


def test_the_compilers_trip_count_wins():
    text = loop_module(trip_config=', backend_config={"known_trip_count":{"n":"5"}}')
    (c,) = audit(text, mesh="d=4").collectives
    assert [(lp.trip_count, lp.derived) for lp in c.loops] == [(5, False)]


def test_start_set_by_a_parameter_is_not_guessed():
    text = loop_module().replace("%start = s32[] copy(%zero)", "%start = s32[] parameter(1)")
    text = text.replace("(p: f32[8]) -> f32[8]", "(p: f32[8], q: s32[]) -> f32[8]")
    (c,) = audit(text, mesh="d=4").collectives
    assert c.count_exact is False


GATHER_AS_SUM = f"""HloModule m, num_partitions=4

{ADD}
%pad (z: f32[], s: f32[2], o: s32[]) -> f32[8] {{
  %z = f32[] parameter(0)
  %zeros = f32[8]{{0}} broadcast(%z), dimensions={{}}
  %s = f32[2]{{0}} parameter(1)
  %o = s32[] parameter(2)
  ROOT %dus = f32[8]{{0}} dynamic-update-slice(%zeros, %s, %o)
}}

ENTRY %main (p: f32[2], g: f32[8]) -> (f32[8], f32[8], f32[8]) {{
  %p = f32[2]{{0}} parameter(0)
  %g = f32[8]{{0}} parameter(1)
  %zero = f32[] constant(0)
  %one = f32[] constant(1)
  %pid = u32[] partition-id()
  %two = u32[] constant(2)
  %off = u32[] multiply(%pid, %two)
  %o = s32[] convert(%off)
  %buf = f32[8]{{0}} broadcast(%zero), dimensions={{}}
  %dus = f32[8]{{0}} dynamic-update-slice(%buf, %p, %o)
  %fused = f32[8]{{0}} fusion(%zero, %p, %o), kind=kLoop, calls=%pad
  %ones = f32[8]{{0}} broadcast(%one), dimensions={{}}
  %not_zeros = f32[8]{{0}} dynamic-update-slice(%ones, %p, %o)
  %ar = (f32[8]{{0}}, f32[8]{{0}}, f32[8]{{0}}) all-reduce(%dus, %g, %fused), {GROUP4}, {AR}
  %ar2 = f32[8]{{0}} all-reduce(%not_zeros), channel_id=2, replica_groups={{{{0,1,2,3}}}}, {AR}
  %g0 = f32[8]{{0}} get-tuple-element(%ar), index=0
  ROOT %t = (f32[8]{{0}}, f32[8]{{0}}, f32[8]{{0}}) tuple(%g0, %ar2, %g)
}}
"""


def test_zero_padded_shards_in_an_all_reduce_are_all_gathers():
    a = audit(GATHER_AS_SUM, mesh="d=4")
    got = sorted(
        (
            c.name,
            c.kind,
            c.carried_as,
            c.payload_bytes,
            c.traffic_bytes,
            tuple(p.operand for p in c.parts),
        )
        for c in a.collectives
    )
    assert got == [
        # operands 0 and 2: a shard of 2 written into zeros of 8 (itself, inside a fusion)
        ("ar", "all-gather", "all-reduce", 64, 96, (0, 2)),
        # operand 1 is summed; ar2's base is ones: a sum, not a gather
        ("ar", "all-reduce", None, 32, 48, (1,)),
        ("ar2", "all-reduce", None, 32, 48, (0,)),
    ]
    assert a.counts()["all-gather"] == 1 and a.counts()["all-reduce"] == 2


def test_a_shard_that_is_not_one_group_member_share_is_a_sum():
    # 8 elements over a group of 2: a shard of 2 is not half the buffer.
    text = GATHER_AS_SUM.replace(
        "{{0,1,2,3}}, use_global_device_ids=true, to_apply=%add\n  %ar2",
        "{{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add\n  %ar2",
    )
    a = audit(text, mesh="d=4")
    assert {c.kind for c in a.collectives if c.name == "ar"} == {"all-reduce"}


ASYNC = "async_computation"
ASYNC_FUSION = f"""HloModule m, num_partitions=4

{ADD}
%fused_ar (x: f32[8]) -> f32[8] {{
  %x = f32[8]{{0}} parameter(0)
  ROOT %ar = f32[8]{{0}} all-reduce(%x), channel_id=1, replica_groups={{{{0,1}},{{2,3}}}}, {AR}
}}

%async_computation (y: f32[8]) -> f32[8] {{
  %y = f32[8]{{0}} parameter(0)
  ROOT %f = f32[8]{{0}} fusion(%y), kind=kLoop, calls=%fused_ar
}}

ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %fusion-start = ((f32[8]{{0}}), f32[8]{{0}}) async-start(%p), calls=%async_computation
  %fusion-update = ((f32[8]{{0}}), f32[8]{{0}}) async-update(%fusion-start), calls=%{ASYNC}
  ROOT %fusion-done = f32[8]{{0}} async-done(%fusion-update), calls=%{ASYNC}
}}
"""


def test_collective_fused_behind_a_generic_async_wrapper_is_found_once():
    (c,) = audit(ASYNC_FUSION, mesh="a=2,b=2").collectives
    assert (c.kind, c.count, c.is_async, c.group_size, c.axes) == ("all-reduce", 1, True, 2, ("b",))


def test_every_opcode_of_the_pinned_xla_is_known():
    from jaxlib import _hlo

    enum = [n for n in dir(_hlo.HloOpcode) if n.startswith("k")]
    assert len(KNOWN_OPCODES) == len(enum) == 133
    for op in ("and", "or", "xor", "not", "opt-barrier", "count-leading-zeros", "mulhi", "scan"):
        assert is_known_opcode(op)
    for op in ("reduce-scatter-start", "all-to-all-done", "fusion-start", "call-update"):
        assert is_known_opcode(op)
    for op in ("clz", "optimization-barrier", "frobnicate", "frobnicate-start", "-start"):
        assert not is_known_opcode(op)


def test_and_is_not_an_unknown_instruction():
    text = """HloModule m, num_partitions=2
ENTRY %main (p: pred[4], q: pred[4]) -> pred[4] {
  %p = pred[4]{0} parameter(0)
  %q = pred[4]{0} parameter(1)
  ROOT %r = pred[4]{0} and(%p, %q)
}"""
    assert parse_hlo(text).entry.root.known
    assert audit(text, mesh="d=2").unknown_instructions == ()


@pytest.mark.parametrize(
    "op_name, scope, phase",
    [
        (
            "jit(step)/transpose(jvp(Model))/block_1/Dense_0/dot_general",
            "Model/block_1/Dense_0",
            "backward",
        ),
        ("jit(step)/jvp(Model)/block_0/Dense_1/dot_general", "Model/block_0/Dense_1", "forward"),
        ("jit(step)/jvp()/while/body/closed_call/mlp/dot_general", "mlp", "forward"),
        ("jit(step)/transpose(jvp())/while/body/closed_call/mlp/dot_general", "mlp", "backward"),
        ("jit(step)/transpose(jvp())/while/body/bsd,df->bsf/dot_general", "", "backward"),
        ("jit(model)/cond/branch_1_fun/attn/dot_general", "attn", None),
        ("jit(f)/jit(relu)/max", "", None),
        ("jit(f)/vmap(encoder)/layer_3/add", "encoder/layer_3", None),
        ("jit(body)/shard_map/psum", "", None),
        ("jit(<lambda>)/dot_general", "", None),
        ("x", "", None),
        ("params['w']", "", None),
        (None, "", None),
    ],
)
def test_op_name_scope_and_phase(op_name, scope, phase):
    info = parse_op_name(op_name)
    assert (info.scope, info.phase) == (scope, phase)


@pytest.mark.parametrize(
    "path, library",
    [
        ("/venv/lib/python3.11/site-packages/flax/linen/linear.py", True),
        ("/usr/lib/python3/dist-packages/optax/_src/alias.py", True),
        ("/home/me/src/equinox/equinox/nn/_linear.py", True),  # a source checkout
        ("/usr/lib/python3.11/functools.py", True),
        ("<frozen runpy>", True),
        ("/home/me/project/train.py", False),
        ("train.py", False),
        ("/home/me/jax_experiments/model.py", False),
    ],
)
def test_library_files(path, library):
    assert is_library_file(path) is library


def test_cli_audit_by_scope_prints_the_scope_table(capsys):
    from shardscope._src.cli.main import main

    assert main(["audit", "reshard", "--mesh", "model=8", "--by-scope"]) == 0
    out = capsys.readouterr().out
    assert "by scope" in out and "(no scope)" in out and "all-to-all" in out


def test_collective_inside_a_custom_call_computation_is_found():
    text = f"""HloModule m, num_partitions=4

%wrapped (x: f32[2]) -> f32[8] {{
  %x = f32[2]{{0}} parameter(0)
  ROOT %ag = f32[8]{{0}} all-gather(%x), {GROUP4}, dimensions={{0}}, use_global_device_ids=true
}}

ENTRY %main (p: f32[2]) -> f32[8] {{
  %p = f32[2]{{0}} parameter(0)
  ROOT %cc = f32[8]{{0}} custom-call(%p), custom_call_target="W", called_computations={{%wrapped}}
}}
"""
    (c,) = audit(text, mesh="d=4").collectives
    assert (c.kind, c.name, c.count, c.payload_bytes, c.computation) == (
        "all-gather",
        "ag",
        1,
        32,
        "wrapped",
    )


def test_live_train_step_on_cpu_names_scopes_passes_and_the_users_lines():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import shardscope

    mesh = shardscope.make_mesh("data=2,model=4", axis_types="auto")

    def loss(w, x):
        with jax.named_scope("block_3"), jax.named_scope("mlp"):
            h = jax.nn.relu(x @ w[0])
            y = h @ w[1]  # the forward all-reduce over model
        return jnp.sum(y * y)

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    w = (sds((64, 256), P(None, "model")), sds((256, 64), P("model", None)))
    a = audit(jax.jit(jax.grad(loss)), w, sds((16, 64), P("data", None)))
    rows = {(r.axes, r.kind): r for r in a.by_scope()}
    fwd = rows[("model", "all-reduce")]
    assert fwd.scope == "block_3/mlp" and "forward" in fwd.phases
    grads = rows[("data", "all-reduce")]
    assert grads.scope == "block_3/mlp" and grads.phases == ("backward",)
    lines = {s for r in rows.values() for s in r.sources}
    assert lines and all(s.startswith(__file__ + ":") for s in lines)
