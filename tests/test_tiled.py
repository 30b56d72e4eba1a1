"""attnlib.tiled_attention against SDPA and attnlib.attention, tile by tile and edge by edge."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import masks
from attnlib.tiled import QUERY_BLOCK, tile_kind
from attnlib.timing import peak_memory


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def qkv(batch, T, S, Dh=16, Dv=8, dtype=torch.float64):
    return rand(*batch, T, Dh, dtype=dtype, seed=1), rand(*batch, S, Dh, dtype=dtype, seed=2), \
        rand(*batch, S, Dv, dtype=dtype, seed=3)


@pytest.mark.parametrize("block_size", [1, 7, 64, 128, 1000])
@pytest.mark.parametrize("T,S", [(37, 37), (130, 301), (301, 130), (QUERY_BLOCK + 3, 200), (1, 9)])
def test_equals_sdpa_for_lengths_that_are_not_multiples_of_the_block(T, S, block_size):
    q, k, v = qkv((2, 3), T, S)
    out = attnlib.tiled_attention(q, k, v, block_size=block_size)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("T,S", [(37, 37), (5, 300), (300, 5), (QUERY_BLOCK + 9, QUERY_BLOCK + 40)])
@pytest.mark.parametrize("block_size", [3, 32, 128])
def test_causal_is_bottom_right_as_in_attention(T, S, block_size):
    q, k, v = qkv((2, 2), T, S)
    out = attnlib.tiled_attention(q, k, v, is_causal=True, block_size=block_size)
    # with T > S the first T - S queries see no key at all: SDPA and tiled both give them zeros
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal_mask(T, S)))


def test_square_causal_equals_sdpa_is_causal():
    q, k, v = qkv((1, 4), 200, 200)
    out = attnlib.tiled_attention(q, k, v, is_causal=True, block_size=48)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_the_result_does_not_depend_on_the_block_size():
    q, k, v = qkv((2, 2), 150, 333)
    mask = torch.rand(2, 1, 150, 333, generator=torch.Generator().manual_seed(5)) > 0.5
    outs = [attnlib.tiled_attention(q, k, v, mask, is_causal=True, block_size=b) for b in (1, 5, 64, 333, 4096)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 90), (1, 1, 70, 90), (70, 90), (2, 3, 70, 90), (90,),
                                        (2, 3, 70, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_broadcast_masks_equal_attention(mask_shape, is_causal):
    q, k, v = qkv((2, 3), 70, 90)
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(4)) > 0.4
    out = attnlib.tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=16)
    torch.testing.assert_close(out, attnlib.attention(q, k, v, mask, is_causal=is_causal)[0])


def test_padding_mask_equals_sdpa():
    q, k, v = qkv((3, 2), 40, 40)
    pad = masks.padding_mask(masks.lengths_to_valid([40, 17, 33], 40))  # (B, 1, 1, S)
    out = attnlib.tiled_attention(q, k, v, pad, block_size=8)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=pad))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_give_zeros(dtype):
    q, k, v = qkv((2,), 9, 20, dtype=dtype)
    mask = torch.ones(2, 9, 20, dtype=torch.bool)
    mask[0, 3] = False  # query 3 of batch 0 may attend to nothing
    mask[1, :, :10] = False  # batch 1 sees only the second key tile: the first is skipped
    out = attnlib.tiled_attention(q, k, v, mask, block_size=10)
    assert out.dtype == dtype and not torch.isnan(out).any()
    assert (out[0, 3] == 0).all()
    ref = attnlib.attention(q.double(), k.double(), v.double(), mask)[0]
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_custom_scale_and_unbatched_inputs():
    q, k, v = qkv((), 33, 45)
    out = attnlib.tiled_attention(q, k, v, scale=0.3, block_size=10)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_broadcast_heads_as_in_multi_query_attention():
    q, _, _ = qkv((2, 4), 30, 50)
    _, k, v = qkv((2, 1), 30, 50)  # one key/value head shared by 4 query heads
    out = attnlib.tiled_attention(q, k, v, block_size=16)
    torch.testing.assert_close(out, attnlib.attention(q, k, v)[0])


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 40), S=st.integers(1, 40), block=st.integers(1, 17), causal=st.booleans(),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 10_000))
def test_any_shape_mask_and_block_equals_attention(T, S, block, causal, density, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, 4, generator=g, dtype=torch.float64) for n in (T, S, S))
    mask = torch.rand(2, T, S, generator=g) < density
    out = attnlib.tiled_attention(q, k, v, mask, is_causal=causal, block_size=block)
    torch.testing.assert_close(out, attnlib.attention(q, k, v, mask, is_causal=causal)[0])


@pytest.mark.parametrize("T,S", [(8, 8), (4, 12), (12, 4), (7, 10)])
def test_tile_kind_agrees_with_the_bottom_right_causal_mask(T, S):
    """Every tile of every size: 'skip' iff no query may see a key, 'full' iff every query sees every key."""
    allowed = masks.causal_mask(T, S)
    for i0 in range(T):
        for i1 in range(i0 + 1, T + 1):
            for j0 in range(S):
                for j1 in range(j0 + 1, S + 1):
                    tile = allowed[i0:i1, j0:j1]
                    expected = "skip" if not tile.any() else "full" if tile.all() else "partial"
                    assert tile_kind(i0, i1, j0, j1, S - T) == expected, (i0, i1, j0, j1)


def test_never_holds_a_t_by_s_matrix():
    """Measured: the peak over the inputs stays far below one (T, S) score matrix, and the naive one does not."""
    T = S = 2048
    q, k, v = qkv((1,), T, S, Dh=32, Dv=32, dtype=torch.float32)
    with torch.inference_mode():
        tiled = peak_memory(lambda: attnlib.tiled_attention(q, k, v, block_size=128))
        naive = peak_memory(lambda: attnlib.attention(q, k, v))
    scores = T * S * 4  # bytes of one fp32 (T, S) matrix
    assert naive >= scores
    assert tiled < scores / 8
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    backward = peak_memory(lambda: attnlib.tiled_attention(*leaves, block_size=128).sum().backward())
    assert backward < scores / 4  # the backward recomputes each tile instead of storing the weights


@pytest.mark.parametrize("T,S,is_causal", [(5, 7, True), (7, 5, True), (6, 6, False)])
def test_gradcheck(T, S, is_causal):
    q, k, v = (t.requires_grad_() for t in qkv((2,), T, S, Dh=4, Dv=3))
    mask = torch.rand(2, T, S, generator=torch.Generator().manual_seed(6)) > 0.3
    mask[0, 1] = False  # a query with nothing to attend to: zero output, zero gradient
    fn = lambda q, k, v: attnlib.tiled_attention(q, k, v, mask, is_causal=is_causal, block_size=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_gradients_equal_attention_across_tiles_and_broadcast_heads():
    q, _, _ = qkv((2, 4), QUERY_BLOCK + 30, 300)
    _, k, v = qkv((2, 1), QUERY_BLOCK + 30, 300)  # one key/value head shared by 4 query heads
    pad = masks.padding_mask(masks.lengths_to_valid([300, 120], 300))  # (B, 1, 1, S)
    grads = []
    for fn in (lambda *a: attnlib.tiled_attention(*a, is_causal=True, block_size=64),
               lambda *a: attnlib.attention(*a, is_causal=True)[0]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, pad)
        out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view_as(out))
        grads.append([t.grad for t in leaves])
    for tiled, naive in zip(*grads):
        torch.testing.assert_close(tiled, naive)


# The checks tiled_attention shares with attention (shapes, dtypes, masks) are tested on both in
# test_attention.py; here, what only tiled_attention takes.
@pytest.mark.parametrize("args,kwargs,error,message", [
    ((rand(5, 4), rand(5, 4), rand(5, 4)), {"block_size": 0}, ValueError, "block_size must be a positive int"),
    ((rand(5, 4), rand(5, 4), rand(5, 4)), {"block_size": 64.0}, ValueError, "got 64.0"),
])
def test_bad_input_gives_a_clear_error(args, kwargs, error, message):
    with pytest.raises(error) as info:
        attnlib.tiled_attention(*args, **kwargs)
    assert message in str(info.value)


def test_a_late_tile_far_above_the_first_ones_is_redone_exactly():
    """The lazy step keeps the first tiles' max as its reference; keys whose scores lie ~1000 higher
    overflow 2^(s - m), and the block must be recomputed with exact max updates, not return inf/NaN."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 40, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 260, 16, generator=g, dtype=torch.float64) for _ in range(2))
    k[..., 200:, :] = 3000 * q.mean(dim=-2, keepdim=True)  # last tiles: scores near 1000, 2^(s - m) overflows
    out = attnlib.tiled_attention(q, k, v, block_size=64)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and (out - ref).abs().max() < 1e-10


