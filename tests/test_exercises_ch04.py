"""Chapter 4's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import pytest
import torch

from exercise_helpers import assert_names, stub

from attnlib.exercises import check_fused_qkv, check_merge_heads, check_mha_param_count, check_split_heads


# --- split heads ---------------------------------------------------------------------------------

def good_split(x, num_heads):
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)  # (B, H, T, Dh)


@pytest.mark.parametrize("split", [
    good_split,
    lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),                       # one head at a time
    lambda x, h: x.unflatten(-1, (h, -1)).permute(0, 2, 1, 3),                 # unflatten + permute
    lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).swapaxes(1, 2).contiguous(),
    lambda x, h: torch.einsum("bthd->bhtd", x.view(*x.shape[:2], h, -1)),
    lambda x, h: good_split(x.double(), h),                                    # a wider dtype is fine
])
def test_split_heads_accepts_correct_ones(split):
    assert check_split_heads(split).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), ["without the transpose", "cuts the sequence"]),
    (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2), ["interleaved heads"]),
    (lambda x, h: x.view(*x.shape[:2], h, -1), ["(B, T, H, Dh)", "not moved before time"]),
    (lambda x, h: x.view(*x.shape[:2], h, -1).permute(0, 2, 3, 1), ["(B, H, Dh, T)", "wrong axes"]),
    (lambda x, h: good_split(x, h) * 2, ["it is the expected result times 2"]),
    (lambda x, h: good_split(x, h).reshape(-1, x.shape[1], x.shape[2] // h), ["(B·H, T, Dh)", "folded into the batch"]),
    (lambda x, h: good_split(x, h)[:, :, :1], ["has shape (2, 3, 1, 4), expected (B, H, T, Dh) = (2, 3, 5, 4)"]),
    (lambda x, h: x.view(x.shape[0] * h, x.shape[1], -1), ["has shape (6, 5, 4), expected (B, H, T, Dh)"]),
    (lambda x, h: good_split(x, h).half(), ["torch.float16", "half precision"]),
    (lambda x, h: good_split(x, h).to(torch.bfloat16), ["torch.bfloat16"]),
])
def test_split_heads_names_the_mistake(buggy, phrases):
    assert_names(check_split_heads(buggy), *phrases)


def test_split_heads_stub_and_crash():
    assert check_split_heads(stub).status == "not attempted yet"

    def crashes(x, num_heads):
        return x.view(x.shape[0], x.shape[1], num_heads, 7)
    assert_names(check_split_heads(crashes), "raised RuntimeError", "`return x.view(x.shape[0]")
    assert_names(check_split_heads(lambda x, h: None), "should be a torch.Tensor", "got None")


# --- merge heads ---------------------------------------------------------------------------------

def good_merge(x):
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)


@pytest.mark.parametrize("merge", [
    good_merge,
    lambda x: torch.cat(x.unbind(1), dim=-1),                                   # heads side by side
    lambda x: x.transpose(1, 2).contiguous().view(x.shape[0], x.shape[2], -1),
    lambda x: x.permute(0, 2, 1, 3).flatten(2),                                # permute + flatten
    lambda x: torch.einsum("bhtd->bthd", x).reshape(x.shape[0], x.shape[2], -1),
])
def test_merge_heads_accepts_correct_ones(merge):
    assert check_merge_heads(merge).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), ["the classic bug", "without transposing"]),
    (lambda x: x.transpose(2, 3).reshape(x.shape[0], x.shape[2], -1), ["wrong axes transposed"]),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), ["interleaved heads"]),
    (lambda x: x.transpose(1, 2), ["not flattened"]),
    (lambda x: x.transpose(1, 2).reshape(x.shape[0], -1), ["has shape (2, 60), expected (B, T, H·Dh) = (2, 5, 12)"]),
    (lambda x: x.sum(1), ["has shape (2, 5, 4), expected (B, T, H·Dh)"]),      # broadcast against (B, T, D) before
    (lambda x: good_merge(x).half(), ["torch.float16"]),
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


def via_five_d(x, weight, bias, num_heads):
    B, T, D = x.shape
    qkv = torch.nn.functional.linear(x, weight, bias).view(B, T, 3, num_heads, D // num_heads)
    return qkv.permute(2, 0, 3, 1, 4)                                     # (3, B, H, T, Dh), stacked


@pytest.mark.parametrize("fused", [
    good_fused,
    via_five_d,                                                            # one stacked (3, B, H, T, Dh) tensor
    lambda x, w, b, h: tuple(via_five_d(x, w, b, h)),
    lambda x, w, b, h: list(good_fused(x, w, b, h)),
    lambda x, w, b, h: (t.unflatten(-1, (h, -1)).transpose(1, 2)          # a generator
                        for t in (torch.einsum("btd,ed->bte", x, w) + b).chunk(3, dim=-1)),
    lambda x, w, b, h: [torch.nn.functional.linear(x, wi, bi).unflatten(-1, (h, -1)).transpose(1, 2)
                        for wi, bi in zip(w.chunk(3), b.chunk(3))],        # three products: values still right
])
def test_fused_qkv_accepts_correct_ones(fused):
    result = check_fused_qkv(fused)
    assert result.passed
    assert "one matmul" not in result.message


def test_fused_qkv_names_more_than_one_product():
    three = check_fused_qkv(lambda x, w, b, h: [torch.nn.functional.linear(x, wi, bi).unflatten(-1, (h, -1))
                                                .transpose(1, 2) for wi, bi in zip(w.chunk(3), b.chunk(3))])
    assert three.passed and "from 3 matrix products" in three.message
    for one in (good_fused, via_five_d):
        assert "matrix products" not in check_fused_qkv(one).message


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, w, b, h: good_fused(x, w, torch.zeros_like(b), h), ["the bias is missing"]),
    (lambda x, w, b, h: tuple(torch.nn.functional.linear(x, w, b).view(*x.shape[:2], h, 3, -1).permute(3, 0, 2, 1, 4)),
     ["interleaved layout"]),
    (lambda x, w, b, h: tuple(t.reshape(x.shape[0], h, x.shape[1], -1) for t in (x @ w.T + b).split(x.shape[-1], -1)),
     ["without the transpose"]),
    (lambda x, w, b, h: good_fused(x, w, b, h)[::-1], ["wrong order (as v, k, q)"]),
    (lambda x, w, b, h: tuple(t.transpose(1, 2) for t in good_fused(x, w, b, h)), ["(B, T, H, Dh)", "not moved"]),
    (lambda x, w, b, h: good_fused(x, w, b, h)[:2], ["three torch.Tensors (q, k, v), got a tuple of 2 items"]),
    (lambda x, w, b, h: x @ w.T + b, ["three torch.Tensors (q, k, v), got a torch.Tensor of shape (2, 5, 36)"]),
    (lambda x, w, b, h: {"q": 1, "k": 2, "v": 3}, ["three torch.Tensors (q, k, v), got a dict"]),
    (lambda x, w, b, h: good_fused(x, w.reshape(w.shape[1], -1).T, b, h), ["reshaped to (D, 3D) instead of transposed"]),
    (lambda x, w, b, h: tuple(t.half() for t in good_fused(x, w, b, h)), ["q returned torch.float16"]),
    (lambda x, w, b, h: (t / 0 if False else 1 / 0 for t in range(3)), ["raised ZeroDivisionError"]),  # generator
])
def test_fused_qkv_names_the_mistake(buggy, phrases):
    assert_names(check_fused_qkv(buggy), *phrases)


def test_fused_qkv_stub_and_crash():
    assert check_fused_qkv(stub).status == "not attempted yet"

    def untransposed(x, weight, bias, num_heads):
        return x @ weight + bias                                          # (B, T, D) @ (3D, D): no
    assert_names(check_fused_qkv(untransposed), "raised RuntimeError", "`return x @ weight + bias",
                 "x @ weight without the transpose", "weight.T")

    def einsum_untransposed(x, weight, bias, num_heads):
        return torch.einsum("btd,de->bte", x, weight)                     # the same mistake in einsum
    assert_names(check_fused_qkv(einsum_untransposed), "raised RuntimeError", "without the transpose")


# --- answers in other styles, and the bugs they bring (adversarial review, adv49) ----------------

def nanogpt_c_attn(x, weight, bias, *, n_head):                           # keyword-only head count
    B, T, C = x.size()
    q, k, v = torch.nn.functional.linear(x, weight, bias).split(C, dim=2)
    return tuple(t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))


class FusedModule(torch.nn.Module):                                        # a module whose forward is the answer
    def forward(self, x, in_proj_weight, in_proj_bias, num_heads):
        q, k, v = torch.nn.functional._in_projection_packed(x, x, x, in_proj_weight, in_proj_bias)  # torch's own
        return [t.unflatten(-1, (num_heads, -1)).transpose(1, 2) for t in (q, k, v)]


@pytest.mark.parametrize("fused", [nanogpt_c_attn, FusedModule()])
def test_fused_qkv_accepts_other_styles(fused):
    result = check_fused_qkv(fused)
    assert result.passed, result
    assert "matrix products" not in result.message


def test_split_heads_names_transpose_then_reshape():
    assert_names(check_split_heads(lambda x, h: x.transpose(1, 2).reshape(x.shape[0], h, x.shape[1], -1)),
                 "transpose(1, 2) first, then a reshape")


def _split(y, h):                                                         # (B, T, D) -> (B, H, T, Dh), right
    return y.view(*y.shape[:2], h, -1).transpose(1, 2)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda x, w, b, h: tuple(t.transpose(1, 2).reshape(x.shape[0], h, x.shape[1], -1)
                              for t in (x @ w.T + b).split(x.shape[-1], -1)), ["split with transpose(1, 2) then reshape"]),
    (lambda x, w, b, h: tuple(_split((x @ w.T + b).view(*x.shape, 3)[..., i], h) for i in range(3)),
     ["every third feature", "(B, T, D, 3)"]),
    (lambda x, w, b, h: tuple(_split(x @ wi + bi, h) for wi, bi in zip(w.chunk(3), b.chunk(3))),
     ["used without its transpose"]),
    (lambda x, w, b, h: (lambda q, k, v: (q * q.shape[-1] ** -0.5, k, v))(*good_fused(x, w, b, h)),
     ["q already multiplied by 1/sqrt(Dh)"]),
    (lambda x, w, b, h: tuple(t.numpy() for t in good_fused(x, w, b, h)), ["got a tuple of 3 items (a numpy.ndarray of shape (2, 3, 5, 4)"]),
])
def test_fused_qkv_names_more_mistakes(buggy, phrases):
    assert_names(check_fused_qkv(buggy), *phrases)


def test_fused_qkv_passes_when_only_the_counted_run_fails():
    calls = []

    def right_once(x, weight, bias, num_heads):  # right with 3 heads and with 2; the third, counted run stops early
        calls.append(1)
        if len(calls) > 2:
            raise NotImplementedError("a stub path left in")
        return good_fused(x, weight, bias, num_heads)
    assert check_fused_qkv(right_once).passed
