"""The caches of attnlib.caches against KVCache: PagedKVCache bit for bit, QuantizedKVCache within its
rounding bound, SinkCache bit for bit while everything fits and as StreamingLLM defines it after."""

import pytest
import torch

from attnlib import KVCache, MultiHeadAttention, PagedKVCache, QuantizedKVCache, SinkCache, attention, masks
from attnlib.caches import dequantize_int8, quantize_int8
from attnlib.head_layout import merge_heads, repeat_kv
from attnlib.positional import RotaryEmbedding

CHUNKS = [(0, 9), (9, 10), (10, 23), (23, 24), (24, 40)]  # a prefill, single steps, chunks across block edges


def kv(B=2, H_kv=3, S=1, Dh=4, Dv=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H_kv, S, Dh, generator=g, dtype=dtype), torch.randn(B, H_kv, S, Dv, generator=g, dtype=dtype)


def layers(n=2, seed=0, rotary=None, dtype=torch.float32):
    torch.manual_seed(seed)
    return [MultiHeadAttention(32, 4, 2, layer_idx=i, rotary=rotary).to(dtype).eval() for i in range(n)]


def run_layers(stack, cache, x, valid=None, chunks=CHUNKS):
    """The outputs of a stack of attention layers fed x (B, T, D) chunk by chunk through one cache."""
    outs = []
    with torch.no_grad():
        for a, b in chunks:
            h = x[:, a:b]
            mask = None if valid is None else masks.padding_mask(valid[:, :b])
            for layer in stack:
                h = layer(h, mask=mask, is_causal=True, cache=cache)
            outs.append(h)
    return torch.cat(outs, dim=1)


def left_padded(B=3, T=40, seed=2):
    x = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(seed))
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, :5] = valid[2, :11] = False
    return x, valid


# --- PagedKVCache -----------------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_paged_update_returns_what_kv_cache_returns_bit_for_bit(block_size):
    paged, contiguous = PagedKVCache(block_size), KVCache()
    for step, (a, b) in enumerate(CHUNKS):
        for layer in range(3):
            k, v = kv(S=b - a, seed=10 * step + layer)
            for got, want in zip(paged.update(layer, k, v), contiguous.update(layer, k, v)):
                assert torch.equal(got, want)
    assert (paged.seq_len, len(paged), paged.batch_size, paged.nbytes) == \
        (contiguous.seq_len, len(contiguous), contiguous.batch_size, contiguous.nbytes)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_attention_through_mha_is_bit_identical_with_left_padding(block_size):
    x, valid = left_padded()
    stack = layers(rotary=RotaryEmbedding(8, 128))
    assert torch.equal(run_layers(stack, PagedKVCache(block_size), x, valid), run_layers(stack, KVCache(), x, valid))


def test_block_table_maps_each_position_to_its_block_and_slot():
    cache = PagedKVCache(4)
    k = torch.arange(2 * 10, dtype=torch.float32).view(2, 1, 10, 1)  # each entry its own (sequence, position)
    cache.update(0, k[:, :, :6], k[:, :, :6])
    cache.update(0, k[:, :, 6:], k[:, :, 6:])
    table = cache.block_table
    assert table.tolist() == [[0, 2, 4], [1, 3, 5]]                    # handed out in turn: not contiguous
    pool = cache._pools[0][0]                                         # (blocks, block_size, H_kv, Dh)
    for b in range(2):
        for p in range(10):
            assert pool[table[b, p // 4], p % 4, 0, 0] == k[b, 0, p, 0]
    assert cache.num_blocks == 6 and cache.nbytes == 2 * 2 * 10 * 4
    assert cache.reserved_nbytes == 6 * 4 * 2 * 4                    # 6 blocks of 4 slots, k and v, fp32


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_paged_block_size_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"block_size must be an int >= 1 \\(tokens per block\\), got {bad!r}"):
        PagedKVCache(bad)


# --- QuantizedKVCache -------------------------------------------------------------------------------

def test_int8_round_trip_is_within_half_a_step_of_each_vector():
    x = torch.randn(2, 3, 50, 64) * torch.logspace(-3, 2, 50)[:, None]  # tokens of very different sizes
    x[0, 0, 7] = 0.0                                                     # an all-zero vector
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (2, 3, 50, 1) and int(q.abs().max()) == 127
    error = (dequantize_int8(q, scale) - x).abs()
    assert bool((error <= scale / 2 * (1 + 1e-5)).all())                # rounding: at most half a step
    assert torch.equal(dequantize_int8(q, scale)[0, 0, 7], torch.zeros(64))


def test_quantized_cache_returns_dequantized_keys_and_counts_its_bytes():
    cache = QuantizedKVCache(bits=8)
    ks, vs = [], []
    for step, (a, b) in enumerate(CHUNKS):
        k, v = kv(B=2, H_kv=3, S=b - a, Dh=64, Dv=64, seed=step)
        ks.append(k), vs.append(v)
        k_all, v_all = cache.update(0, k, v)
    for got, parts in ((k_all, ks), (v_all, vs)):
        want = torch.cat(parts, dim=2)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got, dequantize_int8(*quantize_int8(want)))
    full = KVCache()
    full.update(0, torch.cat(ks, 2), torch.cat(vs, 2))
    assert cache.nbytes == 2 * 3 * 40 * 2 * (64 + 4)                    # int8 numbers + one fp32 scale each
    assert cache.nbytes / full.nbytes == pytest.approx(68 / 256)


