"""What a call costs: its wall time (once, or the best of n), ours / reference side by side, counted FLOPs
and the peak memory it allocates.

A bare time says little here (other processes share the two cores), so comparisons are ratios:
each round times both functions back to back, in alternating order, each side the fastest of a
few calls, and the result is the median of the per-round ratios. `make bench` and the chapters
that time things (chapters 9, 15 and 16) use these. A FLOP count does not depend on the machine at all:
count_flops gets it from PyTorch (chapters 4 and 10). peak_memory measures what a call allocates
(torch's profiler), for chapter 9 and its benchmark.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["timed", "best_time", "time_ratio", "count_flops", "peak_memory", "one_thread"]


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """(fn()'s result, the seconds that one call took), wall time by time.perf_counter.

    One call of a long job (a whole generation, chapter 16) when its result is wanted too; a single
    time on a shared machine includes whatever else ran meanwhile, so it is an upper bound, not a
    property of the code (compare with time_ratio).
    """
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def best_time(fn: Callable[[], object], repeats: int = 3) -> float:
    """Seconds of the fastest of `repeats` calls of fn(): on a shared machine, interference only adds time."""
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"repeats must be an int (calls to time), got {type(repeats).__name__}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (calls to time), got {repeats}")
    return min(timed(fn)[1] for _ in range(repeats))


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


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of CPU tensor memory held while fn() runs, above what was allocated before it.

    Measured, not computed: torch.profiler(profile_memory=True) records every allocation and free
    made through torch's CPU allocator, with its size and time. The running sum of those sizes in
    time order is what fn holds at each moment; its maximum is the peak. fn's result is still
    alive when fn returns, so it is counted; the inputs, allocated before, are not.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    cpu = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() in cpu), key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:  # nbytes > 0 for an allocation, < 0 for a free
        live += e.nbytes()
        peak = max(peak, live)
    return peak


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
