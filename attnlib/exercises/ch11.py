"""Checkers for chapter 11 (the whole Transformer): teacher forcing's shift, a decoder block (in ch11_block),
and the cross-attention keys and values that a decoder computes once per source. A wrong result is named
from the known mistakes, else the message says what differs (which positions, heads or features, by how
much)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlib.exercises._core import CandidateError, checker, run
from attnlib.exercises._differ import expect_or_differences as _expect
from attnlib.exercises.ch07 import _tensor_or_named
from attnlib.exercises.ch11_block import check_decoder_block
from attnlib.mha import MultiHeadAttention
from attnlib.cross_attention import memory_kv

__all__ = ["check_shift_right", "check_decoder_block", "check_memory_kv"]


def _shift_case(fn: Callable, tgt: torch.Tensor, bos: int) -> None:
    """One call of the reader's shift_right: bos, then tgt[:, :-1]; the usual mistakes named."""
    B, T = tgt.shape
    col = torch.full((B, 1), bos)
    what = f"shift_right(tgt, bos={bos}) with tgt of shape {(B, T)}"
    got = _tensor_or_named(run(fn, tgt.clone(), bos, what=what), what, (B, T), {
        "BOS prepended but the last target kept: T + 1 positions; drop tgt[:, -1], which nothing is "
        "trained to follow": torch.cat([col, tgt], dim=1),
        "the targets shifted left (tgt[:, 1:]): shift right, so position t sees only the tokens before t":
            tgt[:, 1:],
    })
    if got.is_floating_point() or got.dtype == torch.bool:
        raise CandidateError(f"{what} returned {got.dtype}: token ids index an embedding table, so they "
                             f"must be integers (torch.long)")
    first = got[:, 0]
    if torch.equal(got[:, 1:], tgt[:, :-1]) and bool((first == first[0]).all()) and int(first[0]) != bos:
        right = f"positions 1 to {T - 1} are right, but " if T > 1 else ""
        raise CandidateError(f"{what}: {right}position 0 holds {int(first[0])}, not bos = {bos}: the bos argument "
                             f"is ignored (a start token hard-coded?)")
    if T > 1 and torch.equal(got[:, :-1], tgt[:, 1:]) and not torch.equal(got[:, -1], col[:, 0]):
        raise CandidateError(f"{what} is wrong: it is the targets shifted left (tgt[:, 1:], then "
                             f"{got[:, -1].unique().tolist()} at the end): that is how labels are made from a "
                             f"sequence; the decoder's input is shifted right, bos first, then tgt[:, :-1]")
    _expect(got, torch.cat([col, tgt[:, :-1]], dim=1), what, axes=("sequence", "position"), mistakes={
        "tgt unchanged, no shift: position t would see the very token it must predict": tgt,
        "the first target dropped instead of the last: BOS, then tgt[:, :-1] (not tgt[:, 1:])":
            torch.cat([col, tgt[:, 1:]], dim=1),
        "torch.roll(tgt, 1): the last target wrapped around to position 0 where BOS belongs":
            tgt.roll(1, dims=1),
        "a left shift with BOS at the end: the decoder input starts with BOS": torch.cat([tgt[:, 1:], col], dim=1),
        "a shift along the batch axis (dim=0) instead of the time axis (dim=1)":
            torch.cat([torch.full((1, T), bos), tgt[:-1]], dim=0),
        "a shift by two positions (two BOS, then tgt[:, :-2]): shift by one, so position t sees the tokens before t":
            torch.cat([col, col, tgt[:, :-2]], dim=1)[:, :T],
    })


