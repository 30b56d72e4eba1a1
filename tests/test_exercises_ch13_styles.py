"""Chapter 13's checkers against answers written in other courses' and libraries' styles (transformers'
additive masks, vLLM's slot mapping, KIVI's and HF's asymmetric quantizers, numpy, loops, float64), against
realistic bugs, each of which must be named, and against hostile code (a hang, sys.exit, global state)."""

import sys
import time

import numpy as np
import pytest
import torch

from attnlib.exercises import (check_block_table_lookup, check_int8_quantization, check_rolling_buffer_update,
                               check_sliding_window_mask)
from attnlib.exercises._guard import limited_to
from exercise_helpers import assert_names


@pytest.fixture(autouse=True)
def short_limit():
    with limited_to(0.5):   # the hangs below are stopped in half a second, not the default 10
        yield


def distance(T):
    return torch.arange(T)[:, None] - torch.arange(T)[None, :]   # (T, T): i - j


def passes(result):
    assert result.passed, result


# --- the sliding-window mask ---------------------------------------------------------------------

def window_transformers(T, window):                     # additive, torch.finfo(dtype).min, (1, 1, T, T)
    allowed = (distance(T) >= 0) & (distance(T) < window)
    return torch.full((T, T), torch.finfo(torch.float32).min).masked_fill(allowed, 0.0)[None, None]


def window_minus_1e9(T, w):                             # an older additive style, float64
    allowed = torch.ones(T, T).tril().triu(-(w - 1)).bool()
    return torch.zeros(T, T, dtype=torch.float64).masked_fill(~allowed, -1e9)


def window_loops(T, window):
    m = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(max(0, i - window + 1), i + 1):
            m[i, j] = True
    return m


def window_mask_mod(T, window):                         # flex_attention's mask_mod, materialised
    mask_mod = lambda b, h, q, kv: (q >= kv) & (q - kv < window)  # noqa: E731
    return mask_mod(0, 0, torch.arange(T)[:, None], torch.arange(T)[None])


def window_bf16_finfo(T, window):
    hidden = ~((distance(T) >= 0) & (distance(T) < window))
    return torch.zeros(T, T, dtype=torch.bfloat16).masked_fill(hidden, torch.finfo(torch.bfloat16).min)


@pytest.mark.parametrize("answer", [window_loops, window_mask_mod])
def test_sliding_window_accepts_other_styles(answer):
    passes(check_sliding_window_mask(answer))


@pytest.mark.parametrize("answer", [window_transformers, window_minus_1e9, window_bf16_finfo])
def test_sliding_window_refuses_an_additive_mask_naming_the_rule(answer):   # issue 36: ~mask raises on a float
    assert_names(check_sliding_window_mask(answer), "an additive float mask", "asks for a bool tensor")


def test_sliding_window_refuses_a_zero_answer_under_patched_torch():
    def zero(T, w):
        torch.equal = torch.allclose = lambda *a, **k: True
        return torch.zeros(T, T, dtype=torch.bool)
    equal = torch.equal
    assert_names(check_sliding_window_mask(zero), "replaced torch's own torch.allclose, torch.equal")
    assert torch.equal is equal


