"""Checkers for chapter 1 (attention from scratch): a stable softmax, einsum attention, one query with loops.

`score_mistakes`, `run_or_explain` and `reject_shape_mistakes` are shared with chapter 2's checkers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from attnlib.attention import attention, softmax
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, matching, run

__all__ = ["check_stable_softmax", "check_attention_einsum", "check_one_query_attention"]

_INF = float("inf")
_NAIVE = ("exp() overflowing: exp(1000) is inf in float32 (and above about 709 in float64), and "
          "inf / inf is NaN; subtract the row's largest score before exp")
_NO_KEEPDIM = ("without keepdim=True: x - x.amax(dim=-1) lines the maxima (..., T) up with the last axis "
               "of x (..., T, S), not with its rows")
_UNTRANSPOSED = "K is not transposed: Q K instead of Q Kᵀ (k.transpose(-2, -1))"


def score_mistakes(q: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """The wrongly scaled scores readers write, by name: q (..., H, T, Dh), k (..., H, S, Dh) → (..., H, T, S)."""
    Dh, S = q.shape[-1], k.shape[-2]
    H = q.shape[-3] if q.dim() >= 3 else 1
    raw = q @ k.transpose(-2, -1)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    heads = {"the wrong scale: divided by sqrt(H), the number of heads, instead of sqrt(Dh)": raw / math.sqrt(H)}
    return {
        "no scale: Q Kᵀ is never divided by sqrt(Dh)": raw,
        "the wrong scale: divided by Dh instead of sqrt(Dh)": raw / Dh,
        "the wrong scale: multiplied by sqrt(Dh) instead of divided by it": raw * math.sqrt(Dh),
        "the wrong scale: divided by sqrt(D) = sqrt(H · Dh), the model width, instead of sqrt(Dh), "
        "the head width": raw / math.sqrt(H * Dh),
        "the wrong scale: divided by sqrt(S), the number of keys, instead of sqrt(Dh)": raw / math.sqrt(S),
        **(heads if H > 1 else {}),
    }


def run_or_explain(fn: Callable, args: Sequence, what: str,
                   square_args: Sequence, square_mistakes: dict[str, torch.Tensor]) -> object:
    """Run fn(*args) on inputs whose sizes all differ. If it raises, run it on square inputs: when its
    result there matches one of `square_mistakes` (bugs that only run when sizes agree), name that bug."""
    try:
        return run(fn, *args, what=what)
    except CandidateError as error:
        try:
            got = run(fn, *square_args, what=what)
        except CandidateError:
            raise error from None
        found = matching(got, square_mistakes) if isinstance(got, torch.Tensor) else []
        if found:
            raise CandidateError(f"{' and '.join(found)}. Such code only runs when the sizes agree, and on "
                                 f"square inputs your result matches this mistake. With sizes that all "
                                 f"differ, {error}") from None
        raise


def reject_shape_mistakes(got: object, what: str, shape_mistakes: dict[str, torch.Tensor]) -> torch.Tensor:
    """Return got if it is a tensor; raise a CandidateError naming the mistake when it equals one of
    `shape_mistakes` (wrong results of another shape: the weights instead of the output, ...)."""
    found = matching(as_tensor(got, what), shape_mistakes)
    if found:
        raise CandidateError(f"{what} returned {' and '.join(found)}")
    return got


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
    expect_close(got, out[0], what, mistakes=mistakes)


@checker("one query with loops")
def check_one_query_attention(fn: Callable[[list, list, list], list]) -> str:
    """fn(q, keys, values) on Python lists: q (Dh,), keys (S, Dh), values (S, Dv) → the output (Dv,)."""
    q, keys, values = (torch.randn(*shape).round(decimals=2).tolist() for shape in ((3,), (4, 3), (4, 2)))
    _one_query_stage(fn, q, keys, values)
    big_keys = [[-10.0] * 3, [10.0] * 3, [9.0] * 3]  # scores -1732, 1732, 1559: the largest is not first
    _one_query_stage(fn, [100.0] * 3, big_keys, [[5.0, 5.0], [1.0, 0.0], [0.0, 1.0]], overflow=True)
    return "equals attnlib.attention for one query, and does not overflow on scores above 1000"
