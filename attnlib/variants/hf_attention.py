"""transformers attention modules of the 2025 models as attnlib VariantAttention layers, weights copied.

Each converter reads the module's config and layer index: its heads, window, RoPE (attnlib.variants.rope)
and what it adds (QK-norm, sinks, gate, differential kernel). Norm weights stored as an offset from one
(Gemma 3's and Qwen3.5's RMSNorm multiply by 1 + w) are copied as 1 + w into attnlib's RMSNorm.
`rotaries` (a dict) lets a whole model's layers share one RotaryEmbedding per distinct RoPE.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlib.positional import RotaryEmbedding
from attnlib.variants.attention import VariantAttention
from attnlib.variants.differential import DifferentialAttention
from attnlib.variants.gated import OutputGate
from attnlib.variants.qknorm import QKNorm
from attnlib.variants.rope import rotary_from_config
from attnlib.variants.sinks import SinkAttention

__all__ = ["ATTENTION_CONVERTERS", "layer_rotary"]


def layer_rotary(c: Any, layer_idx: int, head_dim: int, rotaries: dict | None = None) -> RotaryEmbedding | None:
    """The RotaryEmbedding of layer `layer_idx`'s heads (width head_dim) under config c: one per layer type
    when the config has rope_parameters per layer type (Gemma 3); None for a NoPE layer (SmolLM3's
    no_rope_layers[i] = 0)."""
    if getattr(c, "no_rope_layers", None) is not None and not c.no_rope_layers[layer_idx]:
        return None
    p, key = c.rope_parameters, "all"
    if isinstance(p, dict) and "rope_type" not in p and getattr(c, "layer_types", None):
        key = c.layer_types[layer_idx]
        p = p[key]
    rotaries = {} if rotaries is None else rotaries
    if key not in rotaries:
        rotaries[key] = rotary_from_config(p, head_dim, c.max_position_embeddings)
    return rotaries[key]


def _base(attn: nn.Module, rotaries: dict | None, **options: Any) -> VariantAttention:
    """A VariantAttention sized like attn, with its window and RoPE, q/k/v and o copied."""
    c, i = attn.config, attn.layer_idx
    q_proj = options.pop("q_proj", None) or attn.q_proj
    ours = VariantAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim=attn.head_dim,
                            bias=attn.k_proj.bias is not None, layer_idx=i, rotary=layer_rotary(c, i, attn.head_dim, rotaries),
                            window=getattr(attn, "sliding_window", None), **options)
    ours.to(dtype=attn.k_proj.weight.dtype, device=attn.k_proj.weight.device)
    with torch.no_grad():
        for kind in ("weight", "bias") if ours.qkv.bias is not None else ("weight",):
            ours.qkv.get_parameter(kind).copy_(torch.cat([getattr(p, kind) for p in (q_proj, attn.k_proj, attn.v_proj)]))
        ours.out.load_state_dict(attn.o_proj.state_dict())
    return ours.eval()


def _qk_norm(attn: nn.Module, ours: VariantAttention, *, offset: float = 0.0) -> VariantAttention:
    """Copy attn's q_norm and k_norm weights (plus offset: 1 for norms that multiply by 1 + w)."""
    with torch.no_grad():
        ours.qk_norm.q_norm.weight.copy_(attn.q_norm.weight + offset)
        ours.qk_norm.k_norm.weight.copy_(attn.k_norm.weight + offset)
    return ours


def _eps(attn: nn.Module) -> float:
    return attn.config.rms_norm_eps


