"""Fit the checker's positional arguments to the reader's signature.

A checker calls the reader's code as the exercise writes it, `fused_qkv(x, weight, bias, num_heads)`.
A reader may make the last ones keyword-only, `def fused_qkv(x, weight, bias, *, num_heads)`, as many
libraries do: the call is still the exercise's, so those arguments are passed by keyword instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = ["fit_call"]


def _signature(candidate: Callable) -> inspect.Signature | None:
    """The signature a call of candidate binds to (a module's forward), or None when it is unknown."""
    target = candidate.forward if isinstance(candidate, torch.nn.Module) else candidate
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def fit_call(candidate: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) with the positional arguments beyond candidate's positional parameters moved onto its
    keyword-only ones (the required ones first, then in their order); unchanged when the call binds as it
    is, when the signature is unknown, or when moving them would not bind either."""
    sig = _signature(candidate)
    if sig is None:
        return args, kwargs
    try:
        sig.bind(*args, **kwargs)
        return args, kwargs
    except TypeError:
        pass
    params = list(sig.parameters.values())
    n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    free = [p for p in params if p.kind == p.KEYWORD_ONLY and p.name not in kwargs]
    free = [p for p in free if p.default is p.empty] + [p for p in free if p.default is not p.empty]
    extra = args[n:]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or not extra or len(extra) > len(free):
        return args, kwargs
    moved = {**kwargs, **{p.name: a for p, a in zip(free, extra)}}
    try:
        sig.bind(*args[:n], **moved)
    except TypeError:
        return args, kwargs
    return args[:n], moved
