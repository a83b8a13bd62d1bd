"""Records read back: ``from_dict`` inverts ``to_dict`` exactly, audit files of the earlier
version load, the live program stays out of the record's data, and the diff reads records."""

import dataclasses
import json
import pickle
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from shardscope._src.audit.records import (
    Audit,
    AuditTotals,
    Collective,
    KindTotals,
    Loop,
    Part,
    Rematerialization,
    ScopeTotals,
    UnknownInstruction,
)
from shardscope._src.base.records import write_result

FIXTURES = Path(__file__).parent / "fixtures"
JSON_FILES = FIXTURES / "audit_json"
#: The HLO each JSON fixture audited, and its mesh (as tests/fixtures/audit_json/generate.py).
TEXTS = {
    "sub_axes_2d": ("hlo/sub_axes_2d.hlo", "dp=2,mp=4"),
    "shard_map_collectives": ("hlo/shard_map_collectives.hlo", "dp=2,mp=4"),
    "scan_1d": ("hlo/scan_1d.hlo", "model=8"),
    "combined_collectives": ("hlo_targets/h100x8/combined_collectives.hlo", "x=8"),
}
HEADER = ("schema_version", "shardscope_version", "jax_version", "jaxlib_version")


def via_json(data):
    return json.loads(json.dumps(data, allow_nan=False))


#: What this version writes that the earlier one did not (an audit's, a collective's): a
#: file of the earlier version reads them back as unknown.
NEW_AUDIT_KEYS = {
    "hlo_flops",
    "hlo_bytes",
    "priced_on",
    "exposure",
    "memory_pressure",
    "ragged_dots",
    "unused_rules",
    "widened_dtype",
}
NEW_COLLECTIVE_KEYS = {"overlap"}


def without_new_keys(data: dict) -> dict:
    out = {k: v for k, v in data.items() if k not in NEW_AUDIT_KEYS}
    out["collectives"] = [
        {k: v for k, v in c.items() if k not in NEW_COLLECTIVE_KEYS} for c in data["collectives"]
    ]
    return out


def as_read_back_from_earlier(a: Audit) -> Audit:
    """What a file of the earlier version holds of an audit: its collectives in table order,
    the replica groups only of the irregular ones (a regular collective's read back as its
    axes name them, in mesh order), no counts from the HLO."""
    collectives = tuple(
        dataclasses.replace(c, groups=c.groups if c.irregular else c.named_groups(a.mesh_axes))
        for c in a.sorted_collectives()
    )
    return dataclasses.replace(a, collectives=collectives, hlo_flops=None, hlo_bytes=None)


@pytest.mark.parametrize("name", sorted(p.stem for p in JSON_FILES.glob("*.json")))
def test_an_audit_file_of_the_earlier_version_reads_back_to_the_same_json(name):
    data = json.loads((JSON_FILES / f"{name}.json").read_text())
    read = Audit.from_dict(data)
    # every field, and every sum computed again from the collectives, as the file has it
    written = via_json(read.to_dict())
    assert without_new_keys(written) == {k: v for k, v in data.items() if k not in HEADER}
    assert all(written[k] is None for k in NEW_AUDIT_KEYS)
    assert all(c["overlap"] is None for c in written["collectives"])
    assert read.program is None and read.compiled is None and read.hlo_text == ""


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_an_audit_file_reads_back_to_the_audit_of_its_hlo(name):
    file, mesh = TEXTS[name]
    fresh = shardscope.audit((FIXTURES / file).read_text(), mesh=mesh)
    read = Audit.from_dict(json.loads((JSON_FILES / f"{name}.json").read_text()))
    assert read == as_read_back_from_earlier(fresh)
    assert read.by_scope() == fresh.by_scope() and read.totals() == fresh.totals()


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_an_audit_reads_back_from_its_json_equal_to_itself(name):
    """Every field that ``==`` compares survives the JSON: the collectives in the audit's
    order, and the replica groups of a regular collective, written only where the compiler
    printed them in another order than its axes name them in."""
    file, mesh = TEXTS[name]
    fresh = shardscope.audit((FIXTURES / file).read_text(), mesh=mesh)
    data = via_json(fresh.to_dict())
    assert Audit.from_dict(data) == fresh
    for c, written in zip(fresh.collectives, data["collectives"], strict=True):
        named = c.named_groups(fresh.mesh_axes)
        assert written["groups"] == (None if c.groups == named else [list(g) for g in c.groups])


