"""The cache of multi-head latent attention: per token and layer, the latent c (r numbers) and the
shared rotary key k^R (D_R numbers), never the per-head keys and values rebuilt from them."""

from __future__ import annotations

import torch

from attnlib.caches._base import LayeredCache, append_rows

__all__ = ["LatentCache"]


class LatentCache(LayeredCache):
    """An empty cache for a whole MultiHeadLatentAttention model, grown in place, one entry per layer.

    It holds r + D_R numbers per token and layer (kv_lora_rank + qk_rope_head_dim): 576 for
    DeepSeek-V3, where an MHA cache of the same heads would hold 2 · 128 · 192 = 49,152.
    """

    _expected = "(B, S_new, width)"
    _names = ("latent", "k_rope")

    def __init__(self) -> None:
        super().__init__()
        self._latent: list[torch.Tensor] = []  # per layer: (B, capacity, r)
        self._k_rope: list[torch.Tensor] = []  # per layer: (B, capacity, D_R)

    @property
    def nbytes(self) -> int:
        """Bytes of the latents and rotary keys held, layers · B · S · (r + D_R) · bytes per element."""
        return sum(lat.shape[0] * (lat.shape[-1] + kr.shape[-1]) * n * lat.element_size()
                   for lat, kr, n in zip(self._latent, self._k_rope, self._len))

    def update(self, layer_idx: int, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append latent (B, S_new, r) and k_rope (B, S_new, D_R) to layer `layer_idx`.

        Returns everything that layer holds: (B, S_past + S_new, r) and (B, S_past + S_new, D_R).
        """
        if self._check(layer_idx, latent, k_rope):
            self._latent.append(None)
            self._k_rope.append(None)
        start = self._len[layer_idx]
        self._latent[layer_idx] = append_rows(self._latent[layer_idx], start, latent)
        self._k_rope[layer_idx] = append_rows(self._k_rope[layer_idx], start, k_rope)
        self._len[layer_idx] = end = start + latent.shape[1]
        return self._latent[layer_idx].narrow(1, 0, end), self._k_rope[layer_idx].narrow(1, 0, end)