def test_quantized_attention_is_close_to_full_precision():
    x, valid = left_padded()
    stack = layers(rotary=RotaryEmbedding(8, 128))
    full, int8 = run_layers(stack, KVCache(), x, valid), run_layers(stack, QuantizedKVCache(), x, valid)
    assert 0 < (int8 - full).abs().max() < 0.02 * full.abs().max()


@pytest.mark.parametrize("bad", [4, 16, 8.0, True, "8"])
def test_quantized_bits_must_be_8(bad):
    with pytest.raises(ValueError, match=f"bits must be 8 .*got {bad!r}"):
        QuantizedKVCache(bits=bad)


# --- SinkCache --------------------------------------------------------------------------------------

def test_sink_cache_is_kv_cache_while_everything_fits():
    x, valid = left_padded()
    rotary = RotaryEmbedding(8, 128)
    stack = layers(rotary=rotary)
    cache = SinkCache(4, 36, rotary=rotary)
    assert torch.equal(run_layers(stack, cache, x, valid), run_layers(stack, KVCache(), x, valid))
    assert cache.seq_len == 40 and cache.nbytes == KVCache().nbytes + 2 * 3 * 2 * 40 * 2 * 8 * 4


def streaming_reference(mha, rotary, x, sinks, window, chunks):
    """StreamingLLM by hand: each query attends to the held tokens (the first `sinks` and the last `window`
    of those seen before its chunk) and to its chunk up to itself, every key rotated at its index in that list."""
    q, k, v = mha._project(x, None)                    # (B, H, T, Dh), (B, H_kv, T, Dh): not yet rotated
    held, outs = [], []
    for a, b in chunks:
        for t in range(a, b):
            keys = held + list(range(a, t + 1))
            positions = torch.arange(len(keys))
            out, _ = attention(rotary(q[:, :, t:t + 1], positions[-1:]),
                               repeat_kv(rotary(k[:, :, keys], positions), 2), repeat_kv(v[:, :, keys], 2))
            outs.append(out)                           # (B, H, 1, Dh)
        held += range(a, b)
        if len(held) > sinks + window:
            held = held[:sinks] + held[len(held) - window:]
    return mha.out(merge_heads(torch.cat(outs, dim=2)))


@pytest.mark.parametrize("sinks, window", [(4, 8), (0, 5), (2, 1), (1, 20)])
@pytest.mark.parametrize("chunks", [[(t, t + 1) for t in range(30)], [(0, 10)] + [(t, t + 1) for t in range(10, 30)],
                                    [(0, 7), (7, 12), (12, 13), (13, 30)]])
