"""MultiHeadAttention: equal to nn.MultiheadAttention on the same weights, its two paths equal to each
other, GQA/MQA equal to repeated key/value heads, the cache equal to a full pass, and clear errors."""

import pytest
import torch
from torch import nn

from attnlib import KVCache, MultiHeadAttention, attention, masks
from attnlib.head_layout import merge_heads, repeat_kv, split_heads
from attnlib.mha import _attention_no_grad

B, T, S, D, H = 2, 5, 7, 16, 4


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def torch_pair(**kwargs):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H, batch_first=True, **kwargs).double().eval()
    return ref, MultiHeadAttention.from_torch(ref)


def gqa(num_kv_heads, dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return MultiHeadAttention(D, H, num_kv_heads, **kwargs).to(dtype).eval()


# --- equal to nn.MultiheadAttention through from_torch -------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_equals_torch_with_padding_mask_attn_mask_and_weights_per_head(bias):
    ref, ours = torch_pair(bias=bias)
    x = randn(B, T, D)
    key_padding = torch.tensor([[False] * T, [False] * 3 + [True] * (T - 3)])  # torch: True = ignore
    attn_mask = torch.zeros(T, T, dtype=torch.bool)
    attn_mask[0, 1] = attn_mask[3, 0] = True                                    # torch: True = ignore
    want, want_w = ref(x, x, x, key_padding_mask=key_padding, attn_mask=attn_mask,
                       need_weights=True, average_attn_weights=False)
    mask = masks.combine(masks.from_key_padding_mask(key_padding), ~attn_mask)  # True = may attend
    got, got_w = ours(x, mask=mask, need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    torch.testing.assert_close(ours(x, mask=mask), want)  # the SDPA path too


def test_cross_attention_equals_torch():
    ref, ours = torch_pair()
    x, context = randn(B, T, D), randn(B, S, D, seed=1)
    key_padding = torch.zeros(B, S, dtype=torch.bool)
    key_padding[1, 4:] = True
    want, want_w = ref(x, context, context, key_padding_mask=key_padding, average_attn_weights=False)
    got, got_w = ours(x, context, masks.from_key_padding_mask(key_padding), need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    assert got_w.shape == (B, H, T, S)


def test_causal_equals_torch_and_from_torch_of_a_sequence_first_module():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H).double().eval()  # (T, B, D) inputs
    ours = MultiHeadAttention.from_torch(ref)
    x = randn(B, T, D)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    want = ref(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), attn_mask=causal)[0].transpose(0, 1)
    torch.testing.assert_close(ours(x, is_causal=True), want)
    torch.testing.assert_close(ours(x, is_causal=True, need_weights=True)[0], want)


def test_from_torch_keeps_training_mode_dropout_and_dtype():
    ref = nn.MultiheadAttention(D, H, dropout=0.25, batch_first=True)
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.training and ours.dropout == 0.25 and ours.qkv.weight.dtype == torch.float32
    assert not MultiHeadAttention.from_torch(ref.eval()).training


# --- the SDPA path (no weights) equals the attnlib.attention path (weights) -----------------------

@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
@pytest.mark.parametrize("case", ["none", "padding", "causal", "padding+causal", "cross", "full (B,H,T,S)"])
def test_sdpa_path_equals_attention_path(num_kv_heads, case):
    m = gqa(num_kv_heads)
    x, context = randn(B, T, D), (randn(B, S, D, seed=1) if case == "cross" else None)
    S_ = S if context is not None else T
    mask = {"padding": masks.padding_mask(masks.lengths_to_valid([S_, 2], S_)),
            "padding+causal": masks.padding_mask(masks.lengths_to_valid([S_, 3], S_)),
            "full (B,H,T,S)": randn(B, H, T, S_, seed=2) > 0}.get(case)
    causal = "causal" in case
    fast = m(x, context, mask, is_causal=causal)
    slow, w = m(x, context, mask, is_causal=causal, need_weights=True)
    torch.testing.assert_close(fast, slow)
    assert w.shape == (B, H, T, S_)
    with torch.no_grad():  # the in-place, no-grad variant of the weights path
        torch.testing.assert_close(m(x, context, mask, is_causal=causal, need_weights=True), (slow, w))


def test_gradients_of_both_paths_agree():
    m = gqa(2)
    x = randn(B, T, D).requires_grad_()
    mask = masks.padding_mask(masks.lengths_to_valid([T, 3], T))
    grads = []
    for need_weights in (False, True):
        out = m(x, mask=mask, is_causal=True, need_weights=need_weights)
        out = out[0] if need_weights else out
        grads.append(torch.autograd.grad(out.square().sum(), [x, m.qkv.weight, m.out.weight]))
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow)


