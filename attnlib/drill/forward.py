"""The interview drill's calls of the reader's forward, the way it was written.

`forward(x, mask=None)` or `forward(q, k, v, mask=None)` (given x three times); the mask goes to a parameter
named mask, attn_mask or attention_mask (else to the positional slot after the inputs); a cross-attention's
context to one named context, encoder_hidden_states, memory, ... (else to x's first neighbour).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from attnlib.exercises._core import run

__all__ = ["Forward", "MASK_NAMES", "CONTEXT_NAMES"]

MASK_NAMES = ("mask", "attn_mask", "attention_mask")
CONTEXT_NAMES = ("context", "encoder_hidden_states", "memory", "key_value_states", "encoder_output", "enc_out", "kv",
                 "xa", "y", "source", "src", "cross")


@dataclass(frozen=True)
class Forward:
    """How the reader's forward takes its inputs: x once, or (q, k, v); where the mask goes."""

    inputs: int  # 1: forward(x, ...); 3: forward(q, k, v, ...)
    mask: str | int | None  # the mask's keyword, its positional index, or None (passed as mask=)
    mask_required: bool
    context: str = "context"  # the keyword cross-attention's context goes to (x's first neighbour if unnamed)

    @classmethod
    def of(cls, model: nn.Module) -> Forward:
        try:
            params = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError):
            return cls(1, None, False)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        named = next((p for p in params if p.name in MASK_NAMES), None)
        before = positional[:positional.index(named)] if named in positional else positional
        inputs = 3 if len([p for p in before if p.default is p.empty]) >= 3 else 1
        others = [p.name for p in positional[1:] if p is not named and p.name not in MASK_NAMES]
        context = next((p.name for p in params if p.name in CONTEXT_NAMES), others[0] if others else "context")
        if named is None and len(positional) > inputs:
            named = positional[inputs]
            return cls(inputs, inputs, named.default is named.empty, context)
        return cls(inputs, None if named is None else named.name, named is not None and named.default is named.empty,
                   context)

    def call(self, model: nn.Module, x: torch.Tensor, kwargs: dict, what: str) -> object:
        """model's forward on x with the drill's keyword arguments (mask, context, is_causal)."""
        kwargs = dict(kwargs)
        context = kwargs.pop("context", None) if self.inputs == 3 else None
        if "context" in kwargs:
            kwargs[self.context] = kwargs.pop("context")
        args = [x] if self.inputs == 1 else [x, x if context is None else context, x if context is None else context]
        mask = kwargs.pop("mask", None)
        if isinstance(self.mask, int):
            args += [mask] if mask is not None or self.mask_required or kwargs else []
        elif mask is not None or self.mask_required:
            kwargs[self.mask or "mask"] = mask
        return run(model, *args, what=self.describe(what), **kwargs)

    def describe(self, call: str) -> str:
        """The drill's call, e.g. 'forward(x, mask=mask)', as this forward receives it."""
        if self.inputs == 3:
            call = (call.replace("forward(x, context=context", "forward(x, context, context")
                    if "context=context" in call else call.replace("forward(x", "forward(x, x, x"))
        call = call.replace("context=context", f"{self.context}=context")
        return call.replace("mask=mask", f"{self.mask}=mask") if isinstance(self.mask, str) else call
