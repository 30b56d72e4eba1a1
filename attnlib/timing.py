"""What a call costs: a best-of-n wall time, ours / reference side by side, and counted FLOPs.

A bare time says little here (other processes share the two cores), so comparisons are ratios:
each round times both functions back to back, in alternating order, each side the fastest of a
few calls, and the result is the median of the per-round ratios. `make bench` and the chapters
that time things (chapter 9) use these. A FLOP count does not depend on the machine at all:
count_flops gets it from PyTorch (chapters 4 and 10).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["best_time", "time_ratio", "count_flops", "one_thread"]


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


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of fn() as torch's FlopCounterMode counts them: 2 per multiply-add of every matrix product
    (and of SDPA); elementwise work such as the softmax is not counted.

    Run fn on tensors (and modules) on the "meta" device to count without computing or allocating.
    """
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one thread, then put the thread count back: small tensors gain nothing from a
    second thread, and on a busy machine a thread pool's synchronisation made each small op 10-40 times
    slower (measured here; the exercise checkers and chapter 13's small models use it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
