"""Tiled attention with an online softmax (the FlashAttention algorithm), in plain PyTorch.

Softmax needs a whole row of scores, yet attention can be computed one tile of keys at a time:
keep, for each query, the running max m, the running sum l = Σ_j exp(s_j - m) and the running
unnormalized output acc = Σ_j exp(s_j - m) v_j; when a later tile raises the max to m', multiply
l and acc by exp(m - m'). At the end out = acc / l. Only a (T_tile, S_tile) block of scores ever
exists, never the (T, S) matrix. The backward pass is tiled the same way: it keeps one log-sum-exp
per query from the forward and recomputes each tile's weights from it.

Shapes as in attnlib.attention: q (..., T, Dh), k (..., S, Dh), v (..., S, Dv) → out (..., T, Dv).
"""

from __future__ import annotations

import math

import torch

from attnlib.attention import _check_qkv
from attnlib.masks import check_mask
from attnlib.tiles import _NEG_INF, _add_mask, _key_tiles, tile_kind

__all__ = ["tiled_attention", "tile_kind", "QUERY_BLOCK"]

QUERY_BLOCK = 512  # queries per tile: each key tile loaded is then used by this many queries
_LOG2E = math.log2(math.e)  # exp(x) = 2^(x·log2 e); exp2 stays fast on -inf scores, exp does not


def _exact_step(s: torch.Tensor, v_tile: torch.Tensor, acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor) -> None:
    """Fold one tile of scores s (N, tq, tk) into the state with an exact max update (s is overwritten):
    m' = max(m, rowmax s), p = 2^(s - m'), l = l·2^(m - m') + Σ p, acc = acc·2^(m - m') + p v."""
    m_new = torch.maximum(m, s.amax(dim=-1))  # (N, tq)
    m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)  # rows that have seen no key yet
    alpha = torch.exp2(m - m_safe)  # (N, tq): rescales what was summed under the old max
    s.sub_(m_safe.unsqueeze(-1)).exp2_()  # p = 2^(s - m'), in place
    l.mul_(alpha).add_(s.sum(dim=-1))
    acc.mul_(alpha.unsqueeze(-1)).baddbmm_(s, v_tile)  # (N, tq, tk) @ (N, tk, Dv)
    m.copy_(m_new)


def _online_softmax_rows(qs: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, tiles, batch: torch.Size,
                         out_rows: torch.Tensor, lse_rows: torch.Tensor, scores_buf: torch.Tensor,
                         acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, biases: dict) -> None:
    """Attend queries qs (N, tq, Dh), pre-scaled by scale·log2 e, to k3 (N, S, Dh), v3 (N, S, Dv)
    one key tile at a time; write the result into out_rows (N, tq, Dv) and each row's
    log2 Σ 2^s into lse_rows (N, tq) (+inf for a row with nothing to attend to), for the backward.

    Per tile: s = qs kᵀ (+ 0/-inf bias), then the exact step (m' = max(m, rowmax s), l and acc
    rescaled by 2^(m - m')) until every row has a finite max; after that the lazy one: keep m as the
    reference, p = 2^(s - m) (the subtraction folded into the product), l += Σ p, acc += p v. Any
    reference gives the same acc / l, so the lazy step is exact too, unless a score lies so far above
    m that l = Σ p or acc = Σ p v overflows (acc first when |v| > 1: 2^(s - m) need not overflow on its
    own): then l or acc is not finite and the block is redone with the exact step only.
    """
    N, tq, _ = qs.shape
    tiles = list(tiles)
    for lazy_allowed in (True, False):
        m.fill_(_NEG_INF)
        l.zero_()
        acc.zero_()
        lazy = False
        for j0, j1, allowed, key in tiles:
            s = scores_buf[: N * tq * (j1 - j0)].view(N, tq, j1 - j0)  # a contiguous (N, tq, tk) tile
            k_t = k3[:, j0:j1].transpose(1, 2)  # (N, Dh, tk)
            if lazy:
                r = max(0, -key[0]) if key else 0  # causal: rows above the diagonal see no key of the tile
                s = scores_buf[: N * (tq - r) * (j1 - j0)].view(N, tq - r, j1 - j0)
                torch.baddbmm(-m[:, r:].unsqueeze(-1), qs[:, r:], k_t, out=s)  # s - m = qs kᵀ - m, one call
                _add_mask(s, allowed, key, batch, biases, r)
                l[:, r:].add_(s.exp2_().sum(dim=-1))  # p = 2^(s - m), in place
                acc[:, r:].baddbmm_(s, v3[:, j0:j1])  # (N, tq - r, tk) @ (N, tk, Dv)
            else:
                torch.bmm(qs, k_t, out=s)  # (N, tq, Dh) @ (N, Dh, tk)
                _add_mask(s, allowed, key, batch, biases)
                _exact_step(s, v3[:, j0:j1], acc, m, l)
                lazy = lazy_allowed and bool(torch.isfinite(m).all())  # every row has a finite reference
        # acc.sum() is not finite if any entry of acc is not (an overflow of the sum alone only costs a redo),
        # and unlike isfinite(acc) it allocates nothing of acc's size
        if not lazy or bool(torch.isfinite(l).all() and torch.isfinite(acc.sum())):
            break  # else Σ p or Σ p v overflowed: redo this block with the exact step only
    torch.div(acc, l.masked_fill(l == 0, 1.0).unsqueeze(-1), out=out_rows)  # empty rows: 0 / 1 = 0
    torch.add(m, torch.log2(l), out=lse_rows).masked_fill_(l == 0, float("inf"))


