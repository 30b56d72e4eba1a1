"""Which tiles of (queries × keys) tiled attention must compute, and the mask inside each tile.

Under a bottom-right causal mask (query i sees key j iff j <= i + S - T) a tile is skipped when no
query sees any of its keys, computed without a mask when every query sees every key, and masked
inside otherwise; a user mask is sliced to the tile. Masks are added to the scores as 0/-inf biases.
merge_partials combines what two disjoint blocks of keys gave (chapter 9; ring attention merges by it).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["tile_kind", "merge_partials"]

_NEG_INF = float("-inf")


def tile_kind(i0: int, i1: int, j0: int, j1: int, offset: int) -> str:
    """Classify the tile of queries [i0, i1) × keys [j0, j1) under a bottom-right causal mask.

    Query i may see key j iff j <= i + offset, offset = S - T. Returns 'skip' (no query sees any
    key: the tile is never computed), 'full' (every query sees every key: no mask needed) or
    'partial' (the mask must be applied inside the tile).
    """
    if j0 > i1 - 1 + offset:  # even the last query sees none of the keys
        return "skip"
    if j1 - 1 <= i0 + offset:  # even the first query sees all of the keys
        return "full"
    return "partial"


def _tile_mask(mask: torch.Tensor | None, offset: int | None,
               i0: int, i1: int, j0: int, j1: int) -> tuple[bool, torch.Tensor | None, tuple | None]:
    """(skip, allowed, key) for one tile: skip if nothing in it may be attended; `allowed` is the
    tile's bool mask, broadcastable to (..., i1 - i0, j1 - j0), or None when all is allowed; `key`
    names a purely causal mask by where the diagonal crosses the tile (such tiles share one bias)."""
    kind = "full" if offset is None else tile_kind(i0, i1, j0, j1, offset)
    if kind == "skip":
        return True, None, None
    allowed, key = None, None
    if kind == "partial":
        i = torch.arange(i0, i1, device=mask.device if mask is not None else None)
        allowed = torch.arange(j0, j1, device=i.device) <= i[:, None] + offset  # (tq, tk)
        key = (i0 + offset - j0, i1 - i0, j1 - j0)  # key j may be seen by query i iff j - i <= key[0]
    if mask is not None:  # mask: (..., T or 1, S or 1), sliced only along its non-1 dims
        tile = mask[..., slice(i0, i1) if mask.shape[-2] > 1 else slice(None),
                    slice(j0, j1) if mask.shape[-1] > 1 else slice(None)]
        if not bool(tile.all()):
            allowed, key = (tile if allowed is None else tile & allowed), None
    if allowed is not None and not bool(allowed.any()):
        return True, None, None
    return False, allowed, key


def _key_tiles(mask, offset, i0, i1, S, block_size) -> Iterator[tuple[int, int, torch.Tensor | None, tuple | None]]:
    """The key tiles (j0, j1, allowed, key) that queries [i0, i1) must visit; wholly masked ones are skipped."""
    for j0 in range(0, S, block_size):
        j1 = min(j0 + block_size, S)
        skip, allowed, key = _tile_mask(mask, offset, i0, i1, j0, j1)
        if not skip:
            yield j0, j1, allowed, key


def _add_mask(s: torch.Tensor, allowed: torch.Tensor | None, key: tuple | None, batch: torch.Size,
              biases: dict, first_row: int = 0) -> None:
    """Add the tile's mask to scores s (N, n, tk) of the tile's rows from `first_row` on, in place, as a
    0/-inf bias broadcast over batch. A purely causal tile's bias depends only on its `key`: it is built
    once per call and kept in `biases`."""
    if allowed is not None:  # adding 0/-inf is far cheaper than masked_fill_ on s
        bias = biases.get(key) if key is not None else None
        if bias is None:
            bias = torch.zeros(allowed.shape, dtype=s.dtype, device=s.device).masked_fill_(~allowed, _NEG_INF)
            if key is not None:
                biases[key] = bias
        s.view(*batch, *s.shape[-2:]).add_(bias[first_row:] if bias.dim() >= 2 else bias)


def merge_partials(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Chapter 9's merge of two partial softmax results (m, l, acc) over two disjoint blocks of keys.

    A block's partial result per query: m = max_j s_j (..., T), l = Σ_j exp(s_j - m) (..., T),
    acc = Σ_j exp(s_j - m) v_j (..., T, Dv). Both move to the common max m = max(m1, m2), then add:
    l = l1·exp(m1 - m) + l2·exp(m2 - m), acc likewise; out = acc / l. A row empty in both blocks
    (m = -inf) uses 0 as its reference, so it stays (-inf, 0, 0) instead of NaN.
    """
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    m = torch.maximum(m1, m2)                         # (..., T)
    ref = m.masked_fill(m == _NEG_INF, 0.0)           # a row empty in both blocks
    f1, f2 = torch.exp(m1 - ref), torch.exp(m2 - ref)  # (..., T), each in [0, 1]
    return m, l1 * f1 + l2 * f2, acc1 * f1.unsqueeze(-1) + acc2 * f2.unsqueeze(-1)
