"""Checkers for chapter 9 (efficient attention): online softmax over a stream, merging two partial
softmax results, and the inner loop of tiled attention (the online logsumexp lives in ch09_stream).

A partial result over a block of scores s (..., T, n) with values v (..., n, Dv) is the triple
m = max_j s_j (..., T), l = Σ_j exp(s_j - m) (..., T), acc = Σ_j exp(s_j - m) v_j (..., T, Dv).
Any reference point m describes the same block if l and acc are scaled with it, so states are
compared after rescaling them to the true row max: (l, acc) · exp(m - max).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises.ch09_stream import _NEG_INF, _nan_if_not_finite, _safe, check_online_logsumexp

__all__ = ["check_online_logsumexp", "check_merge_partials", "check_tile_step"]

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # m (..., T), l (..., T), acc (..., T, Dv)


def _merge(a: State, b: State, *, rescale_l: bool = True, rescale_acc: bool = True,
           wrong_way: bool = False, naive_inf: bool = False, keep_first_max: bool = False) -> State:
    """The correct merge of two partial results, or (with a flag) one classic mistake."""
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    if keep_first_max:  # block 1's max as the reference: its own factor is 1
        f2 = torch.exp(m2 - m1)
        return m1, l1 + l2 * f2, acc1 + acc2 * f2[..., None]
    m = torch.maximum(m1, m2)
    ref = m if naive_inf else _safe(m)
    f1, f2 = (torch.exp(ref - m1), torch.exp(ref - m2)) if wrong_way else (torch.exp(m1 - ref), torch.exp(m2 - ref))
    l = l1 * f1 + l2 * f2 if rescale_l else l1 + l2
    acc = acc1 * f1[..., None] + acc2 * f2[..., None] if rescale_acc else acc1 + acc2
    return m, l, acc


def _partial(s: torch.Tensor, v: torch.Tensor) -> State:
    """The partial result (m, l, acc) of scores s (..., T, n) and values v (..., n, Dv)."""
    m = s.amax(dim=-1)  # (..., T)
    p = torch.exp(s - _safe(m)[..., None])  # (..., T, n)
    return m, p.sum(dim=-1), p @ v


def _comparable(state: State, true_max: torch.Tensor, what: str, shapes: tuple) -> torch.Tensor:
    """(l, acc) rescaled to the true row max, as one (..., T, 1 + Dv) tensor; checks types and shapes."""
    if not isinstance(state, (tuple, list)) or len(state) != 3:
        raise CandidateError(f"{what} should return a tuple (m, l, acc), got {type(state).__name__}")
    m, l, acc = (as_tensor(t, f"{what}'s {n}", s) for t, n, s in zip(state, ("m", "l", "acc"), shapes))
    factor = torch.exp(m.to(torch.float64) - _safe(true_max).to(torch.float64))  # (..., T)
    return _nan_if_not_finite(torch.cat([l[..., None], acc], dim=-1).to(torch.float64) * factor[..., None])


# --- 2. merging two partial results ------------------------------------------------------------

_MERGE_MISTAKES = {
    "forgot to rescale the sums: l = l1 + l2 needs the factors exp(m1 - m) and exp(m2 - m)": dict(rescale_l=False),
    "forgot to rescale the accumulators: acc = acc1 + acc2 needs exp(m1 - m) and exp(m2 - m)":
        dict(rescale_acc=False),
    "rescaled the wrong way: exp(m - m1) instead of exp(m1 - m)": dict(wrong_way=True),
    "kept the first block's max as the reference: exp(m2 - m1) overflows when the second block's scores "
    "are larger; use m = max(m1, m2)": dict(keep_first_max=True),
    "NaN from exp(-inf - (-inf)) for a row that is empty in both blocks: use 0 as the reference where "
    "m = -inf": dict(naive_inf=True),
}


def _blocks():
    """Scores (B, T, S) split into two blocks, with rows whose max lies in either block, huge rows
    (block 2 larger by 200, so exp(m2 - m1) overflows) and a row empty in both blocks."""
    g = torch.Generator().manual_seed(7)
    s, v = torch.randn(2, 6, 9, generator=g) * 3, torch.randn(2, 9, 4, generator=g)
    s[0, 0, 4:] += 200.0  # the second block is far larger: m must be the max of the two
    s[0, 1, :4] += 50.0  # the first block is far larger
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
    mistakes = {name: _comparable(_merge(a, b, **kw), true_max, name, shapes) for name, kw in _MERGE_MISTAKES.items()}
    expect_close(_comparable(got, true_max, what, shapes), expected, what, mistakes=mistakes, atol=1e-4)
    return "the union of two blocks, whichever holds the max, with huge scores and empty rows"


# --- 3. the inner loop of tiled attention ------------------------------------------------------

def _tile_step(q, k, v, m, l, acc, scale, *, rescale_l: bool = True, rescale_acc: bool = True,
               wrong_way: bool = False) -> State:
    """Fold one key tile into the running (m, l, acc), or (with a flag) one classic mistake.

    s = q kᵀ · scale, m' = max(m, rowmax s), l' = l·exp(m - m') + Σ exp(s - m'),
    acc' = acc·exp(m - m') + exp(s - m') v.
    """
    s = q @ k.transpose(-2, -1) * scale  # (N, T, tk)
    m_new = torch.maximum(m, s.amax(dim=-1))  # (N, T)
    ref = _safe(m_new)
    alpha = torch.exp(ref - m) if wrong_way else torch.exp(m - ref)  # (N, T)
    p = torch.exp(s - ref[..., None])  # (N, T, tk)
    l = (l * alpha if rescale_l else l) + p.sum(dim=-1)
    acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v
    return m_new, l, acc


def _run_tiles(step: Callable[..., State], q, k, v, scale, tile: int, what: str) -> State:
    """Drive step over the key tiles of k, v from the empty state; return the final state."""
    N, T = q.shape[:2]
    state: State = (torch.full((N, T), _NEG_INF), torch.zeros(N, T), torch.zeros(N, T, v.shape[-1]))
    for j in range(0, k.shape[1], tile):
        state = run(step, q, k[:, j:j + tile], v[:, j:j + tile], *(t.clone() for t in state), scale, what=what)
        if not isinstance(state, (tuple, list)) or len(state) != 3:
            raise CandidateError(f"{what} should return a tuple (m, l, acc), got {type(state).__name__}")
    return tuple(state)


@checker("one tile of tiled attention")
def check_tile_step(fn: Callable[..., State]) -> str:
    """fn(q, k_tile, v_tile, m, l, acc, scale) folds one key tile into the running (m, l, acc).

    q (N, T, Dh), k_tile (N, tile, Dh), v_tile (N, tile, Dv), m and l (N, T), acc (N, T, Dv): N is the
    batch and head axes flattened into one, N = B·H. scale = 1/sqrt(Dh) multiplies the scores.
    """
    g = torch.Generator().manual_seed(3)
    N, T, S, Dh, Dv, tile = 2, 5, 23, 8, 3, 6
    q, k, v = torch.randn(N, T, Dh, generator=g), torch.randn(N, S, Dh, generator=g), torch.randn(N, S, Dv, generator=g)
    q[0, 0] *= 60.0  # scores in the hundreds: exp without the max overflows
    k[:, -4:] *= 3.0  # the largest scores often come in the last tile: the max grows late
    scale, what = 1.0 / math.sqrt(Dh), "tile_step(q, k_tile, v_tile, m, l, acc, scale)"
    s = q @ k.transpose(-2, -1) * scale  # (N, T, S), only to build the reference
    true_max, shapes = s.amax(-1), ((N, T), (N, T), (N, T, Dv))
    expected = _comparable(_partial(s, v), true_max, "the reference", shapes)
    got = _comparable(_run_tiles(fn, q, k, v, scale, tile, what), true_max, what, shapes)

    def variant(used_scale: float = scale, **kw) -> torch.Tensor:
        step = lambda q, k, v, m, l, acc, _: _tile_step(q, k, v, m, l, acc, used_scale, **kw)  # noqa: E731
        return _comparable(_run_tiles(step, q, k, v, scale, tile, what), true_max, "", shapes)
    mistakes = {
        "forgot to rescale the running sum: l must be multiplied by exp(m_old - m_new) when the max grows":
            variant(rescale_l=False),
        "forgot to rescale the accumulator: acc must be multiplied by exp(m_old - m_new) when the max grows":
            variant(rescale_acc=False),
        "rescaled the wrong way: exp(m_new - m_old) instead of exp(m_old - m_new)": variant(wrong_way=True),
        "the scale left out of the scores": variant(used_scale=1.0),
        "divided the scores by scale: scale = 1/sqrt(Dh) multiplies them (s = q kᵀ · scale)":
            variant(used_scale=1.0 / scale),
    }
    for m_kept in (true_max, torch.full_like(true_max, _NEG_INF)):  # m returned updated, or left at -inf
        mistakes[f"no max subtraction: exp(s) overflows for scores in the hundreds"
                 f"{'' if m_kept is true_max else ' (and m never updated)'}"] = _no_max(s, v, m_kept, shapes)
    expect_close(got, expected, what, mistakes=mistakes, atol=1e-4)
    return f"{S} keys in tiles of {tile}, the max growing late, scores in the hundreds"


def _no_max(s: torch.Tensor, v: torch.Tensor, m: torch.Tensor, shapes: tuple) -> torch.Tensor:
    """What a tile loop that sums exp(s) without subtracting any max ends with, returning m as given."""
    p = torch.exp(s)  # (N, T, S), inf where a score exceeds ~88
    return _comparable((m, p.sum(-1), p @ v), s.amax(-1), "", shapes)
