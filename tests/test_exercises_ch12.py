"""Chapter 12's checkers: correct answers in several styles pass, each classic mistake is named, stubs and
crashes are handled."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import check_induction_score, check_repetition_penalty, check_top_p_filter
from exercise_helpers import assert_names, stub


# --- top-p ---------------------------------------------------------------------------------------

def top_p_sorted_desc(logits, p):                       # the book's way
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def top_p_hf_style(logits, p):                          # transformers' TopPLogitsWarper: ascending, 1 - p
    sorted_logits, idx = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(1, idx, remove), -float("Inf"))


def top_p_shift_right(logits, p):                       # the older "shift the mask right by one" recipe
    sorted_logits, sorted_idx = torch.sort(logits, descending=True)
    cum = F.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    remove = cum > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    out = logits.clone()
    for b in range(logits.shape[0]):
        out[b, sorted_idx[b][remove[b]]] = -1e9          # a large negative number instead of -inf
    return out


def top_p_loops(logits, p):                             # plain Python, finfo.min for removed
    out = torch.full_like(logits, torch.finfo(logits.dtype).min)
    for b, row in enumerate(logits):
        probs = torch.softmax(row, 0).tolist()
        total = 0.0
        for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
            if total >= p:
                break
            out[b, i], total = row[i], total + probs[i]
    return out


@pytest.mark.parametrize("answer", [top_p_sorted_desc, top_p_hf_style, top_p_loops])
def test_top_p_accepts_correct_answers(answer):
    result = check_top_p_filter(answer)
    assert result.passed, result.message


def _keep_sorted(logits, p, rule):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    keep = rule(probs)
    return logits.masked_fill(~keep.scatter(-1, order, keep), float("-inf"))


@pytest.mark.parametrize("buggy, phrases", [
    (lambda l, p: _keep_sorted(l, p, lambda s: s.cumsum(-1) <= p), ["token that crosses p is dropped"]),
    (lambda l, p: l.masked_fill(l.softmax(-1).cumsum(-1) - l.softmax(-1) >= p, float("-inf")), ["its own order"]),
    (lambda l, p: (lambda s, o: l.masked_fill(~(s.cumsum(-1) - s < p).scatter(-1, o, s.cumsum(-1) - s < p),
                                               float("-inf")))(*l.softmax(-1).sort(-1)), ["sorted ascending"]),
    (lambda l, p: l.masked_fill(l.softmax(-1) < p, float("-inf")), ["min-p-like"]),
    (lambda l, p: top_p_sorted_desc(l, p).sort(-1, descending=True).values, ["left in sorted order"]),
    (lambda l, p: l.masked_fill(l.softmax(0).cumsum(0) - l.softmax(0) >= p, float("-inf")), ["batch axis (dim=0)"]),
    (lambda l, p: top_p_sorted_desc(l, p).softmax(-1), ["returned probabilities"]),
    (lambda l, p: top_p_sorted_desc(l, p).log_softmax(-1), ["changes their logits"]),
    (lambda l, p: torch.full_like(l, float("-inf")), ["removed every token of a row"]),
    (lambda l, p: top_p_sorted_desc(l, p).float().half(), ["half precision"]),
    (lambda l, p: l.copy_(top_p_sorted_desc(l, p)), ["changed l in place"]),
])
def test_top_p_names_the_mistake(buggy, phrases):
    assert_names(check_top_p_filter(buggy), *phrases)


def top_p_keeps_ties(logits, p):                         # a threshold on the last kept probability
    probs = logits.softmax(-1)
    desc = probs.sort(-1, descending=True).values
    n = (desc.cumsum(-1) - desc < p).sum(-1, keepdim=True)
    return logits.masked_fill(probs < desc.gather(-1, n - 1), float("-inf"))


def top_p_sorted_mask_unsorted(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))


def top_p_batch_softmax(logits, p):
    probs, order = logits.softmax(0).sort(-1, descending=True)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


@pytest.mark.parametrize("buggy, phrases", [                # issue 36: ties, the exact boundary, unnamed ones
    (top_p_keeps_ties, ["p=0.66", "every token tied with the last one of the nucleus kept", "TopPLogitsWarper"]),
    (top_p_shift_right, ["p=0.5", "the mass before it is <= p", "shifted right by one"]),
    (top_p_sorted_mask_unsorted, ["mask computed on the sorted probabilities applied to the logits in vocabulary"]),
    (top_p_batch_softmax, ["the softmax over the batch axis (dim=0)"]),
    (lambda l, p: top_p_sorted_desc(l, p * 0.7), ["nucleus of a different p", "instead of p = 0.9"]),
    (lambda l, p: top_p_sorted_desc(l, 1 - p), ["nucleus of 1 - p = 0.1"]),
    (lambda l, p: top_p_sorted_desc(l, p).index_fill(-1, torch.tensor([0]), float("-inf")),
     ["row 3 keeps 9 tokens where its nucleus has 10", "token 0 (the 2nd most likely", "is removed but should be kept"]),
])
def test_top_p_names_ties_boundaries_and_more(buggy, phrases):
    assert_names(check_top_p_filter(buggy), *phrases)


def test_top_p_stub_and_crash():
    assert check_top_p_filter(stub).status == "not attempted yet"
    assert_names(check_top_p_filter(lambda l, p: l.sort(-1).cumsum(-1)), "raised AttributeError")
    assert_names(check_top_p_filter(lambda l, p: l[0]), "has shape (40,), expected (4, 40)")


# --- induction score ----------------------------------------------------------------------------

def induction_loops(weights, period):
    H, T, _ = weights.shape
    total = torch.zeros(H, dtype=weights.dtype)
    for i in range(T - period, T):
        total += weights[:, i, i - period + 1]
    return total / period


def induction_indexing(weights, period):
    q = torch.arange(weights.shape[-1] - period, weights.shape[-1])
    return weights[:, q, q - period + 1].mean(-1)


def induction_einsum(weights, period):
    T = weights.shape[-1]
    pick = torch.zeros(T, T, dtype=weights.dtype)
    for i in range(T - period, T):
        pick[i, i - period + 1] = 1.0 / period
    return torch.einsum("hij,ij->h", weights, pick)


def induction_diagonal(weights, period):
    return torch.diagonal(weights, offset=-(period - 1), dim1=1, dim2=2)[:, -period:].float().mean(dim=1)


@pytest.mark.parametrize("answer", [induction_loops, induction_indexing, induction_einsum, induction_diagonal])
def test_induction_accepts_correct_answers(answer):
    result = check_induction_score(answer)
    assert result.passed, result.message


def _second(weights, period, shift, start=None):
    T = weights.shape[-1]
    q = torch.arange(T - period if start is None else start, T if start is None else start + period)
    return weights[:, q, q - shift].mean(-1)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda w, p: _second(w, p, p), ["earlier occurrence of the query's token itself"]),
    (lambda w, p: _second(w, p, 1), ["previous-token score"]),
    (lambda w, p: _second(w, p, p + 1), ["one before the earlier occurrence"]),
    (lambda w, p: induction_loops(w, p) * p, ["summed over the queries"]),
    (lambda w, p: induction_loops(w.transpose(1, 2), p), ["keys and queries swapped"]),
    (lambda w, p: _second(w, p, p - 1, start=p), ["taken to start at position 0"]),
    (lambda w, p: torch.diagonal(w, offset=-(p - 1), dim1=1, dim2=2).mean(-1), ["first block included"]),
    (lambda w, p: induction_loops(w, p).mean(), ["average over the heads too"]),
])
def test_induction_names_the_mistake(buggy, phrases):
    assert_names(check_induction_score(buggy), *phrases)


def test_induction_stub_and_crash():
    assert check_induction_score(stub).status == "not attempted yet"
    assert_names(check_induction_score(lambda w, p: w[:, p * 3]), "raised IndexError")


# --- repetition penalty -------------------------------------------------------------------------

def penalty_hf_style(logits, input_ids, penalty):      # transformers' RepetitionPenaltyLogitsProcessor
    score = torch.gather(logits, 1, input_ids)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter(1, input_ids, score)


def penalty_loops(logits, input_ids, penalty):
    out = logits.clone()
    for b in range(logits.shape[0]):
        for token in set(input_ids[b].tolist()):
            value = out[b, token].item()
            out[b, token] = value / penalty if value > 0 else value * penalty
    return out


def penalty_one_hot(logits, input_ids, penalty):
    seen = F.one_hot(input_ids, logits.shape[-1]).any(dim=1)
    factor = torch.where(logits > 0, 1 / penalty, penalty)
    return torch.where(seen, logits * factor, logits)


def penalty_isin(logits, input_ids, penalty):
    rows = []
    for row, ids in zip(logits, input_ids):
        seen = torch.isin(torch.arange(len(row)), ids)
        rows.append(torch.where(seen & (row > 0), row / penalty, torch.where(seen, row * penalty, row)))
    return torch.stack(rows)


@pytest.mark.parametrize("answer", [penalty_hf_style, penalty_loops, penalty_one_hot, penalty_isin])
def test_penalty_accepts_correct_answers(answer):
    result = check_repetition_penalty(answer)
    assert result.passed, result.message


def penalty_per_occurrence(logits, input_ids, penalty):
    out = logits.clone()
    for b in range(logits.shape[0]):
        for token in input_ids[b].tolist():              # a token seen 3 times is penalized 3 times
            out[b, token] = out[b, token] / penalty if out[b, token] > 0 else out[b, token] * penalty
    return out


def _seen(logits, ids):
    return torch.zeros_like(logits, dtype=torch.bool).scatter(1, ids, True)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda l, i, p: torch.where(_seen(l, i), l / p, l), ["whatever its sign", "more* likely"]),
    (lambda l, i, p: penalty_per_occurrence(l, i, p), ["once per occurrence"]),
    (lambda l, i, p: torch.where(~_seen(l, i), torch.where(l > 0, l / p, l * p), l), ["did *not* occur"]),
    (lambda l, i, p: torch.where(_seen(l, i).any(0), torch.where(l > 0, l / p, l * p), l), ["tokens of all rows"]),
    (lambda l, i, p: torch.where(_seen(l, i), l - p, l), ["subtracted"]),
    (lambda l, i, p: torch.where(_seen(l, i), torch.where(l > 0, l * p, l / p), l), ["signs swapped"]),
    (lambda l, i, p: penalty_hf_style(l, i[:, -1:], p), ["only the last token"]),
    (lambda l, i, p: l.scatter_(1, i, 0.0), ["changed l in place"]),
])
def test_penalty_names_the_mistake(buggy, phrases):
    assert_names(check_repetition_penalty(buggy), *phrases)


def test_penalty_stub_and_crash():
    assert check_repetition_penalty(stub).status == "not attempted yet"
    assert_names(check_repetition_penalty(lambda l, i, p: l[i]), "has shape")


# --- issue 36: more mistakes named ----------------------------------------------------------------

def _induction_on(queries_of):
    def score(weights, period):
        q = queries_of(weights.shape[-1], period)
        return weights[:, q, q - period + 1].mean(-1)
    return score


@pytest.mark.parametrize("buggy, phrase", [
    (_induction_on(lambda T, R: torch.arange(T - R + 1, T)), "the first query of the second block left out"),
    (_induction_on(lambda T, R: torch.arange(T - R, T - 1)), "the last query of the sequence left out"),
    (_induction_on(lambda T, R: torch.arange(T - 2 * R, T)), "both copies averaged"),
])
def test_induction_names_more_mistakes(buggy, phrase):
    assert_names(check_induction_score(buggy), phrase)


def penalty_scatter_add(logits, input_ids, penalty):
    seen = logits.gather(-1, input_ids)
    return logits.scatter_add(-1, input_ids, torch.where(seen > 0, seen / penalty, seen * penalty) - seen)


def penalty_on(transform):
    def apply(logits, input_ids, penalty):
        x = transform(logits)
        seen = x.gather(-1, input_ids)
        return x.scatter(-1, input_ids, torch.where(seen > 0, seen / penalty, seen * penalty))
    return apply


@pytest.mark.parametrize("buggy, phrase", [
    (penalty_scatter_add, "the change added once per occurrence"),
    (penalty_on(lambda x: x.softmax(-1)), "the penalty applied after the softmax"),
    (penalty_on(lambda x: x.log_softmax(-1)), "the penalty applied to log-probabilities"),
])
def test_penalty_names_more_mistakes(buggy, phrase):
    assert_names(check_repetition_penalty(buggy), phrase)


def penalty_through_probabilities(logits, input_ids, penalty):
    probs = logits.softmax(-1)
    return probs.scatter(-1, input_ids, probs.gather(-1, input_ids) / penalty).log()


def penalty_abs_trick(logits, input_ids, penalty):             # right for positive logits only
    seen = logits.gather(-1, input_ids)
    return logits.scatter(-1, input_ids, seen - seen.abs() * (1 - 1 / penalty))


@pytest.mark.parametrize("buggy, phrases", [
    (penalty_through_probabilities, ["applied to the probabilities and their log returned"]),
    (penalty_abs_trick, ["is wrong in the negative logits of tokens that occurred",
                         "the logits of tokens that did not occur and the positive logits of tokens that occurred are right"]),
])
def test_penalty_names_held_out_styles(buggy, phrases):
    assert_names(check_repetition_penalty(buggy), *phrases)


def test_induction_names_the_head_average_spread_over_heads():       # issue 36, held-out set 2
    def spread(w, period):
        q = torch.arange(w.shape[-1] - period, w.shape[-1])
        return w[:, q, q - period + 1].mean().expand(w.shape[0])
    assert_names(check_induction_score(spread), "gives every head the same score")


def test_top_p_boundary_case_holds_for_a_softmax_without_the_max_subtracted():
    def manual(logits, p):                                     # numpy, exp without the max, a stable loop
        x = logits.numpy()
        probs = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
        out = x.copy()
        for b in range(x.shape[0]):
            total = 0.0
            for t in np.argsort(-probs[b], kind="stable"):
                if total >= p:
                    out[b, t] = -np.inf
                total += probs[b, t]
        return torch.from_numpy(out)
    assert check_top_p_filter(manual).passed
