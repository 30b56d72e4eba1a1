"""Checkers for chapter 17 (attention across processes): the ring's merge step, Ulysses's all-to-all as
a reshape, and one rank's rows of a fused GQA projection. All run in one process: the reader's function
gets what the ranks would hold, and its answer is compared with attnlib.parallel's."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, matching, run
from attnlib.exercises.ch17_mistakes import (merge_lse_mistakes, merge_out_mistakes, qkv_heads_held, qkv_mistakes,
                                            seq_to_heads_mistakes)
from attnlib.parallel.tensor_parallel import qkv_rows
from attnlib.tiles import merge_partials

__all__ = ["check_ring_merge", "check_seq_to_heads", "check_qkv_shard"]

_NEG_INF = float("-inf")


def _expect(got: object, expected: torch.Tensor, what: str, mistakes: Mapping[str, torch.Tensor]) -> None:
    """expect_close, with a wrong shape first compared with the mistakes (a mistake may change the shape)."""
    got = as_tensor(got, what)
    if tuple(got.shape) != tuple(expected.shape):
        found = matching(got, mistakes)
        raise CandidateError(f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
                             + (f": {found[0]}" if found else ""))  # the first: a wrong shape can fit several
    expect_close(got, expected, what, mistakes=mistakes, atol=1e-5)


# --- 1. the ring's merge step -------------------------------------------------------------------

def _ring_blocks() -> tuple[torch.Tensor, ...]:
    """Two blocks' normalized outputs and natural-log log-sum-exps, (B, T, Dv) and (B, T): rows whose
    log-sum-exp is huge (exp overflows) in one block or the other, and rows with no key in one block."""
    g = torch.Generator().manual_seed(17)
    s, v = torch.randn(2, 5, 8, generator=g, dtype=torch.float64) * 2, torch.randn(2, 8, 3, generator=g, dtype=torch.float64)
    s[0, 0, 4:] += 800.0  # block 2 dominates; exp(lse) overflows even in float64
    s[0, 1, :4] += 800.0  # block 1 dominates
    s[1, 2, :4] = _NEG_INF  # a causal ring: no key of block 1 is visible to this query
    s[1, 3, 4:] = _NEG_INF
    parts = []
    for cols in (slice(0, 4), slice(4, 8)):
        lse = torch.logsumexp(s[..., cols], dim=-1)  # (B, T)
        w = torch.exp(s[..., cols] - lse.masked_fill(lse == _NEG_INF, 0.0)[..., None])
        parts += [w @ v[:, cols], lse]
    return tuple(parts)


def _ring_merge(o1, l1, o2, l2) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: each (out, lse) is the partial (m = lse, l = 1, acc = out); chapter 9's merge."""
    one = lambda lse: (lse != _NEG_INF).to(lse.dtype)  # noqa: E731 - a block with no key: l = 0
    m, l, acc = merge_partials((l1, one(l1), o1), (l2, one(l2), o2))
    return acc / l.unsqueeze(-1), m + torch.log(l)


@checker("the ring's merge step")
def check_ring_merge(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> str:
    """fn(out1, lse1, out2, lse2) returns (out, lse) for the two blocks' keys together: out (B, T, Dv)
    normalized, lse (B, T) the natural log of Σ exp(scores) over both blocks."""
    o1, l1, o2, l2 = _ring_blocks()
    what = "merge(out1, lse1, out2, lse2)"
    got = run(fn, *(t.clone() for t in (o1, l1, o2, l2)), what=what)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CandidateError(f"{what} should return (out, lse), two tensors: the next ring step needs the lse too")
    out, lse = _ring_merge(o1, l1, o2, l2)
    with torch.no_grad():
        _expect(got[0], out, f"{what}'s out", merge_out_mistakes(o1, l1, o2, l2, lse))
        _expect(got[1], lse, f"{what}'s lse", merge_lse_mistakes(l1, l2))
    return "rows where either block dominates by e^800, and rows with no key in one block"


# --- 2. Ulysses's all-to-all as a reshape -----------------------------------------------------

def _after_all_to_all(full: torch.Tensor, W: int) -> torch.Tensor:
    """(W, B, H/W, T, Dh): rank g's heads g·H/W .. of every position, from the whole (B, H, T, Dh)."""
    return torch.stack(full.chunk(W, dim=1))


@checker("Ulysses's all-to-all")
def check_seq_to_heads(fn: Callable[[list], list]) -> str:
    """fn(blocks) gets blocks[r] = rank r's (B, H, T/W, Dh) and returns, for each rank g, what it holds
    after the all-to-all: (B, H/W, T, Dh), the g-th group of H/W heads over all T positions."""
    for B, H, T, Dh, W in ((2, 4, 6, 3, 2), (1, 8, 8, 2, 4), (1, 4, 4, 2, 4)):
        full = torch.randn(B, H, T, Dh, dtype=torch.float64)
        blocks = list(full.chunk(W, dim=2))
        what = f"seq_to_heads(blocks) for {W} ranks, H={H}"
        got = run(fn, [b.clone() for b in blocks], what=what)
        if isinstance(got, torch.Tensor) and got.ndim == 5 and len(got) == W:
            got = list(got.unbind(0))  # the W results stacked in one tensor: the same data
        if not isinstance(got, (list, tuple)) or len(got) != W:
            raise CandidateError(f"{what} should return a list of {W} tensors, one per rank, got "
                                 f"{type(got).__name__}" + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""))
        got = [as_tensor(x, f"{what}[{g}]")
               for g, x in enumerate(got)]
        if len({x.shape for x in got}) > 1:
            raise CandidateError(f"{what} returned tensors of shapes {[tuple(x.shape) for x in got]}: every rank "
                                 f"should hold (B, H/W, T, Dh) = {(B, H // W, T, Dh)}")
        got = torch.stack(got)  # (W, B, H/W, T, Dh)
        _expect(got, _after_all_to_all(full, W), what, seq_to_heads_mistakes(full, blocks))
    return "2 and 4 ranks, with one head per rank and several"


