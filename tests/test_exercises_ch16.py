"""Chapter 16's checkers: correct answers in several styles pass, each classic mistake is named, stubs, crashes,
wrong types and in-place changes are handled, and no checker raises."""

import math

import numpy as np
import pytest
import torch

from attnlib.exercises import check_accept_count, check_admit, check_residual
from attnlib.exercises._guard import limited_to
from attnlib.speculative import accept_reject
from exercise_helpers import assert_names, stub


# --- the accept/reject step ------------------------------------------------------------------------

def accept_loop(p, q, drafts, u):                              # the book's: one draft at a time
    for i, x in enumerate(drafts.tolist()):
        if not u[i] < p[i, x] / q[i, x]:
            return i
    return len(drafts)


def accept_vectorised(p, q, drafts, u):                        # min(1, p/q), cumprod, a 0-d tensor
    k = len(drafts)
    ratio = (p[:k].gather(-1, drafts[:, None]) / q.gather(-1, drafts[:, None]))[:, 0]
    return (u < ratio.clamp(max=1)).long().cumprod(0).sum()


def accept_numpy(target, draft, tokens, draws):                # numpy, other names, a numpy integer back
    t, d, x, r = target.numpy(), draft.numpy(), tokens.numpy(), draws.numpy()
    ok = r * d[np.arange(len(x)), x] < t[np.arange(len(x)), x]
    return np.argmin(ok) if not ok.all() else np.int64(len(x))


def accept_keyword_only(p, q, drafts, *, u):                   # the draws by keyword
    return accept_loop(p, q, drafts, u)


@pytest.mark.parametrize("answer", [accept_loop, accept_vectorised, accept_numpy, accept_keyword_only])
def test_accept_count_accepts_correct_answers(answer):
    result = check_accept_count(answer)
    assert result.passed, result


