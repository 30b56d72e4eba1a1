"""RoPE as a transformers config describes it: the frequencies θ_j of plain, linear and YaRN RoPE, partial RoPE.

A config's `rope_parameters` (one dict, or one per layer type in Gemma 3) names a `rope_type` and its
numbers. attnlib models three, each a set of θ_j (j < R/2, R = the rotated width) and a factor on cos, sin:

- "default": θ_j = base^(-2j / R).
- "linear" (position interpolation, Chen et al. 2023): θ_j / factor.
- "yarn" (Peng et al. 2023): high-frequency dims (many turns over the original context) keep θ_j, low
  ones are interpolated to θ_j / factor, with a linear ramp between; cos and sin are multiplied by the
  attention factor 0.1 ln(factor) + 1, which sharpens the softmax (gpt-oss: factor 32).

`partial_rotary_factor` f rotates only R = f · Dh dims of each head (Qwen3.5: 1/4). Any other rope_type
is a ValueError naming it: a different RoPE would be a silently different model.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnlib.positional import RotaryEmbedding

__all__ = ["ROPE_TYPES", "yarn_inv_freq", "rotary_from_config"]

ROPE_TYPES = ("default", "linear", "yarn")


def _correction_dim(turns: float, dim: int, base: float, original_max: int) -> float:
    """The dim index j whose frequency makes `turns` full turns over original_max positions:
    solves original_max · base^(-2j / dim) = 2π · turns for j."""
    return dim * math.log(original_max / (turns * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(base: float, dim: int, factor: float, original_max: int, *, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """YaRN's θ (dim/2,) float32: θ_j = θ_j^int (1 - e_j) + θ_j^ext e_j, with θ^ext = base^(-2j/dim),
    θ^int = θ^ext / factor and e_j = 1 - clamp((j - lo) / (hi - lo), 0, 1), where lo and hi are the dims
    that turn beta_fast and beta_slow times over the original context (rounded out when truncate)."""
    lo, hi = (_correction_dim(b, dim, base, original_max) for b in (beta_fast, beta_slow))
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001  # no zero-width ramp (as transformers)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)              # (dim/2,)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)  # (dim/2,)
    extrapolate = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate


def _yarn_attention_factor(p: dict[str, Any], factor: float) -> float:
    """cos and sin's factor: the config's attention_factor, else mscale(factor) = 0.1 ln(factor) + 1
    (a ratio of two of them when mscale and mscale_all_dim are given, as DeepSeek's configs do)."""
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    if p.get("mscale") and p.get("mscale_all_dim"):
        return mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
    return mscale(factor)


def rotary_from_config(p: dict[str, Any] | None, head_dim: int, max_position_embeddings: int) -> RotaryEmbedding:
    """The RotaryEmbedding a transformers rope_parameters dict describes, for heads of width head_dim."""
    p = dict(p or {})
    kind = p.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r} is not modelled by attnlib (only {', '.join(ROPE_TYPES)}): "
                         f"converting it would give a different model")
    base = float(p.get("rope_theta", 10000.0))
    dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
    inv_freq, scaling = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if kind == "linear":
        inv_freq = inv_freq / p["factor"]
    elif kind == "yarn":
        original = p["original_max_position_embeddings"]
        factor = p.get("factor") or max_position_embeddings / original
        inv_freq = yarn_inv_freq(base, dim, factor, original, beta_fast=p.get("beta_fast") or 32.0,
                                 beta_slow=p.get("beta_slow") or 1.0, truncate=p.get("truncate", True))
        scaling = _yarn_attention_factor(p, factor)
    return RotaryEmbedding(dim, max_position_embeddings, base, inv_freq=inv_freq, attention_scaling=scaling)
