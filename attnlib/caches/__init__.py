"""Caches beyond KVCache, one module each, all with KVCache's contract (see _base): a latent cache for
multi-head latent attention, a paged cache, an int8 cache and an attention-sink (StreamingLLM) cache."""

from attnlib.caches.latent import LatentCache
from attnlib.caches.paged import PagedKVCache
from attnlib.caches.quantized import QuantizedKVCache, dequantize_int8, quantize_int8
from attnlib.caches.sink import SinkCache

__all__ = ["LatentCache", "PagedKVCache", "QuantizedKVCache", "SinkCache", "quantize_int8", "dequantize_int8"]
