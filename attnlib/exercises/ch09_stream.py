"""Chapter 9's first checker: the logsumexp of a stream of score chunks, read once (online softmax's
running max and running sum). The helpers `_safe`, `_nan_if_not_finite`, `_partial` and `_comparable` are shared
with ch09.py and ch09_tile.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, full_precision, run
from attnlib.exercises.ch07 import CallLog

__all__ = ["check_online_logsumexp"]

_NEG_INF = float("-inf")
State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # m (..., T), l (..., T), acc (..., T, Dv)


def _safe(m: torch.Tensor) -> torch.Tensor:
    """m with -inf (a row that has seen no score yet) replaced by 0, so m - m_safe is never NaN."""
    return m.masked_fill(m == _NEG_INF, 0.0)


def _nan_if_not_finite(x: torch.Tensor) -> torch.Tensor:
    """inf and NaN both become NaN, so that an overflow matches the mistake that overflows the same way."""
    return torch.where(torch.isfinite(x), x, torch.full_like(x, math.nan))


def _partial(s: torch.Tensor, v: torch.Tensor) -> State:
    """The partial result (m, l, acc) of scores s (..., T, n) and values v (..., n, Dv)."""
    m = s.amax(dim=-1)  # (..., T)
    p = torch.exp(s - _safe(m)[..., None])  # (..., T, n)
    return m, p.sum(dim=-1), p @ v


def checked_state(state: object, what: str, shapes: tuple) -> State:
    """The reader's (m, l, acc) as three real tensors in full precision of `shapes`; CandidateError naming
    what is off (not a triple, a non-tensor, a wrong shape, an integer or half-precision dtype)."""
    if not isinstance(state, (tuple, list)) or len(state) != 3:
        size = f" of {len(state)} items" if isinstance(state, (tuple, list)) else ""
        raise CandidateError(f"{what} should return a tuple (m, l, acc), got {type(state).__name__}{size}")
    for t, n, s in zip(state, ("m", "l", "acc"), shapes):
        as_tensor(t, f"{what}: {n}", s)
        if not t.is_floating_point():
            raise CandidateError(f"{what}: {n} is {t.dtype}: the state holds real numbers (exp of scores); "
                                 f"return float32 or float64")
        full_precision(t, f"{what}: {n}")
    return tuple(state)


def _comparable(state: State, true_max: torch.Tensor, what: str, shapes: tuple) -> torch.Tensor:
    """(l, acc) rescaled to the true row max, as one (..., T, 1 + Dv) tensor; checks types and shapes."""
    m, l, acc = checked_state(state, what, shapes)
    factor = torch.exp(m.to(torch.float64) - _safe(true_max).to(torch.float64))  # (..., T)
    return _nan_if_not_finite(torch.cat([l[..., None], acc], dim=-1).to(torch.float64) * factor[..., None])


# --- 1. online logsumexp over a stream ---------------------------------------------------------

def _streams() -> list[list[torch.Tensor]]:
    """Streams of 1-D chunks that catch each mistake: huge scores, a growing max, an empty first chunk."""
    g = torch.Generator().manual_seed(9)
    huge = [1000 + 3 * torch.randn(n, generator=g) for n in (5, 1, 7)]
    growing = [torch.randn(4, generator=g) + 4 * i for i in range(4)]
    shrinking = list(reversed(growing))
    empty_first = [torch.full((3,), _NEG_INF), torch.randn(5, generator=g), torch.tensor([_NEG_INF, 2.0])]
    return [huge, growing, shrinking, empty_first]


def _lse_stream(chunks: list[torch.Tensor], rescale: bool = True, wrong_way: bool = False,
                subtract_max: bool = True, add_max: bool = True, naive_inf: bool = False) -> float:
    """Online logsumexp of a stream (l is kept relative to the running max m), or one classic mistake."""
    m, l = torch.tensor(_NEG_INF, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    for x in chunks:
        x = x.double()
        m_new = torch.maximum(m, x.max()) if subtract_max else torch.zeros_like(m)
        ref = m_new if naive_inf else _safe(m_new)
        factor = torch.exp(ref - m) if wrong_way else torch.exp(m - ref)
        l = (l * factor if rescale else l) + torch.exp(x - ref).sum()
        m = m_new
    return float((m if add_max else 0.0) + torch.log(l))


_CONCATS = {"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack", "row_stack"}


class _StreamWatch(CallLog):
    """Serves one stream of chunks (`stream()`) and records the calls made while the reader's code reads it."""

    def __init__(self, chunks: list[torch.Tensor]) -> None:
        super().__init__()
        self.chunks, self.unused_when_read = [c.clone() for c in chunks], 0

    def stream(self) -> Iterator[torch.Tensor]:
        calls_before = None
        for chunk in self.chunks:  # counts the chunks read while the one before was not used at all
            self.unused_when_read += calls_before == len(self.names)
            calls_before = len(self.names)
            yield chunk

    def kept_every_chunk(self) -> str | None:
        """How the reader's pass kept the whole stream, or None."""
        total = sum(c.numel() for c in self.chunks)
        if any(n in _CONCATS and size >= total for n, size in zip(self.names, self.sizes)):
            return "it keeps every chunk and concatenates them (torch.cat over the whole stream)"
        if self.unused_when_read == len(self.chunks) - 1:
            return "it reads the whole stream (list(chunks), say) before using its first chunk"
        return None


