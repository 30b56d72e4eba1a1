"""The interview drill's probes: what the reader's weights do to the output.

`find` nudges each nn.Linear's weight and watches the output of forward(x): a layer whose nudge changes
nothing is unused; a (D, D) layer whose row i changes only feature i of the output is the output
projection; the others are the input projections, however forward reaches them (layer(x),
layer.forward(x), x @ W.T, F.linear on weights concatenated at run time, on x reshaped or transposed).
A slice of their rows that the output depends on linearly is a value slice. `gradients` checks that
backward reaches every projection and x as it reaches them in the reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from attnlib.exercises._core import CandidateError, matching

__all__ = ["Found", "find", "gradients", "differs"]

Output = Callable[[], torch.Tensor]  # the reader's forward(x), its output (B, T, D)


@dataclass(frozen=True)
class Found:
    """What the weights do: the projections of x (registration order), the output projection, the rest."""

    all: list[tuple[str, nn.Linear]]  # every nn.Linear of the module, as it registers them
    inputs: list[tuple[str, nn.Linear]]
    out: tuple[str, nn.Linear] | None
    unused: list[tuple[str, nn.Linear]]
    extra: list[str]  # parameters outside the projections that change the output (a LayerNorm inside, ...)
    values: frozenset[int] | None  # the slices (Dh rows of the stacked inputs) the output is linear in


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| where it exceeds float32 noise, else 0 (a NaN counts as a difference)."""
    d = (a.detach().double() - b.detach().double()).abs().nan_to_num(1.0)
    return d * (d > 1e-5 * (1 + b.detach().abs().max().double()))


@contextlib.contextmanager
def _nudged(p: torch.Tensor, rows: slice = slice(None), times: float = 1.0) -> Iterator[None]:
    """p[rows] plus a fixed random nudge the size of p's own entries, put back afterwards."""
    saved = p.detach().clone()
    noise = torch.randn(p[rows].shape, generator=torch.Generator().manual_seed(7), dtype=p.dtype)
    with torch.no_grad():
        p[rows] += times * noise * (float(saved.std()) if saved.numel() > 1 and saved.std() > 0 else 0.1)
    try:
        yield
    finally:
        with torch.no_grad():
            p.copy_(saved)


def _effect(output: Output, base: torch.Tensor, p: torch.Tensor, rows: slice = slice(None), times=1.0):
    with _nudged(p, rows, times):
        return differs(output(), base)


def find(model: nn.Module, output: Output, D: int, H: int) -> Found:
    """Which layers forward uses, and how, from the effect of each weight on the output of forward(x)."""
    base = output().detach()
    linears = list({id(m): (n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)}.values())
    used = [(n, m) for n, m in linears if _effect(output, base, m.weight).any()]
    outs = [(n, m) for n, m in used if (m.in_features, m.out_features) == (D, D)
            and (lambda d: bool(d[..., 0].any()) and not d[..., 1:].any())(_effect(output, base, m.weight, slice(0, 1)))]
    out = outs[-1] if outs else None
    inputs = [(n, m) for n, m in used if out is None or m is not out[1]]
    owned = {id(p) for _, m in linears for p in m.parameters()}
    extra = [n for n, p in model.named_parameters() if id(p) not in owned and _effect(output, base, p).any()]
    return Found(linears, inputs, out, [(n, m) for n, m in linears if (n, m) not in used], extra,
                 _values(inputs, output, base, D // H) if out is not None else None)


def _values(inputs: list[tuple[str, nn.Linear]], output: Output, base: torch.Tensor, Dh: int) -> frozenset[int] | None:
    """The slices of Dh rows (stacked in registration order) that the output depends on linearly."""
    if any(m.out_features % Dh for _, m in inputs):
        return None
    found, u = set(), 0
    for _, m in inputs:
        for start in range(0, m.out_features, Dh):
            rows = slice(start, start + Dh)
            with _nudged(m.weight, rows):
                one = output().detach().double() - base.double()
            with _nudged(m.weight, rows, 2.0):
                two = output().detach().double() - base.double()
            size = float(one.abs().max())
            if size > 1e-5 and float((two - 2 * one).abs().max()) <= 1e-3 * size:
                found.add(u)
            u += 1
    return frozenset(found)


def gradients(layers, output: torch.Tensor, reference: torch.Tensor, x: torch.Tensor) -> None:
    """CandidateError unless backward from the reader's output reaches every projection's weight, and x (a
    leaf that requires grad), as it reaches them from the reference (rebuilt on the same parameters)."""
    params = list(zip(layers.part_names, (m.weight for m in layers.parts)))
    params.append((layers.names["o"], layers.out.weight))
    r = torch.randn(output.shape, generator=torch.Generator().manual_seed(3))
    try:
        got = torch.autograd.grad((output * r).sum(), [p for _, p in params] + [x], allow_unused=True)
    except RuntimeError as exc:
        raise CandidateError(f"backward through forward(x) raised RuntimeError: {exc}") from None
    want = torch.autograd.grad((reference * r).sum(), [p for _, p in params] + [x], allow_unused=True)
    if got[-1] is None or not got[-1].any():
        raise CandidateError("the output is right, but x gets no gradient from it: forward cuts its input from "
                             "autograd (x.detach(), x.data, numpy, or torch.no_grad() around the projections), so "
                             "the layers before attention would never learn")
    dead = [n for (n, _), g, w in zip(params, got, want) if (g is None or not g.any()) and w is not None and w.any()]
    if dead:
        raise CandidateError(f"the output is right, but {', '.join(f'`{n}`' for n in dead)} get{'s' if len(dead) == 1 else ''} "
                             f"no gradient from it: backward never reaches {'it' if len(dead) == 1 else 'them'} "
                             f"(torch.no_grad(), .detach(), .data or numpy on the way), so training would never "
                             f"update {'it' if len(dead) == 1 else 'them'}")
    off = [n for (n, _), g, w in zip(params + [("x", x)], got, want) if w is not None
           and not matching(g, {"": w}, atol=1e-4)]
    if off:
        raise CandidateError(f"the output is right, but the gradient of {', '.join(f'`{n}`' for n in off)} differs "
                             f"from the reference's: part of its path is cut from autograd (.detach() or .data)")
