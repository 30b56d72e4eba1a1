"""Chapter 12's top-p checker (re-exported by ch12): the reader's filter against attnlib's on random logits
where every classic mistake gives a different answer, then on logits with ties and on rows whose
probabilities reach p exactly (uniform logits: 1/8 + 1/8 + ... is exact in floating point).

With ties the nucleus is still the *fewest* tokens that reach p, as transformers' TopPLogitsWarper keeps
it: which of several tied tokens stay is the sort's choice, so any choice passes, but not keeping them all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, full_precision, matching, run
from attnlib.exercises._expect import either
from attnlib.exercises.ch12_top_p_mistakes import named_by_size, nucleus_size, other_p, top_p_mistakes

__all__ = ["check_top_p_filter"]

_INF = float("-inf")


def _no_boundary_tie(logits: torch.Tensor, p: float) -> bool:
    """Whether no cumulative probability of the sorted rows comes within 1e-4 of p (so < and <= agree)."""
    cumulative = logits.softmax(-1).sort(-1, descending=True).values.cumsum(-1)
    return bool(((cumulative - p).abs() > 1e-4).all())


def _top_p_inputs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 40, generator=g, dtype=torch.float64) * 2.5  # (B, vocab): no ties


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


def _tie_cases() -> list[tuple[torch.Tensor, float]]:
    """Logits with ties that the nucleus cuts through, and uniform rows whose sums reach p exactly."""
    tied = torch.tensor([[3.0, 1, 1, 1, 1, 0, -1, -2], [0.5, 2, 2, -1, 2, 0, 1, -3]], dtype=torch.float64)
    uniform = torch.zeros(2, 8, dtype=torch.float64)   # exp(0) = 1: every probability 1/8, exactly, however computed
    return [(tied, 0.66), (tied, 0.45), (uniform, 0.5), (uniform, 0.25)]


def _difference(kept: torch.Tensor, probs: torch.Tensor, p: float) -> str:
    """The first wrong row in the reader's terms: how many tokens it keeps, and the first wrong token."""
    want = nucleus_size(probs, p)
    order = probs.sort(-1, descending=True).indices
    for b in range(kept.shape[0]):
        should = torch.zeros_like(kept[b]).scatter(-1, order[b, :int(want[b])], True)
        if int(kept[b].sum()) == int(want[b]) and torch.equal(kept[b], should):
            continue
        t = int((kept[b] != should).nonzero()[0])
        rank = int((order[b] == t).nonzero()[0]) + 1
        return (f": row {b} keeps {int(kept[b].sum())} tokens where its nucleus has {int(want[b])}; token {t} (the "
                f"{rank}{'st' if rank == 1 else 'nd' if rank == 2 else 'rd' if rank == 3 else 'th'} most likely, "
                f"probability {float(probs[b, t]):.3f}) is {'kept' if kept[b, t] else 'removed'} but should be "
                f"{'removed' if kept[b, t] else 'kept'}")
    return ""


def _check_case(fn: Callable, logits: torch.Tensor, p: float, mistakes: dict[str, torch.Tensor]) -> None:
    """One call of the reader's filter: right when each row keeps the nucleus's number of tokens, every kept
    token at least as likely as every removed one (any choice among ties), and the kept logits unchanged."""
    what = f"top_p_filter(logits, p={p}) with logits of shape {tuple(logits.shape)}"
    got = _as_filtered(as_tensor(run(fn, logits.clone(), p, what=what), what, shape=logits.shape), logits, what)
    kept, probs = ~got.isneginf(), logits.softmax(-1)
    found = matching(_finite(got), {name: _finite(m) for name, m in mistakes.items()})
    if kept.all() and bool((nucleus_size(probs, p) < logits.shape[-1]).any()):
        raise CandidateError(f"{what} removed no token at all: every logit is still finite (was masked_fill's "
                             f"result dropped? it returns a new tensor: assign it, or call masked_fill_ on your copy)"
                             + (f"; on these logits that is also what {either(found)} gives" if found else ""))
    if not bool(kept.any(-1).all()):
        raise CandidateError(f"{what} removed every token of a row (softmax would give NaN): the most likely "
                             f"token always stays" + (f"; it matches {' and '.join(found)}" if found else ""))
    ordered = bool((probs.masked_fill(~kept, 2).amin(-1) >= probs.masked_fill(kept, -1).amax(-1)).all())
    if ordered and torch.equal(kept.sum(-1), nucleus_size(probs, p)):
        if not torch.allclose(got[kept], logits[kept], atol=1e-6):
            raise CandidateError(f"{what} keeps the right tokens but changes their logits: leave the kept "
                                 f"logits as they are (renormalizing is the softmax's job)")
        return
    named = named_by_size(kept, probs, p) if ordered else ""
    if named or found:
        raise CandidateError(f"{what} is wrong: it matches {named or ' and '.join(found)}")
    detail = (other_p(kept, probs, p) if ordered else "") or _difference(kept, probs, p)
    raise CandidateError(f"{what} is wrong{detail}")


@checker("top-p filter")
def check_top_p_filter(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> str:
    """fn(logits, p) with logits (B, vocab) returns logits (B, vocab) where every token outside the
    nucleus (the fewest most likely tokens whose probabilities sum to at least p) is -inf; of tied tokens,
    any as many as needed."""
    for seed, p in ((0, 0.9), (1, 0.5), (2, 0.3), (3, 0.95), (4, 0.05)):
        logits = _top_p_inputs(seed)
        while not _no_boundary_tie(logits, p):
            seed += 100
            logits = _top_p_inputs(seed)
        _check_case(fn, logits, p, top_p_mistakes(logits, p))
    for logits, p in _tie_cases():
        _check_case(fn, logits, p, {})
    return ("the nucleus kept (the most likely tokens until their probabilities reach p, the one that crosses p "
            "included) and every other logit set to -inf, for p from 0.05 to 0.95")