def test_groups_a_compiler_printed_in_another_order_are_written_and_read_back():
    # sub_axes_2d.hlo prints the groups of ('dp', 'mp:(2)2') as {0,4,1,5},{2,6,3,7}: the same
    # partitions as the axes name, {0,1,4,5},{2,3,6,7}, in another order within each group
    file, mesh = TEXTS["sub_axes_2d"]
    fresh = shardscope.audit((FIXTURES / file).read_text(), mesh=mesh)
    (c,) = [c for c in fresh.collectives if c.axes == ("dp", "mp:(2)2")]
    assert c.groups == ((0, 4, 1, 5), (2, 6, 3, 7))
    assert c.named_groups(fresh.mesh_axes) == ((0, 1, 4, 5), (2, 3, 6, 7))
    (again,) = [
        x for x in Audit.from_dict(via_json(fresh.to_dict())).collectives if x.name == c.name
    ]
    assert again.groups == c.groups


def test_the_remat_file_keeps_the_partitioners_rematerialization():
    data = json.loads((JSON_FILES / "remat_compiled.json").read_text())
    read = Audit.from_dict(data)
    (r,) = read.rematerializations
    assert (r.instruction, r.op_name) == ("add.2", "jit(f)/add")
    assert (read.backend, read.target, read.memory["output_size_in_bytes"]) == ("cpu", "cpu", 2048)


# -- hypothesis: any record round-trips ------------------------------------------------------

names = st.text("abcdefgh_./:0123456789", min_size=1, max_size=8)
maybe = st.none() | names
shapes = st.lists(st.integers(0, 4096), max_size=3).map(tuple)
sizes = st.integers(0, 2**40)
parts = st.builds(
    Part,
    operand=st.integers(0, 4),
    piece=st.none() | st.integers(0, 4),
    dtype=names,
    shape=shapes,
    payload_bytes=sizes,
    traffic_bytes=sizes,
    op_name=maybe,
    source=maybe,
    user_source=maybe,
    stack=st.lists(names, max_size=3).map(tuple),
    scope=st.just("") | names,
    phase=st.sampled_from([None, "forward", "backward"]),
)
loops = st.builds(Loop, names, st.none() | st.integers(1, 100), st.booleans())
remats = st.builds(Rematerialization, maybe, maybe, maybe, maybe, maybe)
groups = st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4).map(tuple), max_size=3)


@st.composite
def collectives(draw):
    irregular = draw(st.booleans())
    return Collective(
        kind=draw(st.sampled_from(["all-reduce", "all-gather", "all-to-all", "weird-op"])),
        name=draw(names),
        computation=draw(names),
        axes=() if irregular else draw(st.lists(names, max_size=2).map(tuple)),
        group_size=draw(st.integers(1, 8)),
        dtype=draw(names),
        shape=draw(shapes),
        payload_bytes=draw(sizes),
        traffic_bytes=draw(sizes),
        count=draw(st.integers(0, 1000)),
        count_exact=draw(st.booleans()),
        irregular=irregular,
        reason=draw(st.just("") | names),
        groups=draw(groups.map(tuple)) if irregular else (),
        pairs=tuple(draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=3))),
        shapes=tuple(draw(st.lists(shapes, max_size=2))),
        loops=tuple(draw(st.lists(loops, max_size=2))),
        conditionals=tuple(draw(st.lists(names, max_size=2))),
        op_name=draw(maybe),
        source=draw(maybe),
        operand_source=draw(maybe),
        is_async=draw(st.booleans()),
        reduction=draw(maybe),
        channel_id=draw(st.none() | st.integers(0, 99)),
        replica_groups=draw(st.just("") | names),
        unknown_attributes=draw(st.dictionaries(names, names, max_size=2)),
        note=draw(st.just("") | names),
        stack=tuple(draw(st.lists(names, max_size=3))),
        user_source=draw(maybe),
        scope=draw(st.just("") | names),
        phase=draw(st.sampled_from([None, "forward", "backward"])),
        carried_as=draw(st.none() | st.just("all-reduce")),
        parts=tuple(draw(st.lists(parts, max_size=3))),
    )


