"""Modes a reader's code may switch on and leave on, which torch or Python give no simple way to read or put
back (_state uses them): flush-denormal mode (read by a computation), inference mode entered and never left
(undone by a guard of the opposite mode, kept alive), and blanket warnings filters (put back)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

__all__ = ["flush_denormal", "restore_modes"]

_TENSOR, _MUL, _ITEM = torch.tensor, torch.mul, torch.Tensor.item  # read before any answer can replace them


def flush_denormal() -> bool:
    """Whether flush-denormal mode is on (torch has no getter): the smallest float64 denormal times 1 is 0."""
    return _ITEM(_MUL(_TENSOR([5e-324], dtype=torch.float64, device="cpu"), 1.0)) == 0

_KEPT_OFF: list = []  # inference_mode(False) guards that undo an inference mode an answer never left


def _blanket(f: tuple) -> bool:
    """A warnings filter that applies to every warning (no message, module or narrower category), or turns
    some into errors: what simplefilter('error') or simplefilter('ignore') adds, not a library's own filters."""
    return f[0] == "error" or (f[1] is None and f[2] is Warning and f[3] is None)


@contextlib.contextmanager
def restore_modes() -> Iterator[list[tuple[str, object]]]:
    """Inference mode entered and never left, and blanket warnings filters added: each undone, and named as
    (what, detail) for _state_text.modes_text."""
    inference, filters, found = torch.is_inference_mode_enabled(), list(warnings.filters), []
    try:
        yield found
    finally:
        if torch.is_inference_mode_enabled() and not inference:
            guard = torch.inference_mode(False)  # kept alive: the answer's own guard cannot be reached
            guard.__enter__()
            _KEPT_OFF.append(guard)
            found.append(("inference", None))
        added = [f for f in warnings.filters if f not in filters and _blanket(f)]
        if added:
            warnings.resetwarnings()  # public, and tells the warnings module its filters changed
            warnings.filters.extend(filters)
            found.append(("warnings", added[0][0]))
