"""The collectives attnlib.parallel uses, each counting the bytes this process sends while a tally runs.

W processes in a group; a tensor of n bytes:

- ring_shift: this rank sends its tensor to rank r + 1 and receives rank r - 1's: n bytes sent.
- all_to_all: chunk j of W goes to rank j; the own chunk stays: (W - 1)/W · n bytes sent.
- all_reduce (sum): gloo's CPU all-reduce is by default a ring (a reduce-scatter, then an all-gather),
  which sends 2(W - 1)/W · n per rank; that is what is recorded, from the size of the tensor handed to it.
Every count is the payload handed to the call, not bytes read off the socket.

Without an initialised process group everything runs as a group of one: nothing is sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["Tally", "tally", "record", "record_scores", "world", "ring_shift", "all_to_all", "all_reduce"]


@dataclass
class Tally:
    """What this process did while `tally()` ran: bytes sent per collective, and the (query, key)
    scores ring attention computed (its work, to compare ranks' loads)."""

    bytes_sent: dict[str, int] = field(default_factory=Counter)  # a Counter: missing collectives read 0
    scores: int = 0

    @property
    def total(self) -> int:
        """All bytes sent, over every collective."""
        return sum(self.bytes_sent.values())


_active: list[Tally] = []


@contextmanager
def tally() -> Iterator[Tally]:
    """`with tally() as t: ...` then t.bytes_sent['all_to_all'], t.total, t.scores (this process only)."""
    t = Tally()
    _active.append(t)
    try:
        yield t
    finally:
        _active.remove(t)


def record(op: str, nbytes: int) -> None:
    """Add nbytes sent by collective `op` to every running tally."""
    for t in _active:
        t.bytes_sent[op] += nbytes


def record_scores(n: int) -> None:
    """Add n computed (query, key) scores to every running tally."""
    for t in _active:
        t.scores += n


def world(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """(this process's rank in the group, the group's size); (0, 1) when no process group is set up."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("group was given, but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def ring_shift(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Send x to the next rank, return what the previous rank sent (same shape); x itself on one rank.

    One batch_isend_irecv on every rank at once, so no rank waits on another to post its send first.
    """
    rank, W = world(group)
    if W == 1:
        return x
    x = x.contiguous()
    got = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, _global(group, (rank + 1) % W), group),
           dist.P2POp(dist.irecv, got, _global(group, (rank - 1) % W), group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    record("ring_shift", x.nbytes)
    return got


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """x (W, ...): chunk j goes to rank j; returns (W, ...) whose chunk j came from rank j."""
    rank, W = world(group)
    if x.shape[0] != W:
        raise ValueError(f"all_to_all takes x of shape (W, ...) with W={W} ranks, got first dim {x.shape[0]}")
    if W == 1:
        return x
    x = x.contiguous()
    got = torch.empty_like(x)
    dist.all_to_all_single(got, x, group=group)
    record("all_to_all", x.nbytes * (W - 1) // W)
    return got


def all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None = None, *, op: str = "sum") -> torch.Tensor:
    """The sum (op='sum') or elementwise max (op='max') of x over all ranks, as a new tensor."""
    _, W = world(group)
    if W == 1:
        return x
    total = x.detach().clone().contiguous()
    dist.all_reduce(total, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=group)
    record("all_reduce" if op == "sum" else f"all_reduce_{op}", 2 * (W - 1) * x.nbytes // W)
    return total
