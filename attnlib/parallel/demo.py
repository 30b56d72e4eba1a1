"""What chapter 17 runs in each process (launch needs importable functions, so they live here).

run_all(rank, W, ...) checks every method against one process's attention on the same data (forward and
backward), counts what each sends and the ring's work, and times each method's attention core; everything
comes back as plain numbers, one dict per rank.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from attnlib.attention import attention
from attnlib.masks import causal_mask
from attnlib.mha import MultiHeadAttention
from attnlib.parallel.comm import tally
from attnlib.parallel.layout import shard
from attnlib.parallel.ring import ring_attention
from attnlib.parallel.tensor_parallel import TensorParallelAttention
from attnlib.parallel.ulysses import ulysses_attention

__all__ = ["run_all", "time_methods", "METHODS"]

METHODS = {"ring": ("ring", "contiguous"), "ring zig-zag": ("ring", "zigzag"), "ulysses": ("ulysses", "contiguous")}


def _sequence_method(name: str, q, k, v, rank: int, W: int, causal: bool) -> tuple[torch.Tensor, list]:
    """This rank's output and its q, k, v leaves, for one of METHODS."""
    method, layout = METHODS[name]
    leaves = [shard(x, rank, W, layout=layout).requires_grad_() for x in (q, k, v)]
    fn = ring_attention if method == "ring" else ulysses_attention
    kwargs = dict(layout=layout) if method == "ring" else {}
    return fn(*leaves, is_causal=causal, **kwargs), leaves


def _check_sequence(rank: int, W: int, T: int, H: int, Dh: int) -> dict:
    """Max |difference| from full attention (float64), forward and backward; bytes sent; scores computed."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, H, T, Dh, generator=g, dtype=torch.float64) for _ in range(4))
    out = {}
    for causal in (False, True):
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        ref, _ = attention(*full, causal_mask(T) if causal else None)
        ref.backward(dout)
        for name, (_, layout) in METHODS.items():
            with tally() as fwd:
                o, leaves = _sequence_method(name, q, k, v, rank, W, causal)
            with tally() as bwd:
                o.backward(shard(dout, rank, W, layout=layout))
            out[name, causal] = dict(
                forward=(o - shard(ref, rank, W, layout=layout)).abs().max().item(),
                backward=max((a.grad - shard(b.grad, rank, W, layout=layout)).abs().max().item()
                             for a, b in zip(leaves, full)),
                bytes=(fwd.total, bwd.total), scores=fwd.scores)
    return out


def _check_tensor_parallel(rank: int, W: int, T: int, H: int, H_kv: int, Dh: int) -> dict:
    """TP heads against the whole layer (float64, causal): output, gradient of x, bytes sent."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(H * Dh, H, H_kv).double()
    x = torch.randn(1, T, H * Dh, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    tp = TensorParallelAttention.from_module(mha)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = mha(x1, is_causal=True)
    with tally() as fwd:
        mine = tp(x2, is_causal=True)
    ref.sum().backward()
    with tally() as bwd:
        mine.sum().backward()
    return dict(forward=(mine - ref).abs().max().item(), backward=(x2.grad - x1.grad).abs().max().item(),
                bytes=(fwd.total, bwd.total), heads=(tp.heads.start, tp.heads.stop), kv_heads=(tp.kv_heads.start, tp.kv_heads.stop))


def time_methods(rank: int, W: int, T: int, H: int, Dh: int, repeats: int) -> dict:
    """Median seconds of `repeats` runs (after one warm-up) of each method's causal attention core, forward
    and backward, on this rank (float32; q, k, v already sharded, no projections). The ranks meet at a
    barrier before each run, so each run starts together on every rank."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, Dh, generator=g) for _ in range(3))

    def run(name: str) -> float:
        if W > 1:
            dist.barrier()
        start = time.perf_counter()
        o, _ = _sequence_method(name, q, k, v, rank, W, True)
        o.sum().backward()
        return time.perf_counter() - start
    out = {}
    for name in METHODS:
        run(name)  # warm-up
        out[name] = statistics.median(run(name) for _ in range(repeats))
    return out


def _errors(rank: int, W: int, T: int, H: int, Dh: int) -> dict:
    """The messages of the errors chapter 17 shows: Ulysses with fewer heads than ranks, a sequence that
    does not split, TP ranks given different inputs."""
    def message(fn) -> str:
        try:
            fn()
        except ValueError as e:
            return str(e)
        return "no error"
    x = torch.randn(1, T, H * Dh, generator=torch.Generator().manual_seed(rank))  # a different x on each rank
    q = torch.zeros(1, 1, T // W, Dh)  # one head
    tp = TensorParallelAttention.from_module(MultiHeadAttention(H * Dh, H), check_inputs=True)
    return dict(ulysses=message(lambda: ulysses_attention(q, q, q)), shard=message(lambda: shard(x[:, None, :T - 1], rank, W)),
                tensor_parallel=message(lambda: tp(x)))


def run_all(rank: int, W: int, T: int = 32, H: int = 4, Dh: int = 8, T_time: int = 512, repeats: int = 5) -> dict:
    """Every check of chapter 17 in one process of W; returns plain data, with the seconds spent in here."""
    start = time.perf_counter()
    out = dict(sequence=_check_sequence(rank, W, T, H, Dh), errors=_errors(rank, W, T, H, Dh),
               tensor_parallel={kv: _check_tensor_parallel(rank, W, T, H, kv, Dh) for kv in (H, H // 2, 1)},
               seconds=time_methods(rank, W, T_time, H, Dh, repeats) if T_time else {})
    return out | dict(busy=time.perf_counter() - start)

