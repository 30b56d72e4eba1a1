"""The interview drill's reference: multi-head attention rebuilt from the reader's weights, with or without each mistake.

A `Variant` says how each step is done; with every field at its default it is correct multi-head
attention, whose core is attnlib.attention (the reference). Each `Mistake` (mistakes.py) changes
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
from attnlib.drill.layers import Layers, project
from attnlib.drill.masking import allowed_pairs
from attnlib.drill.mistakes import MISTAKES, Mistake
from attnlib.exercises._core import matching

__all__ = ["Case", "Variant", "simulate", "reproduces", "explain", "SCALES"]

SCALES = {"1/sqrt(Dh)": lambda Dh, H: 1 / math.sqrt(Dh), "1": lambda Dh, H: 1.0,
          "1/sqrt(D)": lambda Dh, H: 1 / math.sqrt(Dh * H), "1/sqrt(H)": lambda Dh, H: 1 / math.sqrt(H),
          "1/Dh": lambda Dh, H: 1 / Dh, "1/D": lambda Dh, H: 1 / (Dh * H), "1/8": lambda Dh, H: 1 / 8,
          "sqrt(Dh)": lambda Dh, H: math.sqrt(Dh)}
_AXES = {-1: (-1,), -2: (-2,), 1: (1,), "BH": (0, 1), "TS": (-2, -1)}  # the softmax's axes of the scores (B, H, T, S)


@dataclass(frozen=True)
class Case:
    """One call of the reader's forward: `call` names it in messages; `kwargs` follow x."""

    call: str
    kwargs: Mapping[str, object] = field(default_factory=dict)
    context: torch.Tensor | None = None  # keys and values come from context (B, S, D); None: from x
    mask: torch.Tensor | None = None  # bool, True = may attend, broadcastable to (B, H, T, S)
    is_causal: bool = False
    x: torch.Tensor | None = None  # this call's own x (B, T, D); None: the check's x


@dataclass(frozen=True)
class Variant:
    """How each step of multi-head attention is done; the defaults are right."""

    kv_from_x: bool = False  # keys and values projected from x although a context is given
    heads: str = "split"  # "one": num_heads ignored, a single head of width D (scaled by 1/sqrt(D))
    split: str = "heads"  # view(B, T, H, Dh).transpose(1, 2); "no transpose": view(B, H, T, Dh); "strided": (B, T, Dh, H)
    scale: str | float = "1/sqrt(Dh)"  # the factor on Q Kᵀ, a key of SCALES (or a number)
    scale_at: str = "scores"  # "weights": the softmax of unscaled scores, multiplied by the scale afterwards
    axis: object = -1  # the softmax's axis (or axes), a key of _AXES
    twice: bool = False  # softmax(softmax(scores))
    weights_T: bool = False  # Aᵀ @ v (self-attention only)
    mask: str = "kept"  # the reader's mask: kept, inverted, ignored, "ignored if 2-D", "head 0", transposed
    causal: str = "tril"  # is_causal: tril (key j <= query i), ignored, inverted (j > i), strict (j < i), triu (j >= i),
    #                       "replaces mask" (the causal mask alone), "or" (mask | causal)
    always_causal: str = "never"  # a top-left causal mask on "always" every call, or on "cross"-attention calls only
    fill: str = "-inf"  # disallowed scores: "-inf", "0", "after" (weights zeroed after softmax), "added" (mask as 1/0)
    merge: str = "heads"  # transpose(1, 2) then reshape; "no transpose"; "strided": permute to (B, T, Dh, H)
    w_o: bool = True  # the merged heads go through W_o
    residual: bool = False  # x added to the output


