"""Checkers for chapter 3 (masks): a bottom-right causal mask, a transformers mask converted, a
cross-attention mask from source lengths, and padding combined with causal.

Every mask the reader returns is compared with attnlib.masks' (bool, True = may attend); a wrong
one is matched against the usual mistakes: top-left alignment, an inverted mask, the padding put
on the query axis, the (B, S) shape that was never given its two broadcast axes, ...
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib import masks
from attnlib.exercises._core import CandidateError, as_tensor, checker, matching, run
from attnlib.exercises._describe import differences
from attnlib.exercises._expect import either
from attnlib.exercises.ch01 import reject_shape_mistakes

__all__ = ["check_causal_mask", "check_hf_to_mask", "check_cross_attention_mask", "check_padding_causal_mask"]

_INVERTED = "an inverted mask: True where attending is forbidden (nn.MultiheadAttention's convention), not True = may attend"
_UNEXPANDED = ("the (B, S) mask without its two broadcast axes: against scores (B, H, T, S) a (B, S) mask "
               "lines up with (T, S), so batch b's padding would mask query row b; use mask[:, None, None, :]")
_MAX_LEN = ("a mask max(src_lengths) wide instead of S: the keys are the encoder's S positions, padding included, "
            "however long the longest sentence is (torch.arange(S), not arange(max(src_lengths)))")
_ON_QUERIES = ("the padding put on the query axis, (B, 1, S, 1) or (B, 1, T, 1): padding hides *keys* "
               "(columns), so the mask is (B, 1, 1, S)")


def _check_mask(got: object, expected: torch.Tensor, what: str, *, mistakes: dict[str, torch.Tensor],
                shape_mistakes: dict[str, torch.Tensor] | None = None,
                also_fine: tuple[tuple[int, ...], ...] = ()) -> None:
    """Raise CandidateError unless got is a bool tensor equal to expected (or, for a shape in also_fine,
    equal to expected once broadcast); name the mistake its pattern matches otherwise."""
    got = as_tensor(got, what)
    if got.is_floating_point() and bool((got < 0).any()):
        raise CandidateError(f"{what} returned an additive float mask (0 = attend, -inf or a large negative "
                             f"number = masked); return a bool mask, True = may attend")
    if got.dtype != torch.bool and (got.is_complex() or not bool(((got == 0) | (got == 1)).all())):
        raise CandidateError(f"{what} should be a bool mask (True = may attend), got {got.dtype} "
                             f"with values other than 0 and 1")
    if tuple(got.shape) in also_fine and tuple(got.shape) != tuple(expected.shape):
        got = got.expand(expected.shape)
    if got.shape != expected.shape:  # a shape mistake, named if it is a known one
        reject_shape_mistakes(got, what, shape_mistakes or {})
        as_tensor(got, what, shape=tuple(expected.shape))
    if not torch.equal(got.bool(), expected):
        found = matching(got, mistakes, atol=0.0)
        if found:
            raise CandidateError(f"{what} is wrong: it matches {either(found)}")
        axes = ("batch", "head", "query", "key")[-expected.dim():]
        raise CandidateError(f"{what} is wrong: " + "; ".join(differences(got.bool(), expected, axes)))
    if got.dtype != torch.bool:
        raise CandidateError(f"{what} has the right pattern but dtype {got.dtype}: return a bool tensor "
                             f"(True = may attend). SDPA adds a float mask to the scores instead of masking "
                             f"with it, and attnlib.attention refuses it")


@checker("causal mask, bottom-right")
def check_causal_mask(fn: Callable[[int, int], torch.Tensor]) -> str:
    """fn(T, S) returns the (T, S) bool causal mask aligned bottom-right: query i sees keys j <= i + S - T."""
    for T, S in [(2, 5), (4, 4), (1, 6), (3, 7)]:
        what = f"causal_mask({T}, {S})"
        expected = masks.causal_mask(T, S)
        ones = torch.ones(T, S, dtype=torch.bool)
        mistakes = {
            "top-left alignment (query i sees keys j <= i, like SDPA's is_causal): with a KV cache the "
            "last query is the newest token and must see every key, so shift the diagonal by S - T": ones.tril(),
            _INVERTED: ~expected,
            "the diagonal left out: query i must also see its own key (j <= i + S - T, not <)": ones.tril(S - T - 1),
            "a strict causal mask, top-left (the diagonal left out, and not shifted by S - T): query i must see "
            "keys j <= i + S - T, its own included": ones.tril(-1),
            "the upper triangle (triu): a query would see the future, not the past": ones.triu(S - T),
            "the upper triangle, top-left (triu): a query would see the future, not the past": ones.triu(),
        }
        _check_mask(run(fn, T, S, what=what), expected, what, mistakes=mistakes, shape_mistakes={
            "a (S, T) mask, T and S swapped: rows are queries (T), columns keys (S)": masks.causal_mask(S, T),
            "a (S, T) mask, transposed: rows are queries (T), columns keys (S)": expected.T})
    return "bottom-right aligned for T < S and T = S: the last query sees every key, as a KV cache needs"


def _hf_example() -> torch.Tensor:
    """A transformers attention_mask (B, S) = (3, 5): right padding, left padding and no padding."""
    return torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


@checker("transformers mask to attnlib's")
def check_hf_to_mask(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(attention_mask (B, S), 1 = real token) returns the bool mask (B, 1, 1, S), True = may attend."""
    hf = _hf_example()
    what = f"hf_to_mask(attention_mask) with attention_mask of shape {tuple(hf.shape)}"
    expected = masks.from_hf(hf)  # (B, 1, 1, S)
    _check_mask(run(fn, hf.clone(), what=what), expected, what, mistakes={_INVERTED: ~expected}, shape_mistakes={
        _UNEXPANDED: hf.bool(),
        f"{_UNEXPANDED} (and inverted)": ~hf.bool(),
        _ON_QUERIES: hf.bool()[:, None, :, None],
        "a (B, 1, S) mask: it needs two axes in front of S, for heads and queries, (B, 1, 1, S)": hf.bool()[:, None],
        "the mask expanded to (B, 1, S, S), which assumes T = S: the function cannot know T, so return "
        "(B, 1, 1, S) exactly and let broadcasting give it T rows": expected.expand(-1, 1, hf.shape[1], -1),
    })
    return "(B, 1, 1, S) bool, True at real tokens, for right, left and no padding"


