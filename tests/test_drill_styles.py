"""The interview drill accepts every correct answer, whatever its names, layout, signature or constructor.

Each class below is correct multi-head attention written in the style of a public course or library
(our own code, in their naming and structure). None may be reported as a mistake; the mistakes made in
these styles are named in the reader's own layer names.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib.exercises import check_multi_head_attention


class NanoGPT(nn.Module):
    """nanoGPT's CausalSelfAttention, without its causal mask: c_attn fused [q | k | v], c_proj, SDPA."""

    def __init__(self, n_embd, n_head, bias=True):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x, mask=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.c_proj(y)


class HFStyle(nn.Module):
    """transformers' naming: q_proj, k_proj, v_proj, o_proj without bias; attention_mask; (out, weights)."""

    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_attention_heads, hidden_size // num_attention_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        bsz, q_len, _ = hidden_states.size()
        shape = (bsz, q_len, self.num_heads, self.head_dim)
        query_states = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(attn_weights.dtype).min)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output), attn_weights


class Raschka(nn.Module):
    """W_query, W_key, W_value, out_proj; keys computed first; (d_in, num_heads) style with dropout."""

    def __init__(self, d_model, num_heads, dropout=0.1, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.W_query = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.W_key = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.W_value = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        b, num_tokens, d_out = x.shape
        keys = self.W_key(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        if mask is not None:
            attn_scores.masked_fill_(~mask, -torch.inf)
        attn_weights = self.dropout(torch.softmax(attn_scores / self.head_dim ** 0.5, dim=-1))
        context_vec = (attn_weights @ values).transpose(1, 2).contiguous().view(b, num_tokens, d_out)
        return self.out_proj(context_vec)


class UpperCase(nn.Module):
    """W_Q, W_K, W_V, W_O and forward(Q, K, V, mask=None), the source post's second version (corrected)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_k, self.num_heads = d_model // num_heads, num_heads
        self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, Q, K, V, mask=None):
        B = Q.size(0)
        Q = self.W_Q(Q).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, T, Dh)
        K = self.W_K(K).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, S, Dh)
        V = self.W_V(V).view(B, -1, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, S, Dh)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        out = (torch.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, -1, self.num_heads * self.d_k)
        return self.W_O(out)


class LinearNames(nn.Module):
    """linear_q, linear_k, linear_v, linear_out; keyword-only constructor; attn_mask."""

    def __init__(self, *, embed_dim, num_heads):
        super().__init__()
        self.h = num_heads
        self.linear_q, self.linear_k, self.linear_v, self.linear_out = (
            nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def forward(self, x, attn_mask=None):
        B, T, D = x.shape
        q, k, v = (lin(x).unflatten(-1, (self.h, -1)).transpose(1, 2)
                   for lin in (self.linear_q, self.linear_k, self.linear_v))  # (B, H, T, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, H, T, Dh)
        return self.linear_out(out.transpose(1, 2).flatten(2))


class AnnotatedTransformer(nn.Module):
    """The Annotated Transformer: MultiHeadedAttention(h, d_model), four Linears in a ModuleList,
    forward(query, key, value, mask=None), mask == 0 filled with -1e9. (Its mask.unsqueeze(1) is left out:
    the drill's masks already broadcast over the heads.)"""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        nbatches = query.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value))]
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        p_attn = self.dropout(scores.softmax(dim=-1))
        x = torch.matmul(p_attn, value).transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


class NeoX(nn.Module):
    """GPT-NeoX's fused query_key_value laid out per head (H, 3, Dh), and `dense` as the output."""

    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_heads, self.head_size = num_attention_heads, hidden_size // num_attention_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        B, T, D = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(B, T, self.num_heads, 3 * self.head_size)
        qkv = qkv.permute(0, 2, 1, 3)  # (B, H, T, 3 Dh): each head's [q | k | v]
        q, k, v = qkv.split(self.head_size, dim=-1)  # 3 x (B, H, T, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.dense(out.permute(0, 2, 1, 3).reshape(B, T, D))


class EinsumDict(nn.Module):
    """Projections in an nn.ModuleDict, no bias, einsum for the scores and the weighted sum."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.proj = nn.ModuleDict({r: nn.Linear(dim, dim, bias=False) for r in ("query", "key", "value", "out")})

    def forward(self, x, mask=None):
        q, k, v = (self.proj[r](x).unflatten(-1, (self.heads, -1)) for r in ("query", "key", "value"))  # (B, T, H, Dh)
        sim = torch.einsum("bihd,bjhd->bhij", q, k) * q.shape[-1] ** -0.5  # (B, H, T, S)
        if mask is not None:
            sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
        out = torch.einsum("bhij,bjhd->bihd", sim.softmax(dim=-1), v)  # (B, T, H, Dh)
        return self.proj["out"](out.flatten(2))


class Nested(nn.Module):
    """lucidrains-like: to_q and a fused to_kv inside a submodule, to_out an nn.Sequential."""

    def __init__(self, dim, heads=8):
        super().__init__()
        self.heads = heads
        self.inner = nn.Module()
        self.inner.to_q = nn.Linear(dim, dim, bias=False)
        self.inner.to_kv = nn.Linear(dim, 2 * dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))

    def forward(self, x, mask=None):
        q = self.inner.to_q(x)
        k, v = self.inner.to_kv(x).chunk(2, dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out(out.transpose(1, 2).flatten(2))


def _mask_required(self, x, mask):  # forward(x, mask) without a default: the checker passes None
    return HFStyle.forward(self, x, mask)


STYLES = {"nanoGPT c_attn/c_proj": NanoGPT, "transformers q_proj/o_proj": HFStyle,
          "W_query/out_proj": Raschka, "W_Q/W_O forward(Q, K, V)": UpperCase,
          "linear_q/linear_out keyword-only": LinearNames, "Annotated Transformer ModuleList": AnnotatedTransformer,
          "NeoX per-head fused": NeoX, "einsum ModuleDict": EinsumDict, "nested fused kv": Nested,
          "returns (out, None)": type("WithNone", (NanoGPT,), {"forward": lambda s, x, mask=None:
                                                                (NanoGPT.forward(s, x, mask), None)}),
          "mask without a default": type("Required", (HFStyle,), {"forward": _mask_required}),
          "a factory function": lambda d, h: NanoGPT(d, h)}


@pytest.mark.parametrize("name", list(STYLES))
def test_every_public_style_passes(name):
    result = check_multi_head_attention(STYLES[name])
    assert result.passed, result.message


@pytest.mark.parametrize("candidate, words", [
    (NanoGPT, ["`c_attn` (fused, laid out [q | k | v]) and `c_proj`"]),
    (NeoX, ["`query_key_value` (fused, laid out per head (H, 3, Dh)"]),
    (UpperCase, ["`W_Q`, `W_K`, `W_V` and `W_O`", "forward(q, k, v) was given x three times"]),
    (AnnotatedTransformer, ["`linears.0`, `linears.1`, `linears.2` and `linears.3`"]),
    (Nested, ["`inner.to_q`, `inner.to_kv`", "`to_out.0`"])])
def test_the_verdict_says_which_layers_and_layout_it_found(candidate, words):
    result = check_multi_head_attention(candidate)
    assert result.passed and all(w in result.message for w in words), result.message
