"""Mixtures of experts: their shapes, parameter counts against the model cards, config.json
files, and the refusals where only dense models are built."""

import json

import pytest

from helpers import assert_usage_error
from shardscope._src.base.errors import ModelConfigError, PlanError
from shardscope._src.model.config import ModelConfig
from shardscope._src.model.presets import MODEL_PRESETS, load_hf_config, model_preset

MOE = [p for p in MODEL_PRESETS.values() if p.experts]


def _attention(d, heads, kv, head_dim):
    return d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d


def test_mixtral_8x7b_counts_as_its_shape_says():
    d, layers, vocab, experts, ff = 4096, 32, 32000, 8, 14336
    expert = 3 * d * ff  # gate, up and down
    layer = _attention(d, 32, 8, 128) + experts * expert + d * experts + 2 * d
    total = layers * layer + 2 * vocab * d + d  # untied embedding and unembedding, final norm
    p = model_preset("mixtral-8x7b")
    assert p.param_count() == total
    assert p.active_param_count() == total - layers * (experts - 2) * expert


def test_a_shared_expert_is_active_for_every_token():
    d, layers, vocab, experts, ff = 5120, 48, 202048, 16, 8192
    expert = 3 * d * ff
    layer = _attention(d, 40, 8, 128) + (experts + 1) * expert + d * experts + 2 * d
    total = layers * layer + 2 * vocab * d + d
    p = model_preset("llama4-scout")
    assert p.param_count() == total
    assert p.active_param_count() == total - layers * (experts - 1) * expert


def test_an_active_count_without_the_embedding_is_the_cards_when_it_says_so():
    p = model_preset("gpt-oss-20b")
    config = p.config(batch=1)
    assert not p.active_counts_embedding
    assert p.active_param_count() == config.active_param_count() - 201088 * 2880


def _unit(x):
    """One unit of the last digit a card states: 3.3e9 -> 1e8, 20.91e9 -> 1e7."""
    text = f"{x / 1e9:g}"
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 10.0 ** (9 - decimals)


@pytest.mark.parametrize("preset", MOE, ids=lambda p: p.name)
def test_the_counts_are_the_model_cards(preset):
    total, active = preset.param_count(), preset.active_param_count()
    if preset.published_extra is None:  # Llama 4 Scout's 109B count its vision encoder too
        assert abs(total - preset.published_params) <= 0.005 * preset.published_params
    # a card's active count is given to two or three digits: within one unit of its last
    # digit, and within 0.5% where it states four digits or more
    published = preset.published_active
    assert abs(active - published) < _unit(published)
    if len(f"{published / 1e9:g}".replace(".", "")) >= 3:
        assert abs(active - published) <= 0.005 * published


def _write(tmp_path, **fields):
    base = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **fields}))
    return path


