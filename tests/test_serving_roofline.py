"""The serving roofline against the scaling book's worked examples (../shared/CALIBRATION.md
set 4): formulas, reproduced within the 5% the serving plans are held to."""

import pytest

from shardscope._src.base.errors import PlanError
from shardscope._src.model.presets import model_preset
from shardscope._src.plan.serving import (
    cache_bytes_per_token,
    least_chips,
    prefill_s,
    serving_roofline,
)
from shardscope._src.targets.hardware import PRESETS

V5E = PRESETS["tpu-v5e"]
LLAMA3_70B = model_preset("llama3-70b").config(batch=1)
LLAMA2_13B = model_preset("llama2-13b").config(batch=1)


def _near(got, book):
    assert abs(got / book - 1) <= 0.05, (got, book)


def test_the_kv_cache_of_a_token_is_every_layers_key_and_value_per_kv_head():
    # 80 layers, 8 key/value heads of 128: grouped-query attention's cache
    assert cache_bytes_per_token(LLAMA3_70B, "int8") == 2 * 8 * 128 * 80
    assert cache_bytes_per_token(LLAMA3_70B, "bfloat16") == 2 * 8 * 128 * 80 * 2
    # Llama 2 13B is multi-head: 40 heads of 128, 40 layers
    assert cache_bytes_per_token(LLAMA2_13B, "bfloat16") == 2 * 40 * 128 * 40 * 2
    _near(cache_bytes_per_token(LLAMA3_70B, "int8") * 32768, 5.3e9)  # per 32k sequence


def test_llama3_70b_int8_at_batch_32_and_8k_context():
    r = serving_roofline(LLAMA3_70B, V5E, 8, 32, 8192, weights="int8", cache="int8")
    _near(r.cache_bytes, 41.9e9)
    _near(r.weight_bytes, 70e9)
    assert least_chips(LLAMA3_70B, V5E, 32, 8192, weights="int8", cache="int8") == 7
    assert r.fits  # on a 4x2 slice
    _near(r.decode_step_s, 17e-3)
    _near(r.tokens_per_s_per_chip, 235)
    assert r.decode_memory_s > r.decode_compute_s  # memory-bound
    r16 = serving_roofline(LLAMA3_70B, V5E, 16, 32, 8192, weights="int8", cache="int8")
    _near(r16.decode_step_s, 8.5e-3)


def test_prefill_is_compute_bound_at_the_stated_utilization():
    _near(prefill_s(LLAMA3_70B, V5E, 16, 8192, 0.4), 0.91)


@pytest.mark.parametrize("batch, book_ms", [(1, 4.98), (8, 12.13), (16, 20.30)])
def test_llama2_13b_decode_step_by_batch(batch, book_ms):
    r = serving_roofline(LLAMA2_13B, V5E, 8, batch, 8192)
    _near(r.decode_step_s, book_ms * 1e-3)


def test_bad_serving_input_names_the_value():
    with pytest.raises(PlanError, match="cache='int4'"):
        serving_roofline(LLAMA2_13B, V5E, 8, 1, 8192, cache="int4")
    with pytest.raises(PlanError, match="batch=0"):
        serving_roofline(LLAMA2_13B, V5E, 8, 0, 8192)
    with pytest.raises(PlanError, match="mfu=0"):
        prefill_s(LLAMA2_13B, V5E, 8, 1024, 0)
