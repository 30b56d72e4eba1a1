"""Checkers for chapter 6 (the encoder): a post-LN block from parts, mean pooling, the head that links two tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib import masks
from attnlib.encoder import EncoderLayer, mean_pool
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises._expect import matching
from attnlib.exercises.ch01 import reject_shape_mistakes, run_or_explain

__all__ = ["check_encoder_block", "check_mean_pool", "check_find_head"]


def _random_layer(D: int = 12, H: int = 3, d_ff: int = 20) -> EncoderLayer:
    """An EncoderLayer whose two LayerNorms differ (random gamma and beta), so swapping them shows."""
    layer = EncoderLayer(D, H, d_ff).eval()
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer


def _refuse_call(*args, **kwargs):
    raise RuntimeError("encoder_block called layer(...) itself: use its parts, layer.attn, layer.norm1, "
                       "layer.ffn and layer.norm2")


def _post_ln(layer: EncoderLayer, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """BERT's post-LN block from layer's parts, with `mask` given to attention: LN2(h + FFN(h)), h = LN1(x + MHA(x))."""
    h = layer.norm1(x + layer.attn(x, mask=mask))
    return layer.norm2(h + layer.ffn(h))


def _block_mistakes(layer: EncoderLayer, x: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong blocks readers write, by name, each (B, T, D)."""
    a, n1, f, n2 = layer.attn, layer.norm1, layer.ffn, layer.norm2
    mask = masks.padding_mask(valid)                                   # (B, 1, 1, T)
    inverted = masks.padding_mask(valid == 0)
    h = n1(x + a(x, mask=mask))
    pre_h = x + a(n1(x), mask=mask)
    return {
        "the pre-LN order (x + MHA(LN1(x)), then h + FFN(LN2(h))) instead of BERT's post-LN "
        "(LN1(x + MHA(x)), then LN2(h + FFN(h)))": pre_h + f(n2(pre_h)),
        "no padding mask: real tokens attend to padding": _post_ln(layer, x, None),
        "an inverted padding mask: tokens attend only to padding (1 = real token must become True = "
        "may attend)": _post_ln(layer, x, inverted),
        "no residual around attention: LN1(MHA(x)) instead of LN1(x + MHA(x))":
            n2(n1(a(x, mask=mask)) + f(n1(a(x, mask=mask)))),
        "no residual around the FFN: LN2(FFN(h)) instead of LN2(h + FFN(h))": n2(f(h)),
        "the LayerNorms swapped: norm2 after attention and norm1 after the FFN":
            n1(n2(x + a(x, mask=mask)) + f(n2(x + a(x, mask=mask)))),
        "LayerNorm on the sub-layer's output before the residual (x + LN(MHA(x))) instead of on the sum":
            (x + n1(a(x, mask=mask))) + n2(f(x + n1(a(x, mask=mask)))),
        "the FFN sub-layer left out: it returns h = LN1(x + MHA(x))": h,
        "the FFN's residual adds x, not h: LN2(x + FFN(h)); each residual adds the sub-layer's own input":
            n2(x + f(h)),
        "norm1 applied twice (LN1(h + FFN(h))): layer.norm2 is never used; the second sub-layer has its own "
        "LayerNorm": n1(h + f(h)),
        "the FFN applied to x, not to h: LN2(h + FFN(x))": n2(h + f(x)),
    }


_ON_QUERIES = ("the padding put on the query axis, mask (B, 1, T, 1): it hides padded queries, not padded keys "
               "(B, 1, 1, T), so at the real tokens it is no padding mask at all: real tokens attend to padding")


