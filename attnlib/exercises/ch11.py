"""Checkers for chapter 11 (the whole Transformer): teacher forcing's shift, a decoder block, and the
cross-attention keys and values that a decoder computes once per source. A wrong result is named from
the known mistakes (for the block: every order of its three sublayers and every placement of its three
norms), else the message says what differs (which positions, heads or features, by how much)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from attnlib.drill.differ import differences
from attnlib.exercises._core import CandidateError, checker, expect_close, matching, run
from attnlib.exercises._guard import one_thread
from attnlib.exercises.ch07 import _tensor_or_named
from attnlib.mha import MultiHeadAttention
from attnlib.cross_attention import memory_kv
from attnlib.transformer import DecoderLayer

__all__ = ["check_shift_right", "check_decoder_block", "check_memory_kv"]


def _expect(got: torch.Tensor, want: torch.Tensor, what: str,
            mistakes: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]],
            axes: Sequence[str], atol: float = 1e-5) -> None:
    """expect_close, and when no known mistake matches, what differs (differ.differences). `mistakes` may be
    a function, called only when got is wrong."""
    if got.shape == want.shape and matching(got, {"": want}, atol):
        return
    mistakes = mistakes() if callable(mistakes) else mistakes
    if got.shape == want.shape and not torch.isnan(got).any() and not matching(got, mistakes, atol):
        raise CandidateError(f"{what} is wrong: " + "; ".join(differences(got, want, axes)))
    expect_close(got, want, what, mistakes=mistakes, atol=atol)


@checker("shift right")
def check_shift_right(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(tgt, bos) with target ids tgt (B, T) returns the decoder's input (B, T): bos, then tgt[:, :-1]."""
    tgt = torch.arange(2, 20).reshape(3, 6)  # (B, T) = (3, 6), every id different
    bos = 1
    col = torch.full((3, 1), bos)
    what = "shift_right(tgt, bos=1) with tgt of shape (3, 6)"
    got = _tensor_or_named(run(fn, tgt.clone(), bos, what=what), what, (3, 6), {
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
        raise CandidateError(f"{what}: positions 1 to 5 are right, but position 0 holds {int(first[0])}, not bos = "
                             f"{bos}: the bos argument is ignored (a start token hard-coded?)")
    _expect(got, torch.cat([col, tgt[:, :-1]], dim=1), what, axes=("sequence", "position"), mistakes={
        "tgt unchanged, no shift: position t would see the very token it must predict": tgt,
        "the first target dropped instead of the last: BOS, then tgt[:, :-1] (not tgt[:, 1:])":
            torch.cat([col, tgt[:, 1:]], dim=1),
        "torch.roll(tgt, 1): the last target wrapped around to position 0 where BOS belongs":
            tgt.roll(1, dims=1),
        "a left shift with BOS at the end: the decoder input starts with BOS": torch.cat([tgt[:, 1:], col], dim=1),
        "a shift along the batch axis (dim=0) instead of the time axis (dim=1)":
            torch.cat([torch.full((1, 6), bos), tgt[:-1]], dim=0),
        "a shift by two positions (two BOS, then tgt[:, :-2]): shift by one, so position t sees the tokens before t":
            torch.cat([col, col, tgt[:, :-2]], dim=1),
    })
    one = tgt[:, :1]
    what = "shift_right(tgt, bos=0) with tgt of shape (3, 1)"
    expect_close(_tensor_or_named(run(fn, one.clone(), 0, what=what), what, (3, 1), {}), torch.zeros(3, 1), what)
    return "BOS first, then every target but the last: position t is fed the true tokens before t"


def _post(x: torch.Tensor, norm: Callable, f: Callable) -> torch.Tensor:
    return norm(x + f(x))


_SUBLAYERS = ("self-attention", "cross-attention", "the FFN")


def _arrangement(order: tuple[int, ...], norms: tuple[int, ...]) -> str:
    """A post-LN block with its sublayers in `order` and norm `norms[i]` after the i-th step, in words."""
    words = []
    if order == (1, 0, 2):
        words.append("cross-attention before self-attention: the decoder first attends to its own tokens (causal "
                     "self-attention), then to the memory, then the FFN")
    elif order != (0, 1, 2):
        words.append(f"the sublayers in the order {', '.join(_SUBLAYERS[i] for i in order)}: a decoder block runs "
                     f"self-attention, cross-attention over the memory, then the FFN")
    if len(set(norms)) == 1:
        words.append(f"norm{norms[0] + 1} after every sublayer: norm1, norm2 and norm3 each follow one sublayer "
                     f"(their learned scales differ)")
    elif norms != tuple(order):
        words.append("the norms in the wrong places (" + ", ".join(
            f"norm{n + 1} after {_SUBLAYERS[i]}" for i, n in zip(order, norms)) + "): norm1 follows self-attention, "
            "norm2 cross-attention, norm3 the FFN")
    return "; and ".join(words)


def _block_mistakes(x, memory, sa, ca, ffn, n1, n2, n3) -> dict[str, torch.Tensor]:
    """Decoder blocks with classic mistakes (the right one is post-LN: self, cross, FFN): every order of the
    sublayers with every placement of the norms, and the residual and norm mistakes."""
    cross = lambda z: ca(z, memory)  # noqa: E731
    pre = lambda z, norm, f: z + f(norm(z))  # noqa: E731
    after = lambda z, norm, f: z + norm(f(z))  # noqa: E731
    sublayers, norms, found = (sa, cross, ffn), (n1, n2, n3), {}
    for order in itertools.permutations(range(3)):
        for placed in itertools.product(range(3), repeat=3):
            if order == (0, 1, 2) and placed == (0, 1, 2):
                continue
            h = x
            for i, n in zip(order, placed):
                h = _post(h, norms[n], sublayers[i])
            found[_arrangement(order, tuple(placed))] = h
    h = _post(x, n1, sa)
    return found | {
        "pre-LN, x + f(LN(x)): this block is post-LN as in the paper and nn.Transformer, LN(x + f(x))":
            pre(pre(pre(x, n1, sa), n2, cross), n3, ffn),
        "the norm inside the residual, x + LN(f(x)): add first, then normalize, LN(x + f(x))":
            after(after(after(x, n1, sa), n2, cross), n3, ffn),
        "no residual around self-attention": _post(_post(n1(sa(x)), n2, cross), n3, ffn),
        "no residual around cross-attention": _post(n2(cross(h)), n3, ffn),
        "no residual around the FFN": n3(ffn(_post(h, n2, cross))),
        "no residuals at all, LN(f(x)) for each sublayer: each is LN(x + f(x)), the input added back":
            n3(ffn(n2(cross(n1(sa(x)))))),
        "cross-attention over the decoder's own tokens, cross_attn(h, h): its keys and values come from "
        "the memory, cross_attn(h, memory)": _post(_post(h, n2, lambda z: ca(z, z)), n3, ffn),
        "cross-attention's queries taken from the block's input x, cross_attn(x, memory): they come from the "
        "output of the self-attention step, h = norm1(x + self_attn(x))":
            _post(_post(h, n2, lambda z: ca(x, memory)), n3, ffn),
    }


@checker("decoder block")
def check_decoder_block(fn: Callable[..., torch.Tensor]) -> str:
    """fn(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3) -> (B, T, D): one post-LN decoder block.

    x (B, T, D), memory (B, S, D); self_attn(z) is causal self-attention, cross_attn(z, memory) takes
    its queries from z and its keys and values from memory, ffn(z) the feed-forward network.
    """
    B, T, S, D = 2, 5, 7, 16
    layer = DecoderLayer(D, 4, 24).double().eval()
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2, layer.norm3):  # norms that differ, so misplacing one shows
            norm.weight.uniform_(0.5, 1.5), norm.bias.normal_()
    x, memory = torch.randn(B, T, D, dtype=torch.double), torch.randn(B, S, D, dtype=torch.double)
    sa = lambda z: layer.self_attn(z, is_causal=True)  # noqa: E731

    def ca(z: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if z.shape[1] == S and context.shape[1] == T:
            raise ValueError("cross_attn(memory, h) has the roles swapped: the decoder's tokens ask (the "
                             "queries, first argument), the memory answers: cross_attn(h, memory)")
        return layer.cross_attn(z, context)

    parts = (sa, ca, layer.ffn, layer.norm1, layer.norm2, layer.norm3)
    what = f"decoder_block(x, memory, ...) with x of shape {(B, T, D)} and memory of shape {(B, S, D)}"
    with torch.no_grad(), one_thread():
        got = _tensor_or_named(run(fn, x.clone(), memory.clone(), *parts, what=what), what, (B, T, D), {})
        _expect(got, layer(x, memory), what, atol=1e-9, mistakes=lambda: _block_mistakes(x, memory, *parts),
                axes=("sequence", "position", "feature"))
    return "self-attention, cross-attention over the memory, then the FFN, each LN(x + sublayer(x))"


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
                "heads split with a reshape to (B, H, S, Dh) without a transpose: tokens and heads mixed":
                    flat.reshape(B, H, S, D // H),
                "heads split as view(B, S, Dh, H): head h takes every H-th feature instead of the block h·d_k to "
                "(h+1)·d_k - 1; use view(B, S, H, Dh).transpose(1, 2)": flat.view(B, S, D // H, H).permute(0, 3, 1, 2),
                f"{name} divided by sqrt(d_k): the scale belongs to the scores q @ kᵀ, so the cache holds the plain "
                f"projection": want / math.sqrt(D // H),
            })
    return "k and v from rows [W_k; W_v] of the fused projection, split into heads: computed once per source"
