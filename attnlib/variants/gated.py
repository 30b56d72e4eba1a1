"""Gated attention (Qiu et al. 2025; Qwen3-Next, Qwen3.5): a sigmoid gate on each head's output, from the input.

    y = Attn(x) ⊙ σ(x W_g),   out = y W_o

One gate per head and channel (W_g: D -> H·Dh), applied after the attention and before W_o. It adds a
non-linearity between W_v and W_o (which are otherwise one low-rank linear map per head) and lets a head
output nearly zero without parking its mass on a sink token: Qiu et al. report the first-token sink
share and the largest activations drop. In Qwen3.5 q_proj computes q and the gate in one matmul, each
head's Dh query rows followed by its Dh gate rows; attnlib keeps the gate as its own projection.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["OutputGate"]


class OutputGate(nn.Module):
    """y ⊙ sigmoid(x W_g + b_g): x (B, T, D) the layer's input, y (B, T, H·Dh) the heads' merged output."""

    def __init__(self, d_model: int, width: int, bias: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, width, bias=bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(B, T, H·Dh) gated elementwise."""
        return y * torch.sigmoid(self.proj(x))
