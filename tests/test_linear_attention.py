"""Linear attention: its parallel form against its recurrent form and against the definition written as a
sum over keys; a state whose size does not grow; bad input."""

import pytest
import torch

from attnlib.linear_attention import (LinearAttentionState, elu_feature_map, linear_attention,
                                      linear_attention_recurrent, linear_attention_step)

torch.set_num_threads(1)
B, H, T, DK, DV = 2, 3, 9, 5, 7  # every size different


def qkv(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, DK, generator=g, dtype=dtype), torch.randn(B, H, T, DK, generator=g, dtype=dtype),
            torch.randn(B, H, T, DV, generator=g, dtype=dtype))


def by_definition(q, k, v, causal):
    """out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), j ≤ i when causal: one query at a time."""
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        n = i + 1 if causal else q.shape[-2]
        sim = torch.einsum("bhd,bhjd->bhj", fq[..., i, :], fk[..., :n, :])           # (B, H, n)
        out[..., i, :] = torch.einsum("bhj,bhjv->bhv", sim, v[..., :n, :]) / (sim.sum(-1, keepdim=True) + 1e-6)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_parallel_form_is_the_definition(causal):
    q, k, v = qkv()
    torch.testing.assert_close(linear_attention(q, k, v, causal=causal), by_definition(q, k, v, causal),
                               rtol=0, atol=1e-12)


def test_recurrent_form_equals_parallel_form():
    q, k, v = qkv()
    out, state = linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(out, linear_attention(q, k, v), rtol=0, atol=1e-12)
    fk = elu_feature_map(k)
    torch.testing.assert_close(state.S, fk.transpose(-2, -1) @ v, rtol=0, atol=1e-12)  # Σ φ(k_j) v_jᵀ
    torch.testing.assert_close(state.z, fk.sum(-2), rtol=0, atol=1e-12)


def test_recurrent_form_continues_from_a_state():
    q, k, v = qkv()
    _, state = linear_attention_recurrent(q[..., :4, :], k[..., :4, :], v[..., :4, :])
    rest, _ = linear_attention_recurrent(q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], state=state)
    torch.testing.assert_close(rest, linear_attention(q, k, v)[..., 4:, :], rtol=0, atol=1e-12)


def test_the_state_does_not_grow_and_is_not_modified():
    q, k, v = qkv(torch.float32)
    state, sizes = None, []
    for t in range(T):
        before = None if state is None else state.S.clone()
        _, new = linear_attention_step(state, q[..., t, :], k[..., t, :], v[..., t, :])
        if before is not None:
            assert torch.equal(state.S, before)
        state = new
        sizes.append(state.nbytes)
    assert sizes == [B * H * DK * (DV + 1) * 4] * T


def test_a_custom_feature_map_is_used():
    q, k, v = qkv()
    relu = lambda x: torch.relu(x) + 0.1  # noqa: E731 - any positive map
    out, _ = linear_attention_recurrent(q, k, v, feature_map=relu)
    torch.testing.assert_close(out, linear_attention(q, k, v, feature_map=relu), rtol=0, atol=1e-12)
    assert not torch.allclose(out, linear_attention(q, k, v))


def test_bad_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 9, 4\)"):
        linear_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="v of shape"):
        linear_attention(q, k, v[..., :5, :])
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        linear_attention(q.long(), k, v)
    other = LinearAttentionState.zeros(B, H, DK + 1, DV, dtype=q.dtype)  # a state from other heads
    with pytest.raises(ValueError, match=r"state with S of shape \(2, 3, 6, 7\).*expected S"):
        linear_attention_step(other, q[..., 0, :], k[..., 0, :], v[..., 0, :])
