"""attnlib.from_hf(obj): attnlib's own version of a transformers object, its weights copied.

One registry maps a transformers class name to its converter. Causal LMs become LlamaDecoders
(logits (B, T, vocab), usable by attnlib.generate, `decoder.make_cache()`), hybrids included (Qwen3.5's
Gated DeltaNet + attention, attnlib.hf_hybrid); one layer's attention module becomes an attnlib module
m(x) (B, T, D) -> (B, T, D), causal over positions 0..T-1, with the layer's window (Qwen3.5's Gated DeltaNet
layer: a GatedDeltaNet; DeepSeek-V3.2's sparse attention: a DeepSeekSparseAttention). An unsupported
class is a TypeError naming it and listing what is supported; a feature attnlib does not model (a
mixture-of-experts MLP, an unknown RoPE type) is a TypeError / ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from attnlib.decoder import LlamaDecoder
from attnlib.gated_deltanet import GatedDeltaNet
from attnlib.hf_hybrid import HYBRID_CONVERTERS
from attnlib.mla import MultiHeadLatentAttention
from attnlib.sparse_attention import DeepSeekSparseAttention
from attnlib.variants.hf_attention import ATTENTION_CONVERTERS
from attnlib.variants.hf_models import MODEL_CONVERTERS

__all__ = ["from_hf", "CONVERTERS", "supported"]

CONVERTERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "LlamaForCausalLM": LlamaDecoder.from_hf, "MistralForCausalLM": LlamaDecoder.from_hf,
    "DeepseekV3Attention": MultiHeadLatentAttention.from_hf,
    "Qwen3_5GatedDeltaNet": GatedDeltaNet.from_hf, "DeepseekV32Attention": DeepSeekSparseAttention.from_hf,
    **MODEL_CONVERTERS, **ATTENTION_CONVERTERS, **HYBRID_CONVERTERS,
}


def supported() -> list[str]:
    """The transformers class names from_hf converts, sorted."""
    return sorted(CONVERTERS)


def _converter(obj: object) -> Callable[[nn.Module], nn.Module] | None:
    """The converter of obj's class: the first class in its MRO that transformers defines and the registry holds."""
    for cls in type(obj).__mro__:
        if cls.__module__.startswith("transformers.") and cls.__name__ in CONVERTERS:
            return CONVERTERS[cls.__name__]
    return None


def from_hf(obj: nn.Module) -> nn.Module:
    """attnlib's version of a transformers causal LM (a LlamaDecoder) or attention module, weights copied.

    The copy has obj's dtype and device and is in eval mode; obj is left as it was.
    """
    convert = _converter(obj)
    if convert is None:
        raise TypeError(f"from_hf does not convert a {type(obj).__module__}.{type(obj).__name__}; it converts "
                        f"these transformers classes: {', '.join(supported())}")
    return convert(obj)
