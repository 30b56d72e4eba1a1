"""Hybrid decoders: Gated DeltaNet layers (a fixed-size state) mixed with attention layers (a growing KV cache).

Qwen3-Next and Qwen3.5 stack three Gated DeltaNet layers (attnlib.gated_deltanet) for each gated full-attention
layer. attnlib builds such a model as its LlamaDecoder whose blocks hold either attention or a `LinearMixer`
(a GatedDeltaNet in the attention's place), and decodes it from a `HybridCache`: per linear layer a
GatedDeltaNetState of B · (C (K - 1) + H_v Dk Dv) numbers whatever the length, per attention layer its keys
and values, 2 · B · H_kv · Dh numbers per token. After n tokens the cache holds

    L_lin · B · (C (K - 1) + H_v Dk Dv)  +  L_attn · 2 · B · H_kv · Dh · n     numbers,

which grows at the rate of the attention layers only; with no attention layer it does not grow at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from attnlib.caches import KVCache
from attnlib.gated_deltanet import GatedDeltaNet, GatedDeltaNetState

__all__ = ["HybridCache", "LinearMixer"]

_KINDS = ("linear", "attention")


class HybridCache:
    """The cache of a hybrid model (attnlib.caches.Cache's contract): per layer, `kinds[i]` says which it holds.

    "linear" layers keep a GatedDeltaNetState (`state(i, layer, B)`), "attention" layers their keys and values
    in one KVCache, numbered among the attention layers only. `nbytes` = `state_nbytes` + `kv_nbytes`.
    """

    def __init__(self, kinds: Sequence[str]) -> None:
        kinds = tuple(kinds)
        if not kinds or any(kind not in _KINDS for kind in kinds):
            raise ValueError(f"kinds must list one of {_KINDS} per layer, got {kinds!r}")
        self.kinds, self.kv = kinds, KVCache()
        self._slot = {i: n for n, i in enumerate(i for i, kind in enumerate(kinds) if kind == "attention")}
        self._states: dict[int, GatedDeltaNetState] = {}

    def _require(self, layer_idx: int, kind: str) -> None:
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < len(self.kinds):
            raise ValueError(f"layer_idx must be an int in [0, {len(self.kinds)}) for this {len(self.kinds)}-layer "
                             f"cache, got {layer_idx!r}: a cache belongs to one model; use its decoder.make_cache()")
        if self.kinds[layer_idx] != kind:
            raise ValueError(f"layer {layer_idx} of this cache holds {self.kinds[layer_idx]} state, but a layer "
                             f"of kind {kind!r} asked for it: a cache belongs to one model; use its "
                             f"decoder.make_cache()")

    def state(self, layer_idx: int, layer: GatedDeltaNet, batch_size: int) -> GatedDeltaNetState:
        """Linear layer `layer_idx`'s state (a new empty one from `layer` the first time), updated in place."""
        self._require(layer_idx, "linear")
        if layer_idx not in self._states:
            if self.batch_size not in (None, batch_size):
                raise ValueError(f"a batch of B={batch_size} sequences, but the cache holds B={self.batch_size}: "
                                 f"a cache belongs to one batch; start a new one")
            self._states[layer_idx] = layer.empty_state(batch_size)
        return self._states[layer_idx]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append attention layer `layer_idx`'s k, v (B, H_kv, S_new, Dh); return all it holds (B, H_kv, S, Dh)."""
        self._require(layer_idx, "attention")
        return self.kv.update(self._slot[layer_idx], k, v)

    def fit(self, **model: object) -> None:
        """LlamaDecoder's call before each forward, passed on to the keys and values' KVCache."""
        self.kv.fit(**model)

    def get_seq_len(self, layer_idx: int) -> int:
        """Tokens layer `layer_idx` has seen (0 if nothing yet)."""
        if layer_idx in self._slot:
            return self.kv.get_seq_len(self._slot[layer_idx])
        state = self._states.get(layer_idx)
        return 0 if state is None else state.seq_len

    @property
    def seq_len(self) -> int:
        """Tokens layer 0 has seen, which is the next token's position."""
        return self.get_seq_len(0)

    @property
    def batch_size(self) -> int | None:
        """B of the cached sequences (None while empty)."""
        if self._states:
            return next(iter(self._states.values())).recurrent.shape[0]
        return self.kv.batch_size

    def __len__(self) -> int:
        """The number of layers filled."""
        return len(self._states) + len(self.kv)

    @property
    def state_nbytes(self) -> int:
        """Bytes of the linear layers' states, fixed whatever the length."""
        return sum(state.nbytes for state in self._states.values())

    @property
    def kv_nbytes(self) -> int:
        """Bytes of the attention layers' keys and values, 2 · B · H_kv · Dh elements per token and layer."""
        return self.kv.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes held, the states plus the keys and values."""
        return self.state_nbytes + self.kv_nbytes

    def __repr__(self) -> str:
        return (f"HybridCache(layers={list(self.kinds)}, seq_len={self.seq_len}, state_nbytes={self.state_nbytes:,}, "
                f"kv_nbytes={self.kv_nbytes:,})")


class LinearMixer(nn.Module):
    """A GatedDeltaNet in an attention's place in a LlamaBlock (same call signature, no window, no RoPE).

    forward(x, mask, cache=...) runs the layer from the cache's state for it (a HybridCache), or from zeros
    without a cache. mask (B, 1, 1, S), True = real token: the new tokens' padding is zeroed before the layer.
    """

    window = None  # no sliding window
    rotary = None  # no positions: order comes from the recurrence

    def __init__(self, layer: GatedDeltaNet) -> None:
        super().__init__()
        self.layer, self.layer_idx = layer, layer.layer_idx

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = True,
                cache: HybridCache | None = None, rope: object = None, need_weights: bool = False) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D), causal; the layer's state in `cache` updated in place."""
        if need_weights:
            raise ValueError(f"layer {self.layer_idx} is a Gated DeltaNet layer: it has no attention weights to return")
        if cache is not None and not isinstance(cache, HybridCache):
            raise TypeError(f"layer {self.layer_idx} is a Gated DeltaNet layer, whose state a {type(cache).__name__} "
                            f"cannot hold: pass the model's own cache, decoder.make_cache() (a HybridCache)")
        B, T = x.shape[:2]
        valid = None if mask is None else mask[:, 0, 0, -T:]                   # (B, T)
        state = None if cache is None else cache.state(self.layer_idx, self.layer, B)
        return self.layer(x, state, valid=valid)