def test_sink_cache_keeps_sinks_and_window_with_positions_within_the_cache(sinks, window, chunks):
    torch.manual_seed(0)
    rotary = RotaryEmbedding(8, 128)
    mha = MultiHeadAttention(32, 4, 2, rotary=rotary).double().eval()
    x = torch.randn(2, 30, 32, dtype=torch.float64)
    cache = SinkCache(sinks, window, rotary=rotary)
    with torch.no_grad():
        ours = torch.cat([mha(x[:, a:b], is_causal=True, cache=cache) for a, b in chunks], dim=1)
        want = streaming_reference(mha, rotary, x, sinks, window, chunks)
    # the rotary table is float32: a key moved by re-rotation differs from one rotated afresh by ~1e-8
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-7)
    assert cache.seq_len == sinks + window == cache.capacity
    assert cache.nbytes == 2 * 2 * (sinks + window) * 2 * 8 * 8        # bounded, however long the stream


def test_sink_cache_without_rotary_only_drops_positions():
    cache = SinkCache(2, 3)
    stream = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1)
    for t in range(10):
        k_all, v_all = cache.update(0, stream[:, :, t:t + 1], stream[:, :, t:t + 1])
    assert k_all.flatten().tolist() == [0, 1, 6, 7, 8, 9]              # sinks, the window, the new token
    assert cache.seq_len == 5 and torch.equal(k_all, v_all)


@pytest.mark.parametrize("args, message", [
    ((4, 0), "window must be an int >= 1 (the last positions kept), got 0"),
    ((0, -3), "window must be an int >= 1"),
    ((-1, 8), "num_sinks must be an int >= 0 (the first positions kept for good), got -1"),
    ((4.0, 8), "num_sinks must be an int >= 0"),
    ((4, True), "window must be an int >= 1"),
])
def test_sink_cache_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SinkCache(*args)


def test_rotary_of_another_width_is_named():
    cache = SinkCache(1, 1, rotary=RotaryEmbedding(6, 16))
    with pytest.raises(ValueError, match=r"rotary turns 6 features, but k of shape \(2, 3, 1, 4\) is 4 wide"):
        cache.update(0, *kv(S=1, Dh=4, Dv=4))
    assert len(cache) == 0


# --- the contract every cache shares ---------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: PagedKVCache(4), QuantizedKVCache, lambda: SinkCache(2, 6)])
def test_every_cache_checks_its_input_as_kv_cache_does(make):
    cache = make()
    assert (len(cache), cache.seq_len, cache.batch_size, cache.nbytes) == (0, 0, None, 0)
    name = type(cache).__name__
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 4\) is not \(B, H_kv, S_new, Dh\)"):
        cache.update(0, torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 0\]"):
        cache.update(1, *kv())
    with pytest.raises(TypeError, match="k must be a floating-point tensor"):
        cache.update(0, torch.zeros(2, 3, 1, 4, dtype=torch.long), torch.zeros(2, 3, 1, 4))
    cache.update(0, *kv())
    assert (len(cache), cache.seq_len, cache.get_seq_len(0), cache.get_seq_len(1), cache.batch_size) == (1, 1, 1, 0, 2)
    with pytest.raises(ValueError, match=f"belongs to one batch and one model; start a new {name}"):
        cache.update(0, *kv(B=3))
    with pytest.raises(ValueError, match=f"has B=3, but the cache holds a batch of B=2: start a new {name}"):
        cache.update(1, *kv(B=3))
    with pytest.raises(TypeError, match="holds torch.float32, got torch.float64"):
        cache.update(0, *kv(dtype=torch.float64))
    assert name in repr(cache) and "seq_len=1" in repr(cache)


# --- every cache through LlamaDecoder and generate ----------------------------------------------------

@pytest.fixture(scope="module")
def decoder():
    from test_decoder import tiny_llama
    from attnlib import LlamaDecoder
    return LlamaDecoder.from_hf(tiny_llama(heads=8, kv_heads=2, layers=3))


def decoded(decoder, cache, x, mask=None, chunks=CHUNKS):
    """The logits of x (B, T) fed to the decoder chunk by chunk through one cache."""
    with torch.no_grad():
        return torch.cat([decoder(x[:, a:b], cache, attention_mask=None if mask is None else mask[:, :b])
                          for a, b in chunks], dim=1)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_cache_through_the_decoder_and_generate_is_bit_identical(decoder, block_size):
    from test_decoder import _left_pad, ids
    from attnlib import generate
    batch, mask = _left_pad([ids(1, n, seed=n)[0] for n in (29, 40, 33)])
    assert torch.equal(decoded(decoder, PagedKVCache(block_size), batch, mask), decoded(decoder, KVCache(), batch, mask))
    for prompt, m in ((batch[:, :14], mask[:, :14]), (ids(2, 9), None)):
        paged = PagedKVCache(block_size)
        assert torch.equal(generate(decoder, prompt, 20, attention_mask=m, cache=paged),
                           generate(decoder, prompt, 20, attention_mask=m))
        assert paged.seq_len == prompt.shape[1] + 19 and paged.num_blocks == 2 * 3 * 0 + paged.block_table.numel()


