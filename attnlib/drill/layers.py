"""The interview drill's layers: which of the reader's projections is q, k, v and the output, as layouts.

probes.find learns, from what the weights do to the output, which nn.Linear layers forward uses on x
(the input projections) and which one maps the merged heads to the output. Their rows, stacked in the
order the module registers them, hold 3H slices of Dh rows. A *layout* says which slice is which head
of which role: blocks [q | k | v] in any order, per head (H, 3, Dh) as GPT-NeoX and Megatron store a
fused projection, feature by feature (D, 3) (rows, not slices), one nn.Linear per head and role (nanoGPT's lecture), a separate query beside a fused
key_value laid out either way. `layouts` lists them; roles.choose keeps the one the output agrees with.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Layers", "layouts", "reused", "project", "ROLES"]

ROLES = ("q", "k", "v")


@dataclass(frozen=True)
class Layers:
    """The reader's projections under one layout: the stacked rows `rows` (3D,) of `parts` are [q; k; v]."""

    names: dict[str, str]  # role ("q", "k", "v", "o") -> the reader's layer name, e.g. "q_proj" or "c_attn"
    layout: str  # in words, e.g. "fused, laid out per head (H, 3, Dh)"
    parts: tuple[nn.Linear, ...]  # the input projections, in the order their rows are stacked
    part_names: tuple[str, ...]
    rows: torch.Tensor  # (3D,) long
    out: nn.Linear
    units: tuple[int, ...] = field(default=())  # the slice (of Dh rows) each role-head takes, q heads first

    def in_params(self, live: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight (3D, D), bias (3D,) or None) with rows [q; k; v]: the reader's own (live) or a copy."""
        return self._live() if live else self._copy

    def out_params(self, live: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (self.out.weight, self.out.bias) if live else self._out_copy

    def _live(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = torch.cat([p.weight for p in self.parts])[self.rows]
        if all(p.bias is None for p in self.parts):
            return weight, None
        bias = torch.cat([p.weight.new_zeros(p.out_features) if p.bias is None else p.bias for p in self.parts])
        return weight, bias[self.rows]

    @functools.cached_property
    def _copy(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.no_grad():
            w, b = self._live()
            return w.detach().clone(), None if b is None else b.detach().clone()

    @functools.cached_property
    def _out_copy(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        b = self.out.bias
        return self.out.weight.detach().clone(), None if b is None else b.detach().clone()

    def edited(self, weight: torch.Tensor, bias: torch.Tensor | None, out_weight: torch.Tensor,
               out_bias: torch.Tensor | None) -> Layers:
        """The same layout with other parameter values (copies): what forward computes if it used the reader's
        parameters differently (a bias dropped, a weight not transposed)."""
        new = dataclasses.replace(self)
        new.__dict__.update(_copy=(weight, bias), _out_copy=(out_weight, out_bias))  # the cached copies
        return new

    @property
    def described(self) -> str:
        """'`q_proj`, `k_proj`, `v_proj` and `o_proj`' or '`c_attn` (fused, laid out [q | k | v]) and `c_proj`'."""
        inputs = list(dict.fromkeys(self.part_names))  # as the module registers them; names_note tells roles apart
        head = ", ".join(f"`{n}`" for n in inputs) if len(inputs) <= 4 else f"`{inputs[0]}` ... `{inputs[-1]}`"
        return head + (f" ({self.layout})" if self.layout != "separate projections" else "") + f" and `{self.names['o']}`"


def _orders(sizes: list[int], H: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """How the stacked slices can be (segment, head): [(kind, [(segment, head) for each slice])]."""
    n = sum(sizes)
    orders = [("blocks", [(u // H, u % H) for u in range(n)]), ("per head", [(u % 3, u // 3) for u in range(n)])]
    multi = [i for i, s in enumerate(sizes) if s % H == 0 and s // H >= 2]
    if multi and all(s % H == 0 for s in sizes):  # e.g. a query layer beside a key_value layer laid out per head
        for choice in itertools.product((False, True), repeat=len(multi)):
            units, seg = [], 0
            for i, s in enumerate(sizes):
                k, per_head = s // H, i in multi and choice[multi.index(i)]
                units += [(seg + (u % k if per_head else u // H), u // k if per_head else u % H) for u in range(s)]
                seg += k
            orders.append(("mixed" + "".join("h" if c else "b" for c in choice), units))
    return orders


def _words(kind: str, perm: tuple[int, ...], parts: list[tuple[str, nn.Linear]], D: int, H: int) -> str:
    """The layout in words, for the verdict."""
    if all(m.out_features == D for _, m in parts):
        return "separate projections"
    if all(m.out_features < D for _, m in parts):
        return "one nn.Linear per head and role"
    order = "[" + " | ".join("qkv"[perm.index(s)] for s in range(3)) + "]"
    if len(parts) == 1:
        return (f"fused, laid out {order}" if kind == "blocks" else
                "fused, laid out per head (H, 3, Dh), as GPT-NeoX and Megatron store it")
    fused = [n for n, m in parts if m.out_features > D]
    return f"`{fused[0]}` fused, laid out " + ("per head" if "h" in kind else "in blocks")


def layouts(parts: list[tuple[str, nn.Linear]], out: tuple[str, nn.Linear], D: int, H: int) -> list[Layers]:
    """Every layout of the stacked rows of `parts` (out_features adding up to 3D, each a multiple of Dh)."""
    Dh = D // H
    sizes = [m.out_features // Dh for _, m in parts]
    owner = [n for (n, m), s in zip(parts, sizes) for _ in range(s)]  # the layer of each slice
    seen, options = set(), []
    for kind, units in _orders(sizes, H):
        index = {su: u for u, su in enumerate(units)}
        for perm in itertools.permutations(range(3)):  # perm[r] = the segment of role r
            picked = tuple(index[(perm[r], h)] for r in range(3) for h in range(H))
            if picked not in seen:
                seen.add(picked)
                options.append(_layers(parts, out, picked, Dh, H, _words(kind, perm, parts, D, H), owner))
    if len(parts) == 1 and parts[0][1].out_features == 3 * D:  # one fused layer viewed as (D, 3): roles feature by feature
        for perm in itertools.permutations(range(3)):
            rows = torch.tensor([f * 3 + perm[r] for r in range(3) for f in range(D)])
            order = "[" + ", ".join("qkv"[perm.index(s)] for s in range(3)) + "]"
            options.append(Layers({r: parts[0][0] for r in ROLES} | {"o": out[0]},
                                  f"fused, interleaved feature by feature (D, 3) as {order}", (parts[0][1],),
                                  (parts[0][0],), rows, out[1]))
    return options


def reused(parts: list[tuple[str, nn.Linear]], out: tuple[str, nn.Linear], D: int, H: int) -> list[Layers]:
    """For input rows adding up to 2D (two separate layers or one fused) beside a layer never used: every way one
    block of D rows serves two roles."""
    if sum(m.out_features for _, m in parts) != 2 * D:
        return []
    owner = [n for n, m in parts for _ in range(m.out_features // (D // H))]
    return [_layers(parts, out, tuple(p * H + h for p in roles for h in range(H)), D // H, H,
                    "a layer reused for two roles", owner)
            for roles in itertools.product((0, 1), repeat=3) if len(set(roles)) == 2]


def _layers(parts, out, picked: tuple[int, ...], Dh: int, H: int, words: str, owner: list[str]) -> Layers:
    rows = torch.tensor([u * Dh + d for u in picked for d in range(Dh)])
    names = {r: owner[picked[i * H]] for i, r in enumerate(ROLES)} | {"o": out[0]}
    return Layers(names, words, tuple(m for _, m in parts), tuple(n for n, _ in parts), rows, out[1], picked)


def project(layers: Layers, x: torch.Tensor, context: torch.Tensor, live: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q = x W_qᵀ + b_q (B, T, D); k, v from context (B, S, D); the rows of the weight are [q; k; v]. In the
    layers' own dtype (a reader may make them float64)."""
    weight, bias = layers.in_params(live)
    D = weight.shape[1]
    w, b = weight.split(D), (None,) * 3 if bias is None else bias.split(D)
    return tuple(F.linear(src.to(wi.dtype), wi, bi) for src, wi, bi in zip((x, context, context), w, b))
