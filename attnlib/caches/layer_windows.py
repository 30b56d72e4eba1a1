"""A KV cache whose layers keep different windows: local/global layouts (Gemma 3 5:1, gpt-oss 1:1).

A local layer with window W attends to the last W positions only, so between calls it needs only the
last W - 1 (a rolling buffer, as KVCache keeps for Mistral); a global layer keeps everything. Over L
layers of which L_g are global, after n tokens the cache holds about

    2 · B · H_kv · Dh · (L_g · n + (L - L_g) · (W - 1))    numbers,

which grows with n at the rate of the global layers only.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlib.caches.kv import KVCache

__all__ = ["LayerWindowCache"]


class LayerWindowCache(KVCache):
    """KVCache in which layer i rolls with its own window windows[i] (None: the layer keeps everything);
    LlamaDecoder.make_cache gives one to a model whose layers have windows of their own."""

    def __init__(self, windows: Sequence[int | None]) -> None:
        bad = [w for w in windows if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1)]
        if bad or not len(windows):
            raise ValueError(f"windows must list one window per layer, each an int >= 1 or None, got {windows!r}")
        super().__init__()
        self.windows = tuple(windows)

    def window(self, layer_idx: int) -> int | None:
        """Layer `layer_idx`'s window."""
        return self.windows[layer_idx]

    def fit(self, *, sliding_window: int | None = None, **model: object) -> None:
        """A model with one window for all layers is served by KVCache(sliding_window): a ValueError here."""
        if sliding_window is not None:
            raise ValueError(f"a model with one sliding_window={sliding_window} for all layers takes a "
                             f"KVCache(sliding_window={sliding_window}), not a LayerWindowCache")

    def __repr__(self) -> str:
        return f"LayerWindowCache(layers={len(self)}, seq_len={self.seq_len}, windows={list(self.windows)})"
