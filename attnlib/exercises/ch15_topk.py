"""The checker of chapter 15's top-k key selection under a causal mask (DeepSeek-V3.2's sparse attention).

A right answer is judged by what it must satisfy, not by one tie-breaking: query i keeps exactly min(k, i + 1)
keys, all at positions j <= i, and none of them scores below a visible key it leaves out. Where scores tie at
the k-th place any choice among the tied keys is right. Mistakes are named on scores without ties first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, run

__all__ = ["check_topk_selection"]


def _causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()                     # (T, T): j <= i


def _top(scores: torch.Tensor, k: int, allowed: torch.Tensor | None, *, largest: bool = True,
         fill: float | None = None, and_mask: bool = True, dim: int = -1) -> torch.Tensor:
    """The keys torch.topk picks (a bool mask of scores' shape), with the usual variants."""
    fill = (-torch.inf if largest else torch.inf) if fill is None else fill
    s = scores if allowed is None else scores.masked_fill(~allowed, fill)
    top = s.topk(min(k, s.shape[dim]), dim=dim, largest=largest).indices
    chosen = torch.zeros_like(s, dtype=torch.bool).scatter(dim, top, True)
    return chosen & allowed if and_mask and allowed is not None else chosen


def _as_mask(got: object, what: str, shape: tuple[int, ...], k: int) -> torch.Tensor:
    """The reader's result as a bool mask of `shape`: bool, 0/1 integers, or an additive 0/-inf float mask."""
    got = as_tensor(got, what)
    if k < shape[-1] and tuple(got.shape) == (*shape[:-1], k) and not got.is_floating_point():
        raise CandidateError(f"{what} returned indices {tuple(got.shape)}, not a mask {shape}: scatter them into "
                             f"a bool mask (zeros_like(scores, dtype=bool).scatter(-1, indices, True)) and AND it "
                             f"with the causal mask")
    got = as_tensor(got, what, shape=shape)
    if got.dtype == torch.bool:
        return got
    values = set(got.unique().tolist())
    if got.is_floating_point() and all(v == 0 or v <= -1e4 for v in values):
        return got == 0                                                   # additive: 0 = kept, -inf = hidden
    if not got.is_floating_point() and values <= {0, 1}:
        return got.bool()
    if got.is_floating_point() and values <= {0.0, 1.0}:
        raise CandidateError(f"{what} is a float mask of 0s and 1s: a float mask is added to the scores, so it "
                             f"would hide nothing. Return bool (True = kept)")
    raise CandidateError(f"{what} holds {sorted(values)[:4]}: return a bool mask, True = the key is kept")


def _violation(got: torch.Tensor, scores: torch.Tensor, k: int) -> str:
    """'' if got is a right selection of scores (..., T, T), else what the first wrong row does."""
    T = scores.shape[-1]
    causal = _causal(T)
    rows_got, rows_s = got.reshape(-1, T, T), scores.reshape(-1, T, T)
    for b in range(rows_got.shape[0]):
        for i in range(T):
            kept, s = rows_got[b, i], rows_s[b, i]
            where = f"query {i}" + (f" of row block {b}" if rows_got.shape[0] > 1 else "")
            if (kept & ~causal[i]).any():
                j = int((kept & ~causal[i]).nonzero()[0])
                return f"{where} keeps key {j}, after itself: only keys j <= i are visible"
            want = min(k, i + 1)
            visible_dropped = causal[i] & ~kept
            tie = bool(kept.any() and visible_dropped.any() and s[kept].min() == s[visible_dropped].max())
            if int(kept.sum()) != want:
                more = int(kept.sum()) > want
                why = (": a threshold at the k-th score (scores >= k-th largest) keeps every key tied with it; "
                       "take exactly k, as torch.topk does" if more and _tied_at_k(s[: i + 1], want) else "")
                return f"{where} keeps {int(kept.sum())} keys, not min(k, i + 1) = {want}{why}"
            if visible_dropped.any() and s[kept].min() < s[visible_dropped].max() and not tie:
                return f"{where} keeps a key scoring below one it leaves out: keep the k highest"
    return ""


def _tied_at_k(s: torch.Tensor, k: int) -> bool:
    """Whether the k-th and (k+1)-th largest of s tie."""
    ranked = s.sort(descending=True).values
    return len(ranked) > k and bool(ranked[k - 1] == ranked[k])


def _mistakes(scores: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    T = scores.shape[-1]
    causal, right = _causal(T), _top(scores, k, _causal(T))
    return {
        "the causal mask off by one: query i may keep key i + 1, the next token":
            _top(scores, k, torch.ones(T, T, dtype=torch.bool).tril(1)),
        "the diagonal masked: a query may keep its own key (j <= i)": _top(scores, k, causal.tril(-1)),
        "no causal mask: keys after the query are kept": _top(scores, k, None),
        "the top k over all keys, masked afterwards: take the top k among the visible keys (mask with -inf first)":
            _top(scores, k, None) & causal,
        "the masked keys filled with 0 (or another finite number), not -inf: a visible score below it loses to a "
        "hidden key":
            _top(scores, k, causal, fill=0.0, and_mask=False),
        "the hidden keys filled with 0 (or another finite number, such as -1e4) and the result ANDed with the "
        "causal mask: fewer than k visible keys kept where visible scores are below the fill; fill with -inf":
            _top(scores, k, causal, fill=0.0),
        "rows with fewer than k visible keys keep hidden ones: torch.topk returns k indices even when only "
        "i + 1 keys are visible; AND the result with the causal mask": _top(scores, k, causal, and_mask=False),
        "the k lowest scores, not the highest": _top(scores, k, causal, largest=False),
        "an inverted mask (True where a key is dropped)": ~right,
        "the mask transposed (keys along the rows)": right.transpose(-1, -2),
        "the top k over queries (dim=-2), not over keys (dim=-1)": _top(scores, k, causal, dim=-2),
        "k + 1 keys per query: off by one": _top(scores, k + 1, causal),
        "k - 1 keys per query: off by one": _top(scores, max(k - 1, 1), causal),
    }


@checker("top-k selection under a causal mask")
def check_topk_selection(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(scores, k) with scores (..., T, T) (query i's score for key j at [..., i, j]) returns a bool mask of the
    same shape, True at the k highest-scoring keys j <= i of each query (all i + 1 of them while i + 1 <= k)."""
    gen = torch.Generator().manual_seed(15)
    cases = [(torch.randn(2, 9, 9, generator=gen), 3, "scores of shape (2, 9, 9) without ties"),
             (torch.randn(7, 7, generator=gen), 4, "scores of shape (7, 7) without ties"),
             (torch.randn(2, 5, 5, generator=gen), 8, "scores of shape (2, 5, 5) with k = 8 > T"),
             (torch.relu(torch.randn(2, 10, 10, generator=gen)).round(decimals=1), 3,
              "scores of shape (2, 10, 10) with ties (ReLU's zeros, as the indexer makes)"),
             (1e10 * torch.randn(2, 8, 8, generator=gen), 3, "scores of shape (2, 8, 8) as large as 1e10")]
    for scores, k, about in cases:
        what = f"select(scores, k={k}) on {about}"
        got = _as_mask(run(fn, scores.clone(), k, what=what), what, tuple(scores.shape), k)
        wrong = _violation(got, scores, k)
        if not wrong:
            continue
        found = [name for name, m in _mistakes(scores, k).items() if torch.equal(got, m)]
        if not found and "keeps" in wrong and scores.abs().max() > 1e9:
            wrong += (" (are the hidden keys filled with a finite number such as -1e4 or -1e9? a visible score below "
                      "it then loses to a hidden key: fill with -inf)")
        raise CandidateError(f"{what} is wrong: " + (f"it matches {found[0]}" if found else wrong))
    return ("each query keeps exactly min(k, i + 1) of the keys j <= i, none scoring below a visible key left "
            "out; any choice among keys tied at the k-th place is accepted")
