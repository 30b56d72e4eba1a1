"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a cheap draft guesses k tokens, the
target model scores all of them in one forward, and a rejection rule keeps the target's distribution.

With x_1 .. x_k drafted from q_1 .. q_k and the target's p_1 .. p_{k+1} (each conditioned on the
context and the drafts before it), draft x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)).
At the first rejection the token is drawn instead from the residual normalize(max(0, p_i - q_i)); if
all k are accepted, a bonus token is drawn from p_{k+1}. Each emitted token is then distributed
exactly as p_i:  P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) · max(0, p(x) - q(x)) / Z
= min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x), since Z = sum_y max(0, p(y) - q(y)) = 1 - sum_y min(p, q).
A deterministic draft (prompt lookup, or greedy decoding) is a point mass q = 1[x = x_i]: x_i is
accepted with probability p(x_i), and the residual is p with x_i removed, renormalised. Greedy
decoding keeps the drafts up to the first that differs from the target's argmax, then the argmax.

Each round emits 1 .. k + 1 tokens for one target forward; with a per-token acceptance rate a, it emits
(1 - a^{k+1}) / (1 - a) on average (Leviathan et al., eq. 1). Both models keep KV caches, cropped back
to the accepted tokens after each round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlib._checks import require_count
from attnlib.decoder import check_token_ids
from attnlib.drafts import DecoderDraft, LookupDraft, PromptLookup, croppable_cache, forward_logits, vocab_size
from attnlib.generation import _check_sampling, _eos_ids, process_logits, sample_probs

__all__ = ["speculative_generate", "accept_reject", "SpeculativeStats"]


@dataclass
class SpeculativeStats:
    """What a speculative_generate run did: target forwards, draft tokens proposed, checked and accepted
    (a draft after a rejected one is proposed but never checked)."""
    target_calls: int = 0
    drafted: int = 0
    checked: int = 0
    accepted: int = 0
    new_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The chance that a checked draft is kept (accepted / checked draft tokens), Leviathan et al.'s alpha."""
        return self.accepted / self.checked if self.checked else 0.0

    @property
    def tokens_per_call(self) -> float:
        """New tokens / target forwards (1 for plain decoding)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0


def accept_reject(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule on N independent rounds: returns (accepted (N,), token (N,)).

    p (N, k + 1, V): the target's probabilities at each draft position and after the last; q (N, k, V):
    the draft's, from which drafts (N, k) were drawn. Row n keeps drafts[n, :accepted[n]], then emits
    token[n], drawn from normalize(max(0, p_i - q_i)) at the first rejection i, or from p_{k+1}.
    """
    N, k = drafts.shape
    p_x = p[:, :k].gather(-1, drafts[..., None])[..., 0].double()          # (N, k): p_i(x_i)
    q_x = q.gather(-1, drafts[..., None])[..., 0].double()                 # (N, k): q_i(x_i)
    u = torch.rand(N, k, generator=generator, dtype=torch.float64, device=p.device)
    accepted = (u * q_x < p_x).long().cumprod(dim=-1).sum(dim=-1)         # (N,): u < p/q, up to the first no
    q_next = torch.cat((q, q.new_zeros(N, 1, q.shape[-1])), dim=1)         # (N, k + 1, V): q = 0 after the drafts
    at = accepted.view(N, 1, 1).expand(N, 1, p.shape[-1])                  # (N, 1, V)
    p_i, q_i = p.gather(1, at)[:, 0], q_next.gather(1, at)[:, 0]           # (N, V) each
    residual = (p_i - q_i).clamp(min=0)                                    # max(0, p - q), normalised by the draw
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_i)  # p = q up to rounding: p
    return accepted, sample_probs(residual, generator)


