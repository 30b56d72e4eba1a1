"""Chapter 12's checkers against answers written in other courses' and libraries' styles (transformers'
own warper and processor, numpy, searchsorted, loops, float32, keyword-heavy signatures) and against
realistic bugs, each of which must be refused with its mistake named."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import RepetitionPenaltyLogitsProcessor, TopPLogitsWarper

from attnlib.exercises import check_induction_score, check_repetition_penalty, check_top_p_filter
from exercise_helpers import assert_names

INF = float("-inf")


# --- top-p: correct in other styles ---------------------------------------------------------------

def tp_hf_warper(logits, p):                                  # the library's own class
    return TopPLogitsWarper(p)(None, logits.clone())


def tp_float32_scatter(logits, p):
    x = logits.float()
    probs, idx = x.softmax(-1).sort(-1, descending=True)
    keep = probs.cumsum(-1) - probs < p
    return torch.full_like(x, INF).scatter(-1, idx, torch.where(keep, x.gather(-1, idx), torch.tensor(INF)))


def tp_searchsorted(logits, p):
    probs, idx = logits.softmax(-1).sort(-1, descending=True)
    cum = probs.cumsum(-1)
    n = torch.searchsorted(cum, torch.full((cum.shape[0], 1), p, dtype=cum.dtype)) + 1
    keep = torch.arange(cum.shape[-1]) < n
    return logits.masked_fill(~keep.scatter(-1, idx, keep), INF)


def tp_numpy(logits, p):
    x = logits.numpy()
    pr = np.exp(x - x.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    order = np.argsort(-pr, -1)
    sp = np.take_along_axis(pr, order, -1)
    keep = np.zeros(sp.shape, dtype=bool)
    np.put_along_axis(keep, order, np.cumsum(sp, -1) - sp < p, -1)
    return torch.from_numpy(np.where(keep, x, -np.inf))


def tp_row_by_row(logits, p, min_tokens_to_keep=1, filter_value=-float("inf")):   # the 2019 gist, one row at a time
    rows = []
    for row in logits:
        sorted_logits, sorted_indices = torch.sort(row, descending=True)
        remove = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > p
        remove[1:] = remove[:-1].clone()
        remove[0] = False
        row = row.clone()
        row[sorted_indices[remove]] = filter_value
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("answer", [tp_hf_warper, tp_float32_scatter, tp_searchsorted, tp_numpy])
def test_top_p_accepts_other_styles(answer):
    result = check_top_p_filter(answer)
    assert result.passed, result.message


# --- top-p: realistic bugs ------------------------------------------------------------------------

def _sorted(logits):
    return logits.softmax(-1).sort(-1, descending=True)


def tp_one_too_many(logits, p):
    probs, idx = _sorted(logits)
    keep = torch.arange(probs.shape[-1]) < (probs.cumsum(-1) < p).sum(-1, keepdim=True) + 2
    return logits.masked_fill(~keep.scatter(-1, idx, keep), INF)


def tp_gather_back(logits, p):
    probs, idx = _sorted(logits)
    return logits.masked_fill((probs.cumsum(-1) - probs >= p).gather(-1, idx), INF)


def tp_gist_on_a_batch(logits, p):                           # indices of every row removed from every row
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    remove = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    out = logits.clone()
    out[:, sorted_indices[remove]] = INF
    return out


def tp_unnormalized_probs(logits, p):
    return logits.softmax(-1).masked_fill(TopPLogitsWarper(p)(None, logits.clone()).isinf(), 0.0)


def tp_zero_fill(logits, p):
    return logits.masked_fill(TopPLogitsWarper(p)(None, logits.clone()).isinf(), 0.0)


def tp_hf_comparison_flipped(logits, p):
    sorted_logits, idx = torch.sort(logits)
    remove = sorted_logits.softmax(-1).cumsum(-1) > 1 - p
    return logits.masked_fill(remove.scatter(1, idx, remove), INF)


def tp_fraction_of_vocab(logits, p):
    k = max(1, int(p * logits.shape[-1]))
    return logits.masked_fill(logits < logits.topk(k, -1).values[:, -1:], INF)


@pytest.mark.parametrize("buggy, phrase", [
    (tp_one_too_many, "one token too many"), (tp_gather_back, "put back with gather"),
    (tp_gist_on_a_batch, "removed from every row"), (tp_unnormalized_probs, "not renormalized"),
    (tp_zero_fill, "set to 0 instead of -inf"), (tp_hf_comparison_flipped, "comparison reversed"),
    (tp_fraction_of_vocab, "fraction of the vocabulary"),
    (tp_row_by_row, "the mass before it is <= p"),        # the 2019 gist: one token too many at exactly p
])
def test_top_p_names_realistic_bugs(buggy, phrase):
    assert_names(check_top_p_filter(buggy), phrase)


# --- induction score ------------------------------------------------------------------------------

def ind_lens_style(pattern, seq_len):                         # a diagonal, then the second block's part of it
    return pattern.diagonal(-seq_len + 1, dim1=-2, dim2=-1)[..., -seq_len:].mean(-1)


def ind_float32_python(weights, period):
    H, T, _ = weights.shape
    return torch.tensor([sum(float(weights[h, i, i - period + 1]) for i in range(T - period, T)) / period
                         for h in range(H)], dtype=torch.float32)


def ind_slice_then_diagonal(weights, period):
    T = weights.shape[-1]
    return weights[:, T - period:].diagonal(offset=T - 2 * period + 1, dim1=1, dim2=2).mean(-1)


def ind_batch_ready(attn_weights, seq_len, prefix=None):      # also takes (B, H, T, T)
    w = attn_weights[None] if attn_weights.dim() == 3 else attn_weights
    q = torch.arange(w.shape[-1] - seq_len, w.shape[-1])
    return w[..., q, q - seq_len + 1].mean(-1).squeeze(0)


@pytest.mark.parametrize("answer", [ind_lens_style, ind_float32_python, ind_slice_then_diagonal, ind_batch_ready])
def test_induction_accepts_other_styles(answer):
    result = check_induction_score(answer)
    assert result.passed, result.message


def _second_block(weights, period, key_shift):
    T = weights.shape[-1]
    q = torch.arange(T - period, T)
    return weights[:, q, q - key_shift]


@pytest.mark.parametrize("buggy, phrase", [
    (lambda w, p: w.diagonal(-p + 1, dim1=-2, dim2=-1).mean(-1), "first block included"),   # the whole stripe
    (lambda w, p: w[:, w.shape[-1] - p:].diagonal(offset=1, dim1=1, dim2=2).mean(-1), "prefix left out"),
    (lambda w, p: _second_block(w, p, p - 1).amax(-1), "maximum over the queries"),
    (lambda w, p: _second_block(w, p, p - 2).mean(-1), "key i - 5 for each query"),
    (lambda w, p: _second_block(w, p, 0).mean(-1), "key i - 0 for each query"),
])
def test_induction_names_realistic_bugs(buggy, phrase):
    assert_names(check_induction_score(buggy), phrase)


# --- repetition penalty ---------------------------------------------------------------------------

def pen_hf_processor(logits, input_ids, penalty):
    return RepetitionPenaltyLogitsProcessor(penalty)(input_ids, logits.clone())


def pen_float32_unique(logits, input_ids, penalty):
    out = logits.float().clone()
    for b in range(len(out)):
        ids = input_ids[b].unique()
        v = out[b, ids]
        out[b, ids] = torch.where(v < 0, v * penalty, v / penalty)
    return out


def pen_keywords(scores, ids, theta=1.2):
    seen = torch.zeros_like(scores).scatter_(1, ids, 1.0).bool()
    return torch.where(seen, torch.where(scores > 0, scores / theta, scores * theta), scores)


def pen_index_put(logits, input_ids, penalty):
    rows = torch.arange(logits.shape[0])[:, None].expand_as(input_ids)
    s = logits[rows, input_ids]
    return logits.index_put((rows, input_ids), torch.where(s > 0, s / penalty, s * penalty))


def pen_bincount(logits, input_ids, penalty):
    counts = torch.stack([torch.bincount(r, minlength=logits.shape[-1]) for r in input_ids])
    return torch.where(counts > 0, logits * torch.where(logits > 0, 1.0 / penalty, penalty), logits)


@pytest.mark.parametrize("answer", [pen_hf_processor, pen_float32_unique, pen_keywords, pen_index_put, pen_bincount])
def test_penalty_accepts_other_styles(answer):
    result = check_repetition_penalty(answer)
    assert result.passed, result.message


def _seen(logits, ids):
    return torch.zeros_like(logits, dtype=torch.bool).scatter(1, ids, True)


@pytest.mark.parametrize("buggy, phrase", [
    (lambda input_ids, scores, penalty: pen_hf_processor(scores, input_ids, penalty), "your first parameter is named"),
    (lambda l, i, p: torch.where(_seen(l, i), l * p, l), "multiplied by the penalty, whatever its sign"),
    (lambda l, i, p: torch.where(_seen(l, i) & (l > 0), l / p, l), "only the positive logits"),
    (lambda l, i, p: pen_hf_processor(l, torch.arange(i.shape[1]).expand_as(i), p), "positions 0 .. T - 1"),
    (lambda l, i, p: pen_hf_processor(l, i, p).log_softmax(-1), "log-probabilities"),
])
def test_penalty_names_realistic_bugs(buggy, phrase):
    assert_names(check_repetition_penalty(buggy), phrase)


# --- hostile code: refused, and torch's global state as it was ------------------------------------

def _state():
    return (torch.get_default_dtype(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.get_num_threads())


@pytest.mark.parametrize("check", [check_top_p_filter, check_induction_score, check_repetition_penalty])
@pytest.mark.parametrize("hostile, phrase", [
    (lambda *a: torch.set_default_dtype(torch.float64) or a[0], "set_default_dtype"),
    (lambda *a: torch.set_grad_enabled(False) and a[0], "switched autograd off"),
    (lambda *a: torch.use_deterministic_algorithms(True) or a[0], "use_deterministic_algorithms"),
    (lambda *a: exec("import sys; sys.exit(2)"), "sys.exit(2)"),
])
def test_hostile_answers_are_refused_and_state_restored(check, hostile, phrase):
    before = _state()
    assert_names(check(hostile), phrase)
    assert _state() == before


def test_a_hang_is_stopped():
    from attnlib.exercises._guard import limited_to

    def hangs(*args):
        while True:
            pass
    with limited_to(0.5):
        assert_names(check_repetition_penalty(hangs), "did not return within 0.5 s")