def qwen3(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """Qwen3Attention (and SmolLM3's, Llama's layout): per-head QK-norm before RoPE."""
    c = attn.config
    norm = QKNorm(c.num_attention_heads, c.num_key_value_heads, attn.head_dim, eps=_eps(attn))
    return _qk_norm(attn, _base(attn, rotaries, qk_norm=norm))


def olmo2(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """Olmo2Attention: QK-norm over the whole projection (H·Dh and H_kv·Dh features)."""
    c = attn.config
    norm = QKNorm(c.num_attention_heads, c.num_key_value_heads, attn.head_dim, per_head=False, eps=_eps(attn))
    return _qk_norm(attn, _base(attn, rotaries, qk_norm=norm))


def plain(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """SmolLM3Attention: Llama's attention; NoPE on the layers config.no_rope_layers marks 0."""
    return _base(attn, rotaries)


def gemma3(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """Gemma3Attention: per-head QK-norm (1 + w), logits scaled by query_pre_attn_scalar^(-1/2), the
    layer type's RoPE base and window. transformers 5.24 stores attn_logit_softcapping but never applies
    it: a config that sets it is refused rather than converted to one of two different models."""
    c = attn.config
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention=True (Gemma 3 as an encoder) is not modelled: attnlib's "
                         "layers are causal")
    if getattr(c, "attn_logit_softcapping", None) is not None:
        raise ValueError(f"attn_logit_softcapping={c.attn_logit_softcapping} is set, and transformers' "
                         f"Gemma3Attention ignores it: attnlib does not model it")
    norm = QKNorm(c.num_attention_heads, c.num_key_value_heads, attn.head_dim, eps=_eps(attn))
    return _qk_norm(attn, _base(attn, rotaries, qk_norm=norm, scale=attn.scaling), offset=1.0)


def gpt_oss(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """GptOssAttention: a learned sink logit per head, biases, its layer type's window, YaRN RoPE."""
    ours = _base(attn, rotaries, kernel=SinkAttention(attn.config.num_attention_heads))
    with torch.no_grad():
        ours.kernel.sinks.copy_(attn.sinks)
    return ours


def diffllama(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """DiffLlamaAttention: differential attention (λ's four vectors copied; λ_init from the layer index)."""
    ours = _base(attn, rotaries, kernel=DifferentialAttention(attn.head_dim, attn.layer_idx, eps=_eps(attn)))
    with torch.no_grad():
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(ours.kernel, name).copy_(getattr(attn, name))
    return ours


class _Rows(nn.Module):
    """A stand-in projection holding some rows of another one's weight and bias."""

    def __init__(self, linear: nn.Linear, index: torch.Tensor) -> None:
        super().__init__()
        self.weight = linear.weight[index]
        self.bias = None if linear.bias is None else linear.bias[index]


def qwen3_5(attn: nn.Module, rotaries: dict | None = None) -> VariantAttention:
    """Qwen3_5Attention: an output gate σ(x W_g) per head and channel, per-head QK-norm (1 + w), partial RoPE.

    Its q_proj's rows are, head by head, Dh query rows then Dh gate rows: split into W_q and W_g."""
    c, Dh = attn.config, attn.head_dim
    H = c.num_attention_heads
    rows = torch.arange(2 * H * Dh).view(H, 2, Dh)                     # (H, [q | gate], Dh) row indices
    gate = OutputGate(c.hidden_size, H * Dh, bias=attn.q_proj.bias is not None)
    norm = QKNorm(H, c.num_key_value_heads, Dh, eps=_eps(attn))
    ours = _base(attn, rotaries, qk_norm=norm, gate=gate, q_proj=_Rows(attn.q_proj, rows[:, 0].reshape(-1)))
    with torch.no_grad():
        gate_rows = _Rows(attn.q_proj, rows[:, 1].reshape(-1))
        ours.gate.proj.weight.copy_(gate_rows.weight)
        if gate_rows.bias is not None:
            ours.gate.proj.bias.copy_(gate_rows.bias)
    return _qk_norm(attn, ours, offset=1.0)


ATTENTION_CONVERTERS = {
    "Qwen3Attention": qwen3, "Qwen3MoeAttention": qwen3, "Olmo2Attention": olmo2, "SmolLM3Attention": plain,
    "Gemma3Attention": gemma3, "GptOssAttention": gpt_oss, "DiffLlamaAttention": diffllama,
    "Qwen3_5Attention": qwen3_5,
}
