"""A paged KV cache (PagedAttention, Kwon et al. 2023): keys and values live in fixed-size blocks of a
shared pool, and each sequence's block table lists, in order, the blocks that hold its positions.

Position p of sequence b is slot p % block_size of block block_table[b, p // block_size]. Memory is
taken one block at a time, so a sequence wastes less than one block, whatever its final length,
where a contiguous cache sized for the longest possible sequence wastes everything it does not use.

Used directly, a PagedKVCache holds one batch whose rows grow together. For serving (attnlib.serve),
it holds independent sequences instead: `add_sequence()` opens one, `batch(seqs)` runs any of them
together through a decoder, each at its own length, and `free_sequence(seq)` gives its blocks back to
the pool at once, for the next request to take.
"""

from __future__ import annotations

import torch

from attnlib._checks import require_count
from attnlib.caches._base import LayeredCache
from attnlib.caches.paged_batch import PagedBatch

__all__ = ["PagedKVCache"]


class PagedKVCache(LayeredCache):
    """A drop-in for KVCache whose positions live in blocks of `block_size` tokens.

    Each layer has a pool of blocks (num_blocks, block_size, H_kv, Dh) for keys and one for values; all
    layers share the block table (B, blocks per sequence), as in vLLM. Blocks are handed out in order
    (blocks given back first), so the blocks of one sequence are not contiguous. max_blocks bounds the
    pool (None: it grows as needed); taking a block beyond it is a ValueError. `update` gathers a
    layer's blocks into (B, H_kv, S, Dh): the same values, bit for bit, as KVCache returns. (A
    PagedAttention kernel reads the blocks in place instead of gathering them.)
    """

    def __init__(self, block_size: int = 16, *, max_blocks: int | None = None) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1 (tokens per block), got {block_size!r}")
        if max_blocks is not None:
            require_count(max_blocks, "max_blocks", 1, "the blocks the pool may hold, or None: no limit")
        super().__init__()
        self.block_size, self.max_blocks = block_size, max_blocks
        self._pools: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: k and v pools
        self._table = torch.empty(0, 0, dtype=torch.long)           # (B, blocks per sequence)
        self._capacity = 0                                          # blocks each pool can hold
        self._created = 0                                           # blocks ever handed out: 0 .. _created - 1
        self._free: list[int] = []                                  # blocks given back, taken again first
        self._blocks: dict[int, list[int]] = {}                     # per independent sequence: its blocks
        self._lengths: dict[int, int] = {}                          # per independent sequence: positions held
        self._next_seq = 0

    @property
    def num_blocks(self) -> int:
        """Blocks held by the sequences now (handed out and not given back)."""
        return self._created - len(self._free)

    @property
    def block_table(self) -> torch.Tensor:
        """The block table, (B, blocks per sequence) int64; block_table[b, i] holds positions i·block_size .. (i+1)·block_size - 1
        of sequence b."""
        return self._table

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values cached (the filled slots), as KVCache.nbytes counts them."""
        held = [n * self._table.shape[0] for n in self._len] or [sum(self._lengths.values())] * len(self._pools)
        return sum(k.shape[2] * (k.shape[3] + v.shape[3]) * n * k.element_size() for (k, v), n in zip(self._pools, held))

    @property
    def reserved_nbytes(self) -> int:
        """Bytes of the blocks handed out (filled or not), which is what the cache takes from the pool."""
        return sum(self.num_blocks * k[0].numel() * k.element_size() + self.num_blocks * v[0].numel() * v.element_size()
                   for k, v in self._pools)

    def _take(self, n: int) -> list[int]:
        """n blocks from the pool (given-back ones first), growing the pools if they are full."""
        if self.max_blocks is not None and self.num_blocks + n > self.max_blocks:
            raise ValueError(f"the pool is full: {self.num_blocks} of max_blocks={self.max_blocks} blocks are "
                             f"held, {n} more were asked for")
        self._free.sort(reverse=True)
        reused = [self._free.pop() for _ in range(min(n, len(self._free)))]
        fresh = list(range(self._created, self._created + n - len(reused)))
        self._created += len(fresh)
        if self._created > self._capacity:
            self._capacity = max(2 * self._capacity, self._created, 4)
            if self.max_blocks is not None:
                self._capacity = min(self._capacity, self.max_blocks)
            self._pools = [tuple(self._grown(pool) for pool in pair) for pair in self._pools]
        return reused + fresh

    def _allocate(self, positions: int) -> None:
        """Give every sequence enough blocks for `positions` positions, growing the pools if they are full."""
        B, have = self._table.shape
        need = -(-positions // self.block_size) - have   # ceil(positions / block_size) - blocks held
        if need <= 0:
            return
        new = torch.tensor(self._take(need * B)).view(need, B).T  # (B, need): interleaved
        self._table = torch.cat((self._table, new.to(self._table.device)), dim=1)

    def _grown(self, pool: torch.Tensor) -> torch.Tensor:
        grown = pool.new_empty(self._capacity, *pool.shape[1:])  # (capacity, block_size, H_kv, Dh)
        grown[:pool.shape[0]] = pool
        return grown

    def _slots(self, start: int, end: int) -> torch.Tensor:
        """(B, end - start) indices into a pool viewed as (capacity · block_size, H_kv, Dh)."""
        p = torch.arange(start, end, device=self._table.device)
        return self._table[:, p // self.block_size] * self.block_size + p % self.block_size

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k (B, H_kv, S_new, Dh) and v (B, H_kv, S_new, Dv) to layer `layer_idx`.

        Returns everything that layer has cached, gathered from its blocks: (B, H_kv, S_past + S_new, Dh)
        and (..., Dv).
        """
        if self._next_seq:
            raise ValueError("this PagedKVCache holds independent sequences (add_sequence): run them "
                             "through cache.batch(seqs), not update")
        if self._check(layer_idx, k, v):
            if layer_idx == 0:
                self._table = self._table.new_empty(k.shape[0], 0).to(k.device)
            self._add_layer(k, v)
        start = self._len[layer_idx]
        end = start + k.shape[2]
        self._allocate(end)
        out = []
        for pool, new in zip(self._pools[layer_idx], (k, v)):
            flat = pool.view(-1, *pool.shape[2:])                          # (capacity · block_size, H_kv, Dh)
            flat[self._slots(start, end)] = new.transpose(1, 2)           # (B, S_new, H_kv, Dh) into their slots
            out.append(flat[self._slots(0, end)].transpose(1, 2))           # (B, S, H_kv, Dh) -> (B, H_kv, S, Dh)
        self._len[layer_idx] = end
        return out[0], out[1]

    def _add_layer(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Pools (capacity, block_size, H_kv, Dh) for one more layer, shaped after its k and v."""
        self._pools.append(tuple(t.new_empty(self._capacity, self.block_size, t.shape[1], t.shape[3])
                                 for t in (k, v)))

    # --- independent sequences (serving) ---------------------------------------------------------

    def add_sequence(self) -> int:
        """Open an empty sequence; returns its id. It takes blocks only as it grows."""
        if len(self):
            raise ValueError("this PagedKVCache holds one batch filled by update(); start a new PagedKVCache()")
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        self._blocks[seq], self._lengths[seq] = [], 0
        return seq

    def free_sequence(self, seq: int) -> None:
        """Give sequence `seq`'s blocks back to the pool now."""
        self._free += self._blocks.pop(self._seq(seq))
        del self._lengths[seq]

    def sequence_length(self, seq: int) -> int:
        """Positions sequence `seq` holds."""
        return self._lengths[self._seq(seq)]

    def batch(self, seqs: list[int], new_lengths: list[int] | None = None) -> PagedBatch:
        """The sequences `seqs` as one batch for a decoder's cache argument (see PagedBatch; new_lengths:
        each row's real new tokens when they differ, left-padded)."""
        return PagedBatch(self, [self._seq(s) for s in seqs], new_lengths)

    def _seq(self, seq: int) -> int:
        if seq not in self._blocks:
            raise ValueError(f"seq={seq!r} is not an open sequence of this cache (open: {sorted(self._blocks)})")
        return seq

    def _sequence_slots(self, seq: int, positions: torch.Tensor) -> torch.Tensor:
        """Slots (flat pool indices) of `positions` of sequence `seq`, taking blocks to cover them."""
        blocks = self._blocks[seq]
        need = -(-(int(positions.max()) + 1) // self.block_size) - len(blocks) if positions.numel() else 0
        if need > 0:
            blocks += self._take(need)
        table = torch.tensor(blocks, dtype=torch.long, device=positions.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size
