"""Chapter 14's checkers: correct answers in several styles pass (einsum, loops, transformers-like, nanoGPT-like,
numpy), each classic mistake is named, stubs, bad types and crashes are handled, and no checker raises."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import check_differential_attention, check_output_gate, check_qk_norm, check_sink_softmax
from attnlib.variants import QKNorm, SinkAttention
from exercise_helpers import assert_names, stub

# --- per-head QK-norm ------------------------------------------------------------------------------


def qk_book(q, k, q_weight, k_weight, eps=1e-6):
    r = lambda u, g: u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps) * g  # noqa: E731
    return r(q, q_weight), r(k, k_weight)


def qk_hf(query_states, key_states, q_norm_weight, k_norm_weight):   # Qwen3RMSNorm: float32 inside, eps 1e-6
    def norm(h, w):
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(dtype)
    return norm(query_states, q_norm_weight), norm(key_states, k_norm_weight)


def qk_functional(q, k, wq, wk, *, eps=1e-6):                       # F.rms_norm, eps keyword-only
    return [F.rms_norm(q, (q.shape[-1],), wq, eps), F.rms_norm(k, (k.shape[-1],), wk, eps)]


def qk_attnlib(q, k, wq, wk):                                       # attnlib's module, its weights set
    norm = QKNorm(q.shape[1], k.shape[1], q.shape[-1]).to(q.dtype)
    with torch.no_grad():
        norm.q_norm.weight.copy_(wq)
        norm.k_norm.weight.copy_(wk)
        return norm(q, k)


def qk_numpy(q, k, wq, wk):
    def norm(u, g):
        u = u.numpy()
        return u / np.sqrt((u ** 2).mean(-1, keepdims=True) + 1e-6) * g.numpy()
    return norm(q, wq), norm(k, wk)


def qk_loops(q, k, wq, wk, eps=1e-6):
    def norm(u, g):
        out = torch.empty_like(u)
        for b in range(u.shape[0]):
            for h in range(u.shape[1]):
                for t in range(u.shape[2]):
                    vec = u[b, h, t]
                    out[b, h, t] = vec / math.sqrt(float((vec * vec).sum()) / len(vec) + eps) * g
        return out
    return norm(q, wq), norm(k, wk)


@pytest.mark.parametrize("answer", [qk_book, qk_hf, qk_functional, qk_attnlib, qk_loops])
def test_qk_norm_accepts_correct_answers(answer):
    result = check_qk_norm(answer)
    assert result.passed, result


def _rms(u, g, dims=-1):
    return u * torch.rsqrt(u.pow(2).mean(dims, keepdim=True) + 1e-6) * g


QK_MISTAKES = {
    "over the projection": lambda q, k, a, b: (_rms(q, a, (1, 3)), _rms(k, b, (1, 3))),
    "over the positions (dim=-2)": lambda q, k, a, b: (_rms(q, a, -2), _rms(k, b, -2)),
    "LayerNorm, not RMSNorm": lambda q, k, a, b: (F.layer_norm(q, q.shape[-1:], a, eps=1e-6),
                                                  F.layer_norm(k, k.shape[-1:], b, eps=1e-6)),
    "divided by its length (L2 norm)": lambda q, k, a, b: (F.normalize(q, dim=-1) * a, F.normalize(k, dim=-1) * b),
    "the weight not applied": lambda q, k, a, b: (_rms(q, 1.0), _rms(k, 1.0)),
    "the other weight used": lambda q, k, a, b: (_rms(q, b), _rms(k, a)),
    "as 1 + w": lambda q, k, a, b: (_rms(q, 1 + a), _rms(k, 1 + b)),
    "the weight applied before the norm": lambda q, k, a, b: (_rms(q * a, 1.0), _rms(k * b, 1.0)),
    "without its square root": lambda q, k, a, b: (q / (q.pow(2).mean(-1, keepdim=True) + 1e-6) * a,
                                                   k / (k.pow(2).mean(-1, keepdim=True) + 1e-6) * b),
    "not normalised at all": lambda q, k, a, b: (q, k),
    "ε added outside the square root": lambda q, k, a, b: tuple(
        u / (u.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * g for u, g in ((q, a), (k, b))),
    "ε left out": lambda q, k, a, b: (q * q.pow(2).mean(-1, keepdim=True).rsqrt() * a,
                                      k * k.pow(2).mean(-1, keepdim=True).rsqrt() * b),
    "ε = 1e-5": lambda q, k, a, b: qk_book(q, k, a, b, eps=1e-5),
    "returned (k, q)": lambda q, k, a, b: qk_book(q, k, a, b)[::-1],
    "the keys were repeated to H heads": lambda q, k, a, b: qk_book(q, k.repeat_interleave(2, dim=1), a, b),
    "should return the pair (q, k), got Tensor": lambda q, k, a, b: qk_book(q, k, a, b)[0],
    "got a list of": lambda q, k, a, b: (qk_book(q, k, a, b)[0].tolist(), k),
    "half precision": lambda q, k, a, b: tuple(t.half() for t in qk_book(q, k, a, b)),
    "has shape (3, 4, 5, 1), expected (3, 4, 5, 6)": lambda q, k, a, b: (q.pow(2).mean(-1, keepdim=True), k),
    "integer": lambda q, k, a, b: tuple(t.round().long() for t in qk_book(q, k, a, b)),
    "changed q in place": lambda q, k, a, b: (q.mul_(torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).mul_(a),
                                              _rms(k, b)),
    "raised ZeroDivisionError": lambda q, k, a, b: 1 / 0,
}


@pytest.mark.parametrize("phrase", QK_MISTAKES)
def test_qk_norm_names_each_mistake(phrase):
    assert_names(check_qk_norm(QK_MISTAKES[phrase]), phrase)


def test_qk_norm_wrong_only_in_one_head_says_where():
    def one_head_wrong(q, k, a, b):
        q, k = qk_book(q, k, a, b)
        return q + (torch.arange(q.shape[1]) == 2).view(1, -1, 1, 1) * 0.5, k
    result = check_qk_norm(one_head_wrong)
    assert not result.passed and "head" in result.message and "matches none" not in result.message, result


# --- softmax with a learned sink -------------------------------------------------------------------


def sink_book(scores, sinks):
    B, H, T, S = scores.shape
    return torch.cat([scores, sinks.view(1, H, 1, 1).expand(B, H, T, 1)], -1).softmax(-1)[..., :S]


def sink_gpt_oss(attn_weights, sinks):                            # transformers' eager_attention_forward, gpt-oss
    sinks = sinks.reshape(1, -1, 1, 1).expand(attn_weights.shape[0], -1, attn_weights.shape[-2], -1)
    combined = torch.cat([attn_weights, sinks], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1, dtype=combined.dtype)
    return probs[..., :-1]


def sink_manual(scores, sinks):                                   # logsumexp by hand, the sink in the max
    s = sinks[None, :, None, None]
    m = torch.maximum(scores.amax(-1, keepdim=True), s)
    e = torch.exp(scores - m)
    return e / (torch.exp(s - m) + e.sum(-1, keepdim=True))


def sink_logsumexp(scores, sinks):
    s = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.exp(scores - torch.logsumexp(torch.cat([scores, s], -1), -1, keepdim=True))


def sink_numpy(scores, sinks):
    a, s = scores.numpy(), sinks.numpy()[None, :, None, None]
    m = np.maximum(a.max(-1, keepdims=True), s)
    e = np.exp(a - m)
    return e / (np.exp(s - m) + e.sum(-1, keepdims=True))


@pytest.mark.parametrize("answer", [sink_book, sink_gpt_oss, sink_manual, sink_logsumexp])
def test_sink_softmax_accepts_correct_answers(answer):
    result = check_sink_softmax(answer)
    assert result.passed, result


def _plain(scores, sinks):
    return scores.softmax(-1)


SINK_MISTAKES = {
    "the sink is missing from the denominator": _plain,
    "NaN replaced by 0": lambda a, s: a.softmax(-1).nan_to_num(0.0),
    "renormalising": lambda a, s: (lambda w: w / w.sum(-1, keepdim=True))(sink_book(a, s)),
    "the row maximum taken over the scores only": lambda a, s: (lambda m: torch.exp(a - m) / (
        torch.exp(s.view(1, -1, 1, 1) - m) + torch.exp(a - m).sum(-1, keepdim=True)))(a.amax(-1, keepdim=True)),
    "exp without subtracting the row's maximum": lambda a, s: torch.exp(a) / (
        torch.exp(s.view(1, -1, 1, 1)) + torch.exp(a).sum(-1, keepdim=True)),
    "s_h added to the denominator as it is": lambda a, s: torch.exp(a) / (
        s.view(1, -1, 1, 1) + torch.exp(a).sum(-1, keepdim=True)),
    "the sink logit taken as 0": lambda a, s: sink_book(a, torch.zeros_like(s)),
    "the sink logit negated": lambda a, s: sink_book(a, -s),
    "indexed by the batch": lambda a, s: torch.cat(
        [a, s.view(-1, 1, 1, 1)[: a.shape[0]].expand(*a.shape[:-1], 1)], -1).softmax(-1)[..., :-1],
    "the sink's column is still there": lambda a, s: torch.cat(
        [a, s.view(1, -1, 1, 1).expand(*a.shape[:-1], 1)], -1).softmax(-1),
    "the sink's column returned as the last key": lambda a, s: torch.cat(
        [a, s.view(1, -1, 1, 1).expand(*a.shape[:-1], 1)], -1).softmax(-1)[..., 1:],
    "over the queries (dim=-2)": lambda a, s: torch.cat(
        [a, s.view(1, -1, 1, 1).expand(*a.shape[:-2], 1, a.shape[-1])], -2).softmax(-2)[..., :-1, :],
    "in place": lambda a, s: sink_book(a.clamp_(min=-1e30), s),
    "got a list of": lambda a, s: sink_book(a, s).tolist(),
    "half precision": lambda a, s: sink_book(a, s).half(),
    "raised RuntimeError": lambda a, s: torch.cat([a, s.view(1, 1, -1, 1).expand(*a.shape[:-1], 1)], -1),  # wrong axis
}


@pytest.mark.parametrize("phrase", SINK_MISTAKES)
def test_sink_softmax_names_each_mistake(phrase):
    assert_names(check_sink_softmax(SINK_MISTAKES[phrase]), phrase)


def test_sink_softmax_agrees_with_attnlib_kernel():
    """The checker's weights are SinkAttention's: with identity values its output is the weights."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 2, 3, 3, generator=gen, dtype=torch.float64)
    attn = SinkAttention(2).double()
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([0.3, -1.0]))
        eye = torch.eye(3, dtype=torch.float64).expand(1, 2, 3, 3)
        out = attn(eye, scores.transpose(-1, -2), eye, None, 1.0)         # q = I, k = scoresᵀ, v = I: out = weights
    assert torch.allclose(out, sink_book(scores, attn.sinks.detach()))