@checker("shift right")
def check_shift_right(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(tgt, bos) with target ids tgt (B, T) returns the decoder's input (B, T): bos, then tgt[:, :-1]."""
    _shift_case(fn, torch.arange(2, 20).reshape(3, 6), 1)   # (B, T) = (3, 6), every id different
    _shift_case(fn, torch.arange(2, 5)[:, None], 0)        # one position, another bos
    return "BOS first, then every target but the last: position t is fed the true tokens before t"


@checker("cross-attention keys and values, once per source")
def check_memory_kv(fn: Callable[[MultiHeadAttention, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> str:
    """fn(attn, memory) with attn an attnlib MultiHeadAttention (attn.qkv's rows are [W_q; W_k; W_v])
    and memory (B, S, D) returns k, v (B, H, S, Dh): what cross-attention computes from the memory."""
    B, S, D, H = 2, 7, 24, 4
    attn = MultiHeadAttention(D, H).double().eval()
    memory = torch.randn(B, S, D, dtype=torch.double)
    what = f"memory_kv(attn, memory) with memory of shape {(B, S, D)}, H={H}"
    with torch.no_grad():
        got = run(fn, attn, memory.clone(), what=what)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise CandidateError(f"{what} should return a pair (k, v), got {type(got).__name__}")
        k, v = memory_kv(attn, memory)
        w, b = attn.qkv.weight, attn.qkv.bias
        rows = lambda i: F.linear(memory, w[i * D:(i + 1) * D], b[i * D:(i + 1) * D])  # noqa: E731
        for name, mine, want, other in (("k", got[0], k, v), ("v", got[1], v, k)):
            label = f"{what}: {name}"
            flat = F.linear(memory, w[D:2 * D] if name == "k" else w[2 * D:], b[D:2 * D] if name == "k" else b[2 * D:])
            mine = _tensor_or_named(mine, label, (B, H, S, D // H), {
                "heads not split: (B, S, D) must become (B, H, S, Dh)": flat,
                "heads split but left after the sequence axis, (B, S, H, Dh): transpose(1, 2)":
                    flat.unflatten(-1, (H, -1)),
            })
            _expect(mine, want, label, axes=("sequence", "head", "position", "feature"), mistakes={
                "keys and values swapped: rows D..2D of attn.qkv are W_k, rows 2D..3D are W_v": other,
                "the query rows 0..D of attn.qkv used: the rows are [W_q; W_k; W_v]":
                    rows(0).unflatten(-1, (H, -1)).transpose(1, 2),
                "the bias left out: use attn.qkv.bias's rows too": (flat - (b[D:2 * D] if name == "k" else b[2 * D:]))
                    .unflatten(-1, (H, -1)).transpose(1, 2),
                "memory @ W without the transpose: nn.Linear stores W as (out, in) and computes x @ W.T + b "
                "(F.linear(memory, W, b))": (memory @ w[D:2 * D] + b[D:2 * D] if name == "k" else
                                             memory @ w[2 * D:] + b[2 * D:]).unflatten(-1, (H, -1)).transpose(1, 2),
                "memory @ W without the transpose, and the bias left out: nn.Linear computes x @ W.T + b "
                "(F.linear(memory, W, b))": (memory @ (w[D:2 * D] if name == "k" else w[2 * D:]))
                .unflatten(-1, (H, -1)).transpose(1, 2),
                "attn.out, the output projection W_o, used: k and v come from rows D..3D of attn.qkv; attn.out maps "
                "the merged heads back to d_model after the attention": attn.out(memory).unflatten(-1, (H, -1))
                .transpose(1, 2),
                "heads split with a reshape to (B, H, S, Dh) without a transpose: tokens and heads mixed":
                    flat.reshape(B, H, S, D // H),
                "heads split as view(B, S, Dh, H): head h takes every H-th feature instead of the block h·d_k to "
                "(h+1)·d_k - 1; use view(B, S, H, Dh).transpose(1, 2)": flat.view(B, S, D // H, H).permute(0, 3, 1, 2),
                f"{name} divided by sqrt(d_k): the scale belongs to the scores q @ kᵀ, so the cache holds the plain "
                f"projection": want / math.sqrt(D // H),
            })
    return "k and v from rows [W_k; W_v] of the fused projection, split into heads: computed once per source"
