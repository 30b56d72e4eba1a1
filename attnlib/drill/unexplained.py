"""What the drill says about an output no known mistake explains: a scale fitted to it, a constant factor, the
output bias added again, whether each query's attention weights sum to 1, which sequences, positions, heads
or features differ (differ.differences), and whether one sequence of the batch changes another."""

from __future__ import annotations

import dataclasses

import torch

from attnlib.drill.calls import D, H, call
from attnlib.drill.differ import differences
from attnlib.drill.layers import Layers
from attnlib.drill.variants import Case, Variant, simulate
from attnlib.exercises._core import CandidateError, matching
from attnlib.exercises._describe import fitted

__all__ = ["fitted_scale", "what_differs"]


def fitted_scale(layers: Layers, x, case: Case, out: torch.Tensor) -> float | None:
    """The factor on Q Kᵀ that reproduces out, if one does (_describe.fitted)."""
    return fitted(lambda c: simulate(layers, H, x, case, Variant(scale=c))[0][0], out, 1e-4, 1e2)


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


def what_differs(model, fwd, drill, layers: Layers, found, x, case: Case, out: torch.Tensor) -> list[str]:
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
