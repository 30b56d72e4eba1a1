"""The interview drill's calls and diagnoses: run the reader's forward, and say why its output is wrong.

`call` (calls.py, re-exported) runs forward on one case. `diagnose` names the mistake: a layer never used, the error a call raised, the known mistakes (one, or
two at once) that reproduce every output, a scale fitted to the output, and otherwise what differs
(unexplained.py: the row sums of the attention weights, which positions, heads or sequences, by how much).
"""

from __future__ import annotations

import dataclasses
import math

from attnlib._checks import fmt_shape
from attnlib.drill.calls import B, D, H, S, T, call
from attnlib.drill.layers import ROLES, Layers
from attnlib.drill.mistakes import describe
from attnlib.drill.roles import names_note
from attnlib.drill.slips import fused_note, order_dependence, slip_of
from attnlib.drill.unexplained import fitted_scale, what_differs
from attnlib.drill.variants import Case, explain, reproduces
from attnlib.exercises._core import CandidateError

__all__ = ["call", "diagnose", "B", "T", "S", "D", "H"]


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
    scale = fitted_scale(layers, x, first, out)
    if scale is not None:
        return (f"{head}: the scores are multiplied by {scale:.4g} (divided by {1 / scale:.4g}) before the softmax, "
                f"where 1/sqrt(d_k) = 1/sqrt({D // H}) = {1 / math.sqrt(D // H):.4g}")
    slip = slip_of(layers, H, x, first, out)
    if slip:
        return f"{head}: {slip}" + names_note(layers, passed=False)
    facts = what_differs(model, fwd, drill, layers, found, x, first, out)
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
