"""Issue 28, item by item: correct answers the hooks refused, wrong answers that passed, names that are not
roles, state, and the messages that blamed the wrong thing. Each answer is our own code, in a style the
other drill tests do not use (fairseq's time-first batches, Megatron's per-head key_value, nanoGPT's
lecture heads, d2l's lazy layers and bmm, ...)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib.drill import check_multi_head_attention as check_in_drill
from attnlib.exercises import check_multi_head_attention, check_multi_head_weights


def test_the_drill_is_one_package_and_the_public_names_still_work():
    import attnlib.drill as drill
    import attnlib.exercises as exercises
    assert check_multi_head_attention is check_in_drill
    for name in ("check_causal_multi_head_attention", "check_cross_attention", "check_multi_head_weights"):
        assert getattr(exercises, name) is getattr(drill, name) and name in exercises.__all__
    assert callable(drill.main) and drill.mistakes.MISTAKES  # the command line and the catalogue live there too


class Base(nn.Module):
    """Separate projections; forward is each test's."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def heads(self, t):  # (B, T, D) -> (B, H, T, Dh)
        return t.unflatten(-1, (self.h, -1)).transpose(1, 2)

    def attend(self, q, k, v, mask):  # (B, H, T, Dh) x 3 -> (B, T, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)


def _layer_forward(self, x, mask=None):  # the layers called as self.W_q.forward(x)
    q, k, v = (self.heads(W.forward(x)) for W in (self.W_q, self.W_k, self.W_v))
    return self.W_o.forward(self.attend(q, k, v, mask))


def _weights_by_hand(self, x, mask=None):  # x @ W.T + b, never layer(x)
    q, k, v = (self.heads(x @ W.weight.T + W.bias) for W in (self.W_q, self.W_k, self.W_v))
    return self.attend(q, k, v, mask) @ self.W_o.weight.T + self.W_o.bias


def _concatenated(self, x, mask=None):  # F.linear on the three weights concatenated at run time
    w = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])
    q, k, v = F.linear(x, w, torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])).chunk(3, dim=-1)
    return self.W_o(self.attend(self.heads(q), self.heads(k), self.heads(v), mask))


def _flattened_tokens(self, x, mask=None):  # the projections of x.reshape(B * T, D)
    B, T, D = x.shape
    q, k, v = (self.heads(W(x.reshape(B * T, D)).view(B, T, D)) for W in (self.W_q, self.W_k, self.W_v))
    return self.W_o(self.attend(q, k, v, mask).reshape(B * T, D)).view(B, T, D)


def _time_first(self, x, mask=None):  # fairseq and Megatron: (T, B, D) inside, (B * H, T, Dh) batches
    x = x.transpose(0, 1)
    T, B, D = x.shape
    q, k, v = (W(x).view(T, B * self.h, -1).transpose(0, 1) for W in (self.W_q, self.W_k, self.W_v))
    s = torch.bmm(q * (D // self.h) ** -0.5, k.transpose(1, 2))  # (B * H, T, T)
    if mask is not None:
        s = s.masked_fill(~mask.expand(B, self.h, T, T).reshape(B * self.h, T, T), float("-inf"))
    out = torch.bmm(s.softmax(-1), v).transpose(0, 1).reshape(T, B, D)
    return self.W_o(out).transpose(0, 1)


class LectureHead(nn.Module):  # nanoGPT's lecture: one head, its own key, query and value Linear(D, Dh)
    def __init__(self, n_embd, head_size):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(n_embd, head_size, bias=False) for _ in range(3))

    def forward(self, x, mask):
        w = self.query(x) @ self.key(x).transpose(-2, -1) * self.key.out_features ** -0.5
        return (w if mask is None else w.masked_fill(~mask, float("-inf"))).softmax(-1) @ self.value(x)


class Lecture(nn.Module):
    def __init__(self, n_embd, num_heads):
        super().__init__()
        self.heads = nn.ModuleList(LectureHead(n_embd, n_embd // num_heads) for _ in range(num_heads))
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x, mask=None):
        masks = [None if mask is None else mask[:, min(i, mask.shape[1] - 1)] if mask.dim() == 4 else mask
                 for i in range(len(self.heads))]  # (B, 1 or H, T, T): each head its own
        return self.proj(torch.cat([h(x, m) for h, m in zip(self.heads, masks)], dim=-1))


class KeyValue(nn.Module):  # a query layer and one (D, 2D) key_value layer, laid out per head as Megatron's
    def __init__(self, hidden_size, num_attention_heads, per_head=False):
        super().__init__()
        self.h, self.per_head = num_attention_heads, per_head
        self.query, self.key_value = nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, 2 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, x, attention_mask=None):
        B, T, D = x.shape
        kv = self.key_value(x)
        if self.per_head:
            k, v = kv.view(B, T, self.h, 2, D // self.h).permute(3, 0, 2, 1, 4)  # each head's [k | v]
        else:
            k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in kv.chunk(2, dim=-1))
        q = self.query(x).view(B, T, self.h, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.dense(out.transpose(1, 2).reshape(B, T, D))


class Lazy(nn.Module):  # d2l: nn.LazyLinear, whose weights exist only after the first call
    def __init__(self, num_hiddens, num_heads):
        super().__init__()
        self.h = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.LazyLinear(num_hiddens, bias=False) for _ in range(4))

    def forward(self, x, mask=None):
        q, k, v = (W(x).unflatten(-1, (self.h, -1)).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        return self.W_o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2))


