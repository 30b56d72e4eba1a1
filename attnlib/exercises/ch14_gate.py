"""The checker of chapter 14's gated attention output (Qiu et al. 2025; Qwen3.5): (y ⊙ σ(x W_gᵀ)) W_oᵀ.

The model width D and the heads' merged width H·Dh differ, so that a transposed weight cannot multiply at all,
and the gate's inputs are large enough that SiLU, tanh and the sigmoid give different numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlib.exercises._core import CandidateError, checker, run
from attnlib.exercises._differ import expect_or_differences
from attnlib.exercises.ch14_diff import tensor_of

__all__ = ["check_output_gate"]

B, T, D, W = 2, 5, 10, 12  # W = H·Dh, the heads' merged width


def _mistakes(x, y, w_g, w_o) -> dict[str, torch.Tensor]:
    z = x @ w_g.T                                                         # (B, T, W): the gate's logits
    out = lambda g: (y * g) @ w_o.T  # noqa: E731
    return {
        "SiLU (z σ(z)) instead of the sigmoid σ(z): the gate is a number between 0 and 1": out(F.silu(z)),
        "no sigmoid: the gate is σ(x W_gᵀ), not x W_gᵀ": out(z),
        "tanh instead of the sigmoid": out(torch.tanh(z)),
        "the gate used as 1 - σ(x W_gᵀ)": out(1 - torch.sigmoid(z)),
        "a softmax over the channels instead of a sigmoid per channel": out(z.softmax(-1)),
        "the sigmoid taken of x before the projection (σ(x) W_gᵀ): the gate is σ(x W_gᵀ)":
            out(torch.sigmoid(x) @ w_g.T),
        "the gate added (y + σ(x W_gᵀ)), not multiplied": (y + torch.sigmoid(z)) @ w_o.T,
        "the gate not applied: y W_oᵀ": y @ w_o.T,
        "the gate computed from y (σ(y), SiLU on the heads' output) instead of from the layer's input x: σ(x W_gᵀ)":
            out(torch.sigmoid(y)),
        "gate_weight reshaped to (D, H·Dh) instead of transposed: x @ gate_weight.T (reshape keeps the memory order, "
        "so each channel mixes rows of several)": out(torch.sigmoid(x @ w_g.reshape(w_g.shape[1], w_g.shape[0]))),
        "the gate applied twice (y ⊙ σ² ...)": out(torch.sigmoid(z) ** 2),
        "the gate applied after W_o (to y W_oᵀ, cut to its width): it multiplies the heads' merged output y, channel "
        "by channel, before W_o mixes the heads: (y ⊙ σ(x W_gᵀ)) W_oᵀ": (y @ w_o.T) * torch.sigmoid(z)[..., :w_o.shape[0]],
    }


@checker("gated attention output")
def check_output_gate(fn: Callable) -> str:
    """fn(x, y, gate_weight, out_weight) with x (B, T, D) the layer's input, y (B, T, H·Dh) the heads' merged output,
    gate_weight (H·Dh, D) and out_weight (D, H·Dh) in nn.Linear's (out, in) layout returns (y ⊙ σ(x W_gᵀ)) W_oᵀ,
    of shape (B, T, D)."""
    gen = torch.Generator().manual_seed(14)
    for dtype, about in ((torch.float64, "float64"), (torch.float32, "float32")):
        x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
        y = torch.randn(B, T, W, generator=gen, dtype=torch.float64)
        w_g = torch.randn(W, D, generator=gen, dtype=torch.float64) / D ** 0.5 * 2    # gate logits of about ±2
        w_o = torch.randn(D, W, generator=gen, dtype=torch.float64) / W ** 0.5
        args = [t.to(dtype) for t in (x, y, w_g, w_o)]
        what = (f"gated_output(x {(B, T, D)}, y {(B, T, W)}, gate_weight {(W, D)}, out_weight {(D, W)}) "
                f"in {about}")
        try:
            got = run(fn, *(t.clone() for t in args), what=what)
        except CandidateError as exc:
            if "cannot be multiplied" not in str(exc):
                raise
            raise CandidateError(f"{exc}. Two usual causes: the gate computed from y (width {W}) instead of the layer's "
                                 f"input x (width {D}), which gate_weight {(W, D)} maps to {W} channels; or a weight "
                                 f"used in the wrong layout: both are nn.Linear's (out, in), so multiply by their "
                                 f"transposes, x @ gate_weight.T (or F.linear(x, gate_weight))") from None
        if getattr(got, "shape", None) is not None and tuple(got.shape) == (B, T, W):
            raise CandidateError(f"{what} returned {(B, T, W)}, the gated heads before the output projection: "
                                 f"multiply by out_weight's transpose, (y ⊙ σ(x W_gᵀ)) W_oᵀ, to get back to width {D}")
        got = tensor_of(got, what, (B, T, D))
        want = (y * torch.sigmoid(x @ w_g.T)) @ w_o.T
        expect_or_differences(got, want, what, lambda: _mistakes(x, y, w_g, w_o), ("batch", "position", "feature"),
                              atol=1e-4 if dtype == torch.float32 else 1e-6)
    return ("each head's output channel multiplied by σ(x W_gᵀ) of the layer's input, then W_oᵀ, in float64 and "
            "float32: a gate per head and channel, before the output projection")
