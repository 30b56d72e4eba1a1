"""Which positions of the sequence each rank holds, for sequence-parallel attention.

The sequence of T positions is cut into chunks. 'contiguous': W chunks, rank r holds chunk r
(positions r·T/W .. (r+1)·T/W - 1). 'zigzag': 2W chunks, rank r holds chunks r and 2W - 1 - r, one
early and one late, so that under a causal mask every rank has the same number of scores to compute
(a contiguous layout gives rank W - 1 about 2W - 1 times rank 0's).
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape

__all__ = ["LAYOUTS", "chunk_ids", "shard", "unshard", "causal_pairs"]

LAYOUTS = ("contiguous", "zigzag")


def chunk_ids(rank: int, world_size: int, layout: str = "contiguous") -> list[int]:
    """The chunk indices rank holds, in the order they are concatenated in its block."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def _chunks(x: torch.Tensor, world_size: int, layout: str, dim: int) -> list[torch.Tensor]:
    n_chunks = world_size * len(chunk_ids(0, world_size, layout))
    if x.shape[dim] % n_chunks:
        raise ValueError(f"x of shape {fmt_shape(x.shape)}: the sequence length {x.shape[dim]} (dim {dim}) "
                         f"is not divisible by {n_chunks} chunks ({world_size} ranks, layout={layout!r})")
    return list(x.chunk(n_chunks, dim=dim))


def shard(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """This rank's block of the whole sequence x, along `dim` (the time axis of (B, H, T, Dh) by default)."""
    chunks = _chunks(x, world_size, layout, dim)
    return torch.cat([chunks[c] for c in chunk_ids(rank, world_size, layout)], dim=dim)


def unshard(blocks: list[torch.Tensor], *, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's block (blocks[r] from rank r), the inverse of shard."""
    W = len(blocks)
    per_rank = len(chunk_ids(0, W, layout))
    chunks: list[torch.Tensor | None] = [None] * (W * per_rank)
    for r, block in enumerate(blocks):
        for c, part in zip(chunk_ids(r, W, layout), block.chunk(per_rank, dim=dim)):
            chunks[c] = part
    return torch.cat(chunks, dim=dim)


def causal_pairs(q_rank: int, kv_rank: int, world_size: int, layout: str, is_causal: bool) -> list[tuple[int, int, str]]:
    """(query chunk slot, key chunk slot, 'full' | 'diagonal') for every pair of chunks that has any
    score to compute when rank q_rank's queries meet rank kv_rank's keys. Slots index the chunks inside
    each rank's block. A key chunk after the query chunk is skipped under a causal mask; the same chunk
    is 'diagonal' (the lower triangle); an earlier one is 'full'."""
    pairs = []
    for i, qc in enumerate(chunk_ids(q_rank, world_size, layout)):
        for j, kc in enumerate(chunk_ids(kv_rank, world_size, layout)):
            if not is_causal or kc < qc:
                pairs.append((i, j, "full"))
            elif kc == qc:
                pairs.append((i, j, "diagonal"))
    return pairs
