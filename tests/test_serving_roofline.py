"""Serving estimates against the scaling book's worked examples (../shared/CALIBRATION.md
set 4): what ``serve(..., compiler="cpu")`` (nothing compiled) computes, within the 5% the
serving plans are held to."""

import pytest

from shardscope._src.base.errors import PlanError
from shardscope._src.model.presets import model_preset
from shardscope._src.model.serving import cache_bytes_per_token
from shardscope._src.serve.search import serve

LLAMA3_70B = model_preset("llama3-70b").config(batch=1)
LLAMA2_13B = model_preset("llama2-13b").config(batch=1)
#: the book's context: 8,192 tokens a sequence
PROMPT, OUTPUT = 4096, 4096


def _near(got, book):
    assert abs(got / book - 1) <= 0.05, (got, book)


def _tensor_parallel(model, batch, **formats):
    """The plan of ``model`` over 8 TPU v5e chips as one tensor-parallel replica (the book's
    layout), estimated: the device alone, as the book prices it (no engine keeping memory
    back)."""
    result = serve(
        model, 8, hardware="tpu-v5e", prompt=PROMPT, output=OUTPUT, batch=batch,
        compiler="cpu", engine="none", **formats,
    )  # fmt: skip
    return next(p for p in result.plans if p.mesh == {"model": 8})


def test_the_kv_cache_of_a_token_is_every_layers_key_and_value_per_kv_head():
    # 80 layers, 8 key/value heads of 128: grouped-query attention's cache
    assert cache_bytes_per_token(LLAMA3_70B, "int8") == 2 * 8 * 128 * 80
    assert cache_bytes_per_token(LLAMA3_70B, "bfloat16") == 2 * 8 * 128 * 80 * 2
    # Llama 2 13B is multi-head: 40 heads of 128, 40 layers
    assert cache_bytes_per_token(LLAMA2_13B, "bfloat16") == 2 * 40 * 128 * 40 * 2
    _near(cache_bytes_per_token(LLAMA3_70B, "int8") * 32768, 5.3e9)  # per 32k sequence


def test_llama3_70b_int8_at_batch_32_and_8k_context():
    p = _tensor_parallel("llama3-70b", 32, weights="int8", cache="int8")
    _near(p.cache_bytes_per_device * 8, 41.9e9)
    _near(p.weight_bytes_per_device * 8, 70e9)
    assert p.fits  # on a 4x2 slice
    # the book's step is memory-bound: every weight and the cache through HBM once
    assert p.decode_memory_s > p.decode_compute_s
    _near(p.decode_memory_s, 17e-3)


@pytest.mark.parametrize("batch, book_ms", [(1, 4.98), (8, 12.13), (16, 20.30)])
def test_llama2_13b_decode_step_by_batch(batch, book_ms):
    p = _tensor_parallel("llama2-13b", batch)
    assert p.decode_memory_s > p.decode_compute_s
    _near(p.decode_memory_s, book_ms * 1e-3)


def test_bad_serving_input_names_the_value():
    with pytest.raises(PlanError, match="cache='int4'"):
        serve("llama2-13b", 8, hardware="tpu-v5e", prompt=8, output=8, cache="int4")
    with pytest.raises(PlanError, match="batch=0"):
        serve("llama2-13b", 8, hardware="tpu-v5e", prompt=8, output=8, batch=0)
    with pytest.raises(PlanError, match="cache='int4'"):
        cache_bytes_per_token(LLAMA2_13B, "int4")
