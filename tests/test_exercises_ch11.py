"""Chapter 11's checkers: correct answers in several styles pass, each classic mistake is named, stubs and
crashes are handled."""

import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import check_decoder_block, check_memory_kv, check_shift_right
from attnlib.head_layout import split_heads
from exercise_helpers import assert_names, stub


# --- teacher forcing's shift ---------------------------------------------------------------------

def shift_hf_style(tgt, bos):  # transformers' shift_tokens_right
    shifted = tgt.new_zeros(tgt.shape)
    shifted[:, 1:] = tgt[:, :-1].clone()
    shifted[:, 0] = bos
    return shifted


def shift_roll_then_fix(tgt, bos):
    out = tgt.roll(1, dims=-1)
    out[..., 0] = bos
    return out


@pytest.mark.parametrize("answer", [
    lambda t, bos: torch.cat([torch.full_like(t[:, :1], bos), t[:, :-1]], dim=1),
    lambda t, bos: F.pad(t, (1, 0), value=bos)[:, :-1],
    shift_hf_style,
    shift_roll_then_fix,
    lambda t, bos: torch.tensor([[bos] + row[:-1] for row in t.tolist()]),
])
def test_shift_right_accepts_correct_answers(answer):
    assert check_shift_right(answer).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda t, bos: t, ["no shift", "the very token it must predict"]),
    (lambda t, bos: torch.cat([torch.full_like(t[:, :1], bos), t], 1), ["last target kept: T + 1 positions"]),
    (lambda t, bos: t[:, 1:], ["shifted left (tgt[:, 1:])"]),
    (lambda t, bos: torch.cat([torch.full_like(t[:, :1], bos), t[:, 1:]], 1),
     ["first target dropped instead of the last"]),
    (lambda t, bos: t.roll(1, dims=1), ["torch.roll", "where BOS belongs"]),
    (lambda t, bos: torch.cat([t[:, 1:], torch.full_like(t[:, :1], bos)], 1), ["BOS at the end"]),
    (lambda t, bos: torch.cat([torch.full_like(t[:1], bos), t[:-1]], 0), ["batch axis (dim=0)"]),
    (lambda t, bos: F.pad(t, (1, 0), value=bos)[:, :-1].float(), ["torch.float32", "must be integers"]),
    (lambda t, bos: F.pad(t, (1, 0), value=0)[:, :-1], ["position 0 holds 0, not bos = 1", "bos argument is ignored"]),
    (lambda t, bos: torch.cat([torch.full_like(t[:, :2], bos), t[:, :-2]], 1), ["a shift by two positions"]),
    (lambda t, bos: F.pad(t, (1, 0), value=bos)[:, :-1] * (torch.arange(6) != 3), ["position 3 is not", "max abs"]),
])
def test_shift_right_names_the_mistake(buggy, phrases):
    assert_names(check_shift_right(buggy), *phrases)


def test_shift_right_stub_and_crash():
    assert check_shift_right(stub).status == "not attempted yet"
    assert_names(check_shift_right(lambda t, bos: torch.cat([bos, t[:, :-1]], 1)), "raised TypeError")
    assert_names(check_shift_right(lambda t, bos: t.tolist()), "should be a torch.Tensor", "got a list of")


# --- the order inside a decoder block -------------------------------------------------------------

