"""attnlib.MultiHeadAttention against torch.nn.MultiheadAttention on the same weights (from_torch).

Self-attention forward, B=4, T=512, D=512, H=8, fp32, 2 threads, inference mode, both modules in
eval(). Without weights, ours runs a fused QKV projection and SDPA; torch's (its inference fast path)
materializes the (B, H, T, T) scores. With weights, both return them per head. Outputs are checked
equal before anything is timed.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlib import MultiHeadAttention
from attnlib.timing import time_ratio
from benchmarks._harness import Row

B, T, D, H = 4, 512, 512, 8


def _check_equal(ours: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    with torch.inference_mode():
        want, want_w = ref(x, x, x, need_weights=True, average_attn_weights=False)
        got, got_w = ours(x, need_weights=True)
        diffs = [(ours(x) - want).abs().max(), (got - want).abs().max(), (got_w - want_w).abs().max()]
    if max(diffs) > 1e-4:
        raise AssertionError(f"attnlib differs from nn.MultiheadAttention by {max(diffs):.3g}")


def rows() -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
        ours = MultiHeadAttention.from_torch(ref).eval()
        x = torch.randn(B, T, D)
        _check_equal(ours, ref, x)
        fast = time_ratio(lambda: ours(x), lambda: ref(x, x, x, need_weights=False), rounds=15)
        weights = time_ratio(lambda: ours(x, need_weights=True),
                             lambda: ref(x, x, x, need_weights=True, average_attn_weights=False))
    finally:
        torch.set_num_threads(threads)
    shape = f"B={B} T={T} D={D} H={H} fp32, 2 threads"
    return [
        Row(f"MHA forward, {shape}, time", "MultiHeadAttention (fused QKV + SDPA)",
            "nn.MultiheadAttention(need_weights=False)", fast, 0.75),
        Row(f"MHA forward with weights (B, H, T, T), {shape}, time", "MultiHeadAttention(need_weights=True)",
            "nn.MultiheadAttention(need_weights=True, average_attn_weights=False)", weights, 1.5),
    ]


if __name__ == "__main__":
    from benchmarks._harness import print_table

    print_table(rows())
