"""The interview drill's roles: which layout of the reader's projections forward really computes.

layers.layouts lists every way the projections can be q, k and v; the one whose multi-head attention
equals the reader's output is the reader's, whatever the names say. The verdict follows what the module
computes: in self-attention, W_v used as the keys, W_v used as the queries, or scores K Qᵀ (which is
Q Kᵀ with the two layers' roles swapped) are all correct multi-head attention. The names still matter to
a reader of the code, an interviewer first: `names_note` says when they disagree with the roles.
"""

from __future__ import annotations

import re

from attnlib.drill.layers import ROLES, Layers

__all__ = ["role_of", "ranked", "names_note"]

_WORDS = {"q": ("q", "query", "queries", "wq", "qs"), "k": ("k", "key", "keys", "wk", "ks"),
          "v": ("v", "value", "values", "wv", "vs")}


def role_of(name: str) -> str | None:
    """'q', 'k' or 'v' when a layer's own name (its last dotted part) says so: W_q, q_proj, linear_query..."""
    words = re.split(r"[_\W\d]+", name.rsplit(".", 1)[-1].lower())
    found = {r for r, ws in _WORDS.items() for w in words if w in ws}
    return found.pop() if len(found) == 1 else None


def _agreement(option: Layers) -> int:
    """How many roles are played by a layer named for them (0 for a fused layer, which names no role)."""
    return sum(role_of(option.names[r]) == r for r in ROLES)


def ranked(options: list[Layers], values: frozenset[int] | None) -> list[Layers]:
    """The layouts, most plausible first: those whose value slices are the ones the output is linear in
    (found by probes.find), then those whose layer names agree with their roles, then as listed."""
    def key(item: tuple[int, Layers]) -> tuple:
        i, o = item
        H = len(o.units) // 3
        v_ok = values is not None and bool(o.units) and set(o.units[2 * H:]) == set(values)
        return (not v_ok, -_agreement(o), i)
    return [o for _, o in sorted(enumerate(options), key=key)]


def names_note(layers: Layers, passed: bool = True) -> str:
    """'. Note: ...' when a layer named for one role plays another, else ''."""
    swapped = {r: role_of(layers.names[r]) for r in ROLES}
    wrong = {r: said for r, said in swapped.items() if said not in (None, r)}
    if not wrong or len(set(layers.names[r] for r in ROLES)) < 3:
        return ""
    words = {"q": "the queries", "k": "the keys", "v": "the values"}
    plays = ", ".join(f"`{layers.names[r]}` acts as {words[r]}" for r in ROLES if r in wrong)
    kq = (" (your scores are K Qᵀ: in self-attention that is Q Kᵀ with the two layers' roles swapped)"
          if wrong.get("q") == "k" and wrong.get("k") == "q" else "")
    if not passed:
        return f" (reading your layers as your forward uses them: {plays}{kq})"
    return (f". Note: the names say otherwise: {plays}{kq}. Correct, but an interviewer reads names: give each layer "
            f"the name of the role it plays")
