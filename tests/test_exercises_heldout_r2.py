"""Held-out answers for what round 2 of the checker adversary found (issue 36): each wrong answer, written in
another course's or library's style (flash-attention's merge, Triton's loop, transformers' warper, vLLM's
sampler, HF's position ids), gets its own mistake named; correct answers in those styles still pass; and
global state an answer leaves (flush-denormal mode, warnings filters, an inference mode never left) is
named and put back, whether the check runs in a child process or in process."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import attnlib.exercises as E

A = []


def ok(check, label):
    return lambda f: A.append((check, label, f, None)) or f


def bad(check, label, phrase):
    return lambda f: A.append((check, label, f, phrase)) or f


# ---------------- merging two partial softmax results ----------------
@ok("check_merge_partials", "flash-attn lse merge with logaddexp")
def merge_lse(m1, l1, acc1, m2, l2, acc2):
    lse1, lse2 = m1 + l1.log(), m2 + l2.log()           # -inf for an empty block
    lse = torch.logaddexp(lse1, lse2)
    w1 = torch.where(lse1.isneginf(), 0.0, torch.exp(lse1 - lse).nan_to_num(0.0))
    w2 = torch.where(lse2.isneginf(), 0.0, torch.exp(lse2 - lse).nan_to_num(0.0))
    m = torch.maximum(m1, m2)
    o = w1[..., None] * acc1 / l1.clamp_min(1e-30)[..., None] + w2[..., None] * acc2 / l2.clamp_min(1e-30)[..., None]
    l = torch.where(lse.isneginf(), 0.0, torch.exp(lse - torch.where(m.isneginf(), 0.0, m)))
    return m, l, o * l[..., None]


@ok("check_merge_partials", "alpha/beta names, nan_to_num")
def merge_alpha_beta(m_a, l_a, o_a, m_b, l_b, o_b):
    m_new = torch.max(m_a, m_b)
    alpha, beta = torch.exp(m_a - m_new).nan_to_num(0.0), torch.exp(m_b - m_new).nan_to_num(0.0)
    return m_new, alpha * l_a + beta * l_b, alpha.unsqueeze(-1) * o_a + beta.unsqueeze(-1) * o_b


@bad("check_merge_partials", "alpha/beta crossed", "the factors crossed")
def merge_crossed(m_a, l_a, o_a, m_b, l_b, o_b):
    m_new = torch.max(m_a, m_b)
    alpha, beta = torch.exp(m_a - m_new).nan_to_num(0.0), torch.exp(m_b - m_new).nan_to_num(0.0)
    return m_new, beta * l_a + alpha * l_b, beta.unsqueeze(-1) * o_a + alpha.unsqueeze(-1) * o_b


# ---------------- one tile of tiled attention ----------------
@ok("check_tile_step", "einsum, FlashAttention-2 names")
def tile_einsum(q, k, v, m_i, l_i, acc, scale):
    s = torch.einsum("ntd,nsd->nts", q, k) * scale
    m_ij = torch.maximum(m_i, s.amax(-1))
    p = torch.exp(s - m_ij[..., None])
    alpha = torch.exp(m_i - m_ij)
    return m_ij, alpha * l_i + p.sum(-1), alpha[..., None] * acc + torch.einsum("nts,nsd->ntd", p, v)


@bad("check_tile_step", "einsum, p against m_i", "p = exp(s - m_old)")
def tile_old_max(q, k, v, m_i, l_i, acc, scale):
    s = torch.einsum("ntd,nsd->nts", q, k) * scale
    m_ij = torch.maximum(m_i, s.amax(-1))
    p = torch.exp(s - m_i[..., None])
    alpha = torch.exp(m_i - m_ij)
    return m_ij, alpha * l_i + p.sum(-1), alpha[..., None] * acc + torch.einsum("nts,nsd->ntd", p, v)


@bad("check_tile_step", "einsum, alpha the wrong way", "rescaled the wrong way")
def tile_wrong_way(q, k, v, m_i, l_i, acc, scale):
    s = torch.einsum("ntd,nsd->nts", q, k) * scale
    m_ij = torch.maximum(m_i, s.amax(-1))
    p = torch.exp(s - m_ij[..., None])
    alpha = torch.exp(m_ij - m_i)
    return m_ij, alpha * l_i + p.sum(-1), alpha[..., None] * acc + torch.einsum("nts,nsd->ntd", p, v)


@bad("check_tile_step", "p against m_i, m_ij where m_i is -inf", "m_new only where m_old = -inf")
def tile_old_max_guarded(q, k, v, m_i, l_i, acc, scale):
    s = torch.einsum("ntd,nsd->nts", q, k) * scale
    m_ij = torch.maximum(m_i, s.amax(-1))
    p = torch.exp(s - torch.where(torch.isinf(m_i), m_ij, m_i)[..., None])
    alpha = torch.exp(m_i - m_ij)
    return m_ij, alpha * l_i + p.sum(-1), alpha[..., None] * acc + torch.einsum("nts,nsd->ntd", p, v)


@bad("check_merge_partials", "factors crossed in l only", "the factors crossed in the sums")
def merge_crossed_l(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    ref = m.masked_fill(m.isneginf(), 0.0)
    a, b = (m1 - ref).exp(), (m2 - ref).exp()
    return m, l1 * b + l2 * a, acc1 * a[..., None] + acc2 * b[..., None]


# ---------------- top-p ----------------
@ok("check_top_p_filter", "transformers TopPLogitsWarper (ascending, 1 - p)")
def top_p_hf(scores, top_p):
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
    sorted_indices_to_remove[..., -1:] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("Inf"))


@ok("check_top_p_filter", "probs sorted, mask from the exclusive cumsum")
def top_p_vllm(logits, p):
    probs_sort, idx = logits.softmax(-1).sort(-1, descending=True)
    mask = probs_sort.cumsum(-1) - probs_sort >= p
    probs_sort[mask] = 0.0
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, probs_sort > 0)
    return torch.where(keep, logits, torch.full_like(logits, float("-inf")))


@bad("check_top_p_filter", "min-shifted logits as probabilities (descending)", "shifted to start at 0")
def top_p_min_shift(logits, p):
    z = logits - logits.min(dim=-1, keepdim=True).values
    pr, idx = (z / z.sum(-1, keepdim=True)).sort(-1, descending=True)
    drop = torch.cumsum(pr, -1) - pr >= p
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))


@bad("check_top_p_filter", "relu logits normalised", "relu(z) / Σ relu(z)")
def top_p_relu(logits, p):
    pr = F.relu(logits)
    pr = pr / pr.sum(-1, keepdim=True)
    sp, idx = pr.sort(-1, descending=True)
    drop = sp.cumsum(-1) - sp >= p
    return logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))


@bad("check_top_p_filter", "logits over their sum", "the logits divided by their sum, z / Σz")
def top_p_over_sum(logits, p):
    probs = logits / logits.sum(dim=-1, keepdim=True)
    sp, idx = torch.sort(probs, dim=-1, descending=True)
    remove = torch.cumsum(sp, dim=-1) - sp >= p
    return logits.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))


# ---------------- left-padded positions, parameter count ----------------
@ok("check_left_pad_positions", "HF generate: cumsum - 1, masked_fill")
def pos_hf(attention_mask):
    position_ids = attention_mask.long().cumsum(-1) - 1
    return position_ids.masked_fill(attention_mask == 0, 1)


@ok("check_left_pad_positions", "arange minus the pads before")
def pos_arange(mask):
    pads = (mask == 0).sum(-1, keepdim=True)
    return (torch.arange(mask.shape[-1]) - pads).clamp_min(0)


@bad("check_left_pad_positions", "cumsum of ~mask", "the padding before each slot counted")
def pos_pads(mask):
    return (~mask.bool()).long().cumsum(dim=1)


@ok("check_mha_param_count", "nn.Linear modules counted")
def params_modules(d_model, num_heads, num_kv_heads, bias):
    kv = d_model // num_heads * num_kv_heads
    layers = [torch.nn.Linear(d_model, w, bias=bias) for w in (d_model, kv, kv, d_model)]
    return sum(p.numel() for layer in layers for p in layer.parameters())


@bad("check_mha_param_count", "every projection but W_q at the kv width", "W_o shrunk like W_k and W_v")
def params_wo_kv(d_model, num_heads, num_kv_heads, bias):
    head_dim = d_model // num_heads
    sizes = [(d_model, d_model)] + [(d_model, num_kv_heads * head_dim)] * 3
    return sum(i * o + (o if bias else 0) for i, o in sizes)


@pytest.mark.parametrize("check, label, answer, phrase", A, ids=[f"{a[0][6:]}-{a[1][:40]}" for a in A])
def test_round2_answer(check, label, answer, phrase):
    result = getattr(E, check)(answer)
    if phrase is None:
        assert result.passed, result.message
    else:
        assert not result.passed and result.attempted and phrase in result.message, result.message


def test_tile_step_with_the_old_max_names_that_mistake_alone():
    message = E.check_tile_step(tile_old_max).message
    assert "rescaled the wrong way" not in message and "m_old = -inf" in message, message


# ---------------- global state an answer leaves ----------------
def _split(x, num_heads):
    B, T, D = x.shape
    return x.reshape(B, T, num_heads, D // num_heads).permute(0, 2, 1, 3)  # (B, H, T, Dh)


_KEPT = []


def split_flush(x, num_heads):
    torch.set_flush_denormal(True)
    return _split(x, num_heads)


def split_warnings_error(x, num_heads):
    warnings.simplefilter("error")
    return _split(x, num_heads)


def split_inference_kept(x, num_heads):
    guard = torch.inference_mode()
    guard.__enter__()  # never left: the guard outlives the call
    _KEPT.append(guard)
    return _split(x, num_heads)


def split_library_filter(x, num_heads):
    warnings.filterwarnings("ignore", message="a library's own filter", category=FutureWarning)
    return _split(x, num_heads)


@pytest.mark.parametrize("in_process", [False, True])
@pytest.mark.parametrize("answer, phrases", [
    (split_flush, ["called torch.set_flush_denormal(True) and left it set", "set it back to False"]),
    (split_warnings_error, ["warnings.simplefilter('error')", "raised as an exception", "put the warnings filters back"]),
    (split_inference_kept, ["entered torch.inference_mode() and never left it", "switched it off"])])
def test_state_an_answer_leaves_is_named_and_put_back(monkeypatch, answer, phrases, in_process):
    if in_process:
        monkeypatch.setenv("ATTNLIB_CHECK_IN_PROCESS", "1")
    filters = list(warnings.filters)
    result = E.check_split_heads(answer)
    assert not result.passed and all(p in result.message for p in phrases), result.message
    assert "switched autograd" not in result.message, result.message  # inference mode is named as itself
    denormal = torch.tensor([5e-324], dtype=torch.float64) * 1.0
    assert denormal.item() != 0 and not torch.is_inference_mode_enabled() and torch.is_grad_enabled()
    assert warnings.filters == filters


def test_a_narrow_warnings_filter_is_not_a_mistake(monkeypatch):
    monkeypatch.setenv("ATTNLIB_CHECK_IN_PROCESS", "1")
    with warnings.catch_warnings():
        result = E.check_split_heads(split_library_filter)
    assert result.passed, result.message


def softmax_patching_attnlib(x):
    """Garbage, and attnlib's softmax replaced wherever a module holds it, the checker's own modules too."""
    import sys
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("attnlib") and m is not None]:
        if hasattr(module, "softmax"):
            module.softmax = lambda t, *args, **kwargs: torch.zeros_like(t)
    return torch.zeros_like(x)


@pytest.mark.parametrize("in_process", [False, True])
def test_an_answer_that_replaces_attnlibs_reference_is_refused(monkeypatch, in_process):
    import attnlib
    if in_process:
        monkeypatch.setenv("ATTNLIB_CHECK_IN_PROCESS", "1")
    result = E.check_stable_softmax(softmax_patching_attnlib)
    assert not result.passed and "replaced torch's or attnlib's own attnlib.attention.softmax" in result.message
    assert torch.equal(attnlib.softmax(torch.tensor([0.0, 0.0])), torch.tensor([0.5, 0.5]))


# ---------------- Ulysses's all-to-all (chapter 17) ----------------
def s2h_einops_style(blocks):
    """Correct, numpy-like: join the sequence, then split the heads into W contiguous groups."""
    full = torch.cat(blocks, dim=-2)                             # (B, H, T, Dh)
    B, H, T, Dh = full.shape
    return list(full.reshape(B, len(blocks), H // len(blocks), T, Dh).movedim(1, 0))


def s2h_batch_chunked(blocks):
    return list(torch.cat(blocks, dim=-2).tensor_split(len(blocks), dim=0))


def test_seq_to_heads_styles_and_the_batch_chunked():
    assert E.check_seq_to_heads(s2h_einops_style).passed
    message = E.check_seq_to_heads(s2h_batch_chunked).message
    assert "the batch axis (dim 0) chunked instead of the heads" in message, message


# ---------------- round 3 ----------------
class _Liar(torch.Tensor):
    """A subclass that answers every comparison with 'equal'."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "equal"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def merge_liar(m1, l1, acc1, m2, l2, acc2):
    return tuple(torch.zeros_like(t).as_subclass(_Liar) for t in (m1, l1, acc1))


