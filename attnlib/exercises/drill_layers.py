"""The interview drill's layers: the reader's projections, found by what they do, never by their names.

A forward hook on every nn.Linear records which layers the reader's forward applies to x (the input
projections) and which it applies to anything else (the output projection). The input projections,
whatever their names, nesting (ModuleList, ModuleDict, submodules) and number (three separate, one fused,
or any split adding up to 3 * d_model), are stacked in call order into one (3D, D) weight. Which of its
rows are q, k and v is a *layout*: blocks [q | k | v] in any order, or per head (H, 3, Dh) as GPT-NeoX
and Megatron store a fused projection. `layouts` lists the candidates; drill_roles tries them against
the reader's output.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlib._checks import fmt_shape
from attnlib.exercises._core import CandidateError

__all__ = ["Layers", "Traced", "trace", "layouts", "project", "describe_model"]

ROLES = ("q", "k", "v")


@dataclass(frozen=True)
class Layers:
    """The reader's projections, detached: `weight` (3D, D) with rows [q; k; v], `bias` (3D,) or None."""

    names: dict[str, str]  # role ("q", "k", "v", "o") -> the reader's layer name, e.g. "q_proj" or "c_attn"
    layout: str  # in words, e.g. "fused, laid out per head (H, 3, Dh)"
    weight: torch.Tensor
    bias: torch.Tensor | None
    out_weight: torch.Tensor  # (D, D)
    out_bias: torch.Tensor | None  # (D,)
    fused: bool = False

    @property
    def described(self) -> str:
        """'`q_proj`, `k_proj`, `v_proj`, `o_proj`' or '`c_attn` (fused, laid out [q | k | v]) and `c_proj`'."""
        inputs = list(dict.fromkeys(self.names[r] for r in ROLES))
        head = ", ".join(f"`{n}`" for n in inputs) + (f" ({self.layout})" if self.fused else "")
        return f"{head} and `{self.names['o']}`"


@dataclass(frozen=True)
class Traced:
    """What one forward(x) did: the Linear layers applied to x, in call order, and the output projection."""

    inputs: list[tuple[str, nn.Linear]]
    out: tuple[str, nn.Linear] | None  # the last Linear(D, D) applied to something other than x
    unused: list[tuple[str, nn.Linear]]  # Linear layers forward never applied
    error: CandidateError | None  # what forward raised, if it did


