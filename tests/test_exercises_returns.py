"""What a reader returns, and how long a stuck answer keeps the reader waiting (issue 36, adversary round 3).

A checker that expects a tensor refuses anything else by name, the same way in every chapter (a numpy array
with the right values included); a value whose == lies is named as such; code that ignores SIGALRM or
swallows the time limit's exception is stopped within the limit plus a small grace, said in the message."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import (check_accept_count, check_block_table_lookup, check_linear_attention_step,
                               check_qkv_shard, check_residual, check_seq_to_heads, check_stable_softmax,
                               check_top_p_filter)
from attnlib.exercises._guard import limited_to
from exercise_helpers import assert_names


def linear_step_numpy(S, z, q, k, v):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    S_new = S + fk[..., :, None] * v[..., None, :]
    z_new = z + fk
    out = (fq[..., None, :] @ S_new).squeeze(-2) / (fq * z_new).sum(-1, keepdim=True)
    return out.numpy(), S_new.numpy(), z_new.numpy()


def top_p_numpy(logits, p):
    x = logits.numpy()
    order = np.argsort(-x, axis=-1)
    probs = np.take_along_axis(np.exp(x - x.max(-1, keepdims=True)), order, -1)
    probs /= probs.sum(-1, keepdims=True)
    drop_sorted = np.cumsum(probs, -1) - probs >= p
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, -1)
    return np.where(drop, -np.inf, x)


def residual_numpy(p, q):
    r = np.clip(p.numpy() - q.numpy(), 0, None)
    return r / r.sum(-1, keepdims=True)


def seq_to_heads_numpy(blocks):
    W = len(blocks)
    full = np.concatenate([b.numpy() for b in blocks], axis=2)
    return list(np.split(full, W, axis=1))


def qkv_shard_numpy(weight, H, H_kv, rank, W):
    Dh = weight.shape[0] // (H + 2 * H_kv)
    q, k, v = np.split(weight.numpy(), [H * Dh, (H + H_kv) * Dh])
    take = lambda t, n: np.split(t, W)[rank] if n >= W else np.split(t, n)[rank * n // W]
    return np.concatenate([take(q, H), take(k, H_kv), take(v, H_kv)])


@pytest.mark.parametrize("check, answer", [
    (check_linear_attention_step, linear_step_numpy),
    (check_top_p_filter, top_p_numpy),
    (check_residual, residual_numpy),
    (check_seq_to_heads, seq_to_heads_numpy),
    (check_qkv_shard, qkv_shard_numpy),
])
def test_a_numpy_array_with_the_right_values_is_refused_by_name(check, answer):
    assert_names(check(answer), "should be a torch.Tensor", "got a numpy.ndarray of shape (", "torch.from_numpy")


def test_a_tuple_or_a_number_where_one_tensor_is_expected_is_named():
    assert_names(check_stable_softmax(lambda x: (torch.softmax(x, -1), None)),
                 "got a tuple of 2 items (a torch.Tensor of shape (2, 3, 5)", "None)", "not a tuple")
    assert_names(check_stable_softmax(lambda x: 0.5), "should be a torch.Tensor", "got a float (0.5)")


class AlwaysEqual(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def test_an_int_whose_equality_always_holds_is_named_not_taken_for_a_mistake():
    result = check_accept_count(lambda p, q, drafts, u: AlwaysEqual(0))
    assert_names(result, "AlwaysEqual, an int subclass with its own ==", "claims to equal everything",
                 "not a real int")
    assert "matches" not in result.message, result.message


def lookup_ignoring_the_alarm(pool, block_table, seq_len):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass


def lookup_swallowing_everything(pool, block_table, seq_len):
    torch.set_default_dtype(torch.float64)
    while True:
        try:
            time.sleep(0.5)
        except BaseException:
            pass


@pytest.mark.parametrize("answer, words", [
    (lookup_ignoring_the_alarm, ["did not return within 3 s and was stopped 0.5 s later",
                                 "ignores SIGALRM"]),
    (lookup_swallowing_everything, ["ran past its time limit of 3 s and was still running 1 s later",
                                    "`time.sleep(0.5)`", "your kernel is untouched"]),
])
def test_code_that_ignores_the_time_limit_is_stopped_within_the_limit_and_a_stated_grace(answer, words):
    began = time.monotonic()
    with limited_to(3):
        result = check_block_table_lookup(answer)
    took = time.monotonic() - began
    assert_names(result, *words)
    assert took < 2 * 3, took  # was 2 x the limit (SIGALRM ignored) or 4 x the limit + 5 s (swallowed) before
    assert torch.get_default_dtype() == torch.float32
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_a_checker_that_retries_another_call_does_not_wait_for_a_stuck_answer_twice():
    def softmax_forever(x):
        while True:
            pass
    began = time.monotonic()
    with limited_to(3):
        result = check_stable_softmax(softmax_forever)
    assert_names(result, "did not return within 3 s", "of your code: `while True:`")
    assert time.monotonic() - began < 2 * 3  # the square-input retry of chapter 1 ran it 3 s more before


def test_a_numpy_number_where_a_number_is_expected_still_passes():
    from attnlib.exercises import check_xavier_std
    result = check_xavier_std(lambda fan_in, fan_out, gain: np.sqrt(np.float64(gain) ** 2 * 2 / (fan_in + fan_out)))
    assert result.passed, result
