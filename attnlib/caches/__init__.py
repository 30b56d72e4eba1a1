"""The caches, one module each, all keeping one contract (`Cache`, in _base): the plain KVCache, a latent
cache for multi-head latent attention, a paged cache, an int8 cache and an attention-sink (StreamingLLM)
cache."""

from attnlib.caches._base import Cache, check_cache
from attnlib.caches.kv import KVCache, cache_bytes
from attnlib.caches.latent import LatentCache
from attnlib.caches.paged import PagedKVCache
from attnlib.caches.paged_batch import PagedBatch
from attnlib.caches.quantized import QuantizedKVCache, dequantize_int8, quantize_int8
from attnlib.caches.sink import SinkCache

__all__ = ["Cache", "check_cache", "KVCache", "cache_bytes", "LatentCache", "PagedKVCache", "PagedBatch", "QuantizedKVCache", "SinkCache",
           "quantize_int8", "dequantize_int8"]
