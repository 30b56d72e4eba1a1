"""The interview drill from a terminal: check an answer, or practise against the clock.

    python -m attnlib.drill check FILE [--name CLASS]   # exit 0 passed, 1 failed, 2 usage problem
    python -m attnlib.drill practice FILE [--minutes 5]  # re-checks FILE on every save until it passes

`check` runs attnlib.exercises.check_multi_head_attention on the nn.Module class in FILE (the only one,
the one no other class uses, or --name). `practice` writes a starter FILE when there is none, prints the
task, and checks FILE each time it is saved, printing each verdict with the elapsed time m:ss; it ends
with exit 0 and the time taken against the goal as soon as the answer passes, or exit 1 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import inspect
import signal
import sys
import time
import traceback
import types
from pathlib import Path

from torch import nn

from attnlib.exercises import CheckResult, check_multi_head_attention

__all__ = ["main", "load", "check_file", "UsageError"]

TASK = """\
The interview drill: write multi-head attention from memory.
  class MultiHeadAttention(nn.Module), built as MultiHeadAttention(d_model, num_heads)
  forward(x, mask=None): x (B, T, D); mask None or a bool tensor broadcasting to the scores
    (B, H, T, T), True = may attend; returns out (B, T, D), or (out, weights)
  q, k, v and the output projection are nn.Linear layers of any names, separate or fused."""

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


class UsageError(Exception):
    """No such file, no class to check, or a syntax error: exit status 2."""


def load(path: Path) -> types.ModuleType:
    """Execute the reader's FILE as a fresh module (so that inspect finds its source); UsageError if it cannot."""
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    source = path.read_text()
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        line = (exc.text or "").rstrip("\n")
        raise UsageError(f"{path}, line {exc.lineno}: SyntaxError: {exc.msg}"
                         + (f"\n    {line.strip()}" if line.strip() else "")) from None
    module = types.ModuleType(f"_drill_answer_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # inspect.getsource looks the class's module up here
    exec(code, module.__dict__)  # the reader's own file, run as the reader asked
    return module


def _candidate(module: types.ModuleType, name: str | None) -> object:
    """The class to check: --name, else the only nn.Module class, else the one no other class uses."""
    own = {k: v for k, v in vars(module).items() if getattr(v, "__module__", None) == module.__name__}
    classes = {k: v for k, v in own.items() if inspect.isclass(v) and issubclass(v, nn.Module)}
    if name is not None:
        if name not in own:
            raise UsageError(f"no class {name} in {module.__file__}; it defines: {', '.join(own) or 'nothing'}")
        return own[name]
    if not classes:
        functions = [v for v in own.values() if inspect.isfunction(v)]
        if len(functions) == 1:
            return functions[0]  # the checker says the drill asks for a class, and why
        raise UsageError(f"no nn.Module class in {module.__file__}: the drill asks for class "
                         f"MultiHeadAttention(nn.Module)")
    sources = {k: inspect.getsource(v) for k, v in classes.items()}
    top = [k for k in classes if not any(k in s for other, s in sources.items() if other != k)]
    if len(classes) == 1 or len(top) == 1:
        return classes[next(iter(classes))] if len(classes) == 1 else classes[top[0]]
    raise UsageError(f"{module.__file__} defines several nn.Module classes ({', '.join(classes)}): "
                     f"choose one with --name")


def check_file(path: Path, name: str | None = None) -> CheckResult:
    """The verdict on FILE; UsageError for a usage problem. Exceptions at import are the reader's: a failure."""
    try:
        module = load(path)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the reader's module-level code raised
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f" at line {frames[-1].lineno}: `{(frames[-1].line or '').strip()}`" if frames else ""
        return CheckResult("multi-head attention (the interview drill)", False,
                           f"{path} raised {type(exc).__name__}: {exc}{where}")
    return check_multi_head_attention(_candidate(module, name))


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of FILE: a save changes it; None while the file is missing."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _verdict(result: CheckResult) -> str:
    return f"{result.status.upper()}: {result.message}"


def _check(args: argparse.Namespace) -> int:
    try:
        result = check_file(Path(args.file), args.name)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(_verdict(result))
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
                    result = check_file(path, args.name)
                    line = _verdict(result)
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
    practice.add_argument("--minutes", type=float, default=5, help="the goal, in minutes (default 5)")
    practice.add_argument("--poll", type=float, default=0.25, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return _check(args) if args.command == "check" else _practice(args)


if __name__ == "__main__":
    sys.exit(main())
