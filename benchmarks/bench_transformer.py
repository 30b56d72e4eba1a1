"""One training step of attnlib.Transformer against torch.nn.Transformer on the same weights and batch.

A step is forward, backward and an SGD update: d_model 128, 4 heads, 2 + 2 layers, feed-forward 512,
B 32, S = T = 24, dropout 0.1 (both in train mode), source padding masks on the encoder and on
cross-attention, causal decoder self-attention. fp32, 2 threads. Before anything is timed, the two
give the same outputs and gradients with dropout off.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib import Transformer, masks
from attnlib.timing import time_ratio
from benchmarks._harness import Row

D, H, LAYERS, FF, B, S, T, DROPOUT = 128, 4, 2, 512, 32, 24, 24, 0.1


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S, D), tgt (B, T, D) and the source padding (B, S), True = padding (lengths 12..24)."""
    gen = torch.Generator().manual_seed(1)
    src, tgt = torch.randn(B, S, D, generator=gen), torch.randn(B, T, D, generator=gen)
    lengths = torch.randint(S // 2, S + 1, (B,), generator=gen)
    return src, tgt, torch.arange(S)[None] >= lengths[:, None]


def _steps(ref: nn.Transformer, ours: Transformer):
    """Two functions, each one SGD step of one model on the same batch; and their first outputs."""
    src, tgt, pad = _batch()
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    allowed = masks.from_key_padding_mask(pad)  # (B, 1, 1, S), True = may attend

    def theirs():
        return ref(src, tgt, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=pad,
                   memory_key_padding_mask=pad)

    def mine():
        return ours(src, tgt, src_mask=allowed, memory_mask=allowed)

    def step(model: nn.Module, forward, opt: torch.optim.Optimizer):
        @torch.inference_mode(False)  # time_ratio runs under inference_mode; a training step needs autograd
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            forward().square().mean().backward()
            opt.step()
        return run

    opts = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (ours, ref)]
    return step(ours, mine, opts[0]), step(ref, theirs, opts[1]), mine, theirs


def _check_equal(ref: nn.Transformer, ours: Transformer) -> None:
    """With dropout off: outputs equal, and the gradient of the first cross-attention projection."""
    _, _, mine, theirs = _steps(ref.eval(), ours.eval())
    mine().square().mean().backward()
    theirs().square().mean().backward()
    out_diff = (mine() - theirs()).abs().max()
    grad_diff = (ours.decoder[0].cross_attn.qkv.weight.grad - ref.decoder.layers[0].multihead_attn.in_proj_weight.grad)
    if out_diff > 1e-4 or grad_diff.abs().max() > 1e-4:
        raise AssertionError(f"attnlib.Transformer differs from nn.Transformer by {out_diff:.3g}")
    ref.zero_grad(set_to_none=True), ours.zero_grad(set_to_none=True)


def rows() -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        ref = nn.Transformer(D, H, LAYERS, LAYERS, FF, DROPOUT, batch_first=True)
        ours = Transformer.from_torch(ref)
        _check_equal(ref, ours)
        ours_step, ref_step, _, _ = _steps(ref.train(), ours.train())
        ratio = time_ratio(ours_step, ref_step, rounds=15, repeats=3, warmup=3)
    finally:
        torch.set_num_threads(threads)
    shape = f"D={D} H={H} {LAYERS}+{LAYERS} layers ff={FF} B={B} S=T={S} dropout {DROPOUT}, fp32, 2 threads"
    return [Row(f"Transformer training step (forward, backward, SGD), source padding, {shape}, time",
                "attnlib.Transformer", "nn.Transformer", ratio, 1.10)]


if __name__ == "__main__":
    from benchmarks._harness import print_table

    print_table(rows())