@pytest.mark.parametrize("gap,value", [(85.0, 1000.0), (80.0, 1e6)])
def test_an_overflowing_output_accumulator_is_redone_exactly(gap, value):
    """acc = Σ p·v overflows before l = Σ p when |v| > 1: a score `gap` above the first tile's max with
    2^(gap·log2 e) near float32's limit leaves l finite but acc infinite. SDPA is finite; so must we be."""
    q, k = torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 256, 4)
    q[..., 0] = 1.0
    k[..., 200, 0] = 2 * gap  # scale 1/sqrt(4): score `gap` at key 200, in the second tile of 128
    v = torch.full((1, 1, 256, 1), value)
    out = attnlib.tiled_attention(q, k, v, block_size=128)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.allclose(out, ref, rtol=1e-5)


@pytest.mark.parametrize("block_size", [5, 6, 8, 12])
def test_scores_in_the_hundreds_with_large_values_equal_sdpa(block_size):
    """Row 0's first tile max is ~93 and its overall max ~179 (the ex-tile-step checker's data), v × 30."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 5, 8, generator=g), torch.randn(2, 23, 8, generator=g), torch.randn(2, 23, 3, generator=g)
    q[0, 0] *= 60.0
    k[:, -4:] *= 3.0
    out = attnlib.tiled_attention(q, k, 30 * v, block_size=block_size)
    ref = F.scaled_dot_product_attention(q, k, 30 * v)
    assert torch.isfinite(out).all() and torch.allclose(out, ref, rtol=1e-4, atol=1e-3)
