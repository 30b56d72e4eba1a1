"""The interview drill's calls: build the reader's class and call its forward the way it was written.

Constructors: `(d_model, num_heads)` positionally, or by name when the parameters use the common names
(`embed_dim`, `n_heads`, `h`, ... in any order, as the Annotated Transformer's `(h, d_model)`).
forward: `forward(x, mask=None)` or `forward(q, k, v, mask=None)` (given x three times); the mask goes to
a parameter named mask, attn_mask or attention_mask (else to the positional slot after the inputs).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

import torch
from torch import nn

from attnlib.exercises._core import CandidateError, run

__all__ = ["build", "Forward", "with_hints"]

D_NAMES = ("d_model", "embed_dim", "hidden_size", "dim", "n_embd", "model_dim", "d_embed")
H_NAMES = ("num_heads", "n_heads", "nhead", "h", "n_head", "heads", "num_attention_heads")
MASK_NAMES = ("mask", "attn_mask", "attention_mask")
_HINTS = (("before Module.__init__() call", "call super().__init__() first in __init__"),
          ("view size is not compatible", "after a transpose the tensor is not contiguous: use .reshape(...) "
                                          "or .contiguous().view(...)"),
          ("mat1 and mat2 shapes cannot be multiplied", "a Linear layer got a tensor whose last dim is not "
                                                        "its in_features: print the shapes before each projection"))
_CLASS = "class MultiHeadAttention(nn.Module) whose __init__(self, d_model, num_heads) creates the layers once"


def with_hints(error: str, signature: str = "") -> str:
    """The reader's error, followed by what to do about the common ones."""
    hints = [h for key, h in _HINTS if key in error]
    if signature and "unexpected keyword argument" in error:
        hints.append(f"the drill's signature is {signature}")
    return "; ".join([error] + hints)


def _builds_linear(fn: object) -> bool:
    """Whether the source of fn calls nn.Linear (or Linear) itself."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "Linear"
               for n in ast.walk(tree))


def _function(fn: object, name: str, D: int, H: int) -> nn.Module:
    """A function: a factory that returns the module is fine; anything else is told the drill wants a class."""
    if _builds_linear(fn):
        raise CandidateError(f"`{name}` is a function, and the drill asks for an nn.Module class: {_CLASS}. Your "
                             f"function builds its own nn.Linear layers inside, so its weights are new random ones "
                             f"on every call: the same x gives a different output each time, and no optimizer "
                             f"could ever train them")
    try:
        made = run(fn, D, H, what=f"{name}({D}, {H})")
    except CandidateError:
        made = None
    if isinstance(made, nn.Module):
        return made
    got = "" if made is None else f" (called as {name}({D}, {H}) it gave a {type(made).__name__})"
    raise CandidateError(f"`{name}` is a function{got}; the drill asks for an nn.Module class: {_CLASS}, "
                         f"and forward(self, x, mask=None)")


def _arguments(cls: type, name: str, D: int, H: int) -> tuple[tuple, dict]:
    """How to call cls with d_model = D, num_heads = H: by name when its parameters use the common names."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return (D, H), {}
    d = next((p.name for p in params if p.name in D_NAMES), None)
    h = next((p.name for p in params if p.name in H_NAMES), None)
    tries = ([((), {d: D, h: H})] if d and h else []) + [((D, H), {})]
    for args, kwargs in tries:
        try:
            inspect.signature(cls).bind(*args, **kwargs)
            return args, kwargs
        except TypeError:
            continue
    needed = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
              and p.name not in (d, h)]
    raise CandidateError(f"{name}{inspect.signature(cls)} cannot be built as {name}(d_model, num_heads) = "
                         f"{name}({D}, {H})" + (f": it also needs {', '.join(needed)}" if needed else "")
                         + ". Give every other argument a default")


def build(candidate: object, D: int, H: int) -> nn.Module:
    """The reader's module with d_model = D, num_heads = H; CandidateError saying what is wrong."""
    if isinstance(candidate, nn.Module):
        raise CandidateError("pass the class itself, not an instance of it: check_...(MultiHeadAttention), "
                             "not check_...(MultiHeadAttention(...))")
    name = getattr(candidate, "__name__", "your class")
    if callable(candidate) and not inspect.isclass(candidate):
        model = _function(candidate, name, D, H)
    else:
        args, kwargs = _arguments(candidate, name, D, H) if inspect.isclass(candidate) else ((D, H), {})
        shown = ", ".join([str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()])
        try:
            model = run(candidate, *args, what=f"{name}({shown})", **kwargs)
        except CandidateError as exc:
            raise CandidateError(with_hints(str(exc))) from None
        if not isinstance(model, nn.Module):
            raise CandidateError(f"{name}({shown}) gave a {type(model).__name__}, not a torch.nn.Module: "
                                 f"write class {name}(nn.Module) and call super().__init__() first")
    if type(model).forward is nn.Module.forward:
        raise CandidateError(f"{name} has no forward method: is `def forward` indented inside the class?")
    return model


@dataclass(frozen=True)
class Forward:
    """How the reader's forward takes its inputs: x once, or (q, k, v); where the mask goes."""

    inputs: int  # 1: forward(x, ...); 3: forward(q, k, v, ...)
    mask: str | int | None  # the mask's keyword, its positional index, or None (passed as mask=)
    mask_required: bool

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
        if named is None and len(positional) > inputs:
            named = positional[inputs]
            return cls(inputs, inputs, named.default is named.empty)
        return cls(inputs, None if named is None else named.name, named is not None and named.default is named.empty)

    def call(self, model: nn.Module, x: torch.Tensor, kwargs: dict, what: str) -> object:
        """model's forward on x with the drill's keyword arguments (mask, context, is_causal)."""
        kwargs = dict(kwargs)
        context = kwargs.pop("context", None) if self.inputs == 3 else None
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
        return call.replace("mask=mask", f"{self.mask}=mask") if isinstance(self.mask, str) else call
