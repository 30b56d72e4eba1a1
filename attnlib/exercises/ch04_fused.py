"""Chapter 4's fused-QKV checker's helpers: the reader's (q, k, v) as one tensor, the known wrong answers, and
a count of the matrix products behind a right one (check_fused_qkv itself lives in ch04)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from attnlib.exercises._core import CandidateError, as_tensor, full_precision, run
from attnlib.exercises._expect import described
from attnlib.mha import split_heads

__all__ = ["as_triple", "fused_mistakes", "count_products"]


def as_triple(got: object, what: str, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """The reader's (q, k, v) stacked into one (3, B, H, T, Dh) tensor, each of `shape` = (B, H, T, Dh). Any three
    tensors that unpack as q, k, v are fine (a tuple, a list, a generator, a stacked (3, ...) tensor)."""
    if isinstance(got, torch.Tensor) and got.dim() > 0 and got.shape[0] == 3:
        got = got.unbind(0)
    elif isinstance(got, Iterable) and not isinstance(got, (torch.Tensor, str, bytes, Mapping)):
        got = run(tuple, got, what=what)  # a generator runs the reader's code only now
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        raise CandidateError(f"{what} should return three torch.Tensors (q, k, v), got {described(got)}")
    shapes = {tuple(t.shape) for t in got}
    if shapes != {shape}:
        B, H, T, Dh = shape
        found = " (B, T, H, Dh): the heads are not moved before time" if shapes == {(B, T, H, Dh)} else ""
        raise CandidateError(f"{what} returned shapes {sorted(shapes)}, expected (B, H, T, Dh) = "
                             f"{shape} for each of q, k, v{found}")
    return torch.stack([full_precision(as_tensor(t, f"{what}, {n}"), f"{what}, {n}") for t, n in zip(got, "qkv")])


def fused_mistakes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, h: int) -> dict[str, torch.Tensor]:
    """The wrong (3, B, H, T, Dh) answers readers write for x (B, T, D), weight (3D, D), bias (3D,), by name."""
    B, T, D = x.shape
    y = F.linear(x, weight, bias)  # (B, T, 3D)
    blocks = [split_heads(t, h) for t in y.split(D, dim=-1)]  # q, k, v: (B, H, T, Dh) each

    def heads(fused: torch.Tensor) -> torch.Tensor:  # (B, T, 3D) -> (3, B, H, T, Dh), the right way
        return torch.stack([split_heads(t, h) for t in fused.split(D, dim=-1)])

    order = {f"q, k and v returned in the wrong order (as {', '.join('qkv'[i] for i in o)}): the rows of weight are "
             f"[W_q; W_k; W_v]": torch.stack([blocks[i] for i in o]) for o in itertools.permutations(range(3))
             if o != (0, 1, 2)}
    return order | {
        "the bias is missing: x @ weight.T without + bias": heads(F.linear(x, weight)),
        "weight reshaped to (D, 3D) instead of transposed: x @ weight.reshape(D, 3D) has the right shape, "
        "but a reshape regroups the numbers, it does not swap rows and columns; use weight.T":
            heads(x @ weight.reshape(D, 3 * D) + bias),
        "each (D, D) block of weight used without its transpose: x @ W_q is not nn.Linear's x @ W_q.T; "
        "take x @ weight.T on the whole weight, or W_q.T for each block":
            heads(torch.cat([x @ w for w in weight.split(D)], dim=-1) + bias),
        "an interleaved layout: viewing the fused output as (B, T, H, 3, Dh) takes a [q, k, v] triple per "
        "head, but nn.MultiheadAttention's rows are three blocks [W_q; W_k; W_v]; split into three D-wide "
        "blocks first": y.view(B, T, h, 3, D // h).permute(3, 0, 2, 1, 4),
        "every third feature taken: viewing the fused output as (B, T, D, 3) deals the features out to q, k "
        "and v in turn, but the rows of weight are three D-wide blocks; split(D, dim=-1)":
            y.view(B, T, D, 3).permute(3, 0, 1, 2).unflatten(-1, (h, -1)).transpose(2, 3),
        "the heads viewed straight to (B, H, T, Dh) without the transpose, which cuts the sequence instead "
        "of each token's width": torch.stack([t.reshape(B, h, T, -1) for t in y.split(D, dim=-1)]),
        "the heads split with transpose(1, 2) then reshape: (B, D, T) reshaped to (B, H, T, Dh) mixes tokens "
        "and features; view as (B, T, H, Dh) first, then transpose(1, 2)":
            torch.stack([t.transpose(1, 2).reshape(B, h, T, -1) for t in y.split(D, dim=-1)]),
        "q already multiplied by 1/sqrt(Dh): that scale belongs to the scores, q kᵀ / sqrt(Dh), in attention; "
        "the projection returns q as x @ W_q.T + b_q": torch.stack(blocks) * torch.tensor(
            [(D // h) ** -0.5, 1.0, 1.0]).view(3, 1, 1, 1, 1),
    }


class _CountProducts(TorchFunctionMode):
    """Counts the matrix products the reader's code calls (@, F.linear, einsum, ...: one each, whatever they
    lower to). A function mode, not a dispatch mode: entering a dispatch mode imports torch._dynamo, seconds
    on a busy machine, and rebinds torch.manual_seed."""

    NAMES = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot",
                       "linear", "einsum", "tensordot", "inner"})

    def __init__(self) -> None:
        super().__init__()
        self.products = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.products += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


def count_products(call: Callable[[], object]) -> int | None:
    """How many matrix products `call()` runs (a second, watched run of the reader's code), or None when it does
    not run under a dispatch mode."""
    try:
        with _CountProducts() as counted:
            call()
    except Exception:  # noqa: BLE001 - the values were right: code that fails under a dispatch mode only goes uncounted
        return None
    return counted.products
