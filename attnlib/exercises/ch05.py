"""Checkers for chapter 5 (positions): sinusoidal encoding, RoPE on a query, the RoPE score from the
offset alone, and (ch05_permutation) the permutation behind a shuffled sentence.

`rope_variant` computes RoPE and its usual misreadings in float64; its defaults are attnlib's
RotaryEmbedding (tests: equal).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises.ch04 import result_tensor
from attnlib.exercises.ch05_permutation import check_find_permutation
from attnlib.positional import rotate_half

__all__ = ["check_sinusoidal", "check_rope", "check_rope_offset_score", "check_find_permutation"]

_INTERLEAVED = ("the interleaved layout, pairs (2j, 2j+1) as in the RoFormer paper and Meta's original "
                "Llama code, instead of rotate_half's pairs (j, j + Dh/2) that transformers' Llama uses")


def _sinusoidal_variant(T: int, D: int, *, base: float = 10000.0, exponent: float = -2.0, start: int = 0,
                        swap: bool = False, halves: bool = False) -> torch.Tensor:
    """PE (T, D) in float64; the defaults are the true encoding, PE[p, 2i] = sin(p ω_i), ω_i = base^(-2i/D)."""
    omega = base ** (exponent * torch.arange(D // 2, dtype=torch.float64) / D)         # (D/2,)
    angles = torch.arange(start, start + T, dtype=torch.float64)[:, None] * omega      # (T, D/2)
    first, second = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    if halves:
        return torch.cat((first, second), dim=-1)                                       # (T, D)
    return torch.stack((first, second), dim=-1).reshape(T, D)                           # interleaved: (T, D)


@checker("sinusoidal encoding")
def check_sinusoidal(fn: Callable[[int, int], torch.Tensor]) -> str:
    """fn(T, D) returns the sinusoidal encoding (T, D): PE[pos, 2i] = sin(pos ω_i), PE[pos, 2i+1] = cos(pos ω_i)."""
    T, D = 40, 24  # T != D, so a transposed table cannot pass for the right one
    what = f"sinusoidal_encoding({T}, {D})"
    got = as_tensor(run(fn, T, D, what=what), what)
    if tuple(got.shape) == (D, T):
        raise CandidateError(f"{what} has shape {(D, T)}: the table is transposed, it must be (T, D), one row "
                             f"per position")
    got = result_tensor(got, what, (T, D), "(T, D)")
    mistakes = {
        "sin and cos swapped: sin goes to the even dims 2i, cos to the odd dims 2i+1":
            _sinusoidal_variant(T, D, swap=True),
        "the half layout: all sines in the first D/2 dims and all cosines in the last D/2, instead of "
        "interleaving them (sin at 2i, cos at 2i+1)": _sinusoidal_variant(T, D, halves=True),
        "positions counted from 1: the first row is position 0, sin(0) = 0 and cos(0) = 1":
            _sinusoidal_variant(T, D, start=1),
        "a positive exponent: ω_i = 10000^(+2i/D) multiplies the position instead of dividing it":
            _sinusoidal_variant(T, D, exponent=2.0),
        "the exponent i/D instead of 2i/D (i numbers the sin/cos pairs, and the exponent is 2i/D)":
            _sinusoidal_variant(T, D, exponent=-1.0),
        "the exponent 4i/D instead of 2i/D: torch.arange(0, D, 2) already counts 2i, do not double it":
            _sinusoidal_variant(T, D, exponent=-4.0),
    }
    for base in (100.0, 1000.0, 100000.0, 500000.0):
        mistakes[f"the wrong frequency base: {base:g} instead of 10000"] = _sinusoidal_variant(T, D, base=base)
    expect_close(got, _sinusoidal_variant(T, D), what, mistakes=mistakes, axes=("position", "dim"), families={
        "the frequency base {c:.6g} instead of 10000": (lambda c: _sinusoidal_variant(T, D, base=c), 10.0, 1e7),
        "the exponent {c:.4g}·i/D instead of 2i/D (ω_i = 10000^(-2i/D), i the pair's index)":
            (lambda c: _sinusoidal_variant(T, D, exponent=-c), 0.1, 10.0)})
    return f"equals the encoding of Vaswani et al. for T={T}, D={D}"


def rope_variant(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0, exponent: float = -2.0,
                 interleaved: bool = False, repeat_interleave: bool = False, sign: float = 1.0,
                 swap: bool = False) -> torch.Tensor:
    """x (..., T, Dh) rotated by positions (T,) in float64: x cos + rotate_half(x) sin, θ_j = base^(-2j/Dh).

    The keyword arguments reproduce the usual mistakes (another layout, the angles repeated the
    other way, rotating backwards, cos and sin swapped, another exponent or base).
    """
    x = x.double()
    Dh = x.shape[-1]
    theta = base ** (exponent * torch.arange(Dh // 2, dtype=torch.float64) / Dh)       # (Dh/2,)
    freqs = positions.double()[:, None] * theta                                         # (T, Dh/2)
    if interleaved:  # pairs (2j, 2j+1)
        x1, x2 = x[..., 0::2], x[..., 1::2]                                             # (..., T, Dh/2)
        c, s = freqs.cos(), sign * freqs.sin()
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)     # (..., T, Dh)
    angles = freqs.repeat_interleave(2, dim=-1) if repeat_interleave else torch.cat((freqs, freqs), dim=-1)
    c, s = angles.cos(), angles.sin()                                                   # (T, Dh)
    if swap:
        c, s = s, c
    return x * c + sign * rotate_half(x) * s


def _rope_mistakes(x: torch.Tensor, pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong rotations of x (B, H, T, Dh) at positions pos (T,), by name."""
    return {
        _INTERLEAVED: rope_variant(x, pos, interleaved=True),
        "the angles repeated with repeat_interleave (θ0, θ0, θ1, θ1, ...), the interleaved layout's order, "
        "while rotate_half pairs j with j + Dh/2: concatenate them instead, torch.cat((freqs, freqs))":
            rope_variant(x, pos, repeat_interleave=True),
        "a rotation the wrong way (by -angle): rotate_half(x) must be (-x2, x1), not (x2, -x1)":
            rope_variant(x, pos, sign=-1.0),
        "cos and sin swapped: x * sin + rotate_half(x) * cos": rope_variant(x, pos, swap=True),
        "the exponent j/Dh instead of 2j/Dh in θ_j = 10000^(-2j/Dh)": rope_variant(x, pos, exponent=-1.0),
        "a positive exponent: θ_j = 10000^(+2j/Dh)": rope_variant(x, pos, exponent=2.0),
        "positions off by one (each token rotated by position + 1)": rope_variant(x, pos + 1),
        "positions off by one (each token rotated by position - 1)": rope_variant(x, pos - 1),
        "the positions given ignored: torch.arange(T) used instead (wrong for any token after a KV cache)":
            rope_variant(x, torch.arange(len(pos))),
        **{f"the wrong frequency base: {b:g} instead of 10000": rope_variant(x, pos, base=b)
           for b in (1000.0, 500000.0)},
    }


