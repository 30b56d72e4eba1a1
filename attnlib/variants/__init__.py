"""The 2025 attention variants, one small module each, and their transformers converters (attnlib.from_hf).

qknorm (QK-norm), sinks (learned sinks), gated (output gate), differential (differential attention),
rope (plain, linear and YaRN RoPE from a config; partial RoPE), attention (VariantAttention: attnlib's
MultiHeadAttention with these as options), hf_attention and hf_models (the converters). The KV cache of
layers with different windows is attnlib.caches.layer_windows.LayerWindowCache.
"""

from attnlib.variants.attention import VariantAttention
from attnlib.variants.differential import DifferentialAttention
from attnlib.variants.gated import OutputGate
from attnlib.variants.qknorm import QKNorm
from attnlib.variants.rope import rotary_from_config
from attnlib.variants.sinks import SinkAttention

__all__ = ["VariantAttention", "QKNorm", "SinkAttention", "OutputGate", "DifferentialAttention", "rotary_from_config"]
