"""transformers causal LMs of the 2025 layouts as attnlib LlamaDecoders, weights copied.

Every model here is Llama's decoder with options (attnlib.decoder.LlamaDecoder, LlamaBlock): its
attention layers come from attnlib.variants.hf_attention, each with its own RoPE (or none) and window;
the norms sit before the sublayers (Qwen3, SmolLM3, DiffLlama), after them (OLMo 2: "post") or on both
sides (Gemma 3: "sandwich", with (1 + w) weights, embeddings scaled by sqrt(D), a GELU-tanh MLP and an
optional final logit softcap). A mixture-of-experts MLP or an activation attnlib does not model is a
TypeError / ValueError naming it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import LlamaBlock, SwiGLU
from attnlib.variants.hf_attention import ATTENTION_CONVERTERS

__all__ = ["MODEL_LAYOUTS", "assemble_decoder", "decoder_from_hf"]

_ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}

# per model: where its norms sit and, for each of our norm names, the transformers layer norm it copies
MODEL_LAYOUTS: dict[str, dict[str, Any]] = {
    "pre": dict(norms="pre", names={"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}),
    "post": dict(norms="post", names={"attn_post_norm": "post_attention_layernorm",
                                      "mlp_post_norm": "post_feedforward_layernorm"}),
    "sandwich": dict(norms="sandwich", names={"attn_norm": "input_layernorm", "attn_post_norm": "post_attention_layernorm",
                                              "mlp_norm": "pre_feedforward_layernorm",
                                              "mlp_post_norm": "post_feedforward_layernorm"}),
}


def _mlp(layer: nn.Module, c: Any) -> SwiGLU:
    """attnlib's SwiGLU for a dense gate/up/down MLP with the config's activation, its weights copied."""
    mlp = layer.mlp
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
        raise TypeError(f"layer {layer.self_attn.layer_idx}'s MLP is a {type(mlp).__name__} (a mixture of experts or "
                        f"another feed-forward), which attnlib does not model: only dense gate/up/down MLPs convert; "
                        f"convert one layer's attention instead, from_hf(model.model.layers[i].self_attn)")
    act = getattr(c, "hidden_activation", None) or c.hidden_act
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden activation {act!r} is not modelled by attnlib (only {', '.join(_ACTIVATIONS)})")
    ours = SwiGLU(c.hidden_size, mlp.gate_proj.out_features, mlp.down_proj.bias is not None, activation=_ACTIVATIONS[act])
    with torch.no_grad():
        ours.gate_up.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))  # rows [W_gate; W_up]
        ours.down.weight.copy_(mlp.down_proj.weight)
        if ours.down.bias is not None:
            ours.gate_up.bias.copy_(torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]))
            ours.down.bias.copy_(mlp.down_proj.bias)
    return ours


def decoder_from_hf(model: nn.Module, layout: str, *, norm_offset: float = 0.0, embed_scale: float = 1.0,
                    logit_softcap: float | None = None) -> LlamaDecoder:
    """A LlamaDecoder holding a copy of `model`, a transformers causal LM of Llama's family.

    layout: a key of MODEL_LAYOUTS; norm_offset is added to every RMSNorm weight (1 for Gemma's 1 + w).
    """
    c, inner = model.config, model.model
    spec, rotaries = MODEL_LAYOUTS[layout], {}
    blocks = []
    for i, layer in enumerate(inner.layers):
        convert = ATTENTION_CONVERTERS.get(type(layer.self_attn).__name__)
        if convert is None:
            raise TypeError(f"layer {i}'s attention is a {type(layer.self_attn).__name__}, which from_hf does not convert")
        blocks.append(LlamaBlock(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                                 layer_idx=i, rotary=None, eps=c.rms_norm_eps, attention_bias=False, mlp_bias=False,
                                 attn=convert(layer.self_attn, rotaries), mlp=_mlp(layer, c), norms=spec["norms"]))
    return assemble_decoder(model, blocks, spec["names"], norm_offset=norm_offset, embed_scale=embed_scale,
                            logit_softcap=logit_softcap)


def assemble_decoder(model: nn.Module, blocks: list[LlamaBlock], norm_names: dict[str, str], *,
                     norm_offset: float = 0.0, **options: Any) -> LlamaDecoder:
    """A LlamaDecoder around `blocks`, with model's embeddings, final norm and head copied, and each block's norms
    copied from its transformers layer as norm_names says (ours -> theirs), + norm_offset. options go to LlamaDecoder."""
    c, inner = model.config, model.model
    tied = model.lm_head.weight is inner.embed_tokens.weight or bool(getattr(c, "tie_word_embeddings", False))
    ours = LlamaDecoder(c.vocab_size, c.hidden_size, len(blocks), c.num_attention_heads, c.num_key_value_heads,
                        c.intermediate_size, max_position_embeddings=c.max_position_embeddings, eps=c.rms_norm_eps,
                        tie_word_embeddings=tied, blocks=blocks, **options)
    weight = inner.embed_tokens.weight
    ours.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        ours.embed.weight.copy_(weight)
        ours.norm.weight.copy_(inner.norm.weight + norm_offset)
        if not tied:
            ours.lm_head.weight.copy_(model.lm_head.weight)
        for block, layer in zip(ours.blocks, inner.layers):
            for mine, theirs in norm_names.items():
                getattr(block, mine).weight.copy_(getattr(layer, theirs).weight + norm_offset)
    return ours.eval()


def gemma3(model: nn.Module) -> LlamaDecoder:
    """Gemma3ForCausalLM (text): sandwich norms with (1 + w) weights, embeddings times sqrt(D), final softcap."""
    c = model.config
    return decoder_from_hf(model, "sandwich", norm_offset=1.0, embed_scale=math.sqrt(c.hidden_size),
                           logit_softcap=getattr(c, "final_logit_softcapping", None))


MODEL_CONVERTERS = {
    "Qwen3ForCausalLM": lambda m: decoder_from_hf(m, "pre"), "SmolLM3ForCausalLM": lambda m: decoder_from_hf(m, "pre"),
    "DiffLlamaForCausalLM": lambda m: decoder_from_hf(m, "pre"), "Olmo2ForCausalLM": lambda m: decoder_from_hf(m, "post"),
    "Gemma3ForCausalLM": gemma3, "GptOssForCausalLM": lambda m: decoder_from_hf(m, "pre"),
    "Qwen3MoeForCausalLM": lambda m: decoder_from_hf(m, "pre"),
}
