"""attnlib.from_hf against transformers 5.24 on tiny random models, every parameter perturbed (tests/hf_tiny.py).

Whole models: logits on a left-padded batch (<= 1e-4 in float32 at real tokens) and cached greedy generate
token for token (Gemma 3's 4-token windows included: prompt and generation outgrow them). Every attention
layer on its own, against what it returns inside its model. Then the error cases.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers as tf

import attnlib
from attnlib.caches.layer_windows import LayerWindowCache
from attnlib import layer_io
from attnlib.decoder import LlamaDecoder
from attnlib.variants import VariantAttention
from hf_tiny import left_padded, tiny

torch.set_num_threads(1)
TOL = 1e-4

MODELS = {
    "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config, {}),
    "qwen3-wide-heads-tied": (tf.Qwen3ForCausalLM, tf.Qwen3Config, dict(head_dim=8, tie_word_embeddings=True)),
    "olmo2": (tf.Olmo2ForCausalLM, tf.Olmo2Config, dict(attention_bias=True)),
    "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config, dict(num_hidden_layers=4, no_rope_layer_interval=2)),
    "diffllama": (tf.DiffLlamaForCausalLM, tf.DiffLlamaConfig, {}),
    "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig,
               dict(num_hidden_layers=4, sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=16)),
    "gemma3-softcap-linear-rope": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig, dict(
        num_hidden_layers=4, sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=16,
        final_logit_softcapping=3.0, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
}
LAYERS = {  # one layer's attention: (model class, config class, overrides)
    "gpt-oss": (tf.GptOssForCausalLM, tf.GptOssConfig, dict(sliding_window=4, num_local_experts=2, num_experts_per_tok=1)),
    "qwen3.5": (tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, dict(
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4)),
}


@functools.cache
def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the transformers model, attnlib's conversion)."""
    model_cls, config_cls, overrides = MODELS[name]
    model = tiny(model_cls, config_cls, **overrides)
    return model, attnlib.from_hf(model)


@pytest.mark.parametrize("name", MODELS)
def test_logits_left_padded(name: str) -> None:
    model, ours = pair(name)
    assert isinstance(ours, LlamaDecoder)
    ids, mask = left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate gives transformers: padding shifts nothing
    with torch.no_grad():
        theirs = model(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask)
    assert got.shape == theirs.shape == (3, 9, 97)
    real = mask.bool()
    assert (got - theirs)[real].abs().max() <= TOL
    assert theirs[real].std() > 0.1  # logits that say something: the comparison can fail


@pytest.mark.parametrize("name", MODELS)
def test_generate_greedy_equals_transformers(name: str) -> None:
    model, ours = pair(name)
    ids, mask = left_padded()
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    got = attnlib.generate(ours, ids, 8, attention_mask=mask)
    assert torch.equal(got, theirs)
    assert torch.equal(attnlib.generate(ours, ids, 8, attention_mask=mask, use_cache=False), got)


@pytest.mark.parametrize("name", MODELS)
def test_each_attention_layer_on_its_own(name: str) -> None:
    model, _ = pair(name)
    ids, _ = left_padded(B=2, T=10, seed=1)
    for i, layer in enumerate(model.model.layers):
        io = layer_io(model, f"model.layers.{i}.self_attn", ids)
        x, y = io.x, io.y
        ours = attnlib.from_hf(layer.self_attn)
        assert isinstance(ours, VariantAttention)
        with torch.no_grad():
            assert (ours(x) - y).abs().max() <= TOL, f"layer {i}"


@pytest.mark.parametrize("name", LAYERS)
def test_single_attention_module(name: str) -> None:
    model_cls, config_cls, overrides = LAYERS[name]
    model = tiny(model_cls, config_cls, **overrides)
    ids, _ = left_padded(B=2, T=12, seed=2)   # 12 tokens: gpt-oss's 4-token windows hide most keys
    layers = [i for i, kind in enumerate(model.config.layer_types) if kind != "linear_attention"]
    for i in layers:
        io = layer_io(model, f"model.layers.{i}.self_attn", ids)
        x, y = io.x, io.y
        ours = attnlib.from_hf(model.model.layers[i].self_attn)
        with torch.no_grad():
            assert (ours(x) - y).abs().max() <= TOL, f"layer {i}"
    if name == "gpt-oss":  # one windowed and one full layer, YaRN's attention factor on cos and sin
        windows = [attnlib.from_hf(model.model.layers[i].self_attn).window for i in layers]
        assert windows == [4, None]
        assert attnlib.from_hf(model.model.layers[0].self_attn).rotary.attention_scaling > 1.3


