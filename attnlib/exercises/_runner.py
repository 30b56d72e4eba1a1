"""The one way reader code is run, by the exercises and the drill alike: `run` calls it under the time limit
and the state guard (_guard, _state), and turns whatever goes wrong into a CandidateError that says what,
with the reader's own line."""

from __future__ import annotations

import contextlib
import inspect
import traceback
from collections.abc import Callable, Iterator

import torch

from attnlib.exercises._arguments import altered, module_text, snapshot
from attnlib.exercises._binding import fit_call
from attnlib.exercises._child import beat
from attnlib.exercises._guard import GRACE, LateTimeLimit, TimeLimit, changed_state, seconds, time_limit
from attnlib.exercises._state import ExitCalled, library_file

__all__ = ["CandidateError", "NotAttempted", "run", "reader_line", "arg_names", "one_check"]

_STOPPED: list[list[str]] = []  # per check being run (a stack), the verdict on its reader code stopped for time

class CandidateError(Exception):
    """The reader's code did something wrong; the message says what, for the reader."""


class NotAttempted(Exception):
    """The reader's stub still raises NotImplementedError."""


@contextlib.contextmanager
def one_check() -> Iterator[None]:
    """The block is one check: once its reader code is stopped for time, `run` gives that verdict again at once
    instead of running the code again (a checker that retries another call would make the reader wait twice)."""
    _STOPPED.append([])
    try:
        yield
    finally:
        _STOPPED.pop()


def _is_reader_frame(frame: traceback.FrameSummary) -> bool:
    """Not torch, attnlib, an installed library, the standard library or Python's import machinery."""
    return bool(frame.lineno) and not library_file(frame.filename)


def reader_line(exc: BaseException) -> str:
    """' at line N of your code: `source`' for the deepest frame of the reader's own code ('' if none)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_reader_frame(f)]
    if not frames:
        return ""
    f = frames[-1]
    source = f" `{f.line.strip()}`" if f.line else ""
    return f" at line {f.lineno} of your code{':' if source else ''}{source}"


def arg_names(candidate: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The reader's own parameter names for args, e.g. ['scores'], or 'argument N' where unknown."""
    target = candidate.forward if isinstance(candidate, torch.nn.Module) else candidate  # a module's own names
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"argument {i + 1}" for i in range(len(args))] + list(kwargs)


def _hint(exc: BaseException) -> str:
    """What a puzzling exception usually means in attention code ('' when nothing is known)."""
    if any(f"return_types.{op}" in str(exc) for op in ("max", "min")):
        return (". x.max(dim) and x.min(dim) return a pair (values, indices), not a tensor: use "
                "x.amax(dim=-1, keepdim=True) or x.max(dim=-1, keepdim=True).values")
    return ""


def _exited(what: str, exc: SystemExit) -> str:
    if isinstance(exc, ExitCalled):
        return (f"{what} called {exc.call}{reader_line(exc)}, which ends the whole process at once (in a notebook, "
                f"its kernel); the checker stopped it. Your code must return its result, not end the program")
    return (f"{what} called sys.exit({'' if exc.code is None else repr(exc.code)}) (raised SystemExit)"
            f"{reader_line(exc)}: your code must return its result, not end the program")


def _own_override(value: object, depth: int = 0) -> str | None:
    """The name of a torch.Tensor subclass in `value` (or in a tuple, list or dict of it) whose __torch_function__
    is the reader's own: it would answer the checker's comparisons (allclose, eq, sub) itself."""
    if isinstance(value, torch.Tensor):
        code = getattr(getattr(type(value).__torch_function__, "__func__", None), "__code__", None)
        return type(value).__name__ if code is not None and not library_file(code.co_filename) else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return next((n for v in list(items)[:64] if depth < 3 and (n := _own_override(v, depth + 1))), None)


_PLAIN = (bool, int, float, complex, str, bytes, tuple, list, dict)


def _readers(method: object) -> bool:
    """Whether a method is the reader's own Python code (numpy.float64's == is numpy's, in C)."""
    code = getattr(method, "__code__", None)
    return code is not None and not library_file(code.co_filename)


