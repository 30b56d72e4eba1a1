"""The key/value cache: what a decoder keeps so that each new token attends without recomputing the past.

At decode step t, the keys and values of positions 0..t-1 do not change, so each attention layer
stores them once and appends the new token's (k, v). The cache holds H_kv heads per layer, never
repeated to H: that is grouped-query attention's memory saving. `KVCache` is the plain cache; it
keeps the contract of attnlib.caches.Cache, as every cache of attnlib.caches does.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape, require_float_tensor
from attnlib.caches.rolling import RollingBuffers

__all__ = ["KVCache", "cache_bytes"]


def cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, *,
                batch_size: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes a KV cache holds: 2 (K and V) · layers · B · H_kv · seq_len · Dh · bytes per element.

    bytes_per_element is 2 for fp16/bf16, 4 for fp32. For MHA, num_kv_heads = num_heads.
    """
    return 2 * num_layers * batch_size * num_kv_heads * seq_len * head_dim * bytes_per_element


class KVCache(RollingBuffers):
    """An empty cache for a whole model, grown in place, one entry per attention layer (the `Cache` contract).

    Each layer's keys and values live in a preallocated buffer (B, H_kv, capacity, Dh) whose
    capacity doubles when full, so appending one token costs, amortised, a copy of that token only
    (the buffers' growing and rolling: attnlib.caches.rolling.RollingBuffers).

    sliding_window=W makes it a rolling buffer for a sliding-window model (Mistral), whose queries see
    only the last W positions, themselves included: between calls each layer keeps the last W - 1
    positions and drops the older ones, in buffers of at most max(2 (W - 1), 16) positions however
    long the sequence or the prompt (`allocated_nbytes`). A sliding-window LlamaDecoder sets the
    window of the KVCache it fills. `seq_len` still counts every position seen: it is the next
    token's position.
    """

    def __init__(self, sliding_window: int | None = None) -> None:
        self._k: list[torch.Tensor] = []  # per layer: (B, H_kv, capacity, Dh)
        self._v: list[torch.Tensor] = []  # per layer: (B, H_kv, capacity, Dv)
        self._len: list[int] = []         # per layer: slots filled
        self._dropped: list[int] = []     # per layer: positions dropped before slot 0 (a rolling buffer's)
        self.sliding_window = None
        self.fit(sliding_window=sliding_window)

    def fit(self, *, sliding_window: int | None = None, **model: object) -> None:
        """Keep what a model with this sliding window (None: none) needs; LlamaDecoder calls it before
        each forward. A cache belongs to the model that filled it: another window is a ValueError."""
        if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                           or sliding_window < 1):
            raise ValueError(f"sliding_window must be an int >= 1 (the positions a query sees, itself "
                             f"included) or None, got {sliding_window!r}")
        if sliding_window != self.sliding_window and len(self):
            raise ValueError(f"the cache was filled with sliding_window={self.sliding_window}, not "
                             f"{sliding_window}: a cache belongs to one model; start a new KVCache()")
        self.sliding_window = sliding_window

    def __len__(self) -> int:
        """The number of layers filled."""
        return len(self._len)

    @property
    def batch_size(self) -> int | None:
        """B of the cached sequences (None for an empty cache)."""
        return self._k[0].shape[0] if self._k else None

    def window(self, layer_idx: int) -> int | None:
        """The window W layer `layer_idx` rolls with: sliding_window for every layer (a subclass may give
        each layer its own: attnlib.caches.layer_windows.LayerWindowCache)."""
        return self.sliding_window

    def _kept(self, layer_idx: int) -> int:
        """Positions layer `layer_idx` keeps for later tokens: all, or the last W - 1 under a window W."""
        n, W = self._len[layer_idx], self.window(layer_idx)
        return n if W is None else min(n, W - 1)

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values kept (the filled part of the buffers; under a sliding window W,
        at most W - 1 positions per layer)."""
        return sum((k.shape[0] * k.shape[1] * (k.shape[3] + v.shape[3]) * self._kept(i)) * k.element_size()
                   for i, (k, v) in enumerate(zip(self._k, self._v)))

    @property
    def allocated_nbytes(self) -> int:
        """Bytes of the buffers themselves, spare room included, which the cache takes from memory (`nbytes`
        counts the positions kept). Under a sliding window W, at most max(2 (W - 1), 16) positions per
        layer, whatever the sequence's length."""
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in zip(self._k, self._v))

    @property
    def seq_len(self) -> int:
        """Positions seen so far (layer 0's count; 0 for an empty cache), which is the next token's position."""
        return self.get_seq_len(0)

    def get_seq_len(self, layer_idx: int) -> int:
        """Positions seen by one layer (0 if that layer has nothing yet)."""
        return self._dropped[layer_idx] + self._len[layer_idx] if layer_idx < len(self._len) else 0

    def crop(self, seq_len: int) -> None:
        """Keep positions 0 .. seq_len - 1 of every layer and forget the later ones (speculative decoding
        rolls back rejected draft tokens so). The buffers stay; the next update overwrites the slots.
        A rolling buffer cannot bring back the positions it dropped: cropping into them is a ValueError."""
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 <= seq_len <= self.seq_len:
            raise ValueError(f"seq_len must be an int in [0, {self.seq_len}] (the positions to keep), got {seq_len!r}")
        for layer_idx, dropped in enumerate(self._dropped):
            W = self.window(layer_idx)
            needed = seq_len if W is None else min(seq_len, W - 1)  # what the next query of this layer sees
            if seq_len - needed < dropped:
                raise ValueError(f"cannot crop to seq_len={seq_len}: the rolling buffer of layer {layer_idx} "
                                 f"(window {W}) has dropped positions the next token attends to")
        self._len = [seq_len - dropped for dropped in self._dropped]

    def _check(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            require_float_tensor(t, name)
            if t.dim() != 4:
                raise ValueError(f"{name} of shape {fmt_shape(t.shape)} is not (B, H_kv, S_new, Dh)")
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k of shape {fmt_shape(k.shape)} and v of shape {fmt_shape(v.shape)} "
                             f"differ in (B, H_kv, S_new)")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx <= len(self):
            raise ValueError(f"layer_idx must be an int in [0, {len(self)}] (layers are filled in order), "
                             f"got {layer_idx!r}")
        if layer_idx < len(self):
            held = self._k[layer_idx]
            if k.dtype != held.dtype or v.dtype != held.dtype:
                raise TypeError(f"the cache of layer {layer_idx} holds {held.dtype}, got k {k.dtype} and "
                                f"v {v.dtype}: a cache belongs to one model; start a new KVCache()")
            if (k.shape[0], k.shape[1], k.shape[3]) != (held.shape[0], held.shape[1], held.shape[3]) \
                    or v.shape[3] != self._v[layer_idx].shape[3]:
                raise ValueError(
                    f"the cache of layer {layer_idx} holds (B={held.shape[0]}, H_kv={held.shape[1]}, "
                    f"Dh={held.shape[3]}), got k of shape {fmt_shape(k.shape)}: a cache belongs to one "
                    f"batch and one model; start a new KVCache()")

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k (B, H_kv, S_new, Dh) and v (B, H_kv, S_new, Dv) to layer `layer_idx`.

        Returns everything that layer has cached: (B, H_kv, S_past + S_new, Dh) and (..., Dv); under a
        sliding window W, the last W - 1 positions before the new ones, and the new ones.
        """
        self._check(layer_idx, k, v)
        if layer_idx == len(self):
            self._k.append(k.new_empty(k.shape[0], k.shape[1], 0, k.shape[3]))
            self._v.append(v.new_empty(v.shape[0], v.shape[1], 0, v.shape[3]))
            self._len.append(0)
            self._dropped.append(0)
        start, new = self._len[layer_idx], k.shape[2]
        if start + new > self._k[layer_idx].shape[2]:
            if self.window(layer_idx) is not None and self._kept(layer_idx) < start:
                start = self._roll(layer_idx)
            if start + new > self._capacity(start + new, self.window(layer_idx)):  # longer than a rolling buffer holds
                return self._update_past_buffer(layer_idx, k, v)
            if start + new > self._k[layer_idx].shape[2]:
                self._grow(layer_idx, self._capacity(start + new, self.window(layer_idx)))
        k_buf, v_buf = self._k[layer_idx], self._v[layer_idx]
        k_buf.narrow(2, start, new).copy_(k)            # buffer[:, :, start:start + new] = k
        v_buf.narrow(2, start, new).copy_(v)
        W = self.window(layer_idx)
        first = 0 if W is None else max(0, start - W + 1)  # the W - 1 kept
        self._len[layer_idx] = end = start + new
        return k_buf.narrow(2, first, end - first), v_buf.narrow(2, first, end - first)  # views of the filled part

    def __repr__(self) -> str:
        if not self._len:
            return "KVCache(empty)" if self.sliding_window is None else f"KVCache(empty, sliding_window={self.sliding_window})"
        B, H_kv, _, Dh = self._k[0].shape
        window = "" if self.sliding_window is None else f", sliding_window={self.sliding_window}"
        return f"KVCache(layers={len(self)}, seq_len={self.seq_len}, B={B}, H_kv={H_kv}, Dh={Dh}{window})"
