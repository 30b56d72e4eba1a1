"""Checkers for chapter 16 (serving): speculative decoding's accept/reject step, the residual distribution a
rejected draft is replaced from, and a continuous-batching scheduler's admission step under a block budget.

The first and last return counts: a count alone rarely tells one mistake from another, so the reader's counts
over every case are compared, as a whole, with each mistake's."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises.ch16_mistakes import accept_mistakes, admit_mistakes, admit_rule, count_rule, residual_mistakes

__all__ = ["check_accept_count", "check_residual", "check_admit"]


def _as_count(got: object, what: str) -> int:
    """An int from what the reader returned: an int, a 0-d or one-element integer tensor or array."""
    if isinstance(got, (np.ndarray, np.generic)):
        got = torch.as_tensor(np.asarray(got))
    if isinstance(got, torch.Tensor):
        if got.numel() != 1 or got.is_floating_point() or got.dtype == torch.bool:
            raise CandidateError(f"{what} should return a count (an int), got a {got.dtype} tensor of shape "
                                 f"{tuple(got.shape)}")
        got = int(got.item())
    if isinstance(got, bool) or not isinstance(got, int):
        raise CandidateError(f"{what} should return a count (an int), got {type(got).__name__}")
    return int.__index__(got)                         # a plain int: an int subclass's own __eq__ is not trusted


def _first_wrong(got: list[int], want: list[int], calls: list[str]) -> str:
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    return f"{calls[i]} returned {got[i]}, expected {want[i]}"


def _judge(got: list[int], want: list[int], mistakes: dict[str, list[int]], calls: list[str]) -> None:
    if got == want:
        return
    found = [name for name, counts in mistakes.items() if counts == got]
    raise CandidateError(_first_wrong(got, want, calls) + (f": it matches {found[0]}" if found else ""))


# --- 1. the accept/reject step ------------------------------------------------------------------

def _distributions(g: torch.Generator, rows: int, V: int, sharp: float) -> torch.Tensor:
    return (torch.randn(rows, V, generator=g, dtype=torch.float64) * sharp).softmax(-1)


def _accept_cases() -> list[tuple[torch.Tensor, ...]]:
    """(p (k + 1, V), q (k, V), drafts (k,) drawn from q, u (k,)): seeded, no u within 1e-6 of p/q."""
    g, cases = torch.Generator().manual_seed(16), []
    for k, V, sharp in ((4, 6, 1.5), (5, 8, 2.0), (1, 5, 1.0), (6, 4, 0.7), (3, 10, 2.5), (8, 6, 1.0),
                        (2, 3, 3.0), (5, 7, 1.2), (4, 5, 0.5), (7, 9, 2.0), (3, 4, 1.5), (6, 6, 1.8)):
        p, q = _distributions(g, k + 1, V, sharp), _distributions(g, k, V, sharp)
        drafts = torch.multinomial(q, 1, generator=g)[:, 0]                              # (k,)
        u = torch.rand(k, generator=g, dtype=torch.float64)
        ratio = p[:k].gather(-1, drafts[:, None])[:, 0] / q.gather(-1, drafts[:, None])[:, 0]
        u = torch.where((u - ratio).abs() < 1e-6, (u + 0.5) % 1, u)
        cases.append((p, q, drafts, u))
    p, q, drafts, u = (t.clone() for t in cases[1])                 # a draft the target never picks, u = 0
    p[0, drafts[0]] = 0.0
    p[0] /= p[0].sum()
    u[0] = 0.0
    cases.append((p, q, drafts, u))
    return cases


@checker("speculative decoding's accept/reject step")
def check_accept_count(fn: Callable[..., int]) -> str:
    """fn(p, q, drafts, u) returns how many of the k drafts are accepted: draft i (drafts[i], drawn from q[i]) is
    kept when u[i] < p[i, x] / q[i, x], up to the first that is not. p (k + 1, V) and q (k, V) are probabilities,
    u (k,) uniform draws in [0, 1)."""
    cases = _accept_cases()
    calls = [f"accept(p, q, drafts, u) with k = {len(c[2])} drafts, case {i}" for i, c in enumerate(cases)]
    got = [_as_count(run(fn, *(t.clone() for t in case), what=what), what) for case, what in zip(cases, calls)]
    _judge(got, [count_rule(*case) for case in cases], accept_mistakes(cases), calls)
    return (f"{len(cases)} rounds of 1 to 8 drafts, all-accepted and first-draft-rejected rounds among them "
            f"({sum(a == len(c[2]) for a, c in zip(got, cases))} and {got.count(0)} of them)")


# --- 2. the residual distribution ---------------------------------------------------------------

def _residual_cases() -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    g = torch.Generator().manual_seed(160)
    p, q = _distributions(g, 4, 7, 1.5), _distributions(g, 4, 7, 1.5)
    point = torch.nn.functional.one_hot(torch.tensor([0, 3, 5]), 7).double()          # a deterministic draft
    sparse = _distributions(g, 3, 7, 1.0) * (torch.rand(3, 7, generator=g) > 0.4)     # q with zeros
    sparse[:, 0] += 0.1
    return [(p, q, "p and q of shape (4, 7)"), (_distributions(g, 3, 7, 2.0), point, "a point-mass q (one-hot)"),
            (_distributions(g, 3, 7, 1.0), sparse / sparse.sum(-1, keepdim=True), "q with zeros"),
            (_distributions(g, 24, 5, 1.0).view(2, 3, 4, 5), _distributions(g, 24, 5, 1.0).view(2, 3, 4, 5),
             "p and q of shape (2, 3, 4, 5)")]


@checker("the residual distribution")
def check_residual(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(p, q) with p, q (..., V) probabilities (p != q in every row) returns max(0, p - q) normalised over
    the last dimension: what a rejected draft is replaced from."""
    for p, q, about in _residual_cases():
        what = f"residual(p, q) on {about}"
        got = run(fn, p.clone(), q.clone(), what=what)
        got = as_tensor(got, what)
        want = (p - q).clamp(min=0)
        want = want / want.sum(-1, keepdim=True)
        mistakes = residual_mistakes(p, q)
        if tuple(got.shape) != tuple(p.shape):
            raise CandidateError(f"{what} has shape {tuple(got.shape)}, expected {tuple(p.shape)} (one distribution "
                                 f"per row, over the last dimension)")
        expect_close(got.double() if got.dtype == torch.float32 else got, want, what, mistakes=mistakes, atol=1e-5)
    return "random p and q, a point-mass q (the residual is p without the drafted token), q with zeros, 4-D inputs"


