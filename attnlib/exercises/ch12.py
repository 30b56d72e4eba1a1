"""Checkers for chapter 12 (a real language model): a top-p (nucleus) filter (in ch12_top_p), an induction
score (in ch12_induction), a repetition penalty. Each compares the reader's function with attnlib's on inputs
where every classic mistake gives a different answer, and names the mistake it reproduces."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, Unexplained, arg_names, as_tensor, checker, expect_close, run
from attnlib.exercises.ch12_induction import check_induction_score
from attnlib.exercises.ch12_top_p import check_top_p_filter

__all__ = ["check_top_p_filter", "check_induction_score", "check_repetition_penalty"]

_INF = float("-inf")


# --- repetition penalty ----------------------------------------------------------------------

def _penalized(logits: torch.Tensor, input_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' RepetitionPenaltyLogitsProcessor: each seen token's logit / penalty if > 0, * penalty if < 0."""
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, input_ids, True)
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def _ids_first(fn: Callable) -> str:
    """A hint when the reader's first parameter is named like the token ids (transformers' processors take
    (input_ids, scores)), '' otherwise."""
    first = (arg_names(fn, (None,), {}) or [""])[0]
    if first.lower() in ("input_ids", "ids", "tokens", "token_ids", "generated", "prev_tokens", "history"):
        return (f"; your first parameter is named {first!r}, but the exercise's order is (logits, input_ids, "
                f"penalty) (transformers' logits processors take (input_ids, scores)): put the logits first")
    return ""


