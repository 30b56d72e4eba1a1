"""Reading a llama-architecture GGUF file (llama.cpp's format) into transformers' tensor names, with the
`gguf` package: the slow first step of attnlib.load_smollm2, whose result attnlib.pretrained caches."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

# GGUF tensor names (per layer: blk.<i>.<name>) -> transformers' LlamaForCausalLM names
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
_GGUF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}


def _require(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"reading SmolLM2's GGUF file needs the {module} package: pip install {install}")


def _field(reader: Any, key: str) -> Any:
    """One scalar value of the GGUF metadata (ints, floats as float32 read into a Python float)."""
    field = reader.fields[key]
    return field.parts[field.data[0]][0].item()


def _read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(LlamaDecoder's constructor arguments, the tensors under transformers' names) from a llama GGUF file."""
    _require("gguf", "gguf")
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{path.name} holds a {arch!r} model; load_smollm2 reads llama-architecture files")
    H, H_kv = _field(reader, "llama.attention.head_count"), _field(reader, "llama.attention.head_count_kv")
    tensors = {}
    for t in reader.tensors:  # dequantized by the gguf package, as transformers does: float32
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        if t.name.startswith("blk."):
            _, i, kind, suffix = t.name.split(".")
            if kind in ("attn_q", "attn_k"):  # llama.cpp interleaves each head's rotary halves; undo it
                heads = H if kind == "attn_q" else H_kv
                w = w.view(heads, -1, 2, w.shape[-1]).transpose(1, 2).reshape(w.shape)
            tensors[f"model.layers.{i}.{_GGUF_LAYER[kind]}.{suffix}"] = w
        else:
            tensors[_GGUF_TOP[t.name]] = w
    tied = "lm_head.weight" not in tensors
    if tied:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    config = dict(vocab_size=tensors["model.embed_tokens.weight"].shape[0],
                  d_model=_field(reader, "llama.embedding_length"), num_layers=_field(reader, "llama.block_count"),
                  num_heads=H, num_kv_heads=H_kv, d_ff=_field(reader, "llama.feed_forward_length"),
                  max_position_embeddings=_field(reader, "llama.context_length"),
                  rope_base=_field(reader, "llama.rope.freq_base"),
                  eps=_field(reader, "llama.attention.layer_norm_rms_epsilon"), tie_word_embeddings=tied)
    return config, tensors
