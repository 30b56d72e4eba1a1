"""Independent sequences of a PagedKVCache run through a decoder together, each at its own length:
the batch a continuous-batching server (attnlib.serve) forms at every iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attnlib._checks import fmt_shape, require_float_tensor

if TYPE_CHECKING:
    from attnlib.caches.paged import PagedKVCache

__all__ = ["PagedBatch"]


class PagedBatch:
    """Sequences of a PagedKVCache, each at its own length L_b, as one left-padded batch: the Cache
    contract for one decoder forward over new tokens (B, T).

    Row b reads as past - L_b padding slots, then its L_b cached positions, then its T new ones, where
    past = max_b L_b: `seq_len` is past, and `attention_mask(T)` (B, past + T), 1 = real token, is what
    the decoder needs, so that each row's positions (the count of real tokens before it) and keys are
    its own. A padding slot reads the row's position 0 (a finite value the mask hides). new_lengths
    (n_b <= T per row, default all T) lets the rows' new tokens differ in number too, left-padded to T
    (several prompts prefilled in one forward): only row b's last n_b new tokens are real and cached.
    """

    def __init__(self, cache: PagedKVCache, seqs: list[int], new_lengths: list[int] | None = None) -> None:
        if not seqs:
            raise ValueError("seqs is empty: a batch needs at least one sequence")
        if new_lengths is not None and (len(new_lengths) != len(seqs) or min(new_lengths) < 1):
            raise ValueError(f"new_lengths must hold one count >= 1 per sequence ({len(seqs)}), got {new_lengths}")
        self._cache, self._seqs = cache, seqs
        self._n = None if new_lengths is None else torch.tensor(new_lengths)   # (B,) n_b, None: all T
        self._lens = torch.tensor([cache.sequence_length(s) for s in seqs])    # (B,) L_b
        self._past = int(self._lens.max())
        self._new = [0] * len(cache._pools)                                     # per layer: positions appended
        self._read: torch.Tensor | None = None                                  # (B, past + T) slots

    @property
    def batch_size(self) -> int:
        return len(self._seqs)

    def __len__(self) -> int:
        """The layers the pool has filled."""
        return len(self._new)

    @property
    def seq_len(self) -> int:
        """past = the longest sequence's length (before this forward's new tokens, on layer 0 after them)."""
        return self.get_seq_len(0)

    def get_seq_len(self, layer_idx: int) -> int:
        return self._past + self._new[layer_idx] if 0 <= layer_idx < len(self._new) else 0

    @property
    def nbytes(self) -> int:
        """Bytes of these sequences' keys and values."""
        per_position = sum(k.shape[2] * (k.shape[3] + v.shape[3]) * k.element_size() for k, v in self._cache._pools)
        appended = self._new[0] if self._new else 0
        return (int(self._lens.sum()) + len(self._seqs) * appended) * per_position

    def attention_mask(self, new_tokens: int) -> torch.Tensor:
        """(B, past + new_tokens) long, 1 = real token: each row's padding first (and before its new tokens,
        with new_lengths)."""
        columns = torch.arange(self._past + new_tokens)
        real = columns >= (self._past - self._lens)[:, None]                    # (B, past + T)
        if self._n is not None:
            real &= (columns < self._past) | (columns >= self._past + new_tokens - self._n[:, None])
        return real.long()

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k (B, H_kv, T, Dh), v (B, H_kv, T, Dv) at positions L_b .. L_b + T - 1 of each sequence;
        return each row's keys and values, left-padded: (B, H_kv, past + T, Dh) and (..., Dv)."""
        for name, t in (("k", k), ("v", v)):
            require_float_tensor(t, name)
            if t.dim() != 4 or t.shape[0] != len(self._seqs) or t.shape[2] != k.shape[2]:
                raise ValueError(f"{name} of shape {fmt_shape(t.shape)} is not (B, H_kv, T, Dh) with "
                                 f"B={len(self._seqs)} sequences and T={k.shape[2]}")
        T = k.shape[2]
        if layer_idx == 0 and self._new and self._new[0]:
            raise ValueError("a PagedBatch serves one forward: take cache.batch(seqs) again for the next one")
        if layer_idx == len(self._cache._pools):
            self._cache._add_layer(k, v)
            self._new.append(0)
        if self._read is None:                                # layer 0: take blocks, map slots once
            self._map_slots(T)
        out = []
        for pool, x in zip(self._cache._pools[layer_idx], (k, v)):
            flat = pool.view(-1, *pool.shape[2:])             # (capacity · block_size, H_kv, Dh)
            flat[self._write] = x.transpose(1, 2)[self._real]  # (real tokens, H_kv, Dh) into their slots
            out.append(flat[self._read].transpose(1, 2))      # (B, past + T, H_kv, Dh) -> (B, H_kv, past + T, Dh)
        self._new[layer_idx] += T
        return out[0], out[1]

    def _map_slots(self, T: int) -> None:
        """The pool slots the real new tokens go to, and the (B, past + T) slots each row reads."""
        n = torch.full_like(self._lens, T) if self._n is None else self._n    # (B,) real new tokens
        self._real = torch.arange(T) >= (T - n)[:, None]                      # (B, T): the real ones
        self._write = torch.cat([self._cache._sequence_slots(s, L + torch.arange(m))
                                 for s, L, m in zip(self._seqs, self._lens.tolist(), n.tolist())])
        pad = (self._past - self._lens)[:, None] + torch.where(torch.arange(self._past + T) >= self._past, T - n[:, None], 0)
        read = (torch.arange(self._past + T) - pad).clamp(min=0)                    # (B, past + T) positions
        self._read = torch.stack([self._cache._sequence_slots(s, p) for s, p in zip(self._seqs, read)])
        for s, L, m in zip(self._seqs, self._lens.tolist(), n.tolist()):
            self._cache._lengths[s] = L + m