# --- 3. a scheduler step: admission under a block budget ---------------------------------------

def _admit_cases() -> list[tuple]:
    """(waiting, reserved, running, max_batch_size, max_blocks, block_size): hand-made edges, then seeded ones."""
    cases = [([(4, 5), (3, 3)], 0, 0, 4, 2, 4),           # 8 positions: exactly 2 blocks of 4
             ([(5, 4), (2, 2)], 6, 1, 4, 8, 4),           # fills the pool exactly
             ([(3, 2), (9, 9), (1, 2)], 1, 1, 8, 4, 4),   # the second does not fit; the third would
             ([(2, 2)] * 5, 0, 3, 4, 100, 2),             # one batch slot left
             ([(17, 1), (1, 16)], 0, 0, 2, 2, 16),        # 17 - 1 + 1 = 17 positions: 2 blocks
             ([], 0, 0, 4, 10, 4),                        # nobody waits
             ([(4, 1), (8, 1)], 7, 2, 2, 9, 4)]           # the batch is full already
    g = torch.Generator().manual_seed(1616)
    for _ in range(40):
        n = int(torch.randint(1, 7, (1,), generator=g))
        waiting = [tuple(torch.randint(1, 40, (2,), generator=g).tolist()) for _ in range(n)]
        bs = int(torch.randint(1, 9, (1,), generator=g))
        running = int(torch.randint(0, 5, (1,), generator=g))
        cases.append((waiting, int(torch.randint(0, 10, (1,), generator=g)), running,
                      running + int(torch.randint(0, 5, (1,), generator=g)), int(torch.randint(4, 40, (1,), generator=g)), bs))
    return cases


def _admitted(got: object, waiting: list, what: str) -> int:
    """A count from a count, the admitted requests' indices, or the admitted requests themselves."""
    if isinstance(got, (list, tuple)):
        items = list(got)
        if items and all(isinstance(x, (tuple, list)) for x in items):       # the requests themselves
            if [tuple(_as_count(v, what) for v in x) for x in items] == [tuple(w) for w in waiting[:len(items)]]:
                return len(items)
            raise CandidateError(f"{what} admitted {items}, not the first {len(items)} waiting requests in order: "
                                 f"first come, first served stops at the first that does not fit")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            raise CandidateError(f"{what} should return how many requests join (an int), their indices, or the "
                                 f"requests themselves, got {got!r}")
        items = [_as_count(x, what) for x in items]                           # plain ints
        if items != list(range(len(items))):
            raise CandidateError(f"{what} admitted requests {items}, not the first ones in order: first come, first "
                                 f"served stops at the first that does not fit (otherwise a long request could wait forever)")
        return len(items)
    return _as_count(got, what)


@checker("a continuous-batching scheduler's admission step")
def check_admit(fn: Callable[..., object]) -> str:
    """fn(waiting, reserved, running, max_batch_size, max_blocks, block_size) returns how many of the waiting
    requests (a list of (prompt_tokens, max_new_tokens), in arrival order) join now: in order, while the batch
    has fewer than max_batch_size requests and reserved + ceil((prompt + max_new - 1) / block_size) <= max_blocks,
    stopping at the first that does not fit."""
    cases = _admit_cases()
    calls = [f"admit(waiting={c[0]}, reserved={c[1]}, running={c[2]}, max_batch_size={c[3]}, max_blocks={c[4]}, "
             f"block_size={c[5]})" for c in cases]
    got = [_admitted(run(fn, [*c[0]], *c[1:], what=what), c[0], what) for c, what in zip(cases, calls)]
    _judge(got, [admit_rule(*c) for c in cases], admit_mistakes(cases), calls)
    return (f"{len(cases)} scheduler states: exact fits of the pool and of the blocks, a full batch, nobody waiting, "
            f"and a request that does not fit ahead of one that would")
