"""attnlib.LlamaDecoder against transformers' LlamaForCausalLM on the same (random) weights."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from attnlib import KVCache, LlamaDecoder
from attnlib.llama_block import RMSNorm, SwiGLU

VOCAB, MAX_POS = 1000, 128


def tiny_llama(heads: int = 8, kv_heads: int = 2, layers: int = 4, **extra) -> LlamaForCausalLM:
    """A seeded random Llama (hidden 256) with every weight random, norms included."""
    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=VOCAB,
                         max_position_embeddings=MAX_POS, initializer_range=0.1, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None, attn_implementation="eager", **extra)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)  # HF starts them at 1 and 0: hide nothing
    return model


@pytest.fixture(scope="module")
def pair():
    hf = tiny_llama()
    return hf, LlamaDecoder.from_hf(hf)


def ids(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("heads, kv_heads, extra", [
    (8, 2, {}), (8, 8, {}), (8, 1, {}),
    (4, 2, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    (8, 4, {"rope_theta": 500.0, "rms_norm_eps": 1e-5}),
])
def test_logits_equal_transformers(heads, kv_heads, extra, monkeypatch):
    hf = tiny_llama(heads, kv_heads, **extra)
    x = ids(2, 50)
    with torch.no_grad():
        torch.testing.assert_close(LlamaDecoder.from_hf(hf)(x), hf(x).logits, rtol=0, atol=1e-4)
        # float64 shows that the fp32 gap above is rounding, not a different computation. Two steps
        # of transformers stay in fp32 whatever the model's dtype: RMSNorm (patched to float64 here)
        # and eager attention's softmax (`softmax(..., dtype=torch.float32)`, a ~2e-6 gap in the
        # logits), so the float64 model runs SDPA, which keeps float64. What is left is float64
        # rounding of a different op order (fused QKV, SDPA kernels): ~4e-14, far below 1e-10.
        monkeypatch.setattr(LlamaRMSNorm, "forward", _rmsnorm_float64)
        hf64 = hf.double()
        hf64.set_attn_implementation("sdpa")
        torch.testing.assert_close(LlamaDecoder.from_hf(hf64)(x), hf64(x).logits, rtol=0, atol=1e-10)


def test_bfloat16_is_as_close_to_float32_as_transformers_own_bfloat16():
    """In bf16 no two paths agree bit for bit (transformers' eager and SDPA paths differ by ~0.2 in the
    logits of this model), so the property is: ours is no further from the fp32 logits than theirs."""
    hf, x = tiny_llama(), ids(2, 30)
    with torch.no_grad():
        reference = hf(x).logits
        hf.to(torch.bfloat16)
        ours = LlamaDecoder.from_hf(hf)(x)
        errors = {}
        for impl in ("eager", "sdpa"):
            hf.set_attn_implementation(impl)
            errors[impl] = (hf(x).logits.float() - reference).abs().max().item()
    assert ours.dtype == torch.bfloat16
    assert (ours.float() - reference).abs().max().item() <= 1.5 * min(errors.values()), errors


def _rmsnorm_float64(self, x: torch.Tensor) -> torch.Tensor:
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def test_rmsnorm_and_swiglu_equal_transformers(pair):
    hf, _ = pair
    theirs_norm = LlamaRMSNorm(256, eps=1e-6)
    theirs_mlp = hf.model.layers[0].mlp
    assert isinstance(theirs_mlp, LlamaMLP)
    ours_norm, ours_mlp = RMSNorm(256, 1e-6), SwiGLU(256, 688)
    with torch.no_grad():
        theirs_norm.weight.normal_(1.0, 0.1)
        ours_norm.weight.copy_(theirs_norm.weight)
        ours_mlp.gate_up.weight.copy_(torch.cat([theirs_mlp.gate_proj.weight, theirs_mlp.up_proj.weight]))
        ours_mlp.down.weight.copy_(theirs_mlp.down_proj.weight)
        x = torch.randn(3, 5, 256) * 3
        assert torch.equal(ours_norm(x), theirs_norm(x))
        x64, w64 = x.double(), ours_norm.weight.double()
        formula = w64 * (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6))  # float64 throughout
        assert torch.equal(copy.deepcopy(ours_norm).double()(x64), formula)
        assert torch.equal(ours_norm(x.bfloat16()), theirs_norm(x.bfloat16()))  # fp32 weight: fp32 out
        assert torch.equal(ours_norm.bfloat16()(x.bfloat16()), theirs_norm.bfloat16()(x.bfloat16()))
        torch.testing.assert_close(ours_mlp(x), theirs_mlp(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("cuts", [(1,), (17,), (5, 6, 30), tuple(range(1, 40))])
def test_chunked_prefill_equals_at_once(pair, cuts):
    _, dec = pair
    x = ids(2, 40)
    with torch.no_grad():
        whole = dec(x)
        cache, bounds = KVCache(), (0, *cuts, 40)
        pieces = [dec(x[:, a:b], cache) for a, b in zip(bounds, bounds[1:])]
    assert cache.seq_len == 40 and len(cache) == 4
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=1e-4)


def _left_pad(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(p) for p in prompts)
    batch, mask = torch.zeros(len(prompts), T, dtype=torch.long), torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        batch[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return batch, mask


def test_left_padded_batch_equals_each_alone_and_transformers(pair):
    hf, dec = pair
    prompts = [ids(1, n, seed=n)[0] for n in (3, 11, 7)]
    batch, mask = _left_pad(prompts)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # what transformers' generate passes
    with torch.no_grad():
        ours, theirs = dec(batch, attention_mask=mask), hf(batch, attention_mask=mask, position_ids=position_ids).logits
        for i, p in enumerate(prompts):
            real = slice(batch.shape[1] - len(p), None)
            torch.testing.assert_close(ours[i, real], dec(p[None])[0], rtol=0, atol=1e-4)
            torch.testing.assert_close(ours[i, real], theirs[i, real], rtol=0, atol=1e-4)


def test_left_padded_batch_with_cache_equals_without(pair):
    _, dec = pair
    batch, mask = _left_pad([ids(1, n, seed=n)[0] for n in (4, 9)])
    extra = ids(2, 3, seed=5)
    full_mask = torch.cat([mask, torch.ones_like(extra)], dim=1)
    with torch.no_grad():
        whole = dec(torch.cat([batch, extra], dim=1), attention_mask=full_mask)
        cache = KVCache()
        dec(batch, cache, attention_mask=mask)
        steps = [dec(extra[:, i:i + 1], cache, attention_mask=full_mask[:, :batch.shape[1] + i + 1])
                 for i in range(3)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole[:, -3:], rtol=0, atol=1e-4)


def test_last_only_is_the_last_row(pair):
    _, dec = pair
    with torch.no_grad():
        x = ids(2, 9)
        torch.testing.assert_close(dec(x, last_only=True), dec(x)[:, -1:], rtol=0, atol=1e-5)


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(ValueError, match=r"num_kv_heads=3 must divide num_heads=8"):
        LlamaDecoder(100, 64, 2, 8, 3, 128)
    with pytest.raises(ValueError, match=r"d_model=60 is not divisible by num_heads=8"):
        LlamaDecoder(100, 60, 2, 8, 2, 128)
    bad = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8,
                      num_key_value_heads=3, vocab_size=100, head_dim=8)  # transformers builds it
    with pytest.raises(ValueError, match=r"num_kv_heads=3 must divide num_heads=8"):
        LlamaDecoder.from_hf(LlamaForCausalLM(bad))


def test_positions_beyond_the_table_name_both_numbers(pair):
    _, dec = pair
    with pytest.raises(ValueError, match=r"position 128 is beyond max_position_embeddings=128"):
        dec(ids(1, MAX_POS + 1))
    cache = KVCache()
    with torch.no_grad():
        dec(ids(1, 120), cache)
        with pytest.raises(ValueError, match=r"position 129 is beyond max_position_embeddings=128: "
                                             r"120 cached \+ 10 new"):
            dec(ids(1, 10), cache)
    assert cache.seq_len == 120  # the failed call changed nothing
    mask = torch.ones(1, MAX_POS + 5, dtype=torch.long)
    mask[0, :5] = 0  # 128 real tokens after 5 pads: positions 0..127 fit
    with torch.no_grad():
        assert dec(ids(1, MAX_POS + 5), attention_mask=mask).shape == (1, MAX_POS + 5, VOCAB)


def test_a_cache_from_another_batch_size_is_refused(pair):
    _, dec = pair
    cache = KVCache()
    with torch.no_grad():
        dec(ids(2, 5), cache)
        with pytest.raises(ValueError, match=r"batch of B=2 sequences, got input_ids with B=3"):
            dec(ids(3, 1), cache)
    assert cache.seq_len == 5 and all(cache.get_seq_len(i) == 5 for i in range(4))


def test_a_cache_from_another_layer_count_is_refused(pair):
    hf, dec = pair
    two_layers = LlamaDecoder.from_hf(tiny_llama(layers=2))
    small, big = KVCache(), KVCache()
    with torch.no_grad():
        two_layers(ids(1, 4), small)
        dec(ids(1, 4), big)
        with pytest.raises(ValueError, match=r"the cache holds 2 layers but this decoder has 4"):
            dec(ids(1, 1), small)
        with pytest.raises(ValueError, match=r"the cache holds 4 layers but this decoder has 2"):
            two_layers(ids(1, 1), big)
    with pytest.raises(TypeError, match=r"cache must be an attnlib.KVCache, got dict"):
        dec(ids(1, 1), {})


def test_bad_input_ids_and_attention_mask(pair):
    _, dec = pair
    with pytest.raises(ValueError, match=r"input_ids of shape \(2, 3, 4\) and dtype torch.float32 is not \(B, T\)"):
        dec(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"input_ids of shape \(2, 0\)"):
        dec(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 4\) is not \(B, T_total\) = \(2, 5\)"):
        dec(ids(2, 5), attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids holds token id 1000, outside \[0, vocab_size=1000\)"):
        dec(torch.tensor([[1, 1000]]))
    with pytest.raises(ValueError, match=r"input_ids holds token id -1, outside"):
        dec(torch.tensor([[-1, 5]]))
    with pytest.raises(TypeError, match=r"attention_mask must be bool or 0/1 integers"):
        dec(ids(2, 5), attention_mask=torch.ones(2, 5))


def test_from_hf_refuses_what_it_does_not_model():
    with pytest.raises(TypeError, match=r"model must be a transformers LlamaForCausalLM or MistralForCausalLM, got Linear"):
        LlamaDecoder.from_hf(torch.nn.Linear(2, 2))
    scaled = tiny_llama(layers=1, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"only plain RoPE and SiLU are modelled, got rope_type='linear'"):
        LlamaDecoder.from_hf(scaled)


@pytest.mark.parametrize("tied", [True, False])
def test_from_hf_ties_lm_head_to_the_embedding_as_the_model_does(tied):
    hf = tiny_llama(8, 2, layers=2, tie_word_embeddings=tied)
    dec = LlamaDecoder.from_hf(hf)
    assert dec.tie_word_embeddings is tied and (dec.lm_head.weight is dec.embed.weight) is tied
    assert sum(p.numel() for p in dec.parameters()) == sum(p.numel() for p in hf.parameters())
    with torch.no_grad():
        torch.testing.assert_close(dec(ids(2, 6)), hf(ids(2, 6)).logits, rtol=0, atol=1e-5)
        dec.embed.weight[5] += 1.0                                 # tied: the output layer moves with it
    assert torch.equal(dec.lm_head.weight[5], dec.embed.weight[5]) is tied


def test_matrices_are_stored_column_major_and_loading_keeps_it(pair):
    hf, dec = pair
    for name, p in dec.named_parameters():
        if p.dim() == 2:                                           # weight.t() contiguous: (in, out) rows
            assert p.t().is_contiguous() and not p.is_contiguous(), name
    ours = dec.to(torch.float64)
    assert all(p.t().is_contiguous() for p in ours.parameters() if p.dim() == 2)
    ours.to(torch.float32)


def test_need_weights_returns_each_layers_attention_weights_as_transformers(pair):
    hf, dec = pair
    x = ids(2, 9)
    with torch.no_grad():
        logits, weights = dec(x, need_weights=True)
        theirs = hf(x, output_attentions=True)
    torch.testing.assert_close(logits, dec(x), rtol=0, atol=1e-5)   # another attention kernel: rounding
    assert len(weights) == len(theirs.attentions) == 4
    for ours_w, their_w in zip(weights, theirs.attentions):
        assert ours_w.shape == (2, 8, 9, 9)                        # (B, H, T, S): per query head
        torch.testing.assert_close(ours_w, their_w, rtol=0, atol=1e-5)
        assert torch.equal(ours_w.triu(1), torch.zeros_like(ours_w))  # causal
    cache = KVCache()
    with torch.no_grad():
        dec(x[:, :5], cache)
        _, late = dec(x[:, 5:], cache, need_weights=True)         # 4 new queries over 9 keys
    torch.testing.assert_close(late[2], weights[2][:, :, 5:], rtol=0, atol=1e-5)
