"""The interview drill's file check in a child process: whatever the reader's file does, a verdict comes back.

`check_in_child` forks; the child runs files.check_file (its prints discarded, one thread, its address
space capped) and sends the verdict back through a pipe. The parent waits until a hard deadline: a child
still running then (a loop that swallows the time limit's exception, a computation stuck in C code) is
killed, and a child that ends without a verdict (os._exit(), a crash, the memory cap) is reported as such.
Nothing is left behind: the child is always waited for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path

import torch

from attnlib.drill.files import LIMIT, NAME, UsageError, check_file
from attnlib.exercises._core import CheckResult

__all__ = ["check_in_child"]


def _quiet_child() -> None:
    """In the forked child: its prints go nowhere, one thread (a parent's OpenMP pool does not survive a
    fork), and at most 4 GiB more address space than it started with."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child ends with os._exit
    torch.set_num_threads(1)
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    cap = pages * os.sysconf("SC_PAGE_SIZE") + (4 << 30)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))


def _child(path: Path, name: str | None, seconds: float | None, fd: int) -> None:
    try:
        _quiet_child()
        try:
            result, note = check_file(path, name, seconds)
            payload = {"result": dataclasses.asdict(result), "note": note}
        except UsageError as exc:
            payload = {"usage": str(exc)}
        data = json.dumps(payload).encode()
        while data:
            data = data[os.write(fd, data):]
    finally:
        os._exit(0)


def _read(fd: int, deadline: float) -> bytes | None:
    """All the child sends, or None if the deadline passes first."""
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    return None


def check_in_child(path: Path, name: str | None = None, seconds: float | None = None) -> tuple[CheckResult, str]:
    """check_file in a forked child, stopped after a hard deadline; UsageError for a usage problem."""
    limit = LIMIT if seconds is None else seconds
    deadline = 4 * limit + 5  # the child's own limits name a hang; this stops what they cannot
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(path, name, seconds, write)
    os.close(write)
    try:
        data = _read(read, time.monotonic() + deadline)
    finally:
        os.close(read)
    if data is None:
        os.kill(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    if data:
        payload = json.loads(data)
        if "usage" in payload:
            raise UsageError(payload["usage"])
        return CheckResult(**payload["result"]), payload["note"]
    if data is None:
        why = (f"did not finish within {deadline:g} s and was stopped: your code kept running past the time limit of "
               f"{limit:g} s per call (a loop that catches every exception, or a long computation in C code?)")
    elif os.WIFSIGNALED(status):
        why = (f"ended without a verdict: the process was killed by signal {os.WTERMSIG(status)} "
               f"({signal.Signals(os.WTERMSIG(status)).name}; out of memory?)")
    else:
        why = (f"ended without a verdict: the process exited with status {os.WEXITSTATUS(status)} (does your file call "
               f"os._exit(), which ends the process at once?)")
    return CheckResult(NAME, False, f"the check of {path} {why}"), ""
