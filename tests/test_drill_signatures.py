"""The drill's constructors, functions and the source post's class; mistakes named in the reader's own names.

The public-style answers come from test_drill_styles; each buggy class there changes one step (or two).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib.exercises import check_multi_head_attention
from test_drill_styles import AnnotatedTransformer, EinsumDict, HFStyle, LinearNames, NanoGPT


class ScaledDotProductAttention(nn.Module):
    """The first source post's helper: nn.Softmax(dim=2) over scores (B, H, T, S); its mask True = hide."""

    def __init__(self, d_k):
        super().__init__()
        self.d_k = d_k
        self.softmax = nn.Softmax(dim=2)

    def forward(self, Q, K, V, mask=None):
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)
        attn = self.softmax(scores)
        return torch.matmul(attn, V), attn


class SourcePost(nn.Module):
    """The first source post's class: it passes scale= to ScaledDotProductAttention, which takes d_k."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_k, self.num_heads = d_model // num_heads, num_heads
        self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d_model, d_model) for _ in range(4))
        self.attention = ScaledDotProductAttention(scale=math.sqrt(self.d_k))

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        Q, K, V = (W(x).view(B, T, self.num_heads, self.d_k).transpose(1, 2) for W in (self.W_Q, self.W_K, self.W_V))
        out, attn = self.attention(Q, K, V, mask)
        return self.W_O(out.transpose(1, 2).contiguous().view(B, T, -1)), attn


def _fixed_init(self, d_model, num_heads):
    nn.Module.__init__(self)
    self.d_k, self.num_heads = d_model // num_heads, num_heads
    self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d_model, d_model) for _ in range(4))
    self.attention = ScaledDotProductAttention(self.d_k)


def test_the_source_posts_class_gets_its_constructor_error_with_its_line():
    result = check_multi_head_attention(SourcePost)
    for words in ("raised TypeError", "unexpected keyword argument 'scale'", "at line",
                  "ScaledDotProductAttention(scale=math.sqrt(self.d_k))"):
        assert words in result.message, result.message


def test_once_fixed_the_source_posts_two_real_mistakes_are_named_together():
    result = check_multi_head_attention(type("SourcePost", (SourcePost,), {"__init__": _fixed_init}))
    assert not result.passed
    for words in ("two mistakes at once", "over the queries (dim=-2", "an inverted mask"):
        assert words in result.message, result.message


def multi_head_attention(x, num_heads, mask=None):
    """The source post's third version: a function that builds its layers on every call."""
    B, T, D = x.shape
    W_q, W_k, W_v, W_o = (nn.Linear(D, D) for _ in range(4))
    q, k, v = (W(x).view(B, T, num_heads, -1).transpose(1, 2) for W in (W_q, W_k, W_v))
    return W_o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, D))


def mha_with_weights(x, W_q, W_k, W_v, W_o, num_heads, mask=None):
    B, T, D = x.shape
    q, k, v = (W(x).view(B, T, num_heads, -1).transpose(1, 2) for W in (W_q, W_k, W_v))
    return W_o(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, D))


class Config:  # nanoGPT's constructor takes a config
    pass


def _config_init(self, config):
    nn.Module.__init__(self)


