"""Checkers for chapter 7 (grouped-query attention): repeat_kv, the bytes of a KV cache, mean-pooled kv heads."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch.overrides import TorchFunctionMode

from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, matching, run
from attnlib.exercises._expect import either
from attnlib.gqa import mean_pool_kv_heads
from attnlib.caches import cache_bytes
from attnlib.mha import repeat_kv

__all__ = ["check_repeat_kv", "check_kv_cache_bytes", "check_mean_pool_kv_heads"]


class CallLog(TorchFunctionMode):
    """Records each torch function or Tensor method called while active: its __name__ (`names`) and the
    size of the tensor it returned (`sizes`, 0 for anything else), so that a checker can say when an
    answer takes a shortcut its exercise rules out."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.sizes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(getattr(func, "__name__", repr(func)))
        self.sizes.append(out.numel() if isinstance(out, torch.Tensor) else 0)
        return out


def _tensor_or_named(got: object, what: str, shape: tuple[int, ...],
                     shape_mistakes: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """got as a tensor of `shape`; a result of another shape that equals a known mistake is named."""
    as_tensor(got, what)
    found = matching(got, shape_mistakes)
    if found:
        raise CandidateError(f"{what} is wrong: it matches {either(found)}")
    return as_tensor(got, what, shape=shape)


@checker("repeat_kv")
def check_repeat_kv(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    """fn(x, n_rep) with x (B, H_kv, S, Dh) returns (B, H_kv·n_rep, S, Dh): head j repeated n_rep times next to itself."""
    B, H_kv, S, Dh, n_rep = 2, 2, 5, 4, 3  # all different: no axis can stand in for another
    x = torch.randn(B, H_kv, S, Dh)
    what = f"repeat_kv(x, n_rep={n_rep}) with x of shape {(B, H_kv, S, Dh)}"
    with CallLog() as log:
        got = run(fn, x.clone(), n_rep, what=what)
    got = _tensor_or_named(got, what, (B, H_kv * n_rep, S, Dh), {
        "x unchanged: the kv heads were never repeated": x,
        "repeats along the sequence axis (dim=2) instead of the head axis (dim=1)":
            x.repeat_interleave(n_rep, dim=2),
        "repeats along the head width Dh (dim=-1) instead of the head axis (dim=1)":
            x.repeat_interleave(n_rep, dim=-1),
        "n_rep copies of the first kv head only": x[:, :1].expand(B, n_rep, S, Dh),
    })
    expect_close(got, repeat_kv(x, n_rep), what, mistakes={
        "the kv heads tiled (h0, h1, h0, h1, ...) as x.repeat(1, n_rep, 1, 1) does, instead of each "
        "repeated next to itself (h0, h0, h0, h1, ...): query head i must meet kv head i // n_rep, not "
        "i % H_kv": x.repeat(1, n_rep, 1, 1),
        "the repeated heads mixed with the sequence axis: expand and reshape in the wrong order":
            x[:, :, :, None].expand(B, H_kv, S, n_rep, Dh).reshape(B, H_kv * n_rep, S, Dh),
    })
    once = run(fn, x.clone(), 1, what="repeat_kv(x, n_rep=1)")
    expect_close(as_tensor(once, "repeat_kv(x, n_rep=1)", shape=x.shape), x, "repeat_kv(x, n_rep=1)")
    if "repeat_interleave" in log.names:
        raise CandidateError(f"{what} gives the right result, but it calls repeat_interleave, which this "
                             f"exercise rules out: write it with expand and reshape (a view, then one copy), "
                             f"or by indexing the heads with torch.arange(H_kv * n_rep) // n_rep")
    return "each kv head repeated n_rep times next to itself, so query head i meets kv head i // n_rep"


def _as_int(value: object, what: str) -> int:
    """The reader's count of bytes as an int (an int, an integral float or a one-element tensor)."""
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise CandidateError(f"{what} should be a number of bytes, got {type(value).__name__}") from None
    if number != int(number):
        raise CandidateError(f"{what} returned {number}, not a whole number of bytes")
    return int(number)


_CONFIGS = [  # (config, seq_len, batch_size, bytes_per_element): every number different from the others
    ({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32},
     8192, 3, 2),
    ({"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 22},
     1000, 5, 4),
    ({"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 1, "num_hidden_layers": 6},
     333, 7, 2),
    ({"hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 42,
      "head_dim": 256}, 4096, 2, 2),  # Gemma-2-9B's heads: 256 wide, not 3584 / 16 = 224
]


def _head_dim(c: Mapping[str, int]) -> int:
    """The width of one head: head_dim when the configuration gives it, else hidden_size / num_attention_heads."""
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def _bytes_variants(c: Mapping[str, int], T: int, B: int, nbytes: int) -> dict[str, int]:
    """The correct count ("") and the classic wrong ones, for one configuration."""
    L, H, H_kv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
    Dh = _head_dim(c)
    right = cache_bytes(L, H_kv, Dh, T, batch_size=B, bytes_per_element=nbytes)
    return {
        "": right,
        "num_attention_heads used instead of num_key_value_heads: that is an MHA cache; GQA stores "
        "H_kv heads only": cache_bytes(L, H, Dh, T, batch_size=B, bytes_per_element=nbytes),
        "a missing factor 2: the cache holds keys AND values": right // 2,
        "the layers forgotten: every layer has its own cache": right // L,
        "the batch forgotten: each sequence has its own cache": right // B,
        "bits instead of bytes (× 8)": right * 8,
        "hidden_size used as the width of one kv head (Dh = hidden_size / num_attention_heads)":
            cache_bytes(L, H_kv, c["hidden_size"], T, batch_size=B, bytes_per_element=nbytes),
        "head_dim ignored: when the configuration gives head_dim, that is the width of a head, even where "
        "it differs from hidden_size / num_attention_heads":
            cache_bytes(L, H_kv, c["hidden_size"] // H, T, batch_size=B, bytes_per_element=nbytes),
        "bytes_per_element ignored": right // nbytes,
    }


@checker("KV-cache bytes")
def check_kv_cache_bytes(fn: Callable[[dict, int, int, int], int]) -> str:
    """fn(config, seq_len, batch_size, bytes_per_element) returns the bytes of a full KV cache.

    config holds transformers' names: hidden_size, num_attention_heads, num_key_value_heads,
    num_hidden_layers, and sometimes head_dim (then the width of a head, else hidden_size / num_attention_heads).
    """
    calls = [(config, f"kv_cache_bytes(config, seq_len={T}, batch_size={B}, bytes_per_element={n})",
              _bytes_variants(config, T, B, n)) for config, T, B, n in _CONFIGS]
    got = [_as_int(run(fn, dict(config), T, B, n, what=what), what)
           for (config, T, B, n), (_, what, _) in zip(_CONFIGS, calls)]
    for answer, (config, what, variants) in zip(got, calls):
        if answer != variants[""]:  # the mistakes named are those that explain every answer
            found = [name for name in variants if name and all(a == v[name] for a, (_, _, v) in zip(got, calls))]
            raise CandidateError(f"{what} with config {config} returned {answer:,} instead of {variants['']:,}"
                                 + (f": it matches {' and '.join(found)}" if found else ""))
    return (f"2 · layers · B · H_kv · seq_len · Dh · bytes per element, for {len(_CONFIGS)} configurations, "
            f"one with a head_dim of its own")


@checker("mean-pooled kv heads")
def check_mean_pool_kv_heads(fn: Callable[[torch.Tensor, int, int], torch.Tensor]) -> str:
    """fn(w, num_heads, num_kv_heads) with w (H·Dh, D) returns (H_kv·Dh, D): heads mean-pooled within groups."""
    H, H_kv, Dh, D = 6, 2, 4, 5
    g = H // H_kv
    w = torch.randn(H * Dh, D)
    what = f"mean_pool_kv_heads(w, num_heads={H}, num_kv_heads={H_kv}) with w of shape {(H * Dh, D)}"
    heads = w.reshape(H, Dh, D)                                            # (H, Dh, D)
    got = _tensor_or_named(run(fn, w.clone(), H, H_kv, what=what), what, (H_kv * Dh, D), {
        "w unchanged: the heads were never pooled": w,
        "every head pooled into one (MQA), whatever num_kv_heads is": heads.mean(0),
        "the mean taken over the columns D (dim=1) instead of over the heads of a group":
            w.mean(dim=1),
    })
    expect_close(got, mean_pool_kv_heads(w, H, H_kv), what, mistakes={
        "strided groups: heads j, j + H_kv, j + 2·H_kv, ... pooled together, but repeat_kv gives "
        "query head i the kv head i // g, so a group is g CONSECUTIVE heads":
            heads.reshape(g, H_kv, Dh, D).mean(0).reshape(H_kv * Dh, D),
        "a sum instead of a mean over the g heads of a group":
            heads.reshape(H_kv, g, Dh, D).sum(1).reshape(H_kv * Dh, D),
        "the first head of each group kept instead of the mean of the group":
            heads.reshape(H_kv, g, Dh, D)[:, 0].reshape(H_kv * Dh, D),
        "rows averaged within a head (w.reshape(H_kv·Dh, g, D).mean(1)) instead of heads within a group":
            w.reshape(H_kv * Dh, g, D).mean(1),
    })
    return "kv head j is the mean of heads j·g .. j·g + g - 1, the query heads that share it"
