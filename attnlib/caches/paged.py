"""A paged KV cache (PagedAttention, Kwon et al. 2023): keys and values live in fixed-size blocks of a
shared pool, and each sequence's block table lists, in order, the blocks that hold its positions.

Position p of sequence b is slot p % block_size of block block_table[b, p // block_size]. Memory is
taken one block at a time, so a sequence wastes less than one block, whatever its final length,
where a contiguous cache sized for the longest possible sequence wastes everything it does not use.
"""

from __future__ import annotations

import torch

from attnlib.caches._base import LayeredCache

__all__ = ["PagedKVCache"]


class PagedKVCache(LayeredCache):
    """A drop-in for KVCache whose positions live in blocks of `block_size` tokens.

    Each layer has a pool of blocks (num_blocks, block_size, H_kv, Dh) for keys and one for values; all
    layers share the block table (B, blocks per sequence), as in vLLM. Blocks are handed out in order,
    so the blocks of one sequence are not contiguous. `update` gathers a layer's blocks into
    (B, H_kv, S, Dh): the same values, bit for bit, as KVCache returns. (A PagedAttention kernel reads
    the blocks in place instead of gathering them.)
    """

    def __init__(self, block_size: int = 16) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1 (tokens per block), got {block_size!r}")
        super().__init__()
        self.block_size = block_size
        self._pools: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: k and v pools
        self._table = torch.empty(0, 0, dtype=torch.long)           # (B, blocks per sequence)
        self._capacity = 0                                          # blocks each pool can hold
        self.num_blocks = 0                                         # blocks handed out so far

    @property
    def block_table(self) -> torch.Tensor:
        """The block table, (B, blocks per sequence) int64; block_table[b, i] holds positions i·block_size .. (i+1)·block_size - 1
        of sequence b."""
        return self._table

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values cached (the filled slots), as KVCache.nbytes counts them."""
        return sum(k.shape[2] * (k.shape[3] + v.shape[3]) * n * self._table.shape[0] * k.element_size()
                   for (k, v), n in zip(self._pools, self._len))

    @property
    def reserved_nbytes(self) -> int:
        """Bytes of the blocks handed out (filled or not), which is what the cache takes from the pool."""
        return sum(self.num_blocks * k[0].numel() * k.element_size() + self.num_blocks * v[0].numel() * v.element_size()
                   for k, v in self._pools)

    def _allocate(self, positions: int) -> None:
        """Give every sequence enough blocks for `positions` positions, growing the pools if they are full."""
        B, have = self._table.shape
        need = -(-positions // self.block_size) - have   # ceil(positions / block_size) - blocks held
        if need <= 0:
            return
        new = torch.arange(self.num_blocks, self.num_blocks + need * B).view(need, B).T  # (B, need): interleaved
        self._table = torch.cat((self._table, new.to(self._table.device)), dim=1)
        self.num_blocks += need * B
        if self.num_blocks > self._capacity:
            self._capacity = max(2 * self._capacity, self.num_blocks, 4)
            self._pools = [tuple(self._grown(pool) for pool in pair) for pair in self._pools]

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
        if self._check(layer_idx, k, v):
            if layer_idx == 0:
                self._table = self._table.new_empty(k.shape[0], 0).to(k.device)
            self._pools.append(tuple(t.new_empty(self._capacity, self.block_size, t.shape[1], t.shape[3])
                                     for t in (k, v)))
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
