"""Chapter 1's third checker: one query's attention written with Python lists and loops (re-exported by ch01)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.attention import attention, softmax
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises.ch01_common import _NAIVE, reject_shape_mistakes, score_mistakes

__all__ = ["check_one_query_attention"]


def _as_vector(value: object, what: str) -> torch.Tensor:
    """The reader's list (or tuple, or tensor) of numbers as a float64 tensor."""
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise CandidateError(f"{what} should be a list of numbers, got {type(value).__name__}") from None


def _one_query_stage(fn: Callable, q: list, keys: list, values: list, *, overflow: bool = False) -> None:
    what = f"one_query_attention(q, keys, values) with len(q) = {len(q)}, {len(keys)} keys"
    try:
        got = _as_vector(run(fn, q[:], [r[:] for r in keys], [r[:] for r in values], what=what), what)
    except CandidateError as exc:
        if "OverflowError" not in str(exc):
            raise
        raise CandidateError(f"{exc}. {_NAIVE} (the largest score, not the first one or the smallest)") from None
    qt, kt, vt = (torch.tensor(a, dtype=torch.float64) for a in (q, keys, values))  # (Dh,), (S, Dh), (S, Dv)
    out, weights = attention(qt[None], kt, vt)  # (1, Dv), (1, S)
    scores = qt @ kt.T / math.sqrt(len(q))  # (S,)
    reject_shape_mistakes(got, what, {f"the {len(keys)} weights, not the weighted sum of the values": weights[0]})
    as_tensor(got, what, shape=(vt.shape[1],))
    if overflow:
        mistakes = {_NAIVE: (scores.exp() / scores.exp().sum()) @ vt}
    else:
        mistakes = {name: softmax(s[0], dim=-1) @ vt for name, s in score_mistakes(qt[None], kt).items()}
        mistakes["no normalization: the weights exp(s_j) are never divided by their sum"] = scores.exp() @ vt
        mistakes["no normalization: the weights exp(s_j - max) are never divided by their sum"] = \
            (scores - scores.max()).exp() @ vt
        mistakes["the max subtracted in the numerator only: exp(s_j - max) / Σ exp(s_k) is the softmax times "
                 "exp(-max); subtract it above and below the line"] = out[0] * (-scores.max()).exp()
    expect_close(got, out[0], what, mistakes=mistakes)


@checker("one query with loops")
def check_one_query_attention(fn: Callable[[list, list, list], list]) -> str:
    """fn(q, keys, values) on Python lists: q (Dh,), keys (S, Dh), values (S, Dv) → the output (Dv,)."""
    q, keys, values = (torch.randn(*shape).round(decimals=2).tolist() for shape in ((3,), (4, 3), (4, 2)))
    _one_query_stage(fn, q, keys, values)
    big_keys = [[-10.0] * 3, [10.0] * 3, [9.0] * 3]  # scores -1732, 1732, 1559: the largest is not first
    _one_query_stage(fn, [100.0] * 3, big_keys, [[5.0, 5.0], [1.0, 0.0], [0.0, 1.0]], overflow=True)
    return "equals attnlib.attention for one query, and does not overflow on scores above 1000"
