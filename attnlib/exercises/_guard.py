"""What every run of a reader's code is wrapped in: a time limit, and torch's global state kept as it was.

A reader's function may loop forever, or change state that outlives the call: the default dtype, the
grad mode, the global random seed. `guarded` runs it under a time limit (a SIGALRM timer on the main
thread, as in a notebook cell or a terminal; an exception injected from a timer thread elsewhere), then
puts the global state back and says what the code changed. Nothing is left running afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Iterator

import torch

from attnlib.timing import one_thread  # noqa: F401 - re-exported: the checkers run small tensors on one thread

__all__ = ["TimeLimit", "time_limit", "seconds", "limited_to", "changed_state", "one_thread"]

_SECONDS = [10.0]  # the limit for one call of reader code; limited_to() changes it for a while
_active = threading.local()  # .depth: nested limits keep the outer one


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


def _raise(signum: int, frame: object) -> None:
    raise TimeLimit


@contextlib.contextmanager
def time_limit(limit: float) -> Iterator[None]:
    """Raise TimeLimit in the block once `limit` seconds have passed (again every 0.1 s, should the code
    catch it, and from a timer thread after 2 * limit, should it ignore the signal); nested blocks keep the
    outermost limit."""
    if getattr(_active, "depth", 0):
        yield
        return
    _active.depth = 1
    try:
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGALRM, _raise)
            signal.setitimer(signal.ITIMER_REAL, limit, 0.1)
            try:
                with _injected_after(2 * limit):  # in case the code ignores SIGALRM (signal.signal(..., SIG_IGN))
                    yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        else:
            with _injected_after(limit):
                yield
    finally:
        _active.depth = 0


@contextlib.contextmanager
def _injected_after(limit: float) -> Iterator[None]:
    """Off the main thread (no signals there): a timer thread injects TimeLimit into this thread."""
    target, lock, state = threading.get_ident(), threading.Lock(), {"done": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(TimeLimit))

    timer = threading.Timer(limit, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        timer.join()


def _snapshot() -> tuple:
    return torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_default_device()


def _restore_flags(what: str) -> Iterator[list[str]]:
    """Deterministic-algorithms mode, anomaly detection and the thread count: global switches a reader's
    code may flip and leave flipped; each is put back and named."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(), torch.get_num_threads())
    found: list[str] = []
    try:
        yield found
    finally:
        after = (torch.are_deterministic_algorithms_enabled(), torch.is_anomaly_enabled(), torch.get_num_threads())
        for name, old, new, put_back in (
                ("torch.use_deterministic_algorithms", before[0], after[0], torch.use_deterministic_algorithms),
                ("torch.autograd.set_detect_anomaly", before[1], after[1], torch.autograd.set_detect_anomaly),
                ("torch.set_num_threads", before[2], after[2], torch.set_num_threads)):
            if new != old:
                put_back(old)
                found.append(f"{what} called {name}({new}) and left it set: a global setting that changes the rest "
                             f"of your session. The checker set it back to {old}")


@contextlib.contextmanager
def changed_state(what: str) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds what `what` changed in torch's global state (the default
    dtype, the grad mode, the default device, a call to torch.manual_seed, deterministic mode, anomaly detection,
    the thread count), each already put back."""
    before, seeded, found = _snapshot(), [], []
    original = torch.manual_seed

    def manual_seed(seed: int):  # the reader's call is recorded, then done as asked
        seeded.append(seed)
        return original(seed)

    torch.manual_seed = torch.random.manual_seed = manual_seed
    flags = contextlib.contextmanager(_restore_flags)(what)
    try:
        with flags as flipped:
            yield found
    finally:
        torch.manual_seed = torch.random.manual_seed = original
        dtype, grad, device = _snapshot()
        if dtype != before[0]:
            torch.set_default_dtype(before[0])
        if grad != before[1]:
            torch.set_grad_enabled(before[1])
        if device != before[2]:  # None: no default-device mode at all, as before
            torch.set_default_device(None if before[2] == torch.device("cpu") else before[2])
        found += _describe(what, before, (dtype, grad, device), seeded) + flipped


def _describe(what: str, before: tuple, after: tuple, seeded: list) -> list[str]:
    """Each change in plain words, with why it matters."""
    found = []
    if after[0] != before[0]:
        found.append(f"{what} called torch.set_default_dtype({after[0]}) and left it set: every tensor created "
                     f"afterwards in your session would be {after[0]}. The checker set the default dtype back to "
                     f"{before[0]}; change the dtype of your own tensors instead (x.double(), dtype=...)")
    if after[1] != before[1]:
        state = "off" if before[1] else "on"
        found.append(f"{what} switched autograd {state} (torch.set_grad_enabled({not before[1]}), or a "
                     f"torch.no_grad() entered and never left) and left it {state}: the grad mode is global, so "
                     f"training would learn nothing. The checker switched it back; use a `with torch.no_grad():` "
                     f"block, which restores it")
    if after[2] != before[2]:
        found.append(f"{what} changed the default device to {after[2]} and left it; the checker set it back to "
                     f"{before[2]}")
    if seeded:
        found.append(f"{what} calls torch.manual_seed({seeded[0]}): it resets the global random generator every "
                     f"time, so dropout would drop the same units at every step and every random draw in your "
                     f"session would repeat. Seed once, outside the module")
    return found

