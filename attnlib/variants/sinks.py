"""Learned attention sinks (gpt-oss): a logit s_h per head that joins each softmax's denominator.

    p_ij = exp(a_ij) / (exp(s_h) + Σ_j' exp(a_ij')),   out_i = Σ_j p_ij v_j,   a_ij = q_i · k_j · scale

The sink is a key with no value: the mass exp(s_h) / (...) it takes is simply not spent, so the
weights of a row may sum to less than one, and a head can attend to (almost) nothing. Models without
it grow such a sink on their first token by themselves (Xiao et al. 2023; chapter 12).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib.head_layout import repeat_kv

__all__ = ["SinkAttention"]


class SinkAttention(nn.Module):
    """The attention kernel of a layer with learned sinks: `sinks` (H,), one logit per query head."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.sinks = nn.Parameter(torch.zeros(num_heads))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                scale: float) -> torch.Tensor:
        """q (B, H, T, Dh), k (B, H_kv, S, Dh), v (B, H_kv, S, Dv), allowed (.., T, S) bool -> (B, H, T, Dv).

        A row that may attend to nothing puts all its mass on the sink: its output is zero, not NaN.
        """
        B, H, T, _ = q.shape
        n_rep = H // k.shape[1]
        scores = q @ repeat_kv(k, n_rep).transpose(-2, -1) * scale               # (B, H, T, S)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        sink = self.sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, T, 1)   # (B, H, T, 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]  # sink column dropped
        return weights @ repeat_kv(v, n_rep)                                      # (B, H, T, Dv)
