"""Chapter 6's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from attnlib import masks
from attnlib.exercises import check_encoder_block, check_find_head, check_mean_pool
from exercise_helpers import assert_names, stub


# --- post-LN block ------------------------------------------------------------------------------

def block(layer, x, valid, *, order="post", mask_fn=masks.padding_mask, res_attn=True, res_ffn=True,
          swap_norms=False, ffn=True):
    """A configurable block: the defaults are BERT's post-LN block."""
    n1, n2 = (layer.norm2, layer.norm1) if swap_norms else (layer.norm1, layer.norm2)
    mask = mask_fn(valid) if mask_fn else None
    if order == "pre":
        h = x + layer.attn(n1(x), mask=mask)
        return h + layer.ffn(n2(h))
    h = n1((x if res_attn else 0) + layer.attn(x, mask=mask))
    return n2((h if res_ffn else 0) + layer.ffn(h)) if ffn else h


def test_encoder_block_accepts_a_correct_one():
    assert check_encoder_block(block).passed
    assert check_encoder_block(lambda layer, x, valid: block(layer, x, valid, mask_fn=masks.from_hf)).passed


def queries_masked_too(valid):
    """A (B, 1, T, T) mask: padded tokens neither attend nor are attended to (their rows come out zero)."""
    real = valid.bool()                                                   # (B, T)
    return real[:, None, :, None] & real[:, None, None, :]                # (B, 1, T, T)


def test_encoder_block_accepts_padded_queries_masked_too():
    assert check_encoder_block(lambda layer, x, valid: block(layer, x, valid, mask_fn=queries_masked_too)).passed

    def zeroed_padding(layer, x, valid):                                  # a block that blanks padded outputs
        return block(layer, x, valid) * valid[:, :, None]
    assert check_encoder_block(zeroed_padding).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda l, x, v: block(l, x, v, order="pre"), ["the pre-LN order"]),
    (lambda l, x, v: block(l, x, v, mask_fn=None), ["no padding mask"]),
    (lambda l, x, v: block(l, x, v, mask_fn=lambda v: v.bool()[:, None, :, None]), ["the padding put on the query axis"]),
    (lambda l, x, v: block(l, x, v, mask_fn=lambda v: masks.padding_mask(v == 0)), ["an inverted padding mask"]),
    (lambda l, x, v: block(l, x, v, res_attn=False), ["no residual around attention"]),
    (lambda l, x, v: block(l, x, v, res_ffn=False), ["no residual around the FFN"]),
    (lambda l, x, v: block(l, x, v, swap_norms=True), ["the LayerNorms swapped"]),
    (lambda l, x, v: block(l, x, v, ffn=False), ["the FFN sub-layer left out"]),
    (lambda l, x, v: l.norm2(l.norm1(x + l.attn(x, mask=masks.padding_mask(v))) * 2), ["matches none of the usual"]),
])
def test_encoder_block_names_the_mistake(buggy, phrases):
    assert_names(check_encoder_block(buggy), *phrases)


def test_encoder_block_tells_no_mask_from_a_mask_on_the_query_axis():
    """Both give the same numbers at the real tokens; only the padded rows (masked whole) differ."""
    no_mask = check_encoder_block(lambda l, x, v: block(l, x, v, mask_fn=None)).message
    assert "no padding mask" in no_mask and "query axis" not in no_mask, no_mask

    def on_queries(layer, x, valid):                                       # a reader's own loop over the parts
        mask = valid.bool().unsqueeze(1).unsqueeze(-1)                     # (B, 1, T, 1)
        h = layer.norm1(x + layer.attn(x, mask=mask))
        return layer.norm2(h + layer.ffn(h))
    assert_names(check_encoder_block(on_queries), "the padding put on the query axis", "(B, 1, T, 1)")


def test_encoder_block_stub_crash_and_shortcut():
    assert check_encoder_block(stub).status == "not attempted yet"
    assert_names(check_encoder_block(lambda layer, x, valid: layer(x)), "called layer(...) itself")
    assert_names(check_encoder_block(lambda layer, x, valid: layer.attn(x, mask=valid)),  # 0/1 ints
                 "raised TypeError", "attnlib.masks.from_hf")
    assert_names(check_encoder_block(lambda layer, x, valid: layer.attn(x, mask=valid.bool())),  # (B, T)
                 "raised ValueError", "(B, 1, 1, S)")
    assert_names(check_encoder_block(lambda layer, x, valid: None), "should be a torch.Tensor")


