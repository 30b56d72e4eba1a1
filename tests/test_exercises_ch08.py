"""Chapter 8's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import copy

import pytest
import torch

from attnlib import KVCache
from attnlib.exercises import check_cache_update, check_cached_decode, check_left_pad_positions
from exercise_helpers import assert_names, stub


# --- one layer's cache update ---------------------------------------------------------------------

def test_cache_update_accepts_a_correct_one():
    assert check_cache_update(lambda pk, pv, k, v: (torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2))).passed

    def via_kv_cache(pk, pv, k, v):
        cache = KVCache()
        cache.update(0, pk, pv)
        return cache.update(0, k, v)
    assert check_cache_update(via_kv_cache).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda pk, pv, k, v: (k, v), ["the new positions only"]),
    (lambda pk, pv, k, v: (pk, pv), ["the past only"]),
    (lambda pk, pv, k, v: (torch.cat([pk, k], 1), torch.cat([pv, v], 1)), ["along the head axis (dim=1)"]),
    (lambda pk, pv, k, v: (torch.cat([pk, k], -1), torch.cat([pv, v], -1)), ["along the head width Dh"]),
    (lambda pk, pv, k, v: (torch.cat([k, pk], 2), torch.cat([v, pv], 2)), ["new positions before the cached"]),
    (lambda pk, pv, k, v: (torch.cat([pv, v], 2), torch.cat([pk, k], 2)), ["keys and values swapped"]),
    (lambda pk, pv, k, v: torch.cat([pk, k], 2), ["should return a pair (k_all, v_all), got Tensor"]),
])
def test_cache_update_names_the_mistake(buggy, phrases):
    assert_names(check_cache_update(buggy), *phrases)


def test_cache_update_stub_and_crash():
    assert check_cache_update(stub).status == "not attempted yet"

    def crashes(pk, pv, k, v):
        return torch.cat([pk, k], dim=2), torch.cat([pv, k.mT], dim=2)  # the reader's typo
    assert_names(check_cache_update(crashes), "raised RuntimeError", "`return torch.cat([pk, k], dim=2)")
    assert_names(check_cache_update(None), "expected a function or class, got NoneType")


# --- positions of a left-padded batch ------------------------------------------------------------

def test_left_pad_positions_accepts_correct_ones():
    assert check_left_pad_positions(lambda m: (m.cumsum(-1) - 1).clamp(min=0)).passed
    assert check_left_pad_positions(lambda m: (m.long().cumsum(-1) - 1).masked_fill(m == 0, 1)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda m: torch.arange(m.shape[1]).expand_as(m), ["torch.arange", "padding shifts"]),
    (lambda m: m.cumsum(-1), ["start at 1", "subtract 1"]),
    (lambda m: m.cumsum(0) - 1, ["over the batch axis (dim=0)"]),
    (lambda m: (1 - m).cumsum(-1) - 1, ["padding counted", "inverted"]),
    (lambda m: (m.cumsum(-1) - 1).float(), ["torch.float32", "must be integers"]),
    (lambda m: m.cumsum(-1)[:, 1:], ["has shape (4, 6), expected (4, 7)"]),
])
def test_left_pad_positions_names_the_mistake(buggy, phrases):
    assert_names(check_left_pad_positions(buggy), *phrases)


def test_left_pad_positions_stub_and_crash():
    assert check_left_pad_positions(stub).status == "not attempted yet"
    assert_names(check_left_pad_positions(lambda m: m.cumsum()), "raised TypeError")


# --- the cached greedy loop ----------------------------------------------------------------------

def decode(decoder, input_ids, max_new_tokens):
    cache, out = KVCache(), input_ids
    logits = decoder(input_ids, cache)                                   # prefill: (1, T, vocab)
    for _ in range(max_new_tokens):
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        if out.shape[1] < input_ids.shape[1] + max_new_tokens:
            logits = decoder(out[:, -1:], cache)                         # one token: (1, 1, vocab)
    return out


def test_cached_decode_accepts_a_correct_one():
    result = check_cached_decode(decode)
    assert result.passed and "in 8 decoder calls" in result.message, result


def while_loop(model, prompt, n):  # transformers' names, a while loop, forward() called directly
    past_key_values, generated = KVCache(), prompt
    next_input = prompt
    while generated.shape[1] < prompt.shape[1] + n:
        logits = model.forward(next_input, past_key_values)
        next_input = torch.argmax(logits[0, -1]).view(1, 1)
        generated = torch.hstack([generated, next_input])
    return generated


def feeds_the_last_token(decoder, input_ids, max_new_tokens):  # one wasted call at the end
    cache, out = KVCache(), input_ids
    logits = decoder(input_ids, cache)
    for _ in range(max_new_tokens):
        out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)
        logits = decoder(out[:, -1:], cache)
    return out


def test_cached_decode_accepts_other_styles():
    assert check_cached_decode(while_loop).passed
    result = check_cached_decode(feeds_the_last_token)
    assert result.passed and "the last call fed the final token" in result.message, result


def peeks_then_extends(decoder, input_ids, max_new_tokens):  # twice per step: a copy of the cache to peek
    cache, out = KVCache(), input_ids
    logits = decoder(input_ids, cache)
    for _ in range(max_new_tokens - 1):
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        decoder(out[:, -1:], copy.deepcopy(cache))                       # the peek, thrown away
        logits = decoder(out[:, -1:], cache)
    return torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)


def prompt_in_pieces(decoder, input_ids, max_new_tokens):
    cache, out = KVCache(), input_ids
    for t in range(input_ids.shape[1]):
        logits = decoder(input_ids[:, t:t + 1], cache)                   # the prompt one token at a time
    for _ in range(max_new_tokens):
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        if out.shape[1] < input_ids.shape[1] + max_new_tokens:
            logits = decoder(out[:, -1:], cache)
    return out


@pytest.mark.parametrize("wasteful, phrases", [
    (peeks_then_extends, ["right tokens, but the decoder was called 15 times for 8 new tokens",
                          "2 calls per step", "twice per step"]),
    (prompt_in_pieces, ["the prompt was fed in pieces", "fed 1 of its 6 tokens"]),
])
def test_cached_decode_counts_the_calls(wasteful, phrases):
    assert_names(check_cached_decode(wasteful), *phrases)


def no_cache(decoder, input_ids, max_new_tokens):
    out = input_ids
    for _ in range(max_new_tokens):
        out = torch.cat([out, decoder(out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def new_cache_each_step(decoder, input_ids, max_new_tokens):
    out = input_ids
    for _ in range(max_new_tokens):
        out = torch.cat([out, decoder(out, KVCache())[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def refeeds_everything(decoder, input_ids, max_new_tokens):
    cache, out = KVCache(), input_ids
    for _ in range(max_new_tokens):
        out = torch.cat([out, decoder(out, cache)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def first_row(decoder, input_ids, max_new_tokens):
    cache, out = KVCache(), input_ids
    logits = decoder(input_ids, cache)
    for _ in range(max_new_tokens):
        out = torch.cat([out, logits[:, 0].argmax(-1, keepdim=True)], dim=1)
        logits = decoder(out[:, -1:], cache)
    return out


def one_short(decoder, input_ids, max_new_tokens):
    return decode(decoder, input_ids, max_new_tokens - 1)


@pytest.mark.parametrize("buggy, phrases", [
    (no_cache, ["right tokens, but some calls had no cache", "tokens fed in 8 calls instead of 13"]),
    (new_cache_each_step, ["a new empty KVCache was made after the first call"]),
    (refeeds_everything, ["a cache that already held them", "feed only the newest token"]),
    (first_row, ["FIRST token", "logits[:, -1]"]),
    (one_short, ["has shape (1, 13), expected (1, 14)"]),
    (lambda d, x, n: decode(d, x, n)[:, x.shape[1]:], ["has shape (1, 8), expected (1, 14)"]),
])
def test_cached_decode_names_the_mistake(buggy, phrases):
    assert_names(check_cached_decode(buggy), *phrases)


def test_cached_decode_stub_and_crash():
    assert check_cached_decode(stub).status == "not attempted yet"
    assert_names(check_cached_decode(lambda d, x, n: d(x, cache=[])), "raised TypeError",
                 "cache must be an attnlib.KVCache, got list")
    assert_names(check_cached_decode(lambda d, x, n: x.tolist()), "should be a torch.Tensor", "got a list of")
