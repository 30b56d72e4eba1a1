"""Checkers for chapter 4 (multi-head attention): split heads, merge heads, count the parameters, fused QKV.

`result_tensor` (shape named first, then no complex or half-precision result) is shared with chapter 5.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, full_precision, run
from attnlib.exercises._expect import either
from attnlib.exercises.ch01 import reject_shape_mistakes
from attnlib.exercises.ch04_fused import as_triple, count_products, fused_mistakes
from attnlib.mha import MultiHeadAttention, merge_heads, split_heads

__all__ = ["check_split_heads", "check_merge_heads", "check_mha_param_count", "check_fused_qkv"]

B, T, H, Dh = 2, 5, 3, 4  # all different, so that no axis can stand in for another
D = H * Dh
_VIEW_HINT = (". view() needs memory laid out in the new shape, and a transposed tensor is not: use "
              "reshape(), or .contiguous().view()")
_TRANSPOSE_HINT = (". That is x @ weight without the transpose: weight is (3D, D), nn.Linear's (out, in) "
                   "layout, so the product is x @ weight.T (or F.linear(x, weight, bias))")


def result_tensor(value: object, what: str, shape: tuple[int, ...], letters: str = "") -> torch.Tensor:
    """The reader's result as a real tensor of `shape` in full precision; CandidateError naming what is off
    (a complex result, then the shape, written with its dimension `letters` when given, then the dtype)."""
    got = as_tensor(value, what)  # refuses a complex result
    if tuple(got.shape) != tuple(shape):
        raise CandidateError(f"{what} has shape {tuple(got.shape)}, expected {letters + ' = ' if letters else ''}"
                             f"{tuple(shape)}")
    return full_precision(got, what)


def _run_tensor(fn: Callable, *args, what: str, hints: Mapping[str, str] | None = None) -> object:
    """Run the reader's fn on copies of the tensors in args; explain the classic errors (view after transpose,
    and `hints`: a piece of the error message -> what it means)."""
    try:
        return run(fn, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args), what=what)
    except CandidateError as exc:
        for needle, hint in ({"view size is not compatible": _VIEW_HINT} | dict(hints or {})).items():
            if needle in str(exc):
                raise CandidateError(f"{exc}{hint}") from None
        raise


@checker("split heads")
def check_split_heads(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(x, num_heads): x (B, T, D) -> (B, H, T, Dh), head h holding features h·Dh .. (h+1)·Dh - 1."""
    x = torch.randn(B, T, D)
    what = f"split_heads(x, num_heads={H}) with x of shape {(B, T, D)}"
    got = reject_shape_mistakes(_run_tensor(fn, x, H, what=what), what, {
        "(B, T, H, Dh): the width is cut into heads, but the heads are not moved before time "
        "(.transpose(1, 2))": x.view(B, T, H, Dh),
        "(B, H, Dh, T): the wrong axes were transposed; move heads before time, "
        "(B, T, H, Dh).transpose(1, 2)": x.view(B, T, H, Dh).permute(0, 2, 3, 1),
        "(B·H, T, Dh): the heads folded into the batch axis (as some courses do for bmm); keep them as "
        "their own axis, (B, H, T, Dh)": x.view(B, T, H, Dh).transpose(1, 2).reshape(B * H, T, Dh),
    })
    got = result_tensor(got, what, (B, H, T, Dh), "(B, H, T, Dh)")
    expect_close(got, split_heads(x, H), what, mistakes={
        "a view straight to (B, H, T, Dh) without the transpose: that cuts the sequence of tokens "
        "into pieces instead of cutting each token's width; view as (B, T, H, Dh), then transpose(1, 2)":
            x.reshape(B, H, T, Dh),
        "interleaved heads: viewing as (B, T, Dh, H) gives head h every H-th feature instead of the "
        "block h·Dh .. (h+1)·Dh - 1; view as (B, T, H, Dh)": x.view(B, T, Dh, H).permute(0, 3, 1, 2),
        "transpose(1, 2) first, then a reshape to (B, H, T, Dh): that regroups the (B, D, T) numbers, mixing "
        "tokens and features; view as (B, T, H, Dh), then transpose(1, 2)": x.transpose(1, 2).reshape(B, H, T, Dh),
    })
    return f"(B, T, D) = {(B, T, D)} -> (B, H, T, Dh) = {(B, H, T, Dh)}, each head a block of Dh features"


