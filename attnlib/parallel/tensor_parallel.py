"""Tensor-parallel attention heads (Megatron-LM, Shoeybi et al. 2019): each rank owns H/W of the heads.

Heads never look at each other until W_o mixes them, so rank r keeps the rows of W_q, W_k, W_v that make
its heads (column parallel: each rank computes its own slice of the projections' outputs) and the columns
of W_o that read them (row parallel). Then out = Σ_r (heads_r W_o^r) + b: one all-reduce per layer, of
(B, T, D); each rank sends 2(W - 1)/W · B·T·D·e bytes (e bytes per element) in a ring all-reduce.
GQA: rank r's query heads r·H/W .. need key/value heads (r·H/W) // g .. with g = H / H_kv. If W divides
H_kv each rank owns H_kv/W of them; if H_kv divides W (MQA included) each key/value head is copied to the
W/H_kv ranks whose query heads use it. Every rank must be given the same x: check_inputs=True verifies it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_dims, require_float_tensor
from attnlib.head_layout import merge_heads, split_heads
from attnlib.mha import MultiHeadAttention
from attnlib.parallel.comm import all_reduce, world

__all__ = ["TensorParallelAttention", "head_ranges", "qkv_rows"]


class _CopyToRanks(torch.autograd.Function):
    """Megatron's f: identity forward; backward sums the ranks' gradients of x (each rank saw x)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _SumOverRanks(torch.autograd.Function):
    """Megatron's g: all-reduce forward; backward passes the (identical) gradient through."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _check_same_input(x: torch.Tensor, group) -> None:
    """Raise ValueError on every rank if the ranks' x differ: one all-reduce (max) of a fingerprint
    f = (numel, Σx, Σ w_i x_i, max|x|) and of -f gives every rank the max and the min of each entry."""
    xd = x.detach().double().flatten()
    w = torch.linspace(1.0, 2.0, xd.numel(), dtype=torch.float64)
    fp = torch.stack([xd.new_tensor(float(xd.numel())), xd.sum(), (xd * w).sum(), xd.abs().amax()])
    hi = all_reduce(torch.cat((fp, -fp)), group, op="max")
    if not torch.equal(hi[:4], -hi[4:]):
        raise ValueError(f"x of shape {fmt_shape(x.shape)} differs between ranks (its sum ranges from "
                         f"{-float(hi[5]):.6g} to {float(hi[1]):.6g}): tensor parallelism needs the same x on "
                         f"every rank (seed the random draw, or broadcast x from rank 0)")


def head_ranges(num_heads: int, num_kv_heads: int, rank: int, world_size: int) -> tuple[range, range]:
    """(query heads, key/value heads) that rank owns when num_heads are split among world_size ranks."""
    if num_heads % world_size:
        raise ValueError(f"num_heads={num_heads} heads cannot be split evenly among {world_size} ranks: "
                         f"tensor parallelism needs num_heads % world_size == 0")
    if num_kv_heads % world_size and world_size % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} key/value heads among {world_size} ranks: either "
                         f"world_size must divide them (each rank owns some) or they must divide world_size "
                         f"(each is copied to the ranks whose query heads use it)")
    g, a, b = num_heads // num_kv_heads, rank * num_heads // world_size, (rank + 1) * num_heads // world_size
    return range(a, b), range(a // g, (b - 1) // g + 1)


def qkv_rows(w: torch.Tensor, num_heads: int, num_kv_heads: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's rows of a fused projection [W_q; W_k; W_v], weight ((H + 2 H_kv)·Dh, D) or bias
    ((H + 2 H_kv)·Dh,): its query heads' rows of W_q, then its key/value heads' rows of W_k and of W_v."""
    heads, kv_heads = head_ranges(num_heads, num_kv_heads, rank, world_size)
    Dh = w.shape[0] // (num_heads + 2 * num_kv_heads)
    q, k, v = w.split([num_heads * Dh, num_kv_heads * Dh, num_kv_heads * Dh])  # rows [q; k; v]
    return torch.cat([q[heads.start * Dh:heads.stop * Dh], k[kv_heads.start * Dh:kv_heads.stop * Dh],
                      v[kv_heads.start * Dh:kv_heads.stop * Dh]])