def test_a_mixtral_config_json_reads_its_experts(tmp_path):
    path = _write(tmp_path, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    read = load_hf_config(path)
    assert (read.experts, read.top_k, read.expert_ff) == (8, 2, 14336)
    assert read.param_count() == model_preset("mixtral-8x7b").param_count()


def test_a_qwen3_moe_config_json_reads_its_experts(tmp_path):
    path = _write(
        tmp_path,
        model_type="qwen3_moe",
        hidden_size=2048,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        num_hidden_layers=48,
        vocab_size=151936,
    )
    read = load_hf_config(path)
    assert (read.experts, read.top_k, read.expert_ff) == (128, 8, 768)
    assert read.param_count() == model_preset("qwen3-30b-a3b").param_count()


def test_deepseek_v3_counts_as_its_shape_says_and_its_config_json_reads_the_same(tmp_path):
    d, heads, layers, vocab = 7168, 128, 61, 129280
    q_lora, kv_lora, nope, rope, v = 1536, 512, 128, 64, 128
    attention = (
        d * q_lora
        + q_lora
        + q_lora * heads * (nope + rope)  # queries through their latent
        + d * (kv_lora + rope)
        + kv_lora
        + kv_lora * heads * (nope + v)  # keys and values
        + heads * v * d  # output
    )
    expert = 3 * d * 2048
    dense = attention + 3 * d * 18432 + 2 * d
    moe = attention + 256 * expert + expert + d * 256 + 2 * d  # routed, shared, router
    total = 3 * dense + 58 * moe + 2 * vocab * d + d
    p = model_preset("deepseek-v3")
    assert p.param_count() == total
    assert p.active_param_count() == total - 58 * (256 - 8) * expert
    path = _write(
        tmp_path,
        model_type="deepseek_v3",
        hidden_size=d,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=layers,
        vocab_size=vocab,
        n_routed_experts=256,
        num_experts_per_tok=8,
        n_shared_experts=1,
        first_k_dense_replace=3,
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v,
        n_group=8,
        topk_group=4,
    )
    read = load_hf_config(path)
    assert read.param_count() == total
    # each token's experts from 4 of 8 groups, as the preset routes them
    assert read.config(batch=1).group_limit == p.config(batch=1).group_limit == (8, 4)


def test_a_config_json_with_experts_it_cannot_read_is_refused_not_read_dense(tmp_path):
    path = _write(tmp_path, model_type="dbrx", num_experts=16)
    with pytest.raises(ModelConfigError, match="'dbrx'.*num_experts"):
        load_hf_config(path)
    bad = _write(tmp_path, model_type="mixtral", num_local_experts=8, num_experts_per_tok=0)
    with pytest.raises(ModelConfigError, match="num_experts_per_tok=0"):
        load_hf_config(bad)
    # more experts a token than the model has: the file's keys, not the planner's names
    many = _write(tmp_path, model_type="mixtral", num_local_experts=8, num_experts_per_tok=10)
    with pytest.raises(ModelConfigError) as err:
        load_hf_config(many)
    assert str(many) in str(err.value)
    assert "num_experts_per_tok=10 routes each token to more experts than its " in str(err.value)
    assert "num_local_experts=8; give at most 8" in str(err.value)


def test_a_model_folder_is_read_by_its_config_json(tmp_path):
    path = _write(tmp_path, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    assert model_preset(str(path.parent)) == load_hf_config(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlanError, match="is a folder without a config.json") as err:
        model_preset(str(empty))
    assert err.value.params == ("model",)


def test_bad_expert_settings_name_the_value():
    with pytest.raises(ModelConfigError, match="top_k=3: each token goes to 1 to experts=2"):
        ModelConfig(experts=2, top_k=3)
    with pytest.raises(ModelConfigError, match="top_k=2 describe a mixture of experts"):
        ModelConfig(top_k=2)
    with pytest.raises(ModelConfigError, match="dense_layers=2"):
        ModelConfig(layers=2, experts=4, top_k=1, dense_layers=2)
    with pytest.raises(ModelConfigError, match="experts=-1"):
        ModelConfig(experts=-1)
    # a group limit: groups dividing the experts, a token's from no more of them, and its
    # top_k within the experts of the groups it may use; none without experts
    with pytest.raises(ModelConfigError, match="expert_groups=3, groups_per_token=1"):
        ModelConfig(experts=8, top_k=2, expert_groups=3)
    with pytest.raises(ModelConfigError, match="expert_groups=4, groups_per_token=5"):
        ModelConfig(experts=8, top_k=2, expert_groups=4, groups_per_token=5)
    with pytest.raises(ModelConfigError, match="top_k=3: a token's experts come from"):
        ModelConfig(experts=8, top_k=3, expert_groups=4, groups_per_token=1)
    with pytest.raises(ModelConfigError, match="groups_per_token=0"):
        ModelConfig(experts=8, top_k=2, groups_per_token=0)
    with pytest.raises(ModelConfigError, match="expert_groups=2 describe a mixture"):
        ModelConfig(expert_groups=2)


def test_what_the_planner_cannot_price_for_a_mixture_is_refused_naming_the_flag(capsys):
    line = assert_usage_error(
        ["plan", "--model", "qwen3-30b-a3b", "--devices", "8", "--remat", "matmuls"],
        "mixture of experts",
        capsys,
    )
    assert "--remat" in line
    line = assert_usage_error(
        ["plan", "--model", "llama3-8b", "--devices", "8", "--strategies", "fsdp_ep"],
        "has none",
        capsys,
    )
    assert "--strategies" in line
