"""The encoder-decoder Transformer of Vaswani et al. (2017), assembled from attnlib's parts.

    memory = LN_enc(EncoderLayer_N(... EncoderLayer_1(src)))                 (B, S, D)
    y      = LN_dec(DecoderLayer_M(... DecoderLayer_1(tgt, memory), memory))  (B, T, D)

Each encoder layer is chapter 6's block (self-attention, then a feed-forward network, each with a
residual and a LayerNorm); each decoder layer runs causal self-attention, cross-attention over the
memory, then the feed-forward network. The final LayerNorms are where torch.nn.Transformer has them.
Cached decoding (attnlib.cross_attention.DecoderCache) keeps the self-attention keys and values per
layer in a KVCache and projects the memory to cross-attention keys and values once per source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_float_tensor
from attnlib.cross_attention import DecoderCache, attend_memory, memory_kv
from attnlib.encoder import EncoderLayer
from attnlib.mha import MultiHeadAttention
from attnlib.transformer_torch import copy_torch_weights, torch_config

__all__ = ["Transformer", "DecoderLayer", "feed_forward"]

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


def feed_forward(d_model: int, dim_feedforward: int, activation: str = "relu", dropout: float = 0.0) -> nn.Sequential:
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2, W_1: D -> d_ff, W_2: d_ff -> D, as nn.Transformer's layers."""
    return nn.Sequential(nn.Linear(d_model, dim_feedforward), ACTIVATIONS[activation](), nn.Dropout(dropout),
                         nn.Linear(dim_feedforward, d_model))