# --- differential attention ------------------------------------------------------------------------


def diff_sdpa(q1, k1, q2, k2, v, lam):
    a = F.scaled_dot_product_attention(q1, k1, v, is_causal=True)
    return a - lam * F.scaled_dot_product_attention(q2, k2, v, is_causal=True)


def diff_einsum(q1, k1, q2, k2, v, lam):
    T, Dh = q1.shape[-2], q1.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    maps = [torch.einsum("bhid,bhjd->bhij", q, k).div(math.sqrt(Dh)).masked_fill(~mask, float("-inf")).softmax(-1)
            for q, k in ((q1, k1), (q2, k2))]
    return torch.einsum("bhij,bhjd->bhid", maps[0] - lam * maps[1], v)


def diff_nanogpt(q1, k1, q2, k2, v, lam):                         # a causal `bias` buffer, masked_fill, att @ v
    T = q1.size(-2)
    bias = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    att1 = (q1 @ k1.transpose(-2, -1)) * (1.0 / math.sqrt(k1.size(-1)))
    att2 = (q2 @ k2.transpose(-2, -1)) * (1.0 / math.sqrt(k2.size(-1)))
    att1 = F.softmax(att1.masked_fill(bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
    att2 = F.softmax(att2.masked_fill(bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
    return (att1 - lam * att2) @ v


def diff_hf(query_1, key_1, query_2, key_2, value_states, lambda_full):   # DiffLlama-like: one SDPA, heads stacked
    q, k = torch.cat([query_1, query_2], 1), torch.cat([key_1, key_2], 1)
    out = F.scaled_dot_product_attention(q, k, value_states.repeat(1, 2, 1, 1), is_causal=True)
    o1, o2 = out.chunk(2, dim=1)
    return o1 - lambda_full * o2


def diff_loops(q1, k1, q2, k2, v, lam):
    B, H, T, Dh = q1.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=v.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                w1 = torch.softmax(torch.stack([q1[b, h, i] @ k1[b, h, j] for j in range(i + 1)]) / Dh ** 0.5, 0)
                w2 = torch.softmax(torch.stack([q2[b, h, i] @ k2[b, h, j] for j in range(i + 1)]) / Dh ** 0.5, 0)
                out[b, h, i] = ((w1 - lam * w2)[:, None] * v[b, h, : i + 1]).sum(0)
    return out


@pytest.mark.parametrize("answer", [diff_sdpa, diff_einsum, diff_nanogpt, diff_hf, diff_loops])
def test_differential_attention_accepts_correct_answers(answer):
    result = check_differential_attention(answer)
    assert result.passed, result


def _att(q, k, *, scale=None, mask="causal", dim=-1, fill=float("-inf")):
    T, Dh = q.shape[-2], q.shape[-1]
    keep = {"causal": torch.ones(T, T).tril(), "none": torch.ones(T, T), "strict": torch.ones(T, T).tril(-1),
            "anti": torch.ones(T, T).triu()}[mask].bool()
    a = q @ k.transpose(-1, -2) * (Dh ** -0.5 if scale is None else scale)
    return a.masked_fill(~keep, fill).softmax(dim)


DIFF_MISTAKES = {
    "the logits subtracted before one softmax": lambda q1, k1, q2, k2, v, l: (
        (q1 @ k1.transpose(-1, -2) - l * q2 @ k2.transpose(-1, -2)) / 2
    ).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ v,
    "λ on the first map": lambda q1, k1, q2, k2, v, l: (l * _att(q1, k1) - _att(q2, k2)) @ v,
    "the maps swapped": lambda q1, k1, q2, k2, v, l: (_att(q2, k2) - l * _att(q1, k1)) @ v,
    "λ left out": lambda q1, k1, q2, k2, v, l: (_att(q1, k1) - _att(q2, k2)) @ v,
    "λ times the difference": lambda q1, k1, q2, k2, v, l: l * (_att(q1, k1) - _att(q2, k2)) @ v,
    "the maps added": lambda q1, k1, q2, k2, v, l: (_att(q1, k1) + l * _att(q2, k2)) @ v,
    "multiplied by 1 - λ": lambda q1, k1, q2, k2, v, l: (1 - l) * (_att(q1, k1) - l * _att(q2, k2)) @ v,
    "no causal mask": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, mask="none") - l * _att(q2, k2, mask="none")) @ v,
    "the diagonal masked": lambda q1, k1, q2, k2, v, l: (
        _att(q1, k1, mask="strict") - l * _att(q2, k2, mask="strict")).nan_to_num(0.0) @ v,
    "the mask inverted": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, mask="anti") - l * _att(q2, k2, mask="anti")) @ v,
    "filled with 0, not -inf": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, fill=0.0) - l * _att(q2, k2, fill=0.0)) @ v,
    "no 1/sqrt(Dh) scale": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, scale=1.0) - l * _att(q2, k2, scale=1.0)) @ v,
    "divided by Dh, not sqrt(Dh)": lambda q1, k1, q2, k2, v, l: (
        _att(q1, k1, scale=0.25) - l * _att(q2, k2, scale=0.25)) @ v,
    "sqrt(Dv)": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, scale=6 ** -0.5) - l * _att(q2, k2, scale=6 ** -0.5)) @ v,
    "over the queries (dim=-2)": lambda q1, k1, q2, k2, v, l: (_att(q1, k1, dim=-2) - l * _att(q2, k2, dim=-2)) @ v,
    "the pairs crossed": lambda q1, k1, q2, k2, v, l: (_att(q1, k2) - l * _att(q2, k1)) @ v,
    "only the first map": lambda q1, k1, q2, k2, v, l: _att(q1, k1) @ v,
    "has shape (2, 3, 5, 5), expected (2, 3, 5, 6)": lambda q1, k1, q2, k2, v, l: _att(q1, k1) - l * _att(q2, k2),
    "got a tuple of 2 items": lambda q1, k1, q2, k2, v, l: (_att(q1, k1) @ v, _att(q2, k2) @ v),
    "half precision": lambda q1, k1, q2, k2, v, l: diff_sdpa(q1, k1, q2, k2, v, l).half(),
    "changed v in place": lambda q1, k1, q2, k2, v, l: diff_sdpa(q1, k1, q2, k2, v.mul_(1.0).add_(0.0).sub_(-0.0), l)
    if v.add_(1) is not None else None,
}


