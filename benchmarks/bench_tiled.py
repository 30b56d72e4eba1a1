"""tiled_attention against SDPA and the naive attention: time ratios and measured peak memory.

B=1, H=8, Dh=64, fp32, 2 threads. Time: ours / reference in alternating rounds (harness
time_ratio). Memory: torch's profiler records every CPU allocation and free made while one call
runs (attnlib.timing.peak_memory); the peak of the running total is what that call held above its
inputs. Outputs are checked equal to SDPA before anything is timed.
Run alone with `python -m benchmarks.bench_tiled`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlib import attention, tiled_attention
from attnlib.timing import peak_memory, time_ratio
from benchmarks._harness import Row

B, H, DH = 1, 8, 64
T_TIME = 4096
T_MEMORY = (4096, 8192)
MIB = 2**20


def _qkv(T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, T, DH, generator=g) for _ in range(3))  # (B, H, T, Dh) each


def _check_equal(q, k, v, is_causal: bool) -> None:
    with torch.inference_mode():
        diff = (tiled_attention(q, k, v, is_causal=is_causal)
                - F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)).abs().max()
    if diff > 1e-4:
        raise AssertionError(f"tiled_attention differs from SDPA by {diff:.3g} (is_causal={is_causal})")


def time_rows() -> list[Row]:
    """T=4096: tiled / SDPA and tiled / naive, non-causal and causal."""
    q, k, v = _qkv(T_TIME)
    rows = []
    for causal, sdpa_target in ((False, 1.3), (True, 1.25)):
        _check_equal(q, k, v, causal)
        label = f"B{B} H{H} T={T_TIME} Dh{DH} fp32, {'causal' if causal else 'non-causal'}, time"
        tiled = lambda: tiled_attention(q, k, v, is_causal=causal)  # noqa: E731
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        naive = lambda: attention(q, k, v, is_causal=causal)  # noqa: E731
        rows.append(Row(label, "tiled_attention", "SDPA", time_ratio(tiled, sdpa, rounds=7, repeats=2),
                        sdpa_target))
        rows.append(Row(label, "tiled_attention", "naive attnlib.attention",
                        time_ratio(tiled, naive, rounds=5, repeats=1, warmup=1), 0.5))
    return rows


def peak_mib(T: int) -> float:
    """Peak MiB that one non-causal tiled_attention call at length T holds above its inputs."""
    q, k, v = _qkv(T)
    with torch.inference_mode():
        return peak_memory(lambda: tiled_attention(q, k, v)) / MIB


def memory_rows() -> list[Row]:
    """Peak at T=8192 against the 24 MiB budget, and its growth when T doubles from 4096."""
    small, big = (peak_mib(T) for T in T_MEMORY)
    budget = 24.0
    return [
        Row(f"peak memory over the inputs, T={T_MEMORY[1]}", f"tiled {big:.1f} MiB", f"budget {budget:g} MiB",
            big / budget, 1.0),
        Row(f"peak memory growth, T {T_MEMORY[0]} -> {T_MEMORY[1]}", f"tiled {big:.1f} MiB",
            f"tiled {small:.1f} MiB", big / small, 2.1),
    ]


def rows() -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return time_rows() + memory_rows()
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    from benchmarks._harness import print_table

    print_table(rows())
