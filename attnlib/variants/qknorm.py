"""QK-norm: RMSNorm on the queries and keys before RoPE, so that attention logits cannot grow with the weights.

Without it, a logit q · k / sqrt(Dh) grows with the scale of W_q and W_k, and a softmax over large logits
saturates to one-hot (chapter 2). With it, the sizes of q and k are set by the norms' weights g:

    q_h <- q_h / rms(q_h) ⊙ g_q,   k_h <- k_h / rms(k_h) ⊙ g_k.

Two placements exist: per head (Qwen3, Gemma 3, Qwen3.5: the rms over each head's Dh features, one
weight (Dh,) shared by all heads) and over the whole projection (OLMo 2: the rms over all H·Dh query
features of a token at once, weight (H·Dh,); H_kv·Dh for the keys).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib.llama_block import RMSNorm
from attnlib.head_layout import merge_heads, split_heads

__all__ = ["QKNorm"]


def _norm_projection(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """x (B, H, T, Dh) normalized over each token's H·Dh features together, back in heads."""
    return split_heads(norm(merge_heads(x)), x.shape[1])  # (B, T, H·Dh) -> (B, H, T, Dh)


class QKNorm(nn.Module):
    """RMSNorm of q (B, H, T, Dh) and k (B, H_kv, T, Dh): per head (weights (Dh,)) or, with
    per_head=False, over the whole projection (weights (H·Dh,) and (H_kv·Dh,))."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, *, per_head: bool = True,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.per_head = per_head
        self.q_norm = RMSNorm(head_dim if per_head else num_heads * head_dim, eps)
        self.k_norm = RMSNorm(head_dim if per_head else num_kv_heads * head_dim, eps)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, k) normalized, shapes unchanged."""
        if self.per_head:
            return self.q_norm(q), self.k_norm(k)
        return _norm_projection(q, self.q_norm), _norm_projection(k, self.k_norm)

    def extra_repr(self) -> str:
        return "per head" if self.per_head else "over the projection"