class TensorParallelAttention(nn.Module):
    """This rank's share of a MultiHeadAttention: its query heads, the key/value heads they use, and the
    matching columns of W_o. forward(x) with the same x on every rank equals the whole layer's output."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None, *, bias: bool = True,
                 group=None, rotary: nn.Module | None = None, window: int | None = None,
                 dropout: float = 0.0, check_inputs: bool = False) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.rank, self.world_size = world(group)
        self.heads, self.kv_heads = head_ranges(num_heads, num_kv_heads, self.rank, self.world_size)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.group, self.rotary, self.window, self.dropout = group, rotary, window, dropout
        self.check_inputs = check_inputs
        width = (len(self.heads) + 2 * len(self.kv_heads)) * self.head_dim
        self.qkv = nn.Linear(d_model, width, bias=bias)                            # column parallel
        self.out = nn.Linear(len(self.heads) * self.head_dim, d_model, bias=False)  # row parallel
        self.out_bias = nn.Parameter(torch.zeros(d_model)) if bias else None       # added once, after the sum

    @classmethod
    def from_module(cls, mha: MultiHeadAttention, group=None, *, check_inputs: bool = False) -> TensorParallelAttention:
        """This rank's share of mha's weights: rows of qkv (its q heads, then its k and v heads), columns of out."""
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"mha must be an attnlib MultiHeadAttention, got {type(mha).__name__}")
        bias = mha.qkv.bias is not None
        tp = cls(mha.d_model, mha.num_heads, mha.num_kv_heads, bias=bias, group=group, rotary=mha.rotary,
                 window=mha.window, dropout=mha.dropout, check_inputs=check_inputs)
        tp = tp.to(device=mha.qkv.weight.device, dtype=mha.qkv.weight.dtype)
        shard = lambda w: qkv_rows(w, mha.num_heads, mha.num_kv_heads, tp.rank, tp.world_size)  # noqa: E731
        with torch.no_grad():
            tp.qkv.weight.copy_(shard(mha.qkv.weight))
            tp.out.weight.copy_(mha.out.weight[:, tp.heads.start * mha.head_dim:tp.heads.stop * mha.head_dim])
            if bias:
                tp.qkv.bias.copy_(shard(mha.qkv.bias))
                tp.out_bias.copy_(mha.out.bias)
        return tp.train(mha.training)

    def _local_mask(self, mask: torch.Tensor | None, B: int, T: int, is_causal: bool) -> torch.Tensor | None:
        """The mask for this rank's heads: a per-head mask (.., H, T, S) keeps its heads' slice."""
        allowed = _masks.check_mask(mask, (B, self.num_heads, T, T)) if mask is not None else None
        if allowed is not None and allowed.dim() >= 3 and allowed.shape[-3] == self.num_heads > 1:
            allowed = allowed[..., self.heads.start:self.heads.stop, :, :]
        if is_causal:
            window = self.window if self.window is not None and self.window < T else None
            allowed = _masks.combine(allowed, _masks.causal_mask(T, T, window=window, device=mask.device
                                                                 if mask is not None else None))
        return allowed

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = False) -> torch.Tensor:
        """x (B, T, D), the same on every rank → (B, T, D), the whole layer's self-attention output.

        mask: bool, True = may attend, broadcastable to (B, H, T, T); is_causal ANDs the causal mask.
        """
        require_float_tensor(x, "x")
        require_dims(x, "x", 3, f"(B, T, D) with D={self.d_model}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, T, D) with D={self.d_model}")
        if self.check_inputs:
            _check_same_input(x, self.group)
        B, T, _ = x.shape
        h, h_kv, Dh = len(self.heads), len(self.kv_heads), self.head_dim
        q, k, v = self.qkv(_CopyToRanks.apply(x, self.group)).split([h * Dh, h_kv * Dh, h_kv * Dh], dim=-1)
        q, k, v = split_heads(q, h), split_heads(k, h_kv), split_heads(v, h_kv)  # (B, h, T, Dh), (B, h_kv, T, Dh)
        if self.rotary is not None:  # positions 0 .. T-1, as the layer without a cache
            qk = self.rotary(torch.cat((q, k), dim=1), torch.arange(T, device=x.device))
            q, k = qk.split([h, h_kv], dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._local_mask(mask, B, T, is_causal),
                                           dropout_p=self.dropout if self.training else 0.0, enable_gqa=h > h_kv)
        out = _SumOverRanks.apply(self.out(merge_heads(y)), self.group)  # Σ over ranks of (B, T, D)
        return out if self.out_bias is None else out + self.out_bias
