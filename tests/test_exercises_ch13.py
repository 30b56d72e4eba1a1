"""Chapter 13's checkers: correct answers in several styles pass, each classic mistake is named, stubs and
crashes are handled, and no checker raises."""

import numpy as np
import pytest
import torch

from attnlib.caches import dequantize_int8, quantize_int8
from attnlib.exercises import (check_block_table_lookup, check_int8_quantization, check_rolling_buffer_update,
                               check_sliding_window_mask)
from exercise_helpers import assert_names, stub


# --- the sliding-window mask ---------------------------------------------------------------------

def window_by_distance(T, window):                      # the book's style: how far back each key is
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    return (d >= 0) & (d < window)


def window_by_triangles(seq_len, window_size):          # tril minus an older tril
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool)
    return torch.tril(ones) & ~torch.tril(ones, diagonal=-window_size)


def window_in_loops(n, w):                              # plain Python lists
    return [[1 if i - w < j <= i else 0 for j in range(n)] for i in range(n)]


def window_additive_4d(T, window):                      # transformers-style additive mask, (1, 1, T, T)
    allowed = torch.ones(T, T).tril().triu(-(window - 1)).bool()
    return torch.zeros(1, 1, T, T).masked_fill(~allowed, float("-inf"))


def window_numpy(T, window):
    i, j = np.ogrid[:T, :T]
    return (j <= i) & (j > i - window)


@pytest.mark.parametrize("answer", [window_by_distance, window_by_triangles,
                                    lambda T, w: window_by_distance(T, w)[None, None]])
def test_sliding_window_mask_accepts_correct_answers(answer):
    result = check_sliding_window_mask(answer)
    assert result.passed, result


@pytest.mark.parametrize("buggy, phrases", [
    (lambda T, w: window_by_distance(T, w + 1), ["window + 1 keys", "off by one"]),
    (lambda T, w: torch.ones(T, T).tril().triu(-w).bool(), ["window + 1 keys"]),
    (lambda T, w: window_by_distance(T, w - 1), ["window - 1 keys"]),
    (lambda T, w: (torch.arange(T)[:, None] - torch.arange(T)).abs() < w, ["no causal limit"]),
    (lambda T, w: ~window_by_distance(T, w), ["inverted"]),
    (lambda T, w: window_by_distance(T, w).T, ["counted forward", "transposed"]),
    (lambda T, w: torch.ones(T, T, dtype=torch.bool).tril(), ["plain causal mask"]),
    (lambda T, w: torch.arange(T)[None, :] > torch.arange(T)[:, None] - w, ["without the causal limit"]),
    (lambda T, w: torch.ones(T, T, dtype=torch.bool).tril() & (torch.arange(T) < w), ["first `window` keys"]),
    (lambda T, w: window_by_distance(T, w).float(), ["torch.float32 mask of 0s and 1s", "asks for a bool tensor"]),
    (lambda T, w: window_by_distance(T, w).int(), ["torch.int32 mask of 0s and 1s", "asks for a bool tensor"]),
    (window_additive_4d, ["an additive float mask", "~mask raises", "asks for a bool tensor"]),
    (window_in_loops, ["got a list of 9 items", "asks for a bool tensor"]),
    (window_numpy, ["should be a torch.Tensor", "got a numpy.ndarray of shape ("]),
    (lambda T, w: window_by_distance(T, w)[:-1], ["has shape (8, 9), expected (9, 9)"]),
])
def test_sliding_window_mask_names_the_mistake(buggy, phrases):
    assert_names(check_sliding_window_mask(buggy), *phrases)


def test_sliding_window_mask_stub_and_crash():
    assert check_sliding_window_mask(stub).status == "not attempted yet"
    assert_names(check_sliding_window_mask(lambda T, w: torch.ones(T).tril(w)), "raised RuntimeError")
    assert_names(check_sliding_window_mask(lambda T, w: "mask"), "should be a torch.Tensor", "got a str")


# --- the rolling-buffer update --------------------------------------------------------------------

def write_in_place(buffer, k, pos):                     # Mistral's style: one slot, in place, nothing returned
    buffer[:, :, pos % buffer.shape[2]] = k[:, :, 0]


def write_a_copy(cache, new_key, position):             # functional: a new tensor every step
    out = cache.clone()
    out[..., position % cache.shape[-2], :] = new_key.squeeze(-2)
    return out


def index_copy(buf, k, p):
    return buf.index_copy(2, torch.tensor([p % buf.size(2)]), k)


@pytest.mark.parametrize("answer", [write_in_place, write_a_copy, index_copy])
def test_rolling_buffer_accepts_correct_answers(answer):
    result = check_rolling_buffer_update(answer)
    assert result.passed, result


def no_wrap(buffer, k, pos):
    buffer[:, :, pos] = k[:, :, 0]
    return buffer


