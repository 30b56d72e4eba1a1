"""Reading DeepSeek's multi-head latent attention weights (transformers' DeepseekV3Attention, and
V3.2's, which shares its parameter names) into attnlib.MultiHeadLatentAttention.

When config.rope_interleave is set (DeepSeek-V3's default, always in V3.2), transformers keeps the rotary
features of a query or key interleaved, pairs (0, 1), (2, 3), ...; attnlib's RoPE turns halves, pair (i, i + D_R/2). Copying permutes those projection rows once, so the
copy computes the same attention with attnlib's rotation. MultiHeadLatentAttention.from_hf calls this
(importing it when called: this module imports attnlib.mla).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib.mla import MultiHeadLatentAttention

__all__ = ["copy_deepseek", "deinterleave_rope_rows"]

# attnlib's parameter -> DeepseekV3Attention's
_NAMES = {"q_proj": "q_proj", "q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj",
          "kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "out": "o_proj"}


def copy_deepseek(cls: type[MultiHeadLatentAttention], attn: nn.Module, *,
                  rope_interleave: bool) -> MultiHeadLatentAttention:
    """A `cls` with a DeepSeek MLA module's sizes and weights (same dtype, device and training mode), without
    checking attn's class: any module with V3's parameter names (V3.2's too).

    A RoPE other than the plain one (attn.config.rope_parameters' rope_type) and fewer key/value heads than
    query heads (attn.config.num_key_value_heads) are ValueErrors.
    """
    c = attn.config
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"attn.config.rope_parameters: only plain RoPE is modelled, got rope_type={rope.get('rope_type')!r} (YaRN "
                         f"rescales the angles and the softmax scale)")
    if c.num_key_value_heads != c.num_attention_heads:
        raise ValueError(f"attn.config.num_key_value_heads={c.num_key_value_heads} differs from num_attention_heads="
                         f"{c.num_attention_heads}: MLA rebuilds a key and a value for every head")
    ours = cls(c.hidden_size, c.num_attention_heads, kv_lora_rank=c.kv_lora_rank,
               qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
               v_head_dim=c.v_head_dim, q_lora_rank=c.q_lora_rank, bias=c.attention_bias,
               eps=attn.kv_a_layernorm.variance_epsilon, rope_base=rope.get("rope_theta", 10000.0),
               max_position_embeddings=c.max_position_embeddings, layer_idx=attn.layer_idx)
    weight = attn.kv_b_proj.weight
    ours.to(device=weight.device, dtype=weight.dtype)
    theirs = attn.state_dict()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            module, kind = name.split(".")
            param.copy_(theirs[f"{_NAMES[module]}.{kind}"])
        if rope_interleave:
            deinterleave_rope_rows(ours)
    return ours.train(attn.training)


def deinterleave_rope_rows(mla: MultiHeadLatentAttention) -> None:
    """Reorder the rotary output rows of mla's query and kv_down projections from pairs (0, 1), (2, 3), ...
    to halves (0, 2, ..., 1, 3, ...), in place."""
    with torch.no_grad():
        D_R, nope = mla.rope_dim, mla.nope_dim
        order = torch.cat((torch.arange(0, D_R, 2), torch.arange(1, D_R, 2)))
        q = mla.q_proj if mla.q_lora_rank is None else mla.q_up
        rows = q.weight.unflatten(0, (mla.num_heads, nope + D_R))           # (H, D_h + D_R, in)
        rows[:, nope:] = rows[:, nope:][:, order]
        kv = mla.kv_down
        for t in (kv.weight, kv.bias) if kv.bias is not None else (kv.weight,):
            t[mla.kv_lora_rank:] = t[mla.kv_lora_rank:][order]
