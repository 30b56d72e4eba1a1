"""The (gated) delta rule: recurrent form against chunked form and against transformers' own functions; the
GatedDeltaNet layer against Qwen3.5's inside its model; decoding from a fixed-size state; bad input."""

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from attnlib import layer_io
from attnlib.delta_rule import gated_delta_rule_chunked, gated_delta_rule_recurrent, l2_normalize
from attnlib.gated_deltanet import GatedDeltaNet, GatedDeltaNetState

torch.set_num_threads(1)
B, H, T, DK, DV = 2, 3, 100, 8, 6  # T > 64: more than one of transformers' chunks


def rule_inputs(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (l2_normalize(torch.randn(B, H, T, DK, generator=gen, dtype=dtype)) for _ in range(2))
    v = torch.randn(B, H, T, DV, generator=gen, dtype=dtype)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype)
    g = -0.5 * torch.rand(B, H, T, generator=gen, dtype=dtype)
    return q, k, v, beta, g, torch.randn(B, H, DK, DV, generator=gen, dtype=dtype)


def by_definition(q, k, v, beta, g, S):
    """S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ (the papers' product form), o_t = S_tᵀ q_t / sqrt(Dk)."""
    eye, outs = torch.eye(DK, dtype=q.dtype), []
    for t in range(q.shape[2]):
        kt = k[:, :, t, :, None]                                                  # (B, H, Dk, 1)
        b = beta[:, :, t, None, None]
        S = g[:, :, t, None, None].exp() * (eye - b * kt @ kt.mT) @ S + b * kt @ v[:, :, t, None, :]
        outs.append(S.mT @ q[:, :, t, :, None] / DK ** 0.5)
    return torch.stack(outs, dim=2).squeeze(-1), S


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 16, 64, 128])
def test_chunked_equals_recurrent_equals_definition(gated, chunk_size):
    q, k, v, beta, g, S0 = rule_inputs()
    g = g if gated else None
    o_rec, s_rec = gated_delta_rule_recurrent(q, k, v, beta, g, initial_state=S0)
    o_chunk, s_chunk = gated_delta_rule_chunked(q, k, v, beta, g, chunk_size=chunk_size, initial_state=S0)
    o_def, s_def = by_definition(q, k, v, beta, torch.zeros_like(beta) if g is None else g, S0)
    for ours in (o_rec, o_chunk):
        torch.testing.assert_close(ours, o_def, rtol=0, atol=1e-12)
    for ours in (s_rec, s_chunk):
        torch.testing.assert_close(ours, s_def, rtol=0, atol=1e-12)


@pytest.mark.parametrize("theirs", [torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule])
def test_equal_to_transformers_functions(theirs):
    """transformers' functions take (B, T, H, ·), L2-normalise q and k themselves and compute in float32."""
    q, k, v, beta, g, S0 = rule_inputs(torch.float32)
    raw_q, raw_k = q * 3.0, k * 0.5  # their l2norm must undo these
    to_bthd = lambda x: x.transpose(1, 2)  # noqa: E731  (B, H, T, ·) -> (B, T, H, ·)
    o_hf, s_hf = theirs(to_bthd(raw_q), to_bthd(raw_k), to_bthd(v), g=to_bthd(g), beta=to_bthd(beta),
                        initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = gated_delta_rule_chunked(l2_normalize(raw_q), l2_normalize(raw_k), v, beta, g, initial_state=S0)
    torch.testing.assert_close(o, o_hf.transpose(1, 2), rtol=0, atol=2e-6)
    torch.testing.assert_close(s, s_hf, rtol=0, atol=2e-6)


def test_rule_bad_input():
    q, k, v, beta, g, S0 = rule_inputs()
    with pytest.raises(ValueError, match=r"initial_state of shape \(2, 3, 6, 8\) is not \(B, H, Dk, Dv\)"):
        gated_delta_rule_recurrent(q, k, v, beta, g, initial_state=S0.mT)
    with pytest.raises(ValueError, match=r"beta of shape \(2, 100, 3\)"):
        gated_delta_rule_chunked(q, k, v, beta.transpose(1, 2), g)
    with pytest.raises(ValueError, match=r"chunk_size must be an int >= 1"):
        gated_delta_rule_chunked(q, k, v, beta, g, chunk_size=0)


def qwen35(seed=0, dtype=torch.float32) -> Qwen3_5ForCausalLM:
    """RECIPES' tiny hybrid Qwen3.5 (a linear layer, then a full-attention one), every parameter perturbed."""
    config = Qwen3_5TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                               layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                               linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                               linear_conv_kernel_dim=4)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at exactly 1: a forgotten weight would go unseen
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def model():
    return qwen35()


