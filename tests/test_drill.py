"""The interview drill's checkers (chapter 10): correct answers pass, each classic mistake is named.

Every buggy candidate is the correct `Separate` class with one step (or two) changed, so that each
test shows exactly which mistake the checker must find.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib.exercises import (check_causal_multi_head_attention, check_cross_attention,
                               check_multi_head_attention, check_multi_head_weights)
from attnlib.drill.mistakes import MISTAKES, describe


class Separate(nn.Module):
    """A correct answer with separate projections, each step a method that a bug can replace."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, t):  # (B, T, D) -> (B, H, T, Dh)
        B, T, _ = t.shape
        return t.view(B, T, self.h, self.d_k).transpose(1, 2)

    def merge(self, o):  # (B, H, T, Dh) -> (B, T, D)
        B, _, T, _ = o.shape
        return o.transpose(1, 2).reshape(B, T, self.h * self.d_k)

    def scores(self, q, k):  # (B, H, T, Dh), (B, H, S, Dh) -> (B, H, T, S)
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_k)

    def masked(self, s, mask):
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def probs(self, s):
        return torch.softmax(s, dim=-1)

    def output(self, o):
        return self.W_o(o)

    def forward(self, x, mask=None):
        q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        return self.output(self.merge(self.probs(self.masked(self.scores(q, k), mask)) @ v))