# --- _attention_no_grad equals attnlib.attention -------------------------------------------------

MASKS = {
    "none": None,
    "padding (B, 1, 1, S)": masks.padding_mask(masks.lengths_to_valid([S, 4], S)),
    "causal (T, S)": masks.causal_mask(T, S),
    "full (B, H, T, S)": randn(B, H, T, S, seed=3) > 0.3,
    "fully masked rows": torch.tensor([True, False, True, True, False])[:, None] & (randn(T, S, seed=4) > 0),
}


@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_attention_no_grad_equals_attention(num_kv_heads, mask_name, dtype):
    q = randn(B, H, T, 8, dtype=dtype)
    k, v = randn(B, num_kv_heads, S, 8, dtype=dtype, seed=1), randn(B, num_kv_heads, S, 6, dtype=dtype, seed=2)
    mask, n_rep = MASKS[mask_name], H // num_kv_heads
    want = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)
    tol = {torch.bfloat16: 2e-2, torch.float16: 3e-3}.get(dtype)  # one rounding of the scores apart
    torch.testing.assert_close(_attention_no_grad(q, k, v, mask, 0.0), want, atol=tol, rtol=tol)
    if mask_name == "fully masked rows":
        assert (want[1][:, :, 1] == 0).all() and not want[0].isnan().any()


@pytest.mark.parametrize("num_kv_heads", [H, 1])
def test_attention_no_grad_dropout_equals_attention_with_the_same_seed(num_kv_heads):
    q, k, v = randn(B, H, T, 8), randn(B, num_kv_heads, S, 8, seed=1), randn(B, num_kv_heads, S, 8, seed=2)
    torch.manual_seed(7)
    want = attention(q, repeat_kv(k, H // num_kv_heads), repeat_kv(v, H // num_kv_heads), MASKS["causal (T, S)"],
                     dropout_p=0.3)
    torch.manual_seed(7)
    got = _attention_no_grad(q, k, v, MASKS["causal (T, S)"], 0.3)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got[1], _attention_no_grad(q, k, v, MASKS["causal (T, S)"], 0.0)[1])  # it dropped


# --- GQA / MQA against a reference built with repeat_interleave ----------------------------------