def _verify(logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, sampling: dict | None,
            generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """The target's logits (k + 1, V) against drafts (k,) -> (drafts accepted, the token after them).

    Greedy: the drafts up to the first that is not the target's argmax, then the argmax there. Sampled:
    accept_reject on p = the processed softmax and q (None: the point mass of a deterministic draft).
    """
    if sampling is None:
        best = logits.argmax(dim=-1)                                                   # (k + 1,)
        accepted = int((drafts == best[:len(drafts)]).long().cumprod(0).sum())
        return accepted, best[accepted]
    p = process_logits(logits, **sampling).softmax(dim=-1)                              # (k + 1, V)
    q = F.one_hot(drafts, p.shape[-1]).to(p.dtype) if q is None else q.to(p.dtype)     # (k, V)
    accepted, token = accept_reject(p[None], q[None], drafts[None], generator)
    return int(accepted[0]), token[0]


def _check_args(target: torch.nn.Module, draft: object, input_ids: torch.Tensor, max_new_tokens: int,
                num_draft_tokens: int) -> int:
    """The target's vocabulary size, after a ValueError/TypeError naming any bad argument."""
    check_token_ids(input_ids)
    if input_ids.shape[0] != 1:
        raise ValueError(f"input_ids of shape (B={input_ids.shape[0]}, T={input_ids.shape[1]}) is not (1, T): "
                         f"speculative decoding runs one sequence")
    require_count(max_new_tokens, "max_new_tokens", 0, "new tokens at most")
    require_count(num_draft_tokens, "num_draft_tokens", 1, "tokens drafted per target forward")
    V = vocab_size(target, "target")
    if not isinstance(draft, PromptLookup) and vocab_size(draft, "draft (or an attnlib.PromptLookup)") != V:
        raise ValueError(f"draft has a vocabulary of {draft.embed.num_embeddings} tokens but target has {V}: "
                         f"the draft must share the target's vocabulary")
    for name, model in (("target", target), ("draft", draft)):
        limit = getattr(model, "max_position_embeddings", None)
        if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
            raise ValueError(f"{input_ids.shape[1]} prompt tokens + max_new_tokens={max_new_tokens} are beyond "
                             f"the {name}'s max_position_embeddings={limit}")
    return V


@torch.inference_mode()
def speculative_generate(target: torch.nn.Module, draft: torch.nn.Module | PromptLookup, input_ids: torch.Tensor,
                         max_new_tokens: int, *, num_draft_tokens: int = 4, do_sample: bool = False,
                         temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None, eos_token_id: int | Sequence[int] | None = None,
                         stats: SpeculativeStats | None = None) -> torch.Tensor:
    """input_ids (1, T) -> (1, T + n), n <= max_new_tokens, distributed as generate(target, ...)'s output.

    Greedy: exactly generate's tokens (the target scores k + 1 tokens per forward where generate scores
    one: the logits agree to float rounding, so only a near tie between two tokens could part them).
    Sampled (do_sample, with generate's temperature/top_k/top_p): exactly the target's distribution,
    drafts accepted by the rule of accept_reject. draft: a decoder with the target's vocabulary, or a
    PromptLookup. stats, if given, counts target calls and drafts.
    """
    V = _check_args(target, draft, input_ids, max_new_tokens, num_draft_tokens)
    _check_sampling(do_sample, temperature, top_k, top_p, generator)
    eos = _eos_ids(eos_token_id, V)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p) if do_sample else None
    drafter = LookupDraft(draft) if isinstance(draft, PromptLookup) else DecoderDraft(draft, sampling, generator)
    cache = croppable_cache(target, "target")
    stats = SpeculativeStats() if stats is None else stats
    T = input_ids.shape[1]
    out = input_ids.new_empty(1, T + max_new_tokens)         # (1, T + new): the prompt, then the new tokens
    out[:, :T], L = input_ids, T                              # L: tokens so far; the cache holds L - 1 of them
    while L < T + max_new_tokens:
        drafts, q = drafter.propose(out[:, :L], min(num_draft_tokens, T + max_new_tokens - L - 1))
        k = len(drafts)
        if L - 1 > cache.seq_len:                             # the prompt's prefill, all but its last token
            forward_logits(target, out[:, cache.seq_len:L - 1], cache, True)
        logits = target(torch.cat((out[0, L - 1:L], drafts))[None], cache)[0]  # (k + 1, V): p_1 .. p_{k+1}
        accepted, token = _verify(logits, drafts, q, sampling, generator)
        new = torch.cat((drafts[:accepted], token.view(1)))   # (accepted + 1,)
        if eos is not None and torch.isin(new, eos).any():    # stop after the first eos
            new = new[:int(torch.isin(new, eos).long().argmax()) + 1]
            max_new_tokens = L + len(new) - T
        out[0, L:L + len(new)] = new
        L += len(new)
        cache.crop(L - 1)
        drafter.rollback(L - 1)
        stats.target_calls, stats.drafted = stats.target_calls + 1, stats.drafted + k
        stats.checked += min(accepted + 1, k)                 # up to the first rejection, itself included
        stats.accepted, stats.new_tokens = stats.accepted + accepted, stats.new_tokens + len(new)
    return out[:, :L]
