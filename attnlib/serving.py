"""Continuous batching (iteration-level scheduling, Yu et al. 2022, "Orca") over a paged KV cache.

A static batch runs its requests together until the longest has finished: the rows that finish early
idle, and new requests wait for the whole batch. Continuous batching schedules per iteration instead:
every iteration, each running request gets one more token from one decoder forward over the batch
(rows at different lengths: a left-padded batch of their paged sequences, attnlib.caches.PagedBatch);
a request that has finished leaves at once, its KV blocks back in the pool, and waiting requests join.

Admission (first come, first served): a waiting request joins while the batch has fewer than
max_batch_size requests and the pool can hold it at its longest beside the running requests at theirs:
sum of ceil((prompt + max_new - 1) / block_size) <= max_blocks. So no request is ever preempted,
while blocks are still taken only as sequences grow (what the pool's occupancy shows). The requests
that join in one iteration are prefilled together, in one forward over their prompts left-padded to
the longest, which gives each its first token; from then on each decodes with the batch. Greedy
decoding: each output equals generate's alone (a batched, padded forward computes the same logits up
to float rounding, so only a near tie between two tokens could part them).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from attnlib._checks import require_count
from attnlib.caches import PagedKVCache
from attnlib.generation import _eos_ids
from attnlib.drafts import forward_logits, vocab_size

__all__ = ["serve", "ServeStats"]


@dataclass
class ServeStats:
    """What a serve run did. Per decode iteration: the requests decoded together (`batches`), the pool's
    blocks held after it (`blocks_in_use`, of `num_blocks`) and the seconds since the start (`iteration_s`).
    Per request: the iteration it joined in (`joined`), and the seconds since the start at which each of
    its tokens came (`token_s`; the first is its time to first token)."""
    num_blocks: int = 0
    batches: list[list[int]] = field(default_factory=list)
    blocks_in_use: list[int] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    token_s: list[list[float]] = field(default_factory=list)

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    @property
    def time_to_first_token(self) -> list[float]:
        return [t[0] if t else float("nan") for t in self.token_s]


def _check(decoder: torch.nn.Module, prompts: object, max_new_tokens: object, max_batch_size: int,
           block_size: int) -> list[int]:
    """max_new_tokens as one int per prompt, after a ValueError naming any bad argument."""
    V = vocab_size(decoder, "decoder")
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        got = "an empty list" if isinstance(prompts, Sequence) else f"a {type(prompts).__name__}"
        raise ValueError(f"prompts must be a non-empty list of 1-D token id tensors, got {got}")
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or len(p) < 1 or p.is_floating_point() or p.dtype == torch.bool:
            shape = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"prompts[{i}] must be a 1-D integer tensor of T >= 1 token ids, got {shape}")
        if int(p.min()) < 0 or int(p.max()) >= V:
            raise ValueError(f"prompts[{i}] holds a token id outside [0, vocab_size={V})")
    counts = [max_new_tokens] * len(prompts) if not isinstance(max_new_tokens, Sequence) else list(max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(counts)} entries for {len(prompts)} prompts: give one per prompt, or an int")
    for n in counts:
        require_count(n, "max_new_tokens", 0, "new tokens per prompt; an int or a list of them")
    require_count(max_batch_size, "max_batch_size", 1, "requests decoded together")
    require_count(block_size, "block_size", 1, "tokens per block")
    limit = getattr(decoder, "max_position_embeddings", None)
    for i, (p, n) in enumerate(zip(prompts, counts)):
        if limit is not None and len(p) + n > limit:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens; + max_new_tokens={n} = {len(p) + n} positions "
                             f"are beyond the model's max_position_embeddings={limit}")
    return counts


def _prefill(decoder: torch.nn.Module, cache: PagedKVCache, seqs: list[int], prompts: list[torch.Tensor]) -> list[int]:
    """Prefill new sequences with their prompts in one forward (left-padded to the longest): the greedy
    first token of each."""
    T = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat((p.new_zeros(T - len(p)), p)).long() for p in prompts])  # (J, T) left-padded
    batch = cache.batch(seqs, [len(p) for p in prompts])
    logits = forward_logits(decoder, ids, batch, True, attention_mask=batch.attention_mask(T))  # (J, 1 or T, V)
    return logits[:, -1].argmax(dim=-1).tolist()


@torch.inference_mode()
def serve(decoder: torch.nn.Module, prompts: Sequence[torch.Tensor], max_new_tokens: int | Sequence[int], *,
          max_batch_size: int = 8, block_size: int = 16, eos_token_id: int | Sequence[int] | None = None,
          max_blocks: int | None = None, stats: ServeStats | None = None) -> list[torch.Tensor]:
    """Greedy-decode every prompt (T_i,) by continuous batching -> [(T_i + n_i,)], each equal to
    generate(decoder, prompt[None], max_new_tokens_i, eos_token_id=...)[0].

    max_blocks: the pool's size in blocks of block_size positions (default: max_batch_size times the
    longest request's blocks, so memory never holds a request back). stats, if given, is filled.
    """
    counts = _check(decoder, prompts, max_new_tokens, max_batch_size, block_size)
    eos = _eos_ids(eos_token_id, decoder.embed.num_embeddings)
    needs = [-(-(len(p) + n - 1) // block_size) for p, n in zip(prompts, counts)]  # blocks at the longest
    max_blocks = max_batch_size * max(needs) if max_blocks is None else max_blocks
    cache = PagedKVCache(block_size, max_blocks=max_blocks)
    for i, need in enumerate(needs):
        if need > max_blocks:
            raise ValueError(f"prompts[{i}] ({len(prompts[i])} tokens, max_new_tokens={counts[i]}) needs {need} "
                             f"blocks of {block_size} positions; the pool holds max_blocks={max_blocks}")
    stats = ServeStats() if stats is None else stats
    stats.num_blocks, stats.joined, stats.token_s = max_blocks, [-1] * len(prompts), [[] for _ in prompts]
    new: list[list[int]] = [[] for _ in prompts]                 # each request's tokens so far
    waiting, running = deque(i for i, n in enumerate(counts) if n > 0), {}  # running: request -> sequence
    reserved, start = 0, time.perf_counter()

    def emit(r: int, token: int) -> None:
        """Append request r's next token; a finished request leaves and frees its blocks now."""
        nonlocal reserved
        new[r].append(token)
        stats.token_s[r].append(time.perf_counter() - start)
        if len(new[r]) == counts[r] or (eos is not None and token in eos):
            cache.free_sequence(running.pop(r))
            reserved -= needs[r]

    while waiting or running:
        joining = []
        while waiting and len(running) < max_batch_size and reserved + needs[waiting[0]] <= max_blocks:
            r = waiting.popleft()
            running[r], reserved, stats.joined[r] = cache.add_sequence(), reserved + needs[r], len(stats.batches)
            joining.append(r)
        if joining:                                               # their prefills in one forward: first tokens
            for r, token in zip(joining, _prefill(decoder, cache, [running[r] for r in joining],
                                                  [prompts[r] for r in joining])):
                emit(r, token)
        if not running:
            continue
        batch_ids = list(running)                                 # one forward, one new token per request
        batch = cache.batch([running[r] for r in batch_ids])
        last = torch.tensor([new[r][-1] for r in batch_ids])[:, None]           # (B, 1)
        logits = forward_logits(decoder, last, batch, True, attention_mask=batch.attention_mask(1))  # (B, 1, V)
        for r, token in zip(batch_ids, logits[:, -1].argmax(dim=-1).tolist()):
            emit(r, token)
        stats.batches.append(batch_ids)
        stats.blocks_in_use.append(cache.num_blocks)
        stats.iteration_s.append(time.perf_counter() - start)
    return [torch.cat((p, torch.tensor(n, dtype=p.dtype))) for p, n in zip(prompts, new)]
