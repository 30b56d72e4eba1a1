"""attnlib.MultiHeadLatentAttention against transformers' DeepseekV3Attention on the same (random) weights,
its absorbed decoding form against its plain form, and LatentCache against no cache."""

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention, DeepseekV3RMSNorm,
                                                                   DeepseekV3RotaryEmbedding)

from attnlib import KVCache, LatentCache, MultiHeadLatentAttention
from attnlib.mla import LatentRMSNorm

D, H, R, NOPE, ROPE, DV = 64, 4, 16, 8, 6, 10  # every width different: no axis can stand in for another


def deepseek_attention(q_lora_rank=24, *, rope_interleave=True, attention_bias=False, rope_theta=10000.0,
                       dtype=torch.float64, seed=0) -> DeepseekV3Attention:
    """A seeded random DeepseekV3Attention running SDPA (its eager softmax is float32 whatever the dtype)."""
    config = DeepseekV3Config(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora_rank,
                              kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=DV,
                              max_position_embeddings=64, num_hidden_layers=1, rope_interleave=rope_interleave,
                              attention_bias=attention_bias, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": rope_theta})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    attn = DeepseekV3Attention(config, layer_idx=0).to(dtype).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():  # norms start at 1 and biases at 0 in transformers: hide nothing
            if "layernorm" in name or name.endswith("bias"):
                p.normal_(1.0 if "layernorm" in name else 0.0, 0.3)
    return attn


def reference(attn: DeepseekV3Attention, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """transformers' output for x (B, T, D) at positions 0..T-1 with a bool mask (B, 1, T, T)."""
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    cos, sin = DeepseekV3RotaryEmbedding(attn.config)(x, positions)
    additive = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        return attn(x, (cos, sin), attention_mask=additive)[0]


def causal(B: int, T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T)


def inputs(B=2, T=9, dtype=torch.float64, seed=1) -> torch.Tensor:
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("q_lora_rank, interleave, bias, theta", [
    (24, True, False, 10000.0), (None, True, False, 10000.0), (24, False, False, 10000.0),
    (None, False, True, 10000.0), (24, True, True, 500.0),
])
def test_equals_deepseek_v3_attention_in_float64(q_lora_rank, interleave, bias, theta):
    attn = deepseek_attention(q_lora_rank, rope_interleave=interleave, attention_bias=bias, rope_theta=theta)
    ours = MultiHeadLatentAttention.from_hf(attn)
    assert (ours.q_lora_rank is None) == (q_lora_rank is None)
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, is_causal=True), reference(attn, x, causal(2, 9)), rtol=0, atol=1e-10)


