"""The interview drill's one call of the reader's forward (diagnosis and checks use it): on copies of the
inputs, with what it prints or warns hidden, the output unpacked and checked."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from attnlib.drill.build import with_hints
from attnlib.drill.output import unpack
from attnlib.drill.variants import Case
from attnlib.exercises._core import CandidateError

__all__ = ["call", "B", "T", "S", "D", "H"]

B, T, S, D, H = 2, 5, 7, 12, 3  # all different (and Dh = 4), so that no axis can stand in for another


class _Sink:
    """Where the reader's prints go during the check."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def call(model: nn.Module, fwd, x: torch.Tensor, case: Case, drill) -> tuple[torch.Tensor, object]:
    """Run forward for one case on copies of its inputs; (out, weights or None), checked."""
    x = x if case.x is None else case.x
    x_in = x.clone()
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    try:
        with contextlib.redirect_stdout(_Sink()), contextlib.redirect_stderr(_Sink()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what the reader's code prints or warns, over and over, is not shown
            value = fwd.call(model, x_in, kwargs, case.call)
    except CandidateError as exc:
        raise CandidateError(with_hints(str(exc), drill.signature)) from None
    if not torch.equal(x_in, x):
        raise CandidateError(f"{fwd.describe(case.call)} changed x in place (an in-place op such as x += ... or "
                             f"x.mul_()): forward must leave its input alone")
    S_case = x.shape[1] if case.context is None else case.context.shape[1]
    return unpack(value, fwd.describe(case.call), x, S_case, H, drill.need_weights)
