"""attnlib.KVCache and attnlib.generate: the cache against torch.cat, decoding against recomputation
and against transformers' greedy generate on the same (random) Llama weights."""

import pytest
import torch

from attnlib import KVCache, LlamaDecoder, generate
from attnlib.kv_cache import cache_bytes
from test_decoder import MAX_POS, _left_pad, ids, tiny_llama


def kv(B: int = 2, H_kv: int = 3, S: int = 1, Dh: int = 4, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H_kv, S, Dh, generator=g, dtype=dtype), torch.randn(B, H_kv, S, Dh, generator=g, dtype=dtype)


# --- the cache itself -------------------------------------------------------------------------------

def test_update_returns_everything_cached_as_torch_cat_would():
    cache, ks, vs = KVCache(), [], []
    assert (len(cache), cache.seq_len, cache.batch_size, cache.nbytes) == (0, 0, None, 0)
    for step, S_new in enumerate([5, 1, 1, 12, 1, 30, 1]):  # crosses the buffer's growth points
        k, v = kv(S=S_new, seed=step)
        ks.append(k), vs.append(v)
        k_all, v_all = cache.update(0, k, v)
        torch.testing.assert_close(k_all, torch.cat(ks, dim=2), rtol=0, atol=0)
        torch.testing.assert_close(v_all, torch.cat(vs, dim=2), rtol=0, atol=0)
        assert cache.seq_len == sum(t.shape[2] for t in ks) and len(cache) == 1
    assert cache.batch_size == 2


def test_layers_fill_in_order_and_seq_len_is_layer_0s():
    cache = KVCache()
    cache.update(0, *kv(S=4))
    assert (len(cache), cache.seq_len, cache.get_seq_len(1)) == (1, 4, 0)
    cache.update(1, *kv(S=4, seed=1))
    cache.update(0, *kv(S=1, seed=2))
    assert (len(cache), cache.seq_len, cache.get_seq_len(0), cache.get_seq_len(1)) == (2, 5, 5, 4)


def test_nbytes_counts_the_filled_positions_as_cache_bytes_says():
    cache = KVCache()
    for layer in range(3):
        cache.update(layer, *kv(B=2, H_kv=3, S=7, Dh=4, seed=layer))  # buffers hold 16+ positions
    assert cache.nbytes == cache_bytes(3, 3, 4, 7, batch_size=2, bytes_per_element=4)
    k, v = kv(B=2, H_kv=3, S=7, Dh=4)
    assert cache.nbytes == 3 * (k.nelement() * k.element_size() + v.nelement() * v.element_size())
    half = KVCache()
    half.update(0, *kv(S=7, dtype=torch.float16))
    assert half.nbytes == cache_bytes(1, 3, 4, 7, batch_size=2, bytes_per_element=2)


