"""Chapter 13's int8 checker: a cache's key or value vectors quantized to int8 with one scale per vector
(per token and head), then dequantized. Any scheme passes whose round trip stays within rounding's half
step of each vector and whose values take one byte: symmetric, or asymmetric with a zero point."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, as_tensor, checker, matching, run

__all__ = ["check_int8_quantization"]

_BOUND = 1 / 254 + 1e-3  # rounding moves a number by at most half a step, max|x| / 254 (+ room for fp16 scales)


def _inputs() -> torch.Tensor:
    """(B, H_kv, S, Dh) = (2, 3, 6, 16): vectors from 1e-3 to 1e2 in size, one all zero, one whose
    largest magnitude is negative."""
    x = torch.randn(2, 3, 6, 16) * torch.logspace(-3, 2, 6)[:, None]
    x[1, 2, 4] = 0.0
    x[0, 1, 3, 5] = -3 * x[0, 1, 3].abs().max()
    return x


def _round_trip(x: torch.Tensor, scale: torch.Tensor, rounding=torch.round, clamp: bool = True,
                wrap: bool = False) -> torch.Tensor:
    """x quantized with `scale` and back, as a correct or a mistaken quantizer would do it."""
    q = rounding(x / torch.where(scale != 0, scale, torch.ones_like(scale)))
    if clamp:
        q = q.clamp(-127, 127)
    if wrap:
        q = (q + 128) % 256 - 128  # what int8 does to 128, 129, ...: they wrap around to -128, -127, ...
    return q * scale


def _mistakes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True)
    return {
        "truncation instead of rounding: .to(torch.int8) cuts toward zero, so a number can move by a whole step; "
        "torch.round first": _round_trip(x, amax / 127, torch.trunc),
        "scale = max|x| / 128: the largest entry becomes 128, beyond int8's 127, and wraps to -128":
            _round_trip(x, amax / 128, clamp=False, wrap=True),
        "scale = max|x| / 128: the largest entry becomes 128 and is clipped to 127": _round_trip(x, amax / 128),
        "scale = max|x| / 255 (the range of uint8) with signed int8: entries beyond 127 steps overflow":
            _round_trip(x, amax / 255, clamp=False, wrap=True),
        "scale = max|x| / 255 with signed int8: entries beyond 127 steps are clipped": _round_trip(x, amax / 255),
        "the scale from max(x) instead of max(|x|): negative entries larger in size are clipped":
            _round_trip(x, x.amax(dim=-1, keepdim=True) / 127),
        "one scale for the whole tensor: small vectors lose their precision; one scale per vector (dim=-1)":
            _round_trip(x, x.abs().amax() / 127),
        "one scale per feature over all tokens (amax over dim=-2): one scale per vector is over dim=-1":
            _round_trip(x, x.abs().amax(dim=-2, keepdim=True) / 127),
        "one scale per token over all heads: a head with small keys loses its precision":
            _round_trip(x, x.abs().amax(dim=(1, 3), keepdim=True) / 127),
    }


@checker("int8 quantization")
def check_int8_quantization(quantize: Callable[[torch.Tensor], tuple], dequantize: Callable[..., torch.Tensor]) -> str:
    """quantize(x) with x (..., Dh) returns (q, scale, ...): q int8 (or uint8) of x's shape and one scale per
    vector of Dh numbers; dequantize(q, scale, ...) returns x̂ (..., Dh) within max|x| / 254 of each vector."""
    x = _inputs()
    what = f"quantize(x) with x of shape {tuple(x.shape)}"
    out = run(quantize, x.clone(), what=what)
    if isinstance(out, torch.Tensor) or not isinstance(out, (tuple, list)) or len(out) < 2:
        raise CandidateError(f"{what} returned {type(out).__name__}: return the int8 values and their scales, "
                             f"(q, scale), without which nothing can be dequantized")
    q = as_tensor(out[0], f"{what}: q", shape=x.shape)
    if q.dtype not in (torch.int8, torch.uint8):
        whole = not q.is_floating_point() or bool((q == q.round()).all())
        raise CandidateError(f"{what}: q is {q.dtype}, {q.element_size()} bytes per number, so the cache is no "
                             f"smaller: store it as int8 (q.to(torch.int8))" + ("; its values are whole numbers "
                                                                                "already" if whole else ""))
    x_hat = as_tensor(run(dequantize, *out, what="dequantize(*quantize(x))"), "dequantize(*quantize(x))", shape=x.shape)
    if not x_hat.is_floating_point():
        raise CandidateError(f"dequantize(*quantize(x)) returned {x_hat.dtype}: multiply q by its scale in floating point")
    if torch.isnan(x_hat).any():
        raise CandidateError("dequantize(*quantize(x)) contains NaN where x is an all-zero vector (a padded "
                             "token, say): its scale is 0 and 0 / 0 = NaN; guard the division")
    amax = x.double().abs().amax(dim=-1, keepdim=True)
    worst = float(((x_hat.double() - x.double()).abs() / amax.clamp_min(1e-30)).max())
    extra, vectors = sum(t.numel() for t in out[1:] if isinstance(t, torch.Tensor)), x.numel() // x.shape[-1]
    if worst <= _BOUND and extra <= 2 * vectors:
        return ("one byte per number and one scale per vector, and every number of the round trip within half a "
                "step (max|x| / 254) of the original")
    if worst <= _BOUND:
        raise CandidateError(f"{what} returns {extra} scale numbers for {vectors} vectors: keep one scale per "
                             f"vector (per token and head), or the scales take more room than the int8 values save")
    found = matching(x_hat, _mistakes(x), atol=1e-5)
    raise CandidateError(f"dequantize(*quantize(x)) is off by up to {worst:.3g} · max|x| of a vector, more than "
                         f"rounding's half step (1/254)" + (f": it matches {' and '.join(found)}" if found else ""))
