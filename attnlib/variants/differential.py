"""Differential attention (Ye et al. 2024, DIFF Transformer), in transformers' DiffLlama layout.

Two softmax maps are subtracted, so that attention both maps give to irrelevant context (noise)
cancels, as a differential amplifier cancels common-mode noise:

    DiffAttn(X) = (softmax(Q1 K1ᵀ · s) - λ softmax(Q2 K2ᵀ · s)) V,   λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init

with λ_init = 0.8 - 0.6 exp(-0.3 l) at layer l; each pair's output (width 2·Dh) is RMS-normalized (a
group norm per pair, no weight) and multiplied by (1 - λ_init). In DiffLlama query heads i and i + H/2
form pair i (keys: their GQA groups); the values of a pair are both halves of V's kv heads side by side:
the kv heads are split in two, V1 = the first half, V2 = the second, each pair reads [V1_g, V2_g] with
g its group's kv head modulo H_kv/2. So H heads of width Dh give H/2 outputs of width 2·Dh.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DifferentialAttention", "lambda_init"]


def lambda_init(layer_idx: int) -> float:
    """λ_init = 0.8 - 0.6 exp(-0.3 l): the DIFF Transformer's schedule over the layer index l."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class DifferentialAttention(nn.Module):
    """The attention kernel of a differential layer: λ's four vectors (Dh,) and the fixed λ_init."""

    def __init__(self, head_dim: int, layer_idx: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.lambda_init, self.eps = lambda_init(layer_idx), eps
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(head_dim)) for _ in range(4))

    def lam(self) -> torch.Tensor:
        """λ = exp(λ_q1 · λ_k1) - exp(λ_q2 · λ_k2) + λ_init, a scalar."""
        dot = lambda a, b: torch.exp(torch.sum(a * b, dim=-1, dtype=torch.float32))  # noqa: E731
        return dot(self.lambda_q1, self.lambda_k1) - dot(self.lambda_q2, self.lambda_k2) + self.lambda_init

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                scale: float) -> torch.Tensor:
        """q (B, H, T, Dh), k and v (B, H_kv, S, Dh), allowed (.., T, S) bool -> (B, H/2, T, 2·Dh)."""
        H, H_kv = q.shape[1], k.shape[1]
        if H % 2 or H_kv % 2:
            raise ValueError(f"differential attention pairs heads: H={H} and H_kv={H_kv} must be even")
        v1, v2 = v.chunk(2, dim=1)                                   # (B, H_kv/2, S, Dh) each
        pair_v = torch.cat((v1, v2), dim=-1).repeat(1, 2, 1, 1)      # (B, H_kv, S, 2·Dh)
        y = F.scaled_dot_product_attention(q, k, pair_v, attn_mask=allowed, scale=scale,
                                           enable_gqa=H > H_kv)       # (B, H, T, 2·Dh): both maps times V
        y1, y2 = y.chunk(2, dim=1)                                   # heads i and i + H/2: (B, H/2, T, 2·Dh)
        diff = y1 - self.lam().to(y.dtype) * y2
        return (1 - self.lambda_init) * F.rms_norm(diff, (diff.shape[-1],), eps=self.eps)
