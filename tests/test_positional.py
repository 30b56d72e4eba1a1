"""attnlib.positional: sinusoidal against its formula and its shift property, RoPE against transformers' Llama."""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from attnlib import positional
from attnlib.positional import LearnedPositional, RotaryEmbedding, apply_rope, sinusoidal


def _llama_rope(head_dim: int, max_pos: int, base: float) -> LlamaRotaryEmbedding:
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_pos, rope_theta=base, intermediate_size=64,
                         num_hidden_layers=1, vocab_size=32)
    return LlamaRotaryEmbedding(config)


def test_sinusoidal_is_the_formula():
    T, D = 50, 16
    pe = sinusoidal(T, D)
    assert pe.shape == (T, D) and pe.dtype == torch.float32
    for pos in (0, 7, 49):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_shift_is_one_linear_map():
    """PE(pos + k) = PE(pos) M_k for every pos, M_k block-diagonal with 2x2 rotations by k·ω_i."""
    T, D, k = 500, 32, 37
    pe = sinusoidal(T + k + 1, D).double()
    omega = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    M = torch.block_diag(*[torch.stack([torch.stack([ci, -si]), torch.stack([si, ci])]) for ci, si in zip(c, s)])
    torch.testing.assert_close(pe[:T] @ M, pe[k:T + k], rtol=0, atol=1e-4)  # float32 angles up to 537
    assert not torch.allclose(pe[:T] @ M, pe[k + 1:T + k + 1], atol=1e-2)  # and M_k is specific to k


def test_learned_positional_looks_up_its_table():
    torch.manual_seed(0)
    lp = LearnedPositional(10, 8)
    pos = torch.tensor([[0, 3, 9], [1, 1, 2]])
    assert torch.equal(lp(pos), lp.table.weight[pos])
    assert lp(torch.arange(4)).shape == (4, 8)
    with pytest.raises(ValueError, match=r"position 10 is beyond max_len=10"):
        lp(torch.tensor([3, 10]))


@pytest.mark.parametrize("positions_2d", [False, True])
def test_rope_equals_transformers_llama(positions_2d):
    torch.manual_seed(0)
    B, H, T, Dh, max_pos, base = 2, 3, 7, 16, 64, 500.0
    ours, theirs = RotaryEmbedding(Dh, max_pos, base), _llama_rope(Dh, max_pos, base)
    q, k = torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)
    pos = torch.stack([torch.arange(T), torch.arange(T) + 40]) if positions_2d else torch.arange(T) + 13
    cos, sin = theirs(q, pos if positions_2d else pos[None].expand(B, T))  # (B, T, Dh)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(ours(q, pos), q_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours(k, pos), k_ref, rtol=0, atol=1e-6)
    our_cos, our_sin = ours.cos_sin(pos)
    assert our_cos.dtype == torch.float32 and our_cos.shape == ((B, T, Dh) if positions_2d else (T, Dh))
    torch.testing.assert_close(our_cos.expand_as(cos), cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(our_sin.expand_as(sin), sin, rtol=0, atol=1e-6)


def test_rope_in_half_precision_matches_transformers():
    torch.manual_seed(0)
    ours, theirs = RotaryEmbedding(8, 128), _llama_rope(8, 128, 10000.0)
    q = torch.randn(1, 2, 5, 8).bfloat16()
    pos = torch.arange(100, 105)
    cos, sin = theirs(q, pos[None])
    q_ref, _ = apply_rotary_pos_emb(q, q, cos, sin)
    out = ours(q, pos)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, q_ref)


def test_rope_score_depends_only_on_offset():
    torch.manual_seed(0)
    Dh = 32
    rope = RotaryEmbedding(Dh, 4096)
    q, k = torch.randn(1, 1, 1, Dh, dtype=torch.float64), torch.randn(1, 1, 1, Dh, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum().item()

    scale = q.norm().item() * k.norm().item()
    for m, n in [(0, 0), (5, 2), (3, 9), (100, 40)]:
        for shift in (1, 17, 1000):
            # the angles are float32 (as in transformers): error ~ position x 6e-8 per angle
            tol = 1e-6 + 1e-7 * (max(m, n) + shift)
            assert abs(score(m + shift, n + shift) - score(m, n)) <= tol * scale
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # and it does depend on the offset


def test_rope_keeps_norms_and_position_zero_is_identity():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16)
    x = torch.randn(2, 4, 6, 16)
    out = rope(x, torch.arange(6))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])