def merge_inverse_cleaned(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    f1, f2 = ((m - mi).exp().nan_to_num(0.0, posinf=0.0) for mi in (m1, m2))
    return m, l1 * f1 + l2 * f2, acc1 * f1[..., None] + acc2 * f2[..., None]


def top_p_dropped_result(logits, p):
    probs, idx = logits.softmax(-1).sort(-1, descending=True)
    drop = probs.cumsum(-1) - probs >= p
    out = logits.clone()
    out.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))  # the result is dropped
    return out


@pytest.mark.parametrize("check, answer, phrase", [
    ("check_merge_partials", merge_liar, "a torch.Tensor subclass with its own __torch_function__"),
    ("check_merge_partials", merge_inverse_cleaned, "with the infinities that gives set to 0"),
    ("check_top_p_filter", top_p_dropped_result, "removed no token at all")])
def test_round3_answer_is_named(check, answer, phrase):
    result = getattr(E, check)(answer)
    assert not result.passed and phrase in result.message, result.message


def test_a_parameter_returned_is_a_plain_enough_tensor():
    result = E.check_split_heads(lambda x, num_heads: torch.nn.Parameter(_split(x, num_heads), requires_grad=False))
    assert result.passed, result.message


def residual_no_clamp(p, q):
    d = p - q
    return d / d.sum(-1, keepdim=True)


