"""The top-p checker's catalogue of mistakes (ch12_top_p runs the checks): what each usual wrong filter gives
on the same logits, and the mistakes told apart by how many tokens a row keeps (ties, the exact boundary,
the nucleus of another p)."""

from __future__ import annotations

import torch

from attnlib.generation import top_p_filter

__all__ = ["top_p_mistakes", "nucleus_size", "named_by_size", "other_p"]

_INF = float("-inf")


def _unsort(mask_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A mask over sorted positions back in vocabulary order (order[b, r] = the token at rank r)."""
    return torch.empty_like(mask_sorted).scatter_(-1, order, mask_sorted)


def _kept_before_p(sorted_values: torch.Tensor, p: float) -> torch.Tensor:
    """Sorted position r is kept when the values before it sum to less than p."""
    return sorted_values.cumsum(-1) - sorted_values < p


def _linear(z: torch.Tensor) -> torch.Tensor:
    """Non-negative scores normalised by their sum per row (a softmax without the exp)."""
    return z / z.sum(-1, keepdim=True).clamp_min(1e-30)


def _nucleus(scores: torch.Tensor, p: float) -> torch.Tensor:
    """The nucleus (in vocabulary order) that `scores` taken for probabilities would give."""
    desc, order = scores.sort(-1, descending=True)
    return _unsort(_kept_before_p(desc, p), order)


def top_p_mistakes(logits: torch.Tensor, p: float) -> dict[str, torch.Tensor]:
    probs = logits.softmax(-1)
    desc, order = probs.sort(-1, descending=True)
    asc, order_asc = probs.sort(-1)
    by_batch = logits.softmax(0)
    batch_desc, batch_order = by_batch.sort(-1, descending=True)

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
        "the probabilities taken as the logits shifted to start at 0 and divided by their sum, (z - min z) / "
        "Σ(z - min z), instead of softmax(z): a linear normalisation gives unlikely tokens far too much mass, so the "
        "nucleus comes out too large; apply softmax (exp, then normalise) first":
            keep(_nucleus(_linear(logits - logits.amin(-1, keepdim=True)), p)),
        "the probabilities taken as the positive logits divided by their sum, relu(z) / Σ relu(z), instead of "
        "softmax(z): apply softmax (exp, then normalise) first": keep(_nucleus(_linear(logits.clamp_min(0)), p)),
        "the probabilities taken as the logits divided by their sum, z / Σz, instead of softmax(z) (logits can be "
        "negative, and so can their sum: the order even flips): apply softmax (exp, then normalise) first":
            keep(_nucleus(logits / logits.sum(-1, keepdim=True), p)),
        "each token kept when its own probability is >= p (that is min-p-like): top-p sums the sorted "
        "probabilities until they reach p": keep(probs >= p),
        "the mask computed on the sorted probabilities applied to the logits in vocabulary order: scatter it "
        "back first (mask.scatter(-1, order, mask)), so that each decision lands on its own token":
            keep(_kept_before_p(desc, p)),
        "the softmax over the batch axis (dim=0) instead of the vocabulary (dim=-1): each row's probabilities must "
        "sum to 1": keep(_unsort(_kept_before_p(batch_desc, p), batch_order)),
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


def nucleus_size(probs: torch.Tensor, p: float, *, strict: bool = True) -> torch.Tensor:
    """(B,) the nucleus size: tokens whose mass before them (sorted) is < p (<= p: the '> p' mistake)."""
    desc = probs.sort(-1, descending=True).values
    before = desc.cumsum(-1) - desc
    return ((before < p) if strict else (before <= p)).sum(-1)


def named_by_size(kept: torch.Tensor, probs: torch.Tensor, p: float) -> str:
    """The tie or boundary mistake that gives `kept` (which holds the most likely tokens), '' if none."""
    n, want = kept.sum(-1), nucleus_size(probs, p)
    last = probs.sort(-1, descending=True).values.gather(-1, (want - 1).clamp_min(0)[:, None])   # (B, 1)
    if torch.equal(n, (probs >= last).sum(-1)):
        return ("every token tied with the last one of the nucleus kept (a threshold on the probability, "
                "`probs >= probs of the last kept token`): the nucleus is the *fewest* tokens that reach p, so of "
                "tied tokens keep only as many as needed, in the sort's order, as transformers' TopPLogitsWarper does")
    if torch.equal(n, nucleus_size(probs, p, strict=False)):
        return ("a token kept while the mass before it is <= p (the classic `cumsum > p` mask shifted right by "
                "one): when the sum reaches p exactly the nucleus is complete, so drop a token once the mass before "
                "it is >= p, as transformers' TopPLogitsWarper does")
    return ""


def other_p(kept: torch.Tensor, probs: torch.Tensor, p: float) -> str:
    """'it keeps the nucleus of p in (a, b] ...' when every row's kept set is the nucleus of one other p."""
    desc = probs.sort(-1, descending=True).values
    n, cum = kept.sum(-1), torch.nn.functional.pad(desc.cumsum(-1), (1, 0))       # cum[k] = mass of the top k
    lo, hi = float(cum.gather(-1, (n - 1)[:, None].clamp_min(0)).max()), float(cum.gather(-1, n[:, None]).min())
    if lo >= hi or lo < p <= hi:
        return ""
    if lo < 1 - p <= hi:
        return (f": it keeps the nucleus of 1 - p = {1 - p:.3g} instead of p = {p:g} (transformers' warper sorts "
                f"ascending and *removes* the tokens whose cumulative sum is <= 1 - p; sorted descending, keep until p)")
    return (f": it keeps the nucleus of a different p, one between {lo:.3g} and {hi:.3g}, in every row, instead of "
            f"p = {p:g} (was p changed on the way, scaled by a temperature, or 1 - p used?)")
