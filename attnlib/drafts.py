"""Drafts for speculative decoding (attnlib.speculative_generate): a smaller model with its own KV cache,
or prompt lookup (Saxena 2023), which needs no second model.

Prompt lookup: when the output copies from the input (a summary quoting its source, code being edited,
a passage rewritten), the tokens that follow the context's last n-gram have often been seen before:
right after an earlier occurrence of that n-gram. The drafter proposes them; the target model verifies
them as it verifies any draft. Its proposals are deterministic, so as a distribution each one is a
point mass q = 1[x = proposed token].

A drafter has `propose(tokens (1, L), k) -> (drafts (m,), q (m, V) or None)`, m <= k, q None for a
point mass, and `rollback(seq_len)`, called with the tokens kept after verification.
"""

from __future__ import annotations

import functools
import inspect

import torch

from attnlib._checks import require_count
from attnlib.caches import KVCache
from attnlib.generation import process_logits, sample_probs

__all__ = ["PromptLookup", "DecoderDraft", "LookupDraft", "vocab_size", "forward_logits", "croppable_cache"]


class PromptLookup:
    """Proposes the tokens that followed the latest earlier occurrence of the context's last n-gram.

    The rule, for a context x_0 .. x_{L-1} and up to k tokens: for n = ngram_size, ngram_size - 1, .., 1
    (the longest n-gram first, as transformers' PromptLookupCandidateGenerator falls back to shorter
    ones), find the latest start i < L - n with x_i .. x_{i+n-1} = x_{L-n} .. x_{L-1}, and propose
    x_{i+n} .. x_{i+n+k-1} (cut at the end of the context). No match for any n: no proposal.
    transformers takes the *first* occurrence instead; the latest one is the most recent context,
    which a copy that runs on continues.
    """

    def __init__(self, ngram_size: int = 3) -> None:
        self.ngram_size = require_count(ngram_size, "ngram_size", 1, "the longest n-gram matched")

    def propose(self, tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """tokens (L,) -> the proposed continuation (m,), 0 <= m <= num_tokens."""
        L = tokens.shape[0]
        for n in range(min(self.ngram_size, L - 1), 0, -1):
            windows = tokens[:L - 1].unfold(0, n, 1)                 # (L - n, n): the n-grams that end before x_{L-1}
            hits = (windows == tokens[L - n:]).all(dim=-1).nonzero()  # (matches, 1) start positions
            if len(hits):
                start = int(hits[-1]) + n                            # after the latest occurrence
                return tokens[start:start + num_tokens]
        return tokens[:0]

    def __repr__(self) -> str:
        return f"PromptLookup(ngram_size={self.ngram_size})"


def vocab_size(decoder: object, name: str) -> int:
    """The decoder's vocabulary size (its embedding's rows); a TypeError naming `name` if it has none."""
    embed = getattr(decoder, "embed", None)
    if not isinstance(decoder, torch.nn.Module) or not hasattr(embed, "num_embeddings"):
        raise TypeError(f"{name} must be a decoder with an `embed` nn.Embedding (an attnlib.LlamaDecoder), "
                        f"got {type(decoder).__name__}")
    return embed.num_embeddings


@functools.cache
def _takes_last_only(cls: type) -> bool:
    """Whether cls.forward takes last_only (LlamaDecoder's: only the last position's logits)."""
    return "last_only" in inspect.signature(cls.forward).parameters


def forward_logits(decoder: torch.nn.Module, ids: torch.Tensor, cache: object, last_only: bool,
                   **kwargs: object) -> torch.Tensor:
    """decoder(ids (B, T), cache, **kwargs) -> logits (B, T or 1, V): the last row only when last_only and
    the decoder can (LlamaDecoder's last_only skips the vocabulary projection of the others)."""
    if last_only and _takes_last_only(type(decoder)):
        kwargs["last_only"] = True
    return decoder(ids, cache, **kwargs)


def croppable_cache(decoder: torch.nn.Module, name: str) -> object:
    """The cache the decoder fills by default (decoder.make_cache() or a KVCache); it must be able to crop."""
    cache = decoder.make_cache() if hasattr(decoder, "make_cache") else KVCache()
    if not callable(getattr(cache, "crop", None)):
        raise TypeError(f"the {name}'s cache, {type(cache).__name__}, has no crop(seq_len): speculative decoding "
                        f"must roll back rejected draft tokens")
    return cache


class DecoderDraft:
    """A draft model with its own KV cache: proposes k tokens, one forward each, from q = its processed softmax."""

    def __init__(self, decoder: torch.nn.Module, sampling: dict | None, generator: torch.Generator | None) -> None:
        self.decoder, self.sampling, self.generator = decoder, sampling, generator
        self.cache = croppable_cache(decoder, "draft")

    def propose(self, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens (1, L) -> drafts (k,) and q (k, V) (None when greedy)."""
        fed, drafts, qs = tokens[:, self.cache.seq_len:], [], []   # first the tokens it has not cached
        for _ in range(k):
            logits = forward_logits(self.decoder, fed, self.cache, True)[:, -1]  # (1, V)
            if self.sampling is None:
                fed = logits.argmax(dim=-1, keepdim=True)                  # (1, 1)
            else:
                qs.append(process_logits(logits, **self.sampling).softmax(dim=-1))
                fed = sample_probs(qs[-1], self.generator)[:, None]
            drafts.append(fed[0])
        return torch.cat(drafts) if drafts else tokens.new_empty(0), torch.cat(qs) if qs else None

    def rollback(self, seq_len: int) -> None:
        """Forget what it cached beyond the first seq_len tokens (its rejected drafts)."""
        self.cache.crop(min(seq_len, self.cache.seq_len))


class LookupDraft:
    """PromptLookup behind the drafter interface: its proposals, q None (a point mass), nothing to roll back."""

    def __init__(self, lookup: PromptLookup) -> None:
        self.lookup = lookup

    def propose(self, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, None]:
        return self.lookup.propose(tokens[0], k).long(), None   # int64, as the target's choices

    def rollback(self, seq_len: int) -> None:
        pass