class Fused(nn.Module):
    """A correct answer with one fused projection [q | k | v] and PyTorch's SDPA."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_qkv, self.W_o = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = self.W_qkv(x).view(B, T, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
        return self.W_o(out.transpose(1, 2).reshape(B, T, D))


class Einsum(Separate):
    """A correct answer with einsum: no transposes, -1e9 fill, returns (out, weights)."""

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k) for W in (self.W_q, self.W_k, self.W_v))  # (B, T, H, Dh)
        s = torch.einsum("bthd,bshd->bhts", q, k) / self.d_k ** 0.5  # (B, H, T, S)
        if mask is not None:
            s = s.masked_fill(mask == 0, -1e9)
        w = s.softmax(dim=-1)
        return self.W_o(torch.einsum("bhts,bshd->bthd", w, v).reshape(B, T, D)), w


def assert_fails_naming(result, words):
    """The check failed after an attempt, and its message contains every one of `words`."""
    assert not result.passed and result.attempted, result.message
    for word in words:
        assert word in result.message, (word, result.message)


def bug(base=Separate, **methods):
    """`base` with some methods replaced: one class per mistake."""
    return type(f"Buggy{base.__name__}", (base,), methods)


def _unscaled(self, q, k):
    return q @ k.transpose(-2, -1)


def _inverted(self, s, mask):
    return s if mask is None else s.masked_fill(mask, float("-inf"))


def _no_transpose_split(self, t):
    B, T, _ = t.shape
    return t.view(B, self.h, T, self.d_k)


def _no_transpose_merge(self, o):
    B, _, T, _ = o.shape
    return o.reshape(B, T, -1)


def _view_after_transpose(self, o):
    B, _, T, _ = o.shape
    return o.transpose(1, 2).view(B, T, -1)


def _after_softmax_forward(self, x, mask=None):
    q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    w = torch.softmax(self.scores(q, k), dim=-1)
    return self.W_o(self.merge((w if mask is None else w * mask) @ v))


def _float_mask(self, x, mask=None):  # SDPA adds a float attn_mask to the scores
    return Fused.forward(self, x, None if mask is None else mask.float())


def _per_head_fused(self, x, mask=None):
    B, T, D = x.shape
    q, k, v = self.W_qkv(x).view(B, T, self.h, 3, self.d_k).permute(3, 0, 2, 1, 4)  # 3 x (B, H, T, Dh)
    return self.W_o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, D))


def _scaled_v(self, x, mask=None):
    q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    s = self.masked(q @ k.transpose(-2, -1), mask)
    return self.W_o(self.merge(torch.softmax(s, -1) @ (v / math.sqrt(self.d_k))))


def _v_from_w_k(self, x, mask=None):
    q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_k))  # a line copied, not edited
    return self.W_o(self.merge(self.probs(self.masked(self.scores(q, k), mask)) @ v))


def _renamed_no_out(self, x, mask=None):
    q, k, v = (self.split(W(x)) for W in (self.q_proj, self.k_proj, self.v_proj))
    return self.merge(self.probs(self.masked(self.scores(q, k), mask)) @ v)


class Renamed(Separate):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = self.W_q, self.W_k, self.W_v, self.W_o
        del self.W_q, self.W_k, self.W_v, self.W_o

    def forward(self, x, mask=None):
        q, k, v = (self.split(W(x)) for W in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(self.merge(self.probs(self.masked(self.scores(q, k), mask)) @ v))


class NoWo(Separate):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        del self.W_o

    output = lambda self, o: o  # noqa: E731


# (candidate, words the message must contain): each a classic mistake, or two at once
BUGGY = {
    "no scale": (bug(scores=_unscaled), ["a known mistake", "no scale"]),
    "scale sqrt(d_model)": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / math.sqrt(self.h * self.d_k)),
                            ["divided by sqrt(d_model) = sqrt(12) instead of sqrt(d_k)"]),
    "scale d_model": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / (self.h * self.d_k)),
                      ["divided by d_model = 12 instead of sqrt(d_k)"]),
    "scale d_k": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / self.d_k), ["divided by d_k = 4"]),
    "scale multiplied": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) * math.sqrt(self.d_k)),
                         ["multiplied by sqrt(d_k) instead of divided by it"]),
    "softmax over queries": (bug(probs=lambda self, s: torch.softmax(s, dim=-2)), ["over the queries (dim=-2"]),
    "softmax over heads": (bug(probs=lambda self, s: torch.softmax(s, dim=1)), ["over the heads (dim=1)"]),
    "split without transpose": (bug(split=_no_transpose_split), ["heads split without the transpose"]),
    "merge without transpose": (bug(merge=_no_transpose_merge), ["heads merged without the transpose"]),
    "inverted mask": (bug(masked=_inverted), ["is right, but", "an inverted mask"]),
    "mask ignored": (bug(masked=lambda self, s, mask: s), ["the mask is ignored"]),
    "mask filled with 0": (bug(masked=lambda self, s, m: s if m is None else s.masked_fill(~m, 0.0)),
                           ["masked scores set to 0 instead of -inf"]),
    "a 0/1 float mask to SDPA": (bug(Fused, forward=_float_mask), ["the bool mask added to the scores as numbers"]),
    "mask after softmax": (bug(forward=_after_softmax_forward), ["the mask applied after the softmax"]),
    "W_o unused": (bug(output=lambda self, o: o), ["no output projection: your `W_o` is never applied"]),
    "no W_o": (NoWo, ["no output projection: `W_q`, `W_k`, `W_v` take x"]),
    "heads not merged": (bug(merge=lambda self, o: o, output=lambda self, o: o),
                         ["shape (2, 3, 5, 4) = (B, H, T, Dh)", "never merged back", "expected (B, T, D) = (2, 5, 12)"]),
    "view after transpose": (bug(merge=_view_after_transpose),
                             ["raised RuntimeError", "at line", "return o.transpose(1, 2).view(B, T, -1)",
                              "use .reshape"]),
    "W_o unused, named out_proj": (bug(Renamed, forward=_renamed_no_out), ["your `out_proj` is never applied"]),
    "dropout left on": (bug(probs=lambda self, s: F.dropout(torch.softmax(s, -1), 0.5)),
                        ["two different outputs", "eval() mode", "dropout"]),
    "no scale + inverted mask": (bug(scores=_unscaled, masked=_inverted),
                                 ["two mistakes at once", "no scale", "an inverted mask"]),
    "split and merge without transpose": (bug(split=_no_transpose_split, merge=_no_transpose_merge),
                                          ["two mistakes at once", "split without", "merged without"]),
    # the classic mistakes of issue 28, each named
    "scale after the softmax": (bug(probs=lambda self, s: torch.softmax(s * math.sqrt(self.d_k), -1) / math.sqrt(self.d_k)),
                                ["the scale applied after the softmax"]),
    "scale on v": (bug(forward=lambda self, x, mask=None: _scaled_v(self, x, mask)), ["the scale applied after the softmax",
                                                                                    "or to v"]),
    "sqrt(H)": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / math.sqrt(self.h)),
                ["divided by sqrt(num_heads) = sqrt(3)"]),
    "a hard-coded /8": (bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / 8), ["a hard-coded scale", "d_k = 64"]),
    "nn.Softmax() without dim on a 3-D bmm": (bug(probs=lambda self, s: nn.Softmax()(s.flatten(0, 1)).view_as(s)),
                                              ["the batch·heads axis", "nn.Softmax() or F.softmax(s) without dim"]),
    "view(B, T, Dh, H)": (bug(split=lambda self, t: t.view(*t.shape[:2], self.d_k, self.h).permute(0, 3, 1, 2)),
                          ["heads split as view(B, T, Dh, H)"]),
    "heads merged in the wrong order": (bug(merge=lambda self, o: o.permute(0, 2, 3, 1).reshape(o.shape[0], o.shape[2], -1)),
                                        ["heads merged in the wrong order"]),
    "a residual inside": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask) + x),
                          ["a residual inside the module"]),
    "a (T, T) mask skipped": (bug(masked=lambda self, s, m: s if m is None or m.dim() == 2 else s.masked_fill(~m, -math.inf)),
                              ["with mask (B, 1, T, T) is right", "a (T, T) mask is ignored"]),
    "softmax twice": (bug(probs=lambda self, s: torch.softmax(torch.softmax(s, -1), -1)), ["softmax applied twice"]),
    "always causal": (bug(masked=lambda self, s, m: s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(),
                                                                  -math.inf) if m is None else Separate.masked(self, s, m)),
                      ["a causal mask on every call"]),
    "a layer reused for two roles": (bug(forward=lambda self, x, mask=None: _v_from_w_k(self, x, mask)),
                                     ["`W_v` is never used", "the keys and the values with the same rows of `W_k`"]),
    "head 0's mask for every head": (bug(masked=lambda self, s, m: Separate.masked(self, s, None if m is None else m[:, :1]
                                                                                   if m.dim() == 4 else m)),
                                     ["head 0's mask used for every head"]),
    "the weights transposed": (bug(probs=lambda self, s: torch.softmax(s, -1).transpose(-2, -1)),
                               ["the attention weights transposed before they meet v"]),
    "the mask transposed": (bug(masked=lambda self, s, m: Separate.masked(self, s, None if m is None else m.transpose(-2, -1))),
                            ["the mask transposed"]),
    "num_heads ignored": (bug(split=lambda self, t: t.unsqueeze(1), merge=lambda self, o: o.squeeze(1),
                              scores=lambda self, q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])),
                          ["num_heads ignored: one head of width d_model = 12"]),
    "softmax over the whole matrix": (bug(probs=lambda self, s: s.flatten(-2).softmax(-1).view_as(s)),
                                      ["over all T × S scores of a head at once"]),
    "sqrt(d_model) + softmax over queries": (
        bug(scores=lambda self, q, k: q @ k.transpose(-2, -1) / math.sqrt(self.h * self.d_k),
            probs=lambda self, s: torch.softmax(s, dim=-2)),
        ["two mistakes at once", "sqrt(d_model)", "over the queries"]),
}


@pytest.mark.parametrize("name", list(BUGGY))
def test_buggy_candidate_fails_and_the_mistake_is_named(name):
    candidate, words = BUGGY[name]
    assert_fails_naming(check_multi_head_attention(candidate), words)


@pytest.mark.parametrize("candidate", [Separate, Fused, Einsum, Renamed, bug(Fused, forward=_per_head_fused),
                                       bug(scores=lambda self, q, k: k @ q.transpose(-2, -1) / math.sqrt(self.d_k))],
                         ids=["separate", "fused", "einsum", "renamed", "fused per head", "scores K Qᵀ"])
def test_correct_answers_pass(candidate):
    result = check_multi_head_attention(candidate)
    assert result.passed, result.message


def test_the_catalog_covers_every_known_mistake_in_the_drill():
    """Each mistake the drill can show (not the exercises' causal and cross ones) is named by a candidate above."""
    assert len(BUGGY) >= 30
    for mistake in (m for m in MISTAKES if m.needs not in ("causal", "cross") and m.value != "cross"):
        text = describe((mistake,), 12, 3)
        assert any(word in text for _, words in BUGGY.values() for word in words), text
    for mistake in (m for m in MISTAKES if m.needs in ("causal", "cross") or m.value == "cross"):
        text = describe((mistake,), 12, 3)
        assert any(word in text for _, _, words in EXERCISES.values() for word in words), text


def test_a_nan_from_a_wrong_axis_is_still_named():
    """softmax over the queries with a -1e9 fill: fully masked columns become uniform, not NaN or 0."""
    result = check_multi_head_attention(bug(Einsum, forward=_einsum_axis))
    assert not result.passed and "over the queries (dim=-2" in result.message, result.message


def _einsum_axis(self, x, mask):
    B, T, D = x.shape
    q, k, v = (W(x).view(B, T, self.h, self.d_k) for W in (self.W_q, self.W_k, self.W_v))  # (B, T, H, Dh)
    s = torch.einsum("bthd,bshd->bhts", q, k) / self.d_k ** 0.5
    s = s if mask is None else s.masked_fill(mask == 0, -1e9)
    return self.W_o(torch.einsum("bhts,bshd->bthd", s.softmax(dim=-2), v).reshape(B, T, D))


# (candidate, words the message must contain): whatever the candidate does, the checker returns a result
class NoForward(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))


