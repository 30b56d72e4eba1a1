"""What every run of a reader's code is wrapped in: a time limit that counts the reader's own code, and
torch's global state kept as it was (_state).

A reader's function may loop forever. `time_limit` stops it after `limit` seconds of its own running time
(a SIGALRM timer on the main thread, as in a notebook cell or a terminal; an exception injected from a
timer thread elsewhere). Time spent importing a module for the first time (`from transformers... import`
inside the function, a cold start of seconds on a busy machine) is not the reader's code: it is left out
of the count, and the limit never stops the code inside an import. Nothing is left running afterwards.
Code that ignores SIGALRM is stopped GRACE / 2 later from a timer thread; code still running GRACE after the
limit (it swallows every exception) ends a checker's child process (_child.abandon) with a verdict that says
so; in the reader's own process (no child) it is stopped again every 0.1 s, for as long as it swallows that.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import importlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator

from attnlib.exercises._child import abandon
from attnlib.exercises._state import changed_state, library_file  # noqa: F401 - changed_state re-exported: the drill
from attnlib.timing import one_thread  # noqa: F401 - re-exported: the checkers run small tensors on one thread

__all__ = ["TimeLimit", "LateTimeLimit", "GRACE", "time_limit", "seconds", "limited_to", "changed_state", "one_thread"]

_SECONDS = [10.0]  # the limit for one call of reader code; limited_to() changes it for a while
_active = threading.local()  # .depth: nested limits keep the outer one
_MAX_IMPORT = 120.0  # at most this much cold-import time is left out of one run
GRACE = 1.0  # seconds past the limit by which code that ignores SIGALRM, or swallows TimeLimit, is stopped


class TimeLimit(BaseException):
    """Raised inside reader code that ran past its time limit (a BaseException, so that `except
    Exception` in the reader's code does not swallow it)."""


class LateTimeLimit(TimeLimit):
    """TimeLimit raised GRACE / 2 after the limit from a timer thread: the code ignored SIGALRM."""


def seconds() -> float:
    """The time limit, in seconds, of one run of reader code."""
    return _SECONDS[0]


@contextlib.contextmanager
def limited_to(limit: float | None) -> Iterator[None]:
    """Use `limit` seconds per run of reader code inside the block (None: keep the current one)."""
    old = _SECONDS[0]
    _SECONDS[0] = old if limit is None else float(limit)
    try:
        yield
    finally:
        _SECONDS[0] = old


class _Clock:
    """The reader's running time: wall time since the start minus the time its thread spent in cold imports
    (imports that loaded a module not loaded before; `import os` in a loop is the reader's time)."""

    def __init__(self) -> None:
        self.start, self.excluded, self.depth, self.thread = time.monotonic(), 0.0, 0, threading.get_ident()

    def reader_time(self) -> float:
        return time.monotonic() - self.start - self.excluded

    @contextlib.contextmanager
    def importing(self) -> Iterator[None]:
        """Around one call of __import__: its time is excluded if it loaded new modules."""
        if threading.get_ident() != self.thread or self.depth:
            yield
            return
        self.depth, began, loaded = 1, time.monotonic(), len(sys.modules)
        try:
            yield
        finally:
            self.depth = 0
            if len(sys.modules) > loaded:
                self.excluded = min(_MAX_IMPORT, self.excluded + time.monotonic() - began)


@contextlib.contextmanager
def _imports_timed(clock: _Clock) -> Iterator[None]:
    """builtins.__import__ (the import statement) and importlib.import_module (transformers' lazy modules)
    wrapped for the block, so that the clock knows when the code is importing."""
    originals = builtins.__import__, importlib.import_module

    def timed(original):
        def timed_import(*args, **kwargs):
            with clock.importing():
                return original(*args, **kwargs)
        return timed_import

    builtins.__import__, importlib.import_module = map(timed, originals)
    try:
        yield
    finally:
        builtins.__import__, importlib.import_module = originals


def _due(clock: _Clock, limit: float) -> float:
    """Seconds until the limit is reached (<= 0: reached); 0.05 while the code is inside an import."""
    return 0.05 if clock.depth else limit - clock.reader_time()


@contextlib.contextmanager
def time_limit(limit: float, what: str = "your code") -> Iterator[None]:
    """Raise TimeLimit in the block once the reader's code has run `limit` seconds (again every 0.1 s, should
    the code catch it; LateTimeLimit from a timer thread GRACE / 2 later, should it ignore the signal; in a
    checker's child, a verdict naming `what` and the child ended GRACE after the limit, should it swallow
    them all); cold imports do not count; nested blocks keep the outermost limit."""
    if getattr(_active, "depth", 0):
        yield
        return
    _active.depth, clock = 1, _Clock()
    try:
        with _imports_timed(clock):
            if threading.current_thread() is threading.main_thread():
                with _alarm(clock, limit), _injected_after(clock, limit, what, late=True):  # SIGALRM ignored?
                    yield
            else:
                with _injected_after(clock, limit, what):
                    yield
    finally:
        _active.depth = 0


@contextlib.contextmanager
def _alarm(clock: _Clock, limit: float) -> Iterator[None]:
    """SIGALRM raises TimeLimit once the clock reaches the limit; earlier signals re-arm the timer."""
    def handler(signum: int, frame: object) -> None:
        left = _due(clock, limit)
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left, 0.1)
            return
        raise TimeLimit

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, limit, 0.1)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _stuck(what: str, limit: float, thread: int) -> str:
    """The verdict on code still running GRACE after its limit, with the reader's line it is at."""
    frame = sys._current_frames().get(thread)
    mine = [f for f in traceback.extract_stack(frame) if not library_file(f.filename)] if frame else []
    where = f" at line {mine[-1].lineno} of your code: `{(mine[-1].line or '').strip()}`" if mine else ""
    return (f"was stopped: {what} ran past its time limit of {limit:g} s and was still running {GRACE:g} s later"
            f"{where}. It swallows the exception that stops it (`except BaseException:` or a bare `except:` in a "
            f"loop?) or ignores SIGALRM, so the checker's process was ended; your kernel is untouched")


@contextlib.contextmanager
def _injected_after(clock: _Clock, limit: float, what: str, late: bool = False) -> Iterator[None]:
    """A timer thread injects TimeLimit into this thread once the clock reaches `limit` (off the main thread
    there are no signals; with `late`, LateTimeLimit GRACE / 2 after it, when SIGALRM is ignored), again every
    0.1 s, and abandons a checker's child with a verdict GRACE after the limit, until the block ends."""
    target, lock, done = clock.thread, threading.Lock(), threading.Event()
    start, kind = (limit + GRACE / 2, LateTimeLimit) if late else (limit, TimeLimit)

    def watch() -> None:
        while not done.wait(max(0.01, _due(clock, start))):
            if _due(clock, start) > 0:
                continue
            with lock:
                if done.is_set():
                    return
                if _due(clock, limit + GRACE) <= 0:
                    abandon(_stuck(what, limit, target))  # in a child: ends it; elsewhere: returns
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(kind))
            done.wait(0.1)

    timer = threading.Thread(target=watch, daemon=True)
    timer.start()
    try:
        yield
    finally:
        with lock:
            done.set()
        timer.join()
