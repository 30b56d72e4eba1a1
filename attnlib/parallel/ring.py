"""Ring attention (Liu et al. 2023): each rank keeps its queries; the key/value blocks travel a ring.

W ranks each hold a block of the sequence (attnlib.parallel.layout). In step t = 0 .. W-1 rank r holds
the keys and values of rank (r - t) mod W: it attends its queries to them with chapter 9's tiled
attention, which gives each query a normalized output o and its log-sum-exp λ = log Σ_j exp(s_j), and
passes the block on to rank r + 1. (o, λ) is a partial softmax result with m = λ, l = 1, acc = o, so
chapter 9's merge_partials folds the W partial results into the output over the whole sequence.

Backward (as chapter 9's tiled backward, recomputing): with the final λ and δ = rowsum(dO ∘ O), both
per-query numbers over the whole row, each block's share of dq, dk, dv is exact on its own. The key/value blocks travel the ring again, now with
their dk, dv accumulators, and a last step brings each accumulator home: every rank runs the same
ring_shift calls in the same order. Bytes each rank sends per layer, e = bytes per element:
forward 2(W - 1)·B·H·(T/W)·Dh·e, backward (4(W - 1) + 2)·B·H·(T/W)·Dh·e (Dv = Dh).
"""

from __future__ import annotations

import math

import torch

from attnlib._checks import fmt_shape, require_float_tensor
from attnlib.parallel.comm import record_scores, ring_shift, world
from attnlib.parallel.layout import causal_pairs, chunk_ids
from attnlib.tiled import _forward, backward_rows
from attnlib.tiles import merge_partials

__all__ = ["ring_attention", "check_blocks"]

_LN2 = math.log(2.0)


def check_blocks(q: object, k: object, v: object, chunks: int) -> None:
    """Raise unless q, k (B, H, n, Dh) and v (B, H, n, Dv) are one rank's blocks, n divisible by `chunks`."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_float_tensor(x, name)
        if x.dim() != 4:
            raise ValueError(f"{name} of shape {fmt_shape(x.shape)} is not (B, H, T/world, Dh): this rank's block")
    if k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, v {fmt_shape(v.shape)}: expected "
                         f"k of q's shape and v (B, H, T/world, Dv) with q's B, H, T/world (repeat_kv first for GQA)")
    if q.shape[2] % chunks:
        raise ValueError(f"q of shape {fmt_shape(q.shape)}: this rank's {q.shape[2]} positions are not "
                         f"divisible into {chunks} chunks (layout 'zigzag' holds 2 chunks per rank)")


def _as_partial(out: torch.Tensor, lse2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(m, l, acc) of a normalized block result: m = λ (natural log), l = 1, acc = out; an empty row
    (λ2 = +inf from tiled attention) becomes (-inf, 0, 0)."""
    empty = torch.isinf(lse2)
    return (lse2 * _LN2).masked_fill(empty, float("-inf")), (~empty).to(out.dtype), out


