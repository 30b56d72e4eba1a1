"""The interview drill's slips: one projection used differently, an activation after the output, an order.

`slip_of` tries, one at a time, what a forward may do with the reader's own parameters that is not multi-head
attention: a bias never added, a weight used untransposed, the output projection moved onto the values, an
activation after the output projection. `order_dependence` checks that attention without a mask knows no
order (a permutation of the positions of x permutes the output). Each returns the slip in words, or None.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlib.drill.layers import ROLES, Layers
from attnlib.drill.variants import Case, Variant, reproduces, simulate
from attnlib.exercises._core import matching

__all__ = ["slip_of", "order_dependence", "fused_note"]

_ACTIVATIONS = {"F.gelu": F.gelu, "F.relu": F.relu, "torch.tanh": torch.tanh, "F.silu": F.silu,
                "torch.sigmoid": torch.sigmoid}


def _projection_slips(layers: Layers) -> list[tuple[Layers, Variant, str]]:
    """Each role's bias dropped, or its (D, D) weight used untransposed: (layers as forward used them, text)."""
    (w, b), (w_o, b_o) = layers.in_params(), layers.out_params()
    D, tries = w.shape[1], []
    for i, role in enumerate(ROLES + ("o",)):
        rows = slice(i * D, (i + 1) * D) if role != "o" else slice(None)
        weight, bias = (w, b) if role != "o" else (w_o, b_o)
        edit = (lambda wi, bi: layers.edited(wi, bi, w_o, b_o)) if role != "o" else (
            lambda wi, bi: layers.edited(w, b, wi, bi))
        name = layers.names[role]
        if bias is not None and bool(bias[rows].ne(0).any()):
            dropped = bias.clone()
            dropped[rows] = 0
            tries.append((edit(weight, dropped), Variant(), f"`{name}`'s bias is never added: forward uses "
                          f"`{name}.weight` and leaves out `{name}.bias`; call `{name}(t)`"))
        if weight[rows].shape == (D, D):
            flipped = weight.clone()
            flipped[rows] = weight[rows].mT
            tries.append((edit(flipped, bias), Variant(), f"`{name}`'s weight is used untransposed: t @ `{name}.weight` "
                          f"computes t W, but nn.Linear stores W as (out, in) and computes t Wᵀ + b; call `{name}(t)`, "
                          f"or write t @ `{name}.weight`.T + `{name}.bias`"))
    v_rows = slice(2 * D, 3 * D)
    if w_o.shape == (D, D):  # W_o moved onto the values: v' = W_o(W_v x), no projection after the heads merge
        moved_w, moved_b = w.clone(), (torch.zeros(3 * D, dtype=w.dtype) if b is None else b.clone())
        moved_w[v_rows] = w_o @ w[v_rows]
        moved_b[v_rows] = (w_o @ moved_b[v_rows]) + (0 if b_o is None else b_o)
        tries.append((layers.edited(moved_w, moved_b, w_o, b_o), Variant(w_o=False),
                      f"`{layers.names['o']}` applied to the values before the attention instead of to the merged "
                      f"heads after it: attention is linear in v within a head, but `{layers.names['o']}` mixes the "
                      f"heads, so it cannot move inside; apply it to the merged (B, T, D) output"))
    return tries


def slip_of(layers: Layers, num_heads: int, x: torch.Tensor, case: Case, out: torch.Tensor) -> str | None:
    """The one slip that reproduces out on this call, in words, or None."""
    for lay, variant, text in _projection_slips(layers):
        if reproduces(lay, num_heads, x, [(case, out)], variant):
            return text
    ref = simulate(layers, num_heads, x, case)[0][0]
    name = next((n for n, f in _ACTIVATIONS.items() if matching(out, {"": f(ref)})), None)
    if name:
        return (f"the output is {name}(attention): an activation after `{layers.names['o']}`; the drill's module "
                f"ends with the output projection (an activation belongs to the feed-forward block)")
    return None


def order_dependence(output_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, case: Case,
                     out: torch.Tensor) -> str | None:
    """Without a mask, permuting the positions of x must permute the output alike; else the order matters."""
    if case.mask is not None or case.is_causal or case.context is not None or case.kwargs:
        return None
    x = x if case.x is None else case.x
    order = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(5))
    try:
        other = output_of(x[:, order])
    except Exception:  # noqa: BLE001 - the error itself is reported by the other calls
        return None
    if matching(other, {"": out[:, order]}):
        return None
    return ("with the positions of x shuffled, the output is not the same output shuffled: attention without a mask "
            "knows no order, so something in forward depends on where a token stands: positions mixed by a reshape "
            "(view(B, H, T, Dh) without the transpose, on one of q, k, v?), or a positional encoding, ALiBi or RoPE "
            "inside the module (positions belong outside it)")


def fused_note(layers: Layers) -> str:
    """For one fused (3D, D) projection: the layouts the checker can read."""
    if len(layers.parts) != 1 or layers.parts[0].out_features != 3 * layers.parts[0].in_features:
        return ""
    return (". The checker reads a fused projection's rows as [q | k | v] blocks (in any order), per head "
            "(H, 3, Dh) or feature by feature (D, 3): if yours lays out q, k and v otherwise, use one of those")
