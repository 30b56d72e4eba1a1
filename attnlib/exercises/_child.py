"""Reader code run in a forked child process: whatever it does, the caller gets an answer back and survives.

`in_child(work, deadline)` forks; the child runs `work()` on one thread, with at most 4 GiB more address
space than it started with, and sends back what it returned or raised (pickled) and what it printed. The
parent waits until `deadline` seconds have passed since the child last called `beat()` (the runner beats
before each run of reader code, so a check of many runs gets the deadline per run): a child still running then (a loop that swallows the time limit's
exception, a computation stuck in C code) is killed, and a child that ends without an answer (a segfault,
os._exit from C, the memory cap) is a `ChildLost` that says so. The child is always waited for, also when
the parent is interrupted (Ctrl-C, a notebook's interrupt button).

On Linux only: macOS forks a process that has used Objective-C or Accelerate unsafely (Python itself
spawns there), and Windows cannot fork; `available()` says whether a child is used. A fork of a process
that has imported torch and exits at once takes ~15 ms on a busy 2-core machine; a whole check in a child
took ~0.1 to 0.3 s more than in the process at a load average of ~19 (the child's first touches of the
parent's memory are copied; gc.freeze spares the objects the collector would otherwise touch).
ATTNLIB_CHECK_IN_PROCESS=1 turns the child off (to step into a checked function with a debugger).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import os
import pickle
import resource
import select
import signal
import sys
import time
from collections.abc import Callable

import torch

__all__ = ["ChildLost", "available", "in_child", "inside", "beat", "abandon"]

_INSIDE = [False]  # True in a child: a check inside it runs in that child, not in a grandchild
_BEAT = [-1]  # in a child: the pipe on which beat() tells the parent that the child is still making progress
_SEND = [-1, None]  # in a child: the pipe its outcome goes back on, and what the reader's code printed
_EXIT = os._exit  # the real one: the state guard replaces os._exit while reader code runs (_state)
_PRINTED = 20_000  # at most this many characters of what the reader's code printed are shown


class ChildLost(Exception):
    """The child ended without an answer, or ran past the deadline and was killed; the message says which."""


def available() -> bool:
    """Whether in_child forks (Linux, not turned off, not already in a child)."""
    return (sys.platform.startswith("linux") and not _INSIDE[0]
            and os.environ.get("ATTNLIB_CHECK_IN_PROCESS", "") in ("", "0"))


def inside() -> bool:
    """Whether this process is a checker's child."""
    return _INSIDE[0]


def beat() -> None:
    """In a child: restart the parent's deadline (one byte on the beat pipe); elsewhere nothing."""
    if _BEAT[0] >= 0:
        with contextlib.suppress(BlockingIOError):  # the pipe is full of beats the parent has not read yet
            os.write(_BEAT[0], b".")


def _send(fd: int, outcome: tuple, printed: io.StringIO) -> None:
    try:
        data = pickle.dumps((outcome, printed.getvalue()[-_PRINTED:]))
    except Exception as exc:  # noqa: BLE001 - an answer that cannot be pickled
        data = pickle.dumps((("raised", ChildLost(f"its result could not be sent back: {exc}")), ""))
    while data:
        data = data[os.write(fd, data):]


def abandon(why: str) -> None:
    """In a child: send ChildLost(why) back as the outcome and end the child at once (from a timer thread,
    when the reader's code swallows every attempt to stop it); elsewhere nothing."""
    if _SEND[0] >= 0:
        _send(_SEND[0], ("raised", ChildLost(why)), _SEND[1])
        _EXIT(0)


def _settle_child(printed: io.StringIO) -> None:
    """In the forked child: Python's prints go to `printed` and C's to /dev/null (a notebook's output socket
    belongs to the parent), no crash report (faulthandler writes to its own copy of the parent's stderr: the
    parent names the signal instead), one thread (a parent's OpenMP pool does not survive a fork), and at most
    4 GiB more address space."""
    _INSIDE[0] = True
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    faulthandler.disable()
    sys.stdout = sys.stderr = printed
    torch.set_num_threads(1)
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    cap = pages * os.sysconf("SC_PAGE_SIZE") + (4 << 30)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _child(work: Callable[[], object], fd: int, beats: int) -> None:
    try:
        _BEAT[0] = beats
        printed = io.StringIO()
        _SEND[:] = fd, printed
        _settle_child(printed)
        try:
            outcome = ("returned", work())
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it (a KeyboardInterrupt too:
            outcome = ("raised", exc)  # a Ctrl-C stops the check, whichever process it reached)
        _send(fd, outcome, printed)
    finally:
        os._exit(0)


def _read(fd: int, beats: int, deadline: float) -> bytes | None:
    """All the child sends on fd, or None if `deadline` seconds pass without a beat first."""
    chunks, due = [], time.monotonic() + deadline
    while (left := due - time.monotonic()) > 0:
        ready = select.select([fd, beats], [], [], left)[0]
        if beats in ready and os.read(beats, 1 << 12):
            due = time.monotonic() + deadline
        if fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    return None


def _lost(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"the process was killed by signal {sig} ({signal.Signals(sig).name}: a crash in C code, or out of memory?)"
    return (f"the process exited with status {os.WEXITSTATUS(status)} (os._exit() or a C library's exit(), which end "
            f"the process at once?)")


def in_child(work: Callable[[], object], deadline: float, *, show_printed: bool = True) -> object:
    """work() in a forked child: its return value (what it printed is printed here, if show_printed); what it
    raised is raised here; ChildLost if it ends without an answer or is still running after `deadline` s."""
    read, write = os.pipe()
    beats_in, beats_out = os.pipe()
    os.set_blocking(beats_out, False)  # a child that beats faster than the parent reads never waits
    gc.freeze()  # the child's collector then leaves the parent's objects alone: fewer pages copied on write
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; coverage does not follow it
        os.close(read), os.close(beats_in)
        _child(work, write, beats_out)
    gc.unfreeze()
    os.close(write), os.close(beats_out)
    data = None
    try:
        data = _read(read, beats_in, deadline)
    finally:
        os.close(read), os.close(beats_in)
        if data is None:  # past the deadline, or the parent was interrupted
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    if data is None:
        raise ChildLost(f"did not finish within {deadline:g} s and was stopped (a loop that catches every exception, "
                        f"or a long computation in C code?)")
    if not data:
        raise ChildLost(f"ended without an answer: {_lost(status)}")
    (kind, value), printed = pickle.loads(data)
    if printed and show_printed:
        sys.stdout.write(printed)
    if kind == "raised":
        raise value
    return value
