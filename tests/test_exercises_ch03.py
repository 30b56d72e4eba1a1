"""Chapter 3's checkers: a correct mask passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from attnlib import masks
from attnlib.exercises import (check_causal_mask, check_cross_attention_mask, check_hf_to_mask,
                               check_padding_causal_mask)
from exercise_helpers import assert_names, stub


def assert_stub_and_crash(check, crashes):
    assert check(stub).status == "not attempted yet"
    assert_names(check(crashes), "raised ZeroDivisionError", "at line")
    assert_names(check(lambda *args: [[True]]), "should be a torch.Tensor", "got a list of")
    assert_names(check(42), "expected a function or class, got int")


def _boom(*args):
    return 1 / 0


# --- causal mask, bottom-right ------------------------------------------------------------------

def causal(T, S):
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)


@pytest.mark.parametrize("mask", [
    causal,
    lambda T, S: torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T),   # index grids
    lambda T, S: ~torch.ones(T, S, dtype=torch.bool).triu(S - T + 1),             # "no future" inverted
    lambda T, S: torch.tril(torch.ones(S, S))[-T:].bool(),                        # last T rows of the full mask
    lambda T, S: torch.ones(T, S).tril(S - T) == 1,
    lambda T, S: torch.ones(T, S, dtype=torch.int8).tril(S - T).bool(),
])
def test_causal_accepts_correct_ones(mask):
    assert check_causal_mask(mask).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(), ["top-left alignment"]),
    (lambda T, S: ~causal(T, S), ["inverted"]),
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1), ["diagonal left out"]),
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(-1), ["strict causal mask, top-left"]),
    (lambda T, S: torch.ones(T, S).triu(1) == 0, ["top-left alignment"]),
    (lambda T, S: causal(T, S).half(), ["right pattern but dtype torch.float16"]),
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T), ["upper triangle"]),
    (lambda T, S: causal(S, T), ["(S, T) mask"]),
    (lambda T, S: causal(T, S).float(), ["right pattern but dtype torch.float32"]),
    (lambda T, S: torch.zeros(T, S).masked_fill(~causal(T, S), float("-inf")), ["additive float mask"]),
    (lambda T, S: torch.eye(T, S, dtype=torch.bool), ["7 entries are False where it should be True: (query 0, key 1)"]),
    (lambda T, S: 2 * causal(T, S).long(), ["should be a bool mask", "values other than 0 and 1"]),
    (lambda T, S: torch.full((T, S), float("nan")), ["values other than 0 and 1"]),
])
def test_causal_names_the_mistake(buggy, phrases):
    assert_names(check_causal_mask(buggy), *phrases)


def test_causal_stub_and_crash():
    assert_stub_and_crash(check_causal_mask, _boom)


# --- transformers mask to attnlib's -------------------------------------------------------------

def test_hf_accepts_correct_ones():
    assert check_hf_to_mask(lambda m: m.bool()[:, None, None, :]).passed
    assert check_hf_to_mask(lambda m: (m == 1).unsqueeze(1).unsqueeze(2)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda m: (m == 0)[:, None, None, :], ["inverted"]),
    (lambda m: m.bool(), ["without its two broadcast axes", "mask[:, None, None, :]"]),
    (lambda m: m == 0, ["without its two broadcast axes", "(and inverted)"]),
    (lambda m: m.bool()[:, None, :, None], ["query axis"]),
    (lambda m: m.bool()[:, None], ["(B, 1, S)"]),
    (lambda m: m.bool()[:, None, None, :].expand(-1, 1, m.shape[1], -1), ["(B, 1, S, S)", "assumes T = S"]),
    (lambda m: m[:, None, None, :], ["right pattern but dtype torch.int64"]),
    (lambda m: (1.0 - m[:, None, None, :].float()) * -1e9, ["additive float mask"]),
])
def test_hf_names_the_mistake(buggy, phrases):
    assert_names(check_hf_to_mask(buggy), *phrases)


def test_hf_stub_and_crash():
    assert_stub_and_crash(check_hf_to_mask, _boom)


# --- cross-attention mask from source lengths ---------------------------------------------------

def cross(lengths, T, S):
    return (torch.arange(S) < lengths[:, None])[:, None, None, :].expand(len(lengths), 1, T, S)


@pytest.mark.parametrize("mask", [
    cross,
    lambda lengths, T, S: (torch.arange(S) < lengths[:, None])[:, None, None],    # (B, 1, 1, S), broadcasts
    lambda lengths, T, S: torch.stack([torch.arange(S) < n for n in lengths])[:, None, None].repeat(1, 1, T, 1),
    lambda lengths, T, S: (torch.arange(S).expand(len(lengths), T, S) < lengths.view(-1, 1, 1)).unsqueeze(1),
])
def test_cross_accepts_correct_ones(mask):
    assert check_cross_attention_mask(mask).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda lengths, T, S: ~cross(lengths, T, S), ["inverted"]),
    (lambda lengths, T, S: (torch.arange(S) <= lengths[:, None])[:, None, None], ["off-by-one"]),
    (lambda lengths, T, S: cross(lengths, T, S) & torch.ones(T, S, dtype=torch.bool).tril(S - T), ["causal mask added"]),
    (lambda lengths, T, S: cross(lengths, T, S) & torch.ones(T, S, dtype=torch.bool).tril(), ["causal mask added, top-left"]),
    (lambda lengths, T, S: cross(lengths, T, S).half(), ["right pattern but dtype torch.float16"]),
    (lambda lengths, T, S: torch.arange(S) < lengths[:, None], ["without its two broadcast axes"]),
    (lambda lengths, T, S: (torch.arange(T) < lengths[:, None])[:, None, :, None], ["T query positions"]),
    (lambda lengths, T, S: cross(lengths, T, S).transpose(-2, -1), ["(B, 1, S, T)"]),
])
def test_cross_names_the_mistake(buggy, phrases):
    assert_names(check_cross_attention_mask(buggy), *phrases)


def test_cross_stub_and_crash():
    assert_stub_and_crash(check_cross_attention_mask, _boom)


# --- padding and causal combined ----------------------------------------------------------------

def pad_causal(m):
    T = m.shape[1]
    return m.bool()[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("mask", [
    pad_causal,
    lambda m: masks.combine(masks.from_hf(m), masks.causal_mask(m.shape[1])),
    lambda m: (m[:, None, None, :] * torch.ones(m.shape[1], m.shape[1]).tril()).bool(),   # multiply 0/1
    lambda m: torch.logical_and(m.unsqueeze(1).unsqueeze(1) == 1,
                                torch.arange(m.shape[1])[:, None] >= torch.arange(m.shape[1])),
])
def test_padding_causal_accepts_correct_ones(mask):
    assert check_padding_causal_mask(mask).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda m: torch.ones(m.shape[1], m.shape[1], dtype=torch.bool).tril().expand(m.shape[0], 1, -1, -1),
     ["causal mask only"]),
    (lambda m: m.bool()[:, None, None, :].expand(-1, 1, m.shape[1], -1), ["padding mask only"]),
    (lambda m: m.bool()[:, None, None, :] | torch.ones(5, 5, dtype=torch.bool).tril(), ["OR instead of AND"]),
    (lambda m: (m == 0)[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril(), ["padding inverted"]),
    (lambda m: ~pad_causal(m), ["an inverted mask"]),
    (lambda m: m.bool()[:, None, :, None] & torch.ones(5, 5, dtype=torch.bool).tril(), ["query axis"]),
    (lambda m: pad_causal(m) & m.bool()[:, None, :, None], ["padded queries' rows masked too"]),
    (lambda m: pad_causal(m)[:, 0], ["without the head axis"]),
    (lambda m: m.bool()[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril(-1), ["strict causal mask"]),
    (lambda m: pad_causal(m).half(), ["right pattern but dtype torch.float16"]),
])
def test_padding_causal_names_the_mistake(buggy, phrases):
    assert_names(check_padding_causal_mask(buggy), *phrases)


def test_padding_causal_stub_and_crash():
    assert_stub_and_crash(check_padding_causal_mask, _boom)