def test_cache_bytes_of_a_decoder_equals_its_real_cache():
    dec = LlamaDecoder.from_hf(tiny_llama(heads=8, kv_heads=2, layers=4))
    cache = KVCache()
    with torch.no_grad():
        dec(ids(3, 20), cache)
    assert cache.nbytes == cache_bytes(4, 2, 256 // 8, 20, batch_size=3, bytes_per_element=4)


@pytest.mark.parametrize("B, H_kv, Dh, match", [
    (3, 3, 4, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(3, 3, 1, 4\): a cache belongs to one batch"),
    (2, 1, 4, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(2, 1, 1, 4\)"),
    (2, 3, 8, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(2, 3, 1, 8\)"),
])
def test_another_batch_size_head_count_or_head_width_is_refused(B, H_kv, Dh, match):
    cache = KVCache()
    cache.update(0, *kv(S=3))
    with pytest.raises(ValueError, match=match):
        cache.update(0, *kv(B, H_kv, 1, Dh))
    assert cache.seq_len == 3  # the refused update changed nothing


@pytest.mark.parametrize("layer_idx", [2, -1, 1.0, True, "0"])
def test_a_layer_index_out_of_order_is_refused(layer_idx):
    cache = KVCache()
    cache.update(0, *kv())
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 1\] \(layers are filled in order\)"):
        cache.update(layer_idx, *kv())
    assert len(cache) == 1


def test_bad_k_and_v_are_refused_by_name():
    cache = KVCache()
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 4\) is not \(B, H_kv, S_new, Dh\)"):
        cache.update(0, torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 1, 4\) and v of shape \(2, 3, 2, 4\) differ"):
        cache.update(0, kv(S=1)[0], kv(S=2)[1])
    with pytest.raises(TypeError, match=r"v must be a floating-point tensor, got torch.int64"):
        cache.update(0, kv()[0], torch.zeros(2, 3, 1, 4, dtype=torch.long))
    cache.update(0, *kv())
    with pytest.raises(TypeError, match=r"the cache of layer 0 holds torch.float32, got k torch.float16"):
        cache.update(0, *kv(dtype=torch.float16))
    assert repr(cache) == "KVCache(layers=1, seq_len=1, B=2, H_kv=3, Dh=4)" and repr(KVCache()) == "KVCache(empty)"


# --- generate --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair():
    hf = tiny_llama(heads=8, kv_heads=2)  # GQA: H_kv < H
    return hf, LlamaDecoder.from_hf(hf)


def test_cached_generate_equals_recomputing(pair):
    _, dec = pair
    prompt = ids(2, 9)
    cached, recomputed = generate(dec, prompt, 30), generate(dec, prompt, 30, use_cache=False)
    assert cached.shape == (2, 39) and torch.equal(cached[:, :9], prompt)
    assert torch.equal(cached, recomputed)


def test_cached_step_logits_equal_the_whole_sequence_at_once(pair):
    """Each one-token step with the cache gives the logits a full forward over the sequence gives."""
    _, dec = pair
    seq = generate(dec, ids(2, 9), 20)
    cache, steps = KVCache(), []
    with torch.no_grad():
        whole = dec(seq)                                             # (B, 29, vocab), no cache
        steps.append(dec(seq[:, :9], cache))                         # prefill
        steps += [dec(seq[:, t:t + 1], cache) for t in range(9, 29)]  # one token each
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-4)
    assert torch.equal(whole[:, 8:-1].argmax(-1), seq[:, 9:])       # the tokens are the greedy ones


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (8, 1), (4, 4)])
def test_generate_equals_transformers_greedy_generate(heads, kv_heads):
    hf = tiny_llama(heads=heads, kv_heads=kv_heads)
    prompt = ids(2, 12, seed=heads + kv_heads)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                             do_sample=False)
    assert theirs.shape == (2, 32)
    assert torch.equal(generate(LlamaDecoder.from_hf(hf), prompt, 20), theirs)


def test_left_padded_batch_equals_each_sequence_alone_and_transformers(pair):
    hf, dec = pair
    prompts = [ids(1, n, seed=n)[0] for n in (3, 11, 7)]
    batch, mask = _left_pad(prompts)
    ours = generate(dec, batch, 25, attention_mask=mask)
    for i, p in enumerate(prompts):
        alone = generate(dec, p[None], 25)[0]                     # (len(p) + 25,)
        assert torch.equal(ours[i, batch.shape[1] - len(p):], alone)
    with torch.no_grad():
        theirs = hf.generate(batch, attention_mask=mask, max_new_tokens=25, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(generate(dec, batch, 25, attention_mask=mask, use_cache=False), ours)


def test_prompts_beyond_the_position_table_are_refused_before_decoding(pair):
    _, dec = pair
    with pytest.raises(ValueError, match=rf"120 prompt tokens \+ max_new_tokens=9 = 129 positions are beyond "
                                         rf"max_position_embeddings={MAX_POS}"):
        generate(dec, ids(1, 120), 9)
    with pytest.raises(ValueError, match=rf"131 prompt tokens \+ max_new_tokens=1 = 132 positions"):
        generate(dec, ids(1, MAX_POS + 3), 1)  # the prompt alone does not fit
    batch, mask = _left_pad([ids(1, 100)[0], ids(1, 120)[0]])
    assert generate(dec, batch, 8, attention_mask=mask).shape == (2, 128)  # padding takes no position
    with pytest.raises(ValueError, match=r"120 prompt tokens \+ max_new_tokens=9"):
        generate(dec, batch, 9, attention_mask=mask)


def test_generate_bad_arguments(pair):
    _, dec = pair
    prompt = ids(2, 5)
    assert torch.equal(generate(dec, prompt, 0), prompt)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match=rf"max_new_tokens must be an int >= 0, got {bad!r}"):
            generate(dec, prompt, bad)
    with pytest.raises(ValueError, match=r"input_ids of shape \(5,\) and dtype torch.int64 is not \(B, T\)"):
        generate(dec, prompt[0], 3)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 4\) is not \(B, T\) = \(2, 5\)"):
        generate(dec, prompt, 3, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"attention_mask must be bool or 0/1 integers"):
        generate(dec, prompt, 3, attention_mask=torch.ones(2, 5))