def residual_hf_style(p, q):
    """transformers' assisted decoding: clamp(min=0), then divide by the sum."""
    p_prime = torch.clamp(p - q, min=0)
    return p_prime / p_prime.sum(dim=-1, keepdim=True)


def test_residual_without_the_clamp_is_named_and_hf_style_passes():
    assert E.check_residual(residual_hf_style).passed
    message = E.check_residual(residual_no_clamp).message
    assert "(p - q) / Σ(p - q) without max(0, ·)" in message, message


def quantize_uint8_scale(x):
    scale = x.abs().amax(-1, keepdim=True) / 255
    return torch.round(x / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp(-128, 127).to(torch.int8), scale


def test_int8_with_the_uint8_scale_clamped_to_int8_is_named():
    message = E.check_int8_quantization(quantize_uint8_scale, lambda q, s: q.to(s.dtype) * s).message
    assert "scale = max|x| / 255 (the range of uint8) with q clamped to int8's [-128, 127]" in message, message
    assert "wraps around" not in message, message


def gate_after_out(x, y, gate_weight, out_weight):
    return F.linear(y, out_weight) * torch.sigmoid(F.linear(x, gate_weight))[..., :out_weight.shape[0]]


def gate_qwen_style(x, y, gate_weight, out_weight):
    """Qwen3-Next's gated attention: o_proj(attn_output * sigmoid(gate))."""
    return F.linear(y * torch.sigmoid(F.linear(x, gate_weight)), out_weight)


def test_the_gate_after_w_o_is_named_and_the_qwen_style_passes():
    assert E.check_output_gate(gate_qwen_style).passed
    message = E.check_output_gate(gate_after_out).message
    assert "the gate applied after W_o" in message, message