@checker("cross-attention mask from source lengths")
def check_cross_attention_mask(fn: Callable[[torch.Tensor, int, int], torch.Tensor]) -> str:
    """fn(src_lengths (B,), T, S) returns the bool mask (B, 1, T, S) (or (B, 1, 1, S)) for T decoder queries
    over S encoder positions: key j is visible iff j < src_lengths[b]."""
    lengths, T, S = torch.tensor([5, 2, 4]), 2, 5  # B = 3, T = 2, S = 5: all different
    what = f"cross_attention_mask(src_lengths={lengths.tolist()}, T={T}, S={S})"
    valid = masks.lengths_to_valid(lengths, S)  # (B, S)
    expected = masks.padding_mask(valid).expand(3, 1, T, S)  # (B, 1, T, S)
    off_by_one = torch.arange(S) <= lengths[:, None]  # (B, S)
    mistakes = {
        _INVERTED: ~expected,
        "an off-by-one: j <= length keeps one padding position; the real tokens are j < length":
            off_by_one[:, None, None, :].expand(3, 1, T, S),
        "a causal mask added: cross-attention looks at the whole source, no causal mask": expected & masks.causal_mask(T, S),
        "a causal mask added, top-left (SDPA's is_causal=True with T != S): cross-attention looks at the whole "
        "source, no causal mask": expected & torch.ones(T, S, dtype=torch.bool).tril(),
    }
    got = run(fn, lengths.clone(), T, S, what=what)
    _check_mask(got, expected, what, mistakes=mistakes, also_fine=((3, 1, 1, S),), shape_mistakes={
        _UNEXPANDED: valid,
        f"{_UNEXPANDED} (and inverted)": ~valid,
        "the lengths applied to the T query positions instead of the S keys": (torch.arange(T) < lengths[:, None])[:, None, :, None],
        "a (B, 1, S, T) mask: rows are the T decoder queries, columns the S source keys": expected.transpose(-2, -1),
    })
    short = torch.tensor([3, 1, 2])  # no sentence fills the S positions: the mask is still S wide
    what = f"cross_attention_mask(src_lengths={short.tolist()}, T={T}, S={S})"
    expected = masks.padding_mask(masks.lengths_to_valid(short, S)).expand(3, 1, T, S)
    narrow = masks.padding_mask(masks.lengths_to_valid(short, int(short.max())))  # (B, 1, 1, max length)
    _check_mask(run(fn, short.clone(), T, S, what=what), expected, what, mistakes={}, also_fine=((3, 1, 1, S),),
                shape_mistakes={_MAX_LEN: narrow, f"{_MAX_LEN} ": narrow.expand(3, 1, T, -1)})
    return "(B, 1, T, S) bool with T != S, True at each sentence's real source tokens, no causal part"


@checker("padding and causal combined")
def check_padding_causal_mask(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(attention_mask (B, T), 1 = real token) returns the decoder self-attention mask (B, 1, T, T):
    causal AND the key is a real token."""
    hf = _hf_example()
    B, T = hf.shape
    what = f"padding_causal_mask(attention_mask) with attention_mask of shape {(B, T)}"
    pad, causal = masks.from_hf(hf), masks.causal_mask(T)  # (B, 1, 1, T), (T, T)
    expected = masks.combine(pad, causal)  # (B, 1, T, T)
    pad_q = hf.bool()[:, None, :, None]  # (B, 1, T, 1)
    mistakes = {
        "the causal mask only: the padding keys are not masked": causal.expand(B, 1, T, T),
        "the padding mask only: a query also sees the keys after it": pad.expand(B, 1, T, T),
        "OR instead of AND: a key must be allowed by both masks": pad | causal,
        "the padding inverted (True at padding)": ~pad & causal,
        "a strict causal mask, the diagonal left out (tril(-1)): query i must also see its own key, j <= i; "
        "without it the first real token has nothing to attend to": pad & causal.tril(-1),
        _INVERTED: ~expected,
        f"causal AND {_ON_QUERIES}": pad_q & causal,
        "the padded queries' rows masked too: the exercise asks for keys only (as transformers does); masking "
        "the rows leaves a left-padded query nothing at all, which is NaN in nn.MultiheadAttention": expected & pad_q,
    }
    _check_mask(run(fn, hf.clone(), what=what), expected, what, mistakes=mistakes, shape_mistakes={
        "a (B, T, T) mask without the head axis: it needs to be (B, 1, T, T) to broadcast over the heads "
        "of scores (B, H, T, T)": expected[:, 0],
    })
    return "(B, 1, T, T): causal AND a real key, for right, left and no padding"
