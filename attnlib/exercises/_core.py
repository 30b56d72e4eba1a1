"""The machinery every exercise checker shares.

A checker runs the reader's code on inputs it chooses, compares the result with attnlib's, and on
a mismatch tries known mistakes until one reproduces the reader's output. It never raises: the
reader's exceptions, wrong types and wrong shapes all become a failed `CheckResult` whose message
says what is wrong. A stub that still raises NotImplementedError reads "not attempted yet".
"""

from __future__ import annotations

import copy
import functools
import html
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attnlib.exercises._binding import fit_call
from attnlib.exercises._guard import TimeLimit, changed_state, seconds, time_limit

__all__ = ["CheckResult", "CandidateError", "checker", "run", "as_tensor", "full_precision", "expect_close",
           "matching"]

_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                      for m in (torch, sys.modules["attnlib"]) if getattr(m, "__file__", None))
_LIBRARY_DIRS += tuple({os.path.join(p, "lib") for p in (sys.prefix, sys.base_prefix)})


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


class CandidateError(Exception):
    """The reader's code did something wrong; the message says what, for the reader."""


class _NotAttempted(Exception):
    pass


def _reader_line(exc: BaseException) -> str:
    """' at line N of your code: `source`' for the deepest frame outside torch, attnlib and the stdlib."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith(_LIBRARY_DIRS)]
    if not frames:
        return ""
    f = frames[-1]
    source = f" `{f.line.strip()}`" if f.line else ""
    return f" at line {f.lineno} of your code{':' if source else ''}{source}"


def _arg_names(candidate: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The reader's own parameter names for args, e.g. ['scores'], or 'argument N' where unknown."""
    target = candidate.forward if isinstance(candidate, torch.nn.Module) else candidate  # a module's own names
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"argument {i + 1}" for i in range(len(args))] + list(kwargs)


def _unchanged(before: object, after: object) -> bool:
    """Whether an argument still equals its copy taken before the call (NaN equals NaN)."""
    if isinstance(before, torch.Tensor):
        if before.shape != after.shape or before.dtype != after.dtype:
            return False
        if before.is_floating_point() or before.is_complex():
            return bool(((before == after) | (before.isnan() & after.isnan())).all())
        return torch.equal(before, after)
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - lists of tensors and the like: nothing to compare safely
        return True


def _hint(exc: BaseException) -> str:
    """What a puzzling exception usually means in attention code ('' when nothing is known)."""
    if any(f"return_types.{op}" in str(exc) for op in ("max", "min")):
        return (". x.max(dim) and x.min(dim) return a pair (values, indices), not a tensor: use "
                "x.amax(dim=-1, keepdim=True) or x.max(dim=-1, keepdim=True).values")
    return ""


def run(candidate: Callable, *args, what: str = "your function", **kwargs):
    """Call the reader's code under a time limit; turn its exceptions into CandidateError (NotImplementedError:
    not attempted), and so a hang, sys.exit() and any change it leaves in torch's global state (_guard).

    A candidate that changes a tensor or list argument in place is a CandidateError too, even when
    its result is right: the caller's data (the scores, the cache) would be silently overwritten.
    """
    if not callable(candidate):
        raise CandidateError(f"expected a function or class, got {type(candidate).__name__}")
    args, kwargs = fit_call(candidate, args, kwargs)  # def f(x, w, b, *, num_heads): the last by keyword
    values = (*args, *kwargs.values())
    copies = [v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) if isinstance(v, list)
              else None for v in values]
    try:
        with changed_state(what) as changes, time_limit(seconds()):
            result = candidate(*args, **kwargs)
    except NotImplementedError as exc:
        raise _NotAttempted from exc
    except TimeLimit as exc:
        raise CandidateError(f"{what} did not return within {seconds():g} s and was stopped{_reader_line(exc)}: "
                             f"an infinite loop, or a wait that never ends?") from None
    except SystemExit as exc:
        raise CandidateError(f"{what} called sys.exit({'' if exc.code is None else repr(exc.code)}) (raised "
                             f"SystemExit){_reader_line(exc)}: your code must return its result, not end the "
                             f"program") from None
    except Exception as exc:  # the reader's bug, with its type and line
        raise CandidateError(f"{what} raised {type(exc).__name__}: {exc}{_reader_line(exc)}{_hint(exc)}") from None
    if changes:
        raise CandidateError("; and ".join(changes))
    changed = [name for name, v, c in zip(_arg_names(candidate, args, kwargs), values, copies)
               if c is not None and not _unchanged(c, v)]
    if changed:
        raise CandidateError(f"{what} changed {' and '.join(changed)} in place (an in-place "
                             f"operation such as `x -= ...`, `x.exp_()` or `x[...] = ...` on an argument): "
                             f"the caller's data is overwritten. Work on a copy or use out-of-place operations")
    return result


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
            try:
                with torch.random.fork_rng():
                    torch.manual_seed(0)
                    message = body(candidate, *args, **kwargs)
                return CheckResult(name, True, message)
            except _NotAttempted:
                return CheckResult(name, False, "not attempted yet: replace `raise NotImplementedError` "
                                   "with your code and run the cell again", attempted=False)
            except CandidateError as exc:
                return CheckResult(name, False, str(exc))
            except Exception as exc:  # noqa: BLE001 - a checker must never crash on a reader
                return CheckResult(name, False, f"the check could not run your code: "
                                   f"{type(exc).__name__}: {exc}{_reader_line(exc)}")
        # help() and the API page show body's parameters, and what check really returns
        check.__signature__ = inspect.signature(body).replace(return_annotation="CheckResult")
        return check
    return wrap
