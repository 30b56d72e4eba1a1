"""Chapter 13's int8 checker: a cache's key or value vectors quantized to int8 with one scale per vector
(per token and head), then dequantized. Any scheme passes whose round trip stays within rounding's half
step of each vector and whose values take one byte: symmetric, or asymmetric with a zero point."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

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
                wrap: bool = False, lo: int = -127) -> torch.Tensor:
    """x quantized with `scale` (clamped to [lo, 127]) and back, as a correct or a mistaken quantizer would."""
    q = rounding(x / torch.where(scale != 0, scale, torch.ones_like(scale)))
    if clamp:
        q = q.clamp(lo, 127)
    if wrap:
        q = (q + 128) % 256 - 128  # what int8 does to 128, 129, ...: they wrap around to -128, -127, ...
    return q * scale


def _mistakes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True)
    return {
        "truncation instead of rounding: .to(torch.int8) cuts toward zero, so a number can move by a whole step; "
        "torch.round first": _round_trip(x, amax / 127, torch.trunc),
        "floor instead of rounding: torch.floor moves a number by up to a whole step; torch.round":
            _round_trip(x, amax / 127, torch.floor),
        "x multiplied by the scale instead of divided (q = round(x · scale)): q = round(x / scale)":
            _round_trip(x * (amax / 127) ** 2, amax / 127),
        "scale = max|x| / 128: the largest entry becomes 128, beyond int8's 127, and wraps to -128":
            _round_trip(x, amax / 128, clamp=False, wrap=True),
        "scale = max|x| / 128: the largest entry becomes 128 and is clipped to 127": _round_trip(x, amax / 128),
        "scale = max|x| / 128 with q clamped to int8's [-128, 127]: a largest entry that is negative fits, but a "
        "positive one becomes 128 and is clipped to 127, a whole step off; symmetric int8 uses scale = max|x| / 127 "
        "and [-127, 127]": _round_trip(x, amax / 128, lo=-128),
        "scale = max|x| (without / 127): q is only -1, 0 or 1, three levels of int8's 255; scale = max|x| / 127":
            _round_trip(x, amax),
        "scale = max|x| / 255 (the range of uint8) with signed int8: entries beyond 127 steps overflow":
            _round_trip(x, amax / 255, clamp=False, wrap=True),
        "scale = max|x| / 255 with signed int8: entries beyond 127 steps are clipped": _round_trip(x, amax / 255),
        "scale = max|x| / 255 (the range of uint8) with q clamped to int8's [-128, 127]: entries beyond 127 steps "
        "are clipped; symmetric int8 uses scale = max|x| / 127": _round_trip(x, amax / 255, lo=-128),
        "the scale from max(x) instead of max(|x|): negative entries larger in size are clipped":
            _round_trip(x, x.amax(dim=-1, keepdim=True) / 127),
        "one scale for the whole tensor: small vectors lose their precision; one scale per vector (dim=-1)":
            _round_trip(x, x.abs().amax() / 127),
        "one scale per feature over all tokens (amax over dim=-2): one scale per vector is over dim=-1":
            _round_trip(x, x.abs().amax(dim=-2, keepdim=True) / 127),
        "one scale per token over all heads: a head with small keys loses its precision":
            _round_trip(x, x.abs().amax(dim=(1, 3), keepdim=True) / 127),
    }


def _own_mistakes(q: torch.Tensor, rest: list, x: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """What the reader's own (q, scale[, zero point]) give under the usual slips of dequantize."""
    q_dtype, q, rest = q.dtype, q.double(), [t.double() for t in rest if isinstance(t, torch.Tensor)]
    try:
        if not rest or torch.broadcast_shapes(q.shape, *(t.shape for t in rest)) != q.shape:
            return {}
    except RuntimeError:  # scales of a shape that does not broadcast against q: the reader reshapes them
        return {}
    scale, found = rest[0], {"dequantize returns q itself, without its scale: x̂ = q · scale": q}
    right_after_offset = x is not None and len(rest) == 1 and bool(
        (((q - 128) * scale - x.double()).abs() <= _BOUND * x.double().abs().amax(-1, keepdim=True)).all())
    if q_dtype == torch.uint8 and right_after_offset:
        found["dequantize leaves uint8's offset in: q holds round(x / scale) + 128, so take 128 off before scaling, "
              "x̂ = (q - 128) · scale"] = q * scale
    if len(rest) == 1:
        found["dequantize multiplies q by 127 · scale (by max|x|, not max|x| / 127): x̂ = q · scale"] = q * scale * 127
        found["dequantize divides by the scale: x̂ = q · scale"] = q / torch.where(scale != 0, scale, 1.0)
    if len(rest) == 2:
        zero = rest[1]
        found["dequantize ignores the zero point (or offset): subtract it, x̂ = (q - zero) · scale, or add the "
              "offset back"] = q * scale
        found["dequantize adds the zero point: x̂ = (q - zero) · scale"] = (q + zero) * scale
    return found


