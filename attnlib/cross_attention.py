"""Cross-attention whose keys and values are computed once per source, for cached decoding.

In an encoder-decoder, every decoder layer's cross-attention projects the memory (the encoder's
output, (B, S, D)) to keys and values. The memory does not change while one source is decoded, so
a decoder projects it once (memory_kv) and each step computes only its queries (attend_memory).
Both use the cross-attention module's own weights: attnlib's MultiHeadAttention keeps them in one
fused projection `qkv` whose rows are [W_q; W_k; W_v].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlib.caches import KVCache
from attnlib.head_layout import merge_heads, split_heads
from attnlib.mha import MultiHeadAttention

__all__ = ["DecoderCache", "memory_kv", "attend_memory"]


def memory_kv(attn: MultiHeadAttention, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values cross-attention `attn` computes from memory (B, S, D), with attn's own weights.

    k, v (B, H_kv, S, Dh) each: rows [W_k; W_v] of attn.qkv (its rows are [W_q; W_k; W_v]) applied to
    the memory. They depend on the source only, so a decoder computes them once per source.
    """
    D = attn.d_model
    bias = attn.qkv.bias[D:] if attn.qkv.bias is not None else None
    k, v = F.linear(memory, attn.qkv.weight[D:], bias).chunk(2, dim=-1)  # (B, S, H_kv·Dh) each
    return split_heads(k, attn.num_kv_heads), split_heads(v, attn.num_kv_heads)


def attend_memory(attn: MultiHeadAttention, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """attn(x, memory, mask) for x (B, T, D) when kv = memory_kv(attn, memory) is already computed -> (B, T, D)."""
    D = attn.d_model
    bias = attn.qkv.bias[:D] if attn.qkv.bias is not None else None
    q = split_heads(F.linear(x, attn.qkv.weight[:D], bias), attn.num_heads)  # (B, H, T, Dh)
    k, v = kv
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=attn.dropout if attn.training else 0.0,
                                       enable_gqa=attn.num_heads > attn.num_kv_heads)
    return attn.out(merge_heads(y))  # (B, H, T, Dh) -> (B, T, D) -> W_o


class DecoderCache:
    """What cached decoding keeps: `self_attn`, a KVCache of every decoder layer's self-attention keys
    and values (one position more per step), and `cross`, each layer's memory_kv (computed at the first
    step). One cache belongs to one source batch: start a new DecoderCache() for another source."""

    def __init__(self) -> None:
        self.self_attn = KVCache()
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def seq_len(self) -> int:
        """Target positions decoded so far."""
        return self.self_attn.seq_len

    def __repr__(self) -> str:
        return f"DecoderCache(seq_len={self.seq_len}, cross layers={len(self.cross)})"