class HeadsFirst(Base):  # (n_heads, emb_dim), and a constructor whose names no list holds: (heads, width)
    def __init__(self, n_heads, emb_dim):
        super().__init__(emb_dim, n_heads)

    forward = _layer_forward


class Unnamed(Base):
    def __init__(self, heads, width):
        assert width % heads == 0, "width must be divisible by heads"
        super().__init__(width, heads)

    forward = _layer_forward


CORRECT = {"W_q.forward(x)": type("LayerForward", (Base,), {"forward": _layer_forward}),
           "x @ W.weight.T + b": type("ByHand", (Base,), {"forward": _weights_by_hand}),
           "F.linear on weights concatenated at run time": type("Concatenated", (Base,), {"forward": _concatenated}),
           "projections of x.reshape(B * T, D)": type("Flattened", (Base,), {"forward": _flattened_tokens}),
           "x transposed to (T, B, D) inside": type("TimeFirst", (Base,), {"forward": _time_first}),
           "nanoGPT lecture: a Linear(D, Dh) per head and role": Lecture,
           "query + key_value (D, 2D)": KeyValue,
           "query + key_value laid out per head": lambda d, h: KeyValue(d, h, per_head=True),
           "d2l's nn.LazyLinear": Lazy,
           "(n_heads, emb_dim)": HeadsFirst}


@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_answers_the_hooks_refused_pass(name):
    result = check_multi_head_attention(CORRECT[name])
    assert result.passed, result.message


def test_a_constructor_that_takes_heads_first_under_other_names_is_built_that_way_and_told_so():
    result = check_multi_head_attention(Unnamed)
    assert result.passed, result.message
    assert "built as Unnamed(3, 12), since its parameters take (num_heads, d_model)" in result.message


def _swap(first, second):
    def forward(self, x, mask=None):
        layers = {"q": self.W_q, "k": self.W_k, "v": self.W_v}
        layers[first], layers[second] = layers[second], layers[first]
        q, k, v = (self.heads(layers[r](x)) for r in "qkv")
        return self.W_o(self.attend(q, k, v, mask))
    return type("Swapped", (Base,), {"forward": forward})


