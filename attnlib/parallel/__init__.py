"""Attention split across processes (torch.distributed, gloo on CPU; the same code runs under torchrun).

- launch(fn, W, *args): fn(rank, W, *args) in W processes of one process group, results as a list.
- ring_attention / ulysses_attention: each rank holds a block of the sequence (layout.shard).
- TensorParallelAttention.from_module(mha): each rank holds some of the heads.
- tally(): the bytes each collective sent from this process, and ring attention's work;
  bytes_per_rank(...): the same from the formula.
"""

from attnlib.parallel.comm import Tally, tally, world
from attnlib.parallel.cost import bytes_per_rank
from attnlib.parallel.launch import WorkerError, launch
from attnlib.parallel.layout import causal_pairs, chunk_ids, shard, unshard
from attnlib.parallel.ring import ring_attention
from attnlib.parallel.tensor_parallel import TensorParallelAttention, head_ranges, qkv_rows
from attnlib.parallel.ulysses import heads_to_seq, seq_to_heads, ulysses_attention

__all__ = ["launch", "WorkerError", "ring_attention", "ulysses_attention", "TensorParallelAttention", "head_ranges", "qkv_rows",
           "tally", "Tally", "bytes_per_rank", "world", "shard", "unshard", "chunk_ids", "causal_pairs", "seq_to_heads", "heads_to_seq"]