def forward(self, x, mask=None):  # dedented by mistake: not a method of NoForward
    return x


class NoSuper(nn.Module):
    def __init__(self, d_model, num_heads):
        self.W_q = nn.Linear(d_model, d_model)


class Params(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Parameter(torch.randn(d_model, d_model)) for _ in range(4))

    def forward(self, x, mask=None):
        return x


class MHAInside(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, x, mask=None):
        return self.attn(x, x, x, need_weights=False)[0]


class Narrow(Separate):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.W_q = nn.Linear(d_model, d_model // num_heads)


def _add_head_axis(self, x, mask=None):  # expects (B, T, T) and adds the head axis itself
    return Separate.forward(self, x, None if mask is None else mask.unsqueeze(1))


def _in_place(self, x, mask=None):
    x += 1
    return Separate.forward(self, x - 1, mask)


def _bad_init(self, d_model, num_heads):
    nn.Module.__init__(self)
    raise ValueError("d_model must be a power of two")


ODD = {
    "an int": (42, ["expected a function or class, got int"]),
    "None": (None, ["got NoneType"]),
    "an instance": (Separate(12, 3), ["pass the class itself, not an instance"]),
    "a function returning an int": (lambda d, h: 3, ["gave a int", "the drill asks for an nn.Module class"]),
    "a constructor that raises": (bug(__init__=_bad_init), ["BuggySeparate(d_model=12, num_heads=3) raised ValueError: d_model must be",
                                                            "at line", "raise ValueError"]),
    "no super().__init__()": (NoSuper, ["raised AttributeError", "call super().__init__() first"]),
    "no forward (dedented)": (NoForward, ["NoForward has no forward method", "indented"]),
    "raw parameters": (Params, ["found no nn.Linear layer, only the parameters W_q (12, 12)",
                                "The drill's contract: the projections are nn.Linear layers"]),
    "W_q too narrow": (Narrow, ["forward(x) raised RuntimeError", "W_q = Linear(12 → 4), W_k = Linear(12 → 12)",
                                "q, k, v and the output projection need 3 × 12 + 12 = 48"]),
    "returns None": (bug(forward=lambda self, x, mask=None: None), ["forward(x) returned None", "`return`"]),
    "returns three things": (bug(forward=lambda self, x, mask=None: (x, x, x)),
                             ["tuple of 3 items ((2, 5, 12), (2, 5, 12), (2, 5, 12)), 3 of them of shape (B, T, D)"]),
    "returns a string": (bug(forward=lambda self, x, mask=None: "out"), ["should be a torch.Tensor", "got a str"]),
    "returns float64": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask).double()),
                        ["dtype torch.float64", "torch.float32"]),
    "returns integers": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask).long()),
                         ["dtype torch.int64"]),
    "returns a detached tensor": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask).detach()),
                                  ["cut off from autograd"]),
    "returns (T, B, D)": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask).transpose(0, 1)),
                          ["(T, B, D): batch and time are swapped"]),
    "changes x in place": (bug(forward=_in_place), ["changed x in place"]),
    "no mask argument": (bug(forward=lambda self, x: Separate.forward(self, x)),
                         ["unexpected keyword argument 'mask'", "forward(self, x, mask=None)"]),
    "a (B, T, T) mask expected": (bug(forward=_add_head_axis), ["Given the same mask as (B, T, T), your forward is "
                                                                "right", "do not add a head axis"]),
    "NaN everywhere": (bug(forward=lambda self, x, mask=None: Separate.forward(self, x, mask) * float("nan")),
                       ["forward(x) returns NaN, with no mask at all (first at sequence 0, position 0, feature 0)"]),
    "nn.MultiheadAttention inside": (MHAInside, ["holds an nn.MultiheadAttention", "write multi-head attention "
                                                 "yourself", "True = ignore"]),
}


