"""Adversary round 5's findings, each written as a reader's answer would be: what passed or went unnamed before."""

from __future__ import annotations

import torch
from torch import nn

from attnlib.exercises import check_cross_attention_mask, check_decoder_block, check_encoder_block, check_fused_qkv
from exercise_helpers import assert_names


def test_a_cross_attention_mask_as_wide_as_the_longest_sentence_is_named():
    def cross_attention_mask(src_lengths, T, S):
        keep = torch.arange(int(src_lengths.max()))[None, :] < src_lengths[:, None]   # (B, max length)
        return keep[:, None, None, :]
    assert_names(check_cross_attention_mask(cross_attention_mask), "max(src_lengths) wide instead of S")


def test_a_fused_projection_split_per_head_is_named_with_another_head_count():
    def fused_qkv(x, weight, bias, num_heads):                    # GPT-NeoX's layout: [q, k, v] within each head
        qkv = (x @ weight.T + bias).unflatten(-1, (num_heads, 3, -1))             # (B, T, H, 3, Dh)
        return tuple(qkv.permute(2, 0, 1, 3, 4).transpose(2, 3).unbind(0))    # H tensors (B, 3, T, Dh)
    assert_names(check_fused_qkv(fused_qkv), "num_heads=2", "one per head", "GPT-NeoX's layout")


def _zero_block(x, memory, *modules):
    return torch.zeros_like(x)


def test_a_forward_hook_on_a_module_given_is_named():
    def decoder_block(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
        norm3.register_forward_hook(lambda module, args, out: torch.zeros_like(out))
        return _zero_block(x, memory)
    assert_names(check_decoder_block(decoder_block), "a forward hook on", "copy.deepcopy")


def test_a_patched_class_method_or_a_swapped_class_is_named():
    def patched(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
        type(norm3).forward = lambda self, z: torch.zeros_like(z)
        return _zero_block(x, memory)
    assert_names(check_decoder_block(patched), "LayerNorm.forward")

    def swapped(layer, x, valid):
        class Zero(type(layer.norm2)):
            def forward(self, z):
                return torch.zeros_like(z)
        layer.norm2.__class__ = Zero
        return torch.zeros_like(x)
    assert_names(check_encoder_block(swapped), "the class of `norm2`")


def test_a_hook_on_every_module_is_named():
    def decoder_block(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
        nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 0)
        return _zero_block(x, memory)
    assert_names(check_decoder_block(decoder_block), "a forward hook on every module")
