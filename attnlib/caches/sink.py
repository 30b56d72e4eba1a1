"""An attention-sink cache (StreamingLLM, Xiao et al. 2024): keep the first `num_sinks` positions, which
trained models use as a place to put attention they do not need, and a sliding window of the last
`window` positions; drop everything in between.

Positions are counted within the cache, as in the paper: the next token's position is the number of
positions held (`seq_len`), never its place in the whole stream, so a stream of any length stays
within the positions the model was trained on. When the window slides, the keys it keeps move to
lower positions: their rotary embedding is corrected by the shift (a rotation by -shift · θ), from the
key as it was first rotated, so the corrections do not pile up rounding errors.
"""

from __future__ import annotations

import torch

from attnlib._checks import fmt_shape, require_count
from attnlib.caches._base import LayeredCache, append_rows
from attnlib.positional import apply_rope

__all__ = ["SinkCache"]


class SinkCache(LayeredCache):
    """A KV cache that holds at most num_sinks + window positions per layer: the first num_sinks and the last window.

    A step's new tokens attend to everything held plus themselves (causally); after the step the cache
    drops the positions between the sinks and the last `window`. While the stream is no longer than
    num_sinks + window nothing is dropped and it is KVCache, bit for bit.

    rotary: the RotaryEmbedding the keys were rotated with (anything with `inv_freq`, rotate_half
    layout), needed to move kept keys to their new positions; None for keys without RoPE. The caller
    rotates each new token at position get_seq_len(layer_idx) + i, as MultiHeadAttention and
    LlamaDecoder do.
    """

    def __init__(self, num_sinks: int, window: int, *, rotary: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.num_sinks = require_count(num_sinks, "num_sinks", 0, "the first positions kept for good")
        self.window = require_count(window, "window", 1, "the last positions kept")
        self.rotary = rotary
        self._kv: list[list[torch.Tensor | None]] = []  # per layer: [k (B, H_kv, capacity, Dh), v]
        self._rot: list[torch.Tensor | None] = []       # per layer: (capacity, 1) position each key was rotated at
        self._filled: list[int] = []                    # per layer: slots filled (held + the last step's overflow)

    def fit(self, *, sliding_window: int | None = None, rotary: torch.nn.Module | None = None,
            padded: bool = False) -> None:
        """Take the model's rotary embedding (LlamaDecoder calls this before each forward). Renumbering the
        positions it keeps, the cache cannot serve padded batches (padding counts real tokens) nor a
        sliding-window model (which drops old positions itself): ValueErrors."""
        if padded:
            raise ValueError("attention_mask (a padded batch) cannot be used with a SinkCache, which drops positions "
                             "and renumbers the rest: feed sequences of one length, without padding")
        if sliding_window is not None:
            raise ValueError(f"a model with sliding_window={sliding_window} drops old positions itself, and a "
                             f"SinkCache would renumber them: use a KVCache")
        if rotary is None or rotary is self.rotary:
            return
        if self.rotary is None and len(self):
            raise ValueError("this SinkCache holds keys cached without a rotary embedding: start a new SinkCache")
        if self.rotary is not None and not torch.equal(self.rotary.inv_freq.cpu(), rotary.inv_freq.cpu()):
            raise ValueError("this SinkCache re-rotates its keys with another rotary embedding (other frequencies) "
                             "than the model's: a cache belongs to one model; start a new SinkCache")
        self.rotary = rotary

    @property
    def capacity(self) -> int:
        """The most positions a layer holds between steps, num_sinks + window."""
        return self.num_sinks + self.window

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held (at most num_sinks + window positions per layer)."""
        return sum(k.shape[0] * k.shape[1] * (k.shape[3] + v.shape[3]) * n * k.element_size()
                   for (k, v), n in zip(self._kv, self._len))

    def _evict(self, layer_idx: int) -> None:
        """Move the last `window` filled slots next to the sinks, with the positions their keys were rotated at."""
        filled, keep = self._filled[layer_idx], self._len[layer_idx]
        if filled > keep:
            for buf in (*self._kv[layer_idx], self._rot[layer_idx]):  # the slots are dim -2 of each
                buf.narrow(-2, self.num_sinks, self.window).copy_(buf.narrow(-2, filled - self.window, self.window).clone())
            self._filled[layer_idx] = keep

    def _check_new_layer(self, k: torch.Tensor, v: torch.Tensor) -> None:
        width = 2 * self.rotary.inv_freq.numel() if self.rotary is not None else k.shape[-1]
        if width != k.shape[-1]:
            raise ValueError(f"rotary turns {width} features, but k of shape {fmt_shape(k.shape)} is {k.shape[-1]} "
                             f"wide: pass the rotary embedding the keys were rotated with")

    def _rerotate(self, k: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """k (B, H_kv, S, Dh) with each position s rotated further by shift[s] (S,) positions."""
        inv_freq = self.rotary.inv_freq.to(device=k.device, dtype=torch.float64)
        angles = shift.to(torch.float64)[:, None] * inv_freq        # (S, Dh/2)
        angles = torch.cat((angles, angles), dim=-1)                # (S, Dh), rotate_half layout
        return apply_rope(k, angles.cos(), angles.sin())            # cast to k's dtype there

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k (B, H_kv, S_new, Dh) and v (B, H_kv, S_new, Dv), rotated at positions seq_len + i.

        Returns what the new tokens attend to: the positions held, then the new ones, (B, H_kv, S, Dh)
        with S <= num_sinks + window + S_new, each key rotated at its index s in that sequence. Then the
        layer keeps the sinks and the last `window` of them; the tensors returned are valid until the
        layer's next update, which moves the kept positions in place.
        """
        if self._check(layer_idx, k, v):
            self._kv.append([None, None])
            self._rot.append(None)
            self._filled.append(0)
        self._evict(layer_idx)
        start, new = self._len[layer_idx], k.shape[2]
        kv = self._kv[layer_idx]
        kv[0], kv[1] = append_rows(kv[0], start, k), append_rows(kv[1], start, v)
        end = start + new
        positions = torch.arange(start, end, device=k.device)[:, None]          # (S_new, 1): as the caller rotated them
        self._rot[layer_idx] = append_rows(self._rot[layer_idx], start, positions)
        self._filled[layer_idx], self._len[layer_idx] = end, min(end, self.capacity)
        k_all, v_all = kv[0].narrow(2, 0, end), kv[1].narrow(2, 0, end)
        shift = torch.arange(end, device=k.device) - self._rot[layer_idx][:end, 0]  # < 0 for keys the window moved
        if self.rotary is not None and bool(shift.any()):
            k_all = self._rerotate(k_all, shift)
        return k_all, v_all
