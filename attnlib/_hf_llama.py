"""A transformers LlamaForCausalLM or MistralForCausalLM in LlamaDecoder's terms: its constructor arguments
from the config, and where each of its parameters lives in the model's state dict (the same names in both)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}
_RENAMED = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
            "attn.out": "self_attn.o_proj", "mlp.down": "mlp.down_proj"}
_STACKED = {"attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj")}


def hf_tensor(theirs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The transformers tensor for our parameter `name`; qkv and gate_up are theirs stacked by rows."""
    if name in _TOP:
        return theirs[_TOP[name]]
    _, i, rest = name.split(".", 2)                                    # blocks.<i>.<module>.<kind>
    module, kind = rest.rsplit(".", 1)
    prefix = f"model.layers.{i}."
    if module in _STACKED:
        return torch.cat([theirs[f"{prefix}{part}.{kind}"] for part in _STACKED[module]])
    return theirs[f"{prefix}{_RENAMED[module]}.{kind}"]


def decoder_kwargs(c: Any) -> dict[str, Any]:
    """LlamaDecoder's constructor arguments from a transformers LlamaConfig or MistralConfig (Llama's layout
    with a sliding window); what it does not model is an error."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default" or c.hidden_act != "silu":
        raise ValueError(f"only plain RoPE and SiLU are modelled, got rope_type="
                         f"{rope.get('rope_type')!r}, hidden_act={c.hidden_act!r}")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if c.hidden_size != c.num_attention_heads * head_dim:
        raise ValueError(f"head_dim={head_dim} differs from hidden_size / num_attention_heads = "
                         f"{c.hidden_size} / {c.num_attention_heads}: not modelled by attnlib")
    return dict(vocab_size=c.vocab_size, d_model=c.hidden_size, num_layers=c.num_hidden_layers,
                num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, d_ff=c.intermediate_size,
                max_position_embeddings=c.max_position_embeddings, rope_base=rope.get("rope_theta", 10000.0),
                eps=c.rms_norm_eps, attention_bias=bool(getattr(c, "attention_bias", False)),
                mlp_bias=bool(getattr(c, "mlp_bias", False)), tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                sliding_window=getattr(c, "sliding_window", None))


def copy_from_hf(cls: type, model: nn.Module) -> nn.Module:
    """cls (LlamaDecoder) built from a LlamaForCausalLM's or MistralForCausalLM's config, holding a copy of
    its weights in their dtype; a tied lm_head is the embedding itself, listed once among the parameters."""
    from transformers import LlamaForCausalLM, MistralForCausalLM

    if not isinstance(model, (LlamaForCausalLM, MistralForCausalLM)):
        raise TypeError(f"model must be a transformers LlamaForCausalLM or MistralForCausalLM, got "
                        f"{type(model).__name__}")
    ours = cls(**decoder_kwargs(model.config))
    theirs = model.state_dict()
    ours.to(device=theirs["lm_head.weight"].device, dtype=theirs["lm_head.weight"].dtype)
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(hf_tensor(theirs, name))
    return ours.eval()
