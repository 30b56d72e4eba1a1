"""What forward returns (issue 36, adversary round 2): out, or a tuple whose first element is out, as
nn.MultiheadAttention returns (out, weights) and a caller unpacks `out, w = mha(x)`. Correct answers in other
libraries' styles pass (a bare tensor; (out, weights) as transformers' attention layers; (out, None);
nn.MultiheadAttention's need_weights and average_attn_weights; GPT-2's (out, present, weights)); the
output in another place is named, in the drill and in the exercise that asks for the weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlib.exercises import check_multi_head_attention, check_multi_head_weights


class FairseqStyle(nn.Module):
    """fairseq's names (q_proj ... out_proj, embed_dim, num_heads); returns (attn, attn_weights) per head,
    or (attn, None) when need_weights is False, as nn.MultiheadAttention does (its average as an option)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(4))

    def attend(self, query, attn_mask=None):
        bsz, tgt_len, embed_dim = query.shape
        heads = lambda t: t.view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731 (B, H, T, Dh)
        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(query)), heads(self.v_proj(query))
        attn_weights = torch.einsum("bhtd,bhsd->bhts", q, k) * self.head_dim ** -0.5  # (B, H, T, S)
        if attn_mask is not None:
            attn_weights = attn_weights.masked_fill(~attn_mask, float("-inf"))
        attn_probs = attn_weights.softmax(-1)
        attn = torch.einsum("bhts,bhsd->bthd", attn_probs, v).reshape(bsz, tgt_len, embed_dim)  # (B, T, D)
        return self.out_proj(attn), attn_probs


class TensorOnly(FairseqStyle):
    def forward(self, x, mask=None):
        return self.attend(x, mask)[0]


class OutWeights(FairseqStyle):
    def forward(self, x, mask=None):
        return self.attend(x, mask)


class OutNone(FairseqStyle):
    def forward(self, x, mask=None):
        return self.attend(x, mask)[0], None


class NeedWeights(FairseqStyle):
    def forward(self, x, attn_mask=None, need_weights=True, average_attn_weights=False):
        attn, probs = self.attend(x, attn_mask)
        return attn, (probs.mean(1) if average_attn_weights else probs) if need_weights else None


class GPT2Style(FairseqStyle):
    """GPT-2's attention block returns (a, present, attn_weights): the output first, then the cache."""

    def forward(self, hidden_states, attention_mask=None):
        attn, probs = self.attend(hidden_states, attention_mask)
        return attn, (None, None), probs


class WeightsFirst(FairseqStyle):
    def forward(self, x, mask=None):
        attn, probs = self.attend(x, mask)
        return probs, attn


class NoneFirst(FairseqStyle):
    def forward(self, x, mask=None):
        return None, self.attend(x, mask)[0]


@pytest.mark.parametrize("cls", [TensorOnly, OutWeights, OutNone, NeedWeights, GPT2Style])
def test_the_output_first_passes_the_drill(cls):
    result = check_multi_head_attention(cls)
    assert result.passed, result.message


@pytest.mark.parametrize("cls", [OutWeights, NeedWeights, GPT2Style])
def test_the_output_first_passes_the_weights_exercise(cls):
    result = check_multi_head_weights(cls)
    assert result.passed, result.message


@pytest.mark.parametrize("check", [check_multi_head_attention, check_multi_head_weights])
def test_weights_first_is_named(check):
    result = check(WeightsFirst)
    assert not result.passed and "returns (weights, out): the output must come first, as nn.MultiheadAttention" \
        in result.message, result.message


def test_the_output_in_another_place_is_named():
    result = check_multi_head_attention(NoneFirst)
    assert not result.passed and "as item 1 of 2: the output must come first" in result.message, result.message
    assert "a caller unpacks `out, weights = mha(x)`" in result.message, result.message


class HeadMeanKeepdim(FairseqStyle):
    def forward(self, x, mask=None):
        attn, probs = self.attend(x, mask)
        return attn, probs.mean(dim=1, keepdim=True)


class UnscaledWeights(FairseqStyle):
    """The output right, but the weights returned recomputed from the unscaled scores."""

    def forward(self, x, mask=None):
        attn, probs = self.attend(x, mask)
        return attn, (probs ** (self.head_dim ** 0.5)) / (probs ** (self.head_dim ** 0.5)).sum(-1, keepdim=True)


@pytest.mark.parametrize("cls, phrase", [(HeadMeanKeepdim, "averaged over the heads"),
                                         (UnscaledWeights, "c = sqrt(d_k): the unscaled scores")])
def test_wrong_weights_are_named(cls, phrase):
    result = check_multi_head_weights(cls)
    assert not result.passed and phrase in result.message, result.message
