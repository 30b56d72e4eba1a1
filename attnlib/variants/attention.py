"""One attention layer with the 2025 variants as options: attnlib's MultiHeadAttention plus what a model adds.

The steps, each option in brackets::

    q, k, v = x W_qkv                       H, H_kv, H_kv heads of width Dh
    q, k    = QKNorm(q, k)                  [qk_norm: Qwen3, OLMo 2, Gemma 3, Qwen3.5]
    q, k    = RoPE(q, k)                    [rotary per layer: none (NoPE), partial, YaRN, two bases]
    y       = kernel(q, k, v, mask, scale)  [SDPA, learned sinks, or differential attention]
    out     = (y ⊙ σ(x W_g)) W_o            [gate: Qwen3.5]

The mask is causal (bottom-right, over the cache), within the layer's window if it has one, and ANDed
with a padding mask. The projections, the cache, RoPE and the masks are MultiHeadAttention's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib.caches import Cache
from attnlib.head_layout import merge_heads
from attnlib.mha import MultiHeadAttention
from attnlib.variants.gated import OutputGate
from attnlib.variants.qknorm import QKNorm

__all__ = ["VariantAttention"]


class VariantAttention(MultiHeadAttention):
    """A decoder's causal self-attention (H query heads, H_kv key/value heads of width Dh) with options.

    qk_norm: a QKNorm applied before RoPE. kernel: a module (q, k, v, allowed, scale) -> (B, H', T, Dv')
    whose heads merge to width H·Dh (SinkAttention, DifferentialAttention); None is SDPA. gate: an
    OutputGate on the merged heads. scale: the logits' factor (default 1/sqrt(Dh); Gemma 3:
    query_pre_attn_scalar^(-1/2)). `m(x)` is causal over positions 0..T-1 (after the cache, with one).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, *, head_dim: int, bias: bool = False,
                 layer_idx: int = 0, rotary: nn.Module | None = None, window: int | None = None,
                 qk_norm: QKNorm | None = None, kernel: nn.Module | None = None, gate: OutputGate | None = None,
                 scale: float | None = None) -> None:
        super().__init__(d_model, num_heads, num_kv_heads, bias=bias, layer_idx=layer_idx, rotary=rotary,
                         window=window, head_dim=head_dim)
        self.qk_norm, self.kernel, self.gate = qk_norm, kernel, gate
        self.scale = head_dim ** -0.5 if scale is None else scale

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None, *,
                is_causal: bool = True, cache: Cache | None = None, need_weights: bool = False,
                positions: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D). mask: bool, True = may attend, broadcastable to (B, H, T, S), ANDed
        with the causal (and window) mask unless is_causal=False. positions / rope as in MultiHeadAttention."""
        if context is not None or need_weights:
            raise ValueError("a VariantAttention is self-attention that returns its output only: "
                             "context and need_weights=True are not supported")
        self._check_inputs(x, None, cache)
        q, k, v = self._project(x, None)                     # (B, H, T, Dh), (B, H_kv, T, Dh) twice
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        q, k = self._rotate(q, k, cache, positions, rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)        # (B, H_kv, S, Dh)
        B, _, T, _ = q.shape
        S = k.shape[2]
        allowed = self._given_mask(mask, cache, B, T, S)
        if is_causal:
            window = self.window if self.window is not None and self.window < S else None
            allowed = _masks.combine(allowed, _masks.causal_mask(T, S, window=window, device=x.device))
        if self.kernel is not None:
            y = self.kernel(q, k, v, allowed, self.scale)    # (B, H', T, Dv'), H'·Dv' = H·Dh
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale,
                                               enable_gqa=self.num_heads > self.num_kv_heads)
        y = merge_heads(y)                                   # (B, H', T, Dv') -> (B, T, H·Dh)
        if self.gate is not None:
            y = self.gate(x, y)
        return self.out(y)
