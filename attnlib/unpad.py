"""Padding-free batches: run a padded batch's real tokens only, then put the results back in place.

A sentence's hidden states do not depend on the padding around it, so an encoder may drop the padding
before its layers. The N real tokens of a (B, T) batch are packed into one (N, D) tensor, on which every
per-token part of a block (LayerNorm, FFN, residuals) runs at once; self-attention runs per group of
sentences that have the same number L of real tokens: an (n, L, D) batch with no mask and no wasted rows.
"""

from __future__ import annotations

import torch

from attnlib.mha import MultiHeadAttention

__all__ = ["Groups", "length_groups", "packed_index", "attend_groups", "unpack", "unpack_weights"]

Groups = list[tuple[torch.Tensor, torch.Tensor]]  # per length L: rows (n,), positions (n, L)


def length_groups(valid: torch.Tensor) -> Groups:
    """valid (B, T) bool -> per distinct length L > 0: (rows (n,), positions (n, L)) of its sentences' real tokens.

    Positions are in order, so left, right or scattered padding all work.
    """
    lengths = valid.sum(dim=1)                                                      # (B,)
    real_first = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # (B, T) real ones first
    groups = []
    for L in lengths.unique().tolist():
        if L > 0:
            rows = (lengths == L).nonzero()[:, 0]                                   # (n,)
            groups.append((rows, real_first[rows, :L]))                              # (n,), (n, L)
    return groups


def packed_index(groups: Groups, T: int, like: torch.Tensor) -> torch.Tensor:
    """(N,) indices into the flattened (B·T) batch of every real token, group after group."""
    parts = [(rows[:, None] * T + pos).flatten() for rows, pos in groups]  # (n·L,) each
    return torch.cat(parts) if parts else like.new_zeros(0, dtype=torch.long)


def attend_groups(attn: MultiHeadAttention, z: torch.Tensor, groups: Groups,
                  need_weights: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Self-attention on packed tokens z (N, D): each group of n sentences of L tokens is one (n, L, D) batch.

    Returns the packed output (N, D) and, with need_weights, each group's weights (n, H, L, L).
    """
    outs, weights, start = [], [], 0
    for rows, pos in groups:
        n, L = pos.shape
        zg = z[start:start + n * L].view(n, L, -1)                 # (n, L, D)
        if need_weights:
            zg, w = attn(zg, need_weights=True)                    # w (n, H, L, L)
            weights.append(w)
        else:
            zg = attn(zg)
        outs.append(zg.reshape(n * L, -1))                         # (n·L, D)
        start += n * L
    return (torch.cat(outs) if outs else z), weights               # (N, D)


def unpack(x: torch.Tensor, index: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """Packed x (N, D) -> (B, T, D) with each token back at its place and zeros at the padding."""
    full = x.new_zeros(B * T, x.shape[-1])
    full[index] = x
    return full.view(B, T, -1)                                     # (B, T, D)


def unpack_weights(weights: list[torch.Tensor], groups: Groups, B: int, H: int, T: int,
                   like: torch.Tensor) -> torch.Tensor:
    """Per-group weights (n, H, L, L) -> (B, H, T, T) at the real positions, zeros elsewhere."""
    full = like.new_zeros(B, H, T, T)
    for w, (rows, pos) in zip(weights, groups):
        full[rows[:, None, None], :, pos[:, :, None], pos[:, None, :]] = w.permute(0, 2, 3, 1)  # (n, L, L, H)
    return full
