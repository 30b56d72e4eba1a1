"""One mask convention for the whole book: a bool tensor, True = may attend.

Scores have shape (..., T, S): T queries, S keys. A mask broadcasts to that shape:
a padding mask is (B, 1, 1, S), a causal mask is (T, S). Other libraries use other conventions;
the converters here turn theirs into ours:

| library                                     | meaning of True / 1 | converter               |
| ------------------------------------------- | ------------------- | ----------------------- |
| torch scaled_dot_product_attention (bool)   | may attend          | (none needed)           |
| torch nn.MultiheadAttention key_padding_mask | ignore              | from_key_padding_mask   |
| transformers attention_mask (0/1)           | real token, attend  | from_hf                 |
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlib._checks import fmt_shape, require_tensor

__all__ = ["causal_mask", "padding_mask", "lengths_to_valid", "from_hf",
           "from_key_padding_mask", "combine", "check_mask"]


def causal_mask(T: int, S: int | None = None, *, window: int | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """(T, S) bool mask, aligned bottom-right: query i may see keys j <= i + (S - T).

    With S = T this is the usual lower triangle. With S > T (T new queries after S - T cached
    keys) the last query sees every key, which is what a KV cache needs. SDPA's is_causal aligns
    top-left instead (j <= i), which is only the same when T == S. A sliding `window` (Mistral's)
    also hides the keys more than window - 1 positions back: query i sees the last `window` keys up
    to itself, i + (S - T) - window < j <= i + (S - T).
    """
    S = T if S is None else S
    for name, n in (("T", T), ("S", S)) + ((("window", window),) if window is not None else ()):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
    return mask if window is None else mask.triu(diagonal=S - T - window + 1)


def _two_d(mask: object, name: str, meaning: str) -> torch.Tensor:
    """Check a (B, S) mask and return it as bool; 0/1 ints and bools are accepted."""
    require_tensor(mask, name)
    if mask.dim() != 2:
        raise ValueError(f"{name} of shape {fmt_shape(mask.shape)} is not (B, S) ({meaning})")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise TypeError(f"{name} must be bool or 0/1 integers ({meaning}), got {mask.dtype}"
                            + ("" if mask.is_floating_point() else " with values other than 0 and 1"))
        mask = mask.bool()
    return mask


def padding_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, S) with True/1 = real token → (B, 1, 1, S) bool, True = may attend.

    The two inserted axes broadcast over heads H and queries T of scores (B, H, T, S).
    """
    return _two_d(valid, "valid", "True/1 = real token")[:, None, None, :]


def lengths_to_valid(lengths: torch.Tensor | Sequence[int], S: int) -> torch.Tensor:
    """Sequence lengths (B,) → (B, S) bool, True at positions j < lengths[b]."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths of shape {fmt_shape(lengths.shape)} and dtype {lengths.dtype} "
                         f"must be a 1-D integer tensor (B,)")
    if isinstance(S, bool) or not isinstance(S, int) or S < 1:
        raise ValueError(f"S must be a positive int, got {S!r}")
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > S):
        raise ValueError(f"lengths must lie in [0, S={S}], got {lengths.tolist()}")
    return torch.arange(S, device=lengths.device) < lengths[:, None]  # (S,) < (B, 1) -> (B, S)


def from_hf(attention_mask: torch.Tensor) -> torch.Tensor:
    """A transformers attention_mask (B, S), 1 = real token → (B, 1, 1, S) bool, True = may attend."""
    return _two_d(attention_mask, "attention_mask", "transformers: 1 = attend, 0 = padding")[:, None, None, :]


def from_key_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """An nn.MultiheadAttention key_padding_mask (B, S) → (B, 1, 1, S) bool, True = may attend.

    torch's bool key_padding_mask means True = *ignore*, so it is inverted. Its float form is
    additive: 0 = attend, -inf = ignore; other values cannot be expressed as a bool mask.
    """
    require_tensor(mask, "mask")
    if mask.is_floating_point():
        if mask.dim() == 2 and not bool(((mask == 0) | (mask == float("-inf"))).all()):
            raise ValueError("a float key_padding_mask is additive; only 0 (attend) and -inf "
                             "(ignore) convert to a bool mask")
        mask = mask == float("-inf")
    elif mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask must be bool (True = ignore) or float (0 / -inf), got {mask.dtype}")
    return ~_two_d(mask, "mask", "nn.MultiheadAttention key_padding_mask: True = ignore")[:, None, None, :]


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """AND of bool masks with broadcasting (e.g. padding (B, 1, 1, S) & causal (T, S) → (B, 1, T, S)).

    None entries are skipped; combine() of nothing is None (no mask).
    """
    present = [(i, m) for i, m in enumerate(masks) if m is not None]
    for i, m in present:
        require_tensor(m, f"masks[{i}]")
        if m.dtype != torch.bool:
            raise TypeError(f"masks[{i}] must be bool (True = may attend), got {m.dtype}")
    try:
        torch.broadcast_shapes(*(m.shape for _, m in present))
    except RuntimeError:
        shapes = ", ".join(fmt_shape(m.shape) for _, m in present)
        raise ValueError(f"masks of shapes {shapes} do not broadcast together") from None
    out = None
    for _, m in present:
        out = m if out is None else out & m
    return out


def check_mask(mask: object, scores_shape: Sequence[int]) -> torch.Tensor:
    """Return mask if it is bool and broadcasts to scores (..., T, S) without growing them; else raise."""
    require_tensor(mask, "mask")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got {mask.dtype}. Convert a 0/1 mask "
            f"with mask.bool(), an additive 0/-inf mask with mask == 0, a transformers attention_mask "
            f"with attnlib.masks.from_hf(m), an nn.MultiheadAttention key_padding_mask with "
            f"attnlib.masks.from_key_padding_mask(m)")
    scores_shape = tuple(scores_shape)
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        hint = ("; a padding mask (B, S) must become (B, 1, 1, S): attnlib.masks.padding_mask(valid)"
                if mask.dim() == 2 else "")
        raise ValueError(f"mask of shape {fmt_shape(mask.shape)} does not broadcast to scores "
                         f"{fmt_shape(scores_shape)}{hint}")
    return mask