def describe_model(model: nn.Module) -> str:
    """What the reader's module holds: its Linear layers, else its parameters, by name."""
    linears = [f"{name} = Linear({m.in_features} → {m.out_features})"
               for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if linears:
        return "found " + ", ".join(linears)
    params = [f"{name} {fmt_shape(p.shape)}" for name, p in model.named_parameters()]
    return ("found no nn.Linear layer, only the parameters " + ", ".join(params)) if params \
        else "found no layers and no parameters"


def trace(model: nn.Module, x: torch.Tensor, call: Callable[[], object]) -> Traced:
    """Run `call` (the reader's forward on x) with a hook on every nn.Linear; what it applied to what."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    seen: list[tuple[str, nn.Linear, bool]] = []  # (name, layer, applied to x?)

    def hook(name: str) -> Callable:
        def record(layer: nn.Linear, args: tuple, output: object) -> None:
            arg = args[0] if args else None
            on_x = isinstance(arg, torch.Tensor) and arg.shape == x.shape and torch.equal(arg, x)
            seen.append((name, layer, on_x))
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in linears]
    error = None
    try:
        call()
    except CandidateError as exc:
        error = exc
    finally:
        for h in handles:
            h.remove()
    inputs = list({id(m): (n, m) for n, m, on_x in seen if on_x}.values())
    D = x.shape[-1]
    outs = [(n, m) for n, m, on_x in seen if not on_x and (m.in_features, m.out_features) == (D, D)]
    used = {id(m) for _, m, _ in seen}
    return Traced(inputs, outs[-1] if outs else None, [(n, m) for n, m in linears if id(m) not in used], error)


def _shape_problem(traced: Traced, model: nn.Module, D: int) -> str | None:
    """Why the Linear layers applied to x cannot be q, k, v projections; None if they can."""
    found = describe_model(model)
    for name, m in traced.inputs:
        if m.in_features != D or m.out_features % D:
            return (f"`{name}` = nn.Linear({m.in_features}, {m.out_features}) is applied to x, but a projection "
                    f"of x maps d_model = {D} features to d_model = {D} (q, k or v) or 3 * d_model = {3 * D} "
                    f"(fused); {found}")
    total = sum(m.out_features for _, m in traced.inputs)
    if total != 3 * D and (traced.error is None or not any(isinstance(m, nn.Linear) for m in model.modules())):
        got = ", ".join(f"`{n}` ({m.out_features})" for n, m in traced.inputs) or "none"
        return (f"the checker finds q, k and v as the nn.Linear layers your forward applies to x, and their "
                f"outputs should add up to 3 * d_model = {3 * D} features; applied to x: {got}; {found}")
    return None


def layouts(traced: Traced, model: nn.Module, D: int, H: int) -> list[Layers]:
    """Every way the input projections can be q, k, v (call order first); CandidateError if none can."""
    problem = _shape_problem(traced, model, D)
    if problem:
        raise CandidateError(problem)
    if traced.error is not None:
        raise traced.error
    names = [n for n, _ in traced.inputs]
    out = traced.out or next(((n, m) for n, m in traced.unused if (m.in_features, m.out_features) == (D, D)), None)
    if out is None:
        raise CandidateError(f"no output projection: found {', '.join(f'`{n}`' for n in names)} applied to x, "
                             f"but no other nn.Linear(d_model, d_model). Multi-head attention ends with an output "
                             f"projection nn.Linear(d_model, d_model), which mixes what the heads found")
    with torch.no_grad():
        parts = [m for _, m in traced.inputs]
        weight = torch.cat([p.weight for p in parts]).detach().clone()  # (3D, D), in call order
        bias = None if all(p.bias is None for p in parts) else torch.cat(
            [p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in parts]).detach().clone()
        out_bias = None if out[1].bias is None else out[1].bias.detach().clone()
    owner = [n for n, m in traced.inputs for _ in range(m.out_features // D)]  # the layer of each D-row block
    fused = len(parts) < 3
    options = []
    for perm in itertools.permutations(range(3)):  # perm[i] = the block (or per-head slot) of role i
        styles = [("blocks", "laid out [q | k | v]" if perm == (0, 1, 2) else
                   "laid out [" + " | ".join("qkv"[perm.index(b)] for b in range(3)) + "]")]
        if len(parts) == 1:
            styles.append(("per_head", "laid out per head (H, 3, Dh), as GPT-NeoX stores it"))
        for style, words in styles:
            rows = _rows(style, perm, D, H)
            roles = {r: owner[perm[i]] for i, r in enumerate(ROLES)} | {"o": out[0]}
            options.append(Layers(roles, f"fused, {words}" if fused else "separate projections", weight[rows],
                                  None if bias is None else bias[rows], out[1].weight.detach().clone(), out_bias,
                                  fused))
    return options


def _rows(style: str, perm: tuple[int, ...], D: int, H: int) -> torch.Tensor:
    """Row indices (3D,) of the stacked weight that give [q; k; v] for this layout."""
    idx = torch.arange(3 * D)
    grid = idx.view(3, D) if style == "blocks" else idx.view(H, 3, D // H).transpose(0, 1).reshape(3, D)
    return grid[list(perm)].reshape(-1)


def project(layers: Layers, x: torch.Tensor, context: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q = x W_qᵀ + b_q (B, T, D); k, v from context (B, S, D); the rows of layers.weight are [q; k; v]."""
    D = layers.out_weight.shape[0]
    w, b = layers.weight.split(D), (None,) * 3 if layers.bias is None else layers.bias.split(D)
    return tuple(F.linear(src, wi, bi) for src, wi, bi in zip((x, context, context), w, b))
