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


def _quiet_call(model: nn.Module, fwd, x: torch.Tensor, kwargs: dict, case: Case):
    with contextlib.redirect_stdout(_Sink()), contextlib.redirect_stderr(_Sink()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the reader's code prints or warns, over and over, is not shown
        return fwd.call(model, x, kwargs, case.call)


def _fed(model: nn.Module, fwd, x: torch.Tensor, kwargs: dict, case: Case) -> str:
    """For a cross-attention call that failed: which layers were given x and which the context, seen by
    forward hooks on the nn.Linear layers in a second run ('' unless a layer other than the first read x
    while another read the context)."""
    T, S, fed = x.shape[1], case.context.shape[1], {}

    def hook(name: str):
        def seen(module: nn.Module, inputs: tuple, output: object) -> None:  # None: the output is left as it is
            fed.setdefault(name, inputs[0].shape[-2] if inputs and getattr(inputs[0], "dim", int)() > 1 else 0)
        return seen

    hooks = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        _quiet_call(model, fwd, x.clone(), {k: v.clone() if isinstance(v, torch.Tensor) else v
                                            for k, v in kwargs.items()}, case)
    except CandidateError:
        pass
    finally:
        for h in hooks:
            h.remove()
    on_x, on_c = [n for n, t in fed.items() if t == T], [n for n, t in fed.items() if t == S]
    if len(on_x) < 2 or not on_c:
        return ""
    return (f". Your layers {', '.join(f'`{n}`' for n in on_x)} were applied to x (T = {T} positions) and "
            f"{', '.join(f'`{n}`' for n in on_c)} to context (S = {S}): in cross-attention only the queries come "
            f"from x; the keys and the values both come from context")


def call(model: nn.Module, fwd, x: torch.Tensor, case: Case, drill) -> tuple[torch.Tensor, object]:
    """Run forward for one case on copies of its inputs; (out, weights or None), checked."""
    x = x if case.x is None else case.x
    x_in = x.clone()
    kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.kwargs.items()}
    try:
        value = _quiet_call(model, fwd, x_in, kwargs, case)
    except CandidateError as exc:
        fed = _fed(model, fwd, x, case.kwargs, case) if case.context is not None else ""
        raise CandidateError(with_hints(str(exc), drill.signature) + fed) from None
    if not torch.equal(x_in, x):
        raise CandidateError(f"{fwd.describe(case.call)} changed x in place (an in-place op such as x += ... or "
                             f"x.mul_()): forward must leave its input alone")
    S_case = x.shape[1] if case.context is None else case.context.shape[1]
    return unpack(value, fwd.describe(case.call), x, S_case, H, drill.need_weights)
