"""Chapter 12's induction-score checker (re-exported by ch12): the reader's score on causal attention weights
with and without a prefix before the two blocks, and every usual misreading of which key to read named."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, full_precision, matching, run
from attnlib.heads import induction_score

__all__ = ["check_induction_score"]

_INF = float("-inf")


def _causal_weights(H: int, T: int, seed: int) -> torch.Tensor:
    """(H, T, T) attention weights: a softmax of random scores under a causal mask, every entry distinct."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(H, T, T, generator=g, dtype=torch.float64) * 1.5
    return scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), _INF).softmax(-1)


def _at(weights: torch.Tensor, queries: range, shift: int) -> torch.Tensor:
    """mean over query i in `queries` of weights[:, i, i - shift] -> (H,)."""
    return torch.stack([weights[:, i, i - shift] for i in queries], dim=-1).mean(-1)


def _first_copy(T: int, period: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The first copy's queries with their keys i - period + 1, clamped at 0 or wrapped to the end."""
    first = torch.arange(T - 2 * period, T - period)
    return [("clamped to 0", first, (first - period + 1).clamp(min=0)), ("a negative index wraps to the end", first,
                                                                        first - period + 1)]


@checker("induction score")
def check_induction_score(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(weights, period) with weights (H, T, T) of one sequence whose last 2·period tokens are a block
    of `period` tokens written twice returns (H,): for each head, the attention the queries of the second
    block put on the token right after the earlier occurrence of their own token, averaged over them."""
    H = 3
    for prefix, period, seed in ((3, 7, 2), (1, 6, 0), (0, 5, 1)):  # a longer prefix, a BOS-like one, none
        T = prefix + 2 * period
        weights = _causal_weights(H, T, seed)
        what = f"induction_score(weights, period={period}) with weights of shape {(H, T, T)} ({prefix} tokens before the two blocks)"
        second = range(T - period, T)                          # the queries of the second block
        got = run(fn, weights.clone(), period, what=what)
        as_tensor(got, what)
        mean = induction_score(weights, period).mean()
        if got.dim() == 0 and matching(got, {"mean": mean}):
            raise CandidateError(f"{what} is one number, the average over the heads too: return one score "
                                 f"per head, shape ({H},)")
        if got.shape == (H,) and matching(got, {"mean": mean.expand(H)}):
            raise CandidateError(f"{what} gives every head the same score, the average over the heads too: "
                                 f"average over the queries only (dim=-1), one score per head")
        got = full_precision(as_tensor(got, what, shape=(H,)), what)
        named = {period - 1, period, period + 1, 1, period - 1 + prefix}     # the offsets named below
        mistakes = {f"key i - {shift} for each query i of the second block: the token after the earlier occurrence "
                    f"of query i's token is key i - period + 1 = i - {period - 1}": _at(weights, second, shift)
                    for shift in range(T - period + 1) if shift not in named}  # any other fixed offset
        mistakes.update({
            "the earlier occurrence of the query's token itself (key i - period, a duplicate-token score): an "
            "induction head attends to the token *after* it, key i - period + 1": _at(weights, second, period),
            "the previous token (key i - 1): that is a previous-token score": _at(weights, second, 1),
            "key i - period - 1, one before the earlier occurrence: the token after it is key i - period + 1":
                _at(weights, second, period + 1),
            "the queries of the first block included: only the second block has an earlier occurrence to look back at":
                _at(weights, range(max(T - 2 * period, period - 1), T), period - 1),
            "summed over the queries instead of averaged": _at(weights, second, period - 1) * period,
            "period - 1 queries (the first query of the second block left out): every one of its `period` queries "
            "has an earlier occurrence, the first one too": _at(weights, range(T - period + 1, T), period - 1),
            "period - 1 queries (the last query of the sequence left out): the second block runs to the last "
            "position, T - 1": _at(weights, range(T - period, T - 1), period - 1),
            "both copies averaged (queries T - 2·period .. T - 1, key i - period + 1, which for the first copy is "
            "before the blocks or wraps around to the end): only the second copy has an earlier occurrence":
                weights[:, torch.arange(T - 2 * period, T), torch.arange(T - 2 * period, T) - period + 1].mean(-1),
            **{f"the first copy's queries (T - 2·period .. T - period - 1) instead of the second copy's: their key "
               f"i - period + 1 lies before the blocks ({how}); only the second copy has an earlier occurrence":
               weights[:, first, keys].mean(-1) for how, first, keys in _first_copy(T, period)},
            "keys and queries swapped (weights[:, key, query]): rows are queries, columns are keys":
                torch.stack([weights[:, i - period + 1, i] for i in second], -1).mean(-1),
            "the maximum over the queries instead of their mean":
                torch.stack([weights[:, i, i - period + 1] for i in second], -1).amax(-1),
        })
        if prefix:
            mistakes["the prefix left out of the key index (key i - period + 1 - prefix, with i counted over the "
                     "whole sequence): positions count from the first token, prefix included"] = \
                _at(weights, second, period - 1 + prefix)
            mistakes["the two blocks taken to start at position 0: with a prefix (a BOS token, say) they are "
                     "the last 2·period positions, so the second block is queries T - period .. T - 1"] = \
                _at(weights, range(period, 2 * period), period - 1)
        expect_close(got, induction_score(weights, period), what, mistakes=mistakes, atol=1e-6)
    return ("for each head, the mean attention from each query of the second block to the token after its "
            "earlier occurrence (key i - period + 1), with and without a prefix before the blocks")