def test_accept_count_agrees_with_attnlib():
    """attnlib's accept_reject counts the same drafts on a batch (u drawn by the same generator)."""
    g = torch.Generator().manual_seed(3)
    p, q = torch.randn(50, 5, 6, generator=g).softmax(-1), torch.randn(50, 4, 6, generator=g).softmax(-1)
    drafts = torch.multinomial(q.view(-1, 6), 1, generator=g).view(50, 4)
    state = torch.Generator().manual_seed(9)
    u = torch.rand(50, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    accepted, _ = accept_reject(p, q, drafts, state)
    assert accepted.tolist() == [accept_loop(p[n].double(), q[n].double(), drafts[n], u[n]) for n in range(50)]


def _rule(ratio=None, stop=True, shift=0, plus=0):
    def answer(p, q, drafts, u):
        n, k = 0, len(drafts)
        passed = [(ratio or (lambda a, b, r: r * b < a))(float(p[i + shift, x]), float(q[i, x]), float(u[i]))
                  for i, x in enumerate(drafts.tolist())]
        n = sum(passed) if not stop else next((i for i, ok in enumerate(passed) if not ok), k)
        return n + plus if n == k else n
    return answer


@pytest.mark.parametrize("buggy, phrases", [
    (_rule(ratio=lambda a, b, r: r < b / a), ["ratio upside down"]),
    (_rule(ratio=lambda a, b, r: r > a / b), ["above the ratio"]),
    (_rule(stop=False), ["no stop at the first rejection"]),
    (_rule(ratio=lambda a, b, r: a >= b), ["u left out"]),
    (_rule(ratio=lambda a, b, r: r < a), ["q(x) left out"]),
    (_rule(shift=1), ["one position late"]),
    (_rule(plus=1), ["bonus token counted"]),
    (lambda p, q, drafts, u: len(drafts), ["returned"]),
    (lambda p, q, drafts, u: 1.5, ["should return a count"]),
    (lambda p, q, drafts, u: (u < 0.5).long(), ["should return a count"]),
    (lambda p, q, drafts, u: 1 / 0, ["ZeroDivisionError"]),
])
def test_accept_count_names_mistakes(buggy, phrases):
    assert_names(check_accept_count(buggy), *phrases)


def test_accept_count_in_place_and_stub():
    def in_place(p, q, drafts, u):
        u.mul_(0)
        return accept_loop(p, q, drafts, u)
    assert_names(check_accept_count(in_place), "in place")
    result = check_accept_count(stub)
    assert not result.passed and not result.attempted


# --- the residual distribution ----------------------------------------------------------------

def residual_book(p, q):
    r = (p - q).clamp(min=0)
    return r / r.sum(-1, keepdim=True)


def residual_other_normaliser(target, draft):                  # Z = 1 - Σ min(p, q), float32
    r = torch.relu(target - draft).float()
    return r / (1 - torch.minimum(target, draft).sum(-1, keepdim=True)).float()


def residual_numpy(p, q):
    r = np.maximum(p.numpy() - q.numpy(), 0)
    return r / r.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("answer", [residual_book, residual_other_normaliser])
def test_residual_accepts_correct_answers(answer):
    result = check_residual(answer)
    assert result.passed, result


@pytest.mark.parametrize("buggy, phrases", [
    (lambda p, q: (p - q).clamp(min=0), ["not renormalised"]),
    (lambda p, q: p - q, ["without max(0, ·)"]),
    (lambda p, q: residual_book(q, p), ["max(0, q - p)"]),
    (lambda p, q: (p - q).abs() / (p - q).abs().sum(-1, keepdim=True), ["|p - q|"]),
    (lambda p, q: (p - q).clamp(min=0).softmax(-1), ["softmax of max(0, p - q)"]),
    (lambda p, q: p * (q == 0) / (p * (q == 0)).sum(-1, keepdim=True), ["right only for a point-mass draft"]),
    (lambda p, q: p, ["counts the mass min(p, q) twice"]),
    (lambda p, q: residual_book(p, q).half(), ["half precision"]),
    (lambda p, q: residual_book(p, q)[..., :-1], ["has shape"]),
    (lambda p, q: "p", ["should be a torch.Tensor"]),
])
def test_residual_names_mistakes(buggy, phrases):
    assert_names(check_residual(buggy), *phrases)


def test_residual_wrong_dimension_named():
    def dim0(p, q):
        r = (p - q).clamp(min=0)
        return r / r.sum(0, keepdim=True)
    result = check_residual(dim0)
    assert_names(result, "wrong dimension")


# --- admission under a block budget -------------------------------------------------------------

def admit_book(waiting, reserved, running, max_batch_size, max_blocks, block_size):
    joined = 0
    for prompt, new in waiting:
        need = math.ceil((prompt + new - 1) / block_size)
        if running + joined >= max_batch_size or reserved + need > max_blocks:
            break
        reserved, joined = reserved + need, joined + 1
    return joined


def admit_indices(queue, used, active, batch_limit, budget, bs):   # returns the indices admitted
    out = []
    for i, (t, n) in enumerate(queue):
        blocks = -(-(t + n - 1) // bs)
        if active + len(out) < batch_limit and used + blocks <= budget:
            out.append(i)
            used += blocks
        else:
            break
    return out


def admit_requests(waiting, reserved, running, max_batch_size, max_blocks, block_size):   # the requests back
    return waiting[:admit_book(waiting, reserved, running, max_batch_size, max_blocks, block_size)]


def admit_torch(waiting, reserved, running, max_batch_size, *, max_blocks, block_size):  # cumsum, a tensor back
    if not waiting:
        return torch.tensor(0)
    w = torch.tensor(waiting)
    need = torch.div(w.sum(-1) - 1 + block_size - 1, block_size, rounding_mode="floor")
    fits = (reserved + need.cumsum(0) <= max_blocks).long().cumprod(0).sum()
    return torch.clamp(torch.minimum(fits, torch.tensor(max_batch_size - running)), min=0)


@pytest.mark.parametrize("answer", [admit_book, admit_indices, admit_requests, admit_torch])
def test_admit_accepts_correct_answers(answer):
    result = check_admit(answer)
    assert result.passed, result


def _admit(need=None, batch=True, running_counted=True, reserved_counted=True, strict=False, skip=False):
    def answer(waiting, reserved, running, max_batch_size, max_blocks, block_size):
        joined, used = 0, reserved if reserved_counted else 0
        for T, n in waiting:
            blocks = (need or (lambda T, n, b: math.ceil((T + n - 1) / b)))(T, n, block_size)
            full = batch and (running if running_counted else 0) + joined >= max_batch_size
            fits = used + blocks < max_blocks if strict else used + blocks <= max_blocks
            if full or not fits:
                if skip and not full:
                    continue
                break
            used, joined = used + blocks, joined + 1
        return joined
    return answer


@pytest.mark.parametrize("buggy, phrases", [
    (_admit(need=lambda T, n, b: math.ceil((T + n) / b)), ["last new token's position", "never cached"]),
    (_admit(need=lambda T, n, b: (T + n - 1) // b), ["rounded down"]),
    (_admit(need=lambda T, n, b: (T + n - 1) // b + 1), ["one block too many"]),
    (_admit(need=lambda T, n, b: math.ceil(T / b)), ["only the prompt's blocks"]),
    (_admit(batch=False), ["max_batch_size ignored"]),
    (_admit(running_counted=False), ["running requests left out of the batch size"]),
    (_admit(reserved_counted=False), ["reserved blocks left out"]),
    (_admit(strict=True), ["strict bound"]),
    (_admit(skip=True), ["first come, first served"]),
    (lambda w, r, n, m, b, s: [i for i in range(len(w)) if i % 2 == 0], ["not the first ones in order"]),
    (lambda w, r, n, m, b, s: "all", ["should return"]),
    (lambda w, r, n, m, b, s: w.pop() and 0, ["in place"]),
    (lambda w, r, n, m, b, s: w[5][0], ["IndexError"]),
])
def test_admit_names_mistakes(buggy, phrases):
    assert_names(check_admit(buggy), *phrases)


def test_stubs_are_not_attempted():
    for check in (check_residual, check_admit):
        result = check(stub)
        assert not result.passed and not result.attempted, result


def test_a_hang_is_stopped():
    def hang(*args):
        while True:
            pass
    with limited_to(0.5):
        for check in (check_accept_count, check_residual, check_admit):
            assert_names(check(hang), "did not return")


class _AnyInt(int):
    """A hostile answer: an int that claims to equal everything."""
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_an_int_that_equals_everything_does_not_pass():
    assert not check_accept_count(lambda p, q, drafts, u: _AnyInt(0)).passed
    assert not check_admit(lambda w, r, n, m, b, s: _AnyInt(0)).passed
    assert not check_admit(lambda w, r, n, m, b, s: [_AnyInt(0)] * len(w)).passed


@pytest.mark.parametrize("buggy, phrases", [
    (lambda p, q, d, u: next((i + 1 for i, x in enumerate(d.tolist()) if not u[i] * q[i, x] < p[i, x]), len(d)),
     ["rejected draft counted"]),
    (lambda p, q, d, u: next((i for i, x in enumerate(d.tolist()) if not u[i] * q[i, x] <= p[i, x]), len(d)),
     ["u <= p(x) / q(x)"]),
    (lambda p, q, d, u: next((i for i, x in enumerate(d.tolist()) if int(p[i].argmax()) != x), len(d)),
     ["greedy rule"]),
    (lambda p, q, d, u: next((i for i, x in enumerate(d.tolist()) if not u[i] < torch.log(p[i, x] / q[i, x])), len(d)),
     ["log p(x) - log q(x)"]),
])
def test_accept_count_names_more_mistakes(buggy, phrases):
    assert_names(check_accept_count(buggy), *phrases)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda p, q: (p - q).clamp(min=0) / (p - q).clamp(min=0).sum(), ["every element at once"]),
    (lambda p, q: (p - q).softmax(-1), ["softmax(p - q)"]),
    (lambda p, q: torch.minimum(p, q) / torch.minimum(p, q).sum(-1, keepdim=True), ["min(p, q) renormalised"]),
])
def test_residual_names_more_mistakes(buggy, phrases):
    assert_names(check_residual(buggy), *phrases)


@pytest.mark.parametrize("buggy, phrases", [
    (_admit(), []),
])
def test_admit_book_variant_passes(buggy, phrases):
    assert check_admit(buggy).passed


def test_admit_names_more_mistakes():
    def gt(waiting, reserved, running, max_batch_size, max_blocks, block_size):
        joined = 0
        for T, n in waiting:
            need = math.ceil((T + n - 1) / block_size)
            if running + joined > max_batch_size or reserved + need > max_blocks:
                break
            reserved, joined = reserved + need, joined + 1
        return joined

    def no_accumulate(waiting, reserved, running, max_batch_size, max_blocks, block_size):
        joined = 0
        for T, n in waiting:
            if running + joined >= max_batch_size or reserved + math.ceil((T + n - 1) / block_size) > max_blocks:
                break
            joined += 1
        return joined
    assert_names(check_admit(gt), "running + joined > max_batch_size")
    assert_names(check_admit(no_accumulate), "not added to reserved")


@pytest.mark.parametrize("check, answer", [(check_residual, residual_numpy)])
def test_numpy_arrays_with_the_right_values_are_refused_by_name(check, answer):
    """A checker takes torch.Tensors only (issue 36): an array is named, with the way to turn it into one."""
    assert_names(check(answer), "should be a torch.Tensor", "got a numpy.ndarray of shape (", "torch.from_numpy")
