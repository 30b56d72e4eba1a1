"""expect_close with a catalogue computed only when needed (chapter 11's checkers): when no known mistake
matches, expect_close says what differs in the reader's terms (which positions, heads or features, by how
much: _describe.differences)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from attnlib.exercises._core import expect_close, matching

__all__ = ["expect_or_differences"]


def expect_or_differences(got: torch.Tensor, want: torch.Tensor, what: str,
            mistakes: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]],
            axes: Sequence[str], atol: float = 1e-5) -> None:
    """expect_close over `axes`; `mistakes` may be a function, called only when got is wrong."""
    if got.shape == want.shape and matching(got, {"": want}, atol):
        return
    expect_close(got, want, what, mistakes=mistakes() if callable(mistakes) else mistakes, axes=axes, atol=atol)
