"""How fast decoding can be: each new token reads every weight it multiplies by once, so memory bandwidth
bounds tokens/s.

A cached decoding step at batch 1 multiplies one row vector by every weight matrix: two FLOPs per
weight (a multiply and an add) for the four bytes a float32 weight takes to read. A CPU does far
more arithmetic per second than that ratio needs, so the step waits on memory: it is *memory-bound*,
and a step that reads each weight as stored (4 bytes in float32) for one sequence produces no more than

    tokens/s <= read bandwidth / bytes of the weights

tokens per second (the KV cache, small next to the weights at short lengths, adds its own bytes). The
bound is per step: a batch shares each read among its rows, and fewer bytes per weight raise it.
read_bandwidth estimates the first number on this machine; weight_bytes counts the second.
"""

from __future__ import annotations

import torch

from attnlib.timing import best_time

__all__ = ["read_bandwidth", "weight_bytes", "streaming_limit"]


def read_bandwidth(nbytes: int = 2**30, repeats: int = 5) -> float:
    """An estimate of the bytes per second this machine reads from memory: the fastest of `repeats` sums
    over a float32 buffer of `nbytes` (far larger than any cache), with torch's current number of
    threads. A well-threaded kernel can read faster than a plain sum (chapter 12)."""
    buffer = torch.ones(nbytes // 4)
    seconds = best_time(buffer.sum, repeats)
    return buffer.nbytes / seconds


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, each tensor counted once (a tied lm_head shares the embedding's)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() lists a tied one once


def streaming_limit(model: torch.nn.Module, bandwidth: float) -> float:
    """The most tokens per second a batch-1 decoding step can reach, by this estimate: bandwidth /
    weight_bytes(model), for a step that multiplies by every weight (a tied output layer does)."""
    return bandwidth / weight_bytes(model)
