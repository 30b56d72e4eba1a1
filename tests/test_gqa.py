"""attnlib.gqa: mean-pooling an MHA layer's key/value heads into GQA, checked against MHA on averaged heads."""

import pytest
import torch

from attnlib import MultiHeadAttention
from attnlib.gqa import gqa_from_mha, mean_pool_kv_heads

D, H = 48, 6


def loop_pool(w: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """The definition, one group at a time: kv head j = mean of heads j·g .. j·g + g - 1."""
    g, heads = num_heads // num_kv_heads, w.chunk(num_heads)             # H blocks of Dh rows
    return torch.cat([torch.stack(heads[j * g:(j + 1) * g]).mean(0) for j in range(num_kv_heads)])


@pytest.mark.parametrize("H_kv", [6, 3, 2, 1])
def test_mean_pool_equals_the_loop_for_weights_and_biases(H_kv):
    w, b = torch.randn(H * 8, D), torch.randn(H * 8)
    torch.testing.assert_close(mean_pool_kv_heads(w, H, H_kv), loop_pool(w, H, H_kv), rtol=0, atol=1e-6)
    torch.testing.assert_close(mean_pool_kv_heads(b, H, H_kv), loop_pool(b, H, H_kv), rtol=0, atol=1e-6)


def _averaged_mha(mha: MultiHeadAttention, H_kv: int) -> MultiHeadAttention:
    """An MHA copy whose key and value heads are replaced by their group's mean (H heads kept)."""
    out = MultiHeadAttention(D, H, bias=mha.qkv.bias is not None).eval()
    out.load_state_dict(mha.state_dict())
    g = H // H_kv
    with torch.no_grad():
        for t in [out.qkv.weight] + ([out.qkv.bias] if out.qkv.bias is not None else []):
            for part in t.split([D, D, D])[1:]:                             # k rows, then v rows
                heads = part.reshape(H_kv, g, D // H, *part.shape[1:])      # (H_kv, g, Dh, ...)
                part.copy_(heads.mean(1, keepdim=True).expand_as(heads).reshape(part.shape))
    return out


@pytest.mark.parametrize("H_kv", [6, 3, 2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_gqa_from_mha_equals_mha_with_averaged_heads(H_kv, bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, bias=bias).eval()
    gqa = gqa_from_mha(mha, H_kv)
    assert gqa.num_kv_heads == H_kv and gqa.qkv.weight.shape == (D + 2 * H_kv * D // H, D)
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x, is_causal=True), _averaged_mha(mha, H_kv)(x, is_causal=True),
                                   rtol=0, atol=1e-5)
        if H_kv == H:
            assert torch.equal(gqa(x), mha(x))


def test_pool_is_pluggable_and_training_mode_is_kept():
    mha = MultiHeadAttention(D, H).train()
    first = lambda w, h, h_kv: w.reshape(h_kv, h // h_kv, -1, *w.shape[1:])[:, 0].reshape(-1, *w.shape[1:])  # noqa: E731
    gqa = gqa_from_mha(mha, 2, pool=first)
    assert gqa.training
    k_rows = mha.qkv.weight[D:2 * D].reshape(H, D // H, D)
    torch.testing.assert_close(gqa.qkv.weight[D:D + 2 * D // H], k_rows[[0, 3]].reshape(-1, D))


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"w of shape \(50, 48\) is not \(H·Dh, D\) or \(H·Dh,\) with H=num_heads=6"):
        mean_pool_kv_heads(torch.randn(50, D), H, 2)
    with pytest.raises(ValueError, match=r"num_kv_heads=4 does not divide num_heads"):
        mean_pool_kv_heads(torch.randn(48, D), H, 4)
    with pytest.raises(TypeError, match=r"w must be a floating-point tensor"):
        mean_pool_kv_heads(torch.ones(48, D, dtype=torch.long), H, 2)
    with pytest.raises(ValueError, match=r"num_kv_heads == num_heads \(MHA\)"):
        gqa_from_mha(MultiHeadAttention(D, H, 2), 1)
    with pytest.raises(ValueError, match=r"num_kv_heads=4 must divide num_heads=6"):
        gqa_from_mha(MultiHeadAttention(D, H), 4)
