"""What each way of splitting attention sends, from the formula (attnlib.parallel.tally measures it).

One layer of self-attention over B sequences of T positions, H heads of width Dh (D = H·Dh), split
among W ranks, e bytes per element; bytes sent by one rank:

- ring attention, forward: W - 1 steps, each passing the held K and V blocks, 2·B·H·(T/W)·Dh·e:
  2(W - 1)/W · B·T·D·e: (W - 1)/W of all of K and V, growing toward 2·B·T·D·e as ranks are added.
  Backward: W - 1 steps passing K, V and their gradients (4 blocks), then one with the gradients (2):
  (4(W - 1) + 2)/W · B·T·D·e.
- Ulysses, forward: one all-to-all of the stacked q, k, v (3·B·H·(T/W)·Dh·e, of which (W - 1)/W leaves)
  and one of the output: 4(W - 1)/W² · B·T·D·e, MHA-shaped k, v; roughly 4/W of B·T·D·e for large W.
  Backward: the same, mirrored.
- tensor-parallel heads, forward: one all-reduce of the (B, T, D) output: 2(W - 1)/W · B·T·D·e in a ring
  all-reduce (gloo's default), growing toward 2·B·T·D·e; backward: one more, of the gradient of x.
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["METHODS", "bytes_per_rank"]

METHODS = ("ring", "ulysses", "tensor_parallel")


def bytes_per_rank(method: str, *, B: int, T: int, H: int, Dh: int, world_size: int, element_size: int,
                   backward: bool = False) -> int:
    """Bytes one rank sends for one attention layer's forward pass (or its backward pass, backward=True)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    W, btde = world_size, B * T * H * Dh * element_size
    factor = {
        ("ring", False): Fraction(2 * (W - 1), W),
        ("ring", True): Fraction(4 * (W - 1) + 2, W) if W > 1 else Fraction(0),
        ("ulysses", False): Fraction(4 * (W - 1), W * W),
        ("ulysses", True): Fraction(4 * (W - 1), W * W),
        ("tensor_parallel", False): Fraction(2 * (W - 1), W),
        ("tensor_parallel", True): Fraction(2 * (W - 1), W),
    }[method, backward]
    return int(factor * btde)
