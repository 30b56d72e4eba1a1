"""The buffers behind KVCache: how they grow, and how a rolling buffer keeps only a sliding window's keys.

A layer's keys and values sit at the front of a preallocated buffer (B, H_kv, capacity, Dh). Without a
window the capacity doubles when the buffer is full. Under a sliding window W no later query sees a key
more than W - 1 positions back, so the buffer stops growing at max(2 (W - 1), 16) positions and, when
full, moves the last W - 1 positions to its front (`_roll`), dropping the older ones.
"""

from __future__ import annotations

import torch

__all__ = ["RollingBuffers"]


class RollingBuffers:
    """The buffer mechanics of attnlib.caches.KVCache, which inherits them (one class of state, two files).

    They work on the cache's per-layer lists: _k, _v (B, H_kv, capacity, Dh / Dv) buffers, _len (slots
    filled), _dropped (positions dropped before slot 0), and on its window(layer_idx) and _kept(layer_idx).
    """

    _k: list[torch.Tensor]
    _v: list[torch.Tensor]
    _len: list[int]
    _dropped: list[int]

    def _capacity(self, needed: int, W: int | None) -> int:
        """Positions to grow a buffer to: twice what it must hold (at least 16); under a window W, once that
        is more than the W - 1 positions kept, a rolling buffer's fixed size max(2 (W - 1), 16), so that
        each roll frees at least as many slots as it moves. Below `needed` only for a chunk that no
        rolling buffer holds (update passes it through _update_past_buffer)."""
        capacity = max(2 * needed, 16)
        return capacity if W is None or capacity <= W - 1 else max(2 * (W - 1), 16)

    def _update_past_buffer(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """update for a chunk longer than a rolling buffer holds (a long prompt): return the kept positions
        and the chunk concatenated, a new tensor that only the caller's attention holds, and keep the last
        W - 1 of them in a buffer of the rolling size, so that no buffer sized by the prompt stays behind."""
        start, keep = self._len[layer_idx], self.window(layer_idx) - 1  # start <= W - 1: update has rolled
        k_all = torch.cat([self._k[layer_idx].narrow(2, 0, start), k], dim=2)    # (B, H_kv, start + S_new, Dh)
        v_all = torch.cat([self._v[layer_idx].narrow(2, 0, start), v], dim=2)    # (B, H_kv, start + S_new, Dv)
        size = self._capacity(keep, self.window(layer_idx))
        for buffers, full in ((self._k, k_all), (self._v, v_all)):
            if buffers[layer_idx].shape[2] != size:
                buffers[layer_idx] = full.new_empty(full.shape[0], full.shape[1], size, full.shape[3])
            buffers[layer_idx].narrow(2, 0, keep).copy_(full.narrow(2, full.shape[2] - keep, keep))
        self._dropped[layer_idx] += full.shape[2] - keep
        self._len[layer_idx] = keep
        return k_all, v_all

    def _roll(self, layer_idx: int) -> int:
        """Move the positions a rolling buffer keeps to the front of its full buffer; return their number.

        The older ones are out of every later query's window. Done only when the buffer, at least
        2 (W - 1) positions long (_capacity), is full: for tokens appended one at a time, each roll
        frees at least as many slots as it moves, so a token costs at most about one more copy on
        average (a chunk of c tokens can roll a buffer that still has up to c - 1 free slots; then the
        kept range can overlap the front and goes through a temporary copy).
        """
        start, keep = self._len[layer_idx], self._kept(layer_idx)
        for buf in (self._k[layer_idx], self._v[layer_idx]):
            kept = buf.narrow(2, start - keep, keep)
            if start - keep < keep:  # the kept range overlaps the front (a chunk rolled early): copy it out first
                kept = kept.clone()
            buf.narrow(2, 0, keep).copy_(kept)
        self._dropped[layer_idx] += start - keep
        self._len[layer_idx] = keep
        return keep

    def _grow(self, layer_idx: int, capacity: int) -> None:
        """Move layer `layer_idx` into buffers of `capacity` positions."""
        for buffers in (self._k, self._v):
            old = buffers[layer_idx]
            grown = old.new_empty(old.shape[0], old.shape[1], capacity, old.shape[3])
            grown[:, :, :self._len[layer_idx]] = old[:, :, :self._len[layer_idx]]
            buffers[layer_idx] = grown
