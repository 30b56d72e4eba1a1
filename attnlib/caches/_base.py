"""What the caches of attnlib.caches share: the contract every cache keeps, its checks, a growing buffer.

The contract (the one `MultiHeadAttention`, `LlamaDecoder` and `generate` rely on): layers are filled in
order; `update(layer_idx, k, v) -> (k_all, v_all)` appends k, v (B, H_kv, S_new, Dh) and returns what
the new queries attend to; `seq_len` is layer 0's length, the positions it holds, where the next
token's position starts (a cache that drops positions, as SinkCache, counts what it keeps),
`get_seq_len(layer_idx)` one layer's, `batch_size` is B, `len(cache)` the number of layers filled,
and `nbytes` the bytes of what the cache holds now.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from attnlib._checks import fmt_shape, require_float_tensor

__all__ = ["Cache", "check_cache", "LayeredCache", "append_rows"]


@runtime_checkable
class Cache(Protocol):
    """What a cache for a whole model promises: the one contract attention layers, LlamaDecoder and
    `generate(..., cache=...)` rely on. KVCache keeps it; so does any other cache (a sink, paged or
    quantized one), whatever it stores inside. No caller reaches into a cache's private buffers.

    - `update(layer_idx, k, v) -> (k_all, v_all)`: take the new positions' k (B, H_kv, S_new, Dh) and
      v (B, H_kv, S_new, Dv) of layer `layer_idx` (layers are filled in order, 0 first) and return
      the keys and values that the layer's new queries attend to, (B, H_kv, S, Dh) and (..., Dv),
      the new ones last.
    - `seq_len`: the next token's position (layer 0's count): the positions seen so far, or, for a
      cache that renumbers what it keeps (SinkCache), the positions it holds.
    - `get_seq_len(layer_idx)`: the same for one layer (0 if it has nothing yet).
    - `batch_size`: B of the cached sequences, None while empty.
    - `len(cache)`: the number of layers filled.
    - `nbytes`: bytes of the keys and values held now (what is kept, scales included).

    A cache that must know the model it serves also has `fit(*, sliding_window, rotary, padded)`,
    which LlamaDecoder calls before each forward: KVCache rolls with the model's sliding window,
    SinkCache re-rotates the keys it keeps with the model's rotary embedding.
    """

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def seq_len(self) -> int: ...

    def get_seq_len(self, layer_idx: int) -> int: ...

    @property
    def batch_size(self) -> int | None: ...

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


def check_cache(cache: object, num_layers: int, B: int) -> int:
    """Positions `cache` holds for a model of num_layers layers fed a batch of B sequences (0 for None);
    a TypeError for an object without the Cache contract, a ValueError for another model's or batch's."""
    if cache is None:
        return 0
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be an attnlib.KVCache, got {type(cache).__name__} (or another cache that "
                        f"keeps attnlib.caches.Cache's contract: update, seq_len, get_seq_len, batch_size, "
                        f"len, nbytes)")
    new = f"start a new {type(cache).__name__}"
    if len(cache) not in (0, num_layers):
        raise ValueError(f"the cache holds {len(cache)} layers but this decoder has {num_layers}: "
                         f"a cache belongs to one model; {new}")
    if len(cache) and cache.batch_size != B:
        raise ValueError(f"the cache holds a batch of B={cache.batch_size} sequences, got input_ids "
                         f"with B={B}: a cache belongs to one batch; {new}")
    if len({cache.get_seq_len(i) for i in range(len(cache))}) > 1:
        raise ValueError(f"the cache's layers hold different lengths (an earlier call failed "
                         f"half-way); {new}")
    return cache.seq_len


def append_rows(buffer: torch.Tensor | None, length: int, x: torch.Tensor) -> torch.Tensor:
    """Write x (..., n, W) after the first `length` rows of buffer (..., capacity, W) (dim -2).

    Returns the buffer, or a new one of twice the needed capacity (the rows kept) when x does not fit,
    so that appending one row copies one row.
    """
    n = x.shape[-2]
    if buffer is None or length + n > buffer.shape[-2]:
        grown = x.new_empty(*x.shape[:-2], max(2 * (length + n), 16), x.shape[-1])
        if length:
            grown.narrow(-2, 0, length).copy_(buffer.narrow(-2, 0, length))
        buffer = grown
    buffer.narrow(-2, length, n).copy_(x)  # buffer[..., length:length + n, :] = x
    return buffer


class LayeredCache:
    """The bookkeeping of a cache for a whole model: per layer, the positions held and the layout
    (leading dims such as (B, H_kv), widths, dtype) that every later update must keep."""

    _expected = "(B, H_kv, S_new, Dh)"  # the shape update() takes, named in errors
    _names = ("k", "v")

    def __init__(self) -> None:
        self._len: list[int] = []        # per layer: positions held now
        self._layout: list[tuple] = []   # per layer: (leading dims, width of a, width of b, dtype)

    def __len__(self) -> int:
        """The number of layers filled."""
        return len(self._len)

    @property
    def batch_size(self) -> int | None:
        """B of the cached sequences (None for an empty cache)."""
        return self._layout[0][0][0] if self._layout else None

    @property
    def seq_len(self) -> int:
        """Positions held by layer 0 (0 for an empty cache): the next token's position."""
        return self._len[0] if self._len else 0

    def get_seq_len(self, layer_idx: int) -> int:
        """Positions held by one layer (0 if that layer has nothing yet)."""
        return self._len[layer_idx] if 0 <= layer_idx < len(self._len) else 0

    def _check(self, layer_idx: int, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Raise unless (a, b) can be appended to layer `layer_idx`; return True for a new layer."""
        name_a, name_b = self._names
        dims = self._expected.count(",") + 1
        for name, t in ((name_a, a), (name_b, b)):
            require_float_tensor(t, name)
            if t.dim() != dims:
                raise ValueError(f"{name} of shape {fmt_shape(t.shape)} is not {self._expected}")
        if a.shape[:-1] != b.shape[:-1]:
            raise ValueError(f"{name_a} of shape {fmt_shape(a.shape)} and {name_b} of shape {fmt_shape(b.shape)} "
                             f"differ in ({self._expected[1:].rsplit(',', 1)[0]})")
        if a.dtype != b.dtype:
            raise TypeError(f"{name_a} is {a.dtype} but {name_b} is {b.dtype}: cache them in one dtype")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx <= len(self):
            raise ValueError(f"layer_idx must be an int in [0, {len(self)}] (layers are filled in order), "
                             f"got {layer_idx!r}")
        layout = (tuple(a.shape[:-2]), a.shape[-1], b.shape[-1], a.dtype)
        if layer_idx == len(self):
            if self._layout and layout[0][0] != self.batch_size:
                raise ValueError(f"{name_a} of shape {fmt_shape(a.shape)} has B={layout[0][0]}, but the cache "
                                 f"holds a batch of B={self.batch_size}: start a new {type(self).__name__}()")
            self._check_new_layer(a, b)
            self._layout.append(layout)
            self._len.append(0)
            return True
        held, new = self._layout[layer_idx], type(self).__name__
        if layout[3] != held[3]:
            raise TypeError(f"the cache of layer {layer_idx} holds {held[3]}, got {layout[3]}: a cache "
                            f"belongs to one model; start a new {new}()")
        if layout != held:
            raise ValueError(f"the cache of layer {layer_idx} holds leading dims {held[0]} and widths "
                             f"{held[1:3]}, got {name_a} of shape {fmt_shape(a.shape)} and {name_b} of shape "
                             f"{fmt_shape(b.shape)}: a cache belongs to one batch and one model; start a new {new}()")
        return False

    def _check_new_layer(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Raise if a cache cannot hold a new layer of this kind (nothing to check here)."""

    def __repr__(self) -> str:
        if not self._len:
            return f"{type(self).__name__}(empty)"
        lead, w_a, w_b, _ = self._layout[0]
        return (f"{type(self).__name__}(layers={len(self)}, seq_len={self.seq_len}, leading dims={lead}, "
                f"widths=({w_a}, {w_b}), nbytes={self.nbytes:,})")
