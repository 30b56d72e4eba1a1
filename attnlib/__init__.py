"""attnlib: the attention code that attention-book teaches, one idea per module.

Dimension letters: B batch, H heads, H_kv key/value heads, T query length, S key length,
D model width, Dh head width. Masks are bool, True = may attend.
"""

from attnlib import masks, positional
from attnlib.attention import attention, softmax
from attnlib.caches import KVCache, LatentCache, PagedKVCache, QuantizedKVCache, SinkCache
from attnlib.decoder import LlamaDecoder
from attnlib.encoder import mean_pool
from attnlib.from_hf import from_hf
from attnlib.capture import layer_io
from attnlib.generation import generate
from attnlib.mha import MultiHeadAttention
from attnlib.minilm import load_minilm
from attnlib.mla import MultiHeadLatentAttention
from attnlib.pretrained import load_smollm2, load_smollm2_transformers
from attnlib.tiled import tiled_attention
from attnlib.transformer import Transformer
from attnlib.drafts import PromptLookup  # chapter 16: serving
from attnlib.speculative import speculative_generate
from attnlib.serving import serve
from attnlib import parallel  # noqa: E402  (imported as a module: attnlib.parallel.launch, ...)
from attnlib import exercises  # noqa: E402  (after the modules its checkers compare against)

__all__ = ["softmax", "attention", "masks", "MultiHeadAttention", "KVCache", "tiled_attention",
           "load_minilm", "mean_pool", "LlamaDecoder", "generate", "Transformer", "load_smollm2",
           "load_smollm2_transformers", "exercises", "positional",
           "SinkCache", "PagedKVCache", "QuantizedKVCache", "MultiHeadLatentAttention", "LatentCache", "from_hf",
           "layer_io",
           "speculative_generate", "PromptLookup", "serve", "parallel"]
__version__ = "0.1.0"