@st.composite
def audits(draw):
    axes = draw(st.dictionaries(names, st.integers(1, 8), min_size=1, max_size=3))
    return Audit(
        collectives=tuple(draw(st.lists(collectives(), max_size=4))),
        mesh_axes=axes,
        num_partitions=draw(st.integers(1, 64)),
        module_name=draw(names),
        memory=draw(st.none() | st.dictionaries(names, sizes, max_size=2)),
        flops=draw(st.none() | st.floats(0, 1e18, allow_nan=False)),
        in_shardings=draw(st.none() | st.lists(names, max_size=2).map(tuple)),
        out_shardings=draw(st.none() | st.lists(names, max_size=2).map(tuple)),
        rematerializations=draw(st.none() | st.lists(remats, max_size=2).map(tuple)),
        unknown_instructions=tuple(
            draw(st.lists(st.builds(UnknownInstruction, names, names, names, names), max_size=2))
        ),
        execution_threads=tuple(draw(st.lists(names, max_size=2))),
        backend=draw(st.sampled_from([None, "cpu", "gpu", "tpu"])),
        target=draw(maybe),
        widened_dtype=draw(st.sampled_from([None, "bfloat16", "float16"])),
    )


@given(collectives())
def test_a_collective_reads_back_as_itself(c):
    assert Collective.from_dict(via_json(c.to_dict())) == c


@given(parts, loops)
def test_a_part_and_a_loop_read_back_as_themselves(part, loop):
    assert Part.from_dict(via_json(part.to_dict())) == part
    assert Loop.from_dict(via_json(dataclasses.asdict(loop))) == loop


@given(audits())
def test_an_audit_reads_back_as_itself(a):
    data = via_json(a.to_dict())
    read = Audit.from_dict(data)
    assert read == a
    assert via_json(read.to_dict()) == data
    sums = AuditTotals.from_dict(data)
    assert sums == AuditTotals.of(a)
    assert sums.totals == tuple(KindTotals.from_dict(r) for r in data["totals"])
    assert sums.by_scope == tuple(ScopeTotals.from_dict(r) for r in data["by_scope"])


def test_a_field_missing_is_named():
    data = json.loads((JSON_FILES / "scan_1d.json").read_text())
    del data["collectives"][0]["traffic_bytes"]
    with pytest.raises(shardscope.RecordError, match="has no 'traffic_bytes' field"):
        Audit.from_dict(data)


@pytest.mark.parametrize(
    "key, value", [("collectives", 3), ("mesh_axes", [8]), ("num_partitions", "eight")]
)
def test_a_field_of_another_type_is_named_with_its_value(key, value):
    data = json.loads((JSON_FILES / "scan_1d.json").read_text())
    data[key] = value
    with pytest.raises(shardscope.RecordError, match=re.escape(f"'{key}' field holds {value!r}")):
        Audit.from_dict(data)


# -- the live program beside the record -----------------------------------------------------


def matmul_audit(spec):
    mesh = shardscope.make_mesh("model=8", axis_types="auto")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(mesh, P()))
    w = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, spec))
    return shardscope.audit(jax.jit(lambda x, w: x @ w), x, w)


