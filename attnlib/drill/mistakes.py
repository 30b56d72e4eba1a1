"""The interview drill's catalogue of classic mistakes, each a change to one field of variants.Variant.

`needs` says which calls can reveal a mistake (a mask, a (T, T) mask, a per-head mask, is_causal, a
context), so that the checker only tries the mistakes the reader's calls could show. `describe` puts
them in words, with the reader's own layer names and the checker's sizes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["Mistake", "MISTAKES", "describe"]


class Mistake(NamedTuple):
    field: str
    value: object
    text: str  # may use {Dh}, {D}, {H}, {sqrt_Dh} and the reader's layer names {q}, {k}, {v}, {o}
    needs: str = ""  # "mask", "mask2d", "perhead", "masked" (a mask or is_causal), "causal", "cross", "self", ""


_SQRT_DK = "sqrt(d_k) = sqrt(d_model / num_heads) = sqrt({Dh})"
MISTAKES = (
    Mistake("scale", "1", "no scale: the scores Q Kᵀ are not divided by sqrt(d_k) = sqrt({Dh}) = {sqrt_Dh:g}"),
    Mistake("scale", "1/sqrt(D)", "the wrong scale: the scores are divided by sqrt(d_model) = sqrt({D}) instead "
            f"of {_SQRT_DK}; each head's dot product sums d_k terms"),
    Mistake("scale", "1/sqrt(H)", "the wrong scale: the scores are divided by sqrt(num_heads) = sqrt({H}) "
            f"instead of {_SQRT_DK}"),
    Mistake("scale", "1/Dh", "the wrong scale: the scores are divided by d_k = {Dh} instead of sqrt(d_k) (or q "
            "and k are each divided by sqrt(d_k))"),
    Mistake("scale", "1/D", "the wrong scale: the scores are divided by d_model = {D} instead of "
            f"{_SQRT_DK}"),
    Mistake("scale", "1/8", "a hard-coded scale: the scores are divided by 8 = sqrt(64), which is sqrt(d_k) only "
            "when d_k = 64; here d_k = d_model / num_heads = {Dh}: compute it (math.sqrt(self.d_k))"),
    Mistake("scale", "sqrt(Dh)", "the wrong scale: the scores are multiplied by sqrt(d_k) instead of divided by it"),
    Mistake("scale_at", "weights", "the scale applied after the softmax (to the weights, or to v, which gives the "
            "same output): the softmax sees the unscaled scores Q Kᵀ and the output shrinks by sqrt(d_k) = "
            "{sqrt_Dh:g}; divide the scores before the softmax"),
    Mistake("axis", -2, "softmax over the wrong axis: over the queries (dim=-2, which is dim=2 of the scores "
            "(B, H, T, S)) instead of the keys (dim=-1); each query's attention weights over the keys must sum to 1"),
    Mistake("axis", 1, "softmax over the wrong axis: over the heads (dim=1) instead of the keys (dim=-1)"),
    Mistake("axis", "BH", "softmax over the wrong axis: over the batch·heads axis, dim=0 of the (B·H, T, S) scores "
            "of a bmm. nn.Softmax() or F.softmax(s) without dim picks dim=0 for a 3-D tensor (PyTorch's legacy "
            "implicit dim, with a warning): pass dim=-1"),
    Mistake("axis", "TS", "softmax over the wrong axis: over all T × S scores of a head at once (a softmax of the "
            "flattened matrix); each query's row of attention weights must sum to 1: softmax(dim=-1)"),
    Mistake("heads", "one", "num_heads ignored: one head of width d_model = {D} (q, k and v never split into "
            "{H} heads of d_k = {Dh}): split them with view(B, T, H, Dh).transpose(1, 2)"),
    Mistake("twice", True, "softmax applied twice: the attention weights are softmax(softmax(scores)), nearly uniform; "
            "apply it once"),
    Mistake("weights_T", True, "the attention weights transposed before they meet v: Aᵀ @ v sums over the queries; the "
            "output is A @ v with the attention weights A (B, H, T, S), one row per query", "self"),
    Mistake("split", "no transpose", "heads split without the transpose: t.view(B, H, T, Dh) cuts the sequence "
            "into heads and mixes positions; use t.view(B, T, H, Dh).transpose(1, 2)"),
    Mistake("split", "strided", "heads split as view(B, T, Dh, H): head h takes every H-th feature (h, h + H, ...) "
            "instead of the block h·d_k to (h+1)·d_k - 1; use view(B, T, H, Dh)"),
    Mistake("merge", "no transpose", "heads merged without the transpose: reshaping (B, H, T, Dh) straight to "
            "(B, T, D) mixes heads and positions; use out.transpose(1, 2).reshape(B, T, D)"),
    Mistake("merge", "strided", "heads merged in the wrong order: (B, H, T, Dh) permuted to (B, T, Dh, H) before "
            "the reshape interleaves the heads' features; transpose to (B, T, H, Dh), then reshape to (B, T, D)"),
    Mistake("w_o", False, "no output projection: your {o} is never applied to the merged heads"),
    Mistake("residual", True, "a residual inside the module: it returns x + attention(x); the drill's module returns "
            "the attention alone (the residual belongs to the block around it)"),
    Mistake("mask", "inverted", "an inverted mask: True means may attend, so fill the scores where the mask is "
            "False: scores.masked_fill(~mask, float('-inf'))", "mask"),
    Mistake("mask", "ignored", "the mask is ignored: the output with a mask equals the output without it", "mask"),
    Mistake("mask", "ignored if 2-D", "a (T, T) mask is ignored: a (B, 1, T, T) mask is applied, but the causal "
            "(T, T) mask changes nothing; apply any mask that broadcasts to (B, H, T, T)", "mask2d"),
    Mistake("mask", "head 0", "head 0's mask used for every head: a (B, H, T, T) mask gives each head its own, and "
            "mask[:, :1] or mask[:, 0] keeps only the first; let the mask broadcast as it is", "perhead"),
    Mistake("mask", "transposed", "the mask transposed: mask[..., i, j] says whether query i may see key j, so fill "
            "the scores where ~mask, not ~mask.transpose(-2, -1)", "self"),
    Mistake("fill", "0", "masked scores set to 0 instead of -inf: exp(0) still gives the masked keys weight",
            "masked"),
    Mistake("fill", "added", "the bool mask added to the scores as numbers (1.0 where True, 0.0 where False), "
            "which masks nothing: a float attn_mask is added to the scores; pass the bool mask itself, or a float "
            "mask of 0 and -inf", "mask"),
    Mistake("fill", "after", "the mask applied after the softmax: zeroing attention weights there leaves rows that no "
            "longer sum to 1; fill the scores with -inf before the softmax", "masked"),
    Mistake("always_causal", "always", "a causal mask on every call: the module must attend to every key unless "
            "the mask it is given says otherwise (and in cross-attention a query may see every position of the "
            "context: it is not its future); make causality an option of self-attention"),
    Mistake("always_causal", "cross", "a causal mask in cross-attention: each query may see every position of the "
            "context (the memory is not its future); only self-attention in a decoder is causal", "cross"),
    Mistake("causal", "inverted", "an inverted causal mask: each query sees the later positions instead of the "
            "earlier ones; keep key j <= query i (torch.tril)", "causal"),
    Mistake("causal", "triu", "torch.triu as the allowed part: True = may attend, so query i sees keys j >= i, its "
            "future; the allowed part is torch.tril(torch.ones(T, T, dtype=torch.bool))", "causal"),
    Mistake("causal", "ignored", "is_causal=True is ignored: queries still see later positions", "causal"),
    Mistake("causal", "replaces mask", "with is_causal=True the mask is dropped: apply both, mask & causal", "causal"),
    Mistake("causal", "or", "mask | causal: with is_causal=True a key must be allowed by both masks (mask & causal); "
            "OR lets through what either allows", "causal"),
    Mistake("causal", "strict", "the causal mask hides the diagonal: a query must see its own position "
            "(keep j <= i: torch.tril(ones, diagonal=0), or hide torch.triu(ones, diagonal=1))", "causal"),
    Mistake("kv_from_x", True, "keys and values projected from x instead of from context: in cross-attention "
            "only the queries come from x", "cross"),
)


def describe(combo: Sequence[Mistake], d_model: int, num_heads: int, names: Mapping[str, str] | None = None) -> str:
    """The mistakes in plain words, with the reader's layer names: 'X' for one, '(1) X; (2) Y' for two."""
    Dh = d_model // num_heads
    named = {r: f"`{n}`" for r, n in (names or {"q": "W_q", "k": "W_k", "v": "W_v", "o": "W_o"}).items()}
    texts = [m.text.format(Dh=Dh, D=d_model, H=num_heads, sqrt_Dh=math.sqrt(Dh), **named) for m in combo]
    return texts[0] if len(texts) == 1 else "; ".join(f"({i}) {t}" for i, t in enumerate(texts, 1))
