"""The interview drill's output checks: what the reader's forward returned, and what it should have.

forward returns out (B, T, D), or a tuple whose first element is out and no other has its shape (the others
may be the attention weights (B, H, T, S) or None), as nn.MultiheadAttention returns (out, weights): a caller
unpacks `out, weights = mha(x)`. Anything else gets a message that says what came back and, for the shapes
readers often return by mistake (the weights first, the heads never merged), why.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape
from attnlib.exercises._core import CandidateError, as_tensor, matching
from attnlib.exercises._describe import fitted

__all__ = ["unpack", "check_weights", "finite"]


def _shape(value: object) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _shape_mistakes(B: int, T: int, S: int, D: int, H: int) -> dict[tuple[int, ...], str]:
    """Shapes readers return instead of (B, T, D), with what each one means."""
    Dh = D // H
    known = {(B, H, T, Dh): "(B, H, T, Dh): the heads were never merged back; transpose to (B, T, H, Dh), "
                            "then reshape to (B, T, D)",
             (B, T, H, Dh): "(B, T, H, Dh): the heads were never merged back; reshape to (B, T, D)",
             (B, H, T, S): "(B, H, T, S): the attention weights, not the output",
             (T, B, D): "(T, B, D): batch and time are swapped; the drill is batch-first"}
    if S != T:
        known[(B, S, D)] = "(B, S, D): one output per key; the queries, and so the outputs, come from x"
    return known


def _not_first(value: tuple | list, i: int, call: str, weights_shape: tuple[int, ...]) -> str:
    """Why a tuple with the output (B, T, D) at item i > 0 is refused."""
    if len(value) == 2 and _shape(value[0]) == weights_shape:
        return (f"{call} returns (weights, out): the output must come first, as nn.MultiheadAttention and the "
                f"exercise return it (a caller unpacks `out, weights = mha(x)`): return out, weights")
    return (f"{call} returns the output (B, T, D) as item {i} of {len(value)}: the output must come first, as "
            f"nn.MultiheadAttention returns (out, weights) (a caller unpacks `out, weights = mha(x)`)")


def unpack(value: object, call: str, x: torch.Tensor, S: int, num_heads: int,
           need_weights: bool) -> tuple[torch.Tensor, object]:
    """(out, weights or None) from what forward returned; CandidateError if it holds no single out (B, T, D)."""
    B, T, D = x.shape
    if value is None:
        raise CandidateError(f"{call} returned None: is the `return` missing at the end of forward?")
    weights = None
    if isinstance(value, (tuple, list)):
        outs = [i for i, item in enumerate(value) if _shape(item) == (B, T, D)]
        if len(outs) != 1 and not (not outs and 1 <= len(value) <= 2):  # one or two items: value[0] is told why
            shapes = ", ".join(fmt_shape(s) if (s := _shape(item)) else type(item).__name__ for item in value)
            raise CandidateError(f"{call} returned a {type(value).__name__} of {len(value)} items ({shapes}), "
                                 f"{len(outs)} of them of shape (B, T, D) = {fmt_shape((B, T, D))}: return out, "
                                 f"or a tuple with exactly one such tensor, the output, first (the others may be the "
                                 f"attention weights)")
        if outs and outs[0] != 0:
            raise CandidateError(_not_first(value, outs[0], call, (B, num_heads, T, S)))
        rest = list(value[1:])
        weights = next((w for w in rest if _shape(w) == (B, num_heads, T, S)), rest[0] if len(rest) == 1 else None)
        value = value[0]
    elif need_weights:
        raise CandidateError(f"{call} returned only out: this exercise returns (out, attention weights), "
                             f"attention weights (B, H, T, S) = {fmt_shape((B, num_heads, T, S))}")
    out = as_tensor(value, f"the output of {call}")
    if out.shape != x.shape:
        meaning = _shape_mistakes(B, T, S, D, num_heads).get(tuple(out.shape))
        raise CandidateError(f"the output of {call} has shape {fmt_shape(out.shape)}"
                             + (f" = {meaning}" if meaning else "") + f"; expected (B, T, D) = {fmt_shape(x.shape)}")
    if out.dtype != x.dtype:
        raise CandidateError(f"the output of {call} has dtype {out.dtype}; it should keep the dtype of x, {x.dtype}")
    if torch.is_grad_enabled() and not out.requires_grad:
        raise CandidateError(f"the output of {call} is cut off from autograd (torch.no_grad(), .detach(), .data "
                             f"or numpy inside forward), so training could never update W_q, W_k, W_v, W_o")
    return out, weights


def _flat_weights(w: torch.Tensor, expected: torch.Tensor) -> str:
    """What (B, T, S) weights are, given the per-head ones expected (B, H, T, S)."""
    if matching(w, {"mean": expected.mean(1)}):
        return "averaged over the heads (as nn.MultiheadAttention returns them by default); return each head's attention weights"
    head = next((h for h in range(expected.shape[1]) if matching(w, {"": expected[:, h]})), None)
    if head is not None:
        return f"the attention weights of head {head} only; return every head's"
    return "one matrix for all heads; return each head's attention weights"


def check_weights(weights: object, expected: torch.Tensor, call: str, need_weights: bool,
                  unmasked: torch.Tensor | None = None) -> bool:
    """Check the weights the reader returned against `expected` (B, H, T, S); True if they were checked.

    In the drill, weights of another shape (torch's head average (B, T, S), say) are not checked;
    in the exercise that asks for them, they must be the per-head probabilities applied to v.
    `unmasked`: the weights without the call's mask, to name weights returned before masking.
    """
    if weights is None or (not need_weights and _shape(weights) != tuple(expected.shape)):
        return False
    B, H, T, S = expected.shape
    w = as_tensor(weights, f"the attention weights returned by {call}")
    if w.shape != expected.shape:
        hint = {(B, T, S): f": {_flat_weights(w, expected)}", (B, 1, T, S): f": {_flat_weights(w[:, 0], expected)}",
                (B, T, H, S): ": return them as (B, H, T, S)"}.get(tuple(w.shape), "")
        raise CandidateError(f"the attention weights returned by {call} have shape {fmt_shape(w.shape)}{hint}; "
                             f"expected (B, H, T, S) = {fmt_shape(expected.shape)}")
    if matching(w, {"expected": expected}):
        return True
    known = {"the average over the heads, repeated for every head: return each head's own attention weights":
             expected.mean(1, keepdim=True).expand_as(expected)}
    if T == S:
        known["the attention weights transposed, (B, H, S, T): one row per key; return softmax(...) as it is, one row per "
              "query"] = expected.transpose(-2, -1)
    if unmasked is not None:
        known["the attention weights of the scores before the mask: return the probabilities applied to v, with the mask"] = unmasked
    found = matching(w, known)
    power = fitted(lambda c: expected ** c / (expected ** c).sum(-1, keepdim=True), w, 0.1, 10.0) if not found else None
    if power is not None:  # softmax(c · s) = softmax(s)^c, renormalised: another scale in the returned weights only
        found = [f"softmax(c · Q Kᵀ / sqrt(d_k)) with c = {power:.4g}: the weights returned use another scale than "
                 f"the ones applied to v (c = sqrt(d_k): the unscaled scores Q Kᵀ); return the probabilities applied to v"]
    hint = (f": {found[0]}" if found else "" if matching(w.sum(-1), {"sums": expected.sum(-1)}) else
            " (their rows do not sum to 1: the scores before the softmax?)")
    raise CandidateError(f"the attention weights returned by {call} are not the probabilities applied to v, "
                         f"softmax(Q Kᵀ / sqrt(d_k)) with the mask, per head{hint}")


def finite(out: torch.Tensor, call: str) -> None:
    """CandidateError if the output (B, T, D) of `call`, made with no mask at all, holds NaN or inf."""
    if not torch.isfinite(out).all():
        first = (~torch.isfinite(out)).nonzero()[0].tolist()
        what = "NaN" if torch.isnan(out).any() else "inf"
        raise CandidateError(f"{call} returns {what}, with no mask at all (first at sequence {first[0]}, position "
                             f"{first[1]}, feature {first[2]}): 0/0, inf - inf, an overflow, or a softmax row whose "
                             f"every score is -inf")