def _raschka_init(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
    nn.Module.__init__(self)


def test_a_function_is_told_the_drill_asks_for_a_class_and_why_its_weights_are_random():
    result = check_multi_head_attention(multi_head_attention)
    assert "`multi_head_attention` is a function, and the drill asks for an nn.Module class" in result.message
    assert "its parameters are new random ones on every call" in result.message, result.message
    result = check_multi_head_attention(mha_with_weights)
    assert "`mha_with_weights` is a function; the drill asks for an nn.Module class" in result.message
    assert "random" not in result.message, result.message


@pytest.mark.parametrize("init, words", [(_config_init, ["needs config"]),
                                         (_raschka_init, ["needs d_in, d_out, context_length, dropout",
                                                          "Give every other argument a default"])])
def test_a_constructor_that_needs_other_arguments_is_told_which(init, words):
    result = check_multi_head_attention(type("MHA", (NanoGPT,), {"__init__": init}))
    assert not result.passed and all(w in result.message for w in words), result.message


def _hf_no_o_proj(self, hidden_states, attention_mask=None):
    out, _ = HFStyle.forward(self, hidden_states, attention_mask)
    return F.linear(out, torch.linalg.inv(self.o_proj.weight))  # undo o_proj: the merged heads come out


def _hf_keys_as_queries(self, hidden_states, attention_mask=None):
    self.q_proj, self.k_proj = self.k_proj, self.q_proj
    try:
        return HFStyle.forward(self, hidden_states, attention_mask)
    finally:
        self.q_proj, self.k_proj = self.k_proj, self.q_proj


def _nano_unscaled_inverted(self, x, mask=None):
    B, T, C = x.size()
    q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(self.n_embd, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else ~mask, scale=1.0)
    return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def _einsum_over_queries(self, x, mask=None):
    q, k, v = (self.proj[r](x).unflatten(-1, (self.heads, -1)) for r in ("query", "key", "value"))
    sim = torch.einsum("bihd,bjhd->bhij", q, k) * q.shape[-1] ** -0.5
    sim = sim if mask is None else sim.masked_fill(~mask, float("-inf"))
    return self.proj["out"](torch.einsum("bhij,bjhd->bihd", sim.softmax(dim=-2), v).flatten(2))


def _annotated_no_transpose(self, query, key, value, mask=None):
    n = query.size(0)
    query, key, value = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                         for lin, x in zip(self.linears, (query, key, value))]
    scores = (query @ key.transpose(-2, -1) / math.sqrt(self.d_k))
    scores = scores if mask is None else scores.masked_fill(mask == 0, -1e9)
    return self.linears[-1]((scores.softmax(dim=-1) @ value).reshape(n, -1, self.h * self.d_k))


def _dropout_on(self, x, attn_mask=None):
    out = LinearNames.forward(self, x, attn_mask)
    return F.dropout(out, 0.5)


MISTAKES_IN_STYLE = {
    "o_proj never applied": (HFStyle, {"forward": lambda s, h, attention_mask=None: HFStyle.forward(
        s, h, attention_mask)[0] @ torch.linalg.inv(s.o_proj.weight).T}, ["your `o_proj` is never applied"]),
    "nanoGPT unscaled with an inverted mask": (NanoGPT, {"forward": _nano_unscaled_inverted},
                                               ["two mistakes at once", "no scale", "an inverted mask"]),
    "einsum softmax over the queries": (EinsumDict, {"forward": _einsum_over_queries}, ["over the queries"]),
    "Annotated merge without the transpose": (AnnotatedTransformer, {"forward": _annotated_no_transpose},
                                              ["forward(x, x, x) is wrong", "merged without the transpose"]),
    "dropout left on in eval()": (LinearNames, {"forward": _dropout_on}, ["two different outputs", "dropout"]),
}


@pytest.mark.parametrize("name", list(MISTAKES_IN_STYLE))
def test_mistakes_in_any_style_are_named_in_the_readers_names(name):
    base, methods, words = MISTAKES_IN_STYLE[name]
    result = check_multi_head_attention(type(base.__name__, (base,), methods))
    assert not result.passed and result.attempted, result.message
    for word in words:
        assert word in result.message, (word, result.message)


def test_layers_used_in_other_roles_pass_and_the_names_are_noted():
    """Names are not roles: k_proj used as the queries (scores K Qᵀ in effect) is correct multi-head attention."""
    result = check_multi_head_attention(type("HFStyle", (HFStyle,), {"forward": _hf_keys_as_queries}))
    assert result.passed, result.message
    for words in ("`k_proj` acts as the queries, `q_proj` acts as the keys", "K Qᵀ", "an interviewer reads names"):
        assert words in result.message, result.message