# --- 3. one rank's rows of a fused GQA projection ---------------------------------------------

def _round_robin(q, k, v, H: int, H_kv: int, rank: int, W: int, Dh: int) -> torch.Tensor:
    """The rows of query heads rank, rank + W, ... and of the key/value heads they use (a wrong split)."""
    heads = list(range(rank, H, W))
    kv = sorted({i // (H // H_kv) for i in heads})
    rows = lambda w, ids: torch.cat([w[i * Dh:(i + 1) * Dh] for i in ids])  # noqa: E731
    return torch.cat([rows(q, heads), rows(k, kv), rows(v, kv)])


def _which_heads(got: object, want: torch.Tensor, w: torch.Tensor, H: int, H_kv: int, rank: int, W: int,
                 Dh: int, what: str) -> None:
    """A CandidateError naming which heads' rows a wrong answer holds, when each block of Dh rows is some head's."""
    got = as_tensor(got, what)
    held, right = qkv_heads_held(got, w, H, H_kv, Dh), qkv_heads_held(want, w, H, H_kv, Dh)
    if held and held != right:
        raise CandidateError(f"{what} holds the rows of heads {held} (in that order), expected {right}: rank "
                             f"{rank} owns query heads {rank}·H/W .. {rank + 1}·H/W - 1, then the key heads and the "
                             f"value heads they use (query head i uses kv head i // (H / H_kv))")


@checker("a rank's rows of a fused GQA projection")
def check_qkv_shard(fn: Callable[..., torch.Tensor]) -> str:
    """fn(weight, num_heads, num_kv_heads, rank, world_size) returns the rows of the fused [W_q; W_k; W_v]
    weight ((H + 2 H_kv)·Dh, D) that rank keeps under tensor parallelism, [its q rows; its k rows; its v rows]."""
    Dh, D = 2, 5
    configs = ((4, 4, 2), (8, 4, 4), (8, 4, 2), (8, 2, 4), (4, 1, 2), (8, 1, 4), (8, 8, 4))
    for H, H_kv, W, rank in ((H, H_kv, W, r) for H, H_kv, W in configs for r in range(W)):
        w = torch.randn((H + 2 * H_kv) * Dh, D, dtype=torch.float64)
        what = f"qkv_shard(weight, num_heads={H}, num_kv_heads={H_kv}, rank={rank}, world_size={W})"
        got = run(fn, w.clone(), H, H_kv, rank, W, what=what)
        want, q, k, v = qkv_rows(w, H, H_kv, rank, W), *w.split([H * Dh, H_kv * Dh, H_kv * Dh])
        mistakes = qkv_mistakes(w, H, H_kv, rank, W, Dh)
        mistakes[("heads dealt round-robin (rank r got heads r, r + W, ...): this chapter gives each rank a "
                  "contiguous group of query heads")] = _round_robin(q, k, v, H, H_kv, rank, W, Dh)
        if not matching(as_tensor(got, what), {"": want}) and not matching(as_tensor(got, what), mistakes):
            _which_heads(got, want, w, H, H_kv, rank, W, Dh, what)
        _expect(got, want, what, mistakes)
    return "MHA, GQA split among 2 and 4 ranks, kv heads copied when fewer than ranks, and MQA"
