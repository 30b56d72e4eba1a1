"""Multi-head latent attention (MLA, DeepSeek-V2 and V3): the keys and values of all H heads are
rebuilt from one small latent vector per token, and only that latent is cached.

    c_t = RMSNorm(x_t W_DKV)                    (r numbers: the latent, cached)
    k_t^R = RoPE(x_t W_KR)                      (D_R numbers: one rotary key shared by all heads, cached)
    k_t,h = [c_t W_UK,h ; k_t^R],  v_t,h = c_t W_UV,h            (rebuilt per head h)
    q_t,h = [q_t W_UQ,h ; RoPE(q_t W_QR,h)],  q_t = RMSNorm(x_t W_DQ) or x_t

The position lives in a separate (decoupled) D_R-wide part of each query and key, so that at decode
time W_UK can be folded into the query and W_UV into the output (`absorbed`): attention then runs on
the cached latents directly, as multi-query attention with one key head of width r + D_R and one
value head of width r (the latents).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_float_tensor
from attnlib.caches.latent import LatentCache
from attnlib.head_layout import merge_heads
from attnlib.positional import RotaryEmbedding, apply_rope

__all__ = ["MultiHeadLatentAttention", "LatentRMSNorm"]


class LatentRMSNorm(nn.Module):
    """RMSNorm of a latent, x / sqrt(mean(x²) + eps) · w, computed in float32 whatever x's dtype, then
    cast back before w multiplies it: what transformers' DeepseekV3RMSNorm does (in float64 too)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., width) -> (..., width)."""
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention whose keys and values come from a cached latent of width r = kv_lora_rank.

    Query and key heads are D_h + D_R wide (qk_nope_head_dim + qk_rope_head_dim: a part without
    position and a rotary part), value heads D_v wide (v_head_dim). With q_lora_rank set the queries
    also pass through a low-rank latent (q_down, q_norm, q_up), else one projection q_proj.
    Parameters: kv_down D -> r + D_R, kv_norm, kv_up r -> H (D_h + D_v), out H D_v -> D.
    RoPE uses the rotate_half layout; `from_hf` permutes interleaved weights into it.
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None, bias: bool = False,
                 eps: float = 1e-6, rope_base: float = 10000.0, max_position_embeddings: int = 4096,
                 layer_idx: int = 0) -> None:
        super().__init__()
        sizes = dict(d_model=d_model, num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
                     qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank)
        for name, n in sizes.items():
            if name == "q_lora_rank" and n is None:  # no low-rank query path: one projection
                continue
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        self.d_model, self.num_heads, self.kv_lora_rank = d_model, num_heads, kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.q_lora_rank, self.layer_idx = q_lora_rank, layer_idx
        self.scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5  # 1/sqrt of the width q·k runs over
        q_width = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, q_width, bias=False)
        else:
            self.q_down = nn.Linear(d_model, q_lora_rank, bias=bias)
            self.q_norm = LatentRMSNorm(q_lora_rank, eps)
            self.q_up = nn.Linear(q_lora_rank, q_width, bias=False)
        self.kv_down = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_norm = LatentRMSNorm(kv_lora_rank, eps)
        self.kv_up = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out = nn.Linear(num_heads * v_head_dim, d_model, bias=bias)
        self.rotary = RotaryEmbedding(qk_rope_head_dim, max_position_embeddings, rope_base)

    def _queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q_nope (B, H, T, D_h) and q_rope (B, H, T, D_R), not yet rotated."""
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_up(self.q_norm(self.q_down(x)))
        q = q.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, T, H, D_h + D_R) -> (B, H, T, ·)
        return q.split([self.nope_dim, self.rope_dim], dim=-1)

    def _latents(self, x: torch.Tensor, cache: LatentCache | None):
        """The rotated queries and everything the keys and values are rebuilt from, the cache's included:
        q_nope (B, H, T, D_h), q_rope (B, H, T, D_R), latent (B, S, r), k_rope (B, S, D_R)."""
        require_float_tensor(x, "x")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, T, D) with D={self.d_model}")
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"cache must be an attnlib.LatentCache (it stores latents, not keys and values), "
                            f"got {type(cache).__name__}")
        start = cache.get_seq_len(self.layer_idx) if cache is not None else 0
        cos, sin = self.rotary.cos_sin(torch.arange(start, start + x.shape[1], device=x.device))  # (T, D_R)
        q_nope, q_rope = self._queries(x)
        latent, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)  # (B, T, r), (B, T, D_R)
        latent, k_rope = self.kv_norm(latent), apply_rope(k_rope, cos, sin)
        if cache is not None:
            latent, k_rope = cache.update(self.layer_idx, latent, k_rope)  # (B, S_past + T, r), (..., D_R)
        return q_nope, apply_rope(q_rope, cos, sin), latent, k_rope

    def _allowed(self, mask: torch.Tensor | None, is_causal: bool, B: int, T: int, S: int,
                 device: torch.device) -> torch.Tensor | None:
        allowed = _masks.check_mask(mask, (B, self.num_heads, T, S)) if mask is not None else None
        return _masks.combine(allowed, _masks.causal_mask(T, S, device=device)) if is_causal else allowed

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = False,
                cache: LatentCache | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D), every head's keys and values rebuilt from the latents (the training form).

        Positions start at the cache's length. mask: bool, True = may attend, broadcastable to
        (B, H, T, S); is_causal ANDs the bottom-right causal mask.
        """
        q_nope, q_rope, latent, k_rope = self._latents(x, cache)
        B, H, T, _ = q_nope.shape
        S = latent.shape[1]
        k_nope, v = self.kv_up(latent).unflatten(-1, (H, -1)).transpose(1, 2).split(
            [self.nope_dim, self.v_dim], dim=-1)                       # (B, H, S, D_h), (B, H, S, D_v)
        k = torch.cat((k_nope, k_rope[:, None].expand(B, H, S, self.rope_dim)), dim=-1)  # (B, H, S, D_h + D_R)
        q = torch.cat((q_nope, q_rope), dim=-1)                        # (B, H, T, D_h + D_R)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._allowed(mask, is_causal, B, T, S, x.device),
                                           scale=self.scale)           # (B, H, T, D_v)
        return self.out(merge_heads(y))

    def absorbed(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = False,
                 cache: LatentCache | None = None) -> torch.Tensor:
        """forward(x, ...) computed on the latents themselves (the decoding form): the same (B, T, D).

        q·k_nope = q_nope · (W_UK c) = (W_UKᵀ q_nope) · c, so each query head is mapped into latent space
        once and meets the cached latents directly; and Σ a·(W_UV c) = W_UV (Σ a·c), so the values are the
        latents too and W_UV is applied once per head after attention. No per-head key or value is built.
        """
        q_nope, q_rope, latent, k_rope = self._latents(x, cache)
        B, H, T, _ = q_nope.shape
        S = latent.shape[1]
        w_uk, w_uv = self.kv_up.weight.unflatten(0, (H, -1)).split([self.nope_dim, self.v_dim], dim=1)  # (H, D_h, r), (H, D_v, r)
        q_latent = torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk)          # (B, H, T, r): W_UK folded into q
        q = torch.cat((q_latent, q_rope), dim=-1)                        # (B, H, T, r + D_R)
        k = torch.cat((latent, k_rope), dim=-1)[:, None]                 # (B, 1, S, r + D_R): one kv head
        y = F.scaled_dot_product_attention(q, k, latent[:, None], enable_gqa=True, scale=self.scale,
                                           attn_mask=self._allowed(mask, is_causal, B, T, S, x.device))  # (B, H, T, r)
        y = torch.einsum("bhtr,hvr->bthv", y, w_uv)                      # (B, T, H, D_v): W_UV per head
        return self.out(y.flatten(2))                                    # (B, T, H·D_v) -> (B, T, D)

    @classmethod
    def from_hf(cls, attn: nn.Module) -> MultiHeadLatentAttention:
        """A copy of a transformers DeepseekV3Attention's weights (same dtype and device).

        With config.rope_interleave the rotary features come in pairs (0, 1), (2, 3), ...; their rows
        of the projections are permuted into the rotate_half layout (0, 2, 4, ..., 1, 3, ...), where
        pair (2i, 2i + 1) becomes pair (i, i + D_R/2), turned by the same angle.
        """
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

        from attnlib.mla_hf import copy_deepseek  # it imports this module

        if not isinstance(attn, DeepseekV3Attention):
            raise TypeError(f"attn must be a transformers DeepseekV3Attention, got {type(attn).__name__}")
        return copy_deepseek(cls, attn, rope_interleave=attn.config.rope_interleave)
