"""`make bench`: run every benchmarks/bench_*.py that has a rows() function and print one table.

Each module measures ratios (ours / reference) in one run and returns a list of harness Rows. A
module that fails is reported as a row of the table (with its error), so one broken benchmark
never hides the others. Run one module alone with `python -m benchmarks.bench_<topic>`.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
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


def main() -> None:
    torch.set_num_threads(THREADS)
    rows: list[Row] = []
    for name in modules():
        start = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += run_module(name)
        print(f"  {name} took {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print_table(rows)
    missed = sum(not row.met for row in rows)
    print(f"\n{len(rows) - missed} of {len(rows)} targets met" + (f"; {missed} NOT met" if missed else ""))


if __name__ == "__main__":
    main()
