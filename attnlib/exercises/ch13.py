"""Checkers for chapter 13 (beyond GQA): a sliding-window mask, a block-table lookup (the rolling-buffer update
lives in ch13_rolling, the int8 quantization checker in ch13_int8)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, Unexplained, as_tensor, checker, expect_close, run
from attnlib.exercises.ch07 import _tensor_or_named
from attnlib.exercises.ch13_int8 import check_int8_quantization
from attnlib.exercises.ch13_rolling import check_rolling_buffer_update

__all__ = ["check_sliding_window_mask", "check_rolling_buffer_update", "check_block_table_lookup",
           "check_int8_quantization"]


def _window_mask(T: int, lo: int, hi: int) -> torch.Tensor:
    """(T, T) bool, True where lo <= i - j <= hi: query i may see the keys lo .. hi positions back."""
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]   # (T, T): i - j, how far back key j is
    return (d >= lo) & (d <= hi)


def _as_bool_mask(got: object, what: str, T: int) -> torch.Tensor:
    """The reader's mask, which must be a bool tensor of (T, T) (leading 1-dims allowed: they broadcast).
    Anything else is refused with the rule: the chapter applies `~mask`, and SDPA *adds* a float mask."""
    rule = "the exercise asks for a bool tensor, True = may attend (the chapter's code applies `~mask`)"
    try:
        got = as_tensor(got, what)
    except CandidateError as exc:
        raise CandidateError(f"{exc}; {rule}") from None
    while got.dim() > 2 and got.shape[0] == 1:
        got = got[0]                                           # (1, 1, T, T) broadcasts like (T, T)
    got = as_tensor(got, what, shape=(T, T))
    if got.dtype == torch.bool:
        return got
    values = set(got.unique().tolist())
    if got.is_floating_point() and all(v == 0 or v <= -1e4 for v in values):
        kind = ("an additive float mask (0 = may attend, a huge negative = hidden): SDPA would add it to the "
                "scores, but ~mask raises on a float tensor")
    elif values <= {0, 1}:
        kind = (f"a {got.dtype} mask of 0s and 1s: SDPA *adds* a float mask to the scores, so it would add 1 "
                f"to some scores and hide nothing, and ~mask flips every bit of an integer")
    else:
        kind = f"a {got.dtype} tensor holding {sorted(values)[:4]}"
    raise CandidateError(f"{what} is {kind}. {rule[0].upper()}{rule[1:]}: return the bool mask itself "
                         f"(a comparison such as `(i - j >= 0) & (i - j < window)` is bool already)")


@checker("sliding-window mask")
def check_sliding_window_mask(fn: Callable[[int, int], torch.Tensor]) -> str:
    """fn(T, window) returns a (T, T) bool mask, True = may attend: query i sees keys i - window + 1 .. i,
    the last `window` positions, itself included (Mistral's sliding window)."""
    for T, window in ((9, 3), (6, 1), (4, 7), (5, 5)):
        what = f"sliding_window_mask(T={T}, window={window})"
        got = _as_bool_mask(run(fn, T, window, what=what), what, T)
        right = _window_mask(T, 0, window - 1)
        if torch.equal(got, right):
            continue
        mistakes = {
            "window + 1 keys per query: the bound is off by one (keys i - window .. i; tril/triu diagonals "
            "are inclusive; the Mistral paper's \"positions between i - W and i\" reads this way, but its rolling "
            "buffer, and transformers, hold W keys)": _window_mask(T, 0, window),
            "the query itself left out (keys i - window .. i - 1): a query always sees its own key":
                _window_mask(T, 1, window),
            "window - 1 keys per query: the bound is off by one (the query itself counts in its window)":
                _window_mask(T, 0, window - 2),
            "no causal limit: keys after the query are visible (|i - j| < window)": _window_mask(T, 1 - window, window - 1),
            "an inverted mask (True where attention is forbidden)": ~right,
            "the window counted forward (keys i .. i + window - 1): the mask is transposed": right.T,
            "a plain causal mask: the window is never applied": _window_mask(T, 0, T),
            "the window without the causal limit: every later key is visible too": _window_mask(T, -T, window - 1),
            "the first `window` keys instead of the last": _window_mask(T, 0, T) & (torch.arange(T) < window),
            "chunked attention (the keys of the query's own chunk of `window` positions): a sliding window moves "
            "with the query": _window_mask(T, 0, T) & (torch.arange(T)[:, None] // window == torch.arange(T) // window),
            "a symmetric window of window // 2 keys on each side (Longformer's, for an encoder): a decoder's "
            "window looks only back": _window_mask(T, -(window // 2), window // 2),
        }
        found = [name for name, m in mistakes.items() if torch.equal(got, m)]
        raise CandidateError(f"{what} is wrong" + (f": it is {found[0]}" if found else
                             f": row {int((got != right).any(1).nonzero()[0])} differs and it matches none of the "
                             f"usual mistakes"))
    return "query i sees keys i - window + 1 .. i: the last `window` positions, itself included"


@checker("block-table lookup")
def check_block_table_lookup(fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> str:
    """fn(pool, block_table, seq_len) with pool (num_blocks, block_size, H_kv, Dh) and block_table (n,) int64
    returns one sequence's keys (H_kv, seq_len, Dh): position p is slot p % block_size of block
    block_table[p // block_size]."""
    N, bs, H_kv, Dh = 9, 4, 2, 3
    pool = torch.randn(N, bs, H_kv, Dh)
    for table, S in (([7, 2, 5], 10), ([3, 0, 8, 1], 16), ([6, 4, 0], 9)):
        table = torch.tensor(table)
        what = f"lookup(pool, block_table={table.tolist()}, seq_len={S}) with blocks of {bs} slots"
        got = run(fn, pool.clone(), table.clone(), S, what=what)
        if isinstance(got, torch.Tensor) and got.dim() == 4 and got.shape[0] == 1:
            got = got[0]                                      # a batch of one is fine
        blocks = pool[table]                                  # (n, bs, H_kv, Dh): the sequence's blocks in order
        right = blocks.flatten(0, 1)[:S].transpose(0, 1)      # (S, H_kv, Dh) -> (H_kv, S, Dh)
        shapes = {
            "(seq_len, H_kv, Dh): the head axis must come before the positions": right.transpose(0, 1),
            "every slot of the last block, not only the first seq_len positions": blocks.flatten(0, 1).transpose(0, 1),
            "the blocks themselves (n, block_size, H_kv, Dh): flatten them into one sequence": blocks,
            "seq_len // block_size blocks: the last, partly filled block is missing (it takes ceil(seq_len / "
            "block_size) blocks)": right[:, :S // bs * bs],
        }
        got = _tensor_or_named(got, what, (H_kv, S, Dh),
                               {name: m for name, m in shapes.items() if m.shape != right.shape})
        n, p = len(table), torch.arange(S)
        flat = pool.flatten(0, 1)                             # (N·bs, H_kv, Dh): slot b·bs + s is slot s of block b
        try:
            expect_close(got, right, what, atol=0, mistakes={
                "blocks 0, 1, 2, ... of the pool in order: the block table was not used":
                    pool[:n].flatten(0, 1)[:S].transpose(0, 1),
                "the blocks of the table taken in increasing block number (the table sorted, or a mask over the "
                "pool's blocks): entry i of block_table is the block of positions i·block_size .. (i + 1)·block_size "
                "- 1, in the table's order": pool[table.sort().values].flatten(0, 1)[:S].transpose(0, 1),
                "positions and heads mixed by a reshape: move the head axis with transpose/permute, not view":
                    blocks.reshape(H_kv, n * bs, Dh)[:, :S],
                "the block table read backwards (block_table.flip(0), or indices counted from the end): entry 0 "
                "holds the block of positions 0 .. block_size - 1": pool[table.flip(0)].flatten(0, 1)[:S].transpose(0, 1),
                "the block index taken as p % len(block_table) (the table's blocks in turn, one position each): "
                "position p is in block block_table[p // block_size], at slot p % block_size":
                    pool[table[p % n], p % bs].transpose(0, 1),
                "the block number used as a slot index (block_table[p // block_size] + p % block_size): a block "
                "starts at slot block_number · block_size of the flattened pool":
                    flat[table[p // bs] + p % bs].transpose(0, 1),
            })
        except CandidateError as exc:
            unnamed = isinstance(exc, Unexplained)
            raise CandidateError(f"{exc}{_first_misread(got, pool, table, S) if unnamed else ''}") from None
    return "position p read from slot p % block_size of block block_table[p // block_size], for 3 block tables"


def _first_misread(got: torch.Tensor, pool: torch.Tensor, table: torch.Tensor, S: int) -> str:
    """'. Position p came from slot s of block b; it is in ...' for the first wrong position ('' if none is found)."""
    bs, where = pool.shape[1], pool.flatten(0, 1).transpose(0, 1)       # (H_kv, N·bs, Dh)
    for p in range(S):
        want = int(table[p // bs]) * bs + p % bs
        if torch.equal(got[:, p].to(pool.dtype), where[:, want]):
            continue
        hits = [i for i in range(where.shape[1]) if torch.equal(got[:, p].to(pool.dtype), where[:, i])]
        entry = (table == hits[0] // bs).nonzero().flatten().tolist() if hits else []
        came = (f"slot {hits[0] % bs} of block {hits[0] // bs}" + (f" = block_table[{entry[0]}]" if entry else "")
                if hits else "no slot of the pool")
        off = (": the block index is off by one" if entry and abs(entry[0] - p // bs) == 1 and hits[0] % bs == p % bs
               else "")
        return (f". Position {p} came from {came}; it is slot {p % bs} of block {want // bs} = "
                f"block_table[{p // bs}] (p // block_size = {p // bs}, p % block_size = {p % bs}){off}")
    return ""
