"""Checkers for chapter 12 (a real language model): a top-p (nucleus) filter, an induction score (in
ch12_induction), a repetition penalty. Each compares the reader's function with attnlib's on inputs where
every classic mistake gives a different answer, and names the mistake it reproduces."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import (CandidateError, arg_names, as_tensor, checker, expect_close, full_precision,
                                    matching, run)
from attnlib.generation import top_p_filter
from attnlib.exercises.ch12_induction import check_induction_score

__all__ = ["check_top_p_filter", "check_induction_score", "check_repetition_penalty"]

_INF = float("-inf")


# --- 1. top-p ------------------------------------------------------------------------------------

def _no_boundary_tie(logits: torch.Tensor, p: float) -> bool:
    """Whether no cumulative probability of the sorted rows comes within 1e-4 of p (so < and <= agree)."""
    cumulative = logits.softmax(-1).sort(-1, descending=True).values.cumsum(-1)
    return bool(((cumulative - p).abs() > 1e-4).all())


def _top_p_inputs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 40, generator=g, dtype=torch.float64) * 2.5  # (B, vocab): no ties


def _unsort(mask_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A mask over sorted positions back in vocabulary order (order[b, r] = the token at rank r)."""
    return torch.empty_like(mask_sorted).scatter_(-1, order, mask_sorted)


def _kept_before_p(sorted_values: torch.Tensor, p: float) -> torch.Tensor:
    """Sorted position r is kept when the values before it sum to less than p."""
    return sorted_values.cumsum(-1) - sorted_values < p


def _top_p_mistakes(logits: torch.Tensor, p: float) -> dict[str, torch.Tensor]:
    probs = logits.softmax(-1)
    desc, order = probs.sort(-1, descending=True)
    asc, order_asc = probs.sort(-1)
    by_batch = logits.softmax(0)

    def keep(mask: torch.Tensor) -> torch.Tensor:              # mask in vocabulary order -> filtered logits
        return logits.masked_fill(~mask, _INF)

    return {
        "the token that crosses p is dropped (kept while the cumulative sum *including* it is <= p): the "
        "nucleus must reach p, so keep each token while the mass *before* it is below p":
            keep(_unsort(desc.cumsum(-1) <= p, order)),
        "the cumulative sum runs over the vocabulary in its own order: sort the probabilities first "
        "(descending), so that the nucleus is the most likely tokens": keep(_kept_before_p(probs, p)),
        "sorted ascending: the nucleus kept is the least likely tokens; sort in descending order":
            keep(_unsort(_kept_before_p(asc, p), order_asc)),
        "the cumulative sum of the logits instead of the probabilities: apply softmax first":
            keep(_unsort(_kept_before_p(logits.gather(-1, order), p), order)),
        "each token kept when its own probability is >= p (that is min-p-like): top-p sums the sorted "
        "probabilities until they reach p": keep(probs >= p),
        "the result left in sorted order: scatter the kept logits back to their vocabulary positions":
            top_p_filter(logits, p).gather(-1, order),
        "the softmax or cumulative sum over the batch axis (dim=0) instead of the vocabulary (dim=-1)":
            keep(_kept_before_p(by_batch.transpose(0, 1), p).transpose(0, 1)),
        "one token too many kept (the one after the token that crosses p): the nucleus ends with the token "
        "whose probability brings the sum to p": keep(_unsort(desc.cumsum(-1) - desc - desc.roll(1, -1) * (
            torch.arange(desc.shape[-1]) > 0) < p, order)),
        "the sorted mask put back with gather (which sorts it again) instead of scatter: mask.scatter(-1, "
        "order, mask) puts each decision at its token's vocabulary position":
            keep(~(~_kept_before_p(desc, p)).gather(-1, order)),
        "the tokens removed from one row removed from every row (indices taken across the batch, as in code "
        "written for a single sequence): each row has its own nucleus":
            keep(~(~_unsort(_kept_before_p(desc, p), order)).any(0, keepdim=True).expand_as(probs)),
        "the nucleus removed and the rest kept (the comparison reversed)": keep(~_unsort(_kept_before_p(desc, p), order)),
        "p taken as a fraction of the vocabulary (the top p·|V| tokens, a top-k): top-p sums probabilities":
            keep(_unsort(torch.arange(desc.shape[-1]).expand_as(desc) < max(1, int(p * desc.shape[-1])), order)),
        "the removed tokens set to 0 instead of -inf: a logit of 0 still has a probability after the softmax":
            logits.masked_fill(~_unsort(_kept_before_p(desc, p), order), 0.0),
    }


