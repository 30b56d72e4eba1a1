"""The interview drill's layers: build the reader's module, find its W_q, W_k, W_v, W_o (or W_qkv, W_o), project.

The drill's checker rebuilds multi-head attention from the reader's own weights, so it finds them by
the names the drill states. Separate projections are stacked into one (3D, D) weight whose rows are
[q; k; v], the layout of a fused W_qkv, so the rest of the checker has a single code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlib._checks import fmt_shape
from attnlib.exercises._core import CandidateError, run

__all__ = ["Layers", "build", "with_hints", "find_layers", "project"]

_EXPECTED = ("linear layers named W_q, W_k, W_v, W_o (each nn.Linear(d_model, d_model)) or W_qkv, W_o "
             "(W_qkv = nn.Linear(d_model, 3 * d_model))")
_HINTS = (("before Module.__init__() call", "call super().__init__() first in __init__"),
          ("view size is not compatible", "after a transpose the tensor is not contiguous: use .reshape(...) "
                                          "or .contiguous().view(...)"),
          ("mat1 and mat2 shapes cannot be multiplied", "a Linear layer got a tensor whose last dim is not "
                                                        "its in_features: print the shapes before each W_"))


@dataclass(frozen=True)
class Layers:
    """The reader's projections, detached: `weight` (3D, D) with rows [q; k; v], `bias` (3D,) or None."""

    names: str  # "W_q, W_k, W_v, W_o" or "W_qkv, W_o", for messages
    fused: bool
    weight: torch.Tensor
    bias: torch.Tensor | None
    out_weight: torch.Tensor  # (D, D)
    out_bias: torch.Tensor | None  # (D,)


def _describe(model: nn.Module) -> str:
    """What the reader's module holds: its Linear layers, else its parameters, by name."""
    linears = [f"{name} = Linear({m.in_features} → {m.out_features})"
               for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if linears:
        return "found " + ", ".join(linears)
    params = [f"{name} {fmt_shape(p.shape)}" for name, p in model.named_parameters()]
    return ("found no nn.Linear layer, only the parameters " + ", ".join(params)) if params \
        else "found no layers and no parameters"


def _linear(model: nn.Module, name: str, d_in: int, d_out: int) -> nn.Linear:
    """model.<name>, checked to be nn.Linear(d_in, d_out); CandidateError otherwise."""
    layer = getattr(model, name)
    if not isinstance(layer, nn.Linear):
        got = (f"a tensor of shape {fmt_shape(layer.shape)}" if isinstance(layer, torch.Tensor)
               else type(layer).__name__)
        raise CandidateError(f"{name} should be nn.Linear({d_in}, {d_out}), got {got}: the checker "
                             f"rebuilds your attention from {_EXPECTED}; {_describe(model)}")
    if (layer.in_features, layer.out_features) != (d_in, d_out):
        raise CandidateError(f"{name} should be nn.Linear({d_in}, {d_out}) (d_model = {d_in} in, "
                             f"{d_out} out), got nn.Linear({layer.in_features}, {layer.out_features})")
    return layer


def _missing_names(model: nn.Module) -> CandidateError:
    """The error for a module without the drill's layer names: what was expected, what was found."""
    found = _describe(model)
    names = ("W_q", "W_k", "W_v", "W_o", "W_qkv")
    by_lower = {n.lower(): n for n in names}
    wrong_case = [(n, by_lower[n.lower()]) for n, _ in model.named_children() if n not in names and n.lower() in by_lower]
    case = (f" (names are case-sensitive: rename {wrong_case[0][0]} to {wrong_case[0][1]})" if wrong_case else "")
    return CandidateError(f"the checker expects {_EXPECTED}; {found}{case}. Rename them, so that the "
                          f"checker can rebuild your attention from your own weights")


def find_layers(model: nn.Module, d_model: int) -> Layers:
    """The reader's W_q, W_k, W_v, W_o (or W_qkv, W_o), checked and stacked; CandidateError naming the problem."""
    D = d_model
    separate = all(hasattr(model, n) for n in ("W_q", "W_k", "W_v"))
    fused = hasattr(model, "W_qkv")
    if not (separate or fused):
        raise _missing_names(model)
    names = "W_q, W_k, W_v" if separate else "W_qkv"
    if not hasattr(model, "W_o"):
        raise CandidateError(f"no output projection: found {names} but no W_o. Multi-head attention ends "
                             f"with W_o = nn.Linear(d_model, d_model), which mixes what the heads found")
    out = _linear(model, "W_o", D, D)
    if separate:
        parts = [_linear(model, n, D, D) for n in ("W_q", "W_k", "W_v")]
    else:
        parts = [_linear(model, "W_qkv", D, 3 * D)]
    with torch.no_grad():
        weight = torch.cat([p.weight for p in parts]).detach().clone()  # (3D, D)
        bias = None if all(p.bias is None for p in parts) else torch.cat(
            [p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in parts]).detach().clone()
        out_bias = None if out.bias is None else out.bias.detach().clone()
    return Layers(names + ", W_o", fused, weight, bias, out.weight.detach().clone(), out_bias)


def project(layers: Layers, x: torch.Tensor, context: torch.Tensor, num_heads: int,
            layout: str = "qkv") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q = x W_qᵀ + b_q (B, T, D); k, v from context (B, S, D). `layout` says how the 3D rows are ordered:

    "qkv": [q; k; v], each D rows (chunk(3, dim=-1), the drill's layout); "per_head": per head,
    (H, 3, Dh), i.e. [q_0; k_0; v_0; q_1; ...] (a fused W_qkv split the other way round).
    """
    D, H = layers.out_weight.shape[0], num_heads
    rows = torch.arange(3 * D)
    rows = rows.view(3, H, D // H) if layout == "qkv" else rows.view(H, 3, D // H).transpose(0, 1)
    rows = rows.reshape(3, D)  # row indices of q, k, v in the stacked weight
    bias = [None if layers.bias is None else layers.bias[r] for r in rows]
    return tuple(F.linear(src, layers.weight[r], b) for src, r, b in zip((x, context, context), rows, bias))


def build(candidate: object, D: int, H: int) -> nn.Module:
    """candidate(D, H), checked to be an nn.Module with a forward; CandidateError saying what is wrong."""
    if isinstance(candidate, nn.Module):
        raise CandidateError("pass the class itself, not an instance of it: check_...(MultiHeadAttention), "
                             "not check_...(MultiHeadAttention(...))")
    name = getattr(candidate, "__name__", "your class")
    try:
        model = run(candidate, D, H, what=f"{name}({D}, {H})")
    except CandidateError as exc:
        raise CandidateError(with_hints(str(exc))) from None
    if not isinstance(model, nn.Module):
        raise CandidateError(f"{name}({D}, {H}) gave a {type(model).__name__}, not a torch.nn.Module: "
                             f"write class {name}(nn.Module) and call super().__init__() first")
    if type(model).forward is nn.Module.forward:
        raise CandidateError(f"{name} has no forward method: is `def forward` indented inside the class?")
    return model


def with_hints(error: str, signature: str = "") -> str:
    """The reader's error, followed by what to do about the common ones."""
    hints = [h for key, h in _HINTS if key in error]
    if signature and "unexpected keyword argument" in error:
        hints.append(f"the drill's signature is {signature}")
    return "; ".join([error] + hints)