@pytest.mark.parametrize("phrase", DIFF_MISTAKES)
def test_differential_attention_names_each_mistake(phrase):
    assert_names(check_differential_attention(DIFF_MISTAKES[phrase]), phrase)


@pytest.mark.parametrize("check", [check_qk_norm, check_sink_softmax, check_differential_attention, check_output_gate])
def test_stub_is_not_attempted_and_state_is_kept(check):
    result = check(stub)
    assert not result.passed and not result.attempted, result
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()

    def meddler(*args):
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        raise ValueError("oops")
    result = check(meddler)
    assert not result.passed and "ValueError" in result.message, result
    assert torch.get_num_threads() == threads and torch.is_grad_enabled() == grad
    assert torch.get_default_dtype() == torch.float32


# --- the output gate ---------------------------------------------------------------------------------


def gate_book(x, y, gate_weight, out_weight):
    return (y * torch.sigmoid(x @ gate_weight.T)) @ out_weight.T


def gate_functional(hidden_states, attn_output, gate_w, o_w):          # transformers-like: F.linear
    return F.linear(attn_output * torch.sigmoid(F.linear(hidden_states, gate_w)), o_w)


def gate_modules(x, y, gate_weight, out_weight):                        # nn.Linear layers holding the weights
    gate = torch.nn.Linear(x.shape[-1], y.shape[-1], bias=False).to(x.dtype)
    out = torch.nn.Linear(y.shape[-1], x.shape[-1], bias=False).to(x.dtype)
    with torch.no_grad():
        gate.weight.copy_(gate_weight)
        out.weight.copy_(out_weight)
        return out(y * gate(x).sigmoid())


