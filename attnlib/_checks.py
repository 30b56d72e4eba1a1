"""Input checks shared by every module: clear errors that name the argument and its shape."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def fmt_shape(shape: Sequence[int]) -> str:
    """torch.Size([2, 7]) -> '(2, 7)'; a one-element shape keeps its comma: '(7,)'."""
    return str(tuple(int(n) for n in shape))


def require_tensor(x: object, name: str) -> torch.Tensor:
    """Return x if it is a tensor, else raise TypeError naming the argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def require_float_tensor(x: object, name: str) -> torch.Tensor:
    """Return x if it is a floating-point tensor, else raise TypeError naming the argument."""
    require_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}; "
                        f"convert it with {name}.float()")
    return x


def require_dims(x: torch.Tensor, name: str, dims: int, expected: str) -> torch.Tensor:
    """Return x if it has `dims` dimensions, else raise ValueError: 'x of shape (..) is not (B, T, D)'."""
    if x.dim() != dims:
        raise ValueError(f"{name} of shape {fmt_shape(x.shape)} is not {expected}")
    return x


def require_count(n: object, name: str, low: int, meaning: str) -> int:
    """Return n if it is an int >= low (not a bool), else raise ValueError naming the argument and what it counts."""
    if isinstance(n, bool) or not isinstance(n, int) or n < low:
        raise ValueError(f"{name} must be an int >= {low} ({meaning}), got {n!r}")
    return n
