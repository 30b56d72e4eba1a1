"""The interview drill's construction of the reader's module, the way its constructor was written
(forward.Forward calls its forward the way that was written).

Constructors: `(d_model, num_heads)` positionally, or by name when the parameters use the common names
(`embed_dim`, `n_heads`, `h`, `emb_dim`, ... in any order, as the Annotated Transformer's `(h, d_model)`);
a constructor whose unknown names take the two the other way round, `(n_heads, width)`, is seen to build
layers of the wrong width and is built as `(num_heads, d_model)`, and the verdict says so.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from attnlib.exercises._core import CandidateError, run

__all__ = ["build", "Maker", "with_hints"]

D_NAMES = ("d_model", "embed_dim", "hidden_size", "dim", "n_embd", "model_dim", "d_embed", "emb_dim", "embedding_dim",
           "embed_size", "emb_size", "hidden_dim", "n_embed", "dim_model", "qkv_features", "num_hiddens", "model_size")
H_NAMES = ("num_heads", "n_heads", "nhead", "h", "n_head", "heads", "num_attention_heads", "num_head", "nheads",
           "head_num", "attention_heads", "n_heads_q")
_HINTS = (("before Module.__init__() call", "call super().__init__() first in __init__"),
          ("view size is not compatible", "after a transpose the tensor is not contiguous: use .reshape(...) "
                                          "or .contiguous().view(...)"),
          ("mat1 and mat2 shapes cannot be multiplied", "a Linear layer got a tensor whose last dim is not "
                                                        "its in_features: print the shapes before each projection"),
          ("batch2 tensor", "print the shapes before each matmul: the scores are q @ k.transpose(-2, -1), "
                            "(B, H, T, Dh) @ (B, H, Dh, S)"))
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
                             f"function builds its own nn.Linear layers inside, so its parameters are new random ones "
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


@dataclass(frozen=True)
class Maker:
    """How the reader's module is built: `make()` builds one more (the checker builds two alike), `shown`
    is the call in words, `note` what the verdict should say about it ('' when nothing)."""

    make: Callable[[], nn.Module]
    shown: str
    note: str = ""


def _widths(model: object) -> set[int]:
    return {m.in_features for m in model.modules() if isinstance(m, nn.Linear)} if isinstance(model, nn.Module) else set()


def _class(cls: type, name: str, D: int, H: int) -> tuple[nn.Module, Maker]:
    args, kwargs = _arguments(cls, name, D, H)
    shown = f"{name}({', '.join([str(a) for a in args] + [f'{k}={v}' for k, v in kwargs.items()])})"
    maker = Maker(lambda: run(cls, *args, what=shown, **kwargs), shown)
    try:
        model, error = maker.make(), None
    except CandidateError as exc:
        model, error = None, exc
    if args == (D, H) and (error is not None or (D not in _widths(model) and H in _widths(model))):
        swapped = Maker(lambda: run(cls, H, D, what=f"{name}({H}, {D})"), f"{name}({H}, {D})",
                        f"; built as {name}({H}, {D}), since its parameters take (num_heads, d_model): the drill's "
                        f"constructor is (d_model, num_heads), so name them, or put d_model first")
        try:
            other = swapped.make()
        except CandidateError:
            other = None
        if D in _widths(other):
            return other, swapped
    if error is not None:
        raise CandidateError(with_hints(str(error))) from None
    return model, maker


def build(candidate: object, D: int, H: int) -> tuple[nn.Module, Maker]:
    """The reader's module with d_model = D, num_heads = H, and how to build another; CandidateError if none."""
    if isinstance(candidate, nn.Module):
        raise CandidateError("pass the class itself, not an instance of it: check_...(MultiHeadAttention), "
                             "not check_...(MultiHeadAttention(...))")
    name = getattr(candidate, "__name__", "your class")
    if callable(candidate) and not inspect.isclass(candidate):
        model = _function(candidate, name, D, H)
        maker = Maker(lambda: run(candidate, D, H, what=f"{name}({D}, {H})"), f"{name}({D}, {H})")
    elif inspect.isclass(candidate):
        model, maker = _class(candidate, name, D, H)
    else:
        model, maker = run(candidate, D, H, what=name), None  # not callable: run says so
    if not isinstance(model, nn.Module):
        raise CandidateError(f"{maker.shown} gave a {type(model).__name__}, not a torch.nn.Module: "
                             f"write class {name}(nn.Module) and call super().__init__() first")
    if type(model).forward is nn.Module.forward:
        raise CandidateError(f"{name} has no forward method: is `def forward` indented inside the class?")
    return model, maker
