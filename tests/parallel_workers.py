"""Functions the parallel tests run inside attnlib.parallel.launch's processes (spawn needs them importable).

Each returns plain data: the largest differences from one process's result, the bytes measured, and the
messages of the errors it provoked, for the test to assert on in the parent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib.attention import attention
from attnlib.masks import causal_mask
from attnlib.mha import MultiHeadAttention
from attnlib.parallel import (TensorParallelAttention, bytes_per_rank, ring_attention, shard, tally,
                              ulysses_attention)

B, H, Dh = 2, 4, 8


def _qkv(T: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64) for _ in range(4)]  # q, k, v, dout


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def sequence_parallel(rank: int, W: int, T: int) -> dict:
    """Ring (both layouts) and Ulysses against full attention over all T positions, forward and backward."""
    q, k, v, dout = _qkv(T)
    out: dict = {}
    for causal in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        ref, _ = attention(*leaves, causal_mask(T) if causal else None)
        ref.backward(dout)
        for method, layout in (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous")):
            mine = [shard(x, rank, W, layout=layout).requires_grad_() for x in (q, k, v)]
            with tally() as fwd:
                if method == "ring":
                    o = ring_attention(*mine, is_causal=causal, layout=layout)
                else:
                    o = ulysses_attention(*mine, is_causal=causal)
            with tally() as bwd:
                o.backward(shard(dout, rank, W, layout=layout))
            key = f"{method}/{layout}/{'causal' if causal else 'full'}"
            out[key] = dict(out=_diff(o, shard(ref, rank, W, layout=layout)),
                            grad=max(_diff(m.grad, shard(r.grad, rank, W, layout=layout)) for m, r in zip(mine, leaves)),
                            fwd_bytes=fwd.total, bwd_bytes=bwd.total, scores=fwd.scores)
    sizes = dict(B=B, T=T, H=H, Dh=Dh, world_size=W, element_size=8)
    out["formula"] = {m: (bytes_per_rank(m, **sizes), bytes_per_rank(m, **sizes, backward=True))
                      for m in ("ring", "ulysses")}
    out["errors"] = dict(
        not_divisible=_error(lambda: shard(q[..., : T - 1, :], rank, W)),
        few_heads=_error(lambda: ulysses_attention(*(x[:, :1, : T // W] for x in (q, k, v)))),
        zigzag_odd=_error(lambda: ring_attention(*(x[..., :3, :] for x in (q, k, v)), layout="zigzag")),
        wrong_dims=_error(lambda: ring_attention(q[0], k[0], v[0])),
        float_only=_error(lambda: ulysses_attention(*(x.long() for x in (q, k, v)))),
    )
    return out


class TorchAttention(nn.Module):
    """Plain torch attention (separate q/k/v/o Linears, torchtitan's layout) for DTensor to parallelize:
    it infers its local head count from the projection it is given, so it runs sharded or whole."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        D, Dh, kv = mha.d_model, mha.head_dim, mha.num_kv_heads * mha.head_dim
        self.head_dim, self.group = Dh, mha.num_heads // mha.num_kv_heads
        self.wq, self.wk, self.wv, self.wo = nn.Linear(D, D), nn.Linear(D, kv), nn.Linear(D, kv), nn.Linear(D, D)
        with torch.no_grad():
            for lin, w, b in zip((self.wq, self.wk, self.wv), mha.qkv.weight.split([D, kv, kv]),
                                 mha.qkv.bias.split([D, kv, kv])):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            self.wo.load_state_dict(mha.out.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B_, T, _ = x.shape
        q, k, v = (p(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for p in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] > k.shape[1])
        return self.wo(y.transpose(1, 2).reshape(B_, T, -1))  # (B, T, local heads · Dh)


def _dtensor(mha: MultiHeadAttention, x: torch.Tensor, W: int) -> torch.Tensor:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (W,))
    plan = {"wq": ColwiseParallel(), "wo": RowwiseParallel()}
    if mha.num_kv_heads % W == 0:  # else (MQA) a kv head cannot be cut: wk and wv stay whole on every rank
        plan.update(wk=ColwiseParallel(), wv=ColwiseParallel())
    return parallelize_module(TorchAttention(mha).to(x.dtype), mesh, plan)(x)


def tensor_parallel(rank: int, W: int, T: int) -> dict:
    """TP heads against the whole layer: MHA, GQA (kv heads split) and MQA (kv head copied), grads, DTensor."""
    out: dict = {}
    for name, (D, H_, H_kv) in dict(mha=(32, 4, 4), gqa=(64, 8, 4), mqa=(32, 4, 1)).items():
        torch.manual_seed(1)
        mha = MultiHeadAttention(D, H_, H_kv).double()
        x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        pad = torch.ones(B, 1, 1, T, dtype=torch.bool)
        pad[0, ..., -2:] = False
        tp = TensorParallelAttention.from_module(mha, check_inputs=True)
        x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
        ref = mha(x_ref, mask=pad, is_causal=True)
        mine = tp(x_tp, mask=pad, is_causal=True)
        ref.sum().backward()
        with tally() as bwd:
            mine.sum().backward()
        out[name] = dict(out=_diff(mine, ref), grad_x=_diff(x_tp.grad, x_ref.grad),
                         heads=(tp.heads.start, tp.heads.stop), kv_heads=(tp.kv_heads.start, tp.kv_heads.stop),
                         dtensor=_diff(_dtensor(mha, x.detach(), W), mha(x.detach(), is_causal=True)))
        with tally() as t:
            tp(x.detach())
        sizes = dict(B=B, T=T, H=H_, Dh=D // H_, world_size=W, element_size=8)
        out[name]["bytes"] = (t.bytes_sent["all_reduce"], bytes_per_rank("tensor_parallel", **sizes))
        out[name]["bwd_bytes"] = (bwd.total, bytes_per_rank("tensor_parallel", **sizes, backward=True))
    x_own = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)  # per rank
    out["different_inputs"] = _error(lambda: tp(x_own))
    out["heads_split"] = _error(lambda: TensorParallelAttention(36, 6, 3))
    return out


def all_checks(rank: int, W: int, T: int, T_tp: int) -> tuple[dict, dict]:
    """Both groups of checks in one launch (a process start costs seconds)."""
    return sequence_parallel(rank, W, T), tensor_parallel(rank, W, T_tp)


def fails_on_rank_one(rank: int, W: int) -> int:
    """Rank 1 raises; launch must report it with the traceback."""
    if rank == 1:
        raise ZeroDivisionError("rank one cannot go on")
    return rank