def test_equals_deepseek_v3_with_a_padding_mask_and_in_float32():
    attn = deepseek_attention()
    ours = MultiHeadLatentAttention.from_hf(attn)
    x = inputs(B=3, T=8)
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[0, :3] = valid[2, :5] = False                      # left padding
    allowed = causal(3, 8) & valid[:, None, None, :]
    allowed = allowed | torch.eye(8, dtype=torch.bool)       # padded queries see themselves: no empty rows
    with torch.no_grad():
        torch.testing.assert_close(ours(x, mask=allowed), reference(attn, x, allowed), rtol=0, atol=1e-10)
    attn32 = deepseek_attention(dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(MultiHeadLatentAttention.from_hf(attn32)(x.float(), is_causal=True),
                                   reference(attn32, x.float(), causal(3, 8)), rtol=0, atol=1e-5)


def test_interleaved_rope_is_a_permutation_of_the_rotary_rows():
    a, b = deepseek_attention(rope_interleave=True), deepseek_attention(rope_interleave=False)
    ours_a, ours_b = MultiHeadLatentAttention.from_hf(a), MultiHeadLatentAttention.from_hf(b)
    assert torch.equal(a.q_b_proj.weight, b.q_b_proj.weight)   # the same seed: the same parameters
    assert not torch.equal(ours_a.q_up.weight, ours_b.q_up.weight)
    rope_rows = ours_a.q_up.weight.unflatten(0, (H, NOPE + ROPE))[:, NOPE:]
    theirs = a.q_b_proj.weight.unflatten(0, (H, NOPE + ROPE))[:, NOPE:]
    assert torch.equal(rope_rows[:, :ROPE // 2], theirs[:, 0::2]) and torch.equal(rope_rows[:, ROPE // 2:], theirs[:, 1::2])


def test_latent_norm_computes_in_float32_as_transformers_does():
    theirs = DeepseekV3RMSNorm(R).double()
    ours = LatentRMSNorm(R).double()
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.3)
        ours.weight.copy_(theirs.weight)
    x = torch.randn(50, R, dtype=torch.float64)
    assert torch.equal(ours(x), theirs(x))
    assert torch.equal(ours.float()(x.float()), theirs.float()(x.float()))


@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_absorbed_form_equals_the_plain_one(q_lora_rank):
    ours = MultiHeadLatentAttention.from_hf(deepseek_attention(q_lora_rank))
    x = inputs(T=11)
    mask = torch.rand(2, 1, 11, 11, generator=torch.Generator().manual_seed(3)) > 0.3
    with torch.no_grad():
        torch.testing.assert_close(ours.absorbed(x, is_causal=True), ours(x, is_causal=True), rtol=0, atol=1e-12)
        torch.testing.assert_close(ours.absorbed(x, mask=mask), ours(x, mask=mask), rtol=0, atol=1e-12)


@pytest.mark.parametrize("form", ["forward", "absorbed"])
def test_cached_decoding_equals_uncached(form):
    ours = MultiHeadLatentAttention.from_hf(deepseek_attention())
    x = inputs(T=12)
    cache = LatentCache()
    with torch.no_grad():
        whole = ours(x, is_causal=True)
        run = getattr(ours, form)
        pieces = [run(x[:, a:b], is_causal=True, cache=cache) for a, b in ((0, 5), (5, 6), (6, 7), (7, 12))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=1e-12)
    assert cache.seq_len == 12 and len(cache) == 1 and cache.batch_size == 2


def test_latent_cache_holds_r_plus_rope_numbers_per_token_and_layer():
    ours = [MultiHeadLatentAttention(D, H, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
                                     v_head_dim=DV, layer_idx=i) for i in range(3)]
    cache = LatentCache()
    with torch.no_grad():
        x = inputs(B=2, T=7, dtype=torch.float32)
        for layer in ours:
            layer(x, is_causal=True, cache=cache)
    assert cache.nbytes == 3 * 2 * 7 * (R + ROPE) * 4                        # layers · B · S · (r + D_R) · fp32
    mha = KVCache()                                                          # per-head keys and values instead
    for i in range(3):
        mha.update(i, torch.zeros(2, H, 7, NOPE + ROPE), torch.zeros(2, H, 7, DV))
    assert mha.nbytes == 3 * 2 * 7 * H * (NOPE + ROPE + DV) * 4 > cache.nbytes


def test_bad_input_is_a_clear_error():
    ours = MultiHeadLatentAttention.from_hf(deepseek_attention(dtype=torch.float32))
    with pytest.raises(ValueError, match=r"x of shape \(2, 5\) is not \(B, T, D\) with D=64"):
        ours(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        ours(torch.zeros(2, 5, D, dtype=torch.long))
    with pytest.raises(TypeError, match="cache must be an attnlib.LatentCache"):
        ours(torch.zeros(1, 2, D), cache=KVCache())
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) does not broadcast to scores \(1, 4, 2, 2\)"):
        ours(torch.zeros(1, 2, D), mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="must be a transformers DeepseekV3Attention, got Linear"):
        MultiHeadLatentAttention.from_hf(torch.nn.Linear(2, 2))
    yarn = deepseek_attention()
    yarn.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ValueError, match="only plain RoPE is modelled, got rope_type='yarn'"):
        MultiHeadLatentAttention.from_hf(yarn)
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive int, got 0"):
        MultiHeadLatentAttention(D, H, kv_lora_rank=0, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    with pytest.raises(ValueError, match="q_lora_rank must be a positive int, got 0"):
        MultiHeadLatentAttention(D, H, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                 q_lora_rank=0)
    with pytest.raises(ValueError, match="latent of shape .* is not \\(B, S_new, width\\)"):
        LatentCache().update(0, torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3))
