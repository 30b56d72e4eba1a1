"""Comparing a reader's result with the expected one: `expect_close` names the mistake that reproduces it,
from one catalogue per exercise in one format: `mistakes`, a mapping from the words for a mistake to the
output it gives on the checker's inputs, and `families`, mistakes with a number in them (a scale, a
temperature, an epsilon) whose number is fitted. A mistake that explains the result except where its own
formula breaks down (a NaN, an empty row) is still named. When nothing explains it, `Unexplained` says what
differs by structure (_describe.differences). The drill's catalogue (drill.mistakes) describes its
mistakes in the same words-and-change form, its outputs computed by drill.variants.simulate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from attnlib.exercises._describe import differences, fitted
from attnlib.exercises._runner import CandidateError

__all__ = ["Unexplained", "Family", "either", "described", "as_tensor", "full_precision", "matching", "expect_close"]


class Unexplained(CandidateError):
    """expect_close's verdict when no mistake of the catalogue explains the result: the message says what
    differs by structure; a checker may catch it to say more (which groups, which position came from where)."""


def _type_name(value: object) -> str:
    kind = type(value)
    module = kind.__module__.split(".")[0]
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def described(value: object, depth: int = 0) -> str:
    """What a reader returned, in words: 'a numpy.ndarray of shape (2, 3) (float64)', 'a tuple of 2 items
    (a torch.Tensor of shape (2, 5), None)', 'a float (0.5)', 'None'."""
    name = _type_name(value)
    article = "an" if name[0] in "aeiouAEIOU" else "a"
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return f"{article} {name} ({float(value) if isinstance(value, float) else repr(value)[:40]})"
    if isinstance(getattr(value, "shape", None), tuple) or isinstance(value, torch.Tensor):
        return f"{article} {name} of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, (list, tuple)):
        items = ", ".join(described(v, depth + 1) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"{article} {name} of {len(value)} items" + (f" ({items})" if depth == 0 and value else "")
    return f"{article} {name}"


def as_tensor(value: object, what: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Check that the reader returned a tensor (of `shape`, when given); raise CandidateError if not, naming
    what it got: a numpy array, a list, a tuple where one tensor is expected, a Python number."""
    if not isinstance(value, torch.Tensor):
        hint = {np.ndarray: ": torch.from_numpy(array) turns it into one", list: ": torch.tensor(...) or "
                "torch.stack(...) turns a list into one", tuple: ": return the one tensor asked for, not a tuple"}
        expected = "a torch.Tensor" + (f" of shape {tuple(shape)}" if shape is not None else "")
        raise CandidateError(f"{what} should be {expected}, got {described(value)}"
                             f"{next((h for k, h in hint.items() if isinstance(value, k)), '')}")
    if value.is_complex():
        raise CandidateError(f"{what} returned a complex tensor ({value.dtype}): return real numbers "
                             f"(torch.view_as_real, or .real and .imag put back in their places)")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CandidateError(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value


def full_precision(got: torch.Tensor, what: str) -> torch.Tensor:
    """Refuse a float16/bfloat16 result (a CandidateError that says why); return got otherwise."""
    if got.dtype in (torch.float16, torch.bfloat16):
        raise CandidateError(f"{what} returned {got.dtype}: half precision keeps only 2 to 3 significant "
                             f"digits, so the result is rounded off; compute and return float32 or float64")
    return got


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    if a.shape != b.shape:
        return False
    a, b = a.detach().double(), b.detach().double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))  # inf equals inf, NaN equals NaN
    return bool(((a - b).abs() <= atol + atol * b.abs()).logical_or(same).all())


def matching(got: torch.Tensor, mistakes: Mapping[str, torch.Tensor], atol: float = 1e-5) -> list[str]:
    """The names of the known mistakes whose output equals `got`."""
    return [name for name, out in mistakes.items() if _close(got, out, atol)]


Family = tuple[Callable[[float], torch.Tensor], float, float]  # produce(c), and the range [lo, hi] of c


def either(found: Sequence[str]) -> str:
    """Mistakes that all give the reader's numbers: one of them was made, not all ('X, or (the same numbers
    here) Y')."""
    return ", or (the same numbers here) ".join(found)


def _nan_source(got: torch.Tensor, expected: torch.Tensor, mistakes: Mapping[str, torch.Tensor],
                axes: Sequence[str] | None, atol: float) -> str:
    """Where the NaN is, and the mistake that reproduces every entry that is not NaN, if one does."""
    fine = ~torch.isnan(got)
    where = differences(got, expected, axes)[0].removeprefix("it contains NaN ")
    if got.shape != expected.shape or not fine.any():
        return f" {where}"
    found = [name for name, out in mistakes.items() if out.shape == got.shape and
             _close(torch.where(fine, got, 0), torch.where(fine, out, 0), atol)]
    if _close(torch.where(fine, got, 0), torch.where(fine, expected, 0), atol):
        return f" {where}; every other entry is right"
    return f" {where}; the other entries match {either(found)}" if found else f" {where}"


def _partly(got: torch.Tensor, expected: torch.Tensor, mistakes: Mapping[str, torch.Tensor],
            axes: Sequence[str] | None, atol: float) -> str | None:
    """'it matches X at rows a, b (row c differs from both)' when along dim 0 some slices of got equal a
    mistake where it differs from the right answer, and no slice is right; a corner case the mistake's
    formula handles otherwise (an empty row, say) should not hide the mistake."""
    if got.dim() == 0 or got.shape[0] < 2 or got.shape != expected.shape:
        return None
    name = axes[0] if axes else "row"
    rows = range(got.shape[0])
    if any(_close(got[i], expected[i], atol) for i in rows):
        return None
    for text, out in mistakes.items():
        if out.shape != got.shape:
            continue
        hit = [i for i in rows if _close(got[i], out[i], atol) and not _close(out[i], expected[i], atol)]
        if hit and len(hit) >= len(rows) / 2:
            other = [i for i in rows if i not in hit]
            return (f"it matches {text} at {name} {', '.join(map(str, hit))}" +
                    (f" ({name} {', '.join(map(str, other))} differs from both)" if other else ""))
    return None


def expect_close(got: torch.Tensor, expected: torch.Tensor, what: str, *,
                 mistakes: Mapping[str, torch.Tensor] | None = None, atol: float = 1e-5,
                 axes: Sequence[str] | None = None, families: Mapping[str, Family] | None = None) -> None:
    """Raise CandidateError unless got ≈ expected; name the mistakes that reproduce `got`: a fixed output of
    `mistakes`, or one of `families`, mistakes with a number in them ("the scores times {c:.4g}": the text
    is formatted with the c in [lo, hi] for which produce(c) reproduces got, and inv = 1/c). When none
    does, say what differs by structure (_describe.differences over `axes`, the names of got's dimensions).
    A half-precision `got` is named as such when `expected` is in full precision; anything but a tensor
    (a numpy array, a list) is refused by name (as_tensor)."""
    got = as_tensor(got, what)
    if expected.dtype not in (torch.float16, torch.bfloat16):
        full_precision(got, what)
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        found = matching(got, mistakes or {}, atol)
        if found:
            raise CandidateError(f"{what} contains NaN: {either(found)}")
        raise CandidateError(f"{what} contains NaN" + _nan_source(got, expected, mistakes or {}, axes, atol))
    if _close(got, expected, atol):
        return
    found = matching(got, mistakes or {}, atol)
    if found:
        raise CandidateError(f"{what} is wrong: it matches {either(found)}")
    for text, out in (mistakes or {}).items():  # a known mistake with an off-by-one on top
        for k in (1, -1):
            if out.shape == got.shape and _close(got, out + k, atol):
                raise CandidateError(f"{what} is wrong: it matches {text}, and {k:+d} on top of that (an off-by-one)")
    partly = _partly(got, expected, mistakes or {}, axes, atol)
    if partly:
        raise CandidateError(f"{what} is wrong: {partly}")
    for text, (produce, lo, hi) in (families or {}).items():
        c = fitted(produce, got, lo, hi) if got.shape == expected.shape else None
        if c is not None:
            raise CandidateError(f"{what} is wrong: it matches " + text.format(c=c, inv=1 / c))
    if got.shape == expected.shape:
        facts = differences(got, expected, axes)
        if axes is not None or len(facts) > 1 or not facts[0].startswith("max abs difference"):
            raise Unexplained(f"{what} is wrong: " + "; ".join(facts))
    diff = (got.detach().double() - expected.detach().double()).abs().max().item()
    raise Unexplained(f"{what} is wrong (max abs difference {diff:.3g} from the reference), "
                      f"and it matches none of the usual mistakes")