def _forward(q3, k3, v3, mask, offset, scale, tk, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """out (N, T, Dv) and lse (N, T) of q3 (N, T, Dh), k3 (N, S, Dh), v3 (N, S, Dv), by query blocks."""
    (N, T, Dh), S, Dv = q3.shape, k3.shape[1], v3.shape[-1]
    tq, ws = max(1, min(QUERY_BLOCK, T)), dict(dtype=q3.dtype, device=q3.device)
    out, lse = torch.empty(N, T, Dv, **ws), torch.empty(N, T, **ws)
    # Workspaces allocated once per call; each tile uses a contiguous view of their front.
    scores_buf, acc_buf, qs_buf = (torch.empty(N * tq * d, **ws) for d in (tk, Dv, Dh))
    ml_buf, biases = torch.empty(2, N * tq, **ws), {}  # biases: one per causal diagonal offset, for the call
    for i0 in range(0, T, tq):
        n = min(tq, T - i0)
        qs = torch.mul(q3[:, i0:i0 + n], scale * _LOG2E, out=qs_buf[: N * n * Dh].view(N, n, Dh))
        m, l = ml_buf[:, : N * n].view(2, N, n).unbind(0)  # running max and sum, (N, n) each
        _online_softmax_rows(qs, k3, v3, _key_tiles(mask, offset, i0, i0 + n, S, tk), batch, out[:, i0:i0 + n],
                             lse[:, i0:i0 + n], scores_buf, acc_buf[: N * n * Dv].view(N, n, Dv), m, l, biases)
    return out, lse


class _TiledAttention(torch.autograd.Function):
    """Tiled forward; a tiled backward that recomputes each tile's p = 2^(s - lse) instead of storing it.

    With D = rowsum(dout ∘ out): dv += pᵀ dout, ds = p ∘ (dout vᵀ - D), dq += ds k·scale, dk += dsᵀ q·scale.
    """

    @staticmethod
    def forward(ctx, q3, k3, v3, mask, offset, scale, tk, batch):
        out, lse = _forward(q3, k3, v3, mask, offset, scale, tk, batch)
        ctx.save_for_backward(q3, k3, v3, out, lse)
        ctx.args = (mask, offset, scale, tk, batch)
        return out

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, out, lse = ctx.saved_tensors
        D = (dout * out).sum(dim=-1)  # (N, T)
        return (*backward_rows(q3, k3, v3, dout, D, lse, *ctx.args), None, None, None, None, None)


def backward_rows(q3, k3, v3, dout, D, lse, mask, offset, scale, tk, batch) -> tuple[torch.Tensor, ...]:
    """dq (N, T, Dh), dk (N, S, Dh), dv (N, S, Dv) of attention over these keys, tile by tile.

    lse (N, T) is each query's log2 Σ 2^s over *all* the keys it attends to (its softmax's normalizer)
    and D = rowsum(dout ∘ out) over the full output, so when k3, v3 hold only some of those keys (ring
    attention's blocks) the result is those keys' exact share: dq summed over blocks is the full dq.
    """
    dq, dk, dv = torch.zeros_like(q3), torch.zeros_like(k3), torch.zeros_like(v3)
    biases = {}
    T, tq = q3.shape[1], max(1, min(QUERY_BLOCK, q3.shape[1]))
    for i0 in range(0, T, tq):
        i = slice(i0, min(i0 + tq, T))
        qs = q3[:, i] * (scale * _LOG2E)
        for j0, j1, allowed, key in _key_tiles(mask, offset, i0, i.stop, k3.shape[1], tk):
            j = slice(j0, j1)
            s = qs @ k3[:, j].transpose(1, 2)  # (N, n, tk), in log2 units
            _add_mask(s, allowed, key, batch, biases)
            p = torch.exp2(s - lse[:, i, None])  # (N, n, tk): the softmax weights of this tile
            dv[:, j] += p.transpose(1, 2) @ dout[:, i]
            ds = p * (dout[:, i] @ v3[:, j].transpose(1, 2) - D[:, i, None])  # (N, n, tk)
            dq[:, i] += ds @ k3[:, j] * scale
            dk[:, j] += ds.transpose(1, 2) @ q3[:, i] * scale
    return dq, dk, dv


def _flat(x: torch.Tensor, batch: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """(..., L, d) → (N, L, d) with N = prod(batch), broadcasting the leading dims (a view if it can)."""
    return x.to(dtype).expand(*batch, *x.shape[-2:]).reshape(math.prod(batch), *x.shape[-2:])


def _check_args(q, k, v, mask, block_size) -> torch.Size:
    """Validate everything as attnlib.attention does; return the broadcast leading dims."""
    _check_qkv(q, k, v)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int (keys per tile), got {block_size!r}")
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        check_mask(mask, (*batch, q.shape[-2], k.shape[-2]))
    return batch


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 128,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v, computed in tiles of QUERY_BLOCK queries × block_size keys.

    Same arguments and result as attnlib.attention (without the weights): q (..., T, Dh),
    k (..., S, Dh), v (..., S, Dv) → out (..., T, Dv); mask bool, broadcastable to (..., T, S),
    True = may attend; is_causal is bottom-right (query i sees keys j <= i + S - T) and ANDed with
    mask; scale defaults to 1/sqrt(Dh). Tiles in which nothing may be attended are skipped; a query
    with nothing to attend to gets zeros. fp16/bf16 are computed in fp32. Differentiable: the backward
    is tiled too and never holds a (T, S) matrix.
    """
    batch = _check_args(q, k, v, mask, block_size)
    T, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q3, k3, v3 = (_flat(t, batch, work) for t in (q, k, v))  # (N, T, Dh), (N, S, Dh), (N, S, Dv)
    if mask is not None:  # give it all the dims of the scores: (..., T or 1, S or 1)
        mask = mask.reshape((1,) * (len(batch) + 2 - mask.dim()) + tuple(mask.shape))
    offset = S - T if is_causal else None
    out = _TiledAttention.apply(q3, k3, v3, mask, offset, scale, max(1, min(block_size, S)), batch)
    return out.reshape(*batch, T, Dv).to(q.dtype)  # (..., T, Dv)
