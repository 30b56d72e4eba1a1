"""A token's width as H heads and back, and key/value heads shared by groups of query heads.

split_heads and merge_heads move between (B, T, D), one row of D = H·Dh features per token, and
(B, H, T, Dh), one (T, Dh) matrix per head, which is what attention runs on; repeat_kv gives each
of the H query heads its key/value head when there are only H_kv of them (GQA, MQA).
attnlib.MultiHeadAttention (attnlib.mha) is built on them; they are importable from attnlib.mha too.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape, require_dims

__all__ = ["split_heads", "merge_heads", "repeat_kv"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, H·Dh) -> (B, H, T, Dh): cut each token's width into H heads, then put heads before time.

    Head h holds features h·Dh .. (h+1)·Dh - 1 of every token. A view when x's last axis is contiguous.
    """
    require_dims(x, "x", 3, "(B, T, D)")
    if x.shape[-1] % num_heads:
        raise ValueError(f"x of shape {fmt_shape(x.shape)}: D={x.shape[-1]} is not divisible by "
                         f"num_heads={num_heads}")
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, Dh) -> (B, T, H·Dh), the inverse of split_heads: heads back next to Dh, then flatten.

    The transpose must come first: x.reshape(B, T, H·Dh) has the right shape but mixes tokens.
    """
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, D)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, S, Dh) -> (B, H_kv * n_rep, S, Dh): each key/value head repeated n_rep times next to itself.

    Equivalent to torch.repeat_interleave(x, n_rep, dim=1), so query head i meets kv head i // n_rep.
    Uses expand + reshape (one copy, no Python loop).
    """
    if n_rep == 1:
        return x
    B, H_kv, S, Dh = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, Dh).reshape(B, H_kv * n_rep, S, Dh)
