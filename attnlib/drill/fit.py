"""The interview drill's fit: can the layers forward uses be q, k, v and an output projection, and how.

`options_for` turns what probes.find learned into the layouts worth trying (layers.layouts, or
layers.reused when a layer never used suggests another serves two roles), or says what keeps the layers
from fitting: no output projection, a layer of the wrong width, heads of another width than
d_model / num_heads. `shapes_note` adds the same facts to an error that stopped forward itself.
"""

from __future__ import annotations

from torch import nn

from attnlib.drill.layers import Layers, layouts, reused
from attnlib.exercises._core import CandidateError

__all__ = ["options_for", "shapes_note"]


def options_for(found, model: nn.Module, D: int, H: int) -> tuple[list[Layers], list[tuple[str, nn.Linear]]]:
    """(the layouts to try, the projections never used); CandidateError when no layout can fit.

    Without an output projection the value layer's row i changes feature i of the output only, as W_o's
    would: when the layers that take x then add up to 2D beside an unused (D, D) layer, that layer is W_o,
    never applied (the catalogue names it) unless another layer serves two roles (probes cannot tell; the
    output can: `reproduces`)."""
    Dh, inputs, out = D // H, list(found.inputs), found.out
    if not inputs and out is None and not found.extra:
        raise CandidateError("the output does not depend on any of your layers: nudging their parameters changes "
                             "nothing. Does forward return something computed without them?")
    square = lambda m: (m.in_features, m.out_features) == (D, D)  # noqa: E731
    widths = [m.out_features for _, m in inputs if m.in_features == D]
    if len(widths) >= 3 and len(set(widths)) == 1 and widths[0] % H == 0 and widths[0] not in (D, Dh):
        w = widths[0]
        raise CandidateError(f"each projection maps d_model = {D} features to {w} = num_heads × {w // H}: heads {w // H} "
                             f"wide, where the drill's heads are d_k = d_model / num_heads = {Dh} wide (a default "
                             f"head width such as dim_head = 64 left in?)")
    total = sum(m.out_features for _, m in inputs)
    idle = [(n, m) for n, m in found.unused if square(m)]
    if out is not None and total == 2 * D and not idle:
        raise CandidateError(f"no output projection: {', '.join(f'`{n}`' for n, _ in found.inputs + [out])} take x, "
                             f"and no other nn.Linear(d_model, d_model) maps the merged heads to the output. Multi-head "
                             f"attention ends with one, W_o, which mixes what the heads found")
    if out is not None and total == 2 * D:  # W_o never applied, or a layer reused for two roles
        applied = layouts(sorted(inputs + [out], key=lambda p: [m for _, m in found.all].index(p[1])), idle[-1], D, H)
        return reused(inputs, out, D, H) + applied, idle
    if out is None:
        if idle and total == 3 * D:
            out = idle[-1]  # never applied: the catalogue's "no output projection" names it
        elif total == 4 * D and any(square(m) for _, m in inputs):
            out = [(n, m) for n, m in inputs if square(m)][-1]  # applied, but not as the last step
            inputs.remove(out)
        else:
            raise CandidateError("no output projection: no nn.Linear(d_model, d_model) maps the merged heads to the "
                                 "output (one whose row i changes feature i of the output only). Multi-head attention "
                                 "ends with one, W_o, which mixes what the heads found")
    for n, m in inputs:
        if m.in_features != D or m.out_features % Dh:
            raise CandidateError(f"`{n}` = nn.Linear({m.in_features}, {m.out_features}) takes part in the output, but "
                                 f"a projection of x maps d_model = {D} features to d_model = {D} (q, k or v), a "
                                 f"multiple of it (fused) or d_k = {Dh} (one head)")
    total = sum(m.out_features for _, m in inputs)
    if total == 3 * D:
        return layouts(inputs, out, D, H), []
    used = ", ".join(f"`{n}` ({m.out_features})" for n, m in inputs) or "none"
    raise CandidateError(f"the layers that take x, {used}, give {total} features in all; q, k and v need 3 × d_model "
                         f"= {3 * D} (three nn.Linear(d_model, d_model), one fused, or one per head and role)")


def shapes_note(model: nn.Module, D: int) -> str:
    """'. Your layers ...' when the nn.Linear layers that take d_model features cannot be q, k, v and W_o."""
    takes = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.in_features == D]
    total = sum(m.out_features for _, m in takes)
    if not takes or total in (3 * D, 4 * D):
        return ""
    found = ", ".join(f"{n} = Linear({m.in_features} → {m.out_features})" for n, m in takes)
    return (f". Your layers that take d_model = {D} features give {total} in all ({found}), where q, k, v and the "
            f"output projection need 3 × {D} + {D} = {4 * D}")
