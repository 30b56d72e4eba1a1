"""Checkers for chapter 2 (why divide by sqrt(d_k)): scaled scores, the entropy of attention rows, Xavier's std."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.attention import softmax
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises.ch01 import _UNTRANSPOSED, reject_shape_mistakes, run_or_explain, score_mistakes

__all__ = ["check_scaled_scores", "check_attention_entropy", "check_xavier_std"]


@checker("scaled scores")
def check_scaled_scores(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(q, k) with q (B, H, T, Dh), k (B, H, S, Dh) returns the scores q kᵀ / sqrt(Dh), (B, H, T, S)."""
    B, H, T, S, Dh = 2, 3, 4, 5, 8  # all different, so no axis can stand in for another
    q, k = torch.randn(B, H, T, Dh), torch.randn(B, H, S, Dh)
    what = f"scaled_scores(q, k) with q {(B, H, T, Dh)}, k {(B, H, S, Dh)}"
    qs, ks = torch.randn(2, 1, 2, 4, 4).unbind(0)  # (B, H, T, Dh) with T = S = Dh = 4
    got = run_or_explain(fn, (q.clone(), k.clone()), what, (qs, ks), {_UNTRANSPOSED: qs @ ks / 2.0})
    expected = q @ k.transpose(-2, -1) / math.sqrt(Dh)  # (B, H, T, S)
    got = reject_shape_mistakes(got, what, {
        "keys × queries, (B, H, S, T): the scores have one row per query, (B, H, T, S), "
        "so they are q @ k.transpose(-2, -1)": expected.transpose(-2, -1),
    })
    as_tensor(got, what, shape=(B, H, T, S))
    mistakes = score_mistakes(q, k)
    mistakes["the wrong scale: divided by sqrt(T), the number of queries, instead of sqrt(Dh)"] = \
        expected * math.sqrt(Dh) / math.sqrt(T)
    mistakes["a softmax already applied: these are the weights, not the scores"] = softmax(expected, dim=-1)
    mistakes["k reshaped (or viewed) to (B, H, Dh, S) instead of transposed: reshape keeps the memory order, so "
             "each column mixes numbers of several keys; use k.transpose(-2, -1)"] = \
        q @ k.reshape(B, H, Dh, S) / math.sqrt(Dh)
    expect_close(got, expected, what, mistakes=mistakes)
    return "q kᵀ / sqrt(Dh), with one row per query, for T, S and Dh all different"


@checker("entropy of attention rows")
def check_attention_entropy(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(weights) with weights (..., T, S), rows summing to 1, returns each row's entropy in nats, (..., T)."""
    scores = 2 * torch.randn(2, 3, 5)  # (B, T, S)
    scores[0, 0] = torch.tensor([-math.inf, -math.inf, 0.0, -math.inf, -math.inf])  # one-hot: entropy 0
    scores[0, 1] = 0.0  # uniform: entropy ln 5
    scores[1, 2, :2] = -math.inf  # two keys masked: weights exactly 0
    weights = softmax(scores, dim=-1)  # (B, T, S)
    p_log_p = torch.special.xlogy(weights, weights)  # p log p, with 0 log 0 = 0
    expected = -p_log_p.sum(-1)  # (B, T)
    what = "attention_entropy(weights) with weights of shape (2, 3, 5)"
    got = reject_shape_mistakes(run(fn, weights.clone(), what=what), what, {
        "a sum over the query axis (dim=-2) instead of over each row's keys (dim=-1)": -p_log_p.sum(-2),
        "one number for all rows (a sum) instead of one entropy per row": -p_log_p.sum(),
        "one number for all rows (a mean) instead of one entropy per row": expected.mean(),
        "one number per batch (a mean over the rows) instead of one entropy per row": expected.mean(-1),
    })
    as_tensor(got, what, shape=expected.shape)
    expect_close(got, expected, what, mistakes={
        "0 · log 0 computed as 0 · (-inf) = NaN where a weight is 0 (a masked key); count those terms as 0, "
        "e.g. with torch.special.xlogy(p, p)": -(weights * weights.log()).sum(-1),
        "log base 2 (bits) instead of the natural log (nats)": expected / math.log(2),
        "the wrong sign: the entropy is -Σ p log p, which is never negative": -expected,
        "a mean over the keys instead of a sum": expected / weights.shape[-1],
    }, families={"an epsilon of {c:.2g} added inside the log, -Σ p log(p + ε): it shifts every entropy; write 0 log 0 "
                 "as 0 instead (torch.special.xlogy(p, p))": (lambda c: -(weights * (weights + c).log()).sum(-1),
                                                               1e-12, 1.0)},
       axes=("batch", "query"))
    return "one entropy per row in nats: 0 for a one-hot row, ln S for a uniform one, no NaN where a weight is 0"


def _as_number(value: object, what: str) -> float:
    """The reader's number (a float, an int, or a one-element tensor) as a float."""
    if isinstance(value, (str, bytes, bool)):  # float() would accept "0.05" and True
        raise CandidateError(f"{what} should be a number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise CandidateError(f"{what} should be a number, got {type(value).__name__}") from None


@checker("Xavier std")
def check_xavier_std(fn: Callable[[int, int, float], float]) -> str:
    """fn(fan_in, fan_out, gain) returns xavier_normal_'s std: gain · sqrt(2 / (fan_in + fan_out))."""
    cases = [(64, 256, 1.0), (300, 100, math.sqrt(2.0)), (512, 128, 5.0 / 3.0)]
    got = torch.tensor([_as_number(run(fn, *c, what=f"xavier_std{c}"), f"xavier_std{c}") for c in cases],
                       dtype=torch.float64)
    fan_in, fan_out, gain = torch.tensor(cases, dtype=torch.float64).T
    fan_sum = fan_in + fan_out
    expected = gain * (2.0 / fan_sum).sqrt()
    expect_close(got, expected, "xavier_std(fan_in, fan_out, gain)", mistakes={
        "xavier_uniform_'s bound gain · sqrt(6 / (fan_in + fan_out)), not the std (the std of "
        "U(-a, a) is a / sqrt(3))": gain * (6.0 / fan_sum).sqrt(),
        "LeCun's gain / sqrt(fan_in), which ignores fan_out": gain / fan_in.sqrt(),
        "Kaiming's gain · sqrt(2 / fan_in), which ignores fan_out": gain * (2.0 / fan_in).sqrt(),
        "the variance gain² · 2 / (fan_in + fan_out), not its square root": gain**2 * 2.0 / fan_sum,
        "no square root: gain · 2 / (fan_in + fan_out)": gain * 2.0 / fan_sum,
        "a missing factor 2: gain · sqrt(1 / (fan_in + fan_out))": gain * (1.0 / fan_sum).sqrt(),
        "the gain ignored": (2.0 / fan_sum).sqrt(),
        "the gain inside the square root: sqrt(gain · 2 / (fan_in + fan_out))": (gain * 2.0 / fan_sum).sqrt(),
        "the gain squared: gain² · sqrt(2 / (fan_in + fan_out)); the gain multiplies the std once":
            gain**2 * (2.0 / fan_sum).sqrt(),
        "the fans multiplied, not added: gain · sqrt(2 / (fan_in · fan_out))": gain * (2.0 / (fan_in * fan_out)).sqrt(),
        "the mean of the fans in the wrong place: gain · sqrt(1 / (2 (fan_in + fan_out)))":
            gain * (0.5 / fan_sum).sqrt(),
    })
    return "gain · sqrt(2 / (fan_in + fan_out)) for three layer shapes and gains"
