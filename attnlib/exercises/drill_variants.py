"""The interview drill's reference: multi-head attention rebuilt from the reader's weights, with or without each mistake.

A `Variant` says how each step is done; with every field at its default it is correct multi-head
attention, whose core is attnlib.attention (the reference). Each `Mistake` (drill_mistakes) changes
one field. `explain` tries every mistake alone, then every pair, and returns those that reproduce
the reader's output on every call the checker made.

Shapes: x (B, T, D), context (B, S, D), q (B, H, T, Dh), k and v (B, H, S, Dh), scores (B, H, T, S).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnlib.attention import attention, softmax
from attnlib.exercises._core import matching
from attnlib.exercises.drill_layers import Layers, project
from attnlib.exercises.drill_mistakes import MISTAKES, Mistake
from attnlib.masks import causal_mask, combine

__all__ = ["Case", "Variant", "simulate", "explain"]

SCALES = {"1/sqrt(Dh)": lambda Dh, D: 1 / math.sqrt(Dh), "1": lambda Dh, D: 1.0,
          "1/sqrt(D)": lambda Dh, D: 1 / math.sqrt(D), "1/Dh": lambda Dh, D: 1 / Dh,
          "sqrt(Dh)": lambda Dh, D: math.sqrt(Dh)}


@dataclass(frozen=True)
class Case:
    """One call of the reader's forward: `call` names it in messages; `kwargs` follow x."""

    call: str
    kwargs: Mapping[str, object] = field(default_factory=dict)
    context: torch.Tensor | None = None  # keys and values come from context (B, S, D); None: from x
    mask: torch.Tensor | None = None  # bool, True = may attend, broadcastable to (B, H, T, S)
    is_causal: bool = False


@dataclass(frozen=True)
class Variant:
    """How each step of multi-head attention is done; the defaults are right."""

    kv_from_x: bool = False  # keys and values projected from x although a context is given
    split: bool = True  # (B, T, D) -view-> (B, T, H, Dh) -transpose-> (B, H, T, Dh); False: view (B, H, T, Dh)
    scale: str = "1/sqrt(Dh)"  # the factor on Q Kᵀ, a key of SCALES
    transposed: bool = False  # the scores K Qᵀ (rows are keys) instead of Q Kᵀ; self-attention only
    axis: int = -1  # the softmax axis of the scores (B, H, T, S)
    mask: str = "kept"  # the reader's mask "kept", "inverted" or "ignored"
    causal: str = "tril"  # is_causal: "tril" (key j <= query i), "ignored", "inverted" (j > i), "strict" (j < i),
    #                       "replaces mask" (the causal mask alone, the reader's mask dropped)
    fill: str = "-inf"  # disallowed scores: "-inf", "0" (filled with 0), "after" (weights zeroed after softmax),
    #                     "added" (the bool mask added as 1.0 / 0.0, as a float attn_mask of SDPA is)
    merge: bool = True  # (B, H, T, Dh) -transpose-> (B, T, H, Dh) -> (B, T, D); False: reshape straight
    w_o: bool = True  # the merged heads go through W_o



def _split(t: torch.Tensor, H: int, transpose: bool) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh); without the transpose, a plain view that mixes positions into heads."""
    B, L, D = t.shape
    return t.view(B, L, H, D // H).transpose(1, 2) if transpose else t.reshape(B, H, L, D // H)


def _merge(o: torch.Tensor, transpose: bool) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D); without the transpose, a plain reshape that mixes heads into positions."""
    B, H, L, Dh = o.shape
    return (o.transpose(1, 2) if transpose else o).reshape(B, L, H * Dh)


def _allowed(case: Case, v: Variant, T: int, S: int) -> torch.Tensor | None:
    """The mask the variant applies: the reader's mask (as kept, inverted or ignored) AND the causal one."""
    user = {"kept": case.mask, "ignored": None,
            "inverted": None if case.mask is None else ~case.mask}[v.mask]
    if case.is_causal and v.causal == "replaces mask":
        user = None
    causal = None
    if case.is_causal and v.causal != "ignored":
        tril = causal_mask(T, S)  # (T, S), bottom-right aligned
        causal = {"inverted": ~tril, "strict": tril.tril(S - T - 1)}.get(v.causal, tril)
    return combine(user, causal)