def test_the_compiled_program_travels_beside_the_audit_not_in_its_data():
    a = matmul_audit(P("model", None))
    assert isinstance(a.compiled, jax.stages.Compiled)
    assert a.hlo_text == a.compiled.as_text() and a.module.name == a.module_name
    assert a.backend == "cpu" == jax.default_backend()
    copy = pickle.loads(pickle.dumps(a))  # a Compiled itself cannot be pickled
    assert copy == a and copy.program is None and copy.compiled is None
    assert a.program is not None  # the original keeps it
    fields = {f.name for f in dataclasses.fields(Audit)}
    assert not fields & {"compiled", "module", "hlo_text", "program"}
    assert not {"compiled", "hlo_text", "program"} & set(a.to_dict())
    # the same program audited from its text: equal records, though one has no Compiled
    assert shardscope.audit(a.hlo_text, mesh="model=8") == dataclasses.replace(
        a, memory=None, flops=None, in_shardings=None, out_shardings=None,
        rematerializations=None, backend=None, target=None,
    )  # fmt: skip


def test_a_diff_of_files_is_the_diff_of_the_audits_read_back(tmp_path):
    before, after = matmul_audit(P()), matmul_audit(P("model", None))
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    write_result(old, before)
    write_result(new, after)
    from_files = shardscope.diff_audits(old, new)
    in_memory = shardscope.diff_audits(before, after)
    read_back = shardscope.diff_audits(
        Audit.from_dict(json.loads(old.read_text())), Audit.from_dict(json.loads(new.read_text()))
    )
    assert from_files.rows == in_memory.rows == read_back.rows
    (row,) = in_memory.changed
    assert (row.kind, row.new_count, row.new_traffic_bytes) == (
        "all-reduce",
        1,
        2 * 7 * 16 * 512 * 4 // 8,
    )