def test_quantized_cache_through_the_decoder_and_generate(decoder):
    from test_decoder import _left_pad, ids
    from attnlib import generate
    batch, mask = _left_pad([ids(1, n, seed=n)[0] for n in (29, 40, 33)])
    full, int8 = decoded(decoder, KVCache(), batch, mask), decoded(decoder, QuantizedKVCache(), batch, mask)
    real = mask.bool()
    assert 0 < (int8 - full)[real].abs().max() < 0.05 * full[real].abs().max()
    cache = QuantizedKVCache()
    out = generate(decoder, ids(2, 9), 20, cache=cache)
    assert out.shape == (2, 29) and cache.seq_len == 28 and cache.nbytes == 3 * 2 * 2 * 28 * 2 * (32 + 4)


def test_sink_cache_through_the_decoder_is_kv_cache_while_everything_fits(decoder):
    from test_decoder import ids
    from attnlib import generate
    x = ids(2, 40)
    cache = SinkCache(4, 36)
    assert torch.equal(decoded(decoder, cache, x), decoded(decoder, KVCache(), x))
    assert cache.rotary is decoder.rotary                          # the decoder handed over its RoPE
    prompt = ids(2, 9)
    assert torch.equal(generate(decoder, prompt, 30, cache=SinkCache(4, 36)), generate(decoder, prompt, 30))


def test_sink_cache_through_generate_stays_bounded_beyond_the_position_table(decoder):
    """A SinkCache renumbers what it keeps: 400 tokens from a model of 128 positions, in a fixed memory, and
    the same tokens as feeding them one at a time through decoder.forward."""
    from test_decoder import MAX_POS, ids
    from attnlib import generate
    prompt, cache = ids(1, 10, seed=3), SinkCache(4, 20)
    out = generate(decoder, prompt, 400, cache=cache)
    assert out.shape == (1, 410) and MAX_POS < 410
    assert cache.seq_len == 24 and cache.nbytes == 3 * 1 * 2 * 24 * 2 * 32 * 4
    by_hand = SinkCache(4, 20)
    with torch.no_grad():
        logits = torch.cat([decoder(prompt, by_hand)[:, -1:]] +
                           [decoder(out[:, t:t + 1], by_hand) for t in range(10, 409)], dim=1)
    assert torch.equal(logits.argmax(-1), out[:, 10:])
    with pytest.raises(ValueError, match=r"10 prompt tokens \+ max_new_tokens=400 = 410 positions are beyond "
                                         r"max_position_embeddings=128"):
        generate(decoder, prompt, 400, cache=SinkCache(4, 200))      # 204 positions would be needed


def test_caches_that_cannot_serve_a_model_say_why(decoder):
    from test_decoder import _left_pad, ids
    from test_sliding_window import ids as mistral_ids, tiny_mistral
    from attnlib import LlamaDecoder, generate
    batch, mask = _left_pad([ids(1, 5)[0], ids(1, 7)[0]])
    with pytest.raises(ValueError, match=r"attention_mask \(a padded batch\) cannot be used with a SinkCache"):
        generate(decoder, batch, 3, attention_mask=mask, cache=SinkCache(2, 8))
    mistral = LlamaDecoder.from_hf(tiny_mistral(8))
    with pytest.raises(ValueError, match=r"a model with sliding_window=8 drops old positions itself, and a SinkCache"):
        generate(mistral, mistral_ids(1, 4), 3, cache=SinkCache(2, 8))
    with pytest.raises(ValueError, match=r"another rotary embedding \(other frequencies\) than the model's"):
        generate(decoder, ids(1, 4), 3, cache=SinkCache(2, 8, rotary=RotaryEmbedding(32, 128, base=500.0)))
