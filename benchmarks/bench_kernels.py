"""How fast each layout and kernel reads SmolLM2-135M's matrices for one row: the detail behind chapter 12's
one sentence that the kernel and the weight layout matter.

For the output layer (49152 x 576, the largest matrix) and the 30 blocks' down-projections (576 x 1536,
one after the other as in a decoding step: one alone would fit in the CPU's caches), one row x times W^T
by four ways, on one thread and on two:

- BLAS (torch.mm) on W row-major, (out, in) contiguous, as nn.Linear keeps it (and transformers runs);
- BLAS on W column-major, W.t() contiguous, as attnlib.LlamaDecoder stores it;
- oneDNN's linear kernel on a copy packed with the hint "one row": the version of oneDNN in the PyTorch
  this was written with then keeps the plain (out, in) layout (ONEDNN_VERBOSE=1 prints the kernel it runs);
- oneDNN's kernel on a copy packed without that hint (a blocked layout), which attnlib's DecodeStep used
  before it was profiled against transformers (it now runs torch.mm on the column-major layout).

Which vector kernels oneDNN picks depends on the CPU: the table's title prints what PyTorch reports
(torch.backends.cpu.get_cpu_capability()), not a guess. Each figure is the fastest of ten calls, as GB/s
of weights read; on a shared machine compare rows of one run only. This module has no rows(): `make bench`
skips it; run it with `python -m benchmarks.bench_kernels`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.timing import best_time, one_thread


def ways(linears: list[torch.nn.Linear]) -> dict[str, Callable[[torch.Tensor], list[torch.Tensor]]]:
    """Each way of computing x W^T for every layer in `linears`, as a function of x (1, in)."""
    row_major = [m.weight.detach().contiguous() for m in linears]                # (out, in)
    column_major = [m.weight.detach().t().contiguous().t() for m in linears]     # (out, in) view of W^T
    one_row = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in row_major]
    blocked = [torch.ops.mkldnn._reorder_linear_weight(w) for w in row_major]
    return {"BLAS, W row-major (nn.Linear)": lambda x: [torch.mm(x, w.t()) for w in row_major],
            "BLAS, W column-major (LlamaDecoder)": lambda x: [torch.mm(x, w.t()) for w in column_major],
            "oneDNN, packed told one row": lambda x: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                                      for p in one_row],
            "oneDNN, packed (blocked)": lambda x: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                                   for p in blocked]}


def main() -> None:
    from attnlib import load_smollm2

    decoder, _ = load_smollm2()
    groups = {"output layer (49152, 576)": [decoder.lm_head],
              "30 blocks' down (576, 1536)": [b.mlp.down for b in decoder.blocks]}
    print(f"PyTorch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"oneDNN available: {torch.backends.mkldnn.is_available()}")
    print("| matrices | way | GB/s, 1 thread | GB/s, 2 threads |\n| --- | --- | --- | --- |")
    with torch.inference_mode():
        for name, linears in groups.items():
            x = torch.randn(1, linears[0].in_features)
            nbytes = sum(m.weight.nbytes for m in linears)
            reference = torch.cat([torch.mm(x, m.weight.t()) for m in linears], dim=-1)
            for way, f in ways(linears).items():
                if not torch.allclose(torch.cat(f(x), dim=-1), reference, atol=1e-4):
                    raise AssertionError(f"{way} does not compute x W^T")
                with one_thread():
                    one = best_time(lambda: f(x), 10)
                torch.set_num_threads(2)
                two = best_time(lambda: f(x), 10)
                print(f"| {name} | {way} | {nbytes / one / 1e9:.0f} | {nbytes / two / 1e9:.0f} |")


if __name__ == "__main__":
    main()
