"""Held-out answers (issue 36): three sets written in other courses' and libraries' styles (transformers,
vLLM, fairseq, TransformerLens, Mistral's reference code, flash-attention's merge, numpy, loops) by someone
who wrote each before running it. Every correct one passes; every wrong one is refused, leaves torch as it
was, and has its mistake named (two, marked named=False, are only described: which position or how much)."""

import math  # noqa: F401 - used by some answers
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlib.exercises as E

INF = float("-inf")
A = []


def ok(check, label):
    return lambda f: A.append((check, "ok", label, f, True)) or f


def bad(check, label, named=True):
    return lambda f: A.append((check, "bad", label, f, named)) or f


# ======== held-out set 1 ========

# ---------------- RoPE (x (B,H,T,Dh), positions (T,)) ----------------
@ok("check_rope", "hf import inside function")
def rope_hf(x, positions):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    Dh = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    f = positions.double()[:, None] * inv[None]
    emb = torch.cat([f, f], -1)
    q, _ = apply_rotary_pos_emb(x.double(), x.double(), emb.cos().to(x.dtype), emb.sin().to(x.dtype), unsqueeze_dim=0)
    return q.to(x.dtype)

@ok("check_rope", "complex polar, gpt-neox halves")
def rope_complex(x, positions):
    Dh = x.shape[-1]; h = Dh // 2
    theta = 10000 ** (-torch.arange(h, dtype=torch.float64) * 2 / Dh)
    ang = positions.double()[:, None] * theta
    z = torch.complex(x[..., :h].double(), x[..., h:].double()) * torch.polar(torch.ones_like(ang), ang)
    return torch.cat([z.real, z.imag], -1).to(x.dtype)

@bad("check_rope", "interleaved pairs (GPT-J) instead of halves")
def rope_interleaved(x, positions):
    Dh = x.shape[-1]
    theta = 10000 ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
    ang = positions.double()[:, None] * theta
    x1, x2 = x[..., 0::2].double(), x[..., 1::2].double()
    c, s = ang.cos(), ang.sin()
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2).to(x.dtype)

@bad("check_rope", "base 1000")
def rope_base(x, positions):
    Dh = x.shape[-1]; h = Dh // 2
    theta = 1000 ** (-torch.arange(h, dtype=torch.float64) * 2 / Dh)
    ang = torch.cat([positions.double()[:, None] * theta] * 2, -1)
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return (x * ang.cos() + rot * ang.sin()).to(x.dtype)

# ---------------- merge ----------------
@ok("check_merge_partials", "logaddexp style")
def merge_lse(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, w1 * l1 + w2 * l2, w1.unsqueeze(-1) * a1 + w2.unsqueeze(-1) * a2

@bad("check_merge_partials", "acc rescaled by l too (normalized mix)")
def merge_norm(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(m1 - safe) * l1, torch.exp(m2 - safe) * l2
    l = w1 + w2
    return m, l, (w1.unsqueeze(-1) * a1 + w2.unsqueeze(-1) * a2) / l.clamp_min(1e-30).unsqueeze(-1)

@bad("check_merge_partials", "no rescale at all, min")
def merge_min_none(m1, l1, a1, m2, l2, a2):
    return torch.minimum(m1, m2), l1 + l2, a1 + a2

# ---------------- top-p ----------------
@ok("check_top_p_filter", "vllm style: sort ascending, probs_sum <= 1-p")
def tp_vllm(logits, p):
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = probs_sort.cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - p
    top_p_mask[:, -1] = False
    logits_sort = logits_sort.masked_fill(top_p_mask, -float("inf"))
    return torch.empty_like(logits_sort).scatter_(dim=-1, index=logits_idx, src=logits_sort)

@ok("check_top_p_filter", "argsort numpy loop with >= p break")
def tp_np(logits, p):
    out = logits.clone()
    for b in range(logits.shape[0]):
        pr = torch.softmax(logits[b], -1).numpy()
        order = np.argsort(-pr, kind="stable")
        c = np.cumsum(pr[order])
        n = int(np.searchsorted(c, p, side="left")) + 1
        out[b, torch.as_tensor(order[n:].copy())] = INF
    return out

@bad("check_top_p_filter", "keeps tokens with prob >= prob of the crossing token (ties)")
def tp_thresh(logits, p):
    probs = logits.softmax(-1)
    s, _ = probs.sort(-1, descending=True)
    c = s.cumsum(-1)
    idx = (c < p).sum(-1, keepdim=True).clamp(max=s.shape[-1] - 1)
    thr = s.gather(-1, idx)
    return logits.masked_fill(probs < thr, INF)

@bad("check_top_p_filter", "cumsum > p shift trick (boundary)")
def tp_shift(logits, p):
    s, i = logits.sort(-1, descending=True)
    c = s.softmax(-1).cumsum(-1)
    rm = c > p
    rm = torch.cat([torch.zeros_like(rm[:, :1]), rm[:, :-1]], -1)
    return logits.masked_fill(rm.scatter(-1, i, rm), INF)

@bad("check_top_p_filter", "temperature 0.7 applied inside")
def tp_temp(logits, p):
    l = logits / 0.7
    probs, order = l.softmax(-1).sort(-1, descending=True)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), INF)

