"""Chapter 13's rolling-buffer checker (re-exported by ch13): the reader's update is fed eleven keys, so the
buffer of W = 4 slots wraps around twice, starting from old keys in every slot (so that a key written into
the wrong slot always shows). A wrong slot is not judged at the first step alone, where several rules agree:
the slots the reader used at every step are matched against the usual wrong rules, and the one that fits
them all is named."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.exercises._core import CandidateError, checker, expect_close, matching, run
from attnlib.exercises.ch07 import _tensor_or_named

__all__ = ["check_rolling_buffer_update"]


def _written(buffer: torch.Tensor, k: torch.Tensor, slot: int) -> torch.Tensor:
    out = buffer.clone()
    out[:, :, slot] = k[:, :, 0]
    return out


def _slot_rules(shape: tuple[int, ...]) -> dict[str, Callable[[int], int]]:
    """The usual wrong rules for the slot of position pos in a buffer of `shape` (B, H_kv, W, Dh)."""
    W = shape[2]
    rules = {
        "the key written into slot (pos + 1) % W: off by one": lambda pos: (pos + 1) % W,
        "the key written into slot (pos - 1) % W: off by one": lambda pos: (pos - 1) % W,
        "the key written into slot min(pos, W - 1): once the buffer is full every key overwrites the last slot; a "
        "rolling buffer wraps around, slot = pos % W": lambda pos: min(pos, W - 1),
        "the slot counted from the end (W - 1 - pos % W): the buffer is filled back to front; position pos goes to "
        "slot pos % W": lambda pos: W - 1 - pos % W,
        "the slot taken modulo W - 1 (pos % (W - 1)): only W - 1 slots are used, so a key is overwritten one step "
        "early; slot = pos % W, with W = buffer.shape[2]": lambda pos: pos % (W - 1),
    }
    for c in range(2, W - 1):
        rules[f"the key written into slot (pos + {c}) % W: the slot is off by {c}; position pos goes to slot "
              f"pos % W"] = lambda pos, c=c: (pos + c) % W
    for axis in (0, 1, 3):
        s = shape[axis]
        if s != W and s not in shape[:axis]:
            rules[f"the slot taken modulo buffer.shape[{axis}] = {s}: W, the number of slots, is buffer.shape[2]"] = \
                lambda pos, s=s: pos % s
    return rules


def _structural(before: torch.Tensor, k: torch.Tensor, pos: int) -> dict[str, torch.Tensor]:
    """What the usual wrong updates that write more or less than one slot give at `pos`."""
    W = before.shape[2]
    mistakes = {
        "the buffer shifted by one and the new key appended: a sliding window in time order, which copies "
        "all W slots at every step; a rolling buffer overwrites one slot, pos % W": torch.cat([before[:, :, 1:], k], 2),
        "the buffer unchanged: the new key was never written": before,
        "the key written into every slot": k.expand_as(before),
        "only the first sequence of the batch written (buffer[0]): write every sequence, buffer[:, :, slot]":
            torch.cat([_written(before, k, pos % W)[:1], before[1:]]),
    }
    if before.shape[3] > pos % W:
        feature = before.clone()
        feature[..., pos % W] = k[..., 0]                    # (B, H_kv, W) <- (B, H_kv, 1): every slot's feature
        mistakes["the key written along the last axis (feature pos % W of every slot) instead of the slot axis: "
                 "index buffer[:, :, slot] (or buffer[..., slot, :])"] = feature
    return mistakes


def _one_slot(got: torch.Tensor, before: torch.Tensor, k: torch.Tensor) -> int | None:
    """The slot the update wrote k into, if it changed that slot alone (None otherwise)."""
    changed = (got.double() != before.double()).flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist()
    if len(changed) != 1 or not torch.equal(got[:, :, changed[0]].double(), k[:, :, 0].double()):
        return None
    return changed[0]


def _not_k(got: torch.Tensor, before: torch.Tensor, k: torch.Tensor, what: str) -> None:
    """A CandidateError when one slot alone changed, but to something other than k (k scaled, say)."""
    changed = (got.double() != before.double()).flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist()
    if len(changed) != 1:
        return
    written, key = got[:, :, changed[0]].double(), k[:, :, 0].double()
    c = float((written * key).sum() / (key * key).sum())
    scaled = f": it is k times {c:.4g}" if torch.allclose(written, c * key, atol=1e-6) else ""
    raise CandidateError(f"{what} wrote slot {changed[0]} alone, but what it wrote there is not the key k{scaled}; "
                         f"copy k itself into the slot, buffer[:, :, slot] = k[:, :, 0]")


def _wrong_slots(slots: dict[int, int], first: int, shape: tuple[int, ...]) -> str:
    """The rule that gives every slot the reader used, or the slots themselves."""
    W = shape[2]
    what = f"rolling_update(buffer, k, pos={first}) with a buffer of W={W} slots"
    fits = [text for text, rule in _slot_rules(shape).items() if all(rule(p) == s for p, s in slots.items())]
    if fits:
        return f"{what} is wrong: it matches {fits[0]}"
    used = ", ".join(f"{p}→{s}" for p, s in slots.items())
    return (f"{what} wrote the key into slot {slots[first]}, not slot pos % W = {first % W}; the slots it used "
            f"(position→slot) were {used}, which fit none of the usual mistakes")


@checker("rolling-buffer update")
def check_rolling_buffer_update(fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor | None]) -> str:
    """fn(buffer, k, pos) with buffer (B, H_kv, W, Dh) and k (B, H_kv, 1, Dh), the key of position `pos`
    (0, 1, 2, ...), writes k into slot pos % W and returns the buffer (or None after writing in place)."""
    B, H_kv, W, Dh, steps = 2, 2, 4, 5, 11   # the stream wraps around twice; no size is W - 1
    stream = torch.randn(B, H_kv, steps, Dh)
    buffer = torch.randn(B, H_kv, W, Dh) + 10   # old keys in every slot: a key written to a wrong slot shows
    slots: dict[int, int] = {}
    first = None                                # the first position written into a wrong slot
    for pos in range(steps):
        k = stream[:, :, pos:pos + 1].clone()
        what = f"rolling_update(buffer, k, pos={pos}) with a buffer of W={W} slots"
        before, k_before = buffer.clone(), k.clone()
        try:
            got = run(lambda: fn(buffer, k, pos), what=what)  # writing into the buffer is allowed
        except CandidateError as exc:
            if first is not None:
                break                                         # judge the slots seen so far
            wrapped = pos >= W and "out of bounds" in str(exc)
            raise CandidateError(str(exc) + (f". Position {pos} is past the last slot: a rolling buffer wraps "
                                             f"around, slot = pos % W, where W = buffer.shape[2] (the slot axis)"
                                             if wrapped else "")) from None
        if not torch.equal(k, k_before):
            raise CandidateError(f"{what} changed k in place: the caller's new key is overwritten")
        got = _tensor_or_named(buffer if got is None else got, what, tuple(before.shape), {
            "the new key alone, not the buffer": k,
            "the buffer with the key appended (W + 1 slots): a rolling buffer overwrites a slot": torch.cat([before, k], 2),
        })
        slot = _one_slot(got, before, k)
        if slot is None:
            if first is not None:
                break
            mistakes = _structural(before, k, pos)
            if not matching(got, mistakes, atol=0):
                _not_k(got, before, k, what)
            expect_close(got, _written(before, k, pos % W), what, atol=0, mistakes=mistakes)
        slots[pos], buffer = slot, got
        if slot != pos % W and first is None:
            first = pos
    if first is not None:
        raise CandidateError(_wrong_slots(slots, first, tuple(buffer.shape)))
    return f"position p goes to slot p % W: after {steps} keys the buffer holds the last {W}, each in its slot"