def _finish(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out = acc / l and λ2 = log2 Σ exp(s) from a merged state (an empty row: 0 and +inf)."""
    empty = l == 0
    out = acc / l.masked_fill(empty, 1.0).unsqueeze(-1)
    return out, ((m + torch.log(l)) / _LN2).masked_fill(empty, float("inf"))


class _RingAttention(torch.autograd.Function):
    """q3 (N, n, Dh), k3 (N, n, Dh), v3 (N, n, Dv) → out (N, n, Dv); N = B·H."""

    @staticmethod
    def forward(ctx, q3, k3, v3, batch, is_causal, layout, group, scale):
        rank, W = world(group)
        n_q, Dh = len(chunk_ids(rank, W, layout)), k3.shape[-1]
        c = q3.shape[1] // n_q  # positions per chunk
        N, tk = q3.shape[0], min(128, c)
        states = [(q3.new_full((N, c), float("-inf")), q3.new_zeros(N, c), q3.new_zeros(N, c, v3.shape[-1]))
                  for _ in range(n_q)]
        kv = torch.cat((k3, v3), dim=-1)  # (N, n, Dh + Dv): one message per step
        for t in range(W):
            for i, j, kind in causal_pairs(rank, (rank - t) % W, W, layout, is_causal):
                k_j, v_j = kv[:, j * c:(j + 1) * c].split([Dh, v3.shape[-1]], dim=-1)
                out, lse2 = _forward(q3[:, i * c:(i + 1) * c], k_j, v_j, None,
                                     0 if kind == "diagonal" else None, scale, tk, batch)
                states[i] = merge_partials(states[i], _as_partial(out, lse2))
                record_scores(c * (c + 1) // 2 if kind == "diagonal" else c * c)
            if t < W - 1:
                kv = ring_shift(kv, group)
        out, lse2 = (torch.cat(parts, dim=1) for parts in zip(*(_finish(*s) for s in states)))
        ctx.save_for_backward(q3, k3, v3, out, lse2)
        ctx.args = (batch, is_causal, layout, group, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, out, lse2 = ctx.saved_tensors
        batch, is_causal, layout, group, scale = ctx.args
        rank, W = world(group)
        c, Dh = q3.shape[1] // len(chunk_ids(rank, W, layout)), k3.shape[-1]
        delta = (dout * out).sum(dim=-1)  # (N, n): δ = rowsum(dO ∘ O) over the whole output
        dq = torch.zeros_like(q3)
        kv = torch.cat((k3, v3), dim=-1)  # (N, n, Dh + Dv)
        dkv = torch.zeros_like(kv)         # the travelling block's dk, dv accumulators
        for t in range(W):
            for i, j, kind in causal_pairs(rank, (rank - t) % W, W, layout, is_causal):
                qi, kj = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                k_j, v_j = kv[:, kj].split([Dh, v3.shape[-1]], dim=-1)
                dq_i, dk_j, dv_j = backward_rows(q3[:, qi], k_j, v_j, dout[:, qi], delta[:, qi], lse2[:, qi], None,
                                                 0 if kind == "diagonal" else None, scale, min(128, c), batch)
                dq[:, qi] += dq_i
                dkv[:, kj] += torch.cat((dk_j, dv_j), dim=-1)
            if t < W - 1:  # pass the block on with its gradients so far
                kv, dkv = ring_shift(torch.cat((kv, dkv), dim=-1), group).split(kv.shape[-1], dim=-1)
        dkv = ring_shift(dkv, group)  # the block held last is rank r + 1's: one more step brings it home
        dk, dv = dkv.split([Dh, v3.shape[-1]], dim=-1)
        return dq, dk, dv, None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                   group=None, layout: str = "contiguous", scale: float | None = None) -> torch.Tensor:
    """This rank's block of softmax(Q Kᵀ·scale) V over the whole sequence, by ring attention.

    q, k (B, H, T/W, Dh), v (B, H, T/W, Dv): this rank's positions (layout 'contiguous': rank r holds
    positions r·T/W ..; 'zigzag': chunks r and 2W-1-r of 2W, see attnlib.parallel.layout.shard).
    Returns (B, H, T/W, Dv), equal to the same rows of attention over all T positions; is_causal masks
    by global position (query i sees keys j <= i). Differentiable: the gradients of q, k, v are those
    of full attention for this rank's block. Every rank of `group` must call it with equal shapes.
    fp16/bf16 are computed in fp32.
    """
    rank, W = world(group)
    check_blocks(q, k, v, len(chunk_ids(rank, W, layout)))
    B, H, n, Dh = q.shape
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q3, k3, v3 = (x.to(work).reshape(B * H, n, x.shape[-1]) for x in (q, k, v))  # (N, n, Dh)
    out = _RingAttention.apply(q3, k3, v3, q.shape[:2], is_causal, layout, group, scale)
    return out.reshape(B, H, n, v.shape[-1]).to(q.dtype)  # (B, H, T/W, Dv)
