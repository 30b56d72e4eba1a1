"""The interview drill's calls and diagnoses: run the reader's forward, and say why its output is wrong.

`call` runs forward on one case (on copies of the inputs, with what it prints or warns hidden).
`diagnose` names the mistake: a layer never used, the error a call raised, the known mistakes (one, or
two at once) that reproduce every output, a scale fitted to the output, and otherwise what differs
(the row sums of the attention weights, which positions, heads or sequences, by how much).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings

import torch
from torch import nn

from attnlib._checks import fmt_shape
from attnlib.drill.build import with_hints
from attnlib.drill.differ import differences
from attnlib.drill.layers import ROLES, Layers
from attnlib.drill.mistakes import describe
from attnlib.drill.output import unpack
from attnlib.drill.roles import names_note
from attnlib.drill.slips import fused_note, order_dependence, slip_of
from attnlib.drill.variants import Case, Variant, explain, reproduces, simulate
from attnlib.exercises._core import CandidateError, matching

__all__ = ["call", "diagnose", "B", "T", "S", "D", "H"]

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


def _reused(missing, options: list[Layers], x, got) -> str | None:
    """'`W_v` is never used: ...' when a layer serving two roles reproduces every output, else None."""
    stand = next((o for o in options if o.layout == "a layer reused for two roles" and reproduces(o, H, x, got)), None)
    if stand is None:
        return None
    words = {"q": "the queries", "k": "the keys", "v": "the values"}
    first = [stand.units[i * H] for i in range(3)]  # the first slice of each role: equal when the rows are shared
    twice = [r for i, r in enumerate(ROLES) if first.count(first[i]) > 1]
    names = " and ".join(f"`{n}`" for n, _ in missing)
    return (f"{names} {'is' if len(missing) == 1 else 'are'} never used: nudging its parameters does not change the "
            f"output, and forward computes {' and '.join(words[r] for r in twice)} with the same rows of "
            f"`{stand.names[twice[0]]}` (a layer reused for two roles, as when a line is copied and not edited). q, k "
            f"and v each need their own projection")


def _mask_hint(model, fwd, drill, layers: Layers, x, case: Case) -> str:
    """For a call with a mask that failed: whether the same mask as (B, T, T) works, and the mask's shape."""
    if case.mask is not None and case.mask.dim() == 4 and case.mask.shape[1] == 1:
        squeezed = dataclasses.replace(case, kwargs={**case.kwargs, "mask": case.mask.squeeze(1)})
        try:
            out = call(model, fwd, x, squeezed, drill)[0].detach()
        except CandidateError:
            out = None
        if out is not None and reproduces(layers, H, x, [(case, out)]):
            return (". Given the same mask as (B, T, T), your forward is right: the drill's masks already "
                    "broadcast over the heads, (B, 1, T, T) or (T, T), so do not add a head axis")
    return (f". The checker passes mask as a bool tensor of shape {fmt_shape(case.mask.shape)}, True = may attend: "
            f"let it broadcast against the scores (B, H, T, T)" if case.mask is not None else "")


def _fitted_scale(layers: Layers, x, case: Case, out: torch.Tensor) -> float | None:
    """The factor on Q Kᵀ that reproduces out, if one does (found on a log grid, then refined)."""
    err = lambda c: float((simulate(layers, H, x, case, Variant(scale=c))[0][0] - out).abs().max())  # noqa: E731
    best = min((10 ** (k / 20) for k in range(-80, 41)), key=err)
    lo, hi = best / 10 ** 0.05, best * 10 ** 0.05
    for _ in range(40):  # golden-section search on [lo, hi]
        a, b = hi - (hi - lo) / 1.618, lo + (hi - lo) / 1.618
        lo, hi = (lo, b) if err(a) < err(b) else (a, hi)
    c = (lo + hi) / 2
    return c if matching(out, {"": simulate(layers, H, x, case, Variant(scale=c))[0][0]}, atol=1e-4) else None


def _merged(layers: Layers, out: torch.Tensor) -> torch.Tensor:
    """The merged heads (B, T, D) that W_o maps to `out` (W_o undone); RuntimeError if it cannot be."""
    w_o, b_o = layers.out_params()
    return torch.linalg.solve(w_o.double(), (out.double() - (0 if b_o is None else b_o.double())).mT).mT


def _row_sums(model, fwd, drill, layers: Layers, x, case: Case, out: torch.Tensor) -> str | None:
    """Whether each query's attention weights sum to 1, seen from outside: adding 1 to every value vector
    (the value bias) must add 1 to every merged feature; a row summing to r adds r."""
    starts, rows = [0], layers.rows[2 * D:].tolist()  # the value rows, in the stacked input rows
    for m in layers.parts:
        starts.append(starts[-1] + m.out_features)
    where = [(i, r - starts[i]) for r in rows for i in range(len(layers.parts)) if starts[i] <= r < starts[i + 1]]
    if any(layers.parts[i].bias is None for i, _ in where):
        return None
    with torch.no_grad():
        for i, r in where:
            layers.parts[i].bias[r] += 1.0
    try:
        shifted = call(model, fwd, x, case, drill)[0].detach()
        sums = (_merged(layers, shifted) - _merged(layers, out)).unflatten(-1, (H, -1)).mean(-1)  # (B, T, H)
    except (CandidateError, RuntimeError):
        return None
    finally:
        with torch.no_grad():
            for i, r in where:
                layers.parts[i].bias[r] -= 1.0
    if bool(((sums - 1).abs() < 1e-4).all()):
        return None
    if bool(((sums - 1).abs() < 1e-2).all()):
        return (f"each query's attention weights sum to {float(sums.min()):.4g} to {float(sums.max()):.4g}, not "
                f"exactly 1: a softmax in low precision (bfloat16 or float16), or an epsilon in a normalisation of "
                f"your own?")
    return (f"each query's attention weights should sum to 1, and yours sum to {float(sums.min()):.3g} to "
            f"{float(sums.max()):.3g} (adding 1 to every value vector adds that much to the output of each head): a "
            f"softmax over the wrong axis, a mask applied after it, or a normalisation of your own?")


