"""attnlib: the attention code that attention-book teaches, one idea per module.

Dimension letters: B batch, H heads, H_kv key/value heads, T query length, S key length,
D model width, Dh head width. Masks are bool, True = may attend.
"""

from attnlib import masks
from attnlib import positional
from attnlib.attention import attention, softmax
from attnlib.kv_cache import KVCache
from attnlib.mha import MultiHeadAttention
from attnlib import exercises  # noqa: E402  (after the modules its checkers compare against)

__all__ = ["softmax", "attention", "masks", "MultiHeadAttention", "KVCache", "exercises", "positional"]
__version__ = "0.1.0"