@checker("post-LN encoder block")
def check_encoder_block(fn: Callable[[EncoderLayer, torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(layer, x (B, T, D), valid (B, T) with 1 = real token) -> BERT's post-LN block (B, T, D), from layer's parts."""
    B, T, D = 2, 5, 12
    layer = _random_layer(D)
    x = torch.randn(B, T, D)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        expected = layer(x, mask=masks.padding_mask(valid))
        mistakes = _block_mistakes(layer, x, valid)
        # the mask on the query axis, (B, 1, T, 1): at the real tokens the same as no mask; only the padded
        # rows, masked whole, tell the two apart, so this one mistake is compared at every position
        on_queries = _post_ln(layer, x, valid.bool()[:, None, :, None])
        layer.forward = _refuse_call                                   # the reader must use the parts
        what = f"encoder_block(layer, x, valid) with x of shape {(B, T, D)} and valid {(B, T)}"
        got = as_tensor(run(fn, layer, x.clone(), valid.clone(), what=what), what, shape=(B, T, D))
    real = valid.bool()                            # (B, T): a padded query's output is not specified
    if matching(got, {_ON_QUERIES: on_queries}, 1e-4) and not matching(got[real], {"": expected[real]}, 1e-4):
        raise CandidateError(f"{what} is wrong: it matches {_ON_QUERIES}")
    expect_close(got[real], expected[real], f"{what}, at the real tokens",
                 mistakes={name: wrong[real] for name, wrong in mistakes.items()}, atol=1e-4)
    return "equals EncoderLayer (post-LN, with the padding mask) at every real token of a padded batch"


def _pool_mistakes(hidden: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong poolings, by name, each (B, D): hidden (B, T, D), mask (B, T) of 0/1."""
    m = mask[:, :, None].to(hidden.dtype)                              # (B, T, 1)
    total = (hidden * m).sum(dim=1)                                    # (B, D)
    return {
        "a mean over all T positions, padding included (hidden.mean(dim=1)), instead of over the "
        "real tokens only": hidden.mean(dim=1),
        "a sum over the real tokens that is never divided by their number": total,
        "a division by T, the padded length, instead of by each sentence's number of real tokens":
            total / hidden.shape[1],
        "NaN for a sentence with no real token: 0 / 0; divide by the count clamped to at least 1 "
        "(or 1e-9)": total / m.sum(dim=1),
        "the first token's vector (BERT's [CLS] pooling), not the mean of the real tokens": hidden[:, 0],
        "the last position's vector, not the mean of the real tokens": hidden[:, -1],
        "a max over the real tokens (max pooling), not their mean":
            hidden.masked_fill(m == 0, float("-inf")).amax(dim=1).nan_to_num(neginf=0.0),
    }


@checker("mean pooling")
def check_mean_pool(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    """fn(hidden (B, T, D), attention_mask (B, T) of 0/1 integers) -> (B, D) mean over the real tokens."""
    B, T, D = 3, 6, 4                                                  # all different
    hidden = torch.randn(B, T, D)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    hidden[mask == 0] += 10.0                                          # padding holds other numbers
    what = f"my_mean_pool(hidden, attention_mask) with hidden {(B, T, D)}, attention_mask {(B, T)}"
    square_h, square_m = torch.randn(4, 4, 4), torch.tensor([[1, 1, 1, 0]] * 4)
    flat = (square_h * square_m).sum(dim=1)                            # (B, T) * (B, T, D): mask lined up with (T, D)
    no_axis = {"the mask not given a last axis of size 1 (attention_mask[:, :, None]), so it lines up "
               "with the (T, D) axes of hidden instead of (B, T)": flat / square_m.sum(dim=1, keepdim=True)}
    got = run_or_explain(fn, (hidden.clone(), mask.clone()), what, (square_h, square_m), no_axis)
    got = reject_shape_mistakes(got, what, {
        "a mean over the D axis (dim=2 or -1), a (B, T) result, instead of over the tokens (dim=1)":
            hidden.mean(dim=2)})
    as_tensor(got, what, shape=(B, D))
    expect_close(got, mean_pool(hidden, mask), what, mistakes=_pool_mistakes(hidden, mask))
    return "the mean over each sentence's real tokens, zeros for a sentence with none"


def _planted_maps(L: int, H: int, T: int, query: int, key: int,
                  places: dict[str, tuple[int, int]]) -> list[torch.Tensor]:
    """L random (H, T, T) softmax maps with weights[l][h, query, key] largest at places['answer'],
    [key, query] largest at places['transposed'], [query, key] smallest at places['smallest'], and
    the column `key` summed over the queries largest at places['column'] (every other query looks there)."""
    w = torch.softmax(torch.randn(L, H, T, T), dim=-1) * 0.5           # (L, H, T, T), entries < 0.5
    w[:, :, query, key] = torch.empty(L, H).uniform_(0.05, 0.3)
    w[:, :, key, query] = torch.empty(L, H).uniform_(0.05, 0.3)
    w[places["answer"] + (query, key)] = 0.9
    w[places["transposed"] + (key, query)] = 0.95
    w[places["smallest"] + (query, key)] = 0.001
    others = [i for i in range(T) if i != query]
    w[places["column"] + (others, [key] * len(others))] = 0.8
    return list(w.unbind(0))


def _as_pair(value: object, what: str) -> tuple[int, int]:
    try:
        layer, head = (int(v) for v in value)
        return layer, head
    except (TypeError, ValueError, RuntimeError):
        raise CandidateError(f"{what} should return (layer, head), two integers, got {value!r}") from None


def _find_head_stage(fn: Callable, L: int, H: int, T: int, query: int, key: int,
                     places: dict[str, tuple[int, int]]) -> None:
    weights = _planted_maps(L, H, T, query, key, places)
    what = f"find_head(weights, query={query}, key={key}) on {L} layers of {H} heads"
    got = _as_pair(run(fn, [w.clone() for w in weights], query, key, what=what), what)
    layer, head = places["answer"]
    flat = layer * H + head
    mistakes = {
        (head, layer): "(head, layer) returned in the wrong order: return (layer, head)",
        places["transposed"]: "rows and columns swapped: weights[layer][head, key, query] is how much "
                              "the key attends to the query; the query's row is weights[layer][head, query]",
        places["smallest"]: "the smallest weight (argmin) instead of the largest (argmax)",
        (layer + 1, head + 1): "counted from 1: layers and heads are numbered from 0",
        divmod(flat, L): "the flat index split with the wrong number: divmod(i, L) instead of "
                         "divmod(i, H), the number of heads per layer",
        places["column"]: "each head's column `key` summed (or averaged) over ALL queries: that is how "
                          "much every token looks at the key; the query's own weight is the one entry "
                          "weights[layer][head, query, key]",
    }
    if got != (layer, head):
        name = mistakes.get(got)
        raise CandidateError(f"{what} returned {got}, expected {(layer, head)}"
                             + (f": {name}" if name else ""))


@checker("find the head")
def check_find_head(fn: Callable[[list, int, int], tuple[int, int]]) -> str:
    """fn(weights [(H, T, T)] per layer, query, key) -> (layer, head) where weights[layer][head, query, key] is largest."""
    _find_head_stage(fn, 3, 4, 7, 5, 2, {"answer": (2, 1), "transposed": (0, 3), "smallest": (1, 0),
                                         "column": (0, 1)})
    _find_head_stage(fn, 5, 2, 6, 1, 4, {"answer": (3, 0), "transposed": (0, 1), "smallest": (2, 1),
                                         "column": (0, 0)})
    return "finds the (layer, head) where the query puts the most weight on the key"
