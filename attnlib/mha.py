"""Multi-head attention: H heads of width Dh = D / H, each attending on its own, then mixed by W_o.

    head_i = attention(x W_q^i, c W_k^g(i), c W_v^g(i)),   out = concat(head_1..head_H) W_o

c is x for self-attention and the context for cross-attention. With num_kv_heads = H_kv < H,
query head i uses key/value head g(i) = i // (H / H_kv): grouped-query attention (GQA); H_kv = 1
is multi-query attention (MQA); H_kv = H is plain multi-head attention (MHA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_dims, require_float_tensor
from attnlib.attention import attention
from attnlib.caches import KVCache
from attnlib.head_layout import merge_heads, repeat_kv, split_heads
from attnlib.positional import apply_rope

__all__ = ["MultiHeadAttention"]  # split_heads, merge_heads, repeat_kv: attnlib.head_layout, importable from here


def _attention_no_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       allowed: torch.Tensor | None, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """attention(q, k, v, allowed, dropout_p=dropout_p) when no gradient is needed (test_mha: equal).

    q (B, H, T, Dh), k (B, H_kv, S, Dh), v (B, H_kv, S, Dv). The scores, the weights and the dropout
    share one (B, H, T, S) buffer, written in place, instead of a fresh tensor per step. GQA needs no
    repeat_kv: the g = H / H_kv query heads of a group are stacked along time, so one matmul per
    kv head serves its whole group: (B·H_kv, g·T, Dh) @ (B·H_kv, Dh, S).
    """
    B, H, T, Dh = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    q = q.reshape(B * H_kv, H // H_kv * T, Dh)  # (B, H, T, Dh) -> (B·H_kv, g·T, Dh)
    scores = q.new_empty(B * H_kv, H // H_kv * T, S)
    torch.baddbmm(scores, q, k.reshape(B * H_kv, S, Dh).transpose(1, 2), beta=0.0, alpha=Dh ** -0.5,
                  out=scores)  # Q Kᵀ / sqrt(Dh), written into the buffer
    weights = scores.view(B, H, T, S)
    if allowed is not None:
        weights.masked_fill_(~allowed, float("-inf"))
    torch.softmax(weights, dim=-1, out=weights)
    if allowed is not None and not bool(allowed.any(dim=-1).all()):
        weights.masked_fill_(~allowed.any(dim=-1, keepdim=True), 0.0)  # empty rows: NaN -> 0, as attention()
    if dropout_p > 0.0:
        F.dropout(weights, dropout_p, inplace=True)
    out = torch.bmm(scores, v.reshape(B * H_kv, S, v.shape[-1]))  # (B·H_kv, g·T, Dv)
    return out.view(B, H, T, -1), weights


class MultiHeadAttention(nn.Module):
    """Self- and cross-attention with H query heads and H_kv key/value heads (MHA, GQA, MQA).

    Parameters: `qkv`, one fused projection D -> (H + 2 H_kv) Dh whose output rows are ordered
    [q; k; v], and `out`, D -> D. `rotary` (an attnlib.positional.RotaryEmbedding) rotates q and k
    by their positions before the cache, as in Llama. `window` (Mistral's sliding window): with
    is_causal, each query sees only the last `window` keys up to itself (masks.causal_mask).
    `head_dim` Dh defaults to D / H; another value (Qwen3, Gemma 3) makes qkv D -> (H + 2 H_kv) Dh
    and `out` H·Dh -> D.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None, *,
                 bias: bool = True, dropout: float = 0.0, layer_idx: int = 0,
                 rotary: nn.Module | None = None, window: int | None = None, head_dim: int | None = None) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1):
            raise ValueError(f"head_dim must be an int >= 1 or None (d_model / num_heads), got {head_dim!r}")
        if num_heads < 1 or d_model < 1 or (head_dim is None and d_model % num_heads):
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                             f"each head gets Dh = d_model / num_heads")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads} "
                             f"(MHA: equal, GQA: a divisor, MQA: 1)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be an int >= 1 (keys a query sees, itself included) or None, got {window!r}")
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.dropout, self.layer_idx, self.rotary, self.window = dropout, layer_idx, rotary, window
        self.qkv = nn.Linear(d_model, (num_heads + 2 * num_kv_heads) * self.head_dim, bias=bias)
        self.out = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def _project(self, x: torch.Tensor, context: torch.Tensor | None):
        """q (B, H, T, Dh), k and v (B, H_kv, S, Dh) from x (B, T, D) and the context (B, S, D)."""
        D, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if context is None:
            q, k, v = self.qkv(x).split([D, kv, kv], dim=-1)  # one matmul: (B, T, D + 2 kv)
        else:
            w_q, w_kv = self.qkv.weight.split([D, 2 * kv])
            b_q, b_kv = self.qkv.bias.split([D, 2 * kv]) if self.qkv.bias is not None else (None, None)
            q = F.linear(x, w_q, b_q)                                      # (B, T, D)
            k, v = F.linear(context, w_kv, b_kv).split([kv, kv], dim=-1)  # (B, S, kv) each
        return (split_heads(q, self.num_heads), split_heads(k, self.num_kv_heads),
                split_heads(v, self.num_kv_heads))

    def _check_inputs(self, x: torch.Tensor, context: torch.Tensor | None, cache: KVCache | None) -> None:
        require_float_tensor(x, "x")
        require_dims(x, "x", 3, f"(B, T, D) with D={self.d_model}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, T, D) with D={self.d_model}")
        if context is not None:
            require_float_tensor(context, "context")
            if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != self.d_model:
                raise ValueError(f"context of shape {fmt_shape(context.shape)} is not (B, S, D) with "
                                 f"B={x.shape[0]}, D={self.d_model}")
            if cache is not None:
                raise ValueError("cache is for self-attention; cross-attention (context given) "
                                 "recomputes its keys and values")
            if self.rotary is not None:
                raise ValueError("rotary is for self-attention: with a context, the keys' positions "
                                 "are not the queries' positions")

    def _rotate(self, q: torch.Tensor, k: torch.Tensor, cache: KVCache | None, positions: torch.Tensor | None,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, T, Dh) and k (B, H_kv, T, Dh) rotated by `rotary` at `positions` (default: after the
        cache) or by the given rope = (cos, sin); unchanged without a rotary embedding (NoPE)."""
        if self.rotary is None:
            if rope is not None:
                raise ValueError("rope was given, but this layer has no rotary embedding to apply")
            return q, k
        if rope is None and positions is None:
            start = cache.get_seq_len(self.layer_idx) if cache is not None else 0
            positions = torch.arange(start, start + q.shape[2], device=q.device)
        qk = torch.cat((q, k), dim=1)  # q and k share positions: one rotation of (B, H + H_kv, T, Dh)
        qk = self.rotary(qk, positions) if rope is None else apply_rope(qk, *rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k

    def _given_mask(self, mask: torch.Tensor | None, cache: KVCache | None, B: int, T: int,
                    S: int) -> torch.Tensor | None:
        """The caller's mask checked against (B, H, T, S); when a rolling cache returned only the latest S
        of the positions it has seen, a mask over all of them applies by its last S keys."""
        if isinstance(mask, torch.Tensor) and cache is not None and S < mask.shape[-1] == cache.get_seq_len(self.layer_idx):
            mask = mask[..., -S:]                      # (B, 1, 1, S)
        return _masks.check_mask(mask, (B, self.num_heads, T, S)) if mask is not None else None

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, is_causal: bool = False,
                cache: KVCache | None = None, need_weights: bool = False,
                positions: torch.Tensor | None = None, rope: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x (B, T, D), context (B, S, D) or None (self-attention) -> (B, T, D).

        mask: bool, True = may attend, broadcastable to (B, H, T, S); is_causal ANDs the bottom-right
        causal mask (and the sliding window, if the layer has one). With a cache, the T new tokens
        attend to the positions it returns as well; when it returns only the latest S of the positions
        seen (a KVCache under a sliding window), a mask over all of them applies by its last S keys.
        positions (T,) or (B, T): where the T tokens stand, for `rotary` (default: after the cache);
        or rope = rotary.cos_sin(positions), looked up once by a decoder for all its layers.
        need_weights=True also returns the weights (B, H, T, S) actually applied to V.
        """
        self._check_inputs(x, context, cache)
        q, k, v = self._project(x, context)
        q, k = self._rotate(q, k, cache, positions, rope)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, H_kv, S_past + T, Dh)
        B, _, T, _ = q.shape
        S = k.shape[2]
        allowed = self._given_mask(mask, cache, B, T, S)
        p = self.dropout if self.training else 0.0
        window = self.window if self.window is not None and self.window < S else None  # None: hides nothing
        if not need_weights and is_causal and allowed is None and T == S and window is None:  # top-left == bottom-right
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                               enable_gqa=self.num_heads > self.num_kv_heads)
            return self.out(merge_heads(y))
        if is_causal and (T > 1 or window is not None or self.window is None):
            allowed = _masks.combine(allowed, _masks.causal_mask(T, S, window=window, device=x.device))
        if not need_weights:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p,
                                               enable_gqa=self.num_heads > self.num_kv_heads)
            return self.out(merge_heads(y))  # (B, H, T, Dh) -> (B, T, D) -> W_o
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            n_rep = self.num_heads // self.num_kv_heads  # the readable reference, autograd-friendly
            y, weights = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), allowed, dropout_p=p)
        else:
            y, weights = _attention_no_grad(q, k, v, allowed, p)
        return self.out(merge_heads(y)), weights

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of an nn.MultiheadAttention's weights (attnlib is always batch-first)."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"m must be an nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim:
            raise ValueError(f"kdim={m.kdim} / vdim={m.vdim} differ from embed_dim={m.embed_dim}: "
                             f"attnlib projects keys and values from width D only")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not modelled by attnlib")
        ours = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout)
        ours = ours.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        with torch.no_grad():
            ours.qkv.weight.copy_(m.in_proj_weight)  # rows [W_q; W_k; W_v], as ours
            ours.out.weight.copy_(m.out_proj.weight)
            if m.in_proj_bias is not None:
                ours.qkv.bias.copy_(m.in_proj_bias)
                ours.out.bias.copy_(m.out_proj.bias)
        return ours.train(m.training)