@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
def test_gqa_and_mqa_equal_heads_repeated_with_repeat_interleave(num_kv_heads):
    m, x = gqa(num_kv_heads), randn(B, T, D)
    Dh, kv = D // H, num_kv_heads * (D // H)
    q, k, v = m.qkv(x).split([D, kv, kv], dim=-1)                     # (B, T, D), (B, T, kv) x 2
    q = q.view(B, T, H, Dh).transpose(1, 2)                            # (B, H, T, Dh)
    k, v = (t.view(B, T, num_kv_heads, Dh).transpose(1, 2).repeat_interleave(H // num_kv_heads, dim=1)
            for t in (k, v))                                           # (B, H, T, Dh): head i uses i // g
    want_w = torch.softmax(q @ k.transpose(-2, -1) / Dh ** 0.5, dim=-1)  # (B, H, T, T)
    want = m.out((want_w @ v).transpose(1, 2).reshape(B, T, D))
    got, got_w = m(x, need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    torch.testing.assert_close(m(x), want)
    assert m.qkv.weight.shape == ((H + 2 * num_kv_heads) * Dh, D)


def test_split_and_merge_heads_are_inverse_and_split_matches_the_per_head_slices():
    x = randn(B, T, D)
    heads = split_heads(x, H)                                          # (B, H, T, Dh)
    assert heads.shape == (B, H, T, D // H)
    for h in range(H):
        torch.testing.assert_close(heads[:, h], x[..., h * (D // H):(h + 1) * (D // H)])
    torch.testing.assert_close(merge_heads(heads), x)
    assert not torch.equal(heads.reshape(B, T, D), x)                  # the classic bug: no transpose


# --- the KV cache: fed in pieces == fed at once ---------------------------------------------------

@pytest.mark.parametrize("num_kv_heads", [H, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_cache_incremental_equals_full_causal_pass(num_kv_heads, need_weights):
    m, x = gqa(num_kv_heads), randn(B, 6, D)
    full = m(x, is_causal=True)
    cache, pieces = KVCache(), []
    for start, end in [(0, 3), (3, 4), (4, 6)]:                         # prefill 3, then 1, then 2
        out = m(x[:, start:end], is_causal=True, cache=cache, need_weights=need_weights)
        if need_weights:
            out, w = out
            assert w.shape == (B, H, end - start, end)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)
    assert cache.seq_len == 6 and cache._k[0].shape[1] == num_kv_heads  # H_kv heads cached, not H


# --- dropout: only in training, on the weights actually applied ----------------------------------

def test_dropout_only_in_training_and_the_weights_returned_are_the_ones_applied():
    m, x = gqa(2, dropout=0.5), randn(B, T, D)
    m.train()
    out, w = m(x, need_weights=True)
    _, _, v = m._project(x, None)
    torch.testing.assert_close(out, m.out(merge_heads(w @ repeat_kv(v, 2))))
    with torch.no_grad():  # the in-place path drops the weights it returns, too
        out_ng, w_ng = m(x, need_weights=True)
        torch.testing.assert_close(out_ng, m.out(merge_heads(w_ng @ repeat_kv(v, 2))))
    assert (w_ng == 0).any()
    assert (w == 0).any() and not torch.allclose(w.sum(-1), torch.ones(B, H, T, dtype=w.dtype))
    assert not torch.equal(m(x), m(x))
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    torch.testing.assert_close(m(x, need_weights=True)[1].sum(-1), torch.ones(B, H, T, dtype=w.dtype))


# --- bad input: clear errors ---------------------------------------------------------------------

def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match=r"num_kv_heads=3 must divide num_heads=4"):
        MultiHeadAttention(16, 4, 3)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        MultiHeadAttention(16, 4, dropout=1.0)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((randn(T, D),), {}, ValueError, r"x of shape \(5, 16\) is not \(B, T, D\) with D=16"),
    ((randn(B, T, 12),), {}, ValueError, r"x of shape \(2, 5, 12\) is not \(B, T, D\) with D=16"),
    ((torch.ones(B, T, D, dtype=torch.long),), {}, TypeError, r"x must be a floating-point tensor"),
    ((randn(B, T, D), randn(B, S, 12)), {}, ValueError,
     r"context of shape \(2, 7, 12\) is not \(B, S, D\) with B=2, D=16"),
    ((randn(B, T, D), randn(3, S, D)), {}, ValueError, r"context of shape \(3, 7, 16\) is not \(B, S, D\)"),
    ((randn(B, T, D),), {"mask": torch.ones(B, T, dtype=torch.bool)}, ValueError,
     r"mask of shape \(2, 5\) does not broadcast to scores \(2, 4, 5, 5\); a padding mask \(B, S\) must "
     r"become \(B, 1, 1, S\)"),
    ((randn(B, T, D),), {"mask": torch.ones(3, 1, T, T, dtype=torch.bool)}, ValueError,
     r"mask of shape \(3, 1, 5, 5\) does not broadcast to scores \(2, 4, 5, 5\)"),
    ((randn(B, T, D),), {"mask": torch.ones(T, T)}, TypeError,
     r"mask must be a bool tensor \(True = may attend\), got torch.float32"),
    ((randn(B, T, D), randn(B, S, D)), {"cache": KVCache()}, ValueError, r"cache is for self-attention"),
])
def test_bad_forward_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        gqa(2)(*args, **kwargs)
    with pytest.raises(error, match=message):
        gqa(2)(*args, **kwargs, need_weights=True)


def test_rope_looked_up_once_equals_positions():
    from attnlib.positional import RotaryEmbedding

    m, x = gqa(2, rotary=RotaryEmbedding(D // H)), randn(B, T, D)
    for positions in (torch.arange(3, 3 + T), torch.arange(B * T).view(B, T)):
        rope = m.rotary.cos_sin(positions)  # what LlamaDecoder passes to every layer
        assert torch.equal(m(x, rope=rope), m(x, positions=positions))
    assert torch.equal(m(x, rope=m.rotary.cos_sin(torch.arange(T))), m(x))  # default: positions 0..T-1


def test_rotary_misuse_is_an_error():
    from attnlib.positional import RotaryEmbedding

    m = gqa(2, rotary=RotaryEmbedding(D // H))
    with pytest.raises(ValueError, match=r"rotary is for self-attention"):
        m(randn(B, T, D), randn(B, S, D))
    with pytest.raises(ValueError, match=r"rope was given, but this layer has no rotary embedding"):
        gqa(2)(randn(B, T, D), rope=m.rotary.cos_sin(torch.arange(T)))


def test_cache_of_another_batch_is_an_error():
    m, cache = gqa(2), KVCache()
    m(randn(B, T, D), cache=cache)
    with pytest.raises(ValueError, match=r"holds \(B=2, H_kv=2, Dh=4\), got k of shape \(3, 2, 1, 4\)"):
        m(randn(3, 1, D), cache=cache)


@pytest.mark.parametrize("kwargs, message", [
    ({"kdim": 8, "vdim": 8}, r"kdim=8 / vdim=8 differ from embed_dim=16"),
    ({"add_bias_kv": True}, r"add_bias_kv and add_zero_attn are not modelled"),
    ({"add_zero_attn": True}, r"add_bias_kv and add_zero_attn are not modelled"),
])
def test_from_torch_rejects_options_it_does_not_model(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(D, H, **kwargs))


def test_from_torch_rejects_another_module():
    with pytest.raises(TypeError, match=r"m must be an nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(nn.Linear(D, D))


def test_split_heads_bad_input():
    with pytest.raises(ValueError, match=r"x of shape \(2, 5, 16\): D=16 is not divisible by num_heads=3"):
        split_heads(randn(B, T, D), 3)
    with pytest.raises(ValueError, match=r"x of shape \(5, 16\) is not \(B, T, D\)"):
        split_heads(randn(T, D), 4)


@pytest.mark.parametrize("num_kv_heads", [8, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_counted_flops_equal_the_formula(num_kv_heads, need_weights):
    """2·B·T·D·(D + 2·H_kv·Dh) for the input projections, 2·B·T·D² for W_o, 4·B·T²·D for attention."""
    from attnlib.timing import count_flops

    B_, T_, D_, H_ = 2, 64, 128, 8
    with torch.device("meta"):
        m = MultiHeadAttention(D_, H_, num_kv_heads)
        x = torch.empty(B_, T_, D_)
    projections = 2 * B_ * T_ * D_ * (D_ + 2 * num_kv_heads * (D_ // H_)) + 2 * B_ * T_ * D_ * D_
    assert count_flops(lambda: m(x, need_weights=need_weights)) == projections + 4 * B_ * T_ * T_ * D_
