"""attnlib.decode_step.DecodeStep: a cached step without the per-layer Python computes exactly what
LlamaDecoder.forward computes for one new token, and leaves the cache as forward would."""

import contextlib

import pytest
import torch

from attnlib import KVCache, LlamaDecoder
import attnlib.decode_step
import attnlib.generation
from attnlib.decode_step import _PACKED, PACK_MIN, PACK_MODEL_MIN, DecodeStep, packed_bytes, packed_linears
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



def _wide_decoder(monkeypatch) -> LlamaDecoder:
    """Two layers whose gate_up (2048 x 256), down (256 x 1024) and lm_head (2048 x 256) are wide enough for
    DecodeStep's prepacked products and whose qkv (384 x 256) and out (256 x 256) are not; packed as a model
    of PACK_MODEL_MIN parameters would be."""
    monkeypatch.setattr(attnlib.decode_step, "PACK_MODEL_MIN", 0)
    torch.manual_seed(0)
    return LlamaDecoder(vocab_size=2048, d_model=256, num_layers=2, num_heads=4, num_kv_heads=1, d_ff=1024).eval()


def test_a_model_under_pack_model_min_is_not_packed():
    dec = LlamaDecoder.from_hf(tiny_llama(8, 2, layers=2))        # gate_up 1376 x 256: over PACK_MIN
    assert dec.blocks[0].mlp.gate_up.weight.numel() >= PACK_MIN
    assert sum(p.numel() for p in dec.parameters()) < PACK_MODEL_MIN
    with torch.inference_mode():
        _both(dec, ids(1, 5), None)
    assert dec.blocks[0].mlp.gate_up.weight not in _PACKED


def test_large_matrices_use_the_prepacked_kernel_and_equal_forward_to_rounding(monkeypatch):
    dec = _wide_decoder(monkeypatch)
    assert dec.blocks[0].mlp.gate_up.weight.numel() >= PACK_MIN > dec.blocks[0].attn.qkv.weight.numel()
    with torch.inference_mode():
        ours, theirs, _, _ = _both(dec, ids(2, 7), None)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
            assert torch.equal(a.argmax(-1), b.argmax(-1))
        if torch.backends.mkldnn.is_available():
            assert dec.blocks[0].mlp.gate_up.weight in _PACKED    # packed once, kept for the next steps


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a PyTorch without oneDNN packs nothing")
def test_packed_bytes_counts_the_copies_of_the_current_weights(monkeypatch):
    """Nothing before the first step; then as many bytes as the packed matrices (gate_up, down, lm_head of
    both layers: the packed layout pads nothing here); a changed weight's stale copy is not counted."""
    dec = _wide_decoder(monkeypatch)
    assert packed_bytes(dec) == 0
    with torch.inference_mode():
        _both(dec, ids(1, 5), None)
        large = {dec.lm_head.weight} | {w for b in dec.blocks for w in (b.mlp.gate_up.weight, b.mlp.down.weight)}
        assert packed_bytes(dec) == sum(w.nbytes for w in large)
        dec.lm_head.weight.mul_(2.0)
    assert packed_bytes(dec) == sum(w.nbytes for w in large) - dec.lm_head.weight.nbytes


def test_a_changed_weight_is_packed_again(monkeypatch):
    dec = _wide_decoder(monkeypatch)
    with torch.inference_mode():
        before, _, _, _ = _both(dec, ids(1, 5), None)
        dec.lm_head.weight.mul_(2.0)                              # in place: a new version of the weight
        after, theirs, _, _ = _both(dec, ids(1, 5), None)
    torch.testing.assert_close(after[0], theirs[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(after[0], 2 * before[0], rtol=0, atol=1e-4)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)   # no oneDNN: torch.mm throughout
    with torch.inference_mode():
        ours, theirs, _, _ = _both(dec, ids(1, 5), None)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_packed_linears_runs_forward_through_the_packed_copies_and_puts_it_back(monkeypatch):
    dec = _wide_decoder(monkeypatch)
    x = ids(2, 7)
    with torch.inference_mode():
        plain = dec(x)
        with packed_linears(dec):
            swapped = {name for name, m in dec.named_modules() if "forward" in vars(m)}
            packed = dec(x)
        assert not any("forward" in vars(m) for m in dec.modules())      # nn.Linear.forward again
        assert torch.equal(dec(x), plain)
    if torch.backends.mkldnn.is_available():
        assert swapped == {"blocks.0.mlp.gate_up", "blocks.0.mlp.down", "blocks.1.mlp.gate_up", "blocks.1.mlp.down",
                           "lm_head"}
        assert not torch.equal(packed, plain)                             # another kernel: other roundings
    torch.testing.assert_close(packed, plain, rtol=0, atol=1e-4)


def test_packed_linears_puts_forward_back_after_an_error_and_leaves_a_small_model_alone(monkeypatch):
    dec = _wide_decoder(monkeypatch)
    with pytest.raises(ValueError), torch.inference_mode(), packed_linears(dec):
        dec(torch.zeros(1, 3))                                            # float ids: attnlib's ValueError
    assert not any("forward" in vars(m) for m in dec.modules())
    monkeypatch.setattr(attnlib.decode_step, "PACK_MODEL_MIN", PACK_MODEL_MIN)
    with packed_linears(dec):
        assert not any("forward" in vars(m) for m in dec.modules())      # under PACK_MODEL_MIN: nothing packed


def test_generate_prefills_through_the_packed_copies(monkeypatch):
    """generate's prefill and steps use the same packed products: its tokens are the argmax of logits that
    equal forward's to float32 rounding, and no Linear is left swapped."""
    from attnlib import generate
    dec = _wide_decoder(monkeypatch)
    seen = []
    real = packed_linears.__wrapped__

    def spy(decoder):
        seen.append(decoder)
        return real(decoder)
    monkeypatch.setattr(attnlib.generation, "packed_linears", contextlib.contextmanager(spy))
    prompt = ids(2, 7)
    out = generate(dec, prompt, 4)
    assert seen == [dec] and not any("forward" in vars(m) for m in dec.modules())
    with torch.inference_mode():
        logits = dec(out[:, :-1])[:, 6:]                                  # forward over the prompt and 3 new ones
    assert torch.equal(out[:, 7:], logits.argmax(-1))
