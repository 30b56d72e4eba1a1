"""The interview drill's roles: which of the reader's projections is q, k and v, found from the output.

drill_layers.layouts lists every way the reader's input projections can be q, k and v; the one whose
multi-head attention equals the reader's output on forward(x) is the reader's. Names are only used to
put a mistake in the reader's words: when layers are named as queries and keys (`W_q`/`W_k`,
`q_proj`/`k_proj`, `query`/`key`, ...), an answer that uses the key layer as the queries is not
excused by the swap: it has the scores transposed (K Qᵀ), and is told so.
"""

from __future__ import annotations

import re

import torch

from attnlib.exercises._core import matching
from attnlib.exercises.drill_layers import ROLES, Layers
from attnlib.exercises.drill_variants import Case, simulate

__all__ = ["role_of", "choose"]

_WORDS = {"q": ("q", "query", "queries", "wq", "qs"), "k": ("k", "key", "keys", "wk", "ks"),
          "v": ("v", "value", "values", "wv", "vs")}


def role_of(name: str) -> str | None:
    """'q', 'k' or 'v' when a layer's own name (its last dotted part) says so: W_q, q_proj, linear_query..."""
    words = re.split(r"[_\W\d]+", name.rsplit(".", 1)[-1].lower())
    found = {r for r, ws in _WORDS.items() for w in words if w in ws}
    return found.pop() if len(found) == 1 else None


def _named(options: list[Layers]) -> Layers | None:
    """The option whose q, k, v are the layers named so, when the names say so unambiguously."""
    return next((o for o in options if not o.fused and all(role_of(o.names[r]) == r for r in ROLES)), None)


def choose(options: list[Layers], num_heads: int, x: torch.Tensor, case: Case,
           out: torch.Tensor) -> tuple[Layers, list[Layers]]:
    """(the layout that reproduces `out` on `case`, or the most plausible one; the others worth trying)."""
    named = _named(options)
    if named is not None:
        options = [named] + [o for o in options if o is not named and not (  # K Qᵀ is a mistake, not a layout
            o.names["q"] == named.names["k"] and o.names["k"] == named.names["q"])]
    for option in options:
        if matching(out, {str(i): o for i, (o, _) in enumerate(simulate(option, num_heads, x, case))}):
            return option, []
    return options[0], options[1:]