@pytest.mark.parametrize("buggy, phrases", [
    (lambda T, w: (distance(T) > 0) & (distance(T) <= w), ["the query itself left out"]),
    (lambda T, w: (distance(T) >= 0) & (distance(T) <= w), ["window + 1 keys", "Mistral paper"]),
    (lambda T, w: (distance(T) < 0) | (distance(T) >= w), ["inverted"]),
    (lambda T, w: np.tril(np.ones((T, T), int)) - np.tril(np.ones((T, T), int), -w),
     ["got a numpy.ndarray of shape (", "asks for a bool tensor"]),
    (lambda T, w: (torch.arange(T)[:, None] // w == torch.arange(T)[None] // w) & (distance(T) >= 0),
     ["chunked attention"]),
    (lambda T, w: distance(T).abs() <= w // 2, ["symmetric window", "Longformer"]),
])
def test_sliding_window_names_more_mistakes(buggy, phrases):
    assert_names(check_sliding_window_mask(buggy), *phrases)


def test_sliding_window_survives_hostile_code():
    def hang(T, w):
        while True:
            pass
    assert_names(check_sliding_window_mask(hang), "did not return within 0.5 s")
    assert_names(check_sliding_window_mask(lambda T, w: sys.exit(0)), "sys.exit(0)")

    def float64_default(T, w):
        torch.set_default_dtype(torch.float64)
        return window_loops(T, w)
    assert_names(check_sliding_window_mask(float64_default), "set_default_dtype")
    assert torch.get_default_dtype() == torch.float32


# --- the rolling-buffer update --------------------------------------------------------------------

def rolling_narrow(buffer, k, pos):
    buffer.narrow(2, pos % buffer.size(2), 1).copy_(k)
    return buffer


def rolling_where(buffer, k, pos):                      # functional, no indexing
    W = buffer.shape[2]
    return torch.where((torch.arange(W) == pos % W).view(1, 1, W, 1), k, buffer)


def rolling_scatter(cache, key, step):
    return cache.scatter(2, torch.full_like(key, step % cache.shape[2], dtype=torch.long), key)


def rolling_float64(buffer, k, pos):
    out = buffer.double().clone()
    out[:, :, pos % out.shape[2]] = k[:, :, 0].double()
    return out


class RollingCounter:                                   # counts positions itself (they come in order)
    def __init__(self):
        self.n = 0

    def __call__(self, buffer, k, pos):
        buffer[:, :, self.n % buffer.shape[2]] = k[:, :, 0]
        self.n += 1


@pytest.mark.parametrize("answer", [rolling_narrow, rolling_where, rolling_scatter, rolling_float64, RollingCounter])
def test_rolling_buffer_accepts_other_styles(answer):
    passes(check_rolling_buffer_update(answer() if isinstance(answer, type) else answer))


def written(buffer, k, slot):
    buffer[:, :, slot] = k[:, :, 0]
    return buffer


def feature_axis(buffer, k, pos):
    buffer[..., pos % buffer.shape[2]] = k[..., 0]
    return buffer


@pytest.mark.parametrize("buggy, phrases", [
    (lambda b, k, p: written(b, k, p % b.shape[-1]), ["pos=4", "wraps around", "W = buffer.shape[2]"]),
    (lambda b, k, p: written(b, k, p % b.shape[1]), ["modulo buffer.shape[0] = 2", "is buffer.shape[2]"]),
    (feature_axis, ["along the last axis"]),
    (lambda b, k, p: torch.cat([written(b.clone(), k, p % b.shape[2])[:1], b[1:]]), ["only the first sequence"]),
    (lambda b, k, p: written(b, k, min(p, b.shape[2] - 1)), ["slot min(pos, W - 1)", "wraps around"]),
    # issue 36: each named alone, although at the first wrong step another rule writes the same slot
    (lambda b, k, p: written(b, k, b.shape[2] - 1 - p % b.shape[2]), ["pos=0", "W - 1 - pos % W"]),
    (lambda b, k, p: written(b, k, p % (b.shape[2] - 1)), ["pos=3", "modulo W - 1"]),
    (lambda b, k, p: written(b, k, [0, 1, 2, 3, 1][p % 5]), ["pos=4", "wrote the key into slot 1, not slot pos % W = 0",
                                                              "fit none of the usual mistakes"]),
])
def test_rolling_buffer_names_more_mistakes(buggy, phrases):
    result = check_rolling_buffer_update(buggy)
    assert_names(result, *phrases)
    assert " and " not in result.message.split("it matches")[-1][:60], result.message   # one mistake, not two


def test_rolling_buffer_survives_hostile_code():
    assert_names(check_rolling_buffer_update(lambda b, k, p: time.sleep(30)), "did not return within 0.5 s")

    def grad_off(buffer, k, pos):
        torch.set_grad_enabled(False)
        return written(buffer, k, pos % buffer.shape[2])
    assert_names(check_rolling_buffer_update(grad_off), "switched autograd off")
    assert torch.is_grad_enabled()


# --- the block-table lookup -----------------------------------------------------------------------

def vllm_slot_mapping(key_cache, block_tables, context_len):
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    slot_mapping = [int(block_tables[i // block_size]) * block_size + i % block_size for i in range(context_len)]
    return key_cache.view(-1, num_kv_heads, head_size)[torch.tensor(slot_mapping)].transpose(0, 1).contiguous()


def cat_blocks(pool, table, n):
    return torch.cat([pool[int(b)] for b in table], 0)[:n].permute(1, 0, 2)


def index_select_permute(pool, block_table, seq_len):
    N, bs, H, D = pool.shape
    return pool.index_select(0, block_table).permute(2, 0, 1, 3).reshape(H, -1, D)[:, :seq_len]


def numpy_lookup(pool, t, S):
    p, bs = pool.numpy(), pool.shape[1]
    return np.stack([p[int(t[i // bs]), i % bs] for i in range(S)], 1)


@pytest.mark.parametrize("answer", [vllm_slot_mapping, cat_blocks, index_select_permute,
                                    lambda pool, t, S: pool.double()[t].flatten(0, 1)[:S].transpose(0, 1)])
def test_block_table_accepts_other_styles(answer):
    passes(check_block_table_lookup(answer))


def by_position(block_of, slot_of):
    def lookup(pool, t, S):
        bs = pool.shape[1]
        return torch.stack([pool[t[block_of(p, bs, len(t))], slot_of(p, bs, len(t))] for p in range(S)], 1)
    return lookup


@pytest.mark.parametrize("buggy, phrases", [
    (by_position(lambda p, bs, n: min((p + 1) // bs, n - 1), lambda p, bs, n: p % bs),
     ["Position 3 came from slot 3 of block 2 = block_table[1]", "block_table[0]", "off by one"]),
    (by_position(lambda p, bs, n: p % n, lambda p, bs, n: (p // n) % bs), ["Position 1 came from slot 0 of block 2"]),
    (lambda pool, t, S: pool.flatten(0, 1)[t[torch.arange(S) // 4] + torch.arange(S) % 4].transpose(0, 1),
     ["the block number used as a slot index"]),
    (lambda pool, t, S: pool[t[:S // 4]].flatten(0, 1).transpose(0, 1), ["the last, partly filled block is missing"]),
    (lambda pool, t, S: pool[t.sort().values].flatten(0, 1)[:S].transpose(0, 1),      # issue 36: not "off by one"
     ["taken in increasing block number (the table sorted"]),
    (lambda pool, t, S: pool[torch.isin(torch.arange(pool.shape[0]), t)].flatten(0, 1)[:S].transpose(0, 1),
     ["a mask over the pool's blocks"]),
])
def test_block_table_names_more_mistakes(buggy, phrases):
    assert_names(check_block_table_lookup(buggy), *phrases)


def test_block_table_survives_hostile_code():
    assert_names(check_block_table_lookup(lambda pool, t, S: sys.exit(3)), "sys.exit(3)")

    def seeds(pool, t, S):
        torch.manual_seed(0)
        return cat_blocks(pool, t, S)
    assert_names(check_block_table_lookup(seeds), "torch.manual_seed(0)")


# --- int8 quantization ----------------------------------------------------------------------------

def amax(x):
    return x.abs().amax(dim=-1, keepdim=True)


def safe(scale):
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def kivi(x, bits=8):                                    # KIVI's per-token quantizer: the minimum as an offset
    mn, mx = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = safe((mx - mn) / (2 ** bits - 1))
    return ((x - mn) / scale).round().clamp(0, 2 ** bits - 1).to(torch.uint8), scale, mn


def signed_zero_point(x):                               # int8 in [-128, 127] with an integer zero point
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / 255).clamp_min(1e-12)
    zp = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    return (torch.round(x / scale) + zp).clamp(-128, 127).to(torch.int8), scale, zp.to(torch.int8)


def inverse_scale(x):                                   # stores 127 / max|x|, a multiplier
    inv = torch.where(amax(x) > 0, 127 / amax(x), torch.zeros_like(amax(x)))
    return (x * inv).round().to(torch.int8), inv


def vector_loop(x):
    q, s = torch.empty_like(x, dtype=torch.int8), torch.empty(*x.shape[:-1], 1)
    for idx in np.ndindex(*x.shape[:-1]):
        m = float(x[idx].abs().max())
        q[idx], s[idx] = torch.round(x[idx] / (m / 127 if m else 1.0)).to(torch.int8), m / 127
    return q, s


def half_away_from_zero(x):
    y = x / safe(amax(x) / 127)
    return (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-127, 127).to(torch.int8), amax(x) / 127


def numpy_quantize(x):
    s = np.abs(x.numpy()).max(-1, keepdims=True) / 127
    s = np.where(s > 0, s, 1.0)
    return np.clip(np.rint(x.numpy() / s), -127, 127).astype(np.int8), s


def bf16_scales(x):
    s = (amax(x) / 127).bfloat16()
    return (x / safe(s.float())).round().clamp(-127, 127).to(torch.int8), s


def no_keepdim(x):
    s = x.abs().amax(-1) / 127
    return torch.round(x / safe(s)[..., None]).to(torch.int8), s


@pytest.mark.parametrize("quantize, dequantize", [
    (kivi, lambda q, scale, mn: q.float() * scale + mn),
    (signed_zero_point, lambda q, scale, zp: (q.float() - zp.float()) * scale),
    (inverse_scale, lambda q, inv: torch.where(inv > 0, q.float() / inv, torch.zeros(q.shape))),
    (vector_loop, lambda q, s: q.double() * s.double()),
    (half_away_from_zero, lambda q, s: q * s),
    (bf16_scales, lambda q, s: q.float() * s.float()),
    (no_keepdim, lambda q, s: q.float() * s[..., None]),
    (lambda x: signed_zero_point(x.double()), lambda q, scale, zp: (q.double() - zp.double()) * scale),
])
def test_int8_accepts_other_styles(quantize, dequantize):
    passes(check_int8_quantization(quantize, dequantize))


def symmetric(rounding=torch.round):
    return lambda x: (rounding(x / safe(amax(x) / 127)).clamp(-127, 127).to(torch.int8), amax(x) / 127)


def uint8_without_clamp(x):                             # 256 levels counted and no clamp: the top wraps to 0
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / 256).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    return (torch.round(x / scale) + zero).to(torch.uint8), scale, zero


@pytest.mark.parametrize("quantize, dequantize, phrases", [
    (symmetric(torch.floor), lambda q, s: q.float() * s, ["floor instead of rounding"]),
    (lambda x: (torch.round(x * amax(x) / 127).clamp(-127, 127).to(torch.int8), amax(x) / 127),
     lambda q, s: q.float() * s, ["multiplied by the scale instead of divided"]),
    (symmetric(), lambda q, s: q.float() / safe(s), ["dequantize divides by the scale"]),
    (signed_zero_point, lambda q, s, zp: q.float() * s, ["ignores the zero point"]),
    (signed_zero_point, lambda q, s, zp: (q.float() + zp.float()) * s, ["adds the zero point"]),
    (kivi, lambda q, s, mn: q.float() * s, ["ignores the zero point (or offset)"]),
    (uint8_without_clamp, lambda q, s, z: (q.float() - z) * s, ["wraps around when cast", "clamp before casting"]),
    (lambda x: (torch.round(x / safe(amax(x) / 127)).short().to(torch.uint8), amax(x) / 127),
     lambda q, s: q.float() * s, ["negative values stored as uint8", "torch.int8"]),
])
def test_int8_names_more_mistakes(quantize, dequantize, phrases):
    assert_names(check_int8_quantization(quantize, dequantize), *phrases)


def test_int8_survives_hostile_code():
    def hang(x):
        while True:
            pass
    assert_names(check_int8_quantization(hang, lambda q, s: q), "did not return within 0.5 s")
    assert_names(check_int8_quantization(symmetric(), lambda q, s: sys.exit("bye")), "sys.exit('bye')")

    def float64_default(x):
        torch.set_default_dtype(torch.float64)
        return symmetric()(x)
    assert_names(check_int8_quantization(float64_default, lambda q, s: q * s), "set_default_dtype")
    assert torch.get_default_dtype() == torch.float32


def test_rolling_buffer_names_a_scaled_key():                  # issue 36: held-out style
    def half(buffer, k, pos):
        buffer[:, :, pos % buffer.shape[2]] = 0.5 * k[:, :, 0]
    assert_names(check_rolling_buffer_update(half), "pos=0", "wrote slot 0 alone", "k times 0.5")


def test_block_table_names_blocks_taken_in_turn():
    def in_turn(pool, table, n):
        p = torch.arange(n)
        return pool[table[p % len(table)], p % pool.shape[1]].transpose(0, 1)
    assert_names(check_block_table_lookup(in_turn), "p % len(block_table)")


def test_rolling_buffer_names_any_constant_offset():                 # issue 36, held-out set 2
    assert_names(check_rolling_buffer_update(lambda b, k, p: written(b, k, (p + 2) % b.shape[2])),
                 "slot (pos + 2) % W: the slot is off by 2")


def test_block_table_names_a_reversed_table():
    assert_names(check_block_table_lookup(lambda pool, t, S: pool[t.flip(0)].flatten(0, 1)[:S].transpose(0, 1)),
                 "the block table read backwards")


def test_int8_names_uint8_offset_left_in():
    def offset(x):
        s = amax(x).clamp_min(1e-8) / 127
        return (torch.round(x / s) + 128).to(torch.uint8), s
    assert_names(check_int8_quantization(offset, lambda q, s: q.float() * s), "leaves uint8's offset in")


@pytest.mark.parametrize("check, answer", [(check_block_table_lookup, numpy_lookup),
    (lambda answer: check_int8_quantization(answer, lambda q, s: torch.from_numpy(q.astype(np.float32) * s)),
     numpy_quantize)])
def test_numpy_arrays_with_the_right_values_are_refused_by_name(check, answer):
    """A checker takes torch.Tensors only (issue 36): an array is named, with the way to turn it into one."""
    assert_names(check(answer), "should be a torch.Tensor", "got a numpy.ndarray of shape (", "torch.from_numpy")
