"""Padding-free batches: run a padded batch's real tokens only, then put the results back in place.

A sentence's hidden states do not depend on the padding after it (tokenizers pad on the right; padding
before a sentence shifts its positions, in transformers' BERT as here), so an encoder may drop the padding
before its layers. Sentences of similar length form a bucket, padded only to its longest (L <= T);
the buckets are packed, one after another, into one (M, D) tensor, on which every per-token part of a
block (LayerNorm, FFN, residuals) runs at once, and the attention layer runs on each bucket as an
(n, L) view, with a padding mask when its lengths differ. Few buckets mean few
calls; similar lengths, little waste; views mean no copies between the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlib import masks
from attnlib.mha import MultiHeadAttention

__all__ = ["Bucket", "buckets", "layout", "attend_buckets", "unpack", "unpack_weights"]


@dataclass(frozen=True)
class Bucket:
    """n sentences of similar length: rows (n,) of the batch; positions (n, L) of their real tokens in
    order, then T (one past the end) in the slots beyond each sentence's length; valid (n, L) bool."""

    rows: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor


def buckets(valid: torch.Tensor, min_fill: float = 0.8) -> list[Bucket]:
    """Split a batch's sentences (valid (B, T) bool, True = real token) into buckets by length, longest
    first: a new bucket starts when a sentence is shorter than min_fill times its bucket's longest."""
    B, T = valid.shape
    lengths = valid.sum(dim=1)                                                       # (B,)
    real_first = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices   # (B, T) real ones first
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    groups: list[list[int]] = []
    for b in order:
        if lengths[b] == 0:
            break                                                                    # nothing to compute
        if not groups or lengths[b] < min_fill * lengths[groups[-1][0]]:
            groups.append([])
        groups[-1].append(b)
    out = []
    for group in groups:
        rows = torch.tensor(group, device=valid.device)                              # (n,)
        L = int(lengths[rows[0]])
        bucket_valid = torch.arange(L, device=valid.device) < lengths[rows, None]    # (n, L)
        positions = real_first[rows, :L].masked_fill(~bucket_valid, T)               # (n, L)
        out.append(Bucket(rows, positions, bucket_valid))
    return out


def layout(bs: list[Bucket], T: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed layout: bucket after bucket, each (n, L) flattened. Returns gather (M,), the index in
    the flattened (B·T) batch of every slot (a slot past a sentence's end repeats its first token), and
    keep (M,) bool, True at the slots of real tokens."""
    if not bs:
        return like.new_zeros(0, dtype=torch.long), like.new_zeros(0, dtype=torch.bool)
    gather = [(b.rows[:, None] * T + b.positions.where(b.valid, b.positions[:, :1])).flatten() for b in bs]
    return torch.cat(gather), torch.cat([b.valid.flatten() for b in bs])              # (M,), (M,)


def attend_buckets(attn: MultiHeadAttention, z: torch.Tensor, bs: list[Bucket],
                   need_weights: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Self-attention of `attn` on packed slots z (M, D): attn itself on each bucket's (n, L, D) view,
    with a padding mask when the bucket's lengths differ.

    Returns the packed output (M, D) and, with need_weights, each bucket's weights (n, H, L, L).
    """
    outs, weights, start = [], [], 0
    for b in bs:
        n, L = b.valid.shape
        mask = None if bool(b.valid.all()) else masks.padding_mask(b.valid)           # (n, 1, 1, L)
        out = attn(z[start:start + n * L].view(n, L, -1), mask=mask, need_weights=need_weights)
        if need_weights:
            out, w = out
            weights.append(w)                                                         # (n, H, L, L)
        outs.append(out.reshape(n * L, -1))                                           # (n·L, D)
        start += n * L
    return (torch.cat(outs) if outs else z), weights                                  # (M, D)


def unpack(x: torch.Tensor, gather: torch.Tensor, keep: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """Packed x (M, D) -> (B, T, D) with each real token back at its place and zeros at the padding."""
    full = x.new_zeros(B * T, x.shape[-1])
    full[gather[keep]] = x[keep]
    return full.view(B, T, -1)                                                        # (B, T, D)


def unpack_weights(weights: list[torch.Tensor], bs: list[Bucket], B: int, H: int, T: int,
                   like: torch.Tensor) -> torch.Tensor:
    """Per-bucket weights (n, H, L, L) -> (B, H, T, T) at the real positions, zeros elsewhere.

    The slots beyond a sentence's length point at row and column T, which are cut off at the end.
    """
    full = like.new_zeros(B, H, T + 1, T + 1)
    for w, b in zip(weights, bs):
        p = b.positions
        full[b.rows[:, None, None], :, p[:, :, None], p[:, None, :]] = w.permute(0, 2, 3, 1)  # (n, L, L, H)
    return full[:, :, :T, :T].contiguous()                                            # (B, H, T, T)
