"""The interview drill's reference, its masks: which (query, key) pairs a `Variant` (variants.py) lets attend on
one call, from the reader's mask as the variant treats it (kept, inverted, ignored, ...) and the causal mask
as the variant builds it (bottom-right, top-left, strict, ...). True = may attend; (T, S) or broadcastable
to the scores (B, H, T, S).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnlib.masks import causal_mask, combine

if TYPE_CHECKING:
    from attnlib.drill.variants import Case, Variant

__all__ = ["allowed_pairs"]


def _user_mask(mask: torch.Tensor | None, how: str) -> torch.Tensor | None:
    """The reader's mask as the variant's `mask` field treats it (None: no mask at all)."""
    if mask is None or how == "kept":
        return mask
    return {"inverted": lambda m: ~m, "ignored": lambda m: None,
            "ignored if 2-D": lambda m: None if m.dim() == 2 else m,
            "head 0": lambda m: m[:, :1] if m.dim() == 4 else m,
            "transposed": lambda m: m.transpose(-2, -1)}[how](mask)


def allowed_pairs(case: Case, v: Variant, T: int, S: int) -> torch.Tensor | None:
    """The mask the variant applies: the reader's mask (as the variant treats it) and the causal ones."""
    user = None if case.is_causal and v.causal == "replaces mask" else _user_mask(case.mask, v.mask)
    causal = None
    if case.is_causal and v.causal != "ignored":
        tril = causal_mask(T, S)  # (T, S), bottom-right aligned
        causal = {"inverted": ~tril, "strict": tril.tril(S - T - 1),
                  "triu": torch.ones(T, S, dtype=torch.bool).triu()}.get(v.causal, tril)
    if v.always_causal == "always" or (v.always_causal == "cross" and case.context is not None):
        causal = combine(causal, torch.ones(T, S, dtype=torch.bool).tril())  # torch.tril: top-left
    if v.causal == "or" and user is not None and causal is not None:
        return user | causal
    return combine(user, causal)