def gate_einsum(x, y, wg, wo):
    g = 1 / (1 + torch.exp(-torch.einsum("btd,wd->btw", x, wg)))
    return torch.einsum("btw,dw->btd", y * g, wo)


def gate_numpy(x, y, wg, wo):
    x, y, wg, wo = (t.numpy() for t in (x, y, wg, wo))
    return (y / (1 + np.exp(-(x @ wg.T)))) @ wo.T


@pytest.mark.parametrize("answer", [gate_book, gate_functional, gate_modules, gate_einsum])
def test_output_gate_accepts_correct_answers(answer):
    result = check_output_gate(answer)
    assert result.passed, result


GATE_MISTAKES = {
    "SiLU": lambda x, y, g, o: (y * F.silu(x @ g.T)) @ o.T,
    "no sigmoid": lambda x, y, g, o: (y * (x @ g.T)) @ o.T,
    "tanh instead of the sigmoid": lambda x, y, g, o: (y * torch.tanh(x @ g.T)) @ o.T,
    "1 - σ": lambda x, y, g, o: (y * (1 - torch.sigmoid(x @ g.T))) @ o.T,
    "a softmax over the channels": lambda x, y, g, o: (y * (x @ g.T).softmax(-1)) @ o.T,
    "the sigmoid taken of x before the projection": lambda x, y, g, o: (y * (torch.sigmoid(x) @ g.T)) @ o.T,
    "the gate added": lambda x, y, g, o: (y + torch.sigmoid(x @ g.T)) @ o.T,
    "the gate not applied": lambda x, y, g, o: y @ o.T,
    "before the output projection": lambda x, y, g, o: y * torch.sigmoid(x @ g.T),
    "(out, in)": lambda x, y, g, o: (y * torch.sigmoid(x @ g)) @ o,
    "the gate computed from y": lambda x, y, g, o: F.linear(y * torch.sigmoid(F.linear(y, g)), o),
    "the expected result times 2": lambda x, y, g, o: 2 * gate_book(x, y, g, o),
    "half precision": lambda x, y, g, o: gate_book(x, y, g, o).half(),
    "changed y in place": lambda x, y, g, o: y.mul_(torch.sigmoid(x @ g.T)) @ o.T,
}


@pytest.mark.parametrize("phrase", GATE_MISTAKES)
def test_output_gate_names_each_mistake(phrase):
    assert_names(check_output_gate(GATE_MISTAKES[phrase]), phrase)


@pytest.mark.parametrize("check, answer", [(check_qk_norm, qk_numpy), (check_sink_softmax, sink_numpy),
                                                  (check_output_gate, gate_numpy)])
def test_numpy_arrays_with_the_right_values_are_refused_by_name(check, answer):
    """A checker takes torch.Tensors only (issue 36): an array is named, with the way to turn it into one."""
    assert_names(check(answer), "should be a torch.Tensor", "got a numpy.ndarray of shape (", "torch.from_numpy")