@pytest.mark.parametrize("name", list(ODD))
def test_the_checker_never_raises_and_says_what_is_wrong(name):
    candidate, words = ODD[name]
    assert_fails_naming(check_multi_head_attention(candidate), words)


@pytest.mark.parametrize("where", ["__init__", "forward"])
def test_a_stub_is_not_attempted_yet(where):
    def stub(self, *args, **kwargs):
        if where == "__init__":
            nn.Module.__init__(self)
        raise NotImplementedError
    result = check_multi_head_attention(bug(**{where: stub}))
    assert not result.passed and not result.attempted and "not attempted yet" in result.message


def test_the_checker_is_reproducible_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.randn(3)
    torch.manual_seed(123)
    first = check_multi_head_attention(BUGGY["no scale + inverted mask"][0])
    assert torch.equal(torch.randn(3), before)
    assert check_multi_head_attention(BUGGY["no scale + inverted mask"][0]).message == first.message


# The exercises that extend the drill: is_causal, cross-attention, per-head weights.
class Causal(Separate):
    def causal(self, T):  # (T, T), True = may attend: key j <= query i
        return torch.ones(T, T, dtype=torch.bool).tril()

    def forward(self, x, mask=None, is_causal=False):
        if is_causal:
            mask = self.causal(x.shape[1]) if mask is None else mask & self.causal(x.shape[1])
        return Separate.forward(self, x, mask)


