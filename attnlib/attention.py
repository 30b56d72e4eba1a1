"""Scaled dot-product attention, written out: the reference every other module is checked against.

    weights = softmax(Q Kᵀ · scale + mask),  out = weights V,  scale = 1 / sqrt(Dh)

Shapes: q (..., T, Dh), k (..., S, Dh), v (..., S, Dv) → out (..., T, Dv), weights (..., T, S).
The mask is boolean and True means "may attend", as in torch's scaled_dot_product_attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_float_tensor

__all__ = ["softmax", "attention"]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax: softmax(x)_i = exp(x_i - m) / Σ_j exp(x_j - m), m = max_j x_j.

    Subtracting the max changes nothing mathematically but keeps exp() ≤ 1, so large scores
    cannot overflow. A row with no allowed entry (all -inf) gives zeros, not NaN.
    fp16 and bf16 inputs are computed in fp32 and cast back.
    """
    require_float_tensor(x, "x")
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    m = work.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an all -inf row has no max
    e = torch.exp(work - m)
    total = e.sum(dim=dim, keepdim=True)
    out = e / torch.where(total > 0, total, torch.ones_like(total))  # 0 / 1 = 0 for empty rows
    return out.to(x.dtype)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a clear error unless q (..., T, Dh), k (..., S, Dh), v (..., S, Dv) fit together."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_float_tensor(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name} of shape {fmt_shape(t.shape)} needs at least 2 dims: "
                             f"q (..., T, Dh), k (..., S, Dh), v (..., S, Dv)")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q of shape {fmt_shape(q.shape)} and k of shape {fmt_shape(k.shape)} "
                         f"need the same last dim Dh: q (..., T, Dh), k (..., S, Dh)")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k of shape {fmt_shape(k.shape)} and v of shape {fmt_shape(v.shape)} "
                         f"need the same length S: k (..., S, Dh), v (..., S, Dv)")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dims of q {fmt_shape(q.shape)}, "
                         f"k {fmt_shape(k.shape)} and v {fmt_shape(v.shape)} do not broadcast") from None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive scaled dot-product attention; returns (out, weights).

    q (..., T, Dh), k (..., S, Dh), v (..., S, Dv); mask bool, broadcastable to (..., T, S),
    True = may attend. is_causal applies masks.causal_mask(T, S) (bottom-right aligned:
    query i sees keys j <= i + S - T) and is ANDed with mask. scale defaults to 1/sqrt(Dh).
    A query row with nothing to attend to gets zero weights and a zero output, as in SDPA.
    dropout_p > 0 drops weights (and rescales by 1/(1-p)) whenever it is given, as SDPA does:
    pass `p if module.training else 0.0`.
    Returns out (..., T, Dv) and the weights actually applied to v (..., T, S).
    """
    _check_qkv(q, k, v)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    allowed = _masks.check_mask(mask, scores.shape) if mask is not None else None
    if is_causal:
        T, S = scores.shape[-2:]
        causal = _masks.causal_mask(T, S, device=scores.device)
        allowed = causal if allowed is None else allowed & causal
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = softmax(scores, dim=-1)  # (..., T, S), rows sum to 1 or are all 0
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
