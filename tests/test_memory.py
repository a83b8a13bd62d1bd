"""A compiler's memory as a record: what ``memory_analysis()`` reports, written and read back
as earlier versions wrote it, what a program holds on each compiler, and the one fit rule."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import shardscope
from shardscope._src.audit.records import Audit
from shardscope._src.cost.memory import CompiledMemory, memory_fits
from shardscope._src.targets.specs import CPU_TARGET, TARGETS

JSON_FILES = Path(__file__).parent / "fixtures" / "audit_json"


def test_an_earlier_records_memory_reads_back_and_writes_the_same_json():
    data = json.loads((JSON_FILES / "remat_compiled.json").read_text())
    written = data["memory"]
    memory = CompiledMemory.from_dict(written)
    assert memory.temp_size_in_bytes == 24580 and memory.peak_memory_in_bytes == 8192
    assert json.dumps(memory.to_dict(), indent=2) == json.dumps(written, indent=2)
    # Read back inside its audit, the whole record writes the same memory.
    assert Audit.from_dict(data).to_dict()["memory"] == written


def test_a_record_keeps_the_fields_it_was_written_with_and_no_others():
    # An older JAX reported no peak; a later one may report what this record has no field
    # for: neither is invented nor lost.
    written = {"argument_size_in_bytes": 6144, "temp_size_in_bytes": 8, "total_in_bytes": 9}
    memory = CompiledMemory.from_dict(written)
    assert memory.peak_memory_in_bytes is None and "peak_memory_in_bytes" not in memory
    assert list(memory.to_dict()) == sorted(written) and memory.to_dict() == written
    assert memory["total_in_bytes"] == 9 and dict(memory) == written
    assert CompiledMemory.from_dict(memory.to_dict()) == memory
    assert hash(memory) == hash(CompiledMemory.from_dict(dict(reversed(written.items()))))


def test_every_byte_count_the_compiler_reports_is_recorded():
    compiled = jax.jit(lambda x: (x @ x).sum(0)).lower(jnp.ones((64, 64))).compile()
    stats = compiled.memory_analysis()
    memory = CompiledMemory.from_stats(stats)
    reported = {n: getattr(stats, n) for n in dir(stats) if n.endswith("_in_bytes")}
    assert len(reported) == 11 and memory.to_dict() == reported
    assert memory.extra == ()  # JAX 0.10.2's every field is one of the record's
    assert shardscope.audit(compiled).memory == memory


def test_what_a_program_holds_depends_on_the_compiler_that_built_it():
    memory = CompiledMemory(
        argument_size_in_bytes=64,
        output_size_in_bytes=32,
        temp_size_in_bytes=100,
        alias_size_in_bytes=32,
        peak_memory_in_bytes=96,
    )
    assert memory.buffer_bytes == 164
    # XLA:CPU's peak is its arguments and outputs alone: its buffers are what it holds.
    assert memory.held_by(CPU_TARGET) == 164
    for name in ("h100", "tpu-v5p"):
        assert memory.held_by(TARGETS[name]) == memory.held_bytes == 96
    # no peak reported, or a zero one: the buffers
    assert CompiledMemory(temp_size_in_bytes=7).held_by(TARGETS["h100"]) == 7
    assert CompiledMemory(temp_size_in_bytes=7, peak_memory_in_bytes=0).held_bytes == 7


def test_the_fit_rule_holds_the_device_and_the_host_to_their_limits():
    assert memory_fits(1000, 1000) and not memory_fits(1001, 1000)
    assert memory_fits(1000, 1000.0, host_bytes=5, host_limit_bytes=5)
    assert not memory_fits(10, 1000, host_bytes=6, host_limit_bytes=5)
    assert not memory_fits(10, 1000, host_bytes=1)  # no host memory to hold it


@pytest.mark.parametrize(
    "data, words",
    [
        ({"temp_size_in_bytes": "lots"}, "'temp_size_in_bytes' must be a number of bytes"),
        ([1, 2], "must be a JSON object of byte counts, got list"),
    ],
)
def test_a_memory_record_that_is_not_one_is_named(data, words):
    with pytest.raises(shardscope.RecordError, match=words):
        CompiledMemory.from_dict(data)
