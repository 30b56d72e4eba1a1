"""The interview drill's catalog of classic mistakes, each a change to one field of drill_variants.Variant.

`needs` says which calls can reveal a mistake (a mask, is_causal, a context), so that
the checker only tries the mistakes the reader's calls could show. `describe` puts them in words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["Mistake", "MISTAKES", "describe"]


class Mistake(NamedTuple):
    field: str
    value: object
    text: str  # may use {Dh}, {D}, {sqrt_Dh} and the reader's layer names {q}, {k}, {v}, {o}
    needs: str = ""  # when it can show: "mask", "causal", "masked" (either), "cross", "self", "" (always)


MISTAKES = (
    Mistake("scale", "1", "no scale: the scores Q Kᵀ are not divided by sqrt(d_k) = sqrt({Dh}) = {sqrt_Dh:g}"),
    Mistake("scale", "1/sqrt(D)", "the wrong scale: the scores are divided by sqrt(d_model) = sqrt({D}) instead "
            "of sqrt(d_k) = sqrt(d_model / num_heads) = sqrt({Dh}); each head's dot product sums d_k terms"),
    Mistake("scale", "1/Dh", "the wrong scale: the scores are divided by d_k = {Dh} instead of sqrt(d_k)"),
    Mistake("scale", "sqrt(Dh)", "the wrong scale: the scores are multiplied by sqrt(d_k) instead of divided by it"),
    Mistake("axis", -2, "softmax over the wrong axis: over the queries (dim=-2, which is dim=2 of the scores "
            "(B, H, T, S)) instead of the keys (dim=-1); "
            "each query's weights over the keys must sum to 1"),
    Mistake("axis", 1, "softmax over the wrong axis: over the heads (dim=1) instead of the keys (dim=-1)"),
    Mistake("transposed", True, "the scores transposed: K Qᵀ gives one row per key ({k} acts as the queries, {q} as the "
            "keys); the scores are "
            "Q Kᵀ = q @ k.transpose(-2, -1), (B, H, T, S), one row per query", "self"),
    Mistake("split", False, "heads split without the transpose: t.view(B, H, T, Dh) cuts the sequence into "
            "heads and mixes positions; use t.view(B, T, H, Dh).transpose(1, 2)"),
    Mistake("merge", False, "heads merged without the transpose: reshaping (B, H, T, Dh) straight to (B, T, D) "
            "mixes heads and positions; use out.transpose(1, 2).reshape(B, T, D)"),
    Mistake("w_o", False, "no output projection: your {o} is never applied to the merged heads"),
    Mistake("mask", "inverted", "an inverted mask: True means may attend, so fill the scores where the mask is "
            "False: scores.masked_fill(~mask, float('-inf'))", "mask"),
    Mistake("mask", "ignored", "the mask is ignored: the output with a mask equals the output without it", "mask"),
    Mistake("fill", "0", "masked scores set to 0 instead of -inf: exp(0) still gives the masked keys weight",
            "masked"),
    Mistake("fill", "added", "the bool mask added to the scores as numbers (1.0 where True, 0.0 where False), "
            "which masks nothing: a float attn_mask is added to the scores; pass the bool mask itself, or a float "
            "mask of 0 and -inf", "mask"),
    Mistake("fill", "after", "the mask applied after the softmax: zeroing weights there leaves rows that no "
            "longer sum to 1; fill the scores with -inf before the softmax", "masked"),
    Mistake("causal", "inverted", "an inverted causal mask: each query sees the later positions instead of the "
            "earlier ones; keep key j <= query i (torch.tril)", "causal"),
    Mistake("causal", "ignored", "is_causal=True is ignored: queries still see later positions", "causal"),
    Mistake("causal", "replaces mask", "with is_causal=True the mask is dropped: apply both, mask & causal", "causal"),
    Mistake("causal", "strict", "the causal mask hides the diagonal: a query must see its own position "
            "(keep j <= i: torch.tril(ones, diagonal=0), or hide torch.triu(ones, diagonal=1))", "causal"),
    Mistake("kv_from_x", True, "keys and values projected from x instead of from context: in cross-attention "
            "only the queries come from x", "cross"),
)


def describe(combo: Sequence[Mistake], d_model: int, num_heads: int, names: Mapping[str, str] | None = None) -> str:
    """The mistakes in plain words, with the reader's layer names: 'X' for one, '(1) X; (2) Y' for two."""
    Dh = d_model // num_heads
    named = {r: f"`{n}`" for r, n in (names or {"q": "W_q", "k": "W_k", "v": "W_v", "o": "W_o"}).items()}
    texts = [m.text.format(Dh=Dh, D=d_model, sqrt_Dh=math.sqrt(Dh), **named) for m in combo]
    return texts[0] if len(texts) == 1 else "; ".join(f"({i}) {t}" for i, t in enumerate(texts, 1))