def _k_q_transposed(self, x, mask=None):
    q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    s = k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])  # K Qᵀ: in self-attention, Q Kᵀ with the roles swapped
    s = s if mask is None else s.masked_fill(~mask, float("-inf"))
    return self.W_o((s.softmax(-1) @ v).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("candidate, note", [
    (_swap("k", "v"), "`W_v` acts as the keys, `W_k` acts as the values"),
    (_swap("q", "v"), "`W_v` acts as the queries, `W_q` acts as the values"),
    (type("KQ", (Base,), {"forward": _k_q_transposed}), "(your scores are K Qᵀ: in self-attention that is Q Kᵀ")])
def test_names_are_not_roles_the_verdict_follows_what_the_module_computes(candidate, note):
    result = check_multi_head_attention(candidate)
    assert result.passed and note in result.message and "an interviewer reads names" in result.message, result.message


def _cached(self, x, mask=None):  # keeps k and v from its first call
    if not hasattr(self, "kv"):
        self.kv = (self.heads(self.W_k(x)), self.heads(self.W_v(x)))
    return self.W_o(self.attend(self.heads(self.W_q(x)), *self.kv, mask))


def _growing(self, x, mask=None):  # a cache that grows on every call
    k, v = self.heads(self.W_k(x)), self.heads(self.W_v(x))
    if hasattr(self, "k_cache"):
        k, v = torch.cat([self.k_cache, k], 2), torch.cat([self.v_cache, v], 2)
    self.k_cache, self.v_cache = k.detach(), v.detach()
    return self.W_o(self.attend(self.heads(self.W_q(x)), k, v, mask))


def _no_grad_scores(self, x, mask=None):
    v = self.heads(self.W_v(x))
    with torch.no_grad():
        w = (self.heads(self.W_q(x)) @ self.heads(self.W_k(x)).transpose(-2, -1) / 2).masked_fill(
            torch.zeros((), dtype=torch.bool) if mask is None else ~mask, float("-inf")).softmax(-1)
    return self.W_o((w @ v).transpose(1, 2).flatten(2))


def _grad_off(self, x, mask=None):
    torch.set_grad_enabled(False)
    return _layer_forward(self, x, mask)


def _head0_mask(self, x, mask=None):
    return _layer_forward(self, x, None if mask is None else mask[:, :1] if mask.dim() == 4 else mask)


def _recreated(self, x, mask=None):
    self.W_o = nn.Linear(x.shape[-1], x.shape[-1])  # "built here to save memory"
    return _layer_forward(self, x, mask)


WRONG = {  # (forward, words): each passed, or was blamed on something else, before issue 28
    "k and v kept from the first call": (_cached, ["depends on its earlier calls", "a second, different x",
                                                   "keeps state between calls in `self.kv`"]),
    "a cache that grows across calls (was blamed on the mask)": (_growing, ["keeps state between calls in",
                                                                            "`self.k_cache` (2, 3, 10, 4)"]),
    "the scores under torch.no_grad()": (_no_grad_scores, ["the output is right, but `W_q`, `W_k` get no gradient"]),
    "autograd switched off and left off": (_grad_off, ["forward(x) switched autograd off", "switched it back"]),
    "head 0's mask for every head": (_head0_mask, ["with a per-head mask (B, H, T, T) is wrong",
                                                   "head 0's mask used for every head"]),
    "a layer re-created in forward (was 'dropout still on?')": (_recreated, [
        "forward creates a new layer on every call", "self.W_o = nn.Linear(x.shape[-1], x.shape[-1])"]),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_that_passed_or_were_misnamed_are_named(name):
    forward, words = WRONG[name]
    result = check_multi_head_attention(type("Wrong", (Base,), {"forward": forward}))
    assert not result.passed, result.message
    for w in words:
        assert w in result.message, (w, result.message)
    assert "dropout" not in result.message and torch.is_grad_enabled()


def test_one_heads_weights_are_not_called_an_average():
    def forward(self, x, mask=None):
        q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        w = (q @ k.transpose(-2, -1) / 2).masked_fill(torch.zeros((), dtype=torch.bool) if mask is None else ~mask,
                                                     float("-inf")).softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).flatten(2)), w[:, 1]  # head 1 only
    result = check_multi_head_weights(type("OneHead", (Base,), {"forward": forward}))
    assert "the attention weights of head 1 only" in result.message and "averaged" not in result.message, result.message


