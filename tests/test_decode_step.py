"""attnlib.decode_step.DecodeStep: a cached step without the per-layer Python computes exactly what
LlamaDecoder.forward computes for one new token, and leaves the cache as forward would."""

import pytest
import torch

from attnlib import KVCache, LlamaDecoder
from attnlib.decode_step import DecodeStep
from test_decoder import _left_pad, ids, tiny_llama

STEPS = 6


def _both(dec: LlamaDecoder, prompt: torch.Tensor, real: torch.Tensor | None):
    """Logits of STEPS steps, each fed the previous argmax, by DecodeStep and by forward."""
    B, T = prompt.shape
    total = T + STEPS
    mask = None if real is None else torch.cat([real.bool(), torch.ones(B, STEPS, dtype=torch.bool)], dim=1)
    theirs_cache, ours_cache = KVCache(), KVCache()
    first = dec(prompt, theirs_cache, attention_mask=real, last_only=True)
    assert torch.equal(dec(prompt, ours_cache, attention_mask=real, last_only=True), first)
    step = DecodeStep(dec, ours_cache, mask, total)
    token, ours, theirs = first.argmax(-1), [], []
    for t in range(T, total):
        theirs.append(dec(token, theirs_cache, attention_mask=None if mask is None else mask[:, :t + 1],
                          last_only=True))
        ours.append(step(token))
        token = theirs[-1].argmax(-1)
    return ours, theirs, ours_cache, theirs_cache


@pytest.mark.parametrize("heads, kv_heads, extra, dtype", [
    (8, 2, {}, torch.float32),
    (8, 1, {}, torch.float32),
    (4, 4, {"attention_bias": True, "mlp_bias": True}, torch.float32),
    (8, 2, {"attention_bias": True}, torch.float64),
    (8, 2, {}, torch.bfloat16),
])
def test_each_step_is_bit_identical_to_forward(heads, kv_heads, extra, dtype):
    dec = LlamaDecoder.from_hf(tiny_llama(heads, kv_heads, layers=2, **extra)).to(dtype)
    with torch.inference_mode():
        ours, theirs, ours_cache, theirs_cache = _both(dec, ids(2, 7), None)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape == (2, 1, 1000) and torch.equal(a, b), f"step {i}"
    assert ours_cache.seq_len == theirs_cache.seq_len == 7 + STEPS
    n = ours_cache.seq_len
    for layer in range(len(dec.blocks)):
        for mine, other in ((ours_cache._k, theirs_cache._k), (ours_cache._v, theirs_cache._v)):
            assert torch.equal(mine[layer][:, :, :n], other[layer][:, :, :n]), f"layer {layer}: cache differs"


def test_a_left_padded_batch_steps_as_forward_does():
    dec = LlamaDecoder.from_hf(tiny_llama(8, 2, layers=2))
    batch, real = _left_pad([ids(1, 9, seed=2)[0], ids(1, 4, seed=3)[0], ids(1, 6, seed=4)[0]])
    with torch.inference_mode():
        ours, theirs, _, _ = _both(dec, batch, real)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_forward_continues_from_the_cache_a_step_filled():
    dec, prompt = LlamaDecoder.from_hf(tiny_llama(8, 2, layers=2)), ids(1, 5)
    with torch.inference_mode():
        cache, whole = KVCache(), dec(torch.cat([prompt, ids(1, 2, seed=7)], dim=1))
        dec(prompt, cache)
        step = DecodeStep(dec, cache, None, 7)
        step(ids(1, 2, seed=7)[:, :1])
        last = dec(ids(1, 2, seed=7)[:, 1:], cache)
    torch.testing.assert_close(last[:, -1], whole[:, -1], rtol=0, atol=1e-5)
    assert cache.seq_len == 7


def test_a_cache_of_another_model_is_refused():
    dec, other = LlamaDecoder.from_hf(tiny_llama(8, 2, layers=2)), LlamaDecoder.from_hf(tiny_llama(8, 2, layers=3))
    cache = KVCache()
    with torch.inference_mode():
        other(ids(1, 4), cache)
    with pytest.raises(ValueError, match="the cache holds 3 layers but this decoder has 2"):
        DecodeStep(dec, cache, None, 8)



def test_a_wide_models_steps_are_bit_identical_to_forward():
    """Matrices as wide as a real model's go through torch.mm too (no other kernel, no copy of a weight):
    gate_up (2048 x 256), down (256 x 1024) and lm_head (2048 x 256) give forward's logits bit for bit."""
    torch.manual_seed(0)
    dec = LlamaDecoder(vocab_size=2048, d_model=256, num_layers=2, num_heads=4, num_kv_heads=1, d_ff=1024).eval()
    with torch.inference_mode():
        ours, theirs, _, _ = _both(dec, ids(2, 5), None)
    for o, t in zip(ours, theirs):
        assert torch.equal(o, t)
