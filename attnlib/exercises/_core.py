"""The machinery every exercise checker shares.

A checker runs the reader's code on inputs it chooses (through _runner.run: the time limit, the state
guard), compares the result with attnlib's, and on a mismatch tries known mistakes until one reproduces
the reader's output (_expect.expect_close; re-exported here, with as_tensor and matching). The whole check
runs in a forked child process where one is available (_child), so that an answer that crashes or hangs in
C code costs the child, not the reader's kernel. It never raises: the reader's exceptions, wrong types and wrong shapes all become a
failed `CheckResult` whose message says what is wrong. A stub that still raises NotImplementedError reads
"not attempted yet".
"""

from __future__ import annotations

import functools
import html
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlib.exercises._child import ChildLost, available, in_child
from attnlib.exercises._expect import Family, Unexplained, as_tensor, expect_close, full_precision, matching
from attnlib.exercises._guard import seconds
from attnlib.exercises._runner import CandidateError, NotAttempted, arg_names, one_check, reader_line, run
from attnlib.exercises._state import restore_torch
from attnlib.exercises._state_text import replaced_text

__all__ = ["CheckResult", "CandidateError", "checker", "run", "as_tensor", "full_precision", "expect_close",
           "matching", "arg_names", "Family", "Unexplained"]

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


def _checked(name: str, body: Callable[..., str], args: tuple, kwargs: dict) -> CheckResult:
    """body(*args, **kwargs) with the random generator seeded, its outcome as a CheckResult."""
    try:
        with one_check(), torch.random.fork_rng():
            torch.manual_seed(0)
            message = body(*args, **kwargs)
        return CheckResult(name, True, message)
    except NotAttempted:
        return CheckResult(name, False, "not attempted yet: replace `raise NotImplementedError` "
                           "with your code and run the cell again", attempted=False)
    except CandidateError as exc:
        return CheckResult(name, False, str(exc))
    except Exception as exc:  # noqa: BLE001 - a checker must never crash on a reader
        return CheckResult(name, False, f"the check could not run your code: "
                           f"{type(exc).__name__}: {exc}{reader_line(exc)}")


def checker(name: str) -> Callable[[Callable[..., str]], Callable[..., CheckResult]]:
    """Wrap `body(candidate) -> success message` into a checker that returns a CheckResult and never raises.
    Where a child process is available (_child), the check runs in one: an answer that hangs in C code,
    crashes or ends its process loses the child, never the reader's kernel, and leaves its state there."""
    def wrap(body: Callable[..., str]) -> Callable[..., CheckResult]:
        @functools.wraps(body)
        def check(*args, **kwargs) -> CheckResult:
            replaced = restore_torch()  # torch's own functions, whatever the session did to them before
            if replaced:
                return CheckResult(name, False, replaced_text("code run before this check", replaced))
            if not available():
                return _checked(name, body, args, kwargs)
            try:
                return in_child(lambda: _checked(name, body, args, kwargs), 4 * seconds() + 5)
            except ChildLost as exc:
                return CheckResult(name, False, f"the check of your code {exc}")
        # help() and the API page show body's parameters, and what check really returns
        check.__signature__ = inspect.signature(body).replace(return_annotation="CheckResult")
        return check
    return wrap