def _split(t: torch.Tensor, H: int, how: str) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, Dh) as `how` says (only "heads" keeps each head's features together)."""
    B, L, D = t.shape
    if how == "strided":
        return t.view(B, L, D // H, H).permute(0, 3, 1, 2)
    return t.view(B, L, H, D // H).transpose(1, 2) if how == "heads" else t.reshape(B, H, L, D // H)


def _merge(o: torch.Tensor, how: str) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, D) as `how` says."""
    B, H, L, Dh = o.shape
    if how == "strided":
        return o.permute(0, 2, 3, 1).reshape(B, L, H * Dh)
    return (o.transpose(1, 2) if how == "heads" else o).reshape(B, L, H * Dh)


def _softmax(s: torch.Tensor, axis: object) -> torch.Tensor:
    if axis == "BH":
        return softmax(s.flatten(0, 1), dim=0).view_as(s)
    return softmax(s.flatten(-2), dim=-1).view_as(s) if axis == "TS" else softmax(s, dim=axis)


def _weights(q, k, v, allowed, variant: Variant) -> torch.Tensor:
    """The attention weights (B, H, T, S) as the variant computes them; all-masked groups give zeros."""
    Dh, H = q.shape[-1], q.shape[-3]
    scale = SCALES[variant.scale](Dh, H) if isinstance(variant.scale, str) else float(variant.scale)
    inside = scale if variant.scale_at == "scores" else 1.0
    if variant.axis == -1 and variant.fill == "-inf" and not variant.twice:
        w = attention(q, k, v, allowed, scale=inside)[1]  # the reference's own path
    else:
        scores = q @ k.transpose(-2, -1) * inside  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
        if allowed is not None and variant.fill == "added":
            scores = scores + allowed.to(scores.dtype)
        elif allowed is not None and variant.fill != "after":
            scores = scores.masked_fill(~allowed, float("-inf") if variant.fill == "-inf" else 0.0)
        w = _softmax(scores, variant.axis)
        w = _softmax(w, variant.axis) if variant.twice else w
        w = w * allowed if allowed is not None and variant.fill == "after" else w
    return w if variant.scale_at == "scores" else w * scale


def _flavours(w: torch.Tensor, allowed: torch.Tensor | None, variant: Variant) -> list[torch.Tensor]:
    """The ways a softmax group with every score at -inf comes out: zeros (attnlib, SDPA), NaN
    (torch.softmax), uniform (a -1e9 or finfo.min fill). One entry when no group is all masked."""
    if allowed is None or variant.fill != "-inf":
        return [w]
    dims = _AXES[variant.axis]
    empty = ~allowed.expand(w.shape).any(dim=dims[0], keepdim=True)
    for d in dims[1:]:
        empty = empty.all(dim=d, keepdim=True)
    if not bool(empty.any()):
        return [w]
    size = math.prod(w.shape[d] for d in dims)
    return [w, w.masked_fill(empty, float("nan")), w.masked_fill(empty, 1.0 / size)]


def simulate(layers: Layers, num_heads: int, x: torch.Tensor, case: Case, variant: Variant = Variant(),
             live: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Multi-head attention done as `variant` says on one call: [(out (B, T, D), weights (B, H, T, S))],
    one pair per way an all-masked softmax group can come out (see _flavours). `live`: from the reader's
    own parameters, with autograd (for the gradient check); else on detached copies."""
    x = x if case.x is None else case.x
    context = x if case.context is None else case.context
    with torch.set_grad_enabled(live):
        q, k, v = project(layers, x, x if variant.kv_from_x else context, live)
        heads = 1 if variant.heads == "one" else num_heads
        q, k, v = (_split(t, heads, variant.split) for t in (q, k, v))  # (B, H, T or S, Dh)
        allowed = allowed_pairs(case, variant, q.shape[-2], k.shape[-2])
        pairs = []
        for w in _flavours(_weights(q, k, v, allowed, variant), allowed, variant):
            applied = w.transpose(-2, -1) if variant.weights_T else w
            out = _merge(applied @ v, variant.merge)  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh) -> (B, T, D)
            if variant.w_o:
                w_o, b_o = layers.out_params(live)
                out = F.linear(out.to(w_o.dtype), w_o, b_o)
            pairs.append((out + x if variant.residual else out, w))
    return pairs


def _applies(m: Mistake, cases: Sequence[Case]) -> bool:
    has = {"": True, "cross": any(c.context is not None for c in cases),
           "self": all(c.context is None for c in cases),
           "mask": any(c.mask is not None for c in cases), "causal": any(c.is_causal for c in cases),
           "mask2d": any(c.mask is not None and c.mask.dim() == 2 for c in cases),
           "perhead": any(c.mask is not None and c.mask.dim() == 4 and c.mask.shape[1] > 1 for c in cases)}
    has["masked"] = has["mask"] or has["causal"]
    return has[m.needs]


def reproduces(layers: Layers, num_heads: int, x: torch.Tensor, outputs: Sequence[tuple[Case, torch.Tensor]],
               variant: Variant = Variant()) -> bool:
    """Whether `variant` gives the reader's output on every (case, out)."""
    try:
        return all(matching(got, {str(i): out for i, (out, _) in
                                  enumerate(simulate(layers, num_heads, x, case, variant))}) for case, got in outputs)
    except (RuntimeError, ValueError):  # a variant whose mask cannot apply to this call (a transposed (B, 1, 1, S))
        return False


def explain(layers: Layers, num_heads: int, x: torch.Tensor, outputs: Sequence[tuple[Case, torch.Tensor]],
            sizes: tuple[int, ...] = (1, 2)) -> list[tuple[Mistake, ...]]:
    """The fewest known mistakes (of the `sizes` tried: one, two at once) that reproduce every (case, out)."""
    candidates = [m for m in MISTAKES if _applies(m, [c for c, _ in outputs])]
    for n in sizes:
        found = [combo for combo in itertools.combinations(candidates, n)
                 if len({m.field for m in combo}) == n and reproduces(
                     layers, num_heads, x, outputs, dataclasses.replace(Variant(), **{m.field: m.value for m in combo}))]
        if found:
            return found
    return []
