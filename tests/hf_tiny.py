"""Tiny random transformers models of the 2025 architectures, every parameter perturbed (../shared RECIPES).

Freshly initialised norms are exactly 1 (or 0 for the 1 + w kind) and sinks 0: a converter that forgot
one would still agree with transformers. Noise on every parameter makes each one count.
"""

from __future__ import annotations

import torch


BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def tiny(model_cls: type, config_cls: type, seed: int = 0, noise: float = 0.05, **overrides: object) -> torch.nn.Module:
    """model_cls(config_cls(**BASE, **overrides)) in float32, eval mode, eos unset, every parameter + noise."""
    config = config_cls(**{**BASE, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn(p.shape, generator=g))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return model


def left_padded(B: int = 3, T: int = 9, vocab: int = 97, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (B, T) and attention_mask (B, T): row b has 2b pad tokens (id 0) on the left."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for b in range(B):
        mask[b, :2 * b] = 0
    return ids.masked_fill(mask == 0, 0), mask


# Qwen3.5 (text) as shipped, 3 Gated DeltaNet layers per full-attention layer; and with every layer linear
QWEN3_5_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                      linear_value_head_dim=16, linear_conv_kernel_dim=4)
QWEN3_5_HYBRID = dict(QWEN3_5_LINEAR, num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"])
QWEN3_5_ALL_LINEAR = dict(QWEN3_5_LINEAR, num_hidden_layers=3, layer_types=["linear_attention"] * 3)
# DeepSeek-V3.2 with dense MLPs only (first_k_dense_replace = layers) and an indexer keeping 4 keys per query
DEEPSEEK_V32_DENSE = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                          qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=2, index_topk=4, index_n_heads=2,
                          index_head_dim=16)