def _finite(t: torch.Tensor) -> torch.Tensor:
    """-inf written as -1e30, so that two filtered results compare as numbers."""
    return t.masked_fill(t.isneginf(), -1e30)


def _as_filtered(got: torch.Tensor, logits: torch.Tensor, what: str) -> torch.Tensor:
    """The reader's result in float64 with 'removed' written as -inf (-1e9 or finfo.min count as removed too)."""
    if bool((got >= 0).all()) and torch.allclose(got.double().sum(-1), torch.ones(1, dtype=torch.float64)):
        raise CandidateError(f"{what} returned probabilities (rows summing to 1), not logits: keep the logits of "
                             f"the nucleus as they are and set every other one to -inf")
    if bool(((got >= 0) & (got <= 1)).all()) and bool((got.double().sum(-1) <= 1 + 1e-6).all()) and \
            bool((logits > 1).any()):
        raise CandidateError(f"{what} returned probabilities (every value in [0, 1], rows summing to at most 1: "
                             f"those of the nucleus, not renormalized), not logits: keep the logits of the nucleus "
                             f"as they are and set every other one to -inf")
    got = full_precision(got, what).double()
    return got.masked_fill(got.isneginf() | (got < got.amax(-1, keepdim=True) - 1e4), _INF)


@checker("top-p filter")
def check_top_p_filter(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> str:
    """fn(logits, p) with logits (B, vocab) returns logits (B, vocab) where every token outside the
    nucleus (the fewest most likely tokens whose probabilities sum to at least p) is -inf."""
    cases = [(seed, p) for seed, p in ((0, 0.9), (1, 0.5), (2, 0.3), (3, 0.95), (4, 0.05))]
    for seed, p in cases:
        logits = _top_p_inputs(seed)
        while not _no_boundary_tie(logits, p):
            seed += 100
            logits = _top_p_inputs(seed)
        what = f"top_p_filter(logits, p={p}) with logits of shape {tuple(logits.shape)}"
        got = as_tensor(run(fn, logits.clone(), p, what=what), what, shape=logits.shape)
        got = _as_filtered(got, logits, what)
        expected = top_p_filter(logits, p)
        mistakes = {name: _finite(m) for name, m in _top_p_mistakes(logits, p).items()}
        if bool(got.isneginf().all(-1).any()):
            found = matching(_finite(got), mistakes)
            raise CandidateError(f"{what} removed every token of a row (softmax would give NaN): the most likely "
                                 f"token always stays" + (f"; it matches {' and '.join(found)}" if found else ""))
        same_kept = torch.equal(got.isneginf(), expected.isneginf())
        if same_kept and not torch.allclose(got[~got.isneginf()], logits[~expected.isneginf()], atol=1e-6):
            raise CandidateError(f"{what} keeps the right tokens but changes their logits: leave the kept "
                                 f"logits as they are (renormalizing is the softmax's job)")
        expect_close(_finite(got), _finite(expected), what, mistakes=mistakes)
    return ("the nucleus kept (the most likely tokens until their probabilities reach p, the one that crosses p "
            "included) and every other logit set to -inf, for p from 0.05 to 0.95")


# --- 2. repetition penalty ----------------------------------------------------------------------

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
    return ("each token that occurs in its row's input_ids penalized once: logit / penalty if positive, "
            "logit · penalty if negative; the others unchanged")


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
        expect_close(got, _penalized(logits, input_ids, penalty), what, atol=1e-6, mistakes={
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
    return ("each token that occurs in its row's input_ids penalized once: logit / penalty if positive, "
            "logit · penalty if negative; the others unchanged")
