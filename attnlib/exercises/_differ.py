"""expect_close, and when no known mistake matches, what differs, in the reader's terms (which positions,
heads or features, by how much: the drill's differ.differences)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from attnlib.drill.differ import differences
from attnlib.exercises._core import CandidateError, expect_close, matching

__all__ = ["expect_or_differences"]


def expect_or_differences(got: torch.Tensor, want: torch.Tensor, what: str,
            mistakes: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]],
            axes: Sequence[str], atol: float = 1e-5) -> None:
    """expect_close, and when no known mistake matches, what differs (differ.differences). `mistakes` may be
    a function, called only when got is wrong."""
    if got.shape == want.shape and matching(got, {"": want}, atol):
        return
    mistakes = mistakes() if callable(mistakes) else mistakes
    if got.shape == want.shape and not torch.isnan(got).any() and not matching(got, mistakes, atol):
        raise CandidateError(f"{what} is wrong: " + "; ".join(differences(got, want, axes)))
    expect_close(got, want, what, mistakes=mistakes, atol=atol)