def test_a_diff_of_a_broken_file_names_the_field(tmp_path):
    data = json.loads((JSON_FILES / "scan_1d.json").read_text())
    del data["totals"][0]["count"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(shardscope.AuditDiffError, match="'count'"):
        shardscope.diff_audits(path, JSON_FILES / "scan_1d.json")


# -- serving results --------------------------------------------------------------------------

#: Serving results as shardscope f72fdd8 wrote them (schema version 3), with the commands of
#: tests/fixtures/serve_json/README.md.
SERVE_JSON = FIXTURES / "serve_json"


def _since(body):
    """A schema-3 result's data with the fields written since at their defaults: no clients in
    a closed loop, no engine (``none``: no host cost in any plan's times), no chunked
    prefill, no prefill attention kernel named, no memory share given and no notes."""
    plans = [
        p | {"engine": "none", "decode_host_s": 0.0, "engine_memory_share": None}
        for p in body["plans"]
    ]
    since = {"clients": None, "engine": "none", "chunked_prefill": None, "prefill_attention": None}
    since |= {"weight_activations": False, "memory_share": None, "notes": []}
    return body | since | {"plans": plans}


def test_a_serving_file_of_schema_3_reads_back_and_names_the_platform_that_compiled_it():
    # Schema 3 wrote "backend": "estimate" whatever compiled the plans: here both were
    # compiled by the H100 compiler. Read back, the result is the file's data, field for
    # field, and its backend is the platform of that compiler, as version 4 writes it.
    data = json.loads((SERVE_JSON / "tiny_h100.json").read_text())
    assert (data["schema_version"], data["backend"]) == (3, "estimate")
    result = shardscope.ServeResult.from_dict(data)
    assert [p.compiled_by for p in result.plans] == ["h100", "h100"]
    assert [p.batch for p in result.plans] == [8, 8]
    assert result.backend == "gpu"
    body = {k: v for k, v in data.items() if k not in (*HEADER, "backend")}
    # the fields written since (clients in a closed loop, the engine, the chunked prefill)
    # take their defaults
    assert via_json(result.to_dict()) == _since(body)


def test_a_serving_result_reads_back_as_the_planner_makes_it(tmp_path):
    # The file of schema 3 reads back as it was written, less the backend it named ("estimate":
    # none of its plans compiled) and with the fields written since at their defaults. It
    # holds the layouts, batches and bytes this shardscope plans for its request (on no
    # engine: the file's times paid no host's), to the byte
    # (its times, the floats, were priced before matmuls were priced by their shape); written
    # now (schema 4) a result holds the same fields and reads back the same; a plan compiled
    # by a TPU's compiler makes the backend "tpu".
    now = shardscope.serve("tiny", 2, prompt=64, output=16, rate=2, compiler="cpu", engine="none")
    old = json.loads((SERVE_JSON / "tiny_rate_cpu.json").read_text())
    assert (old["schema_version"], old["backend"]) == (3, "estimate")
    body = {k: v for k, v in old.items() if k not in (*HEADER, "backend")}
    read = shardscope.ServeResult.from_dict(old)
    assert via_json(read.to_dict()) == _since(body)

    def exact(result):  # every field but the floats (the times), of the result and its plans
        plans = [
            {k: v for k, v in vars(p).items() if not isinstance(v, float)} for p in result.plans
        ]
        return {k: v for k, v in vars(result).items() if k != "plans"}, plans

    # but the kernels an estimated step launches, which it counts since from the model's
    # structure (the file's: none): tiny's 4 layers of 10 and 4 a step; and the prefill's
    # attention kernel it names since (the file's: none; on no engine, FlashAttention-2)
    assert [p.decode_kernels for p in read.plans] == [0, 0]
    assert [p.decode_kernels for p in now.plans] == [4 * 10 + 4] * 2
    assert (read.prefill_attention, now.prefill_attention) == (None, "flash-attention-2")
    # and the memory a device holds on no engine: all an H100's runtime reports since
    # (79.11 GiB), the preset's 80 GB then
    assert {p.memory_limit_bytes for p in read.plans} == {80 * 10**9}
    assert {p.memory_limit_bytes for p in now.plans} == {int(79.11 * 2**30)}
    # and a prefill's temporaries: a layer's scores over the 64-token prompt then (8 heads a
    # device at tensor parallelism 1, 4 at 2; float32 and bfloat16), a layer's activations
    # since (its MLP's widest: 2 x 256 + 3 x 1024 / t elements of 2 bytes a token, and the
    # last token's float32 logits over 1024 / t of the vocabulary)
    then = [8 * 64 * 64 * 6, 4 * 64 * 64 * 6]
    since = [64 * (2 * 256 + 3 * 1024 // t) * 2 + 1024 // t * 4 for t in (1, 2)]
    assert [p.tensor_parallel for p in now.plans] == [1, 2]
    assert [p.temp_bytes_per_device for p in read.plans] == then
    assert [p.temp_bytes_per_device for p in now.plans] == since
    now_counted_as_then = dataclasses.replace(
        now,
        plans=tuple(
            dataclasses.replace(
                p, decode_kernels=0, memory_limit_bytes=80 * 10**9, temp_bytes_per_device=held
            )
            for p, held in zip(now.plans, then, strict=True)
        ),
        prefill_attention=None,
    )
    assert exact(read) == exact(now_counted_as_then)
    written = json.loads(write_result(tmp_path / "serve.json", now).read_text())
    assert (written["schema_version"], written["backend"]) == (4, None)
    assert shardscope.ServeResult.from_dict(written) == now
    since = {
        "clients", "engine", "chunked_prefill", "prefill_attention", "weight_activations",
        "memory_share", "notes",
    }  # fmt: skip
    assert written.keys() - HEADER == old.keys() - HEADER | since
    on_tpu = dataclasses.replace(
        now, plans=tuple(dataclasses.replace(p, compiled_by="tpu-v5e") for p in now.plans)
    )
    assert on_tpu.backend == "tpu"


def test_a_serving_file_of_a_later_schema_or_without_plans_is_refused():
    data = json.loads((SERVE_JSON / "tiny_rate_cpu.json").read_text())
    with pytest.raises(shardscope.ShardscopeError, match="schema version 5: this shardscope"):
        shardscope.ServeResult.from_dict({**data, "schema_version": 5})
    with pytest.raises(shardscope.ShardscopeError, match="a serving result has no 'plans'"):
        shardscope.ServeResult.from_dict({k: v for k, v in data.items() if k != "plans"})
    plan = {k: v for k, v in data["plans"][0].items() if k != "batch"}
    with pytest.raises(shardscope.ShardscopeError, match="a serving plan has no 'batch'"):
        shardscope.ServeResult.from_dict({**data, "plans": [plan]})
