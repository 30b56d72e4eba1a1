"""transformers' Qwen3.5 (text) and DeepSeek-V3.2 causal LMs as attnlib LlamaDecoders, weights copied (attnlib.from_hf).

Both keep Llama's pre-norm block, x + Mixer(RMSNorm(x)) then + SwiGLU(RMSNorm(·)); only the mixer differs:

- Qwen3.5: per config.layer_types, a Gated DeltaNet layer (attnlib.hybrid.LinearMixer) or gated full attention
  (attnlib.variants' Qwen3_5Attention converter); its RMSNorms multiply by 1 + w. Decodes from a HybridCache.
- DeepSeek-V3.2: DeepSeek Sparse Attention (`SparseMixer`: MLA over the keys the lightning indexer picks) in every
  layer, dense MLPs only (a mixture-of-experts layer is refused by name). Decodes from an IndexedLatentCache.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attnlib.caches import Cache
from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import LlamaBlock
from attnlib.gated_deltanet import GatedDeltaNet
from attnlib.hybrid import HybridCache, LinearMixer
from attnlib.sparse_attention import DeepSeekSparseAttention, IndexedLatentCache
from attnlib.variants.hf_attention import ATTENTION_CONVERTERS
from attnlib.variants.hf_models import MODEL_LAYOUTS, _mlp, assemble_decoder

__all__ = ["SparseMixer", "qwen3_5", "deepseek_v32", "HYBRID_CONVERTERS"]


class SparseMixer(nn.Module):
    """DeepSeekSparseAttention in an attention's place in a LlamaBlock: its own RoPE and positions (from the cache)."""

    window = None
    rotary = None  # the MLA inside rotates its own queries and keys

    def __init__(self, dsa: DeepSeekSparseAttention) -> None:
        super().__init__()
        self.dsa, self.layer_idx = dsa, dsa.mla.layer_idx

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, is_causal: bool = True,
                cache: IndexedLatentCache | None = None, rope: object = None,
                need_weights: bool = False) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D), causal, over the cache's latents and indexer keys (appended to)."""
        if need_weights or (mask is not None and not bool(mask.all())):
            raise ValueError("a DeepSeek-V3.2 model here takes unpadded batches (attention_mask all ones) and returns "
                             "no attention weights: its sparse attention numbers positions from the cache")
        return self.dsa(x, cache)


def _assemble(model: nn.Module, mixers: list[nn.Module], *, norm_offset: float = 0.0,
              cache_factory: Callable[[], Cache] | None = None) -> LlamaDecoder:
    """A LlamaDecoder of pre-norm blocks around `mixers` (one per layer), with model's MLPs, norms (+ norm_offset),
    embeddings and head copied."""
    c, inner = model.config, model.model
    blocks = [LlamaBlock(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, layer_idx=i,
                         rotary=None, eps=c.rms_norm_eps, attention_bias=False, mlp_bias=False, attn=mixer,
                         mlp=_mlp(layer, c)) for i, (mixer, layer) in enumerate(zip(mixers, inner.layers))]
    return assemble_decoder(model, blocks, MODEL_LAYOUTS["pre"]["names"], norm_offset=norm_offset,
                            cache_factory=cache_factory)


def qwen3_5(model: nn.Module) -> LlamaDecoder:
    """Qwen3_5ForCausalLM: Gated DeltaNet and gated full-attention layers as config.layer_types says, (1 + w) norms."""
    kinds, mixers, rotaries = [], [], {}
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer, "linear_attn"):
            kinds.append("linear")
            mixers.append(LinearMixer(GatedDeltaNet.from_hf(layer.linear_attn)))
        else:
            kinds.append("attention")
            mixers.append(ATTENTION_CONVERTERS[type(layer.self_attn).__name__](layer.self_attn, rotaries))
    return _assemble(model, mixers, norm_offset=1.0, cache_factory=functools.partial(HybridCache, kinds))


def deepseek_v32(model: nn.Module) -> LlamaDecoder:
    """DeepseekV32ForCausalLM with dense MLPs: DeepSeek Sparse Attention in every layer (tie_break as transformers)."""
    mixers = [SparseMixer(DeepSeekSparseAttention.from_hf(layer.self_attn)) for layer in model.model.layers]
    return _assemble(model, mixers, cache_factory=IndexedLatentCache)


HYBRID_CONVERTERS: dict[str, Any] = {"Qwen3_5ForCausalLM": qwen3_5, "DeepseekV32ForCausalLM": deepseek_v32}