class Cross(Separate):
    def forward(self, x, context=None, mask=None):
        c = x if context is None else context
        q, k, v = self.split(self.W_q(x)), self.split(self.W_k(c)), self.split(self.W_v(c))  # (B, H, T|S, Dh)
        return self.W_o(self.merge(self.probs(self.masked(self.scores(q, k), mask)) @ v))


class Weights(Separate):
    def forward(self, x, mask=None):
        q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        w = self.probs(self.masked(self.scores(q, k), mask))  # (B, H, T, T)
        return self.W_o(self.merge(w @ v)), w


def _causal_too(self, s, mask):  # a causal (T, S) mask on every call, cross-attention included
    causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return Separate.masked(self, s, causal if mask is None else mask & causal)


def _cross_causal(self, x, context=None, mask=None):  # causal only when there is a context
    if context is not None:
        causal = torch.ones(x.shape[1], context.shape[1], dtype=torch.bool).tril()
        mask = causal if mask is None else mask & causal
    return Cross.forward(self, x, context, mask)


def _scores_not_weights(self, x, mask=None):
    q, k, v = (self.split(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    s = self.masked(self.scores(q, k), mask)  # (B, H, T, T): the scores, before the softmax
    return self.W_o(self.merge(self.probs(s) @ v)), s


EXERCISES = {
    "causal inverted": (check_causal_multi_head_attention,
                        bug(Causal, causal=lambda self, T: torch.ones(T, T, dtype=torch.bool).triu(1)),
                        ["an inverted causal mask"]),
    "causal hides the diagonal": (check_causal_multi_head_attention,
                                  bug(Causal, causal=lambda self, T: torch.ones(T, T, dtype=torch.bool).tril(-1)),
                                  ["hides the diagonal"]),
    "is_causal ignored": (check_causal_multi_head_attention,
                          bug(Causal, forward=lambda self, x, mask=None, is_causal=False: Separate.forward(self, x, mask)),
                          ["forward(x, mask=mask) with a causal mask (T, T) is right", "is_causal=True is ignored"]),
    "is_causal drops the mask": (check_causal_multi_head_attention,
                                 bug(Causal, forward=lambda self, x, mask=None, is_causal=False: Separate.forward(
                                     self, x, self.causal(x.shape[1]) if is_causal else mask)),
                                 ["the mask is dropped"]),
    "is_causal missing": (check_causal_multi_head_attention, Separate,
                          ["unexpected keyword argument 'is_causal'", "forward(self, x, mask=None, is_causal=False)"]),
    "keys from x": (check_cross_attention,
                    bug(Cross, forward=lambda self, x, context=None, mask=None: Separate.forward(self, x, mask)),
                    ["projected from x instead of from context"]),
    "queries from context": (check_cross_attention,
                             bug(Cross, forward=lambda self, x, context=None, mask=None: Cross.forward(
                                 self, x if context is None else context, x, None)),
                             ["(B, S, D): one output per key"]),
    "weights missing": (check_multi_head_weights, Separate, ["returned only out", "(2, 3, 5, 5)"]),
    "weights averaged": (check_multi_head_weights,
                         bug(Weights, forward=lambda self, x, mask=None: (Weights.forward(self, x, mask)[0],
                                                                         Weights.forward(self, x, mask)[1].mean(1))),
                         ["averaged over the heads"]),
    "one head's weights": (check_multi_head_weights,
                           bug(Weights, forward=lambda self, x, mask=None: (Weights.forward(self, x, mask)[0],
                                                                           Weights.forward(self, x, mask)[1][:, 0])),
                           ["the attention weights of head 0 only"]),
    "weights transposed": (check_multi_head_weights,
                           bug(Weights, forward=lambda self, x, mask=None: (Weights.forward(self, x, mask)[0],
                                                                           Weights.forward(self, x, mask)[1].mT)),
                           ["the attention weights transposed, (B, H, S, T)"]),
    "triu as the allowed part": (check_causal_multi_head_attention,
                                 bug(Causal, causal=lambda self, T: torch.ones(T, T, dtype=torch.bool).triu()),
                                 ["torch.triu as the allowed part"]),
    "mask | causal": (check_causal_multi_head_attention,
                      bug(Causal, forward=lambda self, x, mask=None, is_causal=False: Separate.forward(
                          self, x, mask | self.causal(x.shape[1]) if is_causal and mask is not None else
                          self.causal(x.shape[1]) if is_causal else mask)),
                      ["mask | causal"]),
    "a causal mask on every call": (check_cross_attention, bug(Cross, masked=_causal_too),
                                    ["a causal mask on every call", "in cross-attention a query may see every"]),
    "a causal mask in cross-attention": (check_cross_attention, bug(Cross, forward=_cross_causal),
                                         ["a causal mask in cross-attention: each query may see every position"]),
    "scores, not weights": (check_multi_head_weights, bug(Weights, forward=_scores_not_weights),
                            ["not the probabilities applied to v", "rows do not sum to 1"]),
}


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_exercises_checkers_name_their_mistakes(name):
    check, candidate, words = EXERCISES[name]
    assert_fails_naming(check(candidate), words)


@pytest.mark.parametrize("check, candidate", [(check_causal_multi_head_attention, Causal),
                                              (check_cross_attention, Cross),
                                              (check_multi_head_weights, Weights),
                                              (check_multi_head_weights, Einsum)])
def test_the_exercises_correct_answers_pass(check, candidate):
    result = check(candidate)
    assert result.passed, result.message
