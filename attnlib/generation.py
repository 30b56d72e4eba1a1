"""Decoding: turn a decoder's next-token logits into text, one token at a time, greedy or sampled.

At each step the decoder scores every vocabulary token as the next one (logits (B, vocab)), one is
chosen and appended, and the loop runs again. Greedy decoding takes the argmax. Sampling draws from
softmax(logits / temperature), optionally restricted to the top_k most likely tokens (Fan et al.,
2018) or to the nucleus, the smallest set of most likely tokens whose probabilities sum to at least
top_p (Holtzman et al., 2020). With a cache the prompt is run once (the prefill) and each step feeds
one token; without, the whole sequence is re-run at every step (the baseline the cache is measured
against).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnlib import masks as _masks
from attnlib._checks import fmt_shape
from attnlib.decode_step import DecodeStep
from attnlib.caches import Cache, KVCache, SinkCache
from attnlib.decoder import LlamaDecoder, check_token_ids

__all__ = ["generate", "sample_logits", "process_logits", "sample_probs", "top_k_filter", "top_p_filter"]


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits (..., vocab) with every token below the k-th largest set to -inf (ties with it are kept)."""
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits (..., vocab) restricted to the nucleus: the fewest most likely tokens whose probabilities
    sum to at least p; the others set to -inf. The most likely token always stays.

    Sorted by probability, a token is in the nucleus when the tokens before it sum to less than p.
    """
    probs, order = torch.sort(logits.softmax(dim=-1), dim=-1, descending=True)  # (..., vocab) each
    drop_sorted = probs.cumsum(dim=-1) - probs >= p                              # mass ahead of each token
    drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)        # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """logits (..., vocab) -> the logits sampling draws from: divided by temperature, then the top_k and
    top_p filters (in that order, as transformers applies them), in float32 at least.

    softmax of the result is the distribution `sample_logits` samples (and speculative decoding keeps).
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of probs (B, vocab) -> (B,); a row need not sum to 1 (it is scaled by its sum).

    The draw inverts the cumulative distribution: u ~ U[0, 1) from `generator` (one number per row),
    and the token is the first whose cumulative probability exceeds u · total.
    """
    cdf = probs.double().cumsum(dim=-1)                                             # (B, vocab)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64, device=cdf.device)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)                   # (B, 1)
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous())       # the last token whose probability is not 0
    return torch.minimum(token, last).view(-1)          # (u · total rounded up to the total: that one)


def sample_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits (B, vocab) -> (B,), drawn from softmax(process_logits(logits)):
    softmax(logits / temperature) after the top_k and top_p filters."""
    logits = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return sample_probs(logits.softmax(dim=-1), generator)


