"""The parts of a Llama-style block: RMSNorm, the SwiGLU feed-forward, and the pre-norm block around attention.

    h = x + Attn(RMSNorm(x)),   out = h + SwiGLU(RMSNorm(h))

attnlib.decoder.LlamaDecoder stacks L of these blocks between the embedding and the output layer;
attnlib.variants and attnlib.hf_hybrid build other models' blocks from the same parts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnlib.mha import MultiHeadAttention
from attnlib.caches import Cache
from attnlib.positional import RotaryEmbedding

__all__ = ["rms_norm", "column_major", "RMSNorm", "SwiGLU", "LlamaBlock"]

_HALF = (torch.float16, torch.bfloat16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · weight over the last dim D, bit-identical to transformers' LlamaRMSNorm.

    F.rms_norm does it in one call. fp16/bf16 are normalized in fp32 and rounded back before the
    weight multiplies them, as transformers does.
    """
    if x.dtype is weight.dtype and x.dtype not in _HALF:
        return F.rms_norm(x, (x.shape[-1],), weight, eps=eps)
    work = x.float() if x.dtype in _HALF else x
    return weight * F.rms_norm(work, (work.shape[-1],), eps=eps).to(x.dtype)


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """The same (out, in) matrix stored column by column: weight.t() is then contiguous (in, out).

    A one-token step computes x (1, in) @ weight.t(); with weight.t() contiguous, BLAS streams it row
    after row of (in, out). Whether that reads faster than the row-major layout depends on the CPU and
    its BLAS: chapter 12 prints both on yours, for SmolLM2's output layer.
    """
    return weight.t().contiguous().t()


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + eps) · w over the last dim D: LayerNorm without the mean
    and the bias. fp16/bf16 inputs are normalized in fp32 (as transformers' Llama does)."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D); a decode step runs 2L + 1 of these on one token."""
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """The gated feed-forward of Llama: SwiGLU(x) = W_down (silu(W_gate x) ⊙ W_up x), D -> D_ff -> D.

    `gate_up` holds W_gate and W_up stacked by rows, D -> 2 D_ff: one matmul instead of two (as the fused
    qkv of MultiHeadAttention), which a one-token decode step feels most. `activation` replaces silu
    (Gemma's GeGLU: the tanh approximation of GELU).
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False, *,
                 activation: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> None:
        super().__init__()
        self.activation = activation
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D) through the hidden width F."""
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (..., 2F) -> (..., F) each
        return self.down(self.activation(gate) * up)


class LlamaBlock(nn.Module):
    """One decoder block. Pre-norm (Llama): x + Attn(RMSNorm(x)), then + SwiGLU(RMSNorm(·)).

    `norms` places the RMSNorms: "pre" (above), "post" (OLMo 2: x + RMSNorm(Attn(x)), then
    + RMSNorm(SwiGLU(·))) or "sandwich" (Gemma 3: x + RMSNorm(Attn(RMSNorm(x))), the same around the MLP).
    `attn` and `mlp` replace the default attention and SwiGLU by any module with their call signature
    (attnlib.variants builds them); d_model, num_heads, ... then only size the norms.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, *, layer_idx: int,
                 rotary: RotaryEmbedding | None, eps: float, attention_bias: bool, mlp_bias: bool,
                 window: int | None = None, attn: nn.Module | None = None, mlp: nn.Module | None = None,
                 norms: str = "pre") -> None:
        super().__init__()
        if norms not in ("pre", "post", "sandwich"):
            raise ValueError(f"norms must be 'pre', 'post' or 'sandwich', got {norms!r}")
        pre, post = norms != "post", norms != "pre"
        self.attn_norm = RMSNorm(d_model, eps) if pre else nn.Identity()
        self.attn = attn if attn is not None else MultiHeadAttention(
            d_model, num_heads, num_kv_heads, bias=attention_bias, layer_idx=layer_idx, rotary=rotary, window=window)
        self.mlp_norm = RMSNorm(d_model, eps) if pre else nn.Identity()
        self.mlp = mlp if mlp is not None else SwiGLU(d_model, d_ff, mlp_bias)
        self.attn_post_norm = RMSNorm(d_model, eps) if post else nn.Identity()
        self.mlp_post_norm = RMSNorm(d_model, eps) if post else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: Cache | None,
                rope: tuple[torch.Tensor, torch.Tensor] | None, weights: list | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); causal attention over the cache and the T new tokens.

        rope: the (cos, sin) of the T tokens' positions. One new token may see every cached key, so
        its (bottom-right) causal mask is all True: skipped, unless a sliding window hides the oldest.
        `weights`, if a list, receives the attention weights (B, H, T, S).
        """
        causal = x.shape[1] > 1 or self.attn.window is not None
        h = self.attn(self.attn_norm(x), mask=mask, is_causal=causal, cache=cache, rope=rope,
                      need_weights=weights is not None)
        if weights is not None:
            h, w = h
            weights.append(w)
        x = x + self.attn_post_norm(h)
        return x + self.mlp_post_norm(self.mlp(self.mlp_norm(x)))
