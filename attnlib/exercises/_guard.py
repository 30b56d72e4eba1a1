"""What every run of a reader's code is wrapped in: a time limit that counts the reader's own code, and
torch's global state kept as it was (_state).

A reader's function may loop forever. `time_limit` stops it after `limit` seconds of its own running time
(a SIGALRM timer on the main thread, as in a notebook cell or a terminal; an exception injected from a
timer thread elsewhere). Time spent importing a module for the first time (`from transformers... import`
inside the function, a cold start of seconds on a busy machine) is not the reader's code: it is left out
of the count, and the limit never stops the code inside an import. Nothing is left running afterwards.
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
from collections.abc import Iterator

from attnlib.exercises._state import changed_state  # noqa: F401 - re-exported: the drill imports it from here
from attnlib.timing import one_thread  # noqa: F401 - re-exported: the checkers run small tensors on one thread

__all__ = ["TimeLimit", "time_limit", "seconds", "limited_to", "changed_state", "one_thread"]

_SECONDS = [10.0]  # the limit for one call of reader code; limited_to() changes it for a while
_active = threading.local()  # .depth: nested limits keep the outer one
_MAX_IMPORT = 120.0  # at most this much cold-import time is left out of one run


class TimeLimit(BaseException):
    """Raised inside reader code that ran past its time limit (a BaseException, so that `except
    Exception` in the reader's code does not swallow it)."""


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
def time_limit(limit: float) -> Iterator[None]:
    """Raise TimeLimit in the block once the reader's code has run `limit` seconds (again every 0.1 s, should
    the code catch it, and from a timer thread after 2 * limit, should it ignore the signal); cold imports
    do not count; nested blocks keep the outermost limit."""
    if getattr(_active, "depth", 0):
        yield
        return
    _active.depth, clock = 1, _Clock()
    try:
        with _imports_timed(clock):
            if threading.current_thread() is threading.main_thread():
                with _alarm(clock, limit), _injected_after(clock, 2 * limit):  # in case SIGALRM is ignored
                    yield
            else:
                with _injected_after(clock, limit):
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


@contextlib.contextmanager
def _injected_after(clock: _Clock, limit: float) -> Iterator[None]:
    """A timer thread injects TimeLimit into this thread once the clock reaches `limit` (off the main thread
    there are no signals), and again every 0.1 s until the block ends."""
    target, lock, done = clock.thread, threading.Lock(), threading.Event()

    def watch() -> None:
        while not done.wait(max(0.01, _due(clock, limit))):
            if _due(clock, limit) > 0:
                continue
            with lock:
                if not done.is_set():
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(TimeLimit))
            done.wait(0.1)

    timer = threading.Thread(target=watch, daemon=True)
    timer.start()
    try:
        yield
    finally:
        with lock:
            done.set()
        timer.join()