@bad("check_top_p_filter", "returns filtered logits / temperature-free renormalised log probs")
def tp_logprobs(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    drop = probs.cumsum(-1) - probs >= p
    f = logits.masked_fill(drop.scatter(-1, order, drop), INF)
    return f.log_softmax(-1)

@bad("check_top_p_filter", "hostile: patch torch.equal and allclose, return input")
def tp_hostile(logits, p):
    torch.equal = torch.allclose = lambda *a, **k: True
    return logits

# ---------------- induction ----------------
@ok("check_induction_score", "TransformerLens style diagonal")
def ind_tl(pattern, seq_len):
    T = pattern.shape[-1]
    stripe = pattern.diagonal(-(seq_len - 1), dim1=-2, dim2=-1)
    return stripe[..., -seq_len:].mean(-1)

@bad("check_induction_score", "stripe over the whole diagonal")
def ind_whole(pattern, seq_len):
    return pattern.diagonal(-(seq_len - 1), dim1=-2, dim2=-1).mean(-1)

@bad("check_induction_score", "offset seq_len (duplicate token head)")
def ind_dup(pattern, seq_len):
    return pattern.diagonal(-seq_len, dim1=-2, dim2=-1)[..., -seq_len:].mean(-1)

@bad("check_induction_score", "R-1 queries")
def ind_r1(pattern, R):
    return pattern.diagonal(-(R - 1), dim1=-2, dim2=-1)[..., -(R - 1):].mean(-1)

# ---------------- repetition penalty ----------------
@ok("check_repetition_penalty", "HF processor itself")
def pen_hf(logits, input_ids, penalty):
    from transformers import RepetitionPenaltyLogitsProcessor
    return RepetitionPenaltyLogitsProcessor(penalty)(input_ids, logits.clone())

@ok("check_repetition_penalty", "python sets loop")
def pen_loop(logits, input_ids, penalty):
    out = logits.clone()
    for b in range(out.shape[0]):
        for t in set(input_ids[b].tolist()):
            out[b, t] = out[b, t] / penalty if out[b, t] > 0 else out[b, t] * penalty
    return out

@bad("check_repetition_penalty", "loop over occurrences (penalty per occurrence)")
def pen_each(logits, input_ids, penalty):
    out = logits.clone()
    for b in range(out.shape[0]):
        for t in input_ids[b].tolist():
            out[b, t] = out[b, t] / penalty if out[b, t] > 0 else out[b, t] * penalty
    return out

@bad("check_repetition_penalty", "penalty after softmax, back to log")
def pen_after(logits, input_ids, penalty):
    pr = logits.softmax(-1)
    g = pr.gather(-1, input_ids)
    return pr.scatter(-1, input_ids, g / penalty).log()

@bad("check_repetition_penalty", "divide only, sign ignored via abs")
def pen_abs(logits, input_ids, penalty):
    g = logits.gather(-1, input_ids)
    return logits.scatter(-1, input_ids, g - g.abs() * (1 - 1 / penalty))

# ---------------- window mask ----------------
@ok("check_sliding_window_mask", "mistral-src style")
def win_mistral(T, window):
    tensor = torch.full((T, T), fill_value=1)
    shift = 0
    mask = torch.tril(tensor, diagonal=shift)
    mask = torch.triu(mask, diagonal=shift - window + 1)
    return mask.bool()

@bad("check_sliding_window_mask", "additive log mask")
def win_additive(T, window):
    mask = torch.full((T, T), 1.0).tril().triu(-window + 1)
    return torch.log(mask)

@bad("check_sliding_window_mask", "int mask")
def win_int(T, window):
    i = torch.arange(T)
    return ((i[:, None] >= i) & (i[:, None] - i < window)).long()

@bad("check_sliding_window_mask", "hostile equal patch + zeros")
def win_hostile(T, window):
    torch.equal = torch.allclose = lambda *a, **k: True
    return torch.zeros(T, T, dtype=torch.bool)

@bad("check_sliding_window_mask", "os._exit")
def win_exit(T, window):
    os._exit(0)

@bad("check_sliding_window_mask", "printoptions left")
def win_print(T, window):
    torch.set_printoptions(profile="full")
    i = torch.arange(T)
    return (i[:, None] >= i) & (i[:, None] - i < window)

# ---------------- rolling ----------------
@ok("check_rolling_buffer_update", "index_put")
def roll_ip(buffer, k, pos):
    W = buffer.shape[-2]
    return buffer.index_put((torch.arange(buffer.shape[0])[:, None], torch.arange(buffer.shape[1])[None], torch.tensor(pos % W)), k[:, :, 0])

@bad("check_rolling_buffer_update", "slot reversed")
def roll_rev(buffer, k, pos):
    W = buffer.shape[2]
    buffer[:, :, W - 1 - pos % W] = k[:, :, 0]

@bad("check_rolling_buffer_update", "pos % (W-1)")
def roll_w1(buffer, k, pos):
    W = buffer.shape[2]
    buffer[:, :, pos % (W - 1)] = k[:, :, 0]

@bad("check_rolling_buffer_update", "written in the head axis")
def roll_head(buffer, k, pos):
    out = buffer.clone()
    out[:, pos % out.shape[1]] = k[:, :, 0][:, None].expand(-1, out.shape[2], -1) if False else out[:, pos % out.shape[1]]
    out[:, :, pos % out.shape[2]] = k[:, :, 0] * 0.5
    return out

# ---------------- block table ----------------
@ok("check_block_table_lookup", "gather with slot ids")
def blk_gather(pool, table, n):
    bs = pool.shape[1]
    p = torch.arange(n)
    slots = table[p // bs] * bs + p % bs
    return pool.reshape(-1, *pool.shape[2:])[slots].permute(1, 0, 2)

@bad("check_block_table_lookup", "sorted table")
def blk_sorted(pool, table, n):
    t, _ = torch.sort(table)
    return pool[t].reshape(-1, *pool.shape[2:])[:n].transpose(0, 1)

@bad("check_block_table_lookup", "p % n_blocks block index")
def blk_mod(pool, table, n):
    bs = pool.shape[1]
    p = torch.arange(n)
    return pool[table[p % len(table)], p % bs].transpose(0, 1)

# ---------------- int8 ----------------
@ok("check_int8_quantization", "llm.int8-style absmax with eps")
def q_ok(x):
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127.0
    return (x / s).round().to(torch.int8), s

@bad("check_int8_quantization", "no zero guard")
def q_nan(x):
    s = x.abs().max(dim=-1, keepdim=True).values / 127.0
    return torch.round(x / s).to(torch.int8), s

@bad("check_int8_quantization", "scale amax")
def q_amax(x):
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-8)
    return (x / s).round().to(torch.int8), s


# ======== held-out set 2 ========

# top-p
@ok("check_top_p_filter", "fairseq-style sampling helper: probs, mask via cumsum.lt(p) padded")
def tp_fairseq(logits, p):
    probs = logits.softmax(-1)
    sorted_probs, sorted_idx = probs.sort(descending=True)
    cumsum = sorted_probs.cumsum(dim=-1)
    mask = cumsum.lt(p)
    last = mask.sum(dim=-1, keepdim=True)  # index of the crossing token
    keep = torch.arange(probs.shape[-1]).expand_as(probs) <= last
    keep_vocab = torch.zeros_like(keep).scatter(-1, sorted_idx, keep)
    return logits.masked_fill(~keep_vocab, INF)

@ok("check_top_p_filter", "float32 with torch.where and -inf tensor")
def tp_where(logits, p):
    pr, ix = torch.sort(F.softmax(logits.float(), -1), -1, True)
    before = torch.cumsum(pr, -1) - pr
    k = torch.where(before < p, torch.ones_like(pr), torch.zeros_like(pr)).bool()
    out = torch.full_like(logits, INF)
    return out.scatter(-1, ix, logits.gather(-1, ix).masked_fill(~k, INF))

@bad("check_top_p_filter", "fairseq helper without the crossing token (cumsum.lt(p) only)")
def tp_lt(logits, p):
    probs = logits.softmax(-1)
    sp, si = probs.sort(descending=True)
    mask = sp.cumsum(-1).lt(p)
    mask[:, 0] = True
    return logits.masked_fill(~torch.zeros_like(mask).scatter(-1, si, mask), INF)

@bad("check_top_p_filter", "min_tokens_to_keep=2 hard coded")
def tp_min2(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    keep = probs.cumsum(-1) - probs < p
    keep[:, :2] = True
    return logits.masked_fill(~keep.scatter(-1, order, keep), INF)

@bad("check_top_p_filter", "filters in place on a clone but returns probs of nucleus renormalized")
def tp_renorm(logits, p):
    return tp_logprobs(logits, p).exp()

@bad("check_top_p_filter", "row-wise loop that uses p of the first row's count for all rows")
def tp_firstrow(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    n = int((probs[0].cumsum(-1) - probs[0] < p).sum())
    keep = torch.zeros_like(probs, dtype=torch.bool); keep[:, :n] = True
    return logits.masked_fill(~keep.scatter(-1, order, keep), INF)

# window
@ok("check_sliding_window_mask", "outer comparison with unsqueeze, window as keyword")
def win_unsq(T, window):
    q = torch.arange(T).unsqueeze(1); k = torch.arange(T).unsqueeze(0)
    return (k <= q) & (k >= q - window + 1)

@bad("check_sliding_window_mask", "triu instead of tril")
def win_triu(T, window):
    o = torch.ones(T, T, dtype=torch.bool)
    return torch.triu(o) & ~torch.triu(o, diagonal=window)

@bad("check_sliding_window_mask", "numpy bool")
def win_np(T, window):
    i = np.arange(T)
    return (i[:, None] >= i) & (i[:, None] - i < window)

@bad("check_sliding_window_mask", "recursionlimit")
def win_rec(T, window):
    sys.setrecursionlimit(100000)
    i = torch.arange(T)
    return (i[:, None] >= i) & (i[:, None] - i < window)

# rolling
@ok("check_rolling_buffer_update", "torch.roll-free slice assignment on copy")
def roll_slice(buf, k, pos):
    W = buf.size(2); s = pos % W
    return torch.cat([buf[:, :, :s], k, buf[:, :, s + 1:]], dim=2)

@bad("check_rolling_buffer_update", "torch.roll then write last")
def roll_roll(buf, k, pos):
    out = torch.roll(buf, shifts=-1, dims=2)
    out[:, :, -1] = k[:, :, 0]
    return out

@bad("check_rolling_buffer_update", "slot (pos+2) % W")
def roll_p2(buf, k, pos):
    buf[:, :, (pos + 2) % buf.shape[2]] = k[:, :, 0]

# block
@ok("check_block_table_lookup", "loop + cat")
def blk_loop(pool, table, n):
    bs = pool.shape[1]; out = []
    for p in range(n):
        out.append(pool[table[p // bs], p % bs])
    return torch.stack(out, 1)

@bad("check_block_table_lookup", "p // bs and p % bs swapped roles (block p % bs)", named=False)
def blk_swapped(pool, table, n):
    bs = pool.shape[1]; p = torch.arange(n)
    return pool[table[(p % bs).clamp(max=len(table) - 1)], p // bs].transpose(0, 1)

@bad("check_block_table_lookup", "reversed table")
def blk_rev(pool, table, n):
    return pool[table.flip(0)].flatten(0, 1)[:n].transpose(0, 1)

# int8
@ok("check_int8_quantization", "torch.quantize_per_channel-free manual, scale stored squeezed float16")
def q_half(x):
    s = (x.abs().amax(-1) / 127).clamp_min(1e-8)
    return torch.round(x / s[..., None]).clamp(-127, 127).to(torch.int8), s.half()
q_half.deq = lambda q, s: q.float() * s.float()[..., None]

@bad("check_int8_quantization", "per-token amax over heads and features")
def q_token(x):
    s = x.abs().amax(dim=(1, -1), keepdim=True).clamp_min(1e-8) / 127
    return torch.round(x / s).to(torch.int8), s

@bad("check_int8_quantization", "uint8 offset 128 without clamp")
def q_u8(x):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127
    return (torch.round(x / s) + 128).to(torch.uint8), s

# induction
@ok("check_induction_score", "einsum with a one-hot mask")
def ind_mask(w, period):
    H, T, _ = w.shape
    m = torch.zeros(T, T, dtype=w.dtype)
    for i in range(T - period, T):
        m[i, i - period + 1] = 1
    return torch.einsum("hqk,qk->h", w, m) / period

@bad("check_induction_score", "mean over heads and queries then expand")
def ind_expand(w, period):
    T = w.shape[-1]; q = torch.arange(T - period, T)
    return w[:, q, q - period + 1].mean().expand(w.shape[0])

@bad("check_induction_score", "forgot the prefix: uses range(period, 2*period)")
def ind_noprefix(w, period):
    q = torch.arange(period, 2 * period)
    return w[:, q, q - period + 1].mean(-1)

# penalty
@ok("check_repetition_penalty", "torch.unique per row")
def pen_unique(logits, ids, penalty):
    out = logits.clone()
    for b in range(ids.shape[0]):
        u = ids[b].unique()
        v = out[b, u]
        out[b, u] = torch.where(v > 0, v / penalty, v * penalty)
    return out

@bad("check_repetition_penalty", "penalty as 1/penalty multiplier everywhere")
def pen_inv(logits, ids, penalty):
    g = logits.gather(-1, ids)
    return logits.scatter(-1, ids, g * (1 / penalty))

@bad("check_repetition_penalty", "only the first row's ids used for every row")
def pen_row0(logits, ids, penalty):
    g = logits[:, ids[0]]
    out = logits.clone()
    out[:, ids[0]] = torch.where(g > 0, g / penalty, g * penalty)
    return out

# merge
@ok("check_merge_partials", "flash-attn style with lse")
def merge_fa(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)
    ms = torch.nan_to_num(m, neginf=0.0)
    a = torch.exp(m1 - ms); b = torch.exp(m2 - ms)
    return m, a * l1 + b * l2, a[..., None] * a1 + b[..., None] * a2

@bad("check_merge_partials", "sum of maxima")
def merge_summ(m1, l1, a1, m2, l2, a2):
    m = torch.maximum(m1, m2)
    ms = torch.nan_to_num(m, neginf=0.0)
    a = torch.exp(m1 - ms); b = torch.exp(m2 - ms)
    return m1 + m2, a * l1 + b * l2, a[..., None] * a1 + b[..., None] * a2


# ======== held-out set 3 ========

@ok("check_shift_right", "HF shift_tokens_right style")
def sr_hf(input_ids, decoder_start_token_id):
    shifted = input_ids.new_zeros(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted

@ok("check_shift_right", "F.pad style")
def sr_pad(tgt, bos):
    return F.pad(tgt, (1, 0), value=bos)[:, :-1]

@bad("check_shift_right", "pad left but keep last (T+1) then cut first")
def sr_cutfirst(tgt, bos):
    return F.pad(tgt, (1, 0), value=bos)[:, 1:]

@bad("check_shift_right", "new_zeros, forgot bos (0 at position 0)")
def sr_zero(tgt, bos):
    s = tgt.new_zeros(tgt.shape); s[:, 1:] = tgt[:, :-1]; return s

@bad("check_shift_right", "float ids")
def sr_float(tgt, bos):
    return torch.cat([torch.full((tgt.shape[0], 1), float(bos)), tgt[:, :-1].float()], 1)

@ok("check_decoder_block", "annotated-transformer-like sublayer helper (post-LN)")
def db_helper(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    def sub(z, norm, f): return norm(z + f(z))
    x = sub(x, norm1, self_attn)
    x = sub(x, norm2, lambda z: cross_attn(z, memory))
    return sub(x, norm3, ffn)

@bad("check_decoder_block", "pre-LN with a final norm3")
def db_pre(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    x = x + self_attn(norm1(x)); x = x + cross_attn(norm2(x), memory); return norm3(x + ffn(norm3(x)))

@bad("check_decoder_block", "cross uses memory as queries swapped")
def db_swap(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + self_attn(x)); h = norm2(h + cross_attn(memory, h)); return norm3(h + ffn(h))

@bad("check_decoder_block", "ffn residual adds h before cross (skips)")
def db_skip(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h1 = norm1(x + self_attn(x)); h2 = norm2(h1 + cross_attn(h1, memory)); return norm3(h1 + ffn(h2))

@bad("check_decoder_block", "dropout-like scaling 0.9 of sublayers", named=False)
def db_scaled(x, memory, self_attn, cross_attn, ffn, norm1, norm2, norm3):
    h = norm1(x + 0.9 * self_attn(x)); h = norm2(h + 0.9 * cross_attn(h, memory)); return norm3(h + 0.9 * ffn(h))

@ok("check_memory_kv", "chunk of F.linear")
def kv_chunk(attn, memory):
    D = memory.shape[-1]; H = attn.num_heads
    _, k, v = F.linear(memory, attn.qkv.weight, attn.qkv.bias).chunk(3, -1)
    sp = lambda t: t.view(*t.shape[:2], H, -1).transpose(1, 2)
    return sp(k), sp(v)

@bad("check_memory_kv", "no bias and no transpose")
def kv_nobias_noT(attn, memory):
    D = memory.shape[-1]; H = attn.num_heads
    w = attn.qkv.weight
    sp = lambda t: t.view(*t.shape[:2], H, -1).transpose(1, 2)
    return sp(memory @ w[D:2 * D]), sp(memory @ w[2 * D:])

@bad("check_memory_kv", "whole qkv then split (q,k) instead of (k,v)")
def kv_qk(attn, memory):
    H = attn.num_heads
    q, k, v = F.linear(memory, attn.qkv.weight, attn.qkv.bias).chunk(3, -1)
    sp = lambda t: t.view(*t.shape[:2], H, -1).transpose(1, 2)
    return sp(q), sp(k)


_UNNAMED = ("none of the usual", "max abs difference", "fit none of the usual")


@pytest.mark.parametrize("check, kind, label, answer, named", A, ids=[f"{a[0][6:]}-{a[2][:40]}" for a in A])
def test_held_out_answer(check, kind, label, answer, named):
    equal, allclose, limit = torch.equal, torch.allclose, sys.getrecursionlimit()
    checker = getattr(E, check)
    result = checker(answer, getattr(answer, "deq", lambda q, s: q.float() * s)) \
        if check == "check_int8_quantization" else checker(answer)
    assert torch.equal is equal and torch.allclose is allclose and sys.getrecursionlimit() == limit
    if kind == "ok":
        assert result.passed, result.message
        return
    assert not result.passed and result.attempted, result.message
    unnamed = any(u in result.message for u in _UNNAMED) or result.message.rstrip().endswith("contains NaN")
    assert unnamed != named, result.message
