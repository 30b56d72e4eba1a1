"""How fast decoding can be: each step reads every weight it multiplies by, and every sequence's KV cache,
once, so memory bandwidth bounds tokens/s.

A cached decoding step at batch 1 multiplies one row vector by every weight matrix: two FLOPs per
weight (a multiply and an add) for the four bytes a float32 weight takes to read. A CPU does far
more arithmetic per second than that ratio needs, so the step waits on memory: it is *memory-bound*.
A step for a batch of B sequences reads the weights once for all its rows, and each sequence's own
KV cache (bytes that grow with B x context), so it produces at most

    tokens/s <= B x read bandwidth / (bytes of the weights + bytes of the B caches)

tokens per second. At batch 1 and a short context the weights dominate; at long context and large B
the caches do, and then batching raises the bound less and less, never above bandwidth / bytes of one
cache. read_bandwidth estimates the bandwidth on this machine, weight_bytes counts the weights' bytes,
step_bytes those a step reads (an untied embedding table left out: a step looks up one row of it),
attnlib.caches.cache_bytes a cache's.
"""

from __future__ import annotations

import time

import torch

from attnlib._checks import require_count

__all__ = ["read_bandwidth", "weight_bytes", "step_bytes", "streaming_limit"]


def read_bandwidth(nbytes: int = 2**30, repeats: int = 5, seconds: float = 0.0) -> float:
    """An estimate of the bytes per second this machine reads from memory: sums over a float32 buffer of
    `nbytes` (far larger than any cache) with torch's current number of threads, back to back for at least
    `seconds` (one sum at least), the bytes over the time; the best of `repeats` such windows.

    On a machine shared with other work the rate moves (on this book's machine single 1 GiB sums have read
    anywhere from about 20 to 80 GB/s from one time to another), so the fastest short sum is a best moment,
    not what a longer call can average. A limit for a call that
    takes t seconds is measured over windows of t seconds (chapter 12, `make bench`). A well-threaded kernel
    can read faster than a plain sum (chapter 12)."""
    require_count(nbytes, "nbytes", 4, "bytes of the buffer, one float32 at least")
    require_count(repeats, "repeats", 1, "windows to measure")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
    buffer = torch.ones(nbytes // 4)
    return max(_window_rate(buffer, seconds) for _ in range(repeats))


def _window_rate(buffer: torch.Tensor, seconds: float) -> float:
    """Bytes per second of back-to-back sums of buffer for at least `seconds` (one sum at least)."""
    start, sums = time.perf_counter(), 0
    while True:
        buffer.sum()
        sums += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return sums * buffer.nbytes / elapsed


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, each tensor counted once (a tied lm_head shares the embedding's)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() lists a tied one once


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a cached decoding step reads: weight_bytes(model) less every embedding table
    that no nn.Linear multiplies by (an untied one: a step looks up one row of it per sequence, which this
    leaves out). With a tied output layer, all of weight_bytes(model)."""
    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    looked_up = {id(m.weight): m.weight for m in model.modules()
                 if isinstance(m, torch.nn.Embedding) and id(m.weight) not in multiplied}
    return weight_bytes(model) - sum(w.numel() * w.element_size() for w in looked_up.values())


def streaming_limit(model: torch.nn.Module, bandwidth: float, *, batch: int = 1, cache_bytes: int = 0) -> float:
    """The most tokens per second a decoding step can reach, by this estimate: batch x bandwidth /
    (step_bytes(model) + cache_bytes), for a step that reads every weight it multiplies by (all of them
    but an untied embedding table) and `cache_bytes`, the KV caches of all `batch` sequences (0: the
    weights alone)."""
    require_count(batch, "batch", 1, "sequences in the step")
    require_count(cache_bytes, "cache_bytes", 0, "bytes of the batch's KV caches")
    return batch * bandwidth / (step_bytes(model) + cache_bytes)
