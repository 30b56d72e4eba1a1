"""Chapter 4's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from exercise_helpers import assert_names, stub

from attnlib.exercises import check_fused_qkv, check_merge_heads, check_mha_param_count, check_split_heads


# --- split heads ---------------------------------------------------------------------------------

def good_split(x, num_heads):
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)  # (B, H, T, Dh)


def test_split_heads_accepts_correct_ones():
    assert check_split_heads(good_split).passed
    assert check_split_heads(lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), ["without the transpose", "cuts the sequence"]),
    (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2), ["interleaved heads"]),
    (lambda x, h: x.view(*x.shape[:2], h, -1), ["(B, T, H, Dh)", "not moved before time"]),
    (lambda x, h: x.view(*x.shape[:2], h, -1).permute(0, 2, 3, 1), ["(B, H, Dh, T)", "wrong axes"]),
    (lambda x, h: good_split(x, h) * 2, ["matches none of the usual mistakes"]),
])
def test_split_heads_names_the_mistake(buggy, phrases):
    assert_names(check_split_heads(buggy), *phrases)


def test_split_heads_stub_and_crash():
    assert check_split_heads(stub).status == "not attempted yet"

    def crashes(x, num_heads):
        return x.view(x.shape[0], x.shape[1], num_heads, 7)
    assert_names(check_split_heads(crashes), "raised RuntimeError", "`return x.view(x.shape[0]")
    assert_names(check_split_heads(lambda x, h: None), "should be a torch.Tensor, got NoneType")


# --- merge heads ---------------------------------------------------------------------------------

def good_merge(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)


def test_merge_heads_accepts_correct_ones():
    assert check_merge_heads(good_merge).passed
    assert check_merge_heads(lambda x: torch.cat(x.unbind(1), dim=-1)).passed
    assert check_merge_heads(lambda x: x.transpose(1, 2).contiguous().view(x.shape[0], x.shape[2], -1)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), ["the classic bug", "without transposing"]),
    (lambda x: x.transpose(2, 3).reshape(x.shape[0], x.shape[2], -1), ["wrong axes transposed"]),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), ["interleaved heads"]),
    (lambda x: x.transpose(1, 2), ["not flattened"]),
])
def test_merge_heads_names_the_mistake(buggy, phrases):
    assert_names(check_merge_heads(buggy), *phrases)


def test_merge_heads_stub_crash_and_view_after_transpose():
    assert check_merge_heads(stub).status == "not attempted yet"

    def view_after_transpose(x):
        return x.transpose(1, 2).view(x.shape[0], x.shape[2], -1)
    assert_names(check_merge_heads(view_after_transpose), "raised RuntimeError", "use reshape()")

    def crashes(x):
        return x.flatten(7)
    assert_names(check_merge_heads(crashes), "raised IndexError", "`return x.flatten(7)`")


# --- count the parameters ------------------------------------------------------------------------

def good_count(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * (d_model // num_heads)
    weights = d_model * (d_model + 2 * kv) + d_model * d_model   # W_q, W_k, W_v; W_o
    return weights + (bias and (d_model + 2 * kv) + d_model)     # their biases


def test_param_count_accepts_correct_ones():
    assert check_mha_param_count(good_count).passed
    assert check_mha_param_count(lambda *a: torch.tensor(good_count(*a))).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda d, h, kv, bias: 4 * d * d, ["biases are missing"]),
    (lambda d, h, kv, bias: 4 * d * d + bias * 4 * d, ["K and V counted as D x D each"]),
    (lambda d, h, kv, bias: good_count(d, h, kv, bias) - d * d - bias * d, ["output projection W_o"]),
    (lambda d, h, kv, bias: good_count(d, 1, kv, bias),  # Dh taken as D
     ["D x (H_kv·D) instead of D x (H_kv·Dh)"]),
    (lambda d, h, kv, bias: 4 * d * d + 1, ["returned", "matches none of the usual mistakes"]),
])
def test_param_count_names_the_mistake(buggy, phrases):
    assert_names(check_mha_param_count(buggy), *phrases)


def test_param_count_stub_crash_and_wrong_type():
    assert check_mha_param_count(stub).status == "not attempted yet"
    assert_names(check_mha_param_count(lambda d, h, kv, bias: d / 0), "raised ZeroDivisionError")
    assert_names(check_mha_param_count(lambda *a: "a lot"), "should return a whole number, got 'a lot'")
    assert_names(check_mha_param_count(lambda *a: good_count(*a) + 0.5), "should return a whole number")


# --- fused QKV projection ------------------------------------------------------------------------

def good_fused(x, weight, bias, num_heads):
    B, T, D = x.shape
    q, k, v = (x @ weight.T + bias).split(D, dim=-1)                      # (B, T, D) each
    return tuple(t.view(B, T, num_heads, D // num_heads).transpose(1, 2) for t in (q, k, v))


def test_fused_qkv_accepts_correct_ones():
    assert check_fused_qkv(good_fused).passed

    def via_five_d(x, weight, bias, num_heads):
        B, T, D = x.shape
        qkv = torch.nn.functional.linear(x, weight, bias).view(B, T, 3, num_heads, D // num_heads)
        return tuple(qkv.permute(2, 0, 3, 1, 4))                          # 3 x (B, H, T, Dh)
    assert check_fused_qkv(via_five_d).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, w, b, h: good_fused(x, w, torch.zeros_like(b), h), ["the bias is missing"]),
    (lambda x, w, b, h: tuple(torch.nn.functional.linear(x, w, b).view(*x.shape[:2], h, 3, -1).permute(3, 0, 2, 1, 4)),
     ["interleaved layout"]),
    (lambda x, w, b, h: tuple(t.reshape(x.shape[0], h, x.shape[1], -1) for t in (x @ w.T + b).split(x.shape[-1], -1)),
     ["without the transpose"]),
    (lambda x, w, b, h: good_fused(x, w, b, h)[::-1], ["wrong order (as v, k, q)"]),
    (lambda x, w, b, h: tuple(t.transpose(1, 2) for t in good_fused(x, w, b, h)), ["(B, T, H, Dh)", "not moved"]),
    (lambda x, w, b, h: good_fused(x, w, b, h)[:2], ["three tensors (q, k, v), got tuple"]),
])
def test_fused_qkv_names_the_mistake(buggy, phrases):
    assert_names(check_fused_qkv(buggy), *phrases)


def test_fused_qkv_stub_and_crash():
    assert check_fused_qkv(stub).status == "not attempted yet"

    def untransposed(x, weight, bias, num_heads):
        return x @ weight + bias                                          # (B, T, D) @ (3D, D): no
    assert_names(check_fused_qkv(untransposed), "raised RuntimeError", "`return x @ weight + bias")
