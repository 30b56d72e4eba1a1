"""Chapter 9's tile-step checker: one pass of tiled attention's inner loop, folding a tile of keys into the
running state (m, l, acc), driven by the checker over every tile and compared with softmax attention.

Any state that describes the same softmax passes: acc kept unnormalized (FlashAttention-2, the chapter's),
acc kept normalized as acc / l (FlashAttention-1), m kept in base-2 units for exp2 (Triton's tutorial) or
m kept as the max of the unscaled scores (FlashAttention-2's kernel); the last three pass with a note on what
they change.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, checker, expect_close, matching, run
from attnlib.exercises.ch09_stream import _NEG_INF, State, _comparable, _partial, _safe, checked_state

__all__ = ["check_tile_step"]

_STEP = "tile_step(q, k_tile, v_tile, m, l, acc, scale)"


def _tile_step(q, k, v, m, l, acc, scale, *, rescale_l: bool = True, rescale_acc: bool = True,
               wrong_way: bool = False, old_ref: str = "m", p_ref: str = "m_new", normalize: bool = False,
               keep_m: bool = False, base2: bool = False) -> State:
    """Fold one key tile into the running (m, l, acc), or (with a flag) one classic mistake.

    s = q kᵀ · scale, m' = max(m, rowmax s), l' = l·exp(m - m') + Σ exp(s - m'),
    acc' = acc·exp(m - m') + exp(s - m') v. old_ref / p_ref = "tile": the tile's own max in place of m / m';
    base2: exp2 in place of exp, without the log2(e) factor on the scores.
    """
    exp = torch.exp2 if base2 else torch.exp
    s = q @ k.transpose(-2, -1) * scale  # (N, T, tk)
    m_tile = s.amax(dim=-1)  # (N, T)
    m_new = torch.maximum(m, m_tile)  # (N, T)
    ref, old = _safe(m_new), m_tile if old_ref == "tile" else m
    alpha = exp(ref - old) if wrong_way else exp(old - ref)  # (N, T)
    m_old_safe = torch.where(m.isneginf(), ref, m)  # the old max, or m_new where there is none yet
    p = exp(s - {"tile": m_tile, "m_old": m, "m_old_safe": m_old_safe}.get(p_ref, ref)[..., None])  # (N, T, tk)
    l = (l * alpha if rescale_l else l) + p.sum(dim=-1)
    acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v
    return m if keep_m else m_new, l, acc / l[..., None] if normalize else acc


def _run_tiles(step: Callable[..., State], q, k, v, scale, tile: int, what: str, first: int = 0) -> State:
    """Drive step over the key tiles of k, v from tile `first` on: from the empty state (m = -inf), or from the
    right state after the tiles before it; return the final state."""
    N, T = q.shape[:2]
    shapes = ((N, T), (N, T), (N, T, v.shape[-1]))
    state: State = (torch.full((N, T), _NEG_INF), torch.zeros(N, T), torch.zeros(*shapes[2]))
    if first:
        state = _tile_step(q, k[:, :first * tile], v[:, :first * tile], *state, scale)
    for j in range(first * tile, k.shape[1], tile):
        state = run(step, q, k[:, j:j + tile], v[:, j:j + tile], *(t.clone() for t in state), scale, what=what)
        state = checked_state(state, f"{what} on keys {j}..{min(j + tile, k.shape[1]) - 1}", shapes)
    return state


def _other_forms(state: State, scale: float) -> dict[str, State]:
    """The reader's final state read as the other representations of the same softmax, each with its note."""
    m, l, acc = (t.to(torch.float64) for t in state)
    return {
        "acc is kept normalized (acc / l after every tile, as in FlashAttention-1): right, at the cost of a "
        "division per tile; the chapter keeps acc unnormalized and divides once at the end (FlashAttention-2), "
        "so its loop would divide by l twice with this step": (m, l, acc * l[..., None]),
        "m is kept in base-2 units (the max of s·log2(e), for exp2, as in Triton's tutorial): right, but "
        "the chapter's m is the max of s itself, so m + log(l) is no longer the logsumexp; return "
        "m / log2(e)": (m * math.log(2.0), l, acc),
        "m is the max of the unscaled scores q kᵀ (as FlashAttention-2's kernel keeps it, with scale folded "
        "into the exponent): right, but the chapter's m is the max of s = q kᵀ · scale, so m + log(l) is no "
        "longer the logsumexp; return m · scale": (m * scale, l, acc),
    }


def _mistakes(q, k, v, s, scale, tile, true_max, shapes, first: int = 0) -> dict[str, torch.Tensor]:
    """What each classic mistake ends with (run from tile `first` on, see _run_tiles), comparable with the
    reference, by name."""
    def variant(used_scale: float = scale, keys: slice = slice(None), **kw) -> torch.Tensor:
        def step(q, k, v, m, l, acc, _):
            return _tile_step(q, k[:, keys], v[:, keys], m, l, acc, used_scale, **kw)
        return _comparable(_run_tiles(step, q, k, v, scale, tile, "", first), true_max, "", shapes)
    mistakes = {
        "forgot to rescale the running sum: l must be multiplied by exp(m_old - m_new) when the max grows":
            variant(rescale_l=False),
        "forgot to rescale the accumulator: acc must be multiplied by exp(m_old - m_new) when the max grows":
            variant(rescale_acc=False),
        "rescaled the wrong way: exp(m_new - m_old) instead of exp(m_old - m_new)": variant(wrong_way=True),
        "rescaled the old l and acc by exp(m_tile - m_new), with the tile's own max: the factor is "
        "exp(m_old - m_new), with the running max they were kept relative to": variant(old_ref="tile"),
        "p = exp(s - m_tile) is relative to the tile's own max, but it is added to l and acc kept relative to "
        "m_new: use exp(s - m_new)": variant(p_ref="tile"),
        "p = exp(s - m_old), the tile's scores against the old max, added to l and acc rescaled to m_new: use "
        "exp(s - m_new); on the first tile m_old = -inf, so p = exp(+inf) = inf and l and acc become inf and NaN":
            variant(p_ref="m_old"),
        "p = exp(s - m_old), the tile's scores against the old max (m_new only where m_old = -inf), added to l and "
        "acc rescaled to m_new: where the max grows, the tile's terms are too large by exp(m_new - m_old) (inf once "
        "it grows by more than about 88); use exp(s - m_new)":
            variant(p_ref="m_old_safe"),
        "acc divided by l after every tile, then rescaled next time as if it were not: keep acc unnormalized "
        "and divide once at the end": variant(normalize=True),
        "returned the old m: the new state's m is m_new = max(m, rowmax s)": variant(keep_m=True),
        "the scale left out of the scores": variant(used_scale=1.0),
        "divided the scores by scale: scale = 1/sqrt(Dh) multiplies them (s = q kᵀ · scale)":
            variant(used_scale=1.0 / scale),
        "scaled twice: scale is already 1/sqrt(Dh), so s = q kᵀ · scale needs no further / sqrt(Dh)":
            variant(used_scale=scale * scale),
        "exp2 without the log2(e) factor: 2^s = e^(s·ln 2) is a softmax at another temperature; multiply the "
        "scores by log2(e) = 1.4427 (scale·log2(e)) before exp2": variant(base2=True),
        "the last key of each tile left out (an off-by-one in the tile's bounds)": variant(keys=slice(None, -1)),
        "the first key of each tile left out (an off-by-one in the tile's bounds)": variant(keys=slice(1, None)),
    }
    for m_kept in (true_max, torch.full_like(true_max, _NEG_INF)):  # m returned updated, or left at -inf
        mistakes[f"no max subtraction: exp(s) overflows for scores in the hundreds"
                 f"{'' if m_kept is true_max else ' (and m never updated)'}"] = _no_max(s, v, m_kept, shapes)
    return mistakes


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
    scale = 1.0 / math.sqrt(Dh)
    s = q @ k.transpose(-2, -1) * scale  # (N, T, S), only to build the reference
    true_max, shapes = s.amax(-1), ((N, T), (N, T), (N, T, Dv))
    expected = _comparable(_partial(s, v), true_max, "the reference", shapes)
    final = _run_tiles(fn, q, k, v, scale, tile, _STEP)
    got = _comparable(final, true_max, _STEP, shapes)
    done = f"{S} keys in tiles of {tile}, the max growing late, scores in the hundreds"
    if not matching(got, {"": expected}, atol=1e-4):
        forms = {note: _comparable(alt, true_max, _STEP, shapes) for note, alt in _other_forms(final, scale).items()}
        for note in (n for n, alt in forms.items() if matching(alt, {n: expected}, atol=1e-4)):
            return f"{done}; {note}"
        if not final[1].any():
            raise CandidateError(f"{_STEP} left l at 0 after every tile: l is the running sum Σ exp(s - m), which "
                                 f"grows with each tile (if m carries the logsumexp and acc is normalized, l is 1)")
    mistakes = _mistakes(q, k, v, s, scale, tile, true_max, shapes)
    found = matching(got, mistakes, atol=1e-4)
    if len(found) > 1 and got.isnan().any():  # NaN from m = -inf on the first tile: told apart from a finite state
        later = _comparable(_run_tiles(fn, q, k, v, scale, tile, _STEP, first=1), true_max, _STEP, shapes)
        told = matching(later, _mistakes(q, k, v, s, scale, tile, true_max, shapes, first=1), atol=1e-4)
        mistakes = {name: mistakes[name] for name in found if name in told} or mistakes
    expect_close(got, expected, _STEP, mistakes=mistakes, atol=1e-4)
    return done


def _no_max(s: torch.Tensor, v: torch.Tensor, m: torch.Tensor, shapes: tuple) -> torch.Tensor:
    """What a tile loop that sums exp(s) without subtracting any max ends with, returning m as given."""
    p = torch.exp(s)  # (N, T, S), inf where a score exceeds ~88
    return _comparable((m, p.sum(-1), p @ v), s.amax(-1), "", shapes)