@pytest.mark.parametrize("buggy, phrases", [
    (no_wrap, ["raised IndexError", "wraps around, slot = pos % W"]),
    (lambda b, k, p: torch.cat([b[:, :, 1:], k], dim=2), ["shifted by one", "copies all W slots"]),
    (lambda b, k, p: write_a_copy(b, k, p + 1), ["slot (pos + 1) % W: off by one"]),
    (lambda b, k, p: write_a_copy(b, k, p - 1), ["slot (pos - 1) % W: off by one"]),
    (lambda b, k, p: b, ["the new key was never written"]),
    (lambda b, k, p: k.expand_as(b).clone(), ["written into every slot"]),
    (lambda b, k, p: k, ["the new key alone"]),
    (lambda b, k, p: torch.cat([b, k], dim=2), ["appended (W + 1 slots)"]),
])
def test_rolling_buffer_names_the_mistake(buggy, phrases):
    assert_names(check_rolling_buffer_update(buggy), *phrases)


def test_rolling_buffer_stub_crash_and_changed_key():
    assert check_rolling_buffer_update(stub).status == "not attempted yet"

    def scales_the_key(buffer, k, pos):
        k.mul_(2)
        write_in_place(buffer, k / 2, pos)
    assert_names(check_rolling_buffer_update(scales_the_key), "changed k in place")
    assert_names(check_rolling_buffer_update(lambda b, k, p: (b, k)), "should be a torch.Tensor", "got a tuple of 2 items")


# --- the block-table lookup -----------------------------------------------------------------------

def gather_blocks(pool, block_table, seq_len):          # the book's style
    blocks = pool[block_table]                          # (n, block_size, H_kv, Dh)
    return blocks.flatten(0, 1)[:seq_len].transpose(0, 1)


