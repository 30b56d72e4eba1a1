"""`make bench`: run every benchmarks/bench_*.py that has a rows() function and print one table.

Each module measures ratios (ours / reference) in one run and returns a list of harness Rows. Each
runs in a fresh Python process: run in one process, the decoder and encoder benchmarks left
MultiHeadAttention's ratio about 0.1 worse than when it ran alone. A module that fails is reported
as a row of the table (with its error), so one broken benchmark never hides the others. Run one
module alone with `python -m benchmarks.bench_<topic>`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pkgutil
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks._harness import Row, print_table

THREADS = 2  # the targets are stated for 2 threads


def modules() -> list[str]:
    """The names of the bench_* modules next to this file, sorted."""
    here = str(Path(__file__).parent)
    return sorted(m.name for m in pkgutil.iter_modules([here]) if m.name.startswith("bench_"))


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform.processor() says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def run_module(name: str) -> list[Row]:
    """rows() of benchmarks.<name>, or one failed Row that says why it could not run."""
    try:
        module = importlib.import_module(f"benchmarks.{name}")
        if not callable(getattr(module, "rows", None)):
            return []
        return list(module.rows())
    except Exception as exc:  # noqa: BLE001 - a failing benchmark is a row of the table, not a crash
        message = " ".join(str(exc).split())[:160]
        return [Row(f"{name}: FAILED ({type(exc).__name__}: {message})", "-", "-", math.nan, math.nan)]


def run_in_fresh_process(name: str) -> list[Row]:
    """run_module(name) in a new interpreter (its Rows come back as JSON on stdout)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--one", name], stdout=subprocess.PIPE, text=True)
    try:
        return [Row(**row) for row in json.loads(done.stdout.strip().splitlines()[-1])]
    except (IndexError, ValueError, TypeError):
        return [Row(f"{name}: FAILED (its process exited with {done.returncode})", "-", "-", math.nan, math.nan)]


def main() -> None:
    if sys.argv[1:2] == ["--one"]:  # the child process: one module's rows as JSON
        torch.set_num_threads(THREADS)
        print(json.dumps([dataclasses.asdict(row) for row in run_module(sys.argv[2])]))
        return
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {THREADS} threads")
    rows: list[Row] = []
    for name in modules():
        start = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += run_in_fresh_process(name)
        print(f"  {name} took {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print_table(rows)
    bounded = [row for row in rows if row.met is not None]  # a row without a target is a measurement only
    missed = sum(not row.met for row in bounded)
    print(f"\n{len(bounded) - missed} of {len(bounded)} targets met" + (f"; {missed} NOT met" if missed else ""))


if __name__ == "__main__":
    main()
