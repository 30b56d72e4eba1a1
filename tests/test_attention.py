"""attnlib.attention and attnlib.softmax against torch's scaled_dot_product_attention and softmax."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import masks


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)], ids=["unbatched", "3-D", "4-D"])
@pytest.mark.parametrize("T,S,Dh,Dv", [(5, 5, 8, 8), (3, 7, 8, 8), (6, 4, 16, 5)])
def test_equals_sdpa(batch, T, S, Dh, Dv):
    q, k, v = rand(*batch, T, Dh, seed=1), rand(*batch, S, Dh, seed=2), rand(*batch, S, Dv, seed=3)
    out, weights = attnlib.attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (*batch, T, S)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(Dh), -1))


def test_custom_scale_equals_sdpa():
    q, k, v = rand(2, 4, 8, seed=1), rand(2, 6, 8, seed=2), rand(2, 6, 8, seed=3)
    out, _ = attnlib.attention(q, k, v, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 6), (1, 1, 4, 6), (4, 6), (2, 3, 4, 6), (6,)])
def test_broadcast_masks_equal_sdpa(mask_shape):
    q, k, v = rand(2, 3, 4, 8, seed=1), rand(2, 3, 6, 8, seed=2), rand(2, 3, 6, 8, seed=3)
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(4)) > 0.3
    mask[..., 0] = True  # no fully masked rows here: SDPA's math path agrees either way below
    out, weights = attnlib.attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(2, 3, 4, 6)))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_causal_square_equals_sdpa_is_causal():
    q, k, v = rand(2, 3, 5, 8, seed=1), rand(2, 3, 5, 8, seed=2), rand(2, 3, 5, 8, seed=3)
    out, _ = attnlib.attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_t_less_than_s_is_bottom_right():
    """2 new queries after 3 cached keys: query i sees keys j <= i + 3 (what a KV cache needs)."""
    q, k, v = rand(1, 2, 4, seed=1), rand(1, 5, 4, seed=2), rand(1, 5, 4, seed=3)
    out, weights = attnlib.attention(q, k, v, is_causal=True)
    expected = torch.tensor([[True, True, True, True, False], [True] * 5])
    assert torch.equal(weights[0] > 0, expected)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=expected))
    # SDPA's own is_causal aligns top-left, which differs here:
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(out, top_left)


def test_causal_and_mask_both_apply():
    q, k, v = rand(2, 4, 4, seed=1), rand(2, 4, 4, seed=2), rand(2, 4, 4, seed=3)
    pad = masks.padding_mask(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))[:, 0]  # (B, 1, S)
    out, _ = attnlib.attention(q, k, v, pad, is_causal=True)
    both = pad & masks.causal_mask(4)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=both))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_give_zeros(dtype):
    q, k, v = rand(2, 3, 8, dtype=dtype, seed=1), rand(2, 5, 8, dtype=dtype, seed=2), rand(2, 5, 8, dtype=dtype, seed=3)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, 1] = False  # query 1 of batch 0 may attend to nothing
    out, weights = attnlib.attention(q, k, v, mask)
    assert out.dtype == dtype and not torch.isnan(out).any()
    assert (out[0, 1] == 0).all() and (weights[0, 1] == 0).all()
    sdpa = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(out.float(), sdpa, atol=1e-2, rtol=1e-2)


def test_softmax_is_stable_and_matches_torch():
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1.0, 0.0, 1.0]])
    torch.testing.assert_close(attnlib.softmax(x), torch.softmax(x, -1))
    assert not torch.isnan(attnlib.softmax(x)).any()
    torch.testing.assert_close(attnlib.softmax(x, dim=0), torch.softmax(x, 0))


def test_softmax_of_all_minus_inf_row_is_zero():
    x = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 0.0]])
    assert torch.equal(attnlib.softmax(x), torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.5]]))


def test_dropout_scales_kept_weights():
    q, k, v = rand(1, 64, 8, seed=1), rand(1, 64, 8, seed=2), rand(1, 64, 8, seed=3)
    _, clean = attnlib.attention(q, k, v)
    torch.manual_seed(0)
    _, dropped = attnlib.attention(q, k, v, dropout_p=0.5)
    kept = dropped != 0
    assert 0.3 < kept.double().mean() < 0.7
    torch.testing.assert_close(dropped[kept], clean[kept] * 2)


def test_gradcheck():
    q, k, v = (rand(2, 3, 4, seed=s).requires_grad_() for s in (1, 2, 3))
    mask = torch.tensor([[True, False, True]] * 3)
    assert torch.autograd.gradcheck(lambda q, k, v: attnlib.attention(q, k, v, mask, is_causal=True)[0], (q, k, v))


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 6), S=st.integers(1, 6), seed=st.integers(0, 10_000), density=st.floats(0.0, 1.0))
def test_weight_rows_sum_to_one_or_zero(T, S, seed, density):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, T, 4, generator=g), torch.randn(2, S, 4, generator=g), torch.randn(2, S, 3, generator=g)
    mask = torch.rand(2, T, S, generator=g) < density
    out, weights = attnlib.attention(q, k, v, mask)
    sums = weights.sum(-1)
    empty = ~mask.any(-1)
    torch.testing.assert_close(sums[~empty], torch.ones_like(sums[~empty]))
    assert (sums[empty] == 0).all() and (out[empty] == 0).all()


@settings(max_examples=30, deadline=None)
@given(S=st.integers(2, 8), seed=st.integers(0, 10_000))
def test_permuting_keys_and_values_together_changes_nothing(S, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, n, 4, generator=g, dtype=torch.float64) for n in (5, S, S))
    perm = torch.randperm(S, generator=g)
    out, weights = attnlib.attention(q, k, v)
    out_p, weights_p = attnlib.attention(q, k[:, perm], v[:, perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(weights_p, weights[..., perm])


@pytest.mark.parametrize("args,kwargs,error,message", [
    ((rand(2, 5, 8), rand(2, 5, 7), rand(2, 5, 8)), {}, ValueError, "need the same last dim Dh"),
    ((rand(2, 5, 8), rand(2, 5, 8), rand(2, 6, 8)), {}, ValueError, "need the same length S"),
    ((rand(8), rand(5, 8), rand(5, 8)), {}, ValueError, "q of shape (8,) needs at least 2 dims"),
    ((rand(2, 5, 8), rand(3, 5, 8), rand(3, 5, 8)), {}, ValueError, "do not broadcast"),
    ((torch.ones(5, 8, dtype=torch.long), rand(5, 8), rand(5, 8)), {}, TypeError, "q must be a floating-point tensor"),
    ((rand(5, 8), rand(5, 8).float(), rand(5, 8)), {}, TypeError, "must share one dtype"),
    ((rand(2, 8, 5, 4), rand(2, 8, 5, 4), rand(2, 8, 5, 4), torch.ones(2, 7, dtype=torch.bool)), {}, ValueError,
     "mask of shape (2, 7) does not broadcast to scores (2, 8, 5, 5); a padding mask (B, S)"),
    ((rand(2, 5, 4), rand(2, 5, 4), rand(2, 5, 4), torch.ones(2, 1, 1, 5, dtype=torch.bool)), {}, ValueError,
     "mask of shape (2, 1, 1, 5) does not broadcast to scores (2, 5, 5)"),
    ((rand(5, 4), rand(5, 4), rand(5, 4), torch.ones(5, 5)), {}, TypeError, "mask must be a bool tensor"),
    ((rand(5, 4), rand(5, 4), rand(5, 4), [[True]]), {}, TypeError, "mask must be a torch.Tensor, got list"),
])
@pytest.mark.parametrize("fn", [attnlib.attention, attnlib.tiled_attention], ids=lambda f: f.__name__)
def test_bad_input_gives_a_clear_error(fn, args, kwargs, error, message):
    """attention and tiled_attention share their argument checks: the same bad input, the same message."""
    with pytest.raises(error) as info:
        fn(*args, **kwargs)
    assert message in str(info.value)


def test_bad_dropout_gives_a_clear_error():
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        attnlib.attention(rand(5, 4), rand(5, 4), rand(5, 4), dropout_p=1.0)


def test_softmax_rejects_integer_input():
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.int64"):
        attnlib.softmax(torch.tensor([1, 2, 3]))