def test_a_mistake_nothing_in_the_catalogue_reproduces_gets_what_differs():
    """No 'matches none of the known mistakes': which heads, by how much, and the weights' row sums."""
    def forward(self, x, mask=None):
        q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        w = torch.exp(q @ k.transpose(-2, -1) / 2)
        w = torch.cat([w[:, :1] / w[:, :1].sum(-2, keepdim=True), w[:, 1:] / w[:, 1:].sum(-1, keepdim=True)], 1)
        return self.W_o((w @ v).transpose(1, 2).flatten(2))  # head 0 normalised over the queries by hand
    result = check_multi_head_attention(type("HandMade", (Base,), {"forward": forward}))
    assert not result.passed and "none of the" not in result.message, result.message
    for words in ("forward(x) is wrong", "should sum to 1, and yours sum to", "heads 1 and 2 are right, head 0 is not",
                  "max abs difference"):
        assert words in result.message, (words, result.message)


class FusedKV(nn.Module):  # query and a fused key_value, in the style of lucidrains' to_q / to_kv
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.to_q, self.to_kv, self.to_out = (nn.Linear(d_model, d_model), nn.Linear(d_model, 2 * d_model),
                                              nn.Linear(d_model, d_model))

    def forward(self, x, mask=None):
        q = self.to_q(x)
        k, v = self.to_kv(x).chunk(2, dim=-1)
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in (q, k, v))
        return self.to_out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2))


def _queries_from_kv(self, x, mask=None):
    k, v = self.to_kv(x).chunk(2, dim=-1)  # to_q forgotten: the keys' rows serve as the queries too
    q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in (k, k, v))
    return self.to_out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("forward, words", [
    (lambda self, x, mask=None: 2 * FusedKV.forward(self, x, mask), ["it is the reference's output times 2"]),
    (lambda self, x, mask=None: FusedKV.forward(self, x, mask) + x.mean(1, keepdim=True),
     ["the difference is the same at every position"]),
    (_queries_from_kv, ["`to_q` is never used", "the queries and the keys with the same rows of `to_kv`"])])
def test_what_differs_is_said_in_new_styles(forward, words):
    result = check_multi_head_attention(type("FusedKV", (FusedKV,), {"forward": forward}))
    assert not result.passed and all(w in result.message for w in words), result.message


def test_weights_that_are_the_head_average_repeated_are_named():
    def forward(self, x, mask=None):
        q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        w = (q @ k.transpose(-2, -1) / 2).masked_fill(torch.zeros((), dtype=torch.bool) if mask is None else ~mask,
                                                     float("-inf")).softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).flatten(2)), w.mean(1, keepdim=True).expand_as(w)
    result = check_multi_head_weights(type("Averaged", (Base,), {"forward": forward}))
    assert "the average over the heads, repeated for every head" in result.message, result.message


def _mutating(self, x, mask=None):
    with torch.no_grad():
        self.W_o.weight.mul_(1.01)  # "a little learning" in forward
    return _layer_forward(self, x, mask)


def _numpy_noise(self, x, mask=None):
    import numpy as np
    return _layer_forward(self, x, mask) + torch.from_numpy(np.random.randn(*x.shape).astype("float32")) * 1e-3


@pytest.mark.parametrize("forward, words", [
    (_mutating, ["forward changes `W_o.weight` in place on every call"]),
    (_numpy_noise, ["with no dropout and no random draw of torch's", "numpy's or Python's random numbers"]),
    (lambda self, x, mask=None: _layer_forward(self, x, mask) * float("inf"),
     ["returns inf, with no mask at all (first at sequence 0, position 0, feature 0)"]),
    (lambda self, x, mask=None: x + 0 * self.W_o.weight.sum(), ["the output does not depend on any of your layers"])])
def test_hostile_forwards_get_the_cause_not_a_wrong_blame(forward, words):
    result = check_multi_head_attention(type("Hostile", (Base,), {"forward": forward}))
    assert not result.passed and all(w in result.message for w in words), result.message


def test_a_time_first_output_reshaped_instead_of_transposed_is_told_its_rows_moved():
    def forward(self, x, mask=None):
        B, T, D = x.shape
        out = _time_first(self, x, mask).transpose(0, 1)  # back to (T, B, D) ...
        return out.reshape(B, T, D)                       # ... and reshaped where a transpose belongs
    result = check_multi_head_attention(type("TimeFirstReshaped", (Base,), {"forward": forward}))
    assert "its (sequence, position) rows are the expected ones in other places" in result.message, result.message
    assert "(0, 1) holds (1, 0)" in result.message and "a reshape where a transpose belongs?" in result.message
