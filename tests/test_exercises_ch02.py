"""Chapter 2's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import math

import pytest
import torch

from attnlib.exercises import check_attention_entropy, check_scaled_scores, check_xavier_std
from exercise_helpers import assert_names, stub


# --- scaled scores ------------------------------------------------------------------------------

def test_scaled_scores_accepts_a_correct_one():
    assert check_scaled_scores(lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).passed
    assert check_scaled_scores(lambda q, k: torch.einsum("bhtd,bhsd->bhts", q, k) * q.shape[-1] ** -0.5).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda q, k: q @ k.transpose(-2, -1), ["no scale"]),
    (lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], ["divided by Dh instead of sqrt(Dh)"]),
    (lambda q, k: q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1]), ["multiplied by sqrt(Dh)"]),
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[1] * q.shape[-1]), ["sqrt(D) = sqrt(H · Dh)"]),
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2]), ["sqrt(S), the number of keys"]),
    (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.shape[-2]), ["sqrt(T), the number of queries"]),
    (lambda q, k: q @ k / math.sqrt(q.shape[-1]), ["K is not transposed", "raised RuntimeError"]),
    (lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), ["keys × queries"]),
    (lambda q, k: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1), ["softmax already applied"]),
])
def test_scaled_scores_names_the_mistake(buggy, phrases):
    assert_names(check_scaled_scores(buggy), *phrases)


def test_scaled_scores_stub_and_crash():
    assert check_scaled_scores(stub).status == "not attempted yet"

    def crashes(q, k):
        return q @ key.transpose(-2, -1) / math.sqrt(q.shape[-1])  # noqa: F821 - the reader's typo
    assert_names(check_scaled_scores(crashes), "raised NameError", "`return q @ key.transpose(-2, -1)")
    assert_names(check_scaled_scores(lambda q, k: 1.0), "should be a torch.Tensor", "got a float")


# --- entropy of attention rows ------------------------------------------------------------------

def entropy(weights):
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def test_entropy_accepts_a_correct_one():
    assert check_attention_entropy(entropy).passed
    masked_log = lambda w: -(w * torch.where(w > 0, w.log(), 0.0)).sum(-1)  # noqa: E731
    assert check_attention_entropy(masked_log).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda w: -(w * w.log()).sum(-1), ["contains NaN", "0 · log 0"]),
    (lambda w: entropy(w) / math.log(2), ["bits"]),
    (lambda w: -entropy(w), ["wrong sign"]),
    (lambda w: -torch.special.xlogy(w, w).sum(dim=-2), ["over the query axis (dim=-2)"]),
    (lambda w: entropy(w).mean(), ["one number for all rows (a mean)"]),
    (lambda w: -torch.special.xlogy(w, w).mean(-1), ["a mean over the keys instead of a sum"]),
])
def test_entropy_names_the_mistake(buggy, phrases):
    assert_names(check_attention_entropy(buggy), *phrases)


def test_entropy_stub_and_crash():
    assert check_attention_entropy(stub).status == "not attempted yet"

    def crashes(weights):
        return -sum(p * math.log(p) for p in weights)  # math.log of a tensor row
    assert_names(check_attention_entropy(crashes), "raised", "of your code")


# --- Xavier std ---------------------------------------------------------------------------------

def xavier_std(fan_in, fan_out, gain=1.0):
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("fan_in, fan_out, gain", [(64, 256, 1.0), (300, 100, math.sqrt(2.0)), (700, 20, 5 / 3)])
def test_xavier_formula_is_what_torch_draws(fan_in, fan_out, gain):
    """The checker's formula equals the std torch.nn.init.xavier_normal_ samples with (a Linear weight is (out, in))."""
    w = torch.nn.init.xavier_normal_(torch.empty(fan_out, fan_in, dtype=torch.float64), gain=gain,
                                     generator=torch.Generator().manual_seed(0))
    assert w.std().item() == pytest.approx(xavier_std(fan_in, fan_out, gain), rel=0.02)


def test_xavier_accepts_a_correct_one():
    assert check_xavier_std(xavier_std).passed
    assert check_xavier_std(lambda fi, fo, g: torch.tensor(g * (2 / (fi + fo)) ** 0.5)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda fi, fo, g: g * math.sqrt(6 / (fi + fo)), ["xavier_uniform_'s bound"]),
    (lambda fi, fo, g: g / math.sqrt(fi), ["LeCun"]),
    (lambda fi, fo, g: g * math.sqrt(2 / fi), ["Kaiming"]),
    (lambda fi, fo, g: g * 2 / (fi + fo), ["no square root"]),
    (lambda fi, fo, g: math.sqrt(2 / (fi + fo)), ["the gain ignored"]),
    (lambda fi, fo, g: math.sqrt(g * 2 / (fi + fo)), ["the gain inside the square root"]),
    (lambda fi, fo, g: g * math.sqrt(1 / (fi + fo)), ["a missing factor 2"]),
])
def test_xavier_names_the_mistake(buggy, phrases):
    assert_names(check_xavier_std(buggy), *phrases)


def test_xavier_stub_crash_and_wrong_type():
    assert check_xavier_std(stub).status == "not attempted yet"

    def crashes(fan_in, fan_out, gain):
        return gain * math.sqrt(2 / (fan_in - fan_in))
    assert_names(check_xavier_std(crashes), "raised ZeroDivisionError", "`return gain * math.sqrt(")
    assert_names(check_xavier_std(lambda fi, fo, g: [fi, fo]), "should be a number, got list")
    assert_names(check_xavier_std(lambda fi, fo: 1.0), "raised TypeError")


def test_xavier_refuses_a_string_or_a_bool_that_float_would_accept():
    as_text = lambda fi, fo, g: f"{g * math.sqrt(2 / (fi + fo))}"  # noqa: E731 - float() would take it
    assert_names(check_xavier_std(as_text), "should be a number, got str '0.079")
    assert_names(check_xavier_std(lambda fi, fo, g: True), "should be a number, got bool True")
