"""First contact (issue 36): answers written in other courses' styles (d2l, HF, sentence-transformers, numpy, loops,
einsum, flash-attention's merge) before the checkers were changed for them. Each correct one passes; each wrong
one is refused with its mistake named: a catalogue entry, a family with its number fitted (a temperature, a
position factor, an epsilon), or a structural fact (another diagonal's triangle, the log of the right result,
which features are wrong)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib.exercises as E

A = []


def ok(check, label):
    return lambda f: A.append((check, label, f, None)) or f


def bad(check, phrase):
    return lambda f: A.append((check, phrase, f, phrase)) or f


def phi(x):
    return F.elu(x) + 1


@ok("check_stable_softmax", "numpy-converted with nan_to_num")
def sm_np(x, dim=-1):
    a = x.detach().double().numpy()
    m = np.max(a, axis=-1, keepdims=True); m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(a - m); s = e.sum(-1, keepdims=True)
    return torch.from_numpy(np.where(s > 0, e / np.where(s > 0, s, 1), 0.0)).to(x.dtype)

@bad("check_stable_softmax", 'the log of the expected result')
def sm_log(x, dim=-1):
    return torch.nan_to_num(torch.log_softmax(x, -1), neginf=0.0)

@bad("check_stable_softmax", 'the scores multiplied by 0.5')
def sm_temp(x, dim=-1):
    y = x / 2; m = y.amax(-1, keepdim=True).clamp_min(-1e30); e = (y - m).exp(); return torch.nan_to_num(e / e.sum(-1, keepdim=True))

@bad("check_stable_softmax", "the row's mean subtracted")
def sm_mean(x, dim=-1):
    f = torch.where(torch.isinf(x), torch.zeros_like(x), x)
    e = (x - f.mean(-1, keepdim=True)).exp(); s = e.sum(-1, keepdim=True)
    return torch.where(s > 0, e / s, torch.zeros_like(e))

# ---- ch01 einsum attention

@ok("check_attention_einsum", "loop over heads")
def ein_loop(q, k, v):
    outs = []
    for h in range(q.shape[2]):
        s = q[:, :, h] @ k[:, :, h].transpose(-1, -2) / math.sqrt(q.shape[-1])
        outs.append(s.softmax(-1) @ v[:, :, h])
    return torch.stack(outs, 2)

@bad("check_attention_einsum", 'divided by 2.449')
def ein_dv(q, k, v):
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(v.shape[-1])
    return torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)

@bad("check_attention_einsum", 'the scores summed over the heads')
def ein_h(q, k, v):
    s = torch.einsum("bthd,bshd->bts", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("bts,bshd->bthd", s.softmax(-1), v)

# ---- ch01 one query on lists

@ok("check_one_query_attention", "pure python")
def oq(q, keys, values):
    d = len(q); s = [sum(a*b for a, b in zip(q, k)) / math.sqrt(d) for k in keys]
    m = max(s); e = [math.exp(t - m) for t in s]; z = sum(e)
    return [sum(w / z * v[j] for w, v in zip(e, values)) for j in range(len(values[0]))]

@ok("check_attention_entropy", "xlogy")
def ent(w):
    return -torch.special.xlogy(w, w).sum(-1)

@bad("check_attention_entropy", 'an epsilon of 0.001 added inside the log')
def ent_eps(w):
    return -(w * torch.log(w + 1e-3)).sum(-1)

@bad("check_xavier_std", 'the gain squared')
def xav_g2(fan_in, fan_out, gain):
    return gain ** 2 * math.sqrt(2.0 / (fan_in + fan_out))

@bad("check_causal_mask", 'every entry is True: every query sees every key')
def cm_off(T, S):
    return torch.ones(T, S, dtype=torch.bool).tril(S - T + 1)

@bad("check_causal_mask", 'every entry is False: no query may see any key')
def cm_flip(T, S):
    return torch.ones(T, S, dtype=torch.bool).tril(T - S)

@bad("check_padding_causal_mask", 'False where it should be True')
def pcm_triu(m):
    T = m.shape[1]
    return torch.triu(torch.ones(T, T, dtype=torch.bool)) & m.bool()[:, None, None, :]

# ---- ch04 heads

@ok("check_split_heads", "einops-like via unflatten")
def sh(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)

@ok("check_sinusoidal", "d2l style")
def sin_d2l(T, D):
    P = torch.zeros(T, D)
    X = torch.arange(T, dtype=torch.float32).reshape(-1, 1) / torch.pow(10000, torch.arange(0, D, 2, dtype=torch.float32) / D)
    P[:, 0::2] = torch.sin(X); P[:, 1::2] = torch.cos(X); return P

@bad("check_sinusoidal", 'the frequency base 14925 instead of 10000')
def sin_dm1(T, D):
    div = 10000 ** (torch.arange(0, D, 2).float() / (D - 1))
    pos = torch.arange(T).float()[:, None]; P = torch.zeros(T, D)
    P[:, 0::2] = torch.sin(pos / div); P[:, 1::2] = torch.cos(pos / div); return P

@bad("check_rope", 'features 0-3 are right, features 4-7 are not')
def rope_sign(x, positions):
    Dh = x.shape[-1]; h = Dh // 2
    inv = 1.0 / 10000 ** (torch.arange(0, Dh, 2).float() / Dh)
    f = positions.float()[:, None] * inv; c, s = f.cos(), f.sin()
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c - x1 * s], -1)

@bad("check_rope", 'each position multiplied by 0.5')
def rope_scaled(x, positions):
    Dh = x.shape[-1]; inv = 1.0 / 10000 ** (torch.arange(0, Dh, 2).float() / Dh)
    f = (positions.float() / 2)[:, None] * inv; emb = torch.cat([f, f], -1)
    x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

@ok("check_find_permutation", "cdist argmin")
def fp(out, shuffled):
    return torch.cdist(shuffled, out).argmin(-1)

@ok("check_repeat_kv", "hf expand reshape")
def rk(x, n_rep):
    B, Hk, S, Dh = x.shape
    return x[:, :, None].expand(B, Hk, n_rep, S, Dh).reshape(B, Hk * n_rep, S, Dh)

@ok("check_kv_cache_bytes", "dict get")
def kvb(config, seq_len, batch_size, bytes_per_element):
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", config["num_attention_heads"]) * hd * seq_len * batch_size * bytes_per_element

@ok("check_mean_pool_kv_heads", "view mean")
def mp(w, num_heads, num_kv_heads):
    HDh, D = w.shape; Dh = HDh // num_heads
    return w.view(num_kv_heads, num_heads // num_kv_heads, Dh, D).mean(1).reshape(num_kv_heads * Dh, D)

@bad("check_cache_update", 'the new keys and values swapped')
def cu_swap(past_k, past_v, k, v):
    return torch.cat([past_k, v], 2), torch.cat([past_v, k], 2)

@ok("check_left_pad_positions", "cumsum-1 clamp")
def lp(m):
    return (m.long().cumsum(-1) - 1).clamp_min(0)

@ok("check_online_logsumexp", "running m,s loop")
def ol(chunks):
    m, s = -math.inf, 0.0
    for c in chunks:
        c = c.double()
        if c.numel() == 0: continue
        cm = float(c.max())
        nm = max(m, cm)
        if nm == -math.inf: continue
        s = s * math.exp(m - nm) + float(torch.exp(c - nm).sum()); m = nm
    return m + math.log(s) if s > 0 else -math.inf

@bad("check_online_logsumexp", "the largest of the chunks' logsumexps")
def ol_max(chunks):
    return max(float(torch.logsumexp(c.double(), 0)) for c in chunks if c.numel())

@ok("check_merge_partials", "fa style")
def mg(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2); a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    a = torch.nan_to_num(a); b = torch.nan_to_num(b)
    return m, a * l1 + b * l2, a[..., None] * acc1 + b[..., None] * acc2

@bad("check_merge_partials", 'the other entries match acc divided by l')
def mg_div(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2); a, b = torch.nan_to_num(torch.exp(m1 - m)), torch.nan_to_num(torch.exp(m2 - m))
    l = a * l1 + b * l2
    return m, l, (a[..., None] * acc1 + b[..., None] * acc2) / l[..., None]

@ok("check_tile_step", "flash loop")
def ts(q, k_tile, v_tile, m, l, acc, scale):
    s = q @ k_tile.transpose(-1, -2) * scale
    m_new = torch.maximum(m, s.amax(-1))
    p = torch.exp(s - m_new[..., None]); c = torch.exp(m - m_new)
    return m_new, c * l + p.sum(-1), c[..., None] * acc + p @ v_tile

@ok("check_linear_attention_step", "einsum")
def la(S, z, q, k, v):
    S2 = S + torch.einsum("bhk,bhv->bhkv", phi(k), v); z2 = z + phi(k)
    out = torch.einsum("bhk,bhkv->bhv", phi(q), S2) / (phi(q) * z2).sum(-1, keepdim=True)
    return out, S2, z2

@bad("check_linear_attention_step", "the output read from the state before this token's write")
def la_old(S, z, q, k, v):
    S2 = S + torch.einsum("bhk,bhv->bhkv", phi(k), v); z2 = z + phi(k)
    out = torch.einsum("bhk,bhkv->bhv", phi(q), S) / (phi(q) * z).sum(-1, keepdim=True).clamp_min(1e-6)
    return out, S2, z2

@bad("check_linear_attention_step", 'φ = relu(x): the feature map')
def la_relu(S, z, q, k, v):
    f = F.relu
    S2 = S + torch.einsum("bhk,bhv->bhkv", f(k), v); z2 = z + f(k)
    out = torch.einsum("bhk,bhkv->bhv", f(q), S2) / (f(q) * z2).sum(-1, keepdim=True).clamp_min(1e-6)
    return out, S2, z2

@ok("check_delta_rule_update", "loop form")
def dr(S, k, v, beta, alpha):
    kh = F.normalize(k, dim=-1)
    Sa = alpha[..., None, None] * S
    pred = torch.einsum("bhkv,bhk->bhv", Sa, kh)
    return Sa + beta[..., None, None] * torch.einsum("bhk,bhv->bhkv", kh, v - pred)

@ok("check_topk_selection", "masked topk scatter")
def tk(scores, k):
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = scores.masked_fill(~causal, float("-inf"))
    idx = s.topk(min(k, T), -1).indices
    out = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)
    return out & causal

@ok("check_ring_merge", "logaddexp")
def rm(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    return torch.nan_to_num(out1 * torch.exp(lse1 - lse)[..., None]) + torch.nan_to_num(out2 * torch.exp(lse2 - lse)[..., None]), lse

@bad("check_ring_merge", 'lse = (lse1 + lse2) / 2')
def rm_mean(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    out = torch.nan_to_num(out1 * torch.exp(lse1 - lse)[..., None]) + torch.nan_to_num(out2 * torch.exp(lse2 - lse)[..., None])
    return out, (lse1 + lse2) / 2

@ok("check_seq_to_heads", "cat then chunk")
def s2h(blocks):
    full = torch.cat(blocks, 2); W = len(blocks)
    return list(full.chunk(W, 1))

@ok("check_mean_pool", "sentence-transformers style")
def mp(hidden, attention_mask):
    m = attention_mask.unsqueeze(-1).expand(hidden.size()).float()
    return torch.sum(hidden * m, 1) / torch.clamp(m.sum(1), min=1e-9)

@bad("check_mean_pool", "the first token's vector")
def mp_cls(hidden, attention_mask):
    return hidden[:, 0]

@bad("check_mean_pool", 'a max over the real tokens (max pooling), not their mean at row 0, 1')
def mp_max(hidden, attention_mask):
    return hidden.masked_fill(attention_mask[..., None] == 0, -1e9).amax(1)

@ok("check_find_head", "argmax flat")
def fh(weights, query, key):
    vals = torch.stack([w[:, query, key] for w in weights])
    i = int(vals.argmax()); return divmod(i, vals.shape[1])

@ok("check_encoder_block", "post-LN by hand")
def eb(layer, x, valid):
    m = valid.bool()[:, None, None, :]
    h = layer.norm1(x + layer.attn(x, mask=m))
    return layer.norm2(h + layer.ffn(h))

@bad("check_encoder_block", "the FFN's residual adds x")
def eb_res(layer, x, valid):
    m = valid.bool()[:, None, None, :]
    h = layer.norm1(x + layer.attn(x, mask=m))
    return layer.norm2(x + layer.ffn(h))

@bad("check_encoder_block", 'norm1 applied twice')
def eb_norm1(layer, x, valid):
    m = valid.bool()[:, None, None, :]
    h = layer.norm1(x + layer.attn(x, mask=m))
    return layer.norm1(h + layer.ffn(h))

# ---- ch12

@ok("check_top_p_filter", "HF TopPLogitsWarper style")
def tp(logits, p):
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    remove = cum <= (1 - p)
    remove[..., -1:] = False
    rm = remove.scatter(1, sorted_idx, remove)
    return logits.masked_fill(rm, float("-inf"))

@ok("check_repetition_penalty", "hf gather/scatter")
def rp(logits, input_ids, penalty):
    sc = torch.gather(logits, 1, input_ids)
    sc = torch.where(sc < 0, sc * penalty, sc / penalty)
    return logits.scatter(1, input_ids, sc)

@bad("check_repetition_penalty", "the first row's input_ids used for every row")
def rp_row0(logits, input_ids, penalty):
    ids = input_ids[:1].expand_as(input_ids)
    sc = torch.gather(logits, 1, ids)
    return logits.scatter(1, ids, torch.where(sc < 0, sc * penalty, sc / penalty))

# ---- ch13

@ok("check_sliding_window_mask", "Mistral-ish")
def sw(T, window):
    i = torch.arange(T)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)

@ok("check_rolling_buffer_update", "index_copy")
def rb(buffer, k, pos):
    return buffer.index_copy(2, torch.tensor([pos % buffer.shape[2]]), k)

@ok("check_block_table_lookup", "gather view")
def bt(pool, block_table, seq_len):
    nb, bs, H, Dh = pool.shape
    return pool[block_table].reshape(-1, H, Dh)[:seq_len].transpose(0, 1)

@ok("check_int8_quantization", "absmax per vector")
def q8(x):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (x / s).round().clamp(-127, 127).to(torch.int8), s

# ---- round 1 of the outside adversary: the mistakes it found unnamed, in answers of our own


@bad("check_stable_softmax", "your guard against 0 / 0 returns them as zeros")
def softmax_one_max(x):
    e = torch.exp(x - x[torch.isfinite(x)].max())
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


@bad("check_mha_param_count", "one bias missing, W_q's or W_o's")
def params_no_o_bias(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * (d_model // num_heads)
    return 2 * d_model * (d_model + kv) + (d_model + 2 * kv if bias else 0)


@bad("check_induction_score", "the first copy's queries")
def induction_first_copy(weights, period):
    T = weights.shape[-1]
    first = torch.arange(T - 2 * period, T - period)
    return weights[:, first, first - period + 1].mean(-1)


@bad("check_padding_causal_mask", "torch.triu where torch.tril belongs")
def padding_causal_triu(attention_mask):
    T = attention_mask.shape[1]
    return torch.ones(T, T, dtype=torch.bool).triu() & attention_mask.bool()[:, None, None, :]


@bad("check_sinusoidal", "the exponent i/D instead of 2i/D (i numbers the sin/cos pairs, and the exponent is 2i/D), or")
def sinusoidal_i_over_d(T, D):
    angle = torch.arange(T)[:, None] * 10000 ** (-torch.arange(D // 2) / D)
    return torch.stack([angle.sin(), angle.cos()], -1).flatten(1)


@bad("check_cross_attention", "were applied to x (T = 5 positions) and `value` to context (S = 7)")
class CrossKeysFromX(torch.nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.query, self.key, self.value, self.out = (torch.nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, context=None, mask=None):
        B, T, D = x.shape
        c = x if context is None else context
        split = lambda t: t.unflatten(-1, (self.h, -1)).transpose(1, 2)  # noqa: E731 - (B, H, *, Dh)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(c))
        s = q @ k.mT / math.sqrt(D // self.h)
        s = s if mask is None else s.masked_fill(~mask, float("-inf"))
        return self.out((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))



# ---- round 2 of the outside adversary


@bad("check_left_pad_positions", "the padding before each slot counted instead of the real tokens")
def positions_count_padding(attention_mask):
    return (1 - attention_mask.long()).cumsum(-1)


@bad("check_mha_param_count", "W_o shrunk like W_k and W_v")
def params_o_shrunk(d_model, num_heads, num_kv_heads, bias):
    kv = num_kv_heads * (d_model // num_heads)
    return d_model * d_model + 3 * d_model * kv + (d_model + 3 * kv if bias else 0)



@pytest.mark.parametrize("check, label, answer, phrase", A, ids=[f"{a[0][6:]}-{a[2].__name__}" for a in A])
def test_first_contact_answer(check, label, answer, phrase):
    checker = getattr(E, check)
    result = checker(answer, lambda q, s: q.float() * s) if check == "check_int8_quantization" else checker(answer)
    if phrase is None:
        assert result.passed, result.message
    else:
        assert not result.passed and result.attempted and phrase in result.message, result.message
