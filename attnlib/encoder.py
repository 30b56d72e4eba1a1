"""A BERT-style encoder: embeddings, then a stack of blocks of attention and a feed-forward network.

    x_0 = LayerNorm(word[id] + position[pos] + token_type[type])          (B, T, D)
    block (post-LN, as BERT):  h = LN(x + MHA(x)),   x' = LN(h + W_2 GELU(W_1 h))

The encoder drops padding before the layers (attnlib.unpad): outputs and weights at padded
positions are zeros; everything at real positions equals a padded, masked run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnlib import masks as _masks
from attnlib import unpad
from attnlib._checks import fmt_shape, require_dims, require_float_tensor, require_tensor
from attnlib.mha import MultiHeadAttention
from attnlib.positional import LearnedPositional

__all__ = ["Embeddings", "EncoderLayer", "Encoder", "mean_pool"]


class Embeddings(nn.Module):
    """Token ids, positions and token types (each (B, T) or packed (N,) integers) -> (..., D): summed, normalized."""

    def __init__(self, vocab_size: int, d_model: int, max_len: int, type_vocab_size: int = 2, *,
                 eps: float = 1e-12, dropout: float = 0.0) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, d_model)
        self.position = LearnedPositional(max_len, d_model)
        self.token_type = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        """ids, positions, token_types (B, T) -> LayerNorm(word + position + token-type embeddings) (B, T, D)."""
        x = self.word(ids) + self.position(positions) + self.token_type(token_types)  # (..., D)
        return self.dropout(self.norm(x))


class EncoderLayer(nn.Module):
    """One encoder block: self-attention and a GELU feed-forward network, each with a residual.

    post-LN (BERT, default):   h = LN_1(x + MHA(x)),      y = LN_2(h + FFN(h))
    pre-LN (norm_first=True):  h = x + MHA(LN_1(x)),      y = h + FFN(LN_2(h))
    FFN(h) = W_2 GELU(W_1 h + b_1) + b_2, with W_1: D -> d_ff and W_2: d_ff -> D.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, eps: float = 1e-12,
                 dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, need_weights: bool = False):
        """x (B, T, D), mask bool broadcastable to (B, H, T, T), True = may attend -> (B, T, D).

        need_weights=True also returns the attention weights (B, H, T, T).
        """
        def attend(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            out = self.attn(z, mask=mask, need_weights=need_weights)
            return out if need_weights else (out, None)

        y, weights = self.around(x, attend)
        return (y, weights) if need_weights else y

    def around(self, x: torch.Tensor, attend: Callable[[torch.Tensor], tuple]) -> tuple:
        """The block around any self-attention `attend(z) -> (a, weights)`, a shaped like z.

        Everything but attention acts on each token alone, so x may be (B, T, D) or packed (M, D).
        """
        if self.norm_first:
            a, weights = attend(self.norm1(x))
            h = x + self.dropout(a)                                 # residual around attention
            y = h + self.dropout(self.ffn(self.norm2(h)))           # residual around the FFN
        else:
            a, weights = attend(x)
            h = self.norm1(x + self.dropout(a))                     # add, then normalize
            y = self.norm2(h + self.dropout(self.ffn(h)))
        return y, weights


def _check_ids(t: object, name: str, limit: int, what: str) -> torch.Tensor:
    """Return t if it is an integer (B, T) tensor with values in [0, limit)."""
    require_tensor(t, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    require_dims(t, name, 2, "(B, T)")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        raise ValueError(f"{name} holds {bad}, outside {what} [0, {limit})")
    return t


def _same_shape(t: object, name: str, ids: torch.Tensor) -> torch.Tensor:
    require_tensor(t, name)
    if t.shape != ids.shape:
        raise ValueError(f"{name} of shape {fmt_shape(t.shape)} differs from input_ids' shape "
                         f"{fmt_shape(ids.shape)}: both are (B, T)")
    return t


class Encoder(nn.Module):
    """Embeddings and num_layers post-LN blocks (a BertModel without its pooler).

    forward(input_ids, attention_mask=None, *, token_type_ids=None, need_weights=False)
    -> hidden (B, T, D), or (hidden, [weights (B, H, T, T) per layer]).
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int, *,
                 max_len: int = 512, type_vocab_size: int = 2, eps: float = 1e-12, dropout: float = 0.1) -> None:
        super().__init__()
        self.vocab_size, self.max_len, self.type_vocab_size = vocab_size, max_len, type_vocab_size
        self.embeddings = Embeddings(vocab_size, d_model, max_len, type_vocab_size, eps=eps, dropout=dropout)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, eps=eps, dropout=dropout)
                                    for _ in range(num_layers))

    def _check(self, input_ids, attention_mask, token_type_ids):
        """Validate the inputs; return ids, valid (B, T) bool and token types."""
        ids = _check_ids(input_ids, "input_ids", self.vocab_size, "the vocabulary")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"input_ids of shape {fmt_shape(ids.shape)} has T={ids.shape[1]} tokens, more "
                             f"than the position table's max_len={self.max_len}; truncate the input "
                             f"(tokenizer(..., truncation=True))")
        valid = torch.ones_like(ids, dtype=torch.bool)
        if attention_mask is not None:  # from_hf checks 0/1 -> (B, 1, 1, T) bool
            valid = _masks.from_hf(_same_shape(attention_mask, "attention_mask", ids))[:, 0, 0, :]
        types = torch.zeros_like(ids)
        if token_type_ids is not None:
            types = _check_ids(_same_shape(token_type_ids, "token_type_ids", ids), "token_type_ids",
                               self.type_vocab_size, "the token types")
        return ids, valid, types

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                token_type_ids: torch.Tensor | None = None, need_weights: bool = False):
        """input_ids (B, T), attention_mask (B, T) with 1 = real token -> hidden (B, T, D).

        Real tokens keep their positions in the padded input (as in transformers' BERT).
        need_weights=True also returns a list of (B, H, T, T) weights per layer.
        """
        ids, valid, types = self._check(input_ids, attention_mask, token_type_ids)
        B, T = ids.shape
        buckets = unpad.buckets(valid)
        gather, keep = unpad.layout(buckets, T, ids)                                     # (M,) slots
        x = self.embeddings(ids.flatten()[gather], gather % T, types.flatten()[gather])  # (M, D) packed
        weights = []
        for layer in self.layers:
            x, w = layer.around(x, lambda z: unpad.attend_buckets(layer.attn, z, buckets, need_weights))
            weights.append(w)
        hidden = unpad.unpack(x, gather, keep, B, T)                                     # (B, T, D)
        if not need_weights:
            return hidden
        H = self.layers[0].attn.num_heads if self.layers else 0
        return hidden, [unpad.unpack_weights(w, buckets, B, H, T, x) for w in weights]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings (B, D): the mean of hidden (B, T, D) over the real tokens of attention_mask (B, T).

    e_b = Σ_t m_bt h_bt / max(Σ_t m_bt, 1e-9), as sentence-transformers does (an empty row gives zeros).
    """
    require_float_tensor(hidden, "hidden")
    require_dims(hidden, "hidden", 3, "(B, T, D)")
    require_tensor(attention_mask, "attention_mask")
    if attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"attention_mask of shape {fmt_shape(attention_mask.shape)} is not (B, T) = "
                         f"{fmt_shape(hidden.shape[:2])} of hidden {fmt_shape(hidden.shape)}")
    m = _masks.from_hf(attention_mask)[:, 0, 0, :, None].to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)          # (B, D)