def _check_sampling(do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
                    generator: torch.Generator | None) -> None:
    """A ValueError naming the argument for any value sampling cannot use."""
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < float("inf"):
        raise ValueError(f"temperature must be a number > 0 (1.0 leaves the distribution as it is; greedy "
                         f"decoding is do_sample=False, not temperature=0), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if not do_sample:
        unused = [f"{name}={value!r}" for name, value, default in
                  (("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None),
                   ("generator", generator, None)) if value is not default and value != default]
        if unused:
            raise ValueError(f"{', '.join(unused)} only apply when sampling: pass do_sample=True, or leave "
                             f"them out for greedy decoding")


def _eos_ids(eos_token_id: int | Sequence[int] | None, vocab: int | None) -> torch.Tensor | None:
    """eos_token_id as a (n,) long tensor of token ids, or None; a ValueError names a bad one."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
    ok = isinstance(ids, Sequence) and len(ids) > 0 and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < (vocab or i + 1) for i in ids)
    if not ok:
        raise ValueError(f"eos_token_id must be a token id in [0, vocab_size={vocab}) or a list of them, "
                         f"got {eos_token_id!r}")
    return torch.tensor(list(ids), dtype=torch.long)


def _prompt_mask(attention_mask: torch.Tensor | None, B: int, T: int, total: int) -> torch.Tensor | None:
    """(B, total) bool, True = real token: the prompt's attention_mask (B, T), then the new tokens (all real)."""
    if attention_mask is None:
        return None
    real = _masks.from_hf(attention_mask)[:, 0, 0]          # (B, T) bool; checks dtype and values
    if tuple(real.shape) != (B, T):
        raise ValueError(f"attention_mask of shape {fmt_shape(real.shape)} is not (B, T) = "
                         f"({B}, {T}), the shape of input_ids")
    mask = torch.ones(B, total, dtype=torch.bool, device=real.device)
    mask[:, :T] = real
    return mask


@torch.inference_mode()
def generate(decoder: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = True, attention_mask: torch.Tensor | None = None, cache: Cache | None = None,
             eos_token_id: int | Sequence[int] | None = None, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """input_ids (B, T) -> (B, T + n), n <= max_new_tokens: the prompt, then the tokens chosen.

    Greedy (argmax) unless do_sample, which draws with sample_logits (temperature, top_k, top_p,
    generator: without do_sample, setting them is an error, not ignored). attention_mask (B, T), 1 = real token, allows a left-padded batch. cache: the cache
    to fill (default a new KVCache; any attnlib.caches.Cache). A row that has produced an
    eos_token_id produces only that token afterwards; the loop stops once every row has.
    """
    check_token_ids(input_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    _check_sampling(do_sample, temperature, top_k, top_p, generator)
    embed = getattr(decoder, "embed", None)
    eos = _eos_ids(eos_token_id, getattr(embed, "num_embeddings", None))
    eos = None if eos is None else eos.to(input_ids.device)
    if cache is not None and not use_cache:
        raise ValueError("cache was given with use_cache=False: pass one or the other")
    if cache is not None and (not isinstance(cache, Cache) or len(cache) or cache.seq_len):
        raise ValueError(f"cache must be an empty cache to fill (attnlib.KVCache() or another "
                         f"attnlib.caches.Cache), got {cache!r}")
    B, T = input_ids.shape
    out = input_ids.new_empty(B, T + max_new_tokens)        # (B, T + new): the prompt, then the new tokens
    out[:, :T] = input_ids
    mask = _prompt_mask(attention_mask, B, T, T + max_new_tokens)
    longest = T if mask is None else int(mask[:, :T].sum(dim=1).max())
    limit = getattr(decoder, "max_position_embeddings", None)
    needed = longest + max_new_tokens
    if isinstance(cache, SinkCache):  # it renumbers what it keeps: no position beyond max(prompt, capacity)
        needed = min(needed, max(longest, cache.capacity + 1))
    if limit is not None and needed > limit:
        raise ValueError(f"{longest} prompt tokens + max_new_tokens={max_new_tokens} = "
                         f"{longest + max_new_tokens} positions are beyond max_position_embeddings={limit}")
    default = decoder.make_cache if hasattr(decoder, "make_cache") else KVCache
    cache = (default() if cache is None else cache) if use_cache else None
    # DecodeStep's fast path: a plain KVCache, no window, Llama's layout
    fast = type(cache) is KVCache and isinstance(decoder, LlamaDecoder) and decoder.sliding_window is None \
        and decoder.is_llama
    step, done = None, torch.zeros(B, dtype=torch.bool, device=out.device)  # done: the row has produced eos
    for t in range(T, T + max_new_tokens):
        if step is not None:  # a cached step: one token per row
            logits = step(out[:, t - 1:t])                  # (B, 1, vocab)
        else:                 # the prefill, a cache without a fast path, or no cache: decoder.forward
            fed = out[:, :t] if t == T or cache is None else out[:, t - 1:t]
            logits = decoder(fed, cache, attention_mask=None if mask is None else mask[:, :t], last_only=True)
            if fast:
                step = DecodeStep(decoder, cache, mask, T + max_new_tokens)
        last = logits[:, -1]                                # (B, vocab)
        token = sample_logits(last, temperature=temperature, top_k=top_k, top_p=top_p,
                              generator=generator) if do_sample else last.argmax(dim=-1)
        if eos is not None:
            token = torch.where(done, out[:, t - 1], token)  # a finished row repeats its eos token
            done |= torch.isin(token, eos)
        out[:, t] = token
        if eos is not None and bool(done.all()):
            return out[:, :t + 1]
    return out
