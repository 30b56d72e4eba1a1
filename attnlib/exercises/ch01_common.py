"""What chapter 1's checkers share with later chapters': the wrongly scaled scores, a run that explains an error
by the square inputs on which the reader's code does run, and results of a wrong shape named."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from attnlib.exercises._core import CandidateError, as_tensor, matching, run

__all__ = ["score_mistakes", "run_or_explain", "reject_shape_mistakes"]

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