@checker("online logsumexp")
def check_online_logsumexp(fn: Callable[[Iterator[torch.Tensor]], float]) -> str:
    """fn(chunks) reads an iterator of 1-D score chunks once and returns log Σ exp over all of them."""
    streams = _streams()
    got, kept = [], []
    for i, chunks in enumerate(streams):
        watch = _StreamWatch(chunks)
        with watch:
            value = run(fn, watch.stream(), what=f"your function on stream {i}")
        kept.append(watch.kept_every_chunk())
        try:
            got.append(float(value))
        except (TypeError, ValueError, RuntimeError):
            raise CandidateError(f"it should return a number, got {type(value).__name__}") from None
    expected = torch.tensor([float(torch.logsumexp(torch.cat(c).double(), 0)) for c in streams])
    variants = {
        "no max subtraction: exp(1000) overflows to inf": dict(subtract_max=False),
        "forgot to rescale the running sum by exp(m_old - m_new) when the max grows": dict(rescale=False),
        "rescaled the wrong way: exp(m_new - m_old) instead of exp(m_old - m_new)": dict(wrong_way=True),
        "the max is not added back: log l is only the log of the sum relative to the max": dict(add_max=False),
        "NaN from exp(-inf - (-inf)) when the first chunk is all -inf: use 0 as the reference "
        "while the max is still -inf": dict(naive_inf=True),
    }
    mistakes = {name: _nan_if_not_finite(torch.tensor([_lse_stream(c, **kw) for c in streams]))
                for name, kw in variants.items()}
    per_chunk = [torch.stack([torch.logsumexp(x.double(), 0) for x in c if x.numel()]) for c in streams]
    mistakes["the largest of the chunks' logsumexps: log Σ exp over the whole stream adds the chunks' sums, "
             "logsumexp(a ∪ b) = logaddexp(lse_a, lse_b)"] = torch.stack([p.max() for p in per_chunk])
    mistakes["the chunks' logsumexps added: that is the log of a product of their sums; combine them with "
             "torch.logaddexp"] = _nan_if_not_finite(torch.stack([p.sum() for p in per_chunk]))
    expect_close(_nan_if_not_finite(torch.tensor(got, dtype=torch.float64)), expected, "the logsumexp of 4 streams",
                 mistakes=mistakes, atol=1e-6)
    how = next((k for k in kept if k), None)
    if how:
        raise CandidateError(f"the values are right, but {how}, which this exercise rules out: a stream is read "
                             f"once and may be longer than memory; keep only a running max and a running sum, "
                             f"and fold each chunk into them before reading the next")
    return "one pass, no overflow at 1000, a growing and a shrinking max, and an all -inf first chunk"
