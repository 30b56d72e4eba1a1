"""A Llama-style decoder: pre-norm blocks of RMSNorm, rotary grouped-query attention and SwiGLU.

    h = x + Attn(RMSNorm(x)),   out = h + SwiGLU(RMSNorm(h)),   logits = RMSNorm(out_L) W_vocab

Attention is attnlib's MultiHeadAttention with H query heads and H_kv key/value heads (GQA) whose
queries and keys are rotated by RoPE; a cache (attnlib.caches.Cache: KVCache or any other) carries
the keys and values of earlier tokens. `LlamaDecoder.from_hf(model)` copies a transformers
LlamaForCausalLM's weights, or a MistralForCausalLM's: the same layout, with a sliding window (each
token attends to the last `sliding_window` positions, itself included). W_vocab is the embedding
matrix itself when the model ties them. The blocks and their parts (RMSNorm, SwiGLU, LlamaBlock) are
in attnlib.llama_block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_tensor
from attnlib._hf_llama import copy_from_hf
from attnlib.caches import Cache, KVCache, SinkCache, check_cache
from attnlib.caches.layer_windows import LayerWindowCache
from attnlib.llama_block import LlamaBlock, RMSNorm, column_major
from attnlib.positional import RotaryEmbedding

__all__ = ["LlamaDecoder", "check_token_ids"]


def check_token_ids(input_ids: object) -> torch.Tensor:
    """Return input_ids if it is a (B, T) integer tensor with T >= 1, else raise ValueError."""
    require_tensor(input_ids, "input_ids")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.is_floating_point() \
            or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids of shape {fmt_shape(input_ids.shape)} and dtype {input_ids.dtype} "
                         f"is not (B, T) integer token ids with T >= 1")
    return input_ids


class LlamaDecoder(nn.Module):
    """A decoder-only language model in Llama's layout: token ids (B, T) -> logits (B, T, vocab).

    tie_word_embeddings: lm_head uses the embedding matrix itself (vocab, D), as GPT-2, SmolLM2 and
    Llama 3.2 do (Press and Wolf, 2017): one (vocab, D) matrix fewer. sliding_window=W: each token
    attends to the last W positions, itself included (Mistral); a KVCache it fills keeps only those.

    The 2025 layouts (attnlib.from_hf) reuse it through options: `blocks`, the L blocks built by the
    caller (LlamaBlocks whose attention may be an attnlib.variants module, each with its own rotary
    embedding or none, and its own window); `embed_scale` multiplies the embeddings (Gemma: sqrt(D));
    `logit_softcap` c squashes the logits to c · tanh(logits / c) (Gemma 2/3's final softcapping);
    `cache_factory` makes the cache `make_cache` returns (attnlib.hybrid.HybridCache for a hybrid model).
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int,
                 num_kv_heads: int, d_ff: int, *, max_position_embeddings: int = 2048,
                 rope_base: float = 10000.0, eps: float = 1e-6, attention_bias: bool = False,
                 mlp_bias: bool = False, tie_word_embeddings: bool = False,
                 sliding_window: int | None = None, blocks: list[nn.Module] | None = None,
                 embed_scale: float = 1.0, logit_softcap: float | None = None,
                 cache_factory: Callable[[], Cache] | None = None) -> None:
        super().__init__()
        if blocks is None and (num_heads < 1 or d_model % num_heads):  # RoPE needs Dh before the blocks exist
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                             f"each head gets Dh = d_model / num_heads")
        if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                           or sliding_window < 1):
            raise ValueError(f"sliding_window must be an int >= 1 (the positions a token attends to, itself "
                             f"included) or None, got {sliding_window!r}")
        if blocks is not None and len(blocks) != num_layers:
            raise ValueError(f"blocks holds {len(blocks)} blocks, not num_layers={num_layers}")
        self.max_position_embeddings, self.sliding_window = max_position_embeddings, sliding_window
        self.embed_scale, self.logit_softcap, self.cache_factory = embed_scale, logit_softcap, cache_factory
        # one rotary embedding for every layer, or none when the blocks bring their own
        self.rotary = RotaryEmbedding(d_model // num_heads, max_position_embeddings, rope_base) if blocks is None else None
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(blocks if blocks is not None else (
            LlamaBlock(d_model, num_heads, num_kv_heads, d_ff, layer_idx=i, rotary=self.rotary, eps=eps,
                       attention_bias=attention_bias, mlp_bias=mlp_bias, window=sliding_window)
            for i in range(num_layers)))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for m in self.modules():  # every matrix a token is multiplied by, stored column-major
            if isinstance(m, (nn.Linear, nn.Embedding)) and not (tie_word_embeddings and m is self.lm_head):
                m.weight = nn.Parameter(column_major(m.weight.detach()))
        if tie_word_embeddings:
            self.lm_head.weight = self.embed.weight                    # one Parameter, (vocab, D)

    @property
    def is_llama(self) -> bool:
        """True for Llama's own layout (one rotary embedding, default blocks, no embedding scale or softcap):
        what generate's one-token fast path (attnlib.decode_step) computes."""
        return self.rotary is not None and self.embed_scale == 1.0 and self.logit_softcap is None

    def make_cache(self) -> Cache:
        """The cache generate fills by default: cache_factory()'s if given; else a KVCache (rolling under this
        model's sliding window), or, when the blocks have windows of their own, a LayerWindowCache."""
        if self.cache_factory is not None:
            return self.cache_factory()
        windows = [getattr(block.attn, "window", None) for block in self.blocks]
        if self.sliding_window is not None or all(w is None for w in windows):
            return KVCache(sliding_window=self.sliding_window)
        return LayerWindowCache(windows)

    @property
    def tie_word_embeddings(self) -> bool:
        return self.lm_head.weight is self.embed.weight

    def _positions(self, B: int, T: int, past: int, attention_mask: torch.Tensor | None,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """positions (T,) or (B, T) of the new tokens and the padding mask (B, 1, 1, past + T) or None.

        With an attention_mask, a token's position is the number of real tokens before it, so left
        padding shifts nothing; padded slots get position 0 and are never attended to.
        """
        if attention_mask is None:
            last, positions, mask = past + T - 1, torch.arange(past, past + T, device=device), None
        else:
            require_tensor(attention_mask, "attention_mask")
            if tuple(attention_mask.shape) != (B, past + T):
                raise ValueError(f"attention_mask of shape {fmt_shape(attention_mask.shape)} is not (B, "
                                 f"T_total) = ({B}, {past + T}): {past} cached + {T} new tokens")
            mask = _masks.from_hf(attention_mask)                      # (B, 1, 1, past + T)
            count = mask[:, 0, 0].long().cumsum(dim=-1)                # real tokens up to each slot
            positions = (count[:, past:] - 1).clamp(min=0)             # (B, T)
            last = int(count[:, -1].max()) - 1
        if last >= self.max_position_embeddings:
            raise ValueError(f"position {last} is beyond max_position_embeddings="
                             f"{self.max_position_embeddings}: {past} cached + {T} new tokens do not fit")
        return positions, mask

    def forward(self, input_ids: torch.Tensor, cache: Cache | None = None, *,
                attention_mask: torch.Tensor | None = None, last_only: bool = False,
                need_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids (B, T) -> logits (B, T, vocab) (or (B, 1, vocab) for the last token, last_only).

        With a cache, the T tokens continue the cached ones (positions from cache.seq_len) and
        their keys and values are appended. attention_mask (B, past + T), 1 = real token.
        need_weights=True also returns each layer's attention weights (B, H, T, S): (logits, [L of them]).
        """
        B, T = check_token_ids(input_ids).shape
        (lo, hi), V = (int(m) for m in torch.aminmax(input_ids)), self.embed.num_embeddings
        if lo < 0 or hi >= V:
            raise ValueError(f"input_ids holds token id {lo if lo < 0 else hi}, outside [0, vocab_size={V})")
        past = check_cache(cache, len(self.blocks), B)
        if self.rotary is None and isinstance(cache, SinkCache):
            raise ValueError("a SinkCache re-rotates its keys with one rotary embedding for all layers; this "
                             "model's layers have their own (or none): use a KVCache")
        if hasattr(cache, "fit"):  # a cache that must know the model: a KVCache its window, a SinkCache its RoPE
            cache.fit(sliding_window=self.sliding_window, rotary=self.rotary, padded=attention_mask is not None)
        positions, mask = self._positions(B, T, past, attention_mask, input_ids.device)
        x, weights = self.embed(input_ids), [] if need_weights else None  # (B, T, D)
        if self.embed_scale != 1.0:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)  # rounded to x's dtype first, as transformers
        tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # (cos, sin) (T, Dh) or (B, T, Dh) per rotary
        for block in self.blocks:
            rotary = self.rotary if self.rotary is not None else block.attn.rotary
            if rotary is not None and id(rotary) not in tables:
                tables[id(rotary)] = rotary.cos_sin(positions)
            x = block(x, mask, cache, None if rotary is None else tables[id(rotary)], weights)
        logits = self.lm_head(self.norm(x[:, -1:] if last_only else x))  # (B, T or 1, vocab)
        if self.logit_softcap is not None:
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return (logits, weights) if need_weights else logits

    @classmethod
    def from_hf(cls, model: nn.Module) -> LlamaDecoder:
        """A LlamaDecoder holding a copy of a transformers LlamaForCausalLM's or MistralForCausalLM's weights
        (same dtype), tied as the model ties them, with Mistral's sliding window."""
        return copy_from_hf(cls, model)
