"""Whole hybrid and sparse models from attnlib.from_hf against transformers 5.24 (tiny configs, tests/hf_tiny.py).

Qwen3.5 (3 Gated DeltaNet layers per gated full-attention layer): logits on a left-padded batch (<= 1e-4 in
float32) and greedy generate token for token, decoding from `make_cache()`'s HybridCache, whose bytes grow by the
attention layers' keys and values only; with every layer linear they do not grow at all (transformers' generate
fails on that config: its forward is the reference). DeepSeek-V3.2 with dense MLPs and top-k 4 < T: logits and
greedy generation, cached and not. The registry converts the two layers too; bad input is a named error.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers as tf

import attnlib
from attnlib import layer_io
from attnlib.decoder import LlamaDecoder
from attnlib.gated_deltanet import GatedDeltaNet
from attnlib.hybrid import HybridCache
from attnlib.sparse_attention import DeepSeekSparseAttention, IndexedLatentCache
from hf_tiny import DEEPSEEK_V32_DENSE, QWEN3_5_ALL_LINEAR, QWEN3_5_HYBRID, left_padded, tiny

torch.set_num_threads(1)
TOL = 1e-4


@functools.cache
def pair(name: str) -> tuple[torch.nn.Module, LlamaDecoder]:
    """(the transformers model, attnlib's conversion), every parameter perturbed."""
    model = {"hybrid": lambda: tiny(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, **QWEN3_5_HYBRID),
             "linear": lambda: tiny(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, **QWEN3_5_ALL_LINEAR),
             "dsa": lambda: tiny(tf.DeepseekV32ForCausalLM, tf.DeepseekV32Config, **DEEPSEEK_V32_DENSE)}[name]()
    return model, attnlib.from_hf(model)


def decode(ours: LlamaDecoder, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[int], HybridCache]:
    """Greedy decoding by hand from ours.make_cache(): the tokens (B, T + steps) and the cache's nbytes after
    the prefill and after each token fed back (steps of them, the last one fed too)."""
    cache, out = ours.make_cache(), ids
    with torch.no_grad():
        logits, sizes = ours(ids, cache, last_only=True), [cache.nbytes]
        for _ in range(steps):
            out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)    # (B, T + n)
            logits = ours(out[:, -1:], cache)
            sizes.append(cache.nbytes)
    return out, sizes, cache


def test_qwen3_5_hybrid_logits_left_padded():
    model, ours = pair("hybrid")
    assert [type(b.attn).__name__ for b in ours.blocks] == ["LinearMixer"] * 3 + ["VariantAttention"]
    ids, mask = left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate gives transformers: padding shifts nothing
    with torch.no_grad():
        theirs = model(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask)
    real = mask.bool()
    assert (got - theirs)[real].abs().max() <= TOL
    assert theirs[real].std() > 0.1  # logits that say something: the comparison can fail


def test_heads_of_a_given_width_need_not_divide_the_model_width():
    """Qwen3.5 states head_dim: 3 heads of 16 in a width of 64 is a valid model, converted, not refused."""
    model = tiny(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, **{**QWEN3_5_HYBRID, "num_attention_heads": 3,
                                                                "num_key_value_heads": 1})
    ids, mask = left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = model(ids, attention_mask=mask, position_ids=positions).logits
        got = attnlib.from_hf(model)(ids, attention_mask=mask)
    assert (got - theirs)[mask.bool()].abs().max() <= TOL


def test_qwen3_5_hybrid_generates_transformers_tokens():
    model, ours = pair("hybrid")
    ids, mask = left_padded()
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    got = attnlib.generate(ours, ids, 10, attention_mask=mask)
    assert torch.equal(got, theirs)
    assert torch.equal(attnlib.generate(ours, ids, 10, attention_mask=mask, use_cache=False), got)


def test_hybrid_cache_grows_by_the_attention_layers_keys_and_values_only():
    model, ours = pair("hybrid")
    ids, _ = left_padded(B=2, T=7, seed=4)
    _, sizes, cache = decode(ours, ids, 6)
    assert isinstance(cache, HybridCache) and cache.seq_len == 7 + 6
    c = model.config
    C = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    state = 2 * (C * (c.linear_conv_kernel_dim - 1) + c.linear_num_value_heads * c.linear_key_head_dim
                 * c.linear_value_head_dim) * 4                                   # B = 2, float32
    per_token = 2 * 2 * c.num_key_value_heads * c.head_dim * 4                      # K and V, B = 2, one layer
    assert cache.state_nbytes == 3 * state
    assert sizes == [3 * state + per_token * n for n in range(7, 14)]
    assert cache.nbytes == cache.state_nbytes + cache.kv_nbytes