class DecoderLayer(nn.Module):
    """One decoder block: causal self-attention, cross-attention over the memory, a feed-forward network.

    post-LN (norm_first=False):  h = LN_1(x + SelfAttn(x)),  g = LN_2(h + CrossAttn(h, m)),  y = LN_3(g + FFN(g))
    pre-LN  (norm_first=True):   h = x + SelfAttn(LN_1 x),   g = h + CrossAttn(LN_2 h, m),   y = g + FFN(LN_3 g)
    """

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, *, activation: str = "relu",
                 dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5, layer_idx: int = 0) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, layer_idx=layer_idx)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = feed_forward(d_model, dim_feedforward, activation, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model, eps=eps) for _ in range(3))
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def sublayer(self, x: torch.Tensor, norm: nn.LayerNorm, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x + dropout(f(LN x)) (pre-LN) or LN(x + dropout(f(x))) (post-LN)."""
        if self.norm_first:
            return x + self.dropout(f(norm(x)))
        return norm(x + self.dropout(f(x)))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, *, tgt_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, cache: DecoderCache | None = None,
                weights: list | None = None) -> torch.Tensor:
        """x (B, T, D), memory (B, S, D) -> (B, T, D). The self-attention is causal (bottom-right with a
        cache) AND tgt_mask; cross-attention uses memory_mask. `weights`, if a list, receives the
        cross-attention weights (B, H, T, S)."""
        kv_cache = cache.self_attn if cache is not None else None
        x = self.sublayer(x, self.norm1, lambda z: self.self_attn(z, mask=tgt_mask, is_causal=True, cache=kv_cache))

        def cross(z: torch.Tensor) -> torch.Tensor:
            if weights is not None:
                out, w = self.cross_attn(z, memory, memory_mask, need_weights=True)
                weights.append(w)
                return out
            if cache is not None:
                return attend_memory(self.cross_attn, z, cache.cross[self.self_attn.layer_idx], memory_mask)
            return self.cross_attn(z, memory, memory_mask)

        x = self.sublayer(x, self.norm2, cross)
        return self.sublayer(x, self.norm3, self.ffn)


def _check_input(x: object, name: str, d_model: int, batch: int | None = None) -> torch.Tensor:
    """x must be a float (B, L, D) tensor with D = d_model (and B = batch when given)."""
    require_float_tensor(x, name)
    if x.dim() != 3 or x.shape[-1] != d_model or (batch is not None and x.shape[0] != batch):
        want = f"(B, L, D) with D={d_model}" + (f" and B={batch}" if batch is not None else "")
        raise ValueError(f"{name} of shape {fmt_shape(x.shape)} is not {want}")
    return x


def _check_named_mask(mask: torch.Tensor | None, name: str, scores: Sequence[int]) -> torch.Tensor | None:
    """attnlib.masks.check_mask, with the argument's name in the message."""
    if mask is None:
        return None
    try:
        return _masks.check_mask(mask, scores)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


class Transformer(nn.Module):
    """The encoder-decoder: forward(src, tgt) = decode(tgt, encode(src)) on embedded inputs.

    src (B, S, D) and tgt (B, T, D) are embeddings (positions added); masks are bool, True = may
    attend, broadcastable to (B, H, S, S) (src_mask), (B, H, T, T) (tgt_mask, ANDed with the causal
    mask) and (B, H, T, S) (memory_mask); a padding mask is (B, 1, 1, L). Equal to
    torch.nn.Transformer(batch_first=True) on the same weights (Transformer.from_torch).
    """

    def __init__(self, d_model: int, num_heads: int, num_encoder_layers: int, num_decoder_layers: int,
                 dim_feedforward: int, dropout: float = 0.0, *, activation: str = "relu",
                 norm_first: bool = False, layer_norm_eps: float = 1e-5) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        for name, n in (("num_encoder_layers", num_encoder_layers), ("num_decoder_layers", num_decoder_layers),
                        ("dim_feedforward", dim_feedforward)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        self.d_model, self.num_heads = d_model, num_heads
        self.encoder = nn.ModuleList(EncoderLayer(d_model, num_heads, dim_feedforward, eps=layer_norm_eps,
                                                  dropout=dropout, norm_first=norm_first)
                                     for _ in range(num_encoder_layers))
        for layer in self.encoder:  # chapter 6's block, with nn.Transformer's choice of activation
            layer.ffn = feed_forward(d_model, dim_feedforward, activation, dropout)
        self.encoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.decoder = nn.ModuleList(DecoderLayer(d_model, num_heads, dim_feedforward, activation=activation,
                                                  dropout=dropout, norm_first=norm_first, eps=layer_norm_eps,
                                                  layer_idx=i) for i in range(num_decoder_layers))
        self.decoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S, D) -> memory (B, S, D); src_mask broadcastable to (B, H, S, S)."""
        B, S, _ = _check_input(src, "src", self.d_model).shape
        src_mask = _check_named_mask(src_mask, "src_mask", (B, self.num_heads, S, S))
        for layer in self.encoder:
            src = layer(src, src_mask)
        return self.encoder_norm(src)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, *, tgt_mask: torch.Tensor | None = None,
               memory_mask: torch.Tensor | None = None, cache: DecoderCache | None = None,
               need_weights: bool = False):
        """tgt (B, T, D), memory (B, S, D) -> (B, T, D); with need_weights, also the cross-attention
        weights [(B, H, T, S) per layer].

        With a DecoderCache, tgt holds the T new positions only: they attend to every cached one, and
        tgt_mask covers the cached positions too, (B, H, T, S_past + T).
        """
        B, T, _ = _check_input(tgt, "tgt", self.d_model).shape
        S = _check_input(memory, "memory", self.d_model, batch=B).shape[1]
        if cache is not None and not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be an attnlib.cross_attention.DecoderCache, got {type(cache).__name__}")
        past = cache.seq_len if cache is not None else 0
        tgt_mask = _check_named_mask(tgt_mask, "tgt_mask", (B, self.num_heads, T, past + T))
        memory_mask = _check_named_mask(memory_mask, "memory_mask", (B, self.num_heads, T, S))
        if cache is not None and not cache.cross:
            cache.cross = [memory_kv(layer.cross_attn, memory) for layer in self.decoder]
        elif cache is not None and cache.cross[0][0].shape[::2] != (B, S):
            raise ValueError(f"memory of shape {fmt_shape(memory.shape)} is not the source this cache was "
                             f"started with, (B, S) = {fmt_shape(cache.cross[0][0].shape[::2])}: "
                             f"start a new DecoderCache() for a new source")
        weights = [] if need_weights else None
        for layer in self.decoder:
            tgt = layer(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, cache=cache, weights=weights)
        y = self.decoder_norm(tgt)
        return (y, weights) if need_weights else y

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, src_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S, D), tgt (B, T, D) -> (B, T, D): decode(tgt, encode(src, src_mask), ...)."""
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask=tgt_mask, memory_mask=memory_mask)

    @classmethod
    def from_torch(cls, m: nn.Transformer) -> Transformer:
        """A copy of an nn.Transformer(batch_first=True)'s weights; what attnlib does not model is a ValueError."""
        ours = cls(**torch_config(m))
        weight = m.encoder.norm.weight
        ours = ours.to(device=weight.device, dtype=weight.dtype)
        copy_torch_weights(m, ours)
        return ours.train(m.training)
