"""Where each parameter of a LlamaDecoder lives in a transformers LlamaForCausalLM's state dict."""

from __future__ import annotations

import torch

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