# --- mean pooling -------------------------------------------------------------------------------

def good_pool(hidden, mask):
    m = mask[:, :, None].to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def test_mean_pool_accepts_a_correct_one():
    assert check_mean_pool(good_pool).passed
    assert check_mean_pool(lambda h, m: torch.stack([h[b, m[b].bool()].mean(0) if m[b].any() else h.new_zeros(h.shape[-1])
                                                     for b in range(len(h))])).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda h, m: h.mean(dim=1), ["padding included"]),
    (lambda h, m: (h * m[:, :, None]).sum(1), ["never divided"]),
    (lambda h, m: (h * m[:, :, None]).sum(1) / h.shape[1], ["division by T"]),
    (lambda h, m: (h * m[:, :, None]).sum(1) / m[:, :, None].sum(1), ["contains NaN", "0 / 0"]),
    (lambda h, m: h.mean(dim=2), ["a mean over the D axis"]),
    (lambda h, m: (h * m).sum(1) / m.sum(1, keepdim=True), ["raised RuntimeError", "last axis of size 1"]),
])
def test_mean_pool_names_the_mistake(buggy, phrases):
    assert_names(check_mean_pool(buggy), *phrases)


def test_mean_pool_stub_and_crash():
    assert check_mean_pool(stub).status == "not attempted yet"
    assert_names(check_mean_pool(lambda h, m: h.sum(dim=5)), "raised IndexError", "h.sum(dim=5)")
    assert_names(check_mean_pool(lambda h, m: h.tolist()), "should be a torch.Tensor", "got a list of")


# --- find the head ------------------------------------------------------------------------------

def good_find(weights, query, key):
    w = torch.stack(list(weights))[:, :, query, key]  # (L, H)
    return divmod(int(w.argmax()), w.shape[1])


def with_bug(bug):
    def find(weights, query, key):
        w = torch.stack(list(weights))  # (L, H, T, T)
        sel = w[:, :, key, query] if bug == "transposed" else w[:, :, query, key]
        i = int(sel.argmin() if bug == "argmin" else sel.argmax())
        layer, head = divmod(i, w.shape[0] if bug == "divmod" else w.shape[1])
        if bug == "order":
            return head, layer
        return (layer + 1, head + 1) if bug == "one" else (layer, head)
    return find


def test_find_head_accepts_a_correct_one():
    assert check_find_head(good_find).passed
    assert check_find_head(lambda w, q, k: [torch.tensor(v) for v in good_find(w, q, k)]).passed

    def loops(weights, query, key):                                       # plain Python, no stacking
        best = max((float(w[h, query, key]), layer, h) for layer, w in enumerate(weights) for h in range(len(w)))
        return best[1], best[2]
    assert check_find_head(loops).passed


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_find_head_names_a_column_summed_over_the_queries(reduce):
    def column(weights, query, key):
        w = getattr(torch.stack(list(weights))[..., key], reduce)(-1)    # (L, H): every query's weight on key
        return divmod(int(w.argmax()), w.shape[1])
    assert_names(check_find_head(column), "summed (or averaged) over ALL queries")


@pytest.mark.parametrize("bug, phrases", [
    ("order", ["(head, layer) returned in the wrong order"]),
    ("transposed", ["rows and columns swapped"]),
    ("argmin", ["the smallest weight (argmin)"]),
    ("one", ["counted from 1"]),
    ("divmod", ["divmod(i, L) instead of"]),
])
def test_find_head_names_the_mistake(bug, phrases):
    assert_names(check_find_head(with_bug(bug)), *phrases)


def test_find_head_stub_and_crash():
    assert check_find_head(stub).status == "not attempted yet"
    assert_names(check_find_head(lambda w, q, k: w[q][k]), "raised IndexError")
    assert_names(check_find_head(lambda w, q, k: 3), "should return (layer, head)")
    assert_names(check_find_head(lambda w, q, k: (0, 0)), "returned (0, 0), expected (2, 1)")
