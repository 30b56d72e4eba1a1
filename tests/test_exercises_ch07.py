"""Chapter 7's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from attnlib.exercises import check_kv_cache_bytes, check_mean_pool_kv_heads, check_repeat_kv
from exercise_helpers import assert_names, stub


# --- repeat_kv ----------------------------------------------------------------------------------

def test_repeat_kv_accepts_correct_ones():
    assert check_repeat_kv(lambda x, n: x[:, :, None].expand(-1, -1, n, -1, -1).flatten(1, 2)).passed
    assert check_repeat_kv(lambda x, n: x[:, torch.arange(x.shape[1] * n) // n]).passed           # indexing
    assert check_repeat_kv(lambda x, n: torch.stack([x] * n, dim=2).reshape(x.shape[0], -1, *x.shape[2:])).passed

    def hf_style(hidden_states, n_rep):                                   # transformers' repeat_kv
        batch, num_key_value_heads, slen, head_dim = hidden_states.shape
        if n_rep == 1:
            return hidden_states
        hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
        return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
    assert check_repeat_kv(hf_style).passed


@pytest.mark.parametrize("shortcut", [
    lambda x, n: torch.repeat_interleave(x, n, dim=1),
    lambda x, n: x.repeat_interleave(n, dim=1),
    lambda x, n: x.repeat_interleave(torch.full((x.shape[1],), n), dim=1),
])
def test_repeat_kv_says_when_it_uses_the_shortcut_the_exercise_rules_out(shortcut):
    assert_names(check_repeat_kv(shortcut), "gives the right result, but it calls repeat_interleave")


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, n: x.repeat(1, n, 1, 1), ["tiled (h0, h1, h0, h1, ...)", "i // n_rep"]),
    (lambda x, n: x[:, None].expand(-1, n, -1, -1, -1).flatten(1, 2), ["tiled"]),
    (lambda x, n: x.repeat_interleave(n, dim=2), ["along the sequence axis (dim=2)"]),
    (lambda x, n: x.repeat_interleave(n, dim=-1), ["along the head width Dh"]),
    (lambda x, n: x, ["never repeated"]),
    (lambda x, n: x[:, :1].expand(-1, n, -1, -1), ["first kv head only"]),
    (lambda x, n: x[:, :, :, None].expand(-1, -1, -1, n, -1).reshape(x.shape[0], -1, *x.shape[2:]),
     ["expand and reshape in the wrong order"]),
])
def test_repeat_kv_names_the_mistake(buggy, phrases):
    assert_names(check_repeat_kv(buggy), *phrases)


def test_repeat_kv_stub_and_crash():
    assert check_repeat_kv(stub).status == "not attempted yet"

    def crashes(x, n_rep):
        return x.repeat_interleave(n_rep, dim=4)  # the reader's out-of-range axis
    assert_names(check_repeat_kv(crashes), "raised IndexError", "`return x.repeat_interleave(n_rep, dim=4)")
    assert_names(check_repeat_kv(lambda x, n: None), "should be a torch.Tensor", "got None")
    assert_names(check_repeat_kv(42), "expected a function or class, got int")


# --- KV-cache bytes -----------------------------------------------------------------------------

def kv_cache_bytes(config, seq_len, batch_size, bytes_per_element):
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    return per_token * seq_len * batch_size * bytes_per_element


def test_cache_bytes_accepts_correct_ones():
    assert check_kv_cache_bytes(kv_cache_bytes).passed
    assert check_kv_cache_bytes(lambda *a: torch.tensor(float(kv_cache_bytes(*a)))).passed  # a tensor is fine

    def transformers_style(config, seq_len, batch_size, bytes_per_element):   # getattr-like default, one expression
        head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
        return (2 * config["num_hidden_layers"] * batch_size * seq_len * config["num_key_value_heads"]
                * head_dim * bytes_per_element)
    assert check_kv_cache_bytes(transformers_style).passed


def test_cache_bytes_names_a_head_dim_left_unread():
    def from_hidden_size(c, T, B, n):                      # the width of a head always hidden_size / heads
        return kv_cache_bytes({k: v for k, v in c.items() if k != "head_dim"}, T, B, n)
    result = check_kv_cache_bytes(from_hidden_size)
    assert_names(result, "'head_dim': 256", "head_dim ignored", "differs from hidden_size / num_attention_heads")


@pytest.mark.parametrize("buggy, phrases", [
    (lambda c, T, B, n: kv_cache_bytes({**c, "num_key_value_heads": c["num_attention_heads"]}, T, B, n),
     ["num_attention_heads used instead of num_key_value_heads"]),
    (lambda c, T, B, n: kv_cache_bytes(c, T, B, n) // 2, ["a missing factor 2"]),
    (lambda c, T, B, n: kv_cache_bytes(c, T, B, n) // c["num_hidden_layers"], ["the layers forgotten"]),
    (lambda c, T, B, n: kv_cache_bytes(c, T, 1, n), ["the batch forgotten"]),
    (lambda c, T, B, n: kv_cache_bytes(c, T, B, n) * 8, ["bits instead of bytes"]),
    (lambda c, T, B, n: kv_cache_bytes(c, T, B, 1), ["bytes_per_element ignored"]),
    (lambda c, T, B, n: kv_cache_bytes({**c, "head_dim": c["hidden_size"]}, T, B, n), ["hidden_size used as the width"]),
])
def test_cache_bytes_names_the_mistake(buggy, phrases):
    assert_names(check_kv_cache_bytes(buggy), *phrases)


def test_cache_bytes_with_two_mistakes_that_cancel_nowhere_names_none():
    result = check_kv_cache_bytes(lambda c, T, B, n: kv_cache_bytes(c, T, B, n) + 1)
    assert_names(result, "instead of")
    assert "matches" not in result.message


def test_cache_bytes_stub_and_crash():
    assert check_kv_cache_bytes(stub).status == "not attempted yet"
    assert_names(check_kv_cache_bytes(lambda c, T, B, n: c["head_dim"]), "raised KeyError", "'head_dim'")
    assert_names(check_kv_cache_bytes(lambda c, T, B, n: "lots"), "should be a number of bytes, got str")
    assert_names(check_kv_cache_bytes(lambda c, T, B, n: kv_cache_bytes(c, T, B, n) / 7), "not a whole number")


# --- mean-pooled kv heads -----------------------------------------------------------------------

def mean_pool(w, num_heads, num_kv_heads):
    g, Dh = num_heads // num_kv_heads, w.shape[0] // num_heads
    return w.reshape(num_kv_heads, g, Dh, -1).mean(1).reshape(num_kv_heads * Dh, -1)


def test_mean_pool_accepts_correct_ones():
    assert check_mean_pool_kv_heads(mean_pool).passed
    loop = lambda w, H, H_kv: torch.cat([torch.stack(w.chunk(H)[j * (H // H_kv):(j + 1) * (H // H_kv)]).mean(0)  # noqa: E731
                                         for j in range(H_kv)])
    assert check_mean_pool_kv_heads(loop).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda w, H, H_kv: w.reshape(H // H_kv, H_kv, -1, w.shape[1]).mean(0).reshape(-1, w.shape[1]),
     ["strided groups", "CONSECUTIVE"]),
    (lambda w, H, H_kv: mean_pool(w, H, H_kv) * (H // H_kv), ["a sum instead of a mean"]),
    (lambda w, H, H_kv: w.reshape(H_kv, H // H_kv, -1, w.shape[1])[:, 0].reshape(-1, w.shape[1]),
     ["the first head of each group kept"]),
    (lambda w, H, H_kv: w.reshape(w.shape[0] // (H // H_kv), H // H_kv, -1).mean(1), ["rows averaged within a head"]),
    (lambda w, H, H_kv: w.reshape(H, -1, w.shape[1]).mean(0), ["every head pooled into one (MQA)"]),
    (lambda w, H, H_kv: w.mean(1), ["over the columns D"]),
    (lambda w, H, H_kv: w, ["never pooled"]),
])
def test_mean_pool_names_the_mistake(buggy, phrases):
    assert_names(check_mean_pool_kv_heads(buggy), *phrases)


def test_mean_pool_stub_and_crash():
    assert check_mean_pool_kv_heads(stub).status == "not attempted yet"
    assert_names(check_mean_pool_kv_heads(lambda w, H, H_kv: w.view(H_kv, 7, -1)), "raised RuntimeError")
    assert_names(check_mean_pool_kv_heads(lambda w, H, H_kv: w[:8, :4]), "has shape (8, 4), expected (8, 5)")
