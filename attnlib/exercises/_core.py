"""The machinery every exercise checker shares.

A checker runs the reader's code on inputs it chooses (through _runner.run: the time limit, the state
guard), compares the result with attnlib's, and on a mismatch tries known mistakes until one reproduces
the reader's output. It never raises: the reader's exceptions, wrong types and wrong shapes all become a
failed `CheckResult` whose message says what is wrong. A stub that still raises NotImplementedError reads
"not attempted yet".
"""

from __future__ import annotations

import functools
import html
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attnlib.exercises._runner import CandidateError, NotAttempted, arg_names, reader_line, run
from attnlib.exercises._state import restore_torch
from attnlib.exercises._state_text import replaced_text

__all__ = ["CheckResult", "CandidateError", "checker", "run", "as_tensor", "full_precision", "expect_close",
           "matching", "arg_names"]

@dataclass(frozen=True)
class CheckResult:
    """What a checker found: `passed`, a plain-English `message`, and whether it was `attempted`."""

    name: str
    passed: bool
    message: str
    attempted: bool = True

    @property
    def status(self) -> str:
        return "passed" if self.passed else ("not attempted yet" if not self.attempted else "failed")

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"[{self.status}] {self.name}: {self.message}"

    def _repr_html_(self) -> str:
        colour = {"passed": "#1a7f37", "failed": "#cf222e"}.get(self.status, "#6e7781")
        return (f'<div style="border-left: 4px solid {colour}; padding: 0.3em 0.8em;">'
                f'<strong style="color: {colour}">{html.escape(self.name)}: {self.status}</strong>'
                f'<br>{html.escape(self.message)}</div>')


def as_tensor(value: object, what: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Check that the reader returned a tensor (of `shape`, when given); raise CandidateError if not."""
    if not isinstance(value, torch.Tensor):
        raise CandidateError(f"{what} should be a torch.Tensor, got {type(value).__name__}")
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


def expect_close(got: torch.Tensor, expected: torch.Tensor, what: str, *,
                 mistakes: Mapping[str, torch.Tensor] | None = None, atol: float = 1e-5) -> None:
    """Raise CandidateError unless got ≈ expected; name the mistakes that reproduce `got`.
    A half-precision `got` is named as such when `expected` is in full precision."""
    if expected.dtype not in (torch.float16, torch.bfloat16):
        full_precision(got, what)
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        found = matching(got, mistakes or {}, atol)
        raise CandidateError(f"{what} contains NaN" + (f": {' and '.join(found)}" if found else ""))
    if _close(got, expected, atol):
        return
    found = matching(got, mistakes or {}, atol)
    if found:
        raise CandidateError(f"{what} is wrong: it matches {' and '.join(found)}")
    diff = (got.detach().double() - expected.detach().double()).abs().max().item()
    raise CandidateError(f"{what} is wrong (max abs difference {diff:.3g} from the reference), "
                         f"and it matches none of the usual mistakes")


def checker(name: str) -> Callable[[Callable[..., str]], Callable[..., CheckResult]]:
    """Wrap `body(candidate) -> success message` into a checker that returns a CheckResult and never raises."""
    def wrap(body: Callable[..., str]) -> Callable[..., CheckResult]:
        @functools.wraps(body)
        def check(candidate, *args, **kwargs) -> CheckResult:
            replaced = restore_torch()  # torch's own functions, whatever the session did to them before
            if replaced:
                return CheckResult(name, False, replaced_text("code run before this check", replaced))
            try:
                with torch.random.fork_rng():
                    torch.manual_seed(0)
                    message = body(candidate, *args, **kwargs)
                return CheckResult(name, True, message)
            except NotAttempted:
                return CheckResult(name, False, "not attempted yet: replace `raise NotImplementedError` "
                                   "with your code and run the cell again", attempted=False)
            except CandidateError as exc:
                return CheckResult(name, False, str(exc))
            except Exception as exc:  # noqa: BLE001 - a checker must never crash on a reader
                return CheckResult(name, False, f"the check could not run your code: "
                                   f"{type(exc).__name__}: {exc}{reader_line(exc)}")
        # help() and the API page show body's parameters, and what check really returns
        check.__signature__ = inspect.signature(body).replace(return_annotation="CheckResult")
        return check
    return wrap
