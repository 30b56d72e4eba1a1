"""Side-by-side timing: ours against a reference in alternating rounds, reported as a ratio.

The machines are shared and noisy, so a bare time means little. Each round times both functions
back to back (in alternating order), each side's time the fastest of a few calls, and records
ours / reference; the result is the median of the per-round ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    """One line of the `make bench` table. `ratio` is ours / reference (lower is better unless
    `higher_is_better`); `target` is the bound the issue asks for."""

    measure: str
    ours: str
    reference: str
    ratio: float
    target: float
    higher_is_better: bool = False

    @property
    def met(self) -> bool:
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target


def _time(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls: on a shared machine, interference only ever adds time."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def time_ratio(ours: Callable[[], object], reference: Callable[[], object], *,
               rounds: int = 9, repeats: int = 3, warmup: int = 2) -> float:
    """Median over `rounds` of time(ours) / time(reference), each the fastest of `repeats` calls.

    Both run under torch.inference_mode(); the order alternates between rounds so that neither
    side always runs on a warmer cache.
    """
    with torch.inference_mode():
        for _ in range(warmup):
            ours()
            reference()
        ratios = []
        for r in range(rounds):
            if r % 2 == 0:
                t_ours, t_ref = _time(ours, repeats), _time(reference, repeats)
            else:
                t_ref, t_ours = _time(reference, repeats), _time(ours, repeats)
            ratios.append(t_ours / t_ref)
    return statistics.median(ratios)


def print_table(rows: list[Row]) -> None:
    """Print rows as a Markdown table: measure, ours, reference, ratio, target, met."""
    print("| measure | ours | reference | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        bound = ">=" if row.higher_is_better else "<="
        print(f"| {row.measure} | {row.ours} | {row.reference} | {row.ratio:.2f} | "
              f"{bound} {row.target:g} | {'yes' if row.met else 'NO'} |")