@checker("repetition penalty")
def check_repetition_penalty(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> str:
    """fn(logits, input_ids, penalty) with logits (B, vocab) and input_ids (B, T) returns (B, vocab): the logit
    of every token that occurs in that row's input_ids divided by `penalty` if it is positive and
    multiplied by it if negative (CTRL's penalty with transformers' sign rule: CTRL divides every one); the
    others unchanged."""
    g = torch.Generator().manual_seed(0)
    B, V = 3, 12
    logits = torch.randn(B, V, generator=g, dtype=torch.float64) * 2       # both signs
    input_ids = torch.tensor([[1, 4, 4, 7, 4], [0, 2, 9, 9, 3], [5, 11, 1, 6, 6]])  # repeats, rows differ
    try:
        _check_penalty(fn, logits, input_ids)
    except CandidateError as exc:
        raise CandidateError(f"{exc}{_ids_first(fn)}") from None
    except _Groups as exc:
        raise CandidateError(f"{exc.args[0]}{_ids_first(fn)}") from None
    return ("each token that occurs in its row's input_ids penalized once: logit / penalty if positive, "
            "logit · penalty if negative; the others unchanged")


class _Groups(Exception):
    """A wrong result described by which groups of logits are wrong (no known mistake reproduces it)."""


def _groups(got: torch.Tensor, want: torch.Tensor, logits: torch.Tensor, seen: torch.Tensor, what: str) -> str:
    """Which groups of logits are right and which wrong: unseen, seen positive, seen negative."""
    close = (got.double() - want).abs() <= 1e-6 * (1 + want.abs())
    groups = {"the logits of tokens that did not occur (which stay as they are)": ~seen,
              "the positive logits of tokens that occurred (logit / penalty)": seen & (logits > 0),
              "the negative logits of tokens that occurred (logit · penalty)": seen & (logits < 0)}
    wrong = [name for name, where in groups.items() if not bool(close[where].all())]
    right = [name.split(" (")[0] for name, where in groups.items() if bool(close[where].all())]
    return (f"{what} is wrong in {' and in '.join(wrong)}" + (f"; {' and '.join(right)} are right" if right else ""))


def _check_penalty(fn: Callable, logits: torch.Tensor, input_ids: torch.Tensor) -> None:
    B, V = logits.shape
    for penalty in (1.3, 2.0, 0.8):  # 0.8 < 1 rewards repetition: the same rule, the other way
        what = f"repetition_penalty(logits, input_ids, penalty={penalty}) with logits {(B, V)}, input_ids {tuple(input_ids.shape)}"
        got = as_tensor(run(fn, logits.clone(), input_ids.clone(), penalty, what=what), what, shape=(B, V))
        if torch.allclose(got.double().logsumexp(-1), torch.zeros(B, dtype=torch.float64), atol=1e-6):
            raise CandidateError(f"{what} returned log-probabilities (each row's logsumexp is 0): return the "
                                 f"penalized logits themselves, the softmax comes later")
        seen = torch.zeros(B, V, dtype=torch.bool).scatter_(-1, input_ids, True)
        counts = torch.zeros(B, V, dtype=torch.float64).scatter_add_(-1, input_ids, torch.ones_like(input_ids, dtype=torch.float64))
        union = seen.any(0, keepdim=True).expand(B, V)
        want = _penalized(logits, input_ids, penalty)
        try:
            _expect_penalty(got, want, what, logits, input_ids, penalty, seen, counts, union)
        except Unexplained:
            if got.shape != want.shape:
                raise
            raise _Groups(_groups(got, want, logits, seen, what)) from None


def _expect_penalty(got, want, what, logits, input_ids, penalty, seen, counts, union) -> None:
    """expect_close against the penalized logits, with the usual mistakes."""
    expect_close(got, want, what, atol=1e-6, mistakes={
        "every seen logit divided by the penalty, whatever its sign: a negative logit divided by it rises "
        "toward 0, which makes the repeated token *more* likely; multiply the negative ones":
            torch.where(seen, logits / penalty, logits),
        "the penalty applied once per occurrence (penalty ** count): CTRL and transformers apply it once per "
        "token that occurs, however often":
            torch.where(logits > 0, logits / penalty ** counts, logits * penalty ** counts),
        "the tokens that did *not* occur penalized instead of those that did":
            torch.where(~seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits),
        "every row penalized for the tokens of all rows: each sequence has its own history":
            torch.where(union, torch.where(logits > 0, logits / penalty, logits * penalty), logits),
        "the penalty subtracted instead of dividing (or multiplying)": torch.where(seen, logits - penalty, logits),
        "the first row's input_ids used for every row (input_ids[0]): each row has its own history":
            _penalized(logits, input_ids[:1].expand_as(input_ids), penalty),
        "the change added once per occurrence (scatter_add of penalized - logit over input_ids, or a `+=` in a "
        "loop over the tokens): a token that occurs c times moves c times as far; penalize each token once "
        "(scatter, not scatter_add)": logits + counts * (_penalized(logits, input_ids, penalty) - logits),
        "the penalty applied after the softmax (to the probabilities, which are all positive, so each seen "
        "one divided): return penalized *logits*; the softmax comes later":
            torch.where(seen, logits.softmax(-1) / penalty, logits.softmax(-1)),
        "the penalty applied to the probabilities and their log returned (log(softmax / penalty)): penalize "
        "the logits themselves": torch.where(seen, logits.softmax(-1) / penalty, logits.softmax(-1)).log(),
        "the penalty applied to log-probabilities (log_softmax first; all negative, so each seen one "
        "multiplied): penalize the logits themselves": torch.where(seen, logits.log_softmax(-1) * penalty,
                                                                     logits.log_softmax(-1)),
        "the signs swapped: positive logits multiplied and negative ones divided (repeats made more likely)":
            torch.where(seen, torch.where(logits > 0, logits * penalty, logits / penalty), logits),
        "only the last token of each row penalized: every token of input_ids counts":
            _penalized(logits, input_ids[:, -1:], penalty),
        "every seen logit multiplied by the penalty, whatever its sign: a positive logit multiplied by it "
        "rises, which makes the repeated token *more* likely; divide the positive ones":
            torch.where(seen, logits * penalty, logits),
        "only the positive logits penalized: a negative one must be multiplied by the penalty, or a repeated "
        "token with a negative logit is not made less likely": torch.where(seen & (logits > 0), logits / penalty, logits),
        "the logits at positions 0 .. T - 1 penalized (the positions of input_ids) instead of the token ids it "
        "holds": _penalized(logits, torch.arange(input_ids.shape[1]).expand_as(input_ids), penalty),
    })
