"""Answers of the kind adversary round 4 found holes with (issue 36): an answer that changes the module the checker
gave it, raises GeneratorExit or KeyboardInterrupt, or builds its drill layers in float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib.exercises import (check_block_table_lookup, check_cached_decode, check_encoder_block, check_find_head,
                               check_memory_kv, check_multi_head_attention, check_ring_merge)
from exercise_helpers import assert_names


def test_zeroing_the_modules_weights_and_returning_zeros_is_named_not_passed():
    def memory_kv(attn, memory):
        with torch.no_grad():
            attn.qkv.weight.zero_()
            attn.qkv.bias.zero_()
        B, S, D = memory.shape
        z = torch.zeros(B, attn.num_heads, S, D // attn.num_heads)
        return z, z.clone()
    assert_names(check_memory_kv(memory_kv), "changed `attn` (its parameters qkv.weight, qkv.bias) in place",
                 "copy.deepcopy")


def test_replacing_a_submodules_forward_is_named():
    def encoder_block(layer, x, valid):
        layer.attn.forward = lambda *args, **kwargs: torch.zeros_like(x)
        return x
    assert_names(check_encoder_block(encoder_block), "changed `layer` (attn.forward replaced on the instance)")


def test_zeroing_the_decoder_is_named_not_a_crash_of_the_checker():
    def decode(decoder, input_ids, max_new_tokens):
        with torch.no_grad():
            for p in decoder.parameters():
                p.zero_()
        return torch.cat([input_ids, input_ids.new_zeros(1, max_new_tokens)], dim=1)
    assert_names(check_cached_decode(decode), "changed the decoder (its parameters embed.weight")


def test_tensors_inside_a_list_argument_changed_in_place_are_named():
    def find_head(weights, query, key):
        for w in weights:
            w.zero_()
        weights[0][0, query, key] = 1.0
        return 0, 0
    assert_names(check_find_head(find_head), "changed weights in place")


def test_generator_exit_and_a_readers_own_base_exception_are_verdicts():
    class Done(BaseException):
        pass

    def lookup(pool, block_table, seq_len):
        raise GeneratorExit("bye")

    def merge(out1, lse1, out2, lse2):
        raise Done
    assert_names(check_block_table_lookup(lookup), "raised GeneratorExit (bye)", "must return its result")
    assert_names(check_ring_merge(merge), "raised Done", "must return its result")


class MHA64(nn.Module):
    """Correct attention whose layers are float64; forward returns x's dtype."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, dtype=torch.float64)
        self.proj = nn.Linear(d_model, d_model, dtype=torch.float64)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = self.qkv(x.double()).view(B, T, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, D)).to(x.dtype)


def test_drill_layers_made_in_float64_pass():
    result = check_multi_head_attention(MHA64)
    assert result.passed, result


class DriftingMHA(nn.Module):
    """Right on its first three calls; then a 'temperature' that drifts with usage (state kept in self.calls)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.calls = num_heads, 0
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        self.calls += 1
        B, T, D = x.shape
        q, k, v = (lin(x).view(B, T, self.h, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
        s = q @ k.transpose(-1, -2) / (D // self.h) ** 0.5 * (1.05 if self.calls > 3 else 1.0)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


def test_state_that_changes_forward_after_a_few_calls_is_named_as_state_not_as_a_scale():
    assert_names(check_multi_head_attention(DriftingMHA), "depends on its earlier calls", "`self.calls`")


def test_keys_reshaped_instead_of_transposed_are_named():
    from attnlib.exercises import check_scaled_scores

    def scaled_scores(q, k):
        B, H, S, Dh = k.shape
        return q @ k.reshape(B, H, Dh, S) / Dh ** 0.5
    assert_names(check_scaled_scores(scaled_scores), "k reshaped (or viewed) to (B, H, Dh, S) instead of transposed")


def test_a_gate_from_y_and_a_reshaped_gate_weight_are_named():
    from attnlib.exercises import check_output_gate

    def gate_from_y(x, y, gate_weight, out_weight):
        return F.linear(y * torch.sigmoid(y), out_weight)

    def gate_reshaped(x, y, gate_weight, out_weight):
        return F.linear(y * torch.sigmoid(x @ gate_weight.reshape(gate_weight.shape[1], -1)), out_weight)
    assert_names(check_output_gate(gate_from_y), "the gate computed from y")
    assert_names(check_output_gate(gate_reshaped), "gate_weight reshaped to (D, H·Dh) instead of transposed")


def test_a_fresh_cache_at_every_call_is_named_even_though_the_tokens_differ():
    from attnlib import KVCache

    def decode(decoder, input_ids, max_new_tokens):
        ids, step = input_ids, input_ids
        for _ in range(max_new_tokens):
            nxt = decoder(step, KVCache())[:, -1].argmax(-1, keepdim=True)
            ids, step = torch.cat([ids, nxt], dim=1), nxt
        return ids
    assert_names(check_cached_decode(decode), "a new empty KVCache was made after the first call",
                 "see none of the earlier tokens")


def test_entries_right_and_wrong_along_an_unnamed_axis_are_told_as_indices():
    from attnlib.exercises import check_left_pad_positions

    def left_pad_positions(attention_mask):
        T = attention_mask.shape[1]
        pads = (attention_mask == 0).sum(-1, keepdim=True)
        return (torch.arange(T)[None] - pads - 1).clamp(min=0)
    result = check_left_pad_positions(left_pad_positions)
    assert_names(result, "indices 1-3, 5-10, 12 and 14-18 along dim 0 are not")
    assert "dim 0s" not in result.message


def test_the_rope_offset_score_with_the_exponent_j_over_dh_is_named():
    from attnlib.exercises import check_rope_offset_score

    def score(q, k, delta):
        Dh = q.shape[-1]
        theta = 10000.0 ** (-torch.arange(Dh // 2, dtype=torch.float64) / Dh)
        angle = torch.cat((delta * theta, delta * theta))
        rotated = q.double() * angle.cos() + torch.cat((-q[Dh // 2:], q[:Dh // 2])).double() * angle.sin()
        return float(rotated @ k.double())
    assert_names(check_rope_offset_score(score), "the exponent j/Dh instead of 2j/Dh")


def test_gqa_biases_counted_as_in_mha_are_named():
    from attnlib.exercises import check_mha_param_count

    def param_count(d_model, num_heads, num_kv_heads, bias):
        kv = num_kv_heads * (d_model // num_heads)
        return 2 * d_model * d_model + 2 * d_model * kv + (4 * d_model if bias else 0)
    assert_names(check_mha_param_count(param_count), "the biases counted as 4·D, as in MHA")


def test_the_max_subtracted_in_the_numerator_only_is_named():
    import math
    from attnlib.exercises import check_one_query_attention

    def one_query_attention(q, keys, values):
        s = [sum(a * b for a, b in zip(q, k)) / math.sqrt(len(q)) for k in keys]
        top = max(s)
        z = sum(math.exp(x) for x in s)
        w = [math.exp(x - top) / z for x in s]
        return [sum(wi * v[d] for wi, v in zip(w, values)) for d in range(len(values[0]))]
    assert_names(check_one_query_attention(one_query_attention), "the max subtracted in the numerator only")