def test_a_forgotten_weight_shows() -> None:
    """The perturbation makes every copied weight count: off by one norm weight, the check fails."""
    model, ours = pair("gemma3")
    ids, _ = left_padded(B=1, T=6)
    with torch.no_grad():
        theirs = model(ids).logits
        ours.blocks[1].attn.qk_norm.k_norm.weight.sub_(0.05)   # as if the noise on it had been dropped
        try:
            assert (ours(ids) - theirs).abs().max() > TOL
        finally:
            ours.blocks[1].attn.qk_norm.k_norm.weight.add_(0.05)


def test_llama_mistral_and_deepseek_go_through_the_same_registry() -> None:
    llama = tiny(tf.LlamaForCausalLM, tf.LlamaConfig)
    ids, _ = left_padded(B=1, T=5)
    ours = attnlib.from_hf(llama)
    assert type(ours) is LlamaDecoder and ours.is_llama
    with torch.no_grad():
        assert (ours(ids) - llama(ids).logits).abs().max() <= TOL
    mistral = tiny(tf.MistralForCausalLM, tf.MistralConfig, sliding_window=3)
    assert attnlib.from_hf(mistral).sliding_window == 3
    config = tf.DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=None,
                                 num_hidden_layers=1, rope_interleave=True)
    attn = tf.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention(config, layer_idx=0)
    assert isinstance(attnlib.from_hf(attn), attnlib.MultiHeadLatentAttention)


def test_unsupported_class_names_it_and_lists_the_supported() -> None:
    with pytest.raises(TypeError, match=r"does not convert a torch.nn.modules.linear.Linear.*Gemma3ForCausalLM.*Qwen3_5Attention"):
        attnlib.from_hf(torch.nn.Linear(2, 2))
    phi = tf.PhiForCausalLM(tf.PhiConfig(vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(TypeError, match="PhiForCausalLM"):
        attnlib.from_hf(phi)


def test_moe_in_a_whole_model_is_a_type_error_naming_it() -> None:
    model = tiny(*LAYERS["gpt-oss"][:2], **LAYERS["gpt-oss"][2])
    with pytest.raises(TypeError, match=r"GptOssMLP \(a mixture of experts"):
        attnlib.from_hf(model)


def test_unknown_rope_type_is_a_value_error_naming_it() -> None:
    model = tiny(tf.Qwen3ForCausalLM, tf.Qwen3Config, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="rope_type='llama3' is not modelled"):
        attnlib.from_hf(model)
    with pytest.raises(ValueError, match="rope_type='llama3' is not modelled"):
        attnlib.from_hf(model.model.layers[0].self_attn)


def test_gemma3_attention_softcapping_is_refused() -> None:
    model, _ = pair("gemma3")
    attn = model.model.layers[0].self_attn
    attn.config.attn_logit_softcapping = 50.0
    try:
        with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
            attnlib.from_hf(attn)
    finally:
        attn.config.attn_logit_softcapping = None


@pytest.mark.parametrize("params", [
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
     "truncate": False, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.7,
     "original_max_position_embeddings": 64},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0},
])
def test_rope_frequencies_equal_transformers(params: dict) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlib.variants import rotary_from_config
    config = tf.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=256,
                            rope_parameters=dict(params))
    theirs, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    ours = rotary_from_config(params, 16, 256)
    torch.testing.assert_close(ours.inv_freq, theirs, rtol=1e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(scaling, rel=1e-12)


def test_gemma3_cache_keeps_each_layers_window() -> None:
    """make_cache gives Gemma 3 a cache whose 4-token-window layers keep 3 positions and whose global layers
    keep all; 24 new tokens (well past the window) still equal transformers', as with a cache keeping all."""
    model, ours = pair("gemma3")
    ids, mask = left_padded()
    cache = ours.make_cache()
    assert isinstance(cache, LayerWindowCache) and cache.windows == (4, None, 4, None)
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    assert torch.equal(attnlib.generate(ours, ids, 24, attention_mask=mask, cache=cache), theirs)
    assert torch.equal(attnlib.generate(ours, ids, 24, attention_mask=mask, cache=attnlib.KVCache()), theirs)
    per_position = 3 * 2 * (16 + 16) * 4                   # B · H_kv · (Dh of K + Dh of V) · 4 bytes
    fed = 9 + 23                                           # the prompt, then every new token but the last
    assert cache.nbytes == per_position * (2 * fed + 2 * 3)


def test_a_sink_cache_is_refused_by_layers_with_their_own_rope() -> None:
    """SinkCache re-rotates kept keys with one RoPE for all layers; SmolLM3's NoPE layers have none."""
    _, ours = pair("smollm3")
    with pytest.raises(ValueError, match="SinkCache re-rotates"):
        ours(left_padded(B=1, T=4)[0], attnlib.SinkCache(1, 2))