@checker("RoPE on a query")
def check_rope(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(x, positions): x (B, H, T, Dh) rotated in the rotate_half layout, base 10000, positions (T,)."""
    B, H, T, Dh = 2, 3, 5, 8
    x, pos = torch.randn(B, H, T, Dh), torch.arange(3, 3 + T)  # positions that do not start at 0
    what = f"rope(x, positions) with x {(B, H, T, Dh)} and positions {pos.tolist()}"
    got = result_tensor(run(fn, x.clone(), pos.clone(), what=what), what, (B, H, T, Dh), "(B, H, T, Dh)")
    expect_close(got, rope_variant(x, pos), what, mistakes=_rope_mistakes(x, pos), atol=1e-5,
                 axes=("batch", "head", "position", "feature"), families={
        "each position multiplied by {c:.4g} (linear RoPE scaling, position interpolation?): this exercise rotates "
        "by the positions as given": (lambda c: rope_variant(x, pos * c), 0.05, 20.0),
        "the frequency base {c:.6g} instead of 10000": (lambda c: rope_variant(x, pos, base=c), 10.0, 1e7)})
    return "equals attnlib's RotaryEmbedding (transformers' Llama layout) at positions 3 to 7"


@checker("the RoPE score from the offset")
def check_rope_offset_score(fn: Callable[[torch.Tensor, torch.Tensor, int], object]) -> str:
    """fn(q, k, delta) with q, k (Dh,) returns the score q_m · k_n of RoPE-rotated q at m and k at n = m - delta."""
    Dh, m = 16, 100
    q, k = torch.randn(Dh, dtype=torch.float64), torch.randn(Dh, dtype=torch.float64)
    deltas = [-7, -1, 0, 3, 50]

    def scores(sign: int = -1, **variant) -> torch.Tensor:  # (len(deltas),): q at m, k at m + sign·delta
        return torch.stack([rope_variant(q[None], torch.tensor([m]), **variant)[0]
                            @ rope_variant(k[None], torch.tensor([m + sign * d]), **variant)[0] for d in deltas])

    got = []
    for d in deltas:
        what = f"score(q, k, {d})"
        value = run(fn, q.clone(), k.clone(), d, what=what)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            result_tensor(value, what, tuple(value.shape))  # no complex or half-precision number
        try:
            got.append(torch.as_tensor(value, dtype=torch.float64).reshape(()))
        except (TypeError, ValueError, RuntimeError):
            kind = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise CandidateError(f"{what} should return one number (a float or a 0-d tensor), got {kind}") from None
    expected = scores()
    mistakes = {
        "the offset the wrong way round: n - m instead of m - n": scores(sign=1),
        "q and k both rotated by the same angle, which cancels: that is q · k, with no position at all":
            (q @ k).expand(len(deltas)),
        _INTERLEAVED: scores(interleaved=True),
        "the exponent j/Dh instead of 2j/Dh in θ_j = 10000^(-2j/Dh)": scores(exponent=-1.0),
        "the score divided by sqrt(Dh): asked for is the raw q_m · k_n, before attention's scale":
            expected / Dh ** 0.5,
    }
    expect_close(torch.stack(got), expected, f"score(q, k, delta) for delta in {deltas}", mistakes=mistakes,
                 atol=1e-4)
    return f"the score from the offset alone equals RoPE's q_m · k_n for offsets {deltas}"