def _weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
             variant: Variant) -> torch.Tensor:
    """The attention weights (B, H, T, S) as the variant computes them; all-masked groups give zeros."""
    Dh, H = q.shape[-1], q.shape[-3]
    scale = SCALES[variant.scale](Dh, H * Dh)
    if variant.axis == -1 and variant.fill == "-inf" and not variant.transposed:
        return attention(q, k, v, allowed, scale=scale)[1]  # the reference's own path
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    if variant.transposed:
        scores = scores.transpose(-2, -1)  # K Qᵀ, (B, H, S, T) = (B, H, T, T) in self-attention
    if allowed is not None and variant.fill == "added":
        scores = scores + allowed.to(scores.dtype)
    elif allowed is not None and variant.fill != "after":
        scores = scores.masked_fill(~allowed, float("-inf") if variant.fill == "-inf" else 0.0)
    weights = softmax(scores, dim=variant.axis)
    return weights * allowed if allowed is not None and variant.fill == "after" else weights


def _flavours(w: torch.Tensor, allowed: torch.Tensor | None, variant: Variant) -> list[torch.Tensor]:
    """The ways a softmax group with every score at -inf comes out: zeros (attnlib, SDPA), NaN
    (torch.softmax), uniform (a -1e9 or finfo.min fill). One entry when no group is all masked."""
    if allowed is None or variant.fill != "-inf":
        return [w]
    empty = ~allowed.expand(w.shape).any(dim=variant.axis, keepdim=True)
    if not bool(empty.any()):
        return [w]
    return [w, w.masked_fill(empty, float("nan")), w.masked_fill(empty, 1.0 / w.shape[variant.axis])]


def simulate(layers: Layers, num_heads: int, x: torch.Tensor, case: Case,
             variant: Variant = Variant()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Multi-head attention done as `variant` says on one call: [(out (B, T, D), weights (B, H, T, S))],
    one pair per way an all-masked softmax group can come out (see _flavours)."""
    context = x if case.context is None else case.context
    with torch.no_grad():
        q, k, v = project(layers, x, x if variant.kv_from_x else context)
        q, k, v = (_split(t, num_heads, variant.split) for t in (q, k, v))  # (B, H, T or S, Dh)
        allowed = _allowed(case, variant, q.shape[-2], k.shape[-2])
        pairs = []
        for w in _flavours(_weights(q, k, v, allowed, variant), allowed, variant):
            out = _merge(w @ v, variant.merge)  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh) -> (B, T, D)
            if variant.w_o:
                out = F.linear(out, layers.out_weight, layers.out_bias)
            pairs.append((out, w))
    return pairs


def _applies(m: Mistake, layers: Layers, cases: Sequence[Case]) -> bool:
    has = {"": True, "cross": any(c.context is not None for c in cases),
           "self": all(c.context is None for c in cases),
           "mask": any(c.mask is not None for c in cases), "causal": any(c.is_causal for c in cases)}
    has["masked"] = has["mask"] or has["causal"]
    return has[m.needs]


def explain(layers: Layers, num_heads: int, x: torch.Tensor,
            outputs: Sequence[tuple[Case, torch.Tensor]]) -> list[tuple[Mistake, ...]]:
    """The fewest known mistakes (one, else two at once) that reproduce every (case, reader's out); [] if none."""
    candidates = [m for m in MISTAKES if _applies(m, layers, [c for c, _ in outputs])]

    def reproduces(combo: tuple[Mistake, ...]) -> bool:
        variant = dataclasses.replace(Variant(), **{m.field: m.value for m in combo})
        return all(matching(got, {str(i): out for i, (out, _) in
                                  enumerate(simulate(layers, num_heads, x, case, variant))})
                   for case, got in outputs)

    for n in (1, 2):
        found = [combo for combo in itertools.combinations(candidates, n)
                 if len({m.field for m in combo}) == n and reproduces(combo)]
        if found:
            return found
    return []
