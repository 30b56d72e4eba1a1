"""The drill's cross-attention check passes the context to the parameter the reader gave it, whatever its name
(adversary round 3: a correct HF-style forward(hidden_states, encoder_hidden_states, attention_mask) was refused
because the context was passed as context=)."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from torch import nn

from attnlib.drill.checks import check_cross_attention


class _Heads(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def attend(self, x, c, m, keys_from_x=False):
        B, T, D = x.shape
        q = self.W_q(x).unflatten(-1, (self.h, -1)).transpose(1, 2)           # (B, H, T, Dh)
        kv = x if keys_from_x else c
        k = self.W_k(kv).unflatten(-1, (self.h, -1)).transpose(1, 2)          # (B, H, S, Dh)
        v = self.W_v(c).unflatten(-1, (self.h, -1)).transpose(1, 2)           # (B, H, S, Dh)
        return self.W_o(F.scaled_dot_product_attention(q, k, v, attn_mask=m).transpose(1, 2).reshape(B, T, D))


class HFStyle(_Heads):
    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None):
        c = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        return self.attend(hidden_states, c, attention_mask)


class MemoryStyle(_Heads):
    def forward(self, x, memory=None, mask=None):
        return self.attend(x, x if memory is None else memory, mask)


class UnnamedStyle(_Heads):
    def forward(self, x, other=None, mask=None):
        return self.attend(x, x if other is None else other, mask)


class KeysFromX(_Heads):
    def forward(self, x, encoder_hidden_states=None, mask=None):
        c = x if encoder_hidden_states is None else encoder_hidden_states
        return self.attend(x, c, mask, keys_from_x=True)


@pytest.mark.parametrize("cls", [HFStyle, MemoryStyle, UnnamedStyle], ids=lambda c: c.__name__)
def test_a_context_under_another_name_passes(cls):
    result = check_cross_attention(cls)
    assert result.passed, result.message


def test_keys_from_x_under_another_name_still_fails_and_names_the_call():
    result = check_cross_attention(KeysFromX)
    assert not result.passed and "encoder_hidden_states=context" in result.message, result.message
