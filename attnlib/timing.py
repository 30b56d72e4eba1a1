"""Timing on a shared, noisy machine: a best-of-n wall time, and ours / reference side by side.

A bare time says little here (other processes share the two cores), so comparisons are ratios:
each round times both functions back to back, in alternating order, each side the fastest of a
few calls, and the result is the median of the per-round ratios. `make bench` and the chapters
that time things (chapter 9) use these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["best_time", "time_ratio"]


def best_time(fn: Callable[[], object], repeats: int = 3) -> float:
    """Seconds of the fastest of `repeats` calls of fn(): on a shared machine, interference only adds time."""
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
                t_ours, t_ref = best_time(ours, repeats), best_time(reference, repeats)
            else:
                t_ref, t_ours = best_time(reference, repeats), best_time(ours, repeats)
            ratios.append(t_ours / t_ref)
    return statistics.median(ratios)
