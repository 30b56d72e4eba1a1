"""Chapter 1's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import math

import pytest
import torch

from attnlib.exercises import check_attention_einsum, check_one_query_attention, check_stable_softmax
from exercise_helpers import assert_names, stub


# --- stable softmax ----------------------------------------------------------------------------

def good_softmax(x):
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def test_stable_softmax_accepts_a_correct_one():
    result = check_stable_softmax(good_softmax)
    assert result.passed, result
    assert check_stable_softmax(lambda x: torch.nan_to_num(torch.softmax(x, dim=-1))).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), ["contains NaN", "overflowing"]),
    (lambda x: torch.softmax(x, dim=-1), ["contains NaN", "all -inf row", "return zeros"]),
    (lambda x: torch.softmax(x, dim=0), ["wrong axis (dim=0"]),
    (lambda x: torch.softmax(x, dim=-2), ["wrong axis (dim=-2"]),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)), ["no normalization"]),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(),
     ["over the whole tensor"]),
    (lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(-1, keepdim=True), ["one max for the whole"]),
])
def test_stable_softmax_names_the_mistake(buggy, phrases):
    assert_names(check_stable_softmax(buggy), *phrases)


def test_stable_softmax_stub_and_crash():
    assert check_stable_softmax(stub).status == "not attempted yet"

    def no_keepdim(x):
        e = torch.exp(x - x.amax(dim=-1))  # (2, 3, 5) - (2, 3) does not broadcast; (4, 4) - (4,) does
        return e / e.sum(dim=-1)
    assert_names(check_stable_softmax(no_keepdim), "without keepdim=True", "raised RuntimeError",
                 "`e = torch.exp(x - x.amax(dim=-1))")

    def crashes(x):
        return torch.exp(x) / x.sum(dim=7)
    assert_names(check_stable_softmax(crashes), "raised IndexError", "`return torch.exp(x) / x.sum(dim=7)`")
    assert_names(check_stable_softmax(lambda x: x.tolist()), "should be a torch.Tensor", "got a list of")
    assert_names(check_stable_softmax("softmax"), "expected a function")


# --- attention with einsum, (B, T, H, Dh) layout -------------------------------------------------

def einsum_attention(q, k, v, scale=None, softmax_dim=-1):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale  # (B, H, T, S)
    weights = torch.softmax(scores, dim=softmax_dim)
    return torch.einsum("bhts,bshd->bthd", weights, v)  # (B, T, H, Dv)


def test_attention_einsum_accepts_a_correct_one():
    assert check_attention_einsum(einsum_attention).passed

    def via_sdpa(q, k, v):  # the reference, reached by transposing to (B, H, T, Dh) and back
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)
    assert check_attention_einsum(via_sdpa).passed


def untransposed(q, k, v):
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
    return (torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1) @ v).transpose(1, 2)


def reshaped(q, k, v):
    B, T, H, Dh = q.shape
    qh, kh, vh = (t.reshape(B, H, t.shape[1], t.shape[3]) for t in (q, k, v))  # the classic bug
    return (torch.softmax(qh @ kh.transpose(-2, -1) / math.sqrt(Dh), -1) @ vh).reshape(B, T, H, -1)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda q, k, v: einsum_attention(q, k, v, scale=1.0), ["no scale"]),
    (lambda q, k, v: einsum_attention(q, k, v, scale=1 / math.sqrt(q.shape[2] * q.shape[3])), ["sqrt(D) = sqrt(H · Dh)"]),
    (lambda q, k, v: einsum_attention(q, k, v, scale=1 / q.shape[-1]), ["divided by Dh instead of sqrt(Dh)"]),
    (lambda q, k, v: einsum_attention(q, k, v, softmax_dim=-2), ["softmax over the query axis"]),
    (untransposed, ["K is not transposed", "raised RuntimeError"]),
    (reshaped, ["heads split with reshape/view instead of transpose"]),
    (lambda q, k, v: torch.softmax(torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1]), -1),
     ["the attention weights (B, H, T, S)"]),
    (lambda q, k, v: einsum_attention(q, k, v).transpose(1, 2), ["in (B, H, T, Dv) layout"]),
    (lambda q, k, v: (einsum_attention(q, k, v), None), ["returned a tuple"]),
])
def test_attention_einsum_names_the_mistake(buggy, phrases):
    assert_names(check_attention_einsum(buggy), *phrases)


def test_attention_einsum_stub_and_crash():
    assert check_attention_einsum(stub).status == "not attempted yet"

    def wrong_letters(q, k, v):
        return torch.einsum("bthd,bthd->bht", q, k)  # T and S are different lengths
    assert_names(check_attention_einsum(wrong_letters), "raised RuntimeError", "`return torch.einsum(")
    assert_names(check_attention_einsum(lambda q, k, v: None), "should be a torch.Tensor", "got None")


# --- one query with loops -----------------------------------------------------------------------

def loop_attention(q, keys, values, stable=True, scale=None, normalize=True):
    scale = 1 / math.sqrt(len(q)) if scale is None else scale
    scores = [sum(qi * ki for qi, ki in zip(q, key)) * scale for key in keys]
    top = max(scores) if stable else 0.0
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights) if normalize else 1.0
    return [sum(w * value[d] for w, value in zip(weights, values)) / total for d in range(len(values[0]))]


def test_one_query_accepts_a_correct_one():
    assert check_one_query_attention(loop_attention).passed
    as_tensor = lambda q, k, v: torch.tensor(loop_attention(q, k, v))  # noqa: E731 - a tensor is fine too
    assert check_one_query_attention(as_tensor).passed


def naive_tensor_loop(q, keys, values):
    e = torch.exp(torch.tensor(keys) @ torch.tensor(q) / math.sqrt(len(q)))  # float32: exp(1732) = inf
    return (e / e.sum()) @ torch.tensor(values)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda q, k, v: loop_attention(q, k, v, stable=False), ["raised OverflowError", "subtract the row's largest"]),
    (lambda q, k, v: loop_attention(q, k, v, scale=1.0), ["no scale"]),
    (lambda q, k, v: loop_attention(q, k, v, scale=math.sqrt(len(q))), ["multiplied by sqrt(Dh)"]),
    (lambda q, k, v: loop_attention(q, k, v, normalize=False), ["no normalization", "exp(s_j - max)"]),
    (lambda q, k, v: torch.softmax(torch.tensor(k) @ torch.tensor(q) / math.sqrt(len(q)), 0).tolist(),
     ["the 4 weights, not the weighted sum"]),
    (naive_tensor_loop, ["contains NaN", "overflowing"]),
])
def test_one_query_names_the_mistake(buggy, phrases):
    assert_names(check_one_query_attention(buggy), *phrases)


def test_one_query_stub_and_crash():
    assert check_one_query_attention(stub).status == "not attempted yet"

    def divides_by_zero(q, keys, values):
        return [x / 0 for x in q]
    assert_names(check_one_query_attention(divides_by_zero), "raised ZeroDivisionError", "return [x / 0 for x in q]")
    assert_names(check_one_query_attention(lambda q, k, v: "output"), "should be a list of numbers, got str")


# --- issue 20's gaps: wide rows, the first score, the head axis, uniform rows, half precision, max(dim) -----

def shift_by_min(x):
    e = torch.exp(x - x.amin(dim=-1, keepdim=True))  # fine while a row spans less than ~88
    return e / e.sum(dim=-1, keepdim=True)


def shift_by_first(q, keys, values):
    scores = [sum(qi * ki for qi, ki in zip(q, key)) / math.sqrt(len(q)) for key in keys]
    weights = [math.exp(s - scores[0]) for s in scores]  # the first score, not the largest
    return [sum(w * value[d] for w, value in zip(weights, values)) / sum(weights) for d in range(len(values[0]))]


def large_negative_fill(x):
    return torch.softmax(x.clamp(min=-1e9), dim=-1)  # an all -inf row becomes uniform


def max_as_tensor(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True))  # a (values, indices) pair, not a tensor
    return e / e.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("check, buggy, phrases", [
    (check_stable_softmax, shift_by_min, ["contains NaN", "smallest score subtracted instead of its largest"]),
    (check_stable_softmax, large_negative_fill, ["uniform row", "return zeros"]),
    (check_stable_softmax, lambda x: good_softmax(x).half(), ["torch.float16", "half precision"]),
    (check_stable_softmax, max_as_tensor, ["raised TypeError", "return a pair (values, indices)", ".values"]),
    (check_one_query_attention, shift_by_first, ["raised OverflowError", "not the first one"]),
    (check_attention_einsum, lambda q, k, v: einsum_attention(q, k, v, scale=1 / math.sqrt(q.shape[2])),
     ["divided by sqrt(H), the number of heads"]),
    (check_attention_einsum, lambda q, k, v: torch.einsum(
        "bhts,bshd->bthd", torch.softmax(torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1]), 1), v),
     ["softmax over the head axis"]),
])
def test_issue_20_mistakes_are_named(check, buggy, phrases):
    assert_names(check(buggy), *phrases)


def test_a_row_spanning_120_is_checked_and_a_correct_answer_still_passes():
    assert check_stable_softmax(good_softmax).passed
    x = torch.tensor([[-60.0, 0.0, 60.0]])
    assert torch.isnan(shift_by_min(x)).any() and not torch.isnan(good_softmax(x)).any()
