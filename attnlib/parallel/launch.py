"""Run a function in W processes joined by a gloo process group on this machine, as torchrun would.

launch(fn, W, *args) starts W fresh Python processes (spawn), each calls
torch.distributed.init_process_group("gloo", rank=r, world_size=W), meeting the others at a store that
launch serves from its own process on 127.0.0.1, runs fn(r, W, *args) on one thread, and sends its
result back. Results come back as plain data:
every tensor in them is turned into a numpy array first (a tensor on a multiprocessing queue lives in
shared memory, which a process that exits first can take with it). fn must be importable: defined at
the top level of a module, not in a notebook cell or a closure, because spawn finds it by name.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["launch", "WorkerError"]


class WorkerError(RuntimeError):
    """A worker process raised, died or timed out; the message holds its rank and traceback."""


def _rendezvous(timeout: float) -> dist.TCPStore:
    """The store where the workers meet (the address book of the group), served by this process on a port
    the OS picks as it binds it. A port found free first and bound later by rank 0 can be taken in between
    by any program that binds one (on a busy machine, a rank once failed to join: "connection closed by peer")."""
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False)


def _plain(x: Any) -> Any:
    """x with every tensor replaced by a numpy array (in lists, tuples and dicts too)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _worker(rank: int, world_size: int, port: int, timeout: float, fn: Callable, args: tuple,
            results: mp.Queue) -> None:
    """One process: join the group at launch's store (on `port`), run fn, report ('ok', result) or
    ('error', traceback text). The environment says what torchrun's would, for code that reads it."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    try:
        wait = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=wait)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=wait)
        results.put((rank, "ok", _plain(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent as text
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """[fn(0, W, *args), ..., fn(W-1, W, *args)], each run in its own process of a gloo group of W.

    Raises WorkerError with the worker's rank and traceback if any worker raises, dies without a
    result, or all have not finished after `timeout` seconds (the other workers are stopped; the
    process group's own timeout is the same, so a collective waiting for a dead peer fails too).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (processes to start), got {world_size!r}")
    if not callable(fn) or "<locals>" in getattr(fn, "__qualname__", "<locals>") or fn.__module__ == "__main__":
        raise ValueError(f"fn must be a function defined at the top level of an importable module "
                         f"(spawned processes find it by name), got {fn!r}")
    ctx = mp.get_context("spawn")
    results, store = ctx.Queue(), _rendezvous(timeout)  # store lives until launch returns
    procs = [ctx.Process(target=_worker, args=(r, world_size, store.port, timeout, fn, args, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world_size:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                if dead:
                    raise WorkerError(f"rank {dead[0]} of {world_size} died (exit code "
                                      f"{procs[dead[0]].exitcode}) without a result") from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(got))
                    raise WorkerError(f"ranks {missing} of {world_size} gave no result within "
                                      f"timeout={timeout} s") from None
                continue
            if status == "error":
                raise WorkerError(f"rank {rank} of {world_size} raised:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(max(0.0, min(5.0, deadline - time.monotonic())))
        _stop(procs)
    return [got[r] for r in range(world_size)]