def _facts(model, fwd, drill, layers: Layers, found, x, case: Case, out: torch.Tensor) -> list[str]:
    """What differs between out and the reference on `case`, in the merged heads when W_o can be undone."""
    want = simulate(layers, H, x, case, Variant(w_o=False))[0][0]  # (B, T, D): the merged heads
    ref, b_o = simulate(layers, H, x, case)[0][0], layers.out_params()[1]
    factor = float((out.double() * ref).sum() / (ref.double() * ref).sum().clamp_min(1e-30))
    if matching(out, {"": factor * ref}):
        return [f"it is the reference's output times {factor:.4g}"]
    offset = (out.double() - ref.double()).flatten(0, 1)
    if b_o is not None and matching(offset, {"": offset[:1].expand_as(offset)}):
        times = float(offset[0] @ b_o.double() / (b_o.double() @ b_o.double()).clamp_min(1e-30))
        if matching(offset[0], {"": times * b_o}):
            return [f"it is the reference plus {times:.3g} × `{layers.names['o']}`'s bias at every position: the output "
                    f"projection's bias is added {times + 1:.3g} times"]
    try:
        facts = differences(_merged(layers, out).unflatten(-1, (H, -1)), want.unflatten(-1, (H, -1)),
                            ("sequence", "position", "head", "feature"))
    except RuntimeError:
        facts = differences(out, ref, ("sequence", "position", "feature"))
    sums = _row_sums(model, fwd, drill, layers, x, case, out)
    facts[:0] = [sums] if sums else []
    nudged = x.clone()
    nudged[1] += 1.0
    try:
        other = call(model, fwd, x, dataclasses.replace(case, x=nudged if case.x is None else case.x + (nudged - x)),
                     drill)[0].detach()
        if not matching(other[0], {"": out[0]}):
            facts.insert(0, "the output of sequence 0 changes when only sequence 1 does: something in forward mixes "
                            "the sequences of the batch")
    except CandidateError:
        pass
    if found.extra:
        facts.insert(0, f"{', '.join(f'`{n}`' for n in found.extra)} take part in the output, but the drill's module "
                        f"is attention alone (a LayerNorm, a residual or a parameter of your own belongs to the block)")
    return facts


def _explained(model, fwd, drill, options: list[Layers], found, x, got, wrong: list[Case]) -> str:
    first, calls = wrong[0], [case for case, _ in got]
    right = [case for case in calls[:calls.index(first)] if case not in wrong]
    head = (f"{fwd.describe(right[-1].call)} is right, but {fwd.describe(first.call)} is wrong" if right
            else f"{fwd.describe(first.call)} is wrong")
    upto = [(case, o) for case, o in got if case is first or case in right]
    for option, sizes, outputs, later in [(o, (1,), got, "") for o in options[:3]] + [(options[0], (2,), got, "")] + [
            (o, (1,), upto, " (the later calls differ in other ways too)") for o in options[:3]]:
        combos = explain(option, H, x, outputs, sizes)
        if combos:
            kind = "a known mistake" if len(combos[0]) == 1 else "two mistakes at once"
            return (f"{head}: it matches {kind} — " + " — or, just as well, ".join(
                describe(c, D, H, option.names) for c in combos) + later + names_note(option, passed=False))
    layers, out = options[0], next(o for case, o in got if case is first)
    scale = _fitted_scale(layers, x, first, out)
    if scale is not None:
        return (f"{head}: the scores are multiplied by {scale:.4g} (divided by {1 / scale:.4g}) before the softmax, "
                f"where 1/sqrt(d_k) = 1/sqrt({D // H}) = {1 / math.sqrt(D // H):.4g}")
    slip = slip_of(layers, H, x, first, out)
    if slip:
        return f"{head}: {slip}" + names_note(layers, passed=False)
    facts = _facts(model, fwd, drill, layers, found, x, first, out)
    order = order_dependence(lambda xi: call(model, fwd, x, dataclasses.replace(first, x=xi), drill)[0].detach(),
                             x, first, out)
    facts += [order] if order else []
    return (f"{head}. Compared with multi-head attention rebuilt from your {layers.described}: " + "; ".join(facts)
            + f". Print your shapes: q, k, v should be (B, H, T, Dh) = {fmt_shape((B, H, T, D // H))}, the scores "
            f"(B, H, T, T) = {fmt_shape((B, H, T, T))}, the output (B, T, D) = {fmt_shape((B, T, D))}"
            + fused_note(layers))



def diagnose(model, fwd, drill, options: list[Layers], missing, found, x, got, errors, wrong: list[Case]) -> str:
    """Why the reader's forward is wrong, everything found (a layer unused, an error, the mistakes)."""
    reuse = _reused(missing, options, x, got) if missing else None
    if reuse:
        return reuse
    options = [o for o in options if o.layout != "a layer reused for two roles"] or options
    parts = [errors[0][1] + _mask_hint(model, fwd, drill, options[0], x, errors[0][0])] if errors else []
    if wrong:
        parts.append(_explained(model, fwd, drill, options, found, x, got, wrong))
    return ". Also, ".join(parts)
