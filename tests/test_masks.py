"""attnlib.masks: builders, converters from other libraries' conventions, and validation."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlib import attention, masks


def test_causal_mask_square_is_lower_triangle():
    assert torch.equal(masks.causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("T,S", [(1, 5), (2, 5), (3, 3), (5, 2)])
def test_causal_mask_is_bottom_right(T, S):
    m = masks.causal_mask(T, S)
    assert m.shape == (T, S) and m.dtype == torch.bool
    for i in range(T):
        for j in range(S):
            assert m[i, j] == (j <= i + (S - T))


def test_one_query_after_cached_keys_sees_them_all():
    assert masks.causal_mask(1, 5).all()


def test_lengths_to_valid_and_padding_mask():
    valid = masks.lengths_to_valid(torch.tensor([3, 1, 0]), 4)
    assert torch.equal(valid, torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]).bool())
    m = masks.padding_mask(valid)
    assert m.shape == (3, 1, 1, 4) and torch.equal(m[:, 0, 0], valid)
    assert torch.equal(masks.padding_mask(valid.long()), m)


def test_from_hf_matches_transformers_meaning():
    hf = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(masks.from_hf(hf)[:, 0, 0], hf.bool())


def test_key_padding_mask_conversion_equals_nn_multihead_attention():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, bias=False).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])  # True = ignore
    ref, _ = mha(x, x, x, key_padding_mask=kpm)
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
    split = lambda t: t.view(2, 4, 2, 4).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    out, _ = attention(split(x @ w_q.T), split(x @ w_k.T), split(x @ w_v.T), masks.from_key_padding_mask(kpm))
    torch.testing.assert_close(out.transpose(1, 2).reshape(2, 4, 8) @ mha.out_proj.weight.T, ref)


def test_float_key_padding_mask_is_additive():
    additive = torch.tensor([[0.0, float("-inf")]])
    assert torch.equal(masks.from_key_padding_mask(additive)[:, 0, 0], torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match="only 0 \\(attend\\) and -inf"):
        masks.from_key_padding_mask(torch.tensor([[0.0, -5.0]]))


def test_combine_ands_with_broadcasting():
    pad = masks.padding_mask(torch.tensor([[1, 1, 0]]))
    both = masks.combine(pad, masks.causal_mask(3), None)
    assert both.shape == (1, 1, 3, 3)
    assert torch.equal(both[0, 0], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]]).bool())
    assert masks.combine() is None


def test_inverted_mask_runs_silently_and_differs():
    """The reason conventions matter: an inverted mask raises nothing and gives another answer."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 4, generator=g) for _ in range(3))
    m = masks.causal_mask(3)
    m_inv = ~m
    m_inv[0, 0] = True  # keep every row attendable so SDPA is finite
    assert not torch.allclose(attention(q, k, v, m)[0], F.scaled_dot_product_attention(q, k, v, attn_mask=m_inv))


@pytest.mark.parametrize("call,error,message", [
    (lambda: masks.causal_mask(0), ValueError, "T must be a positive int, got 0"),
    (lambda: masks.causal_mask(3, 2.5), ValueError, "S must be a positive int, got 2.5"),
    (lambda: masks.padding_mask(torch.ones(2, 1, 4)), ValueError, "valid of shape (2, 1, 4) is not (B, S)"),
    (lambda: masks.padding_mask(torch.tensor([[0, 2]])), TypeError, "valid must be bool or 0/1 integers"),
    (lambda: masks.from_hf(torch.ones(2, 3, 4)), ValueError, "attention_mask of shape (2, 3, 4) is not (B, S)"),
    (lambda: masks.from_hf(torch.ones(2, 3)), TypeError, "attention_mask must be bool or 0/1 integers"),
    (lambda: masks.from_key_padding_mask(torch.ones(2, 3, dtype=torch.long)), TypeError,
     "key_padding_mask must be bool (True = ignore) or float"),
    (lambda: masks.lengths_to_valid(torch.tensor([5]), 4), ValueError, "lengths must lie in [0, S=4], got [5]"),
    (lambda: masks.lengths_to_valid(torch.tensor([[1]]), 4), ValueError, "lengths of shape (1, 1)"),
    (lambda: masks.combine(torch.ones(2, 3, dtype=torch.bool), torch.ones(4, 3, dtype=torch.bool)), ValueError,
     "masks of shapes (2, 3), (4, 3) do not broadcast together"),
    (lambda: masks.combine(torch.ones(2, 3)), TypeError, "masks[0] must be bool"),
    (lambda: masks.check_mask(torch.ones(3, 3, dtype=torch.bool), (2, 2, 2)), ValueError,
     "mask of shape (3, 3) does not broadcast to scores (2, 2, 2)"),
])
def test_bad_input_gives_a_clear_error(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


@pytest.mark.parametrize("T,S", [(1, 5), (2, 5), (4, 4), (3, 8)])
def test_causal_mask_equals_torch_causal_lower_right(T, S):
    """torch's own bottom-right causal bias, through SDPA, gives the same output as our mask."""
    from torch.nn.attention.bias import causal_lower_right

    g = torch.Generator().manual_seed(T * 10 + S)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (T, S, S))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))
    torch.testing.assert_close(attention(q, k, v, masks.causal_mask(T, S))[0], ref)
    torch.testing.assert_close(attention(q, k, v, is_causal=True)[0], ref)


def test_sdpa_is_causal_is_top_left_and_differs_when_T_lt_S():
    """The fact chapter 3 teaches: SDPA's is_causal lets query i see keys j <= i, whatever S is."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=g, dtype=torch.float64) for n in (2, 5, 5))
    top_left = torch.ones(2, 5, dtype=torch.bool).tril()
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention(q, k, v, top_left)[0], sdpa)
    assert not torch.allclose(attention(q, k, v, is_causal=True)[0], sdpa)


def test_padding_mask_makes_real_outputs_independent_of_padding():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    pad = masks.padding_mask(masks.lengths_to_valid([3, 5], 5))
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 3:], v2[0, :, 3:] = 50.0, -50.0
    torch.testing.assert_close(attention(q, k2, v2, pad)[0][0, :, :3], attention(q, k, v, pad)[0][0, :, :3])


def test_from_hf_equals_transformers_bert_weights():
    """A tiny random BERT (eager) given attention_mask returns the weights attnlib computes with from_hf."""
    from transformers import BertConfig, BertModel

    B, S, D, H = 2, 4, 8, 2
    config = BertConfig(vocab_size=30, hidden_size=D, num_hidden_layers=1, num_attention_heads=H,
                        intermediate_size=16, initializer_range=0.5, attn_implementation="eager")
    torch.manual_seed(0)
    bert = BertModel(config).eval().double()
    ids, hf = torch.tensor([[5, 6, 7, 0], [0, 9, 10, 11]]), torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    with torch.no_grad():
        ref = bert(ids, attention_mask=hf, output_attentions=True).attentions[0]  # (B, H, S, S)
        h, sa = bert.embeddings(ids), bert.encoder.layer[0].attention.self
        split = lambda t: t.view(B, S, H, D // H).transpose(1, 2)  # noqa: E731 - (B, S, D) -> (B, H, S, Dh)
        _, ours = attention(split(sa.query(h)), split(sa.key(h)), split(sa.value(h)), masks.from_hf(hf))
    torch.testing.assert_close(ours, ref)
