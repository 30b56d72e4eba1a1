"""Checkers for chapter 1 (attention from scratch): a stable softmax, einsum attention, and (ch01_lists) one
query with loops.

`score_mistakes`, `run_or_explain` and `reject_shape_mistakes` (ch01_common) are shared with later chapters' checkers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.attention import attention, softmax
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close
from attnlib.exercises.ch01_common import (_INF, _NAIVE, _NO_KEEPDIM, _UNTRANSPOSED, reject_shape_mistakes, run_or_explain,
                                          score_mistakes)
from attnlib.exercises.ch01_lists import check_one_query_attention

__all__ = ["check_stable_softmax", "check_attention_einsum", "check_one_query_attention"]

_TEMPERATURE = ("the scores multiplied by {c:.4g} (divided by {inv:.4g}, a temperature?) before the softmax: "
                "softmax(x) takes x as it is")


def _softmax_stage(fn: Callable, x: torch.Tensor, mistakes: dict[str, torch.Tensor]) -> None:
    what = f"stable_softmax(x) on x of shape {tuple(x.shape)}"
    square = torch.randn(4, 4)
    e = torch.exp(square - square.amax(dim=-1))  # (4, 4) - (4,): row i's max is subtracted from column i
    no_keepdim = {f"the max taken {_NO_KEEPDIM}": e / e.sum(dim=-1, keepdim=True),
                  f"the max and the sum taken {_NO_KEEPDIM}": e / e.sum(dim=-1)}
    got = as_tensor(run_or_explain(fn, (x.clone(),), what, (square,), no_keepdim), what, shape=x.shape)
    expect_close(got, softmax(x, dim=-1), what, mistakes=mistakes,
                 families={_TEMPERATURE: (lambda c: softmax(c * x, dim=-1), 1e-2, 1e2)})


@checker("stable softmax")
def check_stable_softmax(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(x) = softmax over the last axis of x (..., S): stable for large scores, zeros for an all -inf row."""
    x = 3 * torch.randn(2, 3, 5)  # three different sizes, so that a wrong axis cannot hide
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    _softmax_stage(fn, x, {
        "a softmax over the wrong axis (dim=0 instead of the last axis, dim=-1)": torch.softmax(x, dim=0),
        "a softmax over the wrong axis (dim=-2 instead of the last axis, dim=-1)": torch.softmax(x, dim=-2),
        "no normalization: exp(x - max) is never divided by its sum": e,
        "no normalization: exp(x) is never divided by its sum": torch.exp(x),
        "a normalization over the whole tensor instead of over each row": e / e.sum(),
    })
    big = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0], [1.0, 2.0, 3.0], [-60.0, 0.0, 60.0],
                        [-100.0, 0.0, 100.0]])
    naive, shifted = torch.exp(big), torch.exp(big - big.max())
    from_min = torch.exp(big - big.amin(dim=-1, keepdim=True))  # the last rows span 120 and 200 > 88: exp overflows
    from_mean = torch.exp(big - big.mean(dim=-1, keepdim=True))  # the last row's max is 100 > 88 above its mean
    _softmax_stage(fn, big, {
        "the row's mean subtracted instead of its largest score: exp(x - mean) overflows once the max is more than "
        "about 88 above the mean (here [-100, 0, 100])": from_mean / from_mean.sum(-1, keepdim=True),
        _NAIVE: naive / naive.sum(-1, keepdim=True),
        "one max for the whole tensor (x.max()) instead of each row's max: rows far below it "
        "underflow to 0 / 0": shifted / shifted.sum(-1, keepdim=True),
        "one max for the whole tensor (x.max()) instead of each row's max: rows far below it underflow to 0, and "
        "your guard against 0 / 0 returns them as zeros": shifted / shifted.sum(-1, keepdim=True).where(
            shifted.sum(-1, keepdim=True) > 0, torch.ones(())),
        "the row's smallest score subtracted instead of its largest: exp(x - min) overflows as soon as a "
        "row spans more than about 88 (here [-60, 0, 60])": from_min / from_min.sum(-1, keepdim=True),
    })
    masked = torch.tensor([[0.0, 1.0, -_INF, 2.0], [-_INF, -_INF, -_INF, -_INF], [3.0, -_INF, -_INF, 0.0]])
    _softmax_stage(fn, masked, {
        "an all -inf row (a query allowed to see nothing) gives NaN: its max is -inf and "
        "-inf - (-inf) is NaN; return zeros for such a row, as attnlib.softmax does": torch.softmax(masked, -1),
        "an all -inf row gives a uniform row (each weight 1/S): -inf was replaced by a large negative "
        "number, so a query allowed to see nothing averages every value; return zeros for such a row":
            torch.softmax(masked.clamp(min=-1e9), -1),
    })
    return "normalized over the last axis, stable on [1000, 1001, 1002], and an all -inf row gives zeros"