def _own_equality(value: object, depth: int = 0) -> str | None:
    """'an int subclass Liar ...' for a value in `value` (or in a tuple, list or dict of it) of a subclass of
    a Python number, string or container with its own == or !=: it would answer the checker's comparisons."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    inner = next((n for v in list(items)[:64] if depth < 3 and (n := _own_equality(v, depth + 1))), None)
    base = next((b for b in _PLAIN if isinstance(value, b)), None)
    if inner or base is None or not any(_readers(getattr(type(value), op)) for op in ("__eq__", "__ne__")):
        return inner
    try:
        claims = value == object()  # nothing real equals a fresh object
    except Exception:  # noqa: BLE001 - an == that raises is the reader's too
        claims = False
    every = " that claims to equal everything (== is always True)" if claims is True else ""
    article = "an" if base.__name__[0] in "aeiou" else "a"
    return (f"a {type(value).__name__}, {article} {base.__name__} subclass with its own =={every}: it is not a real "
            f"{base.__name__}, and would answer the checker's comparisons itself. Return a plain {base.__name__}")


def run(candidate: Callable, *args, what: str = "your function", **kwargs):
    """Call the reader's code under a time limit; turn its exceptions into CandidateError (NotImplementedError:
    not attempted), and so a hang, sys.exit() or os._exit() and any change it leaves in global state (_state).

    A candidate that changes a tensor or list argument in place is a CandidateError too, even when
    its result is right: the caller's data (the scores, the cache) would be silently overwritten.
    """
    if not callable(candidate):
        raise CandidateError(f"expected a function or class, got {type(candidate).__name__}")
    if _STOPPED and _STOPPED[-1]:
        raise CandidateError(_STOPPED[-1][0])
    args, kwargs = fit_call(candidate, args, kwargs)  # def f(x, w, b, *, num_heads): the last by keyword
    values = (*args, *kwargs.values())
    copies = [snapshot(v) for v in values]
    beat()  # in a checker's child process: the parent's deadline starts again with this run
    try:
        with changed_state(what) as changes, time_limit(seconds(), what):
            result = candidate(*args, **kwargs)
    except NotImplementedError as exc:
        raise NotAttempted from exc
    except TimeLimit as exc:
        late = (f" {GRACE / 2:g} s later (it ignores SIGALRM, the signal that stops it on time, or catches the "
                f"exception the signal raises?)" if isinstance(exc, LateTimeLimit) else "")
        verdict = (f"{what} did not return within {seconds():g} s and was stopped{late}{reader_line(exc)}: an "
                   f"infinite loop, or a wait that never ends?")
        if _STOPPED:
            _STOPPED[-1].append(verdict)
        raise CandidateError(verdict) from None
    except SystemExit as exc:
        raise CandidateError(_exited(what, exc)) from None
    except Exception as exc:  # the reader's bug, with its type and line
        raise CandidateError(f"{what} raised {type(exc).__name__}: {exc}{reader_line(exc)}{_hint(exc)}") from None
    except KeyboardInterrupt:  # the reader's Ctrl-C (or the interrupt button): it stops the check, as it would any cell
        raise
    except BaseException as exc:  # noqa: BLE001 - GeneratorExit or the reader's own BaseException: a verdict, not a crash
        said = f" ({exc})" if str(exc) else ""
        raise CandidateError(f"{what} raised {type(exc).__name__}{said}{reader_line(exc)}, which is not an error "
                             f"a check can report as a wrong result: your code must return its result") from None
    if changes:
        raise CandidateError("; and ".join(changes))
    liar = _own_override(result)
    if liar:
        raise CandidateError(f"{what} returned a {liar}, a torch.Tensor subclass with its own __torch_function__: "
                             f"it would answer the checker's comparisons itself. Return plain torch.Tensors")
    liar = _own_equality(result)
    if liar:
        raise CandidateError(f"{what} returned {liar}")
    found = [(name, how) for name, v, c in zip(arg_names(candidate, args, kwargs), values, copies)
             if (how := altered(c, v))]
    modules = [f"`{name}` ({how})" for name, how in found if how != "its values"]
    if modules:
        raise CandidateError(module_text(what, modules))
    changed = [name for name, how in found if how == "its values"]
    if changed:
        raise CandidateError(f"{what} changed {' and '.join(changed)} in place (an in-place "
                             f"operation such as `x -= ...`, `x.exp_()` or `x[...] = ...` on an argument): "
                             f"the caller's data is overwritten. Work on a copy or use out-of-place operations")
    return result