def test_layer_equals_transformers_inside_its_model(model):
    ids = torch.randint(0, 97, (2, 150), generator=torch.Generator().manual_seed(1))
    io = layer_io(model, model.model.layers[0].linear_attn, ids)
    x, y = io.x, io.y
    ours = GatedDeltaNet.from_hf(model.model.layers[0].linear_attn)
    with torch.no_grad():
        diff = (ours(x) - y).abs().max().item()
    assert diff < 1e-5, diff
    assert y.abs().max() > 0.1  # a meaningful output, not zeros


def test_left_padding_equals_transformers(model):
    ids = torch.randint(0, 97, (2, 80), generator=torch.Generator().manual_seed(3))
    valid = torch.ones(2, 80, dtype=torch.long)
    valid[1, :13] = 0  # row 1 is left-padded by 13 tokens
    io = layer_io(model, model.model.layers[0].linear_attn, ids, attention_mask=valid)
    x, y = io.x, io.y
    assert torch.equal(io.kwargs["attention_mask"], valid)
    ours = GatedDeltaNet.from_hf(model.model.layers[0].linear_attn)
    with torch.no_grad():
        padded = ours(x, valid=valid)
        alone = ours(x[1:, 13:])  # the padded row's real tokens, without padding
    assert (padded - y).abs().max() < 1e-5
    assert (padded[1:, 13:] - alone).abs().max() < 1e-5  # padding leaves no trace
    with pytest.raises(ValueError, match=r"valid of shape \(2, 79\) is not \(B, T\) = \(2, 80\)"):
        ours(x, valid=valid[:, 1:])


def test_prefill_then_steps_equal_the_full_forward(model):
    m = GatedDeltaNet.from_hf(model.model.layers[0].linear_attn)
    x = torch.randn(2, 90, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(x)
        state = m.empty_state(2)
        parts, sizes = [m(x[:, :70], state)], []
        for t in range(70, 90):
            parts.append(m(x[:, t:t + 1], state))
            sizes.append(state.nbytes)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    K, C = 4, 2 * 2 * 16 + 4 * 16
    assert sizes == [4 * 2 * (C * (K - 1) + 4 * 16 * 16)] * 20 and state.seq_len == 90


def test_layer_bad_input(model):
    with pytest.raises(ValueError, match="num_v_heads=6 is not a multiple of num_k_heads=4"):
        GatedDeltaNet(64, 4, 6, 16, 16)
    m = GatedDeltaNet.from_hf(model.model.layers[0].linear_attn)
    other = GatedDeltaNet(64, 2, 2, 16, 16).empty_state(1)  # another model's state
    with pytest.raises(ValueError, match=r"state.conv of shape \(1, 96, 3\) does not fit this layer: "
                                         r"expected \(1, 128, 3\)"):
        m(torch.randn(1, 1, 64), other)
    with pytest.raises(ValueError, match=r"state.conv of shape \(2, 128, 3\).*expected \(1, 128, 3\)"):
        m(torch.randn(1, 1, 64), m.empty_state(2))
    with pytest.raises(TypeError, match="state must be a GatedDeltaNetState"):
        m(torch.randn(1, 1, 64), {"conv": None})
    with pytest.raises(ValueError, match=r"x of shape \(1, 5, 32\) is not \(B, T, D\) with D=64"):
        m(torch.randn(1, 5, 32))
    with pytest.raises(TypeError, match="must be a transformers Qwen3_5GatedDeltaNet"):
        GatedDeltaNet.from_hf(model.model.layers[1].self_attn)
    assert isinstance(m.empty_state(1), GatedDeltaNetState)
