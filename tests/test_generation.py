"""attnlib.generate: cached and uncached greedy decoding, equal to transformers' generate; eos; sampling
(its filters equal to transformers' warpers, its draws reproducible and distributed as they should be);
any cache that keeps the Cache contract; bad arguments named. SmolLM2's own checks are in test_pretrained.py."""

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from attnlib import KVCache, LlamaDecoder, generate
from attnlib.generation import sample_logits, top_k_filter, top_p_filter
from test_decoder import MAX_POS, VOCAB, _left_pad, ids, tiny_llama

# --- greedy decoding --------------------------------------------------------------------------------

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
    with pytest.raises(ValueError, match=r"cache was given with use_cache=False"):
        generate(dec, prompt, 3, use_cache=False, cache=KVCache())


# --- any cache -------------------------------------------------------------------------------------

class CatCache:
    """A cache written from the contract alone (not a KVCache): torch.cat per update."""

    def __init__(self) -> None:
        self.k, self.v = [], []

    def update(self, layer_idx, k, v):
        if layer_idx == len(self.k):
            self.k.append(k[:, :, :0]), self.v.append(v[:, :, :0])
        self.k[layer_idx] = torch.cat([self.k[layer_idx], k], dim=2)
        self.v[layer_idx] = torch.cat([self.v[layer_idx], v], dim=2)
        return self.k[layer_idx], self.v[layer_idx]

    @property
    def seq_len(self):
        return self.get_seq_len(0)

    def get_seq_len(self, layer_idx):
        return self.k[layer_idx].shape[2] if layer_idx < len(self.k) else 0

    @property
    def batch_size(self):
        return self.k[0].shape[0] if self.k else None

    def __len__(self):
        return len(self.k)

    @property
    def nbytes(self):
        return sum(t.nbytes for t in self.k + self.v)


class CountingDecoder(LlamaDecoder):
    """Counts the calls of forward: the general path calls it at every step, DecodeStep's fast path once."""
    calls = 0

    def forward(self, *args, **kwargs):
        CountingDecoder.calls += 1
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("left_padded", [False, True])
def test_any_cache_with_the_contract_decodes_as_kv_cache_does(pair, left_padded):
    _, dec = pair
    counting = CountingDecoder(VOCAB, 256, 4, 8, 2, 688, max_position_embeddings=MAX_POS)
    counting.load_state_dict(dec.state_dict())
    counting.eval()
    prompt, mask = _left_pad([ids(1, 6, seed=2)[0], ids(1, 9, seed=3)[0]]) if left_padded else (ids(2, 9), None)
    expected = generate(dec, prompt, 12, attention_mask=mask)
    for cache, calls in ((CatCache(), 12), (KVCache(), 1)):
        CountingDecoder.calls = 0
        got = generate(counting, prompt, 12, attention_mask=mask, cache=cache)
        assert torch.equal(got, expected), type(cache).__name__
        assert CountingDecoder.calls == calls, "the general path for any cache, DecodeStep for KVCache"
        assert cache.seq_len == 9 + 11 and len(cache) == 4   # the cache given was filled (the last token not fed)
    with pytest.raises(ValueError, match=r"cache must be an empty cache to fill"):
        generate(dec, prompt, 3, attention_mask=mask, cache=cache)
    with pytest.raises(ValueError, match=r"cache must be an empty cache to fill .* got \{\}"):
        generate(dec, prompt, 3, cache={})


# --- eos -------------------------------------------------------------------------------------------

def test_eos_rows_repeat_it_and_equal_transformers(pair):
    hf, dec = pair
    prompt = ids(2, 7, seed=11)
    free = generate(dec, prompt, 20)[:, 7:]                    # (2, 20) without eos
    eos = int(free[0, 4])                                      # row 0 produces it at step 4
    first = [int((row == eos).nonzero()[0]) if (row == eos).any() else None for row in free]
    ours = generate(dec, prompt, 20, eos_token_id=eos)
    for row, free_row, k in zip(ours[:, 7:], free, first):
        if k is not None:                                      # as without eos up to it, then only eos
            assert torch.equal(row[:k + 1], free_row[:k + 1]) and (row[k:] == eos).all()
        else:
            assert torch.equal(row, free_row)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(ours, theirs)


def test_the_loop_stops_once_every_row_has_finished(pair):
    _, dec = pair
    prompt = ids(1, 5, seed=4)
    free = generate(dec, prompt, 15)
    eos = int(free[0, 5 + 3])
    k = int((free[0, 5:] == eos).nonzero()[0])                 # its first appearance, at step <= 3
    out = generate(dec, prompt, 15, eos_token_id=eos)
    assert out.shape == (1, 5 + k + 1) and torch.equal(out, free[:, :5 + k + 1])
    assert torch.equal(generate(dec, prompt, 15, eos_token_id=[VOCAB - 1, eos]), out)   # a list of eos ids
    assert torch.equal(generate(dec, prompt, 15, eos_token_id=eos, use_cache=False), out)