def _wrapped(q: torch.Tensor, x: torch.Tensor, x_hat: torch.Tensor, amax: torch.Tensor) -> str:
    """A message if the numbers that came back worst sit at the far end of q's range: a cast wrapped them."""
    bad = (x_hat.double() - x.double()).abs() > 0.5 * amax
    if not bad.any():
        return ""
    if q.dtype == torch.uint8 and bool((q[bad].int() > 127).all()) and bool((x[bad] < 0).all()):
        return (": negative values stored as uint8 wrap around (-1 becomes 255): store signed values as "
                "torch.int8, or shift them by a zero point into 0 .. 255")
    lo, hi = torch.iinfo(q.dtype).min, torch.iinfo(q.dtype).max
    if bool(((q[bad].int() - lo <= 2) | (hi - q[bad].int() <= 2)).all()):
        return (f": some numbers come back at the other end of the range: a value beyond {q.dtype}'s {lo} .. {hi} "
                f"wraps around when cast (127 + 1 becomes -128, 255 + 1 becomes 0); clamp before casting")
    return ""


class _NaNCasts(TorchFunctionMode):
    """Records whether torch turned a float tensor holding NaN into integers (x.to(torch.int8) after 0 / 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and not (out.is_floating_point() or out.is_complex() or out.dtype == torch.bool):
            src = next((a for a in args if isinstance(a, torch.Tensor)), None)
            self.found |= src is not None and src.is_floating_point() and bool(src.isnan().any())
        return out


def _factor(x: torch.Tensor, x_hat: torch.Tensor, amax: torch.Tensor) -> str:
    """': it is x times c ...' when the round trip is right but for one constant factor ('' otherwise)."""
    x, x_hat = x.double(), x_hat.double()
    c = float((x_hat * x).sum() / (x * x).sum())
    if abs(c - 1) < 0.01 or not bool(((x_hat - c * x).abs() <= _BOUND * abs(c) * amax).all()):
        return ""
    return (f": it is x times {c:.4g}, right but for one constant factor: quantize and dequantize disagree on the "
            f"scale (one of them leaves out, or applies twice, the factor 127 between max|x| and the scale?)")


@checker("int8 quantization")
def check_int8_quantization(quantize: Callable[[torch.Tensor], tuple], dequantize: Callable[..., torch.Tensor]) -> str:
    """quantize(x) with x (..., Dh) returns (q, scale, ...): q int8 (or uint8) of x's shape and one scale per
    vector of Dh numbers; dequantize(q, scale, ...) returns x̂ (..., Dh) within max|x| / 254 of each vector."""
    x = _inputs()
    what = f"quantize(x) with x of shape {tuple(x.shape)}"
    with _NaNCasts() as casts:
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
    if casts.found:
        raise CandidateError(f"{what} casts NaN to an integer: x holds an all-zero vector (a padded token, say), "
                             f"whose scale is 0, and 0 / 0 = NaN. Casting NaN to int8 is undefined (this CPU gives 0, "
                             f"so the round trip only looks right); guard the division: scale.clamp_min(1e-8), or "
                             f"torch.where(scale == 0, 1.0, scale)")
    x_hat = as_tensor(run(dequantize, *out, what="dequantize(*quantize(x))"), "dequantize(*quantize(x))",
                      shape=x.shape)
    if not x_hat.is_floating_point():
        raise CandidateError(f"dequantize(*quantize(x)) returned {x_hat.dtype}: multiply q by its scale in floating point")
    amax = x.double().abs().amax(dim=-1, keepdim=True)
    if torch.isnan(x_hat).any():
        zero_only = bool((amax.expand_as(x)[torch.isnan(x_hat)] == 0).all())
        raise CandidateError("dequantize(*quantize(x)) contains NaN" + (
            " where x is an all-zero vector (a padded token, say): its scale is 0 and 0 / 0 = NaN; guard the "
            "division" if zero_only else ""))
    worst = float(((x_hat.double() - x.double()).abs() / amax.clamp_min(1e-30)).max())
    rest = [t for t in out[1:]]
    extra, vectors = sum(t.numel() for t in rest if isinstance(t, torch.Tensor)), x.numel() // x.shape[-1]
    if worst <= _BOUND and extra <= 2 * vectors:
        return ("one byte per number and one scale per vector, and every number of the round trip within half a "
                "step (max|x| / 254) of the original")
    if worst <= _BOUND:
        raise CandidateError(f"{what} returns {extra} scale numbers for {vectors} vectors: keep one scale per "
                             f"vector (per token and head), or the scales take more room than the int8 values save")
    found = matching(x_hat, {**_mistakes(x), **_own_mistakes(q, rest, x)}, atol=1e-5)
    raise CandidateError(f"dequantize(*quantize(x)) is off by up to {worst:.3g} · max|x| of a vector, more than "
                         f"rounding's half step (1/254)" + (f": it matches {' and '.join(found)}" if found else
                                                            _factor(x, x_hat, amax) or _wrapped(q, x, x_hat, amax)))