@checker("merge heads")
def check_merge_heads(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(x): x (B, H, T, Dh) -> (B, T, H·Dh), the inverse of split_heads."""
    x = torch.randn(B, H, T, Dh)
    what = f"merge_heads(x) with x of shape {(B, H, T, Dh)}"
    got = reject_shape_mistakes(_run_tensor(fn, x, what=what), what, {
        "(B, T, H, Dh): the heads are moved back next to Dh but not flattened into one width D = H·Dh "
        "(.reshape(B, T, D))": x.transpose(1, 2),
    })
    got = result_tensor(got, what, (B, T, D), "(B, T, H·Dh)")
    expect_close(got, merge_heads(x), what, mistakes={
        "the classic bug, heads merged without transposing: x.reshape(B, T, D) on (B, H, T, Dh) has the "
        "right shape but mixes tokens and heads; transpose(1, 2) to (B, T, H, Dh) first":
            x.reshape(B, T, D),
        "the wrong axes transposed: T and Dh were swapped instead of H and T": x.transpose(2, 3).reshape(B, T, D),
        "interleaved heads: (Dh, H) was flattened instead of (H, Dh), so the features of the heads "
        "alternate; transpose(1, 2), not permute(0, 2, 3, 1)": x.permute(0, 2, 3, 1).reshape(B, T, D),
    })
    return f"(B, H, T, Dh) = {(B, H, T, Dh)} -> (B, T, D) = {(B, T, D)}, and merge(split(x)) == x"


def _param_mistakes(d: int, h: int, kv: int, bias: bool) -> dict[str, int]:
    """Wrong parameter counts readers write, by name, for MultiHeadAttention(d, h, kv, bias=bias)."""
    dh = d // h
    b = int(bias)
    return {
        "the biases are missing: each projection has one bias per output feature": d * (d + 2 * kv * dh) + d * d,
        "the output projection W_o (D x D, plus its bias) is missing": (d + b) * (d + 2 * kv * dh),
        "K and V counted as D x D each, as in MHA: with H_kv key/value heads W_k and W_v are "
        "D x (H_kv·Dh)": 4 * d * d + 4 * b * d,
        "W_k and W_v counted as D x (H_kv·D) instead of D x (H_kv·Dh)":
            d * (d + 2 * kv * d) + d * d + b * (2 * d + 2 * kv * d),
        "one D x D matrix per head: a head's W_q is D x Dh, not D x D": (h + 2 * kv + 1) * (d * d + b * d),
        "W_o shrunk like W_k and W_v (H_kv·Dh x D): it maps the H·Dh merged query heads back to D, so it stays "
        "D x D": d * d + 3 * d * kv * dh + b * (d + 3 * kv * dh),
        "the biases counted as 4·D, as in MHA: W_k's and W_v's biases have H_kv·Dh entries, one per output feature":
            d * (d + 2 * kv * dh) + d * d + 4 * b * d,
        **({f"one bias missing, {name}'s (a count cannot tell which): every projection has one":
            d * (d + 2 * kv * dh) + d * d + d + 2 * kv * dh + d - n
            for name, n in (("W_q's or W_o", d), ("W_k's or W_v", kv * dh))} if bias else {}),
    }


@checker("count the parameters")
def check_mha_param_count(fn: Callable[[int, int, int, bool], int]) -> str:
    """fn(d_model, num_heads, num_kv_heads, bias) = parameters of MultiHeadAttention(d_model, num_heads, num_kv_heads, bias=bias)."""
    cases = [(512, 8, 8, True), (512, 8, 2, True), (96, 4, 1, False), (768, 12, 4, True)]
    got = {}
    for d, h, kv, bias in cases:
        what = f"param_count(d_model={d}, num_heads={h}, num_kv_heads={kv}, bias={bias})"
        n = run(fn, d, h, kv, bias, what=what)
        if isinstance(n, torch.Tensor) and n.numel() == 1:
            n = n.item()
        if not isinstance(n, numbers.Real) or isinstance(n, bool) or n != int(n):
            raise CandidateError(f"{what} should return a whole number, got {n!r}")
        got[d, h, kv, bias] = int(n)
    want = {c: sum(p.numel() for p in MultiHeadAttention(*c[:3], bias=c[3]).parameters()) for c in cases}
    wrong = [c for c in cases if got[c] != want[c]]
    if wrong:  # the mistakes that fit the first wrong case, narrowed to those that fit every case (MHA cannot
        # tell W_q's bias from W_k's: GQA can)
        fits = [[name for name, n in _param_mistakes(*c).items() if n == got[c]] for c in cases]
        first = fits[cases.index(wrong[0])]
        found = [name for name in first if all(name in f or got[c] == want[c] for c, f in zip(cases, fits))] or first
        d, h, kv, bias = wrong[0]
        reason = f": it matches {either(found)}" if found else ", and it matches none of the usual mistakes"
        raise CandidateError(f"param_count(d_model={d}, num_heads={h}, num_kv_heads={kv}, bias={bias}) returned "
                             f"{got[wrong[0]]:,}, expected {want[wrong[0]]:,}{reason}")
    return "equals the parameter count of attnlib.MultiHeadAttention for MHA, GQA and MQA, with and without biases"


def _check_fused_heads(fn: Callable[..., tuple], x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       y: torch.Tensor, h: int = 2) -> None:
    """The fused projection again with h != 3 heads: with H = 3, a split of each head's [q, k, v] triple
    (GPT-NeoX's layout) gives three (B, 3, T, Dh) tensors equal to q, k and v; y = x @ weight.T + bias."""
    what = f"fused_qkv(x, weight, bias, num_heads={h}) with x {(B, T, D)}, weight {(3 * D, D)}"
    got = _run_tensor(fn, x, weight, bias, h, what=what)
    per_head = (B, 3, T, D // h)
    if isinstance(got, (tuple, list)) and len(got) == h and all(
            isinstance(t, torch.Tensor) and tuple(t.shape) == per_head for t in got):
        raise CandidateError(f"{what} returned {h} tensors of shape {per_head}, one per head: the fused output was "
                             f"split into a [q, k, v] triple per head (GPT-NeoX's layout), but nn.MultiheadAttention's "
                             f"rows are three D-wide blocks [W_q; W_k; W_v]; with num_heads=3 the two happen to agree")
    expected = torch.stack([split_heads(t, h) for t in y.split(D, dim=-1)])  # (3, B, h, T, D / h)
    expect_close(as_triple(got, what, (B, h, T, D // h)), expected, what, mistakes=fused_mistakes(x, weight, bias, h))


@checker("fused QKV projection")
def check_fused_qkv(fn: Callable[..., tuple]) -> str:
    """fn(x, weight, bias, num_heads) -> (q, k, v), each (B, H, T, Dh), from nn.MultiheadAttention's
    in_proj_weight (3D, D), rows [W_q; W_k; W_v], and in_proj_bias (3D,)."""
    x, weight, bias = torch.randn(B, T, D), torch.randn(3 * D, D) / D ** 0.5, torch.randn(3 * D)
    what = f"fused_qkv(x, weight, bias, num_heads={H}) with x {(B, T, D)}, weight {(3 * D, D)}"
    got = as_triple(_run_tensor(fn, x, weight, bias, H, what=what, hints={
        f"and {3 * D}x{D})": _TRANSPOSE_HINT,                     # torch.matmul's "(10x12 and 36x12)"
        f"size {3 * D} for operand 1": _TRANSPOSE_HINT}), what, (B, H, T, Dh))  # einsum("btd,de->bte", x, weight)
    y = torch.nn.functional.linear(x, weight, bias)  # (B, T, 3D)
    expected = torch.stack([split_heads(t, H) for t in y.split(D, dim=-1)])  # (3, B, H, T, Dh)
    expect_close(got, expected, what, mistakes=fused_mistakes(x, weight, bias, H))
    _check_fused_heads(fn, x, weight, bias, y)
    products = count_products(lambda: _run_tensor(fn, x, weight, bias, H, what=what))  # the values are right
    if products is not None and products > 1:
        return (f"q, k and v are right, but from {products} matrix products: the exercise asks for "
                f"one, x @ weight.T + bias on the whole (3D, D) weight, then a split of the (B, T, 3D) result")
    return "q, k and v equal the fused projection's three D-wide blocks, each split into heads (B, H, T, Dh)"