def test_apply_rope_broadcasts_batch_cos_over_heads():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 4, 8)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    cos, sin = rope.cos_sin(pos)  # (B, T, Dh)
    torch.testing.assert_close(apply_rope(x, cos, sin), rope(x, pos))
    torch.testing.assert_close(rope(x, pos)[1], rope(x[1:], pos[1])[0])


def test_bad_input_messages():
    rope = RotaryEmbedding(8, max_position_embeddings=16)
    x = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"position 17 is beyond max_position_embeddings=16"):
        rope(x, torch.tensor([15, 16, 17]))
    with pytest.raises(ValueError, match=r"positions must be >= 0"):
        rope(x, torch.tensor([-1, 0, 1]))
    with pytest.raises(TypeError, match=r"positions must be an integer tensor"):
        rope(x, torch.arange(3.0))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) does not fit x of shape \(1, 2, 3, 8\)"):
        rope(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"x of shape \(2, 3, 8\) is not \(B, H, T, Dh\) with Dh=8"):
        rope(torch.randn(2, 3, 8), torch.arange(3))
    cos, sin = rope.cos_sin(torch.arange(4))
    with pytest.raises(ValueError, match=r"cos of shape \(4, 8\) and sin of shape \(4, 8\) do not fit x of "
                                         r"shape \(1, 2, 3, 8\): expected \(T, Dh\) = \(3, 8\) or \(B, T, Dh\) = \(1, 3, 8\)"):
        apply_rope(x, cos, sin)
    with pytest.raises(ValueError, match=r"cos of shape \(3, 8\) and sin of shape \(4, 8\) do not fit"):
        apply_rope(x, cos[:3], sin)
    cos, sin = rope.cos_sin(torch.arange(6).view(2, 3))  # (B=2, T, Dh) for an x with B=1
    with pytest.raises(ValueError, match=r"cos of shape \(2, 3, 8\) and sin of shape \(2, 3, 8\) do not fit x"):
        apply_rope(x, cos, sin)
    with pytest.raises(ValueError, match=r"head_dim must be even"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"D must be even"):
        sinusoidal(4, 5)
    with pytest.raises(ValueError, match=r"T must be a positive int"):
        sinusoidal(0, 4)


def test_public_names():
    import attnlib
    assert attnlib.positional is positional
    assert set(positional.__all__) >= {"sinusoidal", "LearnedPositional", "RotaryEmbedding", "apply_rope"}


def test_more_bad_input_messages():
    rope = RotaryEmbedding(8, max_position_embeddings=16)
    with pytest.raises(ValueError, match=r"positions of shape \(1, 1, 3\) is not \(T,\) or \(B, T\)"):
        rope(torch.randn(1, 2, 3, 8), torch.zeros(1, 1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions of shape \(2, 3\) does not fit x of shape \(1, 2, 3, 8\)"):
        rope(torch.randn(1, 2, 3, 8), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got torch.int64"):
        rope(torch.zeros(1, 2, 3, 8, dtype=torch.long), torch.arange(3))
    with pytest.raises(TypeError, match=r"positions must be a torch.Tensor, got list"):
        rope.cos_sin([0, 1, 2])
    with pytest.raises(ValueError, match=r"max_len must be a positive int, got 0"):
        LearnedPositional(0, 8)
    with pytest.raises(ValueError, match=r"max_position_embeddings must be a positive int, got 2.5"):
        RotaryEmbedding(8, 2.5)
    with pytest.raises(TypeError, match=r"positions must be an integer tensor, got torch.bool"):
        LearnedPositional(4, 8)(torch.tensor([True, False]))


def test_rope_table_grows_and_stays_bit_identical_to_the_formula():
    """cos/sin come from a table grown on demand; after growth they equal pos·θ computed directly."""
    rope = RotaryEmbedding(16, max_position_embeddings=4096)
    for positions in (torch.arange(3), torch.tensor([[5, 900], [4095, 0]]), torch.arange(70)):
        cos, sin = rope.cos_sin(positions)
        freqs = positions[..., None].float() * rope.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())
