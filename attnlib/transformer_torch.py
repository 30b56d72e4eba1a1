"""Reading a torch.nn.Transformer: which of its options attnlib.Transformer models, and its weights.

nn.Transformer keeps, per layer, `self_attn` (and `multihead_attn`, the decoder's cross-attention)
as nn.MultiheadAttention, `linear1`/`linear2` for the feed-forward network, `norm1..3`, and one
activation; `encoder.norm` and `decoder.norm` are the final LayerNorms. Anything else (a custom
encoder or decoder, batch_first=False, an activation other than relu/gelu, bias=False, layers that
differ from each other) is a ValueError that names it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from attnlib.mha import MultiHeadAttention

__all__ = ["torch_config", "copy_torch_weights"]


def _activation_name(act: object) -> str:
    """'relu' or 'gelu' for nn.Transformer's activation (a function or a module), else ValueError."""
    if act is F.relu or type(act) is nn.ReLU:
        return "relu"
    if act is F.gelu or (type(act) is nn.GELU and act.approximate == "none"):
        return "gelu"
    raise ValueError(f"activation {act!r} is not modelled: attnlib.Transformer has 'relu' and 'gelu'")


def _norm_eps(norm: object, where: str) -> float:
    if type(norm) is not nn.LayerNorm or norm.weight is None or norm.bias is None:
        raise ValueError(f"{where} is {type(norm).__name__ if norm is not None else None}: attnlib.Transformer "
                         f"has an nn.LayerNorm with weight and bias there")
    return norm.eps


def _layers(stack: object, stack_type: type, layer_type: type, where: str) -> list[nn.Module]:
    if type(stack) is not stack_type:
        raise ValueError(f"a custom {where} ({type(stack).__name__}) is not modelled: attnlib.Transformer "
                         f"copies an nn.{stack_type.__name__} of nn.{layer_type.__name__}")
    for i, layer in enumerate(stack.layers):
        if type(layer) is not layer_type:
            raise ValueError(f"{where}.layers[{i}] is a {type(layer).__name__}, not an nn.{layer_type.__name__}")
    return list(stack.layers)


def torch_config(m: nn.Transformer) -> dict:
    """attnlib.Transformer's constructor arguments for m; ValueError for what it does not model."""
    if not isinstance(m, nn.Transformer):
        raise TypeError(f"m must be an nn.Transformer, got {type(m).__name__}")
    if not m.batch_first:
        raise ValueError("batch_first=False is not modelled: attnlib is batch-first, (B, S, D); build "
                         "nn.Transformer(..., batch_first=True)")
    enc = _layers(m.encoder, nn.TransformerEncoder, nn.TransformerEncoderLayer, "encoder")
    dec = _layers(m.decoder, nn.TransformerDecoder, nn.TransformerDecoderLayer, "decoder")
    if any(layer.linear1.bias is None or layer.linear2.bias is None for layer in enc + dec):
        raise ValueError("bias=False is not modelled: attnlib.Transformer's linear layers have biases")
    norms = [(m.encoder.norm, "encoder.norm"), (m.decoder.norm, "decoder.norm")]
    for part, stack, count in (("encoder", enc, 2), ("decoder", dec, 3)):
        norms += [(getattr(layer, f"norm{j}"), f"{part}.layers[{i}].norm{j}")
                  for i, layer in enumerate(stack) for j in range(1, count + 1)]
    eps = {_norm_eps(norm, where) for norm, where in norms}
    layers = enc + dec
    modules = [mod for layer in layers for mod in layer.modules()]
    options = {
        "norm_first": {layer.norm_first for layer in layers},
        "activation": {_activation_name(layer.activation) for layer in layers},
        "dim_feedforward": {layer.linear1.out_features for layer in layers},
        "layer_norm_eps": eps,
        "dropout": {mod.p for mod in modules if isinstance(mod, nn.Dropout)}
                   | {mod.dropout for mod in modules if isinstance(mod, nn.MultiheadAttention)},
    }
    for name, values in options.items():
        if len(values) > 1:
            raise ValueError(f"the layers differ in {name} ({sorted(values, key=str)}): attnlib.Transformer "
                             f"uses one {name} for every layer")
    config = {name: values.pop() for name, values in options.items()}
    return dict(d_model=m.d_model, num_heads=m.nhead, num_encoder_layers=len(enc),
                num_decoder_layers=len(dec), **config)


def _copy_attention(target: MultiHeadAttention, source: nn.MultiheadAttention) -> None:
    """Load source's weights into target (MultiHeadAttention.from_torch checks what it models)."""
    target.load_state_dict(MultiHeadAttention.from_torch(source).state_dict())


def copy_torch_weights(m: nn.Transformer, ours: nn.Module) -> None:
    """Copy every weight of m into ours, an attnlib.Transformer built from torch_config(m)."""
    pairs = [(ours.encoder_norm, m.encoder.norm), (ours.decoder_norm, m.decoder.norm)]
    for mine, theirs in zip(ours.encoder, m.encoder.layers):
        _copy_attention(mine.attn, theirs.self_attn)
        pairs += [(mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2)]
        pairs += [(mine.ffn[0], theirs.linear1), (mine.ffn[3], theirs.linear2)]
    for mine, theirs in zip(ours.decoder, m.decoder.layers):
        _copy_attention(mine.self_attn, theirs.self_attn)
        _copy_attention(mine.cross_attn, theirs.multihead_attn)
        pairs += [(mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2), (mine.norm3, theirs.norm3)]
        pairs += [(mine.ffn[0], theirs.linear1), (mine.ffn[3], theirs.linear2)]
    for mine, theirs in pairs:
        mine.load_state_dict(theirs.state_dict())
