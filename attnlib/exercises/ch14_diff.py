"""The checker of chapter 14's differential attention (Ye et al.): (softmax(A1) - λ softmax(A2)) V, causal.

The heads, positions and widths differ (H, T, Dh, Dv), λ is not 1 and not λ_init, and the two maps differ,
so each usual mistake (logits subtracted before one softmax, λ on the wrong map, no mask, another scale) gives
its own output.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, full_precision, run
from attnlib.exercises._differ import expect_or_differences

__all__ = ["check_differential_attention", "tensor_of"]

B, H, T, DH, DV = 2, 3, 5, 4, 6
LAM = 0.7


def tensor_of(value: object, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The reader's result as a floating tensor of `shape`, or a CandidateError."""
    got = as_tensor(value, what, shape=shape)
    if not got.is_floating_point():
        raise CandidateError(f"{what} has dtype {got.dtype}: the result must be floating point (float32 or float64); "
                             f"an integer or bool tensor has lost the values")
    return full_precision(got, what)


def _map(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, mask: str = "causal", dim: int = -1,
         fill: float = -math.inf) -> torch.Tensor:
    """softmax(q kᵀ · scale) over keys j <= i, and its usual variants: (B, H, T, T)."""
    a = q @ k.transpose(-1, -2) * (DH ** -0.5 if scale is None else scale)
    keep = {"causal": torch.ones(T, T, dtype=torch.bool).tril(), "none": torch.ones(T, T, dtype=torch.bool),
            "strict": torch.ones(T, T, dtype=torch.bool).tril(-1), "anti": torch.ones(T, T, dtype=torch.bool).triu()}[mask]
    return a.masked_fill(~keep, fill).softmax(dim)


def _mistakes(q1, k1, q2, k2, v, lam) -> dict[str, torch.Tensor]:
    p1, p2 = _map(q1, k1), _map(q2, k2)
    logits = lambda q, k: (q @ k.transpose(-1, -2) * DH ** -0.5).masked_fill(  # noqa: E731
        ~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    return {
        "the logits subtracted before one softmax (softmax(A1 - λ A2)): subtract the two softmax maps":
            (logits(q1, k1) - lam * logits(q2, k2).nan_to_num(neginf=0.0)).softmax(-1) @ v,
        "λ on the first map (λ softmax(A1) - softmax(A2))": (lam * p1 - p2) @ v,
        "the maps swapped (softmax(A2) - λ softmax(A1))": (p2 - lam * p1) @ v,
        "λ left out (softmax(A1) - softmax(A2))": (p1 - p2) @ v,
        "λ times the difference (λ (softmax(A1) - softmax(A2)))": lam * (p1 - p2) @ v,
        "the maps added, not subtracted": (p1 + lam * p2) @ v,
        "the result multiplied by 1 - λ: the exercise leaves out the per-pair norm and its (1 - λ_init)":
            (1 - lam) * (p1 - lam * p2) @ v,
        "no causal mask: query i attends to later keys": (_map(q1, k1, mask="none") - lam * _map(q2, k2, mask="none")) @ v,
        "a query may not attend to itself (the diagonal masked): keys j <= i are visible":
            (_map(q1, k1, mask="strict") - lam * _map(q2, k2, mask="strict")).nan_to_num(0.0) @ v,
        "the mask inverted (keys j >= i)": (_map(q1, k1, mask="anti") - lam * _map(q2, k2, mask="anti")) @ v,
        "the hidden logits filled with 0, not -inf": (_map(q1, k1, fill=0.0) - lam * _map(q2, k2, fill=0.0)) @ v,
        "no 1/sqrt(Dh) scale": (_map(q1, k1, scale=1.0) - lam * _map(q2, k2, scale=1.0)) @ v,
        "the logits divided by Dh, not sqrt(Dh)": (_map(q1, k1, scale=1 / DH) - lam * _map(q2, k2, scale=1 / DH)) @ v,
        "the logits divided by sqrt(Dv), the values' width: the scale is 1/sqrt(Dh)":
            (_map(q1, k1, scale=DV ** -0.5) - lam * _map(q2, k2, scale=DV ** -0.5)) @ v,
        "the softmax over the queries (dim=-2), not over the keys (dim=-1)":
            (_map(q1, k1, dim=-2) - lam * _map(q2, k2, dim=-2)) @ v,
        "the pairs crossed (q1 with k2, q2 with k1)": (_map(q1, k2) - lam * _map(q2, k1)) @ v,
        "only the first map (the second softmax never subtracted)": p1 @ v,
    }


@checker("differential attention")
def check_differential_attention(fn: Callable) -> str:
    """fn(q1, k1, q2, k2, v, lam) with q1, k1, q2, k2 (B, H, T, Dh), v (B, H, T, Dv) and lam a float returns
    (softmax(Q1 K1ᵀ / sqrt(Dh)) - λ softmax(Q2 K2ᵀ / sqrt(Dh))) V, causal, of shape (B, H, T, Dv)."""
    gen = torch.Generator().manual_seed(14)
    for dtype, about in ((torch.float64, "float64"), (torch.float32, "float32")):
        q1, k1, q2, k2 = (2 * torch.randn(B, H, T, DH, generator=gen, dtype=torch.float64).to(dtype) for _ in range(4))
        v = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64).to(dtype)
        what = f"diff_attention(q1, k1, q2, k2 {(B, H, T, DH)}, v {(B, H, T, DV)}, lam={LAM}) in {about}"
        got = tensor_of(run(fn, q1.clone(), k1.clone(), q2.clone(), k2.clone(), v.clone(), LAM, what=what), what,
                        (B, H, T, DV))
        args = [t.double() for t in (q1, k1, q2, k2, v)]
        want = (_map(args[0], args[1]) - LAM * _map(args[2], args[3])) @ args[4]
        expect_or_differences(got, want, what, lambda: _mistakes(*args, LAM), ("batch", "head", "query", "feature"),
                              atol=1e-4 if dtype == torch.float32 else 1e-6)
    return ("(softmax(A1) - λ softmax(A2)) V with causal masks and the 1/sqrt(Dh) scale, in float64 and float32: "
            "two attention maps subtracted, not their logits")