def per_position(pool, table, n):                       # a loop over positions, as a kernel would
    bs = pool.shape[1]
    return torch.stack([pool[table[p // bs], p % bs] for p in range(n)], dim=1)


def slot_indices(pool, table, S):                       # vLLM's slot mapping
    N, bs, H, Dh = pool.shape
    p = torch.arange(S)
    return pool.reshape(N * bs, H, Dh)[table[p // bs] * bs + p % bs].permute(1, 0, 2)


@pytest.mark.parametrize("answer", [gather_blocks, per_position, slot_indices,
                                    lambda pool, t, S: gather_blocks(pool, t, S)[None]])
def test_block_table_accepts_correct_answers(answer):
    result = check_block_table_lookup(answer)
    assert result.passed, result


@pytest.mark.parametrize("buggy, phrases", [
    (lambda pool, t, S: pool[:len(t)].flatten(0, 1)[:S].transpose(0, 1), ["the block table was not used"]),
    (lambda pool, t, S: pool[t].reshape(pool.shape[2], -1, pool.shape[3])[:, :S], ["mixed by a reshape"]),
    (lambda pool, t, S: pool[t].flatten(0, 1)[:S], ["(seq_len, H_kv, Dh)", "head axis"]),
    (lambda pool, t, S: pool[t].flatten(0, 1).transpose(0, 1), ["every slot of the last block"]),
    (lambda pool, t, S: pool[t], ["the blocks themselves"]),
    (lambda pool, t, S: gather_blocks(pool, t, S - 1), ["has shape (2, 9, 3), expected (2, 10, 3)"]),
])
def test_block_table_names_the_mistake(buggy, phrases):
    assert_names(check_block_table_lookup(buggy), *phrases)


def test_block_table_stub_and_crash():
    assert check_block_table_lookup(stub).status == "not attempted yet"
    assert_names(check_block_table_lookup(lambda pool, t, S: pool[t.float()]), "raised IndexError")


# --- int8 quantization ----------------------------------------------------------------------------

def quantize_book(x):
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / safe).clamp(-127, 127).to(torch.int8), scale


def dequantize_book(q, scale):
    return q.float() * scale


def quantize_asymmetric(x):                             # uint8 with a zero point, as many libraries do
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / 255).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    return torch.clamp(torch.round(x / scale) + zero, 0, 255).to(torch.uint8), scale, zero


def dequantize_asymmetric(q, scale, zero):
    return (q.float() - zero) * scale


def quantize_fp16_scales(x):                            # scales kept in half precision, as servers do
    scale = (x.abs().amax(-1, keepdim=True) / 127).half()
    return torch.nan_to_num(x / scale.float()).round().clamp(-127, 127).char(), scale


@pytest.mark.parametrize("quantize, dequantize", [
    (quantize_book, dequantize_book),
    (quantize_int8, dequantize_int8),
    (quantize_asymmetric, dequantize_asymmetric),
    (quantize_fp16_scales, lambda q, s: q.float() * s.float()),
])
def test_int8_accepts_correct_answers(quantize, dequantize):
    result = check_int8_quantization(quantize, dequantize)
    assert result.passed, result


def quantize_with(scale_of, rounding=torch.round, clamp=True):
    def quantize(x):
        scale = scale_of(x)
        q = rounding(x / torch.where(scale != 0, scale, torch.ones_like(scale)))
        return (q.clamp(-127, 127) if clamp else q).to(torch.int8), scale
    return quantize


AMAX = lambda x: x.abs().amax(dim=-1, keepdim=True)  # noqa: E731


@pytest.mark.parametrize("quantize, phrases", [
    (quantize_with(lambda x: AMAX(x) / 127, rounding=torch.trunc), ["truncation instead of rounding"]),
    (lambda x: (x / (AMAX(x) / 127)).to(torch.int8), ["returned Tensor", "(q, scale)"]),
    (quantize_with(lambda x: AMAX(x) / 128, clamp=False), ["max|x| / 128", "wraps to -128"]),
    (quantize_with(lambda x: AMAX(x) / 128), ["max|x| / 128", "clipped to 127"]),
    (quantize_with(lambda x: AMAX(x) / 255), ["max|x| / 255", "clipped"]),
    (quantize_with(lambda x: x.amax(dim=-1, keepdim=True) / 127), ["max(x) instead of max(|x|)"]),
    (quantize_with(lambda x: x.abs().amax() / 127), ["one scale for the whole tensor"]),
    (quantize_with(lambda x: x.abs().amax(dim=-2, keepdim=True) / 127), ["one scale per feature"]),
    (quantize_with(lambda x: x.abs().amax(dim=(1, 3), keepdim=True) / 127), ["one scale per token over all heads"]),
    (lambda x: (quantize_book(x)[0].float(), quantize_book(x)[1]), ["torch.float32", "store it as int8",
                                                                    "whole numbers already"]),
    (lambda x: (torch.ones_like(x, dtype=torch.int8), x.clone()), ["scale numbers for", "one scale per vector"]),
])
def test_int8_names_the_mistake(quantize, phrases):
    assert_names(check_int8_quantization(quantize, dequantize_book), *phrases)


def quantize_unguarded(x):                              # 0 / 0 = NaN on the all-zero vector, cast to int8
    scale = AMAX(x) / 127
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_scale_amax(x):                             # stores max|x| and puts the 127 into q
    return torch.round(x / AMAX(x).clamp_min(1e-12) * 127).to(torch.int8), AMAX(x)


@pytest.mark.parametrize("quantize, dequantize, phrases", [     # issue 36
    (quantize_unguarded, dequantize_book, ["casts NaN to an integer", "all-zero vector", "guard the division"]),
    (lambda x: (torch.round(x / (AMAX(x) / 128).clamp_min(1e-12)).clamp(-128, 127).to(torch.int8), AMAX(x) / 128),
     dequantize_book, ["max|x| / 128 with q clamped to int8's [-128, 127]"]),
    (quantize_with(lambda x: AMAX(x)), dequantize_book, ["scale = max|x| (without / 127)"]),
    (quantize_book, lambda q, scale: q.float(), ["dequantize returns q itself, without its scale"]),
    (quantize_book, lambda q, scale: q * scale * 127, ["dequantize multiplies q by 127 · scale"]),
    (quantize_scale_amax, lambda q, scale: q * scale, ["it is x times 127", "one constant factor"]),
])
def test_int8_names_more_mistakes(quantize, dequantize, phrases):
    assert_names(check_int8_quantization(quantize, dequantize), *phrases)


def test_int8_clamped_to_int8_range_with_the_right_scale_passes():   # -128 is never reached: not a mistake
    def quantize(x):
        scale = AMAX(x) / 127
        return torch.round(x / scale.clamp_min(1e-12)).clamp(-128, 127).to(torch.int8), scale
    assert check_int8_quantization(quantize, dequantize_book).passed


def test_int8_names_the_nan_of_an_all_zero_vector():
    def asymmetric_unguarded(x):                        # a zero vector: scale 0, zero point -0 / 0 = NaN
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        scale = (hi - lo) / 255
        zero = torch.round(-lo / scale)
        return torch.clamp(torch.round(x / scale) + zero, 0, 255).to(torch.uint8), scale, zero
    assert_names(check_int8_quantization(asymmetric_unguarded, dequantize_asymmetric), "casts NaN to an integer",
                 "all-zero")


def test_int8_stub_crash_and_integer_output():
    assert check_int8_quantization(stub, stub).status == "not attempted yet"
    assert check_int8_quantization(quantize_book, stub).status == "not attempted yet"
    assert_names(check_int8_quantization(quantize_book, lambda q, s: q * s.int()), "returned torch.int32",
                 "in floating point")
    assert_names(check_int8_quantization(quantize_book, lambda q: q.float()), "raised TypeError")
    assert_names(check_int8_quantization(lambda x: x.abs_(), dequantize_book), "changed x in place")
