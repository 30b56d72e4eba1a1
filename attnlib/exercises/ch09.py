"""Checkers for chapter 9 (efficient attention): online softmax over a stream, merging two partial
softmax results, and the inner loop of tiled attention (the online logsumexp lives in ch09_stream, the
tile step in ch09_tile).

A partial result over a block of scores s (..., T, n) with values v (..., n, Dv) is the triple
m = max_j s_j (..., T), l = Σ_j exp(s_j - m) (..., T), acc = Σ_j exp(s_j - m) v_j (..., T, Dv).
Any reference point m describes the same block if l and acc are scaled with it, so states are
compared after rescaling them to the true row max: (l, acc) · exp(m - max).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, checker, expect_close, matching, run
from attnlib.exercises.ch09_stream import _NEG_INF, State, _comparable, _partial, _safe, check_online_logsumexp
from attnlib.exercises.ch09_tile import check_tile_step

__all__ = ["check_online_logsumexp", "check_merge_partials", "check_tile_step"]


def _merge(a: State, b: State, *, rescale_l: bool = True, rescale_acc: bool = True,
           wrong_way: bool = False, naive_inf: bool = False, keep_first_max: bool = False,
           reference=torch.maximum, normalized: bool = False, as_outputs: bool = False,
           crossed: str = "", zeroed: bool = False) -> State:
    """The correct merge of two partial results, or (with a flag) one classic mistake."""
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    if keep_first_max:  # block 1's max as the reference: its own factor is 1
        f2 = torch.exp(m2 - m1)
        return m1, l1 + l2 * f2, acc1 + acc2 * f2[..., None]
    m = reference(m1, m2)
    ref = m if naive_inf else _safe(m)
    f1, f2 = (torch.exp(ref - m1), torch.exp(ref - m2)) if wrong_way else (torch.exp(m1 - ref), torch.exp(m2 - ref))
    if zeroed:  # inf and NaN factors set to 0 (nan_to_num(0, posinf=0))
        f1, f2 = f1.nan_to_num(0.0, posinf=0.0), f2.nan_to_num(0.0, posinf=0.0)
    g1, g2 = (f2, f1) if crossed in ("both", "l") else (f1, f2)  # crossed: block i scaled by the other's factor
    l = l1 * g1 + l2 * g2 if rescale_l else l1 + l2
    g1, g2 = (f2, f1) if crossed in ("both", "acc") else (f1, f2)
    acc = acc1 * g1[..., None] + acc2 * g2[..., None] if rescale_acc else acc1 + acc2
    if as_outputs:  # acc1, acc2 taken for normalized outputs o_i, weighted by l_i · f_i / l
        acc = (acc1 * (l1 * f1)[..., None] + acc2 * (l2 * f2)[..., None]) / l[..., None].clamp_min(1e-30)
    if normalized:  # the output o = acc / l returned in acc's place
        acc = torch.where(l[..., None] > 0, acc / l[..., None].clamp_min(1e-30), torch.zeros_like(acc))
    return m, l, acc


# --- 2. merging two partial results ------------------------------------------------------------

_MERGE_MISTAKES = {
    "forgot to rescale the sums: l = l1 + l2 needs the factors exp(m1 - m) and exp(m2 - m)": dict(rescale_l=False),
    "forgot to rescale the accumulators: acc = acc1 + acc2 needs exp(m1 - m) and exp(m2 - m)":
        dict(rescale_acc=False),
    "neither the sums nor the accumulators rescaled: l = l1 + l2 and acc = acc1 + acc2 add terms measured from "
    "two different maxima; multiply each block's l and acc by exp(m_i - m)": dict(rescale_l=False, rescale_acc=False),
    "the minimum taken for the reference, m = min(m1, m2): exp(m_i - m) then overflows when the blocks' maxima are "
    "far apart; m = max(m1, m2) keeps every factor <= 1": dict(reference=torch.minimum),
    "the minimum taken for the reference, m = min(m1, m2) (so exp(m_i - m) overflows when the maxima are far "
    "apart), and exp(-inf - (-inf)) = NaN where a block is empty; m = max(m1, m2), with 0 as the reference where "
    "m = -inf": dict(reference=torch.minimum, naive_inf=True),
    "rescaled the wrong way: exp(m - m1) instead of exp(m1 - m)": dict(wrong_way=True),
    "rescaled the wrong way: exp(m - m_i) instead of exp(m_i - m), with the infinities that gives set to 0; "
    "exp(m_i - m) is at most 1 and needs no clean-up": dict(wrong_way=True, zeroed=True),
    "the factors crossed: block 1's l and acc scaled by exp(m2 - m) and block 2's by exp(m1 - m); each block's "
    "l and acc are measured from its own max, so block i needs exp(m_i - m)": dict(crossed="both"),
    "the factors crossed in the sums: l = l1·exp(m2 - m) + l2·exp(m1 - m); block i's l is measured from its own "
    "max, so it needs exp(m_i - m), as its acc has": dict(crossed="l"),
    "the factors crossed in the accumulators: acc = acc1·exp(m2 - m) + acc2·exp(m1 - m); block i's acc is "
    "measured from its own max, so it needs exp(m_i - m), as its l has": dict(crossed="acc"),
    "kept the first block's max as the reference: exp(m2 - m1) overflows when the second block's scores "
    "are larger; use m = max(m1, m2)": dict(keep_first_max=True),
    "NaN from exp(-inf - (-inf)) for a row that is empty in both blocks: use 0 as the reference where "
    "m = -inf": dict(naive_inf=True),
    "acc divided by l (the normalized output o = acc / l returned in acc's place): a partial result keeps the "
    "unnormalized sum acc, so that later blocks can still be merged; divide once, at the end": dict(normalized=True),
    "the accumulators taken for normalized outputs (acc = (l1·f1·acc1 + l2·f2·acc2) / l, the merge of two "
    "(o, lse) pairs): acc_i is already the sum Σ exp(s_j - m_i) v_j, weighted by l_i once; just add "
    "f1·acc1 + f2·acc2": dict(as_outputs=True),
}


def _two_at_once() -> dict[str, dict]:
    """Every pair of the single mistakes above that can happen together, named as two at once."""
    single = list(_MERGE_MISTAKES.items())
    pairs = {}
    for i, (text_a, a) in enumerate(single):
        for text_b, b in single[i + 1:]:
            both = {**a, **b}
            if len(both) == len(a) + len(b) and both not in _MERGE_MISTAKES.values() and \
                    not ("keep_first_max" in both and len(both) > 1 and "normalized" not in both):
                pairs[f"two mistakes at once: {text_a}; and {text_b}"] = both
    return pairs


def _blocks():
    """Scores (B, T, S) split into two blocks, with rows whose max lies in either block, huge rows
    (block 2 larger by 200, so exp(m2 - m1) overflows) and a row empty in both blocks."""
    g = torch.Generator().manual_seed(7)
    s, v = torch.randn(2, 6, 9, generator=g) * 3, torch.randn(2, 9, 4, generator=g)
    s[0, 0, 4:] += 200.0  # the second block is far larger: m must be the max of the two
    s[0, 1, :4] += 200.0  # the first block is far larger (a minimum taken for the max overflows here)
    s[1, 2] = _NEG_INF  # nothing to attend to in either block
    s[1, 3, :4] = _NEG_INF  # nothing in the first block
    return s, v


@checker("merge two partial softmax results")
def check_merge_partials(fn: Callable[..., State]) -> str:
    """fn(m1, l1, acc1, m2, l2, acc2) returns (m, l, acc) for the union of the two blocks."""
    s, v = _blocks()
    a, b = _partial(s[..., :4], v[:, :4]), _partial(s[..., 4:], v[:, 4:])
    what = "merge(m1, l1, acc1, m2, l2, acc2)"
    got = run(fn, *(t.clone() for t in (*a, *b)), what=what)
    true_max = s.amax(dim=-1)
    shapes = (true_max.shape, true_max.shape, (2, 6, 4))
    expected = _comparable(_partial(s, v), true_max, "the reference", shapes)
    if isinstance(got, (tuple, list)) and len(got) == 3 and isinstance(got[0], torch.Tensor) and \
            not matching(got[0], {"m": torch.maximum(a[0], b[0])}):
        fixed = _comparable((torch.maximum(a[0], b[0]), *got[1:]), true_max, what, shapes)
        if matching(fixed, {"right": expected}, atol=1e-4):
            raise CandidateError(f"{what} is wrong: l and acc are right for the reference m = max(m1, m2), but the m "
                                 f"it returns is not that maximum: return the m that l and acc are measured from")
    got = _comparable(got, true_max, what, shapes)
    mistakes = {name: _comparable(_merge(a, b, **kw), true_max, name, shapes) for name, kw in _MERGE_MISTAKES.items()}
    if not matching(got, mistakes, atol=1e-4):             # one mistake first; two at once only if none fits
        pairs = {name: _comparable(_merge(a, b, **kw), true_max, name, shapes) for name, kw in _two_at_once().items()}
        mistakes = {name: pairs[name] for name in matching(got, pairs, atol=1e-4)[:1]} or mistakes  # ties: the first
    expect_close(got, expected, what, mistakes=mistakes, atol=1e-4)
    return "the union of two blocks, whichever holds the max, with huge scores and empty rows"