def test_all_linear_model_decodes_from_a_state_that_does_not_grow():
    model, ours = pair("linear")
    ids, _ = left_padded(B=2, T=6, seed=5)
    out, sizes, cache = decode(ours, ids, 12)
    assert cache.kv_nbytes == 0 and len(set(sizes)) == 1 and sizes[0] == cache.nbytes > 0
    assert torch.equal(attnlib.generate(ours, ids, 12), out)
    with pytest.raises(ValueError, match="only contain LinearAttention layers"):
        model.generate(ids, max_new_tokens=2, do_sample=False)  # transformers 5.24's generate fails on this config
    with torch.no_grad():  # its forward (without its cache, which fails the same way) is the reference
        theirs = model(out, use_cache=False).logits
        ref = ours(out)
    assert torch.equal(theirs[:, 5:-1].argmax(-1), out[:, 6:])  # each token is transformers' greedy choice
    assert (ref - theirs).abs().max() <= TOL and theirs.std() > 0.1


def test_deepseek_v32_logits_and_the_selection_decides():
    model, ours = pair("dsa")
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = model(ids).logits
        got = ours(ids)
        for block in ours.blocks:  # the same weights attending to every key: another output
            block.attn.dsa.indexer.topk = 12
        dense = ours(ids)
        for block in ours.blocks:
            block.attn.dsa.indexer.topk = 4
    assert (got - theirs).abs().max() <= TOL and theirs.std() > 0.1
    assert (dense - theirs)[:, 4:].abs().amax(-1).min() > 10 * TOL  # past 4 tokens, every position is sparse


def test_deepseek_v32_generates_transformers_tokens():
    model, ours = pair("dsa")
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    assert isinstance(ours.make_cache(), IndexedLatentCache)
    assert torch.equal(attnlib.generate(ours, ids, 8), model.generate(ids, max_new_tokens=8, do_sample=False))
    # without a cache transformers re-runs top-k over longer rows, which breaks ties differently: ours does the same
    assert torch.equal(attnlib.generate(ours, ids, 8, use_cache=False),
                       model.generate(ids, max_new_tokens=8, do_sample=False, use_cache=False))


def test_registry_converts_the_two_layers():
    assert {"Qwen3_5ForCausalLM", "DeepseekV32ForCausalLM", "Qwen3_5GatedDeltaNet",
            "DeepseekV32Attention"} <= set(attnlib.from_hf.__globals__["supported"]())
    for name, kind, attr in (("hybrid", GatedDeltaNet, "linear_attn"), ("dsa", DeepSeekSparseAttention, "self_attn")):
        model, _ = pair(name)
        ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(6))
        io = layer_io(model, f"model.layers.0.{attr}", ids)
        x, y = io.x, io.y
        layer = attnlib.from_hf(getattr(model.model.layers[0], attr))
        assert isinstance(layer, kind)
        with torch.no_grad():
            assert (layer(x) - y).abs().max() <= 1e-5 and y.abs().max() > 0.1


def test_bad_input_is_a_named_error():
    _, hybrid = pair("hybrid")
    _, linear = pair("linear")
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(7))
    with pytest.raises(TypeError, match="Gated DeltaNet layer, whose state a KVCache cannot hold"):
        hybrid(ids, attnlib.KVCache())
    with pytest.raises(ValueError, match=r"the cache holds 3 layers but this decoder has 4"):
        cache = linear.make_cache()
        linear(ids, cache)
        hybrid(ids, cache)
    with pytest.raises(ValueError, match="layer 3 of this cache holds linear state, but a layer of kind 'attention'"):
        hybrid(ids, HybridCache(["linear"] * 4))
    other = tiny(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, **{**QWEN3_5_HYBRID, "linear_num_value_heads": 2})
    cache = attnlib.from_hf(other).make_cache()  # same layer kinds, another model's widths
    attnlib.from_hf(other)(ids, cache)
    with pytest.raises(ValueError, match=r"state.conv of shape \(1, 96, 3\) does not fit this layer: expected "
                                         r"\(1, 128, 3\)"):
        hybrid(ids, cache)
    for overrides, message in ((dict(num_key_value_heads=3), "num_kv_heads=3 must divide num_heads=4"),
                               (dict(linear_num_key_heads=3), "num_v_heads=4 is not a multiple of num_k_heads=3")):
        with pytest.raises(ValueError, match=message):
            attnlib.from_hf(tiny(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig, **{**QWEN3_5_HYBRID, **overrides}))
    with pytest.raises(ValueError, match="kinds must list one of"):
        HybridCache(["linear", "mamba"])
    with pytest.raises(ValueError, match="num_v_heads=6 is not a multiple of num_k_heads=4"):
        GatedDeltaNet(64, 4, 6, 16, 16)
    _, dsa = pair("dsa")
    ids, mask = left_padded(B=2, T=6)
    with pytest.raises(ValueError, match="unpadded batches"):
        dsa(ids, attention_mask=mask)
    moe = tiny(tf.DeepseekV32ForCausalLM, tf.DeepseekV32Config, **{**DEEPSEEK_V32_DENSE, "first_k_dense_replace": 1,
                                                                    "n_routed_experts": 2, "num_experts_per_tok": 1})
    with pytest.raises(TypeError, match="layer 1's MLP is a DeepseekV32MoE"):
        attnlib.from_hf(moe)
