"""Prompt lookup (Saxena 2023): a draft for speculative decoding that needs no second model.

When the output copies from the input (a summary quoting its source, code being edited, a passage
rewritten), the tokens that follow the context's last n-gram have often been seen before: right
after an earlier occurrence of that n-gram. The drafter proposes them; the target model verifies
them as it verifies any draft (attnlib.speculative_generate). Its proposals are deterministic, so
as a distribution each one is a point mass q = 1[x = proposed token].
"""

from __future__ import annotations

import torch

__all__ = ["PromptLookup"]


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
        if isinstance(ngram_size, bool) or not isinstance(ngram_size, int) or ngram_size < 1:
            raise ValueError(f"ngram_size must be an int >= 1 (the longest n-gram matched), got {ngram_size!r}")
        self.ngram_size = ngram_size

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
