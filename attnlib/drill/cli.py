"""The interview drill from a terminal: check an answer, or practise against the clock.

    python -m attnlib.drill check FILE [--name CLASS]   # exit 0 passed, 1 failed, 2 usage problem
    python -m attnlib.drill practice FILE [--minutes 5]  # re-checks FILE on every save until it passes

`check` runs check_multi_head_attention on the nn.Module class in FILE (--name, or the one class that
the file's other classes lead up to; several candidates are a usage problem), in a child process with a
time limit on each run of the file's code (child.py): a file that loops, exits or crashes gets a failed
verdict that says so. `practice` writes a starter FILE when there is none, prints the task, and checks
FILE each time it is saved, printing each verdict with the elapsed time m:ss; it ends with exit 0 and the
time taken against the goal as soon as the answer passes, or exit 1 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from attnlib.drill.child import check_in_child
from attnlib.drill.files import LIMIT, UsageError
from attnlib.exercises._core import CheckResult

__all__ = ["main"]

TASK = """\
The interview drill: write multi-head attention from memory.
  class MultiHeadAttention(nn.Module), built as MultiHeadAttention(d_model, num_heads)
  forward(x, mask=None): x (B, T, D); mask None or a bool tensor broadcasting to the scores
    (B, H, T, T), True = may attend; returns out (B, T, D), or (out, attention weights)
  q, k, v and the output projection are nn.Linear layers of any names and any split."""

STARTER = """\
{task}
# Save this file: every save is checked. Ctrl-C gives up.
import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError
"""


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of FILE: a save changes it; None while the file is missing."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _verdict(result: CheckResult, note: str = "") -> str:
    return f"{result.status.upper()}: {result.message}" + (f" ({note})" if note else "")


def _check(args: argparse.Namespace) -> int:
    try:
        result, note = check_in_child(Path(args.file), args.name, args.seconds)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(_verdict(result, note))
    return 0 if result.passed else 1


def _practice(args: argparse.Namespace) -> int:
    path, goal = Path(args.file), args.minutes * 60
    task = "\n".join(f"# {line}" for line in TASK.splitlines())
    if not path.exists():
        path.write_text(STARTER.format(task=task))
        print(f"wrote a starter {path}")
    seen = _stamp(path)  # before the prompt: a save made after it is always seen
    # Ctrl-C is how a session stops: make it raise KeyboardInterrupt even when the process was started
    # with SIGINT ignored (a background job of a script, `nohup`), which would otherwise poll forever
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(TASK)
    print(f"Goal: {_clock(goal)}. Edit and save {path}: each save is checked. Ctrl-C to stop.", flush=True)
    start, checks, last = time.monotonic(), 0, "no save checked yet"
    try:
        while True:
            stamp = _stamp(path)
            if stamp is not None and stamp != seen:
                seen, elapsed = stamp, time.monotonic() - start
                try:
                    result, note = check_in_child(path, args.name, args.seconds)
                    line = _verdict(result, note)
                except UsageError as exc:
                    result, line = None, f"ERROR: {exc}"
                checks, last = checks + 1, line.split(":", 1)[0]
                print(f"[{_clock(elapsed)}] {line}", flush=True)
                if result is not None and result.passed:
                    verdict = "within" if elapsed <= goal else "over"
                    print(f"Passed in {_clock(elapsed)}, {verdict} the {_clock(goal)} goal.", flush=True)
                    return 0
            time.sleep(args.poll)
    except KeyboardInterrupt:
        print(f"\nStopped at {_clock(time.monotonic() - start)} after {checks} checked saves; "
              f"last verdict: {last}.", flush=True)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlib.drill", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check the nn.Module class in FILE: exit 0 passed, 1 failed, 2 usage")
    practice = sub.add_parser("practice", help="write FILE against the clock; every save is checked")
    for p in (check, practice):
        p.add_argument("file", metavar="FILE")
        p.add_argument("--name", metavar="CLASS", help="the class to check, when FILE defines several")
        p.add_argument("--seconds", type=float, default=LIMIT,
                       help=f"the time limit of each run of FILE's code (default {LIMIT:g})")
    practice.add_argument("--minutes", type=float, default=5, help="the goal, in minutes (default 5)")
    practice.add_argument("--poll", type=float, default=0.25, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return _check(args) if args.command == "check" else _practice(args)
