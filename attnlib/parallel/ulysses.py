"""DeepSpeed-Ulysses (Jacobs et al. 2023): trade the sequence split for a head split, attend, trade back.

Each of W ranks holds q, k, v for all H heads and its T/W positions. One all-to-all sends head group g
(heads g·H/W .. (g+1)·H/W - 1) of this block to rank g, so afterwards each rank holds H/W heads for
all T positions: attention per head needs nothing else, so it is plain full attention (causal or not).
A second all-to-all sends the output back to sequence blocks. Heads must divide among the ranks: W must
divide H. Bytes each rank sends per layer, e = bytes per element (MHA-shaped k, v):
(W - 1)/W · (3 + 1) · B·H·(T/W)·Dh·e, i.e. 4(W - 1)/W² · B·T·D·e with D = H·Dh; roughly 4/W of B·T·D·e.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlib._checks import fmt_shape
from attnlib.parallel.comm import all_to_all, world
from attnlib.parallel.ring import check_blocks

__all__ = ["ulysses_attention", "seq_to_heads", "heads_to_seq"]


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(L, B, H, T/W, Dh) sequence-sharded → (L, B, H/W, T, Dh) head-sharded, one all-to-all (L stacked tensors)."""
    _, W = world(group)
    L, B, H, n, Dh = x.shape
    send = x.reshape(L, B, W, H // W, n, Dh).permute(2, 0, 1, 3, 4, 5)  # (W, L, B, H/W, n, Dh): chunk g → rank g
    got = all_to_all(send, group)  # (W, L, B, H/W, n, Dh): chunk j is sequence block j
    return got.permute(1, 2, 3, 0, 4, 5).reshape(L, B, H // W, W * n, Dh)  # (L, B, H/W, T, Dh)


def heads_to_seq(y: torch.Tensor, group=None) -> torch.Tensor:
    """(L, B, H/W, T, Dh) head-sharded → (L, B, H, T/W, Dh) sequence-sharded, the inverse of seq_to_heads."""
    _, W = world(group)
    L, B, h, T, Dh = y.shape
    send = y.reshape(L, B, h, W, T // W, Dh).permute(3, 0, 1, 2, 4, 5)  # (W, L, B, H/W, n, Dh): block j → rank j
    got = all_to_all(send, group)  # (W, L, B, H/W, n, Dh): chunk g is head group g
    return got.permute(1, 2, 0, 3, 4, 5).reshape(L, B, W * h, T // W, Dh)  # (L, B, H, n, Dh)


class _Reshard(torch.autograd.Function):
    """there(x) forward (seq_to_heads or heads_to_seq); the gradient goes back by the inverse, back."""

    @staticmethod
    def forward(ctx, x, there, back, group):
        ctx.back, ctx.group = back, group
        return there(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad.contiguous(), ctx.group), None, None, None


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                      group=None, scale: float | None = None) -> torch.Tensor:
    """This rank's block of softmax(Q Kᵀ·scale) V over the whole sequence, by DeepSpeed-Ulysses.

    q, k, v (B, H, T/W, Dh): rank r's contiguous positions r·T/W ..; returns (B, H, T/W, Dh), equal to
    the same rows of full attention over all T positions (is_causal: query i sees keys j <= i).
    Differentiable (the all-to-alls' gradients are the inverse all-to-alls). Requires W to divide H.
    """
    rank, W = world(group)
    check_blocks(q, k, v, 1)
    B, H, n, Dh = q.shape
    if v.shape[-1] != Dh:
        raise ValueError(f"v of shape {fmt_shape(v.shape)}: Ulysses stacks q, k, v into one all-to-all, "
                         f"so v needs q's head width Dh={Dh}")
    if H % W:
        raise ValueError(f"q of shape {fmt_shape(q.shape)}: Ulysses splits the H={H} heads among {W} ranks, "
                         f"so the number of ranks must divide H; use ring attention, or a number of ranks "
                         f"that divides H")
    qkv = _Reshard.apply(torch.stack((q, k, v)), seq_to_heads, heads_to_seq, group)  # (3, B, H, n, Dh) -> (3, B, H/W, T, Dh)
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    y = F.scaled_dot_product_attention(*qkv.unbind(0), is_causal=is_causal, scale=scale)  # (B, H/W, T, Dh)
    return _Reshard.apply(y.unsqueeze(0), heads_to_seq, seq_to_heads, group)[0]  # (B, H, T/W, Dh)