@pytest.mark.parametrize("bad", [-1, VOCAB, 2.0, True, "2", [], [3, None]])
def test_a_bad_eos_token_id_is_named(pair, bad):
    with pytest.raises(ValueError, match=r"eos_token_id must be a token id in \[0, vocab_size=1000\)"):
        generate(pair[1], ids(1, 3), 2, eos_token_id=bad)


# --- sampling --------------------------------------------------------------------------------------

def test_filters_equal_transformers_warpers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g) * 3                 # no ties
    for k in (1, 5, 50, 999, 1000, 5000):
        theirs = TopKLogitsWarper(top_k=k)(None, logits.clone())
        assert torch.equal(top_k_filter(logits, k).isinf(), theirs.isinf()), k
    for p in (1e-6, 0.05, 0.3, 0.9, 0.999):
        theirs = TopPLogitsWarper(top_p=p)(None, logits.clone())
        assert torch.equal(top_p_filter(logits, p).isinf(), theirs.isinf()), p
        assert (~top_p_filter(logits, p).isinf()).sum(-1).min() >= 1
    assert torch.equal(TemperatureLogitsWarper(0.7)(None, logits.clone()), logits / 0.7)


@pytest.mark.parametrize("kwargs, expected", [
    ({}, torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).softmax(-1)),
    ({"temperature": 2.0}, (torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]) / 2).softmax(-1)),
    ({"top_k": 3}, torch.tensor([2.0, 1.0, 0.5, -99, -99, -99]).softmax(-1)),
    ({"top_p": 0.75}, torch.tensor([2.0, 1.0, -99, -99, -99, -99]).softmax(-1)),   # 0.56 + 0.21 >= 0.75
    ({"top_p": 0.8}, torch.tensor([2.0, 1.0, 0.5, -99, -99, -99]).softmax(-1)),    # + 0.13
    ({"top_p": 0.5}, torch.tensor([1.0, 0, 0, 0, 0, 0])),
])
def test_samples_follow_the_filtered_distribution(kwargs, expected):
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).expand(60_000, 6)
    draws = sample_logits(logits, generator=torch.Generator().manual_seed(1), **kwargs)
    freq = torch.bincount(draws, minlength=6).double() / len(draws)
    assert (freq[expected < 1e-30] == 0).all()                          # filtered out: never drawn
    sigma = (expected.double() * (1 - expected.double()) / len(draws)).sqrt()
    assert ((freq - expected.double()).abs() <= 5 * sigma + 1e-12).all(), (freq, expected)


def test_sampling_is_reproducible_and_top_k_1_is_greedy(pair):
    _, dec = pair
    prompt = ids(2, 6, seed=9)

    def sample(seed, **kwargs):
        return generate(dec, prompt, 24, do_sample=True, generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(sample(0), sample(0)) and not torch.equal(sample(0), sample(1))
    greedy = generate(dec, prompt, 24)
    assert not torch.equal(sample(0), greedy)
    assert torch.equal(sample(3, top_k=1, temperature=0.5), greedy)
    assert torch.equal(sample(3, top_p=1e-6), greedy)
    torch.manual_seed(5)                                           # without a generator: torch's global one
    a = generate(dec, prompt, 10, do_sample=True)
    torch.manual_seed(5)
    assert torch.equal(generate(dec, prompt, 10, do_sample=True), a)


def test_sampled_tokens_stay_inside_top_k(pair):
    _, dec = pair
    out = generate(dec, ids(2, 5, seed=3), 30, do_sample=True, top_k=4, temperature=3.0,
                   generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = dec(out)[:, 4:-1]                                 # (2, 30, vocab): what chose tokens 5..34
    top4 = logits.topk(4, dim=-1).indices
    assert (top4 == out[:, 5:, None]).any(-1).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"do_sample": 1}, r"do_sample must be True or False, got 1"),
    ({"do_sample": True, "temperature": 0}, r"temperature must be a number > 0 .*got 0"),
    ({"do_sample": True, "temperature": -1.0}, r"temperature must be a number > 0"),
    ({"do_sample": True, "temperature": float("nan")}, r"temperature must be a number > 0"),
    ({"do_sample": True, "top_k": 0}, r"top_k must be an int >= 1 or None, got 0"),
    ({"do_sample": True, "top_k": 2.5}, r"top_k must be an int >= 1 or None, got 2.5"),
    ({"do_sample": True, "top_p": 0.0}, r"top_p must be a number in \(0, 1\] or None, got 0.0"),
    ({"do_sample": True, "top_p": 1.5}, r"top_p must be a number in \(0, 1\] or None, got 1.5"),
    ({"do_sample": True, "generator": 3}, r"generator must be a torch.Generator or None, got int"),
    ({"temperature": 0.7}, r"temperature=0.7 only apply when sampling: pass do_sample=True"),
    ({"top_k": 5, "top_p": 0.9}, r"top_k=5, top_p=0.9 only apply when sampling"),
])
def test_bad_sampling_arguments_are_named(pair, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(pair[1], ids(1, 3), 2, **kwargs)