def block_plain(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm2(h + cross_attn(h, memory))
    return norm3(h + ffn(h))


def block_loop(x, memory, self_attn, cross_attn, ffn, *norms):
    sublayers = (self_attn, lambda z: cross_attn(z, memory), ffn)
    for norm, sublayer in zip(norms, sublayers):
        x = norm(x + sublayer(x))
    return x


class SublayerConnection:  # the Annotated Transformer's residual: pre-LN, x + sublayer(norm(x))
    def __init__(self, norm):
        self.norm = norm

    def __call__(self, x, sublayer):
        return x + sublayer(self.norm(x))


def block_annotated(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    x = SublayerConnection(norm1)(x, self_attn)
    x = SublayerConnection(norm2)(x, lambda z: cross_attn(z, memory))
    return SublayerConnection(norm3)(x, ffn)


@pytest.mark.parametrize("answer", [block_plain, block_loop])
def test_decoder_block_accepts_correct_answers(answer):
    assert check_decoder_block(answer).passed


def cross_first(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + cross_attn(x, memory))
    h = norm2(h + self_attn(h))
    return norm3(h + ffn(h))


def norm_inside(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = x + norm1(self_attn(x))
    h = h + norm2(cross_attn(h, memory))
    return h + norm3(ffn(h))


def no_ffn_residual(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm2(norm1(x + self_attn(x)) + cross_attn(norm1(x + self_attn(x)), memory))
    return norm3(ffn(h))


def cross_on_itself(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm2(h + cross_attn(h, h))
    return norm3(h + ffn(h))


def memory_asks(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm2(h + cross_attn(memory, h))
    return norm3(h + ffn(h))


def ffn_before_cross(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm2(h + ffn(h))
    return norm3(h + cross_attn(h, memory))


def norm1_three_times(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm1(h + cross_attn(h, memory))
    return norm1(h + ffn(h))


def cross_on_block_input(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x))
    h = norm2(h + cross_attn(x, memory))
    return norm3(h + ffn(h))


def norms_reversed(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    return block_plain(x, memory, self_attn, cross_attn, ffn, norm3, norm2, norm1)


@pytest.mark.parametrize("buggy, phrases", [
    (cross_first, ["cross-attention before self-attention"]),
    (block_annotated, ["pre-LN", "LN(x + f(x))"]),
    (norm_inside, ["the norm inside the residual"]),
    (no_ffn_residual, ["no residual around the FFN"]),
    (cross_on_itself, ["cross_attn(h, h)", "come from the memory"]),
    (memory_asks, ["raised ValueError", "roles swapped", "cross_attn(h, memory)"]),
    (norms_reversed, ["norms in the wrong places"]),
    (ffn_before_cross, ["the sublayers in the order self-attention, the FFN, cross-attention"]),
    (norm1_three_times, ["norm1 after every sublayer"]),
    (cross_on_block_input, ["cross-attention's queries taken from the block's input x"]),
    (lambda x, m, sa, ca, ffn, n1, n2, n3: n3(ffn(n2(ca(n1(sa(x)), m)))), ["no residuals at all"]),
    (lambda x, m, sa, ca, ffn, n1, n2, n3: n3(ffn(ca(sa(x), m))), ["is wrong: max abs difference"]),
    (lambda x, m, sa, ca, ffn, n1, n2, n3: x[:, :-1], ["has shape (2, 4, 16), expected (2, 5, 16)"]),
])
def test_decoder_block_names_the_mistake(buggy, phrases):
    assert_names(check_decoder_block(buggy), *phrases)


def test_decoder_block_stub_and_crash():
    assert check_decoder_block(stub).status == "not attempted yet"
    assert_names(check_decoder_block(lambda x, m, sa, ca, ffn, n1, n2, n3: sa(x, m)), "raised TypeError")


# --- the cross-attention keys and values, once per source ---------------------------------------

def kv_sliced(attn, memory):
    D, H = attn.d_model, attn.num_heads
    B, S, _ = memory.shape
    w_k, w_v = attn.qkv.weight[D:2 * D], attn.qkv.weight[2 * D:]
    b_k, b_v = attn.qkv.bias[D:2 * D], attn.qkv.bias[2 * D:]
    k = (memory @ w_k.T + b_k).view(B, S, H, D // H).transpose(1, 2)
    v = (memory @ w_v.T + b_v).view(B, S, H, D // H).transpose(1, 2)
    return k, v


def kv_full_projection(attn, memory):
    _, k, v = attn.qkv(memory).chunk(3, dim=-1)       # the query part is thrown away
    return split_heads(k, attn.num_heads), split_heads(v, attn.num_heads)


def kv_einsum(attn, memory):
    D, H = attn.d_model, attn.num_heads
    w = attn.qkv.weight.view(3, H, D // H, D)         # (qkv, H, Dh, D)
    b = attn.qkv.bias.view(3, H, 1, D // H)
    kv = torch.einsum("bsd,nhed->nbhse", memory, w[1:]) + b[1:, None]
    return kv[0], kv[1]


@pytest.mark.parametrize("answer", [kv_sliced, kv_full_projection, kv_einsum])
def test_memory_kv_accepts_correct_answers(answer):
    assert check_memory_kv(answer).passed


def kv_query_rows(attn, memory):
    D = attn.d_model
    k = F.linear(memory, attn.qkv.weight[:D], attn.qkv.bias[:D])
    return split_heads(k, attn.num_heads), kv_sliced(attn, memory)[1]


def kv_no_bias(attn, memory):
    D = attn.d_model
    k, v = F.linear(memory, attn.qkv.weight[D:]).chunk(2, dim=-1)
    return split_heads(k, attn.num_heads), split_heads(v, attn.num_heads)


def kv_no_transpose(attn, memory):
    _, k, v = attn.qkv(memory).chunk(3, dim=-1)
    B, S, D = k.shape
    return k.reshape(B, attn.num_heads, S, -1), v.reshape(B, attn.num_heads, S, -1)


def kv_strided(attn, memory):
    _, k, v = attn.qkv(memory).chunk(3, dim=-1)
    B, S, D = k.shape
    return tuple(t.view(B, S, -1, attn.num_heads).permute(0, 3, 1, 2) for t in (k, v))


@pytest.mark.parametrize("buggy, phrases", [
    (lambda a, m: kv_sliced(a, m)[::-1], ["keys and values swapped"]),
    (kv_query_rows, ["the query rows 0..D", "[W_q; W_k; W_v]"]),
    (kv_no_bias, ["the bias left out"]),
    (kv_no_transpose, ["without a transpose"]),
    (lambda a, m: a.qkv(m).chunk(3, dim=-1)[1:], ["heads not split"]),
    (lambda a, m: tuple(t.transpose(1, 2) for t in kv_sliced(a, m)), ["left after the sequence axis"]),
    (lambda a, m: kv_sliced(a, m)[0], ["should return a pair (k, v), got Tensor"]),
    (lambda a, m: (kv_sliced(a, m)[0] / (a.d_model // a.num_heads) ** 0.5, kv_sliced(a, m)[1]),
     ["k divided by sqrt(d_k)"]),
    (kv_strided, ["heads split as view(B, S, Dh, H)"]),
    (lambda a, m: (kv_sliced(a, m)[0], kv_sliced(a, m)[1] * 2), ["v is wrong: it is the expected result times 2"]),
])
def test_memory_kv_names_the_mistake(buggy, phrases):
    assert_names(check_memory_kv(buggy), *phrases)


def test_memory_kv_stub_and_crash():
    assert check_memory_kv(stub).status == "not attempted yet"
    assert_names(check_memory_kv(lambda a, m: a.wk(m)), "raised AttributeError")


# --- issue 36: the first held-out set's unnamed mistakes ------------------------------------------

@pytest.mark.parametrize("buggy, phrases", [
    (lambda tgt, bos: torch.cat([torch.ones_like(tgt[:, :1]), tgt[:, :-1]], 1),
     ["bos=0", "position 0 holds 1, not bos = 0", "hard-coded"]),
    (lambda tgt, bos: torch.cat([tgt[:, 1:], torch.full_like(tgt[:, :1], -100)], 1),
     ["the targets shifted left", "[-100] at the end", "labels"]),
])
def test_shift_right_names_more_mistakes(buggy, phrases):
    assert_names(check_shift_right(buggy), *phrases)


def _block(self_mask=None, residual_from_x=False, norm3_twice=False):
    def block(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
        T = x.shape[1]
        h = norm1(x + (self_attn(x) if self_mask is None else self_attn(x, self_mask(T))))
        h = norm2((x if residual_from_x else h) + cross_attn(h, memory))
        out = norm3((x if residual_from_x else h) + ffn(h))
        return norm3(out) if norm3_twice else out
    return block


@pytest.mark.parametrize("answer", [_block(lambda T: torch.ones(T, T, dtype=torch.bool).tril()),
                                    _block(lambda T: torch.zeros(T, T).masked_fill(
                                        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).double())])
def test_decoder_block_accepts_a_causal_mask_passed_to_self_attn(answer):
    result = check_decoder_block(answer)
    assert result.passed, result.message


@pytest.mark.parametrize("buggy, phrases", [
    (_block(residual_from_x=True), ["the block's input x added back in every residual"]),
    (_block(norm3_twice=True), ["norm3 applied twice"]),
    (_block(lambda T: torch.tril(torch.ones(T, T))), ["torch.float32 mask of 0s and 1s", "*added* to the scores",
                                                       "is bool, True = may attend"]),
])
def test_decoder_block_names_more_mistakes(buggy, phrases):
    assert_names(check_decoder_block(buggy), *phrases)


def _kv_with(project):
    def memory_kv(attn, memory):
        D = memory.shape[-1]
        w, b = attn.qkv.weight, attn.qkv.bias
        k, v = project(attn, memory, w[D:2 * D], b[D:2 * D]), project(attn, memory, w[2 * D:], b[2 * D:], True)
        return split_heads(k, 4), split_heads(v, 4)
    return memory_kv


@pytest.mark.parametrize("buggy, phrase", [
    (_kv_with(lambda attn, m, w, b, is_v=False: m @ w + b), "memory @ W without the transpose"),
    (_kv_with(lambda attn, m, w, b, is_v=False: attn.out(m) if is_v else F.linear(m, w, b)),
     "attn.out, the output projection W_o, used"),
])
def test_memory_kv_names_more_mistakes(buggy, phrase):
    assert_names(check_memory_kv(buggy), phrase)


def _block_pre_ln_final_norm3(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    x = x + self_attn(norm1(x))
    x = x + cross_attn(norm2(x), memory)
    return norm3(x + ffn(norm3(x)))


def _block_ffn_residual_from_h1(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h1 = norm1(x + self_attn(x))
    h2 = norm2(h1 + cross_attn(h1, memory))
    return norm3(h1 + ffn(h2))


def _kv_no_transpose_no_bias(attn, memory):
    D, w = memory.shape[-1], attn.qkv.weight
    return split_heads(memory @ w[D:2 * D], 4), split_heads(memory @ w[2 * D:], 4)


@pytest.mark.parametrize("check, buggy, phrase", [                    # issue 36, held-out set 3
    (check_decoder_block, _block_pre_ln_final_norm3, "with norm3 applied once more at the end"),
    (check_decoder_block, _block_ffn_residual_from_h1, "the residual around the FFN adds h1"),
    (check_memory_kv, _kv_no_transpose_no_bias, "without the transpose, and the bias left out"),
])
def test_chapter_11_names_held_out_styles(check, buggy, phrase):
    assert_names(check(buggy), phrase)