def _attention_mistakes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong outputs for q (B, H, T, Dh), k (B, H, S, Dh), v (B, H, S, Dv), by name, each (B, H, T, Dv)."""
    wrong = {name: softmax(s, dim=-1) @ v for name, s in score_mistakes(q, k).items()}
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    wrong["a softmax over the query axis (dim=-2) instead of the key axis (dim=-1)"] = softmax(scores, -2) @ v
    wrong["a softmax over the head axis instead of the key axis"] = softmax(scores, -3) @ v
    return wrong


@checker("attention with einsum")
def check_attention_einsum(fn: Callable[..., torch.Tensor]) -> str:
    """fn(q, k, v) with q (B, T, H, Dh), k (B, S, H, Dh), v (B, S, H, Dv) returns out (B, T, H, Dv)."""
    B, T, H, S, Dh, Dv = 2, 3, 4, 5, 8, 6  # all different, so no axis can stand in for another
    q, k, v = torch.randn(B, T, H, Dh), torch.randn(B, S, H, Dh), torch.randn(B, S, H, Dv)
    what = f"attention_bthd(q, k, v) with q {(B, T, H, Dh)}, k {(B, S, H, Dh)}, v {(B, S, H, Dv)}"
    qs, ks, vs = torch.randn(3, 1, 4, 2, 4).unbind(0)  # (B, T, H, Dh) with T = S = Dh = Dv = 4
    qsh, ksh, vsh = (t.transpose(1, 2) for t in (qs, ks, vs))  # (B, H, T, Dh)
    untransposed = (softmax(qsh @ ksh / 2.0, dim=-1) @ vsh).transpose(1, 2)  # (B, T, H, Dv)
    got = run_or_explain(fn, (q.clone(), k.clone(), v.clone()), what, (qs, ks, vs), {_UNTRANSPOSED: untransposed})
    if isinstance(got, tuple):
        raise CandidateError(f"{what} returned a tuple: return only the output (B, T, H, Dv)")
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh), (B, H, S, Dh), (B, H, S, Dv)
    out, weights = attention(qh, kh, vh)  # (B, H, T, Dv), (B, H, T, S)
    got = reject_shape_mistakes(got, what, {
        "the attention weights (B, H, T, S), not the output weights @ v": weights,
        "the attention weights in (B, T, H, S) layout, not the output weights @ v": weights.transpose(1, 2),
        "the right numbers in (B, H, T, Dv) layout: the output must be (B, T, H, Dv), like q": out,
    })
    as_tensor(got, what, shape=(B, T, H, Dv))
    mistakes = {name: o.transpose(1, 2) for name, o in _attention_mistakes(qh, kh, vh).items()}
    split = attention(q.reshape(B, H, T, Dh), k.reshape(B, H, S, Dh), v.reshape(B, H, S, Dv))[0]
    mistakes["heads split with reshape/view instead of transpose, which scrambles tokens and heads"] = \
        split.reshape(B, T, H, Dv)
    mistakes["the output put back with reshape/view instead of transpose, which scrambles tokens and "
             "heads"] = out.reshape(B, T, H, Dv)
    mistakes["the scores summed over the heads (h left out of the einsum's output subscripts, 'bthd,bshd->bts'): "
             "each head needs its own (T, S) scores"] = \
        (softmax((qh @ kh.mT).sum(1, keepdim=True) / math.sqrt(Dh), dim=-1) @ vh).transpose(1, 2)
    scaled = {f"the scores multiplied by {{c:.4g}} (divided by {{inv:.4g}}) instead of divided by sqrt(Dh) = "
              f"sqrt({Dh}) = {math.sqrt(Dh):.4g}": (lambda c: attention(qh, kh, vh, scale=c)[0].transpose(1, 2),
                                                  1e-3, 1e2)}
    expect_close(got, out.transpose(1, 2), what, mistakes=mistakes, families=scaled,
                 axes=("batch", "query", "head", "feature"))
    return "equals attnlib.attention on (B, T, H, Dh) inputs with T, S, Dh and Dv all different"

