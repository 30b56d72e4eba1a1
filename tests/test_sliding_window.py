"""Sliding-window attention (Mistral): the window mask, LlamaDecoder against transformers' MistralForCausalLM
over sequences several windows long (float32 and float64), KVCache as a rolling buffer whose memory stays
bounded, greedy generation equal to transformers' (left-padded batches too), the receptive field
L·(W - 1) + 1 that depth gives, and bad windows named."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM
from transformers.models.mistral.modeling_mistral import MistralRMSNorm

from attnlib import KVCache, LlamaDecoder, MultiHeadAttention, PagedKVCache, generate, masks
from test_decoder import _left_pad, _rmsnorm_float64

VOCAB, W = 512, 8


def tiny_mistral(window: int | None = W, layers: int = 4) -> MistralForCausalLM:
    """A seeded random Mistral (hidden 128, GQA 4/2) with random norms."""
    config = MistralConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, sliding_window=window,
                           initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                           attn_implementation="eager")
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    return model


@pytest.fixture(scope="module")
def pair():
    hf = tiny_mistral()
    return hf, LlamaDecoder.from_hf(hf)


def ids(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the mask ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("T, S, window", [(6, 6, 3), (1, 9, 4), (4, 9, 2), (5, 5, 1), (3, 7, 20)])
def test_window_mask_is_the_last_window_keys_up_to_each_query(T, S, window):
    got = masks.causal_mask(T, S, window=window)
    for i in range(T):
        query = i + S - T                                     # its position among the S keys (bottom-right)
        assert got[i].tolist() == [query - window < j <= query for j in range(S)]
    if window >= S:
        assert torch.equal(got, masks.causal_mask(T, S))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_a_window_below_one_is_named(bad):
    with pytest.raises(ValueError, match=rf"window must be a positive int, got {bad!r}"):
        masks.causal_mask(4, window=bad)
    with pytest.raises(ValueError, match=rf"window must be an int >= 1 .*got {bad!r}"):
        MultiHeadAttention(32, 4, window=bad)
    with pytest.raises(ValueError, match=rf"sliding_window must be an int >= 1 .*got {bad!r}"):
        LlamaDecoder(100, 32, 1, 4, 2, 64, sliding_window=bad)
    with pytest.raises(ValueError, match=rf"sliding_window must be an int >= 1 .*got {bad!r}"):
        KVCache(sliding_window=bad)


# --- the decoder against transformers ----------------------------------------------------------------

@pytest.mark.parametrize("window", [1, 3, W])
def test_logits_equal_mistral_over_several_windows(window, monkeypatch):
    hf, x = tiny_mistral(window), ids(2, 40)                  # 40 tokens: 5 windows of 8
    ours = LlamaDecoder.from_hf(hf)
    assert ours.sliding_window == window and all(b.attn.window == window for b in ours.blocks)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, rtol=0, atol=1e-4)
        # float64: transformers' RMSNorm computes in float32 whatever the dtype (patched, as in test_decoder)
        monkeypatch.setattr(MistralRMSNorm, "forward", _rmsnorm_float64)
        hf64 = hf.double()
        hf64.set_attn_implementation("sdpa")
        torch.testing.assert_close(LlamaDecoder.from_hf(hf64)(x), hf64(x).logits, rtol=0, atol=1e-10)


def test_the_window_changes_the_logits_only_beyond_it(pair):
    """Without the window, the first W positions are the same (nothing is hidden yet) and the later ones are not."""
    _, dec = pair
    full = LlamaDecoder.from_hf(tiny_mistral(None))
    x = ids(1, 30)
    with torch.no_grad():
        diff = (dec(x) - full(x)).abs().amax(dim=-1)[0]       # (T,)
    assert full.sliding_window is None and bool((diff[:W] == 0).all()) and bool((diff[W:] > 1e-3).all())


# --- the rolling cache --------------------------------------------------------------------------------

def test_rolling_update_returns_the_last_window_minus_one_and_the_new_positions():
    cache = KVCache(sliding_window=4)
    stream = torch.arange(60, dtype=torch.float32).view(1, 1, 60, 1)
    t = 0
    for n in [5, 1, 1, 7, 1, 1, 2] + [1] * 40:
        k_all, v_all = cache.update(0, stream[:, :, t:t + n], -stream[:, :, t:t + n])
        t += n
        want = list(range(max(0, t - n - 3), t))               # 3 kept positions, then the n new ones
        assert k_all.flatten().tolist() == want and (-v_all).flatten().tolist() == want
        assert cache.seq_len == t and cache.nbytes == min(t, 3) * 2 * 4
    assert cache.allocated_nbytes == 16 * 2 * 4                # one buffer of max(2 (W - 1), 16) positions


@pytest.mark.parametrize("chunks", [[100, 1, 1, 1], [3, 40, 1, 17, 1], [1] * 20 + [50, 1]])
def test_a_prompt_longer_than_the_buffer_leaves_a_buffer_of_the_rolling_size(chunks):
    """A chunk longer than max(2 (W - 1), 16) positions: update returns the kept positions and the whole chunk, and
    keeps only the last W - 1, so the buffer stays that size instead of growing to twice the prompt."""
    window, t = 10, 0
    cache = KVCache(sliding_window=window)
    stream = torch.arange(sum(chunks), dtype=torch.float32).view(1, 1, -1, 1)
    for n in chunks:
        k_all, v_all = cache.update(0, stream[:, :, t:t + n], -stream[:, :, t:t + n])
        t += n
        want = list(range(max(0, t - n - window + 1), t))      # W - 1 kept positions, then the n new ones
        assert k_all.flatten().tolist() == want and (-v_all).flatten().tolist() == want
        assert cache.seq_len == t and cache.nbytes == min(t, window - 1) * 2 * 4
        assert cache.allocated_nbytes <= 2 * (window - 1) * 2 * 4    # K and V, 4 bytes each


def test_a_chunk_that_rolls_a_nearly_empty_buffer_keeps_the_right_positions():
    """Right after a roll the kept positions sit near the front: a chunk that rolls again then moves a range
    that overlaps where it goes (the one case the roll copies through a temporary)."""
    cache = KVCache(sliding_window=4)
    stream = torch.arange(40, dtype=torch.float32).view(1, 1, 40, 1)
    t = 0
    for n in [1] * 17 + [13]:                                  # 16 slots fill, a roll; then 4 + 13 > 16 rolls again
        k_all, _ = cache.update(0, stream[:, :, t:t + n], stream[:, :, t:t + n])
        t += n
    assert cache._k[0].shape[2] == 16 and cache._dropped[0] == 14   # two rolls, no growth
    assert k_all.flatten().tolist() == list(range(t - 13 - 3, t))    # the 3 kept, then the 13 new


def test_chunked_prefill_through_the_rolling_cache_equals_at_once(pair):
    _, dec = pair
    x = ids(2, 45)
    with torch.no_grad():
        whole = dec(x)
        cache = KVCache()
        pieces = [dec(x[:, a:b], cache) for a, b in [(0, 5), (5, 6), (6, 20), (20, 21), (21, 45)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=1e-5)
    assert cache.sliding_window == W and cache.seq_len == 45   # the decoder set the window; positions seen
    assert cache.nbytes == 4 * 2 * 2 * (W - 1) * 2 * 32 * 4    # L · B · H_kv · (W - 1) · (Dh + Dv) · 4 bytes


def test_a_long_prompt_through_the_rolling_cache_equals_at_once_and_leaves_bounded_buffers(pair):
    _, dec = pair
    x = ids(2, 60, seed=3)
    with torch.no_grad():
        whole = dec(x)
        cache = KVCache()
        pieces = [dec(x[:, :50], cache)] + [dec(x[:, t:t + 1], cache) for t in range(50, 60)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=0, atol=1e-5)
    per_position = 4 * 2 * 2 * 2 * 32 * 4                     # L · B · H_kv · (Dh + Dv) · 4 bytes
    assert cache.nbytes == (W - 1) * per_position and cache.allocated_nbytes == 16 * per_position


def test_generate_equals_mistral_and_the_cache_stays_bounded(pair):
    hf, dec = pair
    prompt = ids(2, 6, seed=2)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=100, do_sample=False)
    bounds = []
    for n in (10, 100):
        cache = KVCache()
        ours = generate(dec, prompt, n, cache=cache)
        assert torch.equal(ours, theirs[:, :6 + n])
        bounds.append((cache.nbytes, cache.allocated_nbytes))
    assert bounds[0] == bounds[1] == (4 * 2 * 2 * (W - 1) * 2 * 32 * 4, 4 * 2 * 2 * 16 * 2 * 32 * 4)
    assert torch.equal(generate(dec, prompt, 100, use_cache=False), theirs)


def test_left_padded_batch_equals_mistral_and_each_alone(pair):
    hf, dec = pair
    prompts = [ids(1, n, seed=n)[0] for n in (3, 13, 7)]
    batch, mask = _left_pad(prompts)
    with torch.no_grad():
        theirs = hf.generate(batch, attention_mask=mask, max_new_tokens=30, do_sample=False)
    ours = generate(dec, batch, 30, attention_mask=mask)
    assert torch.equal(ours, theirs)
    for i, p in enumerate(prompts):
        assert torch.equal(ours[i, batch.shape[1] - len(p):], generate(dec, p[None], 30)[0])
    paged = PagedKVCache(4)                                    # keeps every position: the window mask hides them
    assert torch.equal(generate(dec, batch, 30, attention_mask=mask, cache=paged), ours)
    assert paged.seq_len == batch.shape[1] + 29


def test_a_cache_belongs_to_one_window(pair):
    _, dec = pair
    plain, narrow = LlamaDecoder.from_hf(tiny_mistral(None)), LlamaDecoder.from_hf(tiny_mistral(4))
    with torch.no_grad():
        other = KVCache()
        narrow(ids(1, 3), other)
        with pytest.raises(ValueError, match=rf"filled with sliding_window=4, not {W}: a cache belongs to one model"):
            dec(ids(1, 1), other)
        rolled = KVCache()
        dec(ids(1, 3), rolled)
        with pytest.raises(ValueError, match=rf"filled with sliding_window={W}, not None"):
            plain(ids(1, 1), rolled)


# --- how far information travels ---------------------------------------------------------------------

@pytest.mark.parametrize("layers, window", [(1, 4), (2, 4), (3, 5), (4, 3)])
def test_receptive_field_is_layers_times_window_minus_one_plus_one(layers, window):
    """Changing token 0 moves the logits of positions 0 .. L·(W - 1) and of none after: one layer carries
    information W - 1 positions forward, L layers L·(W - 1)."""
    dec = LlamaDecoder.from_hf(tiny_mistral(window, layers)).double()
    x = ids(1, layers * (window - 1) + 6)
    y = x.clone()
    y[0, 0] = (x[0, 0] + 1) % VOCAB
    with torch.no_grad():
        moved = (dec(x) - dec(y)).abs().amax(dim=-1)[0]       # (T,)
    reach = layers * (window - 1)
    assert bool((moved[:reach + 1] > 1e-9).all()) and bool((moved[reach + 1:] == 0).all())
