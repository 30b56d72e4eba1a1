"""Chapter 15's checkers: correct answers in several styles pass, each classic mistake is named, stubs and
crashes are handled, and no checker raises."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlib.exercises import check_delta_rule_update, check_linear_attention_step, check_topk_selection
from attnlib.linear_attention import LinearAttentionState, linear_attention_step
from exercise_helpers import assert_names, stub


# --- the recurrent step of linear attention ------------------------------------------------------

def phi(x):
    return F.elu(x) + 1


def step_book(S, z, q, k, v):                                  # the book's solution
    fq, fk = phi(q), phi(k)
    S, z = S + fk[..., :, None] * v[..., None, :], z + fk
    out = (fq[..., None, :] @ S).squeeze(-2) / (fq * z).sum(-1, keepdim=True)
    return out, S, z


def step_einsum_nested(state, z, query, key, value, eps=1e-6):  # einsum, the state as a pair, an eps
    fk, fq = phi(key), phi(query)
    state = state + torch.einsum("bhk,bhv->bhkv", fk, value)
    z = z + fk
    out = torch.einsum("bhk,bhkv->bhv", fq, state) / (torch.einsum("bhk,bhk->bh", fq, z)[..., None] + eps)
    return out, (state, z)


def step_attnlib(S, z, q, k, v):                                # attnlib's step, its state object returned
    return linear_attention_step(LinearAttentionState(S, z), q, k, v)


def step_numpy(S, z, q, k, v):                                  # numpy, for a reader who thinks in arrays
    S, z, q, k, v = (t.numpy() for t in (S, z, q, k, v))
    f = lambda x: np.where(x > 0, x + 1, np.exp(x))             # noqa: E731  elu(x) + 1
    S = S + f(k)[..., :, None] * v[..., None, :]
    z = z + f(k)
    return np.einsum("bhk,bhkv->bhv", f(q), S) / (f(q) * z).sum(-1, keepdims=True), S, z


@pytest.mark.parametrize("answer", [step_book, step_einsum_nested, step_attnlib])
def test_linear_step_accepts_correct_answers(answer):
    result = check_linear_attention_step(answer)
    assert result.passed, result


def _variant(**change):
    def step(S, z, q, k, v):
        f = change.get("phi", phi)
        fq, fk = f(q), f(k)
        S_new = (0 if change.get("forget") else S) + fk[..., :, None] * change.get("vmap", lambda x: x)(v)[..., None, :]
        z_new = z + (k if change.get("z_raw") else fk)
        read = (change.get("read", lambda a, b: a)(fq, fk)[..., None, :]
                @ (S if change.get("read_old") else S_new)).squeeze(-2)
        if change.get("no_norm"):
            return read, S_new, z_new
        return read / (fq * (z if change.get("norm_old") else z_new)).sum(-1, keepdim=True), S_new, z_new
    return step


@pytest.mark.parametrize("buggy, phrases", [
    (_variant(phi=lambda x: x), ["raw key written", "feature map"]),
    (_variant(phi=torch.exp), ["exp(k)"]),
    (_variant(forget=True), ["state not carried over"]),
    (_variant(vmap=phi), ["φ applied to v"]),
    (_variant(z_raw=True), ["z_new = z + k"]),
    (_variant(no_norm=True), ["no normaliser"]),
    (_variant(read_old=True), ["read before the token's own write"]),
    (_variant(norm_old=True), ["z before the write"]),
    (_variant(read=lambda fq, fk: fk), ["key read instead of the query"]),
    (lambda S, z, q, k, v: (step_book(S, z, q, k, v)[0], step_book(S, z, q, k, v)[1].mT, z + phi(k)),
     ["transpose of the state"]),
    (lambda S, z, q, k, v: step_book(S, z, q, k, v)[:2], ["should return (out, S, z)"]),
    (lambda S, z, q, k, v: step_book(S, z, q, k, v)[0], ["should return (out, S, z)"]),
    (lambda S, z, q, k, v: (S.add_(1), z, q), ["changed S in place"]),
    (lambda S, z, q, k, v: 1 / 0, ["raised ZeroDivisionError"]),
    (_variant(phi=F.elu), ["elu(x) without the + 1"]),                  # held-out answers (issue 36)
    (_variant(phi=lambda x: F.relu(x) + 1), ["relu(x) + 1"]),
    (lambda S, z, q, k, v: (step_book(S, z, q, k, v)[0] * (phi(q) * (z + phi(k))).sum(-1, keepdim=True)
                            / (phi(k) * (z + phi(k))).sum(-1, keepdim=True), *step_book(S, z, q, k, v)[1:]),
     ["normaliser φ(k) · z_new"]),
    (lambda S, z, q, k, v: (step_book(S, z, q, k, v)[0] * (phi(q) * (z + phi(k))).sum(-1, keepdim=True)
                            / (z + phi(k)).sum(-1, keepdim=True), *step_book(S, z, q, k, v)[1:]),
     ["normaliser Σ z_new"]),
    (lambda S, z, q, k, v: (lambda o, S, z: (S, z, o))(*step_book(S, z, q, k, v)), ["S_new as item 0"]),
])
def test_linear_step_names_the_mistake(buggy, phrases):
    assert_names(check_linear_attention_step(buggy), *phrases)


# --- the delta-rule update -----------------------------------------------------------------------

def delta_book(S, k, v, beta, alpha):                          # the book's solution
    k = k / k.norm(dim=-1, keepdim=True)
    S = alpha[..., None, None] * S
    delta = beta[..., None] * (v - (k[..., None, :] @ S).squeeze(-2))
    return S + k[..., :, None] * delta[..., None, :]


def delta_product_form(S, k, v, beta, alpha):                  # α (I - β k kᵀ) S + β k vᵀ, the papers' form
    k = F.normalize(k, dim=-1)
    kk = k[..., :, None] @ k[..., None, :]                    # (B, H, Dk, Dk)
    eye = torch.eye(k.shape[-1], dtype=k.dtype)
    b = beta[..., None, None]
    return alpha[..., None, None] * (eye - b * kk) @ S + b * k[..., :, None] * v[..., None, :]


def delta_einsum_kw(state, key, value, beta, alpha, *, eps=1e-6):  # einsum, an rsqrt eps as the FLA kernels
    key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + eps)
    state = state * alpha[..., None, None]
    pred = torch.einsum("bhkv,bhk->bhv", state, key)
    return state + torch.einsum("bhk,bhv->bhkv", key, beta[..., None] * (value - pred))


def delta_numpy(S, k, v, beta, alpha):
    S, k, v, beta, alpha = (t.numpy() for t in (S, k, v, beta, alpha))
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    S = alpha[..., None, None] * S
    return S + k[..., :, None] * (beta[..., None] * (v - np.einsum("bhkv,bhk->bhv", S, k)))[..., None, :]


@pytest.mark.parametrize("answer", [delta_book, delta_product_form, delta_einsum_kw])
def test_delta_rule_accepts_correct_answers(answer):
    result = check_delta_rule_update(answer)
    assert result.passed, result


def plus_prediction(S, k, v, beta, alpha):                     # a sign slip: v + α Sᵀ k̂
    k = k / k.norm(dim=-1, keepdim=True)
    S = alpha[..., None, None] * S
    return S + k[..., :, None] * (beta[..., None] * (v + (k[..., None, :] @ S).squeeze(-2)))[..., None, :]


def beta_on_v_only(S, k, v, beta, alpha):                      # k̂ (β v - α Sᵀ k̂)ᵀ
    k, S = F.normalize(k, dim=-1), alpha[..., None, None] * S
    return S + k[..., :, None] * (beta[..., None] * v - (k[..., None, :] @ S).squeeze(-2))[..., None, :]


def _delta(norm=True, decay="before", predict="decayed", use_beta=True, subtract=True, gate=lambda a: a):
    def update(S, k, v, beta, alpha):
        k = k / k.norm(dim=-1, keepdim=True) if norm else k
        a = gate(alpha)[..., None, None]
        b = beta[..., None] if use_beta else 1.0
        decayed = a * S if decay == "before" else S
        source = decayed if predict == "decayed" else S
        pred = (k[..., None, :] @ source).squeeze(-2)
        new = decayed + k[..., :, None] * (b * (v - pred) if subtract else b * v)[..., None, :]
        return a * new if decay == "after" else new
    return update


@pytest.mark.parametrize("buggy, phrases", [
    (_delta(norm=False), ["k not normalised"]),
    (_delta(gate=torch.ones_like), ["state not decayed"]),
    (_delta(decay="after"), ["gate applied after the write"]),
    (_delta(predict="old"), ["undecayed state"]),
    (_delta(use_beta=False), ["β missing"]),
    (_delta(subtract=False), ["additive rule"]),
    (_delta(gate=lambda a: 1 - a), ["1 - α"]),
    (_delta(gate=torch.exp), ["log-gate"]),
    (lambda S, k, v, beta, alpha: delta_book(S, k, v / v.norm(dim=-1, keepdim=True), beta, alpha), ["v normalised"]),
    (lambda S, k, v, beta, alpha: plus_prediction(S, k, v, beta, alpha), ["prediction added"]),
    (lambda S, k, v, beta, alpha: delta_book(S, k, v, beta, alpha).mT, ["transpose of the state"]),
    (lambda S, k, v, beta, alpha: delta_book(S, k, v, beta, alpha).half(), ["half precision"]),
    (lambda S, k, v, beta, alpha: delta_book(S, k, v, beta, alpha)[0], ["has shape (3, 5, 4)"]),
    (lambda S, k, v, beta, alpha: delta_book(S, k, v, beta, alpha) + 1e-3, ["it is the expected result plus 0.001 everywhere"]),
    (lambda S, k, v, beta, alpha: S.copy_(delta_book(S, k, v, beta, alpha)), ["changed S in place"]),
    (lambda S, k, v, beta, alpha: _delta(norm=False)(S, k / (k * k).sum(-1, keepdim=True), v, beta, alpha),
     ["‖k‖² instead of ‖k‖"]),                                       # held-out answers (issue 36)
    (lambda S, k, v, beta, alpha: _delta(norm=False)(S, F.normalize(k, dim=1), v, beta, alpha), ["heads axis"]),
    (lambda S, k, v, beta, alpha: 2 * alpha[..., None, None] * S - delta_book(S, k, v, beta, alpha),
     ["correction subtracted"]),
    (lambda S, k, v, beta, alpha: beta_on_v_only(S, k, v, beta, alpha), ["β on v only"]),
])
def test_delta_rule_names_the_mistake(buggy, phrases):
    assert_names(check_delta_rule_update(buggy), *phrases)


# --- top-k selection under a causal mask ---------------------------------------------------------

def select_book(scores, k):                                     # the book's solution
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    top = scores.masked_fill(~causal, float("-inf")).topk(min(k, T), dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top, True) & causal


def select_sorted_int(scores, k):                               # a stable sort, returned as 0/1 integers
    T = scores.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    order = scores.masked_fill(~causal, -torch.inf).argsort(dim=-1, descending=True, stable=True)
    ranks = order.argsort(dim=-1)                               # each key's place in its row
    return ((ranks < k) & causal).long()


def select_loops(scores, k):                                    # Python loops, an additive 0/-inf mask
    *lead, T, _ = scores.shape
    flat = scores.reshape(-1, T, T)
    out = torch.full_like(flat, float("-inf"))
    for b in range(flat.shape[0]):
        for i in range(T):
            keep = sorted(range(i + 1), key=lambda j: -flat[b, i, j].item())[:k]
            out[b, i, keep] = 0.0
    return out.reshape(scores.shape)


def select_numpy(scores, k):
    s = scores.numpy()
    T = s.shape[-1]
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    order = np.argsort(-s, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(s.shape, bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask & np.tril(np.ones((T, T), bool))


@pytest.mark.parametrize("answer", [select_book, select_sorted_int, select_loops])
def test_topk_accepts_correct_answers(answer):
    result = check_topk_selection(answer)
    assert result.passed, result


def _top(scores, k, allowed, largest=True, fill=None, and_mask=True, dim=-1):
    fill = (-torch.inf if largest else torch.inf) if fill is None else fill
    s = scores if allowed is None else scores.masked_fill(~allowed, fill)
    top = s.topk(min(k, s.shape[dim]), dim=dim, largest=largest).indices
    chosen = torch.zeros_like(s, dtype=torch.bool).scatter(dim, top, True)
    return chosen & allowed if and_mask and allowed is not None else chosen


def tril(T, d=0):
    return torch.ones(T, T, dtype=torch.bool).tril(d)


def threshold(scores, k, strict=False):                          # keeps (or drops) every key tied at the k-th place
    T = scores.shape[-1]
    s = scores.masked_fill(~tril(T), -torch.inf)
    kth = s.topk(min(k, T), dim=-1).values[..., -1:]
    return ((s > kth) if strict else (s >= kth)) & tril(T)


@pytest.mark.parametrize("buggy, phrases", [
    (lambda s, k: _top(s, k, tril(s.shape[-1], 1)), ["off by one", "key i + 1"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1], -1)), ["diagonal masked"]),
    (lambda s, k: _top(s, k, None), ["no causal mask"]),
    (lambda s, k: _top(s, k, None) & tril(s.shape[-1]), ["masked afterwards"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1]), fill=0.0, and_mask=False), ["filled with 0 (or another finite number), not -inf"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1]), and_mask=False), ["fewer than k visible keys keep hidden ones"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1]), largest=False), ["lowest"]),
    (lambda s, k: ~select_book(s, k), ["inverted"]),
    (lambda s, k: select_book(s, k).transpose(-1, -2), ["transposed"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1]), dim=-2), ["over queries"]),
    (lambda s, k: _top(s, k + 1, tril(s.shape[-1])), ["k + 1 keys"]),
    (lambda s, k: threshold(s, k), ["keeps every key tied"]),
    (lambda s, k: threshold(s, k, strict=True), ["k - 1 keys"]),
    (lambda s, k: s.masked_fill(~tril(s.shape[-1]), -torch.inf).topk(min(k, s.shape[-1]), -1).indices,
     ["returned indices"]),
    (lambda s, k: select_book(s, k).float(), ["float mask of 0s and 1s"]),
    (lambda s, k: _top(s, k, tril(s.shape[-1]), fill=-1e4), ["such as -1e4"]),   # beaten by scores of 1e10
])
def test_topk_names_the_mistake(buggy, phrases):
    assert_names(check_topk_selection(buggy), *phrases)


@pytest.mark.parametrize("check", [check_linear_attention_step, check_delta_rule_update, check_topk_selection])
def test_stubs_read_not_attempted_and_nothing_raises(check):
    result = check(stub)
    assert not result.passed and not result.attempted and "not attempted yet" in result.message
    for bad in (None, 42, lambda *a: None, lambda *a: "text", lambda *a: (torch.zeros(1),) * 5):
        assert not check(bad).passed


def test_checkers_leave_torch_state_as_found():
    threads, grad, dtype = torch.get_num_threads(), torch.is_grad_enabled(), torch.get_default_dtype()

    def messy(*args):
        torch.set_grad_enabled(False)
        return select_book(*args) if len(args) == 2 else None

    for check in (check_linear_attention_step, check_delta_rule_update, check_topk_selection):
        check(messy)
    assert (torch.get_num_threads(), torch.is_grad_enabled(), torch.get_default_dtype()) == (threads, grad, dtype)


@pytest.mark.parametrize("check, answer", [(check_linear_attention_step, step_numpy), (check_delta_rule_update, delta_numpy),
                                                  (check_topk_selection, select_numpy)])
def test_numpy_arrays_with_the_right_values_are_refused_by_name(check, answer):
    """A checker takes torch.Tensors only (issue 36): an array is named, with the way to turn it into one."""
    assert_names(check(answer), "should be a torch.Tensor", "got a numpy.ndarray of shape (", "torch.from_numpy")
