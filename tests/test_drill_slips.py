"""A third set of answers nobody here wrote (the adversary's, after issue 28): the slip each one makes is named,
not left as "max abs difference". Each answer is our own code in the style the adversary found."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from attnlib.exercises import check_multi_head_attention
from test_drill_issue28 import Base


class Plain(Base):  # separate projections W_q, W_k, W_v, W_o and heads(t), from issue 28's tests
    def attend(self, q, k, v, mask, bias=None):  # (B, H, T, Dh) x 3 -> (B, T, D)
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + (0 if bias is None else bias)
        s = s if mask is None else s.masked_fill(~mask, float("-inf"))
        return (s.softmax(-1) @ v).transpose(1, 2).flatten(2)

    def forward(self, x, mask=None):
        q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        return self.W_o(self.attend(q, k, v, mask))


def _x_detached(self, x, mask=None):
    return Plain.forward(self, x.detach(), mask)


def _q_bias_dropped(self, x, mask=None):
    q = self.heads(x @ self.W_q.weight.T)
    return self.W_o(self.attend(q, self.heads(self.W_k(x)), self.heads(self.W_v(x)), mask))


def _o_untransposed(self, x, mask=None):
    o = self.attend(*(self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v)), mask)
    return o @ self.W_o.weight + self.W_o.bias


def _o_on_values(self, x, mask=None):
    return self.attend(self.heads(self.W_q(x)), self.heads(self.W_k(x)), self.heads(self.W_o(self.W_v(x))), mask)


def _gelu_after(self, x, mask=None):
    return F.gelu(Plain.forward(self, x, mask))


def _alibi_inside(self, x, mask=None):
    T = x.shape[1]
    pos = torch.arange(T)
    bias = -(pos[None, :] - pos[:, None]).abs() * torch.tensor([0.5, 0.25, 0.125])[:, None, None]  # (H, T, T)
    q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    return self.W_o(self.attend(q, k, v, mask, bias))


def _bf16_softmax(self, x, mask=None):
    q, k, v = (self.heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    s = s if mask is None else s.masked_fill(~mask, float("-inf"))
    return self.W_o((s.to(torch.bfloat16).softmax(-1).to(s.dtype) @ v).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("forward, words", [
    (_x_detached, ["x gets no gradient from it", "x.detach()"]),
    (_q_bias_dropped, ["`W_q`'s bias is never added"]),
    (_o_untransposed, ["`W_o`'s weight is used untransposed"]),
    (_o_on_values, ["`W_o` applied to the values before the attention"]),
    (_gelu_after, ["the output is F.gelu(attention)"]),
    (_alibi_inside, ["with the positions of x shuffled, the output is not the same output shuffled"]),
    (_bf16_softmax, ["not exactly 1: a softmax in low precision"]),
], ids=lambda v: getattr(v, "__name__", "words"))
def test_the_slip_is_named(forward, words):
    result = check_multi_head_attention(type("Slip", (Plain,), {"forward": forward}))
    assert not result.passed, result.message
    assert all(w in result.message for w in words), result.message


def test_a_correct_answer_still_passes():
    assert check_multi_head_attention(Plain).passed


def test_a_parametrized_projection_is_told_the_rule_not_that_its_layers_do_nothing():
    class Normed(Plain):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads)
            self.W_q = weight_norm(nn.Linear(d_model, d_model))
    result = check_multi_head_attention(Normed)
    assert not result.passed and "`W_q` is under a parametrization" in result.message, result.message
    assert "changes nothing" not in result.message


def test_a_fused_layer_interleaved_feature_by_feature_passes_and_a_wrong_one_is_told_the_layouts_read():
    class Interleaved(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.h, self.qkv, self.o = num_heads, nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

        def forward(self, x, mask=None):
            B, T, D = x.shape
            q, k, v = self.qkv(x).view(B, T, self.h, D // self.h, 3).permute(4, 0, 2, 1, 3)  # 3 x (B, H, T, Dh)
            return self.o(Plain.attend(self, q, k, v, mask))
    result = check_multi_head_attention(Interleaved)
    assert result.passed and "interleaved feature by feature (D, 3)" in result.message, result.message

    def shuffled(self, x, mask=None):  # rows taken in a fixed random order: no layout a reader would mean
        B, T, D = x.shape
        rows = torch.randperm(3 * D, generator=torch.Generator().manual_seed(0))
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in self.qkv(x)[..., rows].chunk(3, -1))
        return self.o(Plain.attend(self, q, k, v, mask))
    result = check_multi_head_attention(type("Shuffled", (Interleaved,), {"forward": shuffled}))
    assert not result.passed and "if yours lays out q, k and v otherwise" in result.message, result.message
