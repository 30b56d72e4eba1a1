"""What a head does, as numbers: scores computed from attention weights A (..., T, S), one per head.

Each function reduces the last two axes (queries, keys) of causal self-attention weights, so
weights (L, B, H, T, T) give scores (L, B, H). Query i stands at position i + S - T (bottom-right,
as with a cache) and may see keys 0 .. i + S - T.

- sink_share: the share of attention that lands on the first token (an attention sink).
- previous_token_score: the share that lands on the token just before the query.
- induction_score: on a block of `period` tokens repeated, the share that lands on the token right
  after the earlier occurrence of the query's own token (what an induction head attends to).
- attention_distance: how far back a head looks, sum_j A_ij (i - j) averaged over queries.
- pattern_distance: how differently two heads attend, the total variation 1/2 sum_j |A_ij - A'_ij|.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape, require_float_tensor

__all__ = ["sink_share", "previous_token_score", "induction_score", "attention_distance", "pattern_distance"]


def _weights(weights: torch.Tensor) -> tuple[int, int]:
    """(T, S) of causal attention weights (..., T, S) with T <= S; a ValueError otherwise."""
    require_float_tensor(weights, "weights")
    if weights.dim() < 2 or weights.shape[-2] > weights.shape[-1]:
        raise ValueError(f"weights of shape {fmt_shape(weights.shape)} is not (..., T, S) with T <= S")
    return weights.shape[-2], weights.shape[-1]


def sink_share(weights: torch.Tensor, *, skip: int = 1) -> torch.Tensor:
    """(..., T, S) -> (...): attention on key 0, averaged over the queries from index `skip` on
    (the first query can only attend to key 0, so it says nothing)."""
    _weights(weights)
    return weights[..., skip:, 0].mean(dim=-1)


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """(..., T, S) -> (...): attention of each query on the key just before it, averaged over queries."""
    T, S = _weights(weights)
    return weights.diagonal(offset=S - T - 1, dim1=-2, dim2=-1).mean(dim=-1)  # the pairs (i, pos_i - 1)


def induction_score(weights: torch.Tensor, period: int) -> torch.Tensor:
    """(..., T, S) -> (...), for a sequence whose last 2·period tokens are one block of `period`
    tokens written twice: the attention each query of the second block puts on the key right after
    the earlier occurrence of its own token (key i - period + 1 for query i), averaged over them."""
    T, S = _weights(weights)
    if isinstance(period, bool) or not isinstance(period, int) or not (1 <= period <= T and 2 * period <= S):
        raise ValueError(f"period={period!r} must be an int with period <= T={T} queries and 2·period <= S={S} keys")
    # key = query position - period + 1: the diagonal at offset S - T - period + 1, its last `period` entries
    return weights.diagonal(offset=S - T - period + 1, dim1=-2, dim2=-1)[..., -period:].mean(dim=-1)


def attention_distance(weights: torch.Tensor) -> torch.Tensor:
    """(..., T, S) -> (...): sum_j A_ij (pos_i - j), how many positions back a query looks on average,
    averaged over the queries (pos_i = i + S - T)."""
    T, S = _weights(weights)
    positions = torch.arange(S - T, S, device=weights.device, dtype=weights.dtype)         # (T,)
    keys = torch.arange(S, device=weights.device, dtype=weights.dtype)                     # (S,)
    return (weights * (positions[:, None] - keys)).sum(dim=-1).mean(dim=-1)


def pattern_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., T, S) twice -> (...): the total variation distance 1/2 sum_j |a_ij - b_ij| between two
    heads' attention distributions, averaged over queries: 0 for the same pattern, 1 for disjoint ones."""
    _weights(a)
    if a.shape != b.shape:
        raise ValueError(f"a of shape {fmt_shape(a.shape)} and b of shape {fmt_shape(b.shape)} differ")
    return 0.5 * (a - b).abs().sum(dim=-1).mean(dim=-1)
