"""Turning a multi-head attention (MHA) checkpoint into grouped-query attention (GQA).

Ainslie et al. (2023) convert a trained MHA model to GQA by mean-pooling the key and value heads
within each group of g = H / H_kv heads, then train a little more ("uptraining"). Query head i
meets kv head i // g (repeat_kv's grouping), so kv head j is the mean of heads j·g .. (j+1)·g - 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib._checks import fmt_shape, require_float_tensor
from attnlib.mha import MultiHeadAttention

__all__ = ["mean_pool_kv_heads", "gqa_from_mha"]


def mean_pool_kv_heads(w: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """A K or V projection's H heads averaged within each group of g = H / H_kv consecutive heads.

    w is a weight (H·Dh, D) or a bias (H·Dh,) whose rows are head 0's Dh rows, then head 1's, ...;
    returns (H_kv·Dh, D) or (H_kv·Dh,): row block j is the mean of the blocks of heads j·g .. j·g + g - 1.
    """
    require_float_tensor(w, "w")
    if num_kv_heads < 1 or num_heads % num_kv_heads or w.dim() not in (1, 2) or w.shape[0] % num_heads:
        raise ValueError(f"w of shape {fmt_shape(w.shape)} is not (H·Dh, D) or (H·Dh,) with H=num_heads="
                         f"{num_heads} heads, or num_kv_heads={num_kv_heads} does not divide num_heads")
    g, Dh, rest = num_heads // num_kv_heads, w.shape[0] // num_heads, w.shape[1:]
    grouped = w.reshape(num_kv_heads, g, Dh, *rest)                      # (H_kv, g, Dh, D)
    return grouped.mean(dim=1).reshape(num_kv_heads * Dh, *rest)         # (H_kv·Dh, D)


def gqa_from_mha(mha: MultiHeadAttention, num_kv_heads: int, *,
                 pool: Callable[[torch.Tensor, int, int], torch.Tensor] = mean_pool_kv_heads) -> MultiHeadAttention:
    """A copy of an MHA layer with num_kv_heads key/value heads, each the mean of its group's heads.

    Queries and the output projection are copied unchanged; num_kv_heads = H gives an exact copy.
    pool(w, H, H_kv) -> (H_kv·Dh, ...) may replace the mean (e.g. keep each group's first head).
    """
    if not isinstance(mha, MultiHeadAttention) or mha.num_kv_heads != mha.num_heads:
        raise ValueError("mha must be an attnlib MultiHeadAttention with num_kv_heads == num_heads (MHA)")
    H, D = mha.num_heads, mha.d_model
    gqa = MultiHeadAttention(D, H, num_kv_heads, bias=mha.qkv.bias is not None, dropout=mha.dropout,
                             layer_idx=mha.layer_idx, rotary=mha.rotary)
    gqa = gqa.to(device=mha.qkv.weight.device, dtype=mha.qkv.weight.dtype)
    with torch.no_grad():
        for name in ("weight", "bias"):
            theirs = getattr(mha.qkv, name)
            if theirs is not None:
                q, k, v = theirs.split([D, D, D])                         # rows [W_q; W_k; W_v]
                pooled = [pool(t, H, num_kv_heads) for t in (k, v)]
                getattr(gqa.qkv, name).copy_(torch.cat([q, *pooled]))
        gqa.out.load_state_dict(mha.out.state_dict())
    return gqa.train(mha.training)
