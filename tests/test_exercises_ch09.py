"""Chapter 9's checkers: a correct answer passes, each classic mistake is named, stubs and crashes are handled."""

import math

import pytest
import torch

from attnlib.exercises import check_merge_partials, check_online_logsumexp, check_tile_step
from exercise_helpers import assert_names, stub

NEG_INF = float("-inf")


# --- online logsumexp over a stream -------------------------------------------------------------

def lse(chunks, *, rescale=True, wrong_way=False, subtract_max=True, add_max=True, skip_empty=True):
    """A reader's online logsumexp in plain Python floats; each flag off (or on) is one classic mistake."""
    m, l = NEG_INF, 0.0
    for x in chunks:
        m_new = max(m, float(x.max())) if subtract_max else 0.0
        if m_new == NEG_INF and skip_empty:
            continue  # nothing seen yet: there is no max to rescale by
        old = (math.exp(m_new - m) if m > NEG_INF else math.inf) if wrong_way else math.exp(m - m_new)
        l = (l * old if rescale else l) + float(torch.exp(x.double() - m_new).sum())
        m = m_new
    return (m if add_max else 0.0) + math.log(l)


def test_online_logsumexp_accepts_a_correct_one():
    assert check_online_logsumexp(lse).passed

    def with_tensors(chunks):                                             # torch scalars, logaddexp per chunk
        total = torch.tensor(NEG_INF, dtype=torch.float64)
        for x in chunks:
            total = torch.logaddexp(total, torch.logsumexp(x.double(), 0))
        return total

    def first_then_rest(chunks):                                          # starts from the first chunk
        it = iter(chunks)
        first = next(it)
        m = torch.cat([first.new_tensor([NEG_INF]), first]).max()        # a small cat: chunk + state
        l = torch.exp(first - m).sum() if m > NEG_INF else torch.tensor(0.0)
        for x in it:
            m_new = torch.stack([m, x.max()]).max()
            if m_new == NEG_INF:
                continue
            l = l * torch.exp(m - m_new) + torch.exp(x - m_new).sum()
            m = m_new
        return m + torch.log(l)
    assert check_online_logsumexp(with_tensors).passed
    assert check_online_logsumexp(first_then_rest).passed


def concatenates_as_it_goes(chunks):
    seen = torch.empty(0)
    for x in chunks:
        seen = torch.cat([seen, x])
    return torch.logsumexp(seen, 0)


def reads_all_first(chunks):
    return lse(list(chunks))                                              # the online loop, on a kept list


@pytest.mark.parametrize("keeps, phrase", [
    (lambda chunks: torch.logsumexp(torch.cat(list(chunks)), 0), "keeps every chunk and concatenates them"),
    (lambda chunks: torch.hstack(tuple(chunks)).logsumexp(0), "keeps every chunk and concatenates them"),
    (concatenates_as_it_goes, "keeps every chunk and concatenates them"),
    (reads_all_first, "reads the whole stream"),
])
def test_online_logsumexp_says_when_it_keeps_the_stream(keeps, phrase):
    assert_names(check_online_logsumexp(keeps), "the values are right, but", phrase)


@pytest.mark.parametrize("kwargs, phrase", [
    ({"rescale": False}, "forgot to rescale the running sum"),
    ({"wrong_way": True}, "rescaled the wrong way"),
    ({"add_max": False}, "the max is not added back"),
    ({"skip_empty": False}, "NaN from exp(-inf - (-inf))"),
])
def test_online_logsumexp_names_the_mistake(kwargs, phrase):
    assert_names(check_online_logsumexp(lambda chunks: lse(chunks, **kwargs)), phrase)


def test_online_logsumexp_names_overflow_without_the_max():
    no_max = lambda chunks: torch.log(sum(torch.exp(x).sum() for x in chunks))  # noqa: E731
    assert_names(check_online_logsumexp(no_max), "no max subtraction")


def test_online_logsumexp_stub_crash_and_wrong_type():
    assert check_online_logsumexp(stub).status == "not attempted yet"
    assert_names(check_online_logsumexp(lambda chunks: chunks[0]), "raised TypeError")
    assert_names(check_online_logsumexp(lambda chunks: "big"), "should return a number, got str")


# --- merging two partial results ----------------------------------------------------------------

def merge(m1, l1, acc1, m2, l2, acc2, *, rescale_l=True, rescale_acc=True, wrong_way=False, ref_zero_if_empty=True):
    m = torch.maximum(m1, m2)  # (B, T)
    ref = torch.where(m == NEG_INF, 0.0, m) if ref_zero_if_empty else m
    f1, f2 = (torch.exp(ref - m1), torch.exp(ref - m2)) if wrong_way else (torch.exp(m1 - ref), torch.exp(m2 - ref))
    l = l1 * f1 + l2 * f2 if rescale_l else l1 + l2
    acc = acc1 * f1[..., None] + acc2 * f2[..., None] if rescale_acc else acc1 + acc2
    return m, l, acc


def test_merge_accepts_a_correct_one():
    assert check_merge_partials(merge).passed

    def merge_by_logsumexp(m1, l1, acc1, m2, l2, acc2):  # another reference point: the log-sum-exp
        lse = torch.logaddexp(m1 + l1.log(), m2 + l2.log())  # (B, T), -inf for an empty row
        ref = torch.where(lse == NEG_INF, 0.0, lse)
        return lse, torch.exp(m1 + l1.log() - ref) + torch.exp(m2 + l2.log() - ref), \
            acc1 * torch.exp(m1 - ref)[..., None] + acc2 * torch.exp(m2 - ref)[..., None]
    assert check_merge_partials(merge_by_logsumexp).passed


@pytest.mark.parametrize("kwargs, phrase", [
    ({"rescale_l": False}, "forgot to rescale the sums"),
    ({"rescale_acc": False}, "forgot to rescale the accumulators"),
    ({"wrong_way": True}, "rescaled the wrong way"),
    ({"ref_zero_if_empty": False}, "empty in both blocks"),
])
def test_merge_names_the_mistake(kwargs, phrase):
    assert_names(check_merge_partials(lambda *a: merge(*a, **kwargs)), phrase)


def test_merge_names_the_first_max_kept():
    def first_max(m1, l1, acc1, m2, l2, acc2):
        f2 = torch.exp(m2 - m1)  # overflows when block 2 is larger
        return m1, l1 + l2 * f2, acc1 + acc2 * f2[..., None]
    assert_names(check_merge_partials(first_max), "kept the first block's max")


def test_merge_stub_crash_and_wrong_return():
    assert check_merge_partials(stub).status == "not attempted yet"
    assert_names(check_merge_partials(lambda m1, l1, acc1, m2, l2, acc2: m1 @ m2), "raised RuntimeError")
    assert_names(check_merge_partials(lambda *a: a[2] + a[5]), "should return a tuple (m, l, acc), got Tensor")
    assert_names(check_merge_partials(lambda *a: (a[0], a[1], a[2][..., 0])), "acc has shape (2, 6)")


# --- the inner loop of tiled attention ----------------------------------------------------------

def tile_step(q, k, v, m, l, acc, scale, *, rescale_l=True, rescale_acc=True, wrong_way=False, use_scale=True,
              divide=False):
    s = q @ k.transpose(-2, -1) * (scale if use_scale else 1.0)  # (N, T, tk)
    if divide:
        s = q @ k.transpose(-2, -1) / scale  # post 000's trap: dividing by what should multiply
    m_new = torch.maximum(m, s.amax(-1))  # (N, T)
    alpha = torch.exp(m_new - m) if wrong_way else torch.exp(m - m_new)
    p = torch.exp(s - m_new[..., None])  # (N, T, tk)
    l = (l * alpha if rescale_l else l) + p.sum(-1)
    acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ v
    return m_new, l, acc


def test_tile_step_accepts_a_correct_one():
    assert check_tile_step(tile_step).passed


@pytest.mark.parametrize("kwargs, phrase", [
    ({"rescale_l": False}, "forgot to rescale the running sum"),
    ({"rescale_acc": False}, "forgot to rescale the accumulator"),
    ({"wrong_way": True}, "rescaled the wrong way"),
    ({"use_scale": False}, "the scale left out"),
    ({"divide": True}, "divided the scores by scale"),
])
def test_tile_step_names_the_mistake(kwargs, phrase):
    assert_names(check_tile_step(lambda *a: tile_step(*a, **kwargs)), phrase)


def test_tile_step_names_overflow_without_the_max():
    def no_max(q, k, v, m, l, acc, scale):
        s = q @ k.transpose(-2, -1) * scale
        return torch.maximum(m, s.amax(-1)), l + s.exp().sum(-1), acc + s.exp() @ v
    assert_names(check_tile_step(no_max), "no max subtraction")


def test_tile_step_stub_crash_and_wrong_return():
    assert check_tile_step(stub).status == "not attempted yet"
    assert_names(check_tile_step(lambda q, k, v, m, l, acc, scale: q @ k), "raised RuntimeError", "line")
    assert_names(check_tile_step(lambda *a: None), "should return a tuple (m, l, acc), got NoneType")


# --- tile step: answers in other styles, and the bugs they bring (adversarial review, adv49) -----

LOG2E = 1.4426950408889634


def fa1_step(q, k, v, m, l, acc, scale):
    """FlashAttention-1's step: acc kept normalized, O = acc / l after every tile."""
    s = q @ k.mT * scale
    m_tile = s.amax(-1)
    p = torch.exp(s - m_tile[..., None])
    m_new = torch.maximum(m, m_tile)
    old, new = l * torch.exp(m - m_new), torch.exp(m_tile - m_new)
    l_new = old + new * p.sum(-1)
    return m_new, l_new, (old[..., None] * acc + new[..., None] * (p @ v)) / l_new[..., None]


def triton_step(q, k, v, m, l, acc, scale):
    """Triton's tutorial: scores times scale·log2(e), exp2, and m kept in those base-2 units."""
    s = q @ k.transpose(-1, -2) * (scale * LOG2E)
    m_new = torch.maximum(m, s.amax(-1))
    alpha, p = torch.exp2(m - m_new), torch.exp2(s - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def lse_step(q, k, v, m, l, acc, scale):
    """The logsumexp carried in m, l = 1 and acc normalized."""
    s = torch.einsum("ntd,nsd->nts", q * scale, k)                   # the scale folded into q first
    lse = torch.logaddexp(m, torch.logsumexp(s, -1))
    return lse, torch.ones_like(l), acc * torch.exp(m - lse)[..., None] + torch.exp(s - lse[..., None]) @ v


def fa2_kernel_step(q, k, v, m, l, acc, scale):
    """FlashAttention-2's kernel: m is the max of the raw scores q kᵀ, scale·log2(e) folded into exp2."""
    c, s = scale * LOG2E, q @ k.mT
    m_new = torch.maximum(m, s.amax(-1))
    alpha, p = torch.exp2((m - m_new) * c), torch.exp2((s - m_new[..., None]) * c)
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def test_tile_step_accepts_other_styles():
    assert check_tile_step(lse_step).passed
    assert check_tile_step(lambda q, k, v, m, l, acc, *, scale: tile_step(q, k, v, m, l, acc, scale)).passed
    fa1 = check_tile_step(fa1_step)
    assert fa1.passed and "acc is kept normalized" in fa1.message and "FlashAttention-1" in fa1.message
    triton = check_tile_step(triton_step)
    assert triton.passed and "base-2 units" in triton.message
    fa2 = check_tile_step(fa2_kernel_step)
    assert fa2.passed and "max of the unscaled scores" in fa2.message


def bug_step(q, k, v, m, l, acc, scale, *, bug):
    """tile_step with one realistic bug."""
    s = q @ k.mT * scale
    if bug == "scaled twice":
        s = s / math.sqrt(q.shape[-1])
    if bug in ("last key", "first key"):
        keys = slice(None, -1) if bug == "last key" else slice(1, None)
        return tile_step(q, k[:, keys], v[:, keys], m, l, acc, scale)
    m_tile = s.amax(-1)
    m_new = torch.maximum(m, m_tile)
    alpha = torch.exp((m_tile if bug == "tile max" else m) - m_new)
    p = torch.exp(s - (m_tile if bug == "p tile max" else m_new)[..., None])
    l_new, acc_new = l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v
    if bug == "normalized":
        acc_new = acc_new / l_new[..., None]
    return (m if bug == "old m" else m_new), (l if bug == "l kept" else l_new), acc_new


def exp2_without_log2e(q, k, v, m, l, acc, scale):
    """Triton's exp2 without its log2(e) factor on the scores."""
    s = q @ k.mT * scale
    m_new = torch.maximum(m, s.amax(-1))
    alpha, p = torch.exp2(m - m_new), torch.exp2(s - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def test_tile_step_names_exp2_without_log2e():
    assert_names(check_tile_step(exp2_without_log2e), "exp2 without the log2(e) factor")


@pytest.mark.parametrize("bug, phrase", [
    ("tile max", "with the tile's own max"),
    ("p tile max", "p = exp(s - m_tile)"),
    ("normalized", "acc divided by l after every tile"),
    ("old m", "returned the old m"),
    ("scaled twice", "scaled twice"),
    ("last key", "the last key of each tile left out"),
    ("first key", "the first key of each tile left out"),
    ("l kept", "left l at 0 after every tile"),
])
def test_tile_step_names_more_mistakes(bug, phrase):
    assert_names(check_tile_step(lambda *a: bug_step(*a, bug=bug)), phrase)


@pytest.mark.parametrize("wrong, phrases", [
    (lambda *a: tuple(t.half() for t in tile_step(*a)), ["on keys 0..5: m returned torch.float16", "half precision"]),
    (lambda *a: tuple(t.long() for t in tile_step(*a)), ["m is torch.int64"]),
    (lambda *a: (lambda m, l, acc: (m[..., None], l, acc))(*tile_step(*a)), ["m has shape (2, 5, 1), expected (2, 5)"]),
    (lambda *a: tuple(t.numpy() for t in tile_step(*a)), ["m should be a torch.Tensor", "got a numpy.ndarray of shape"]),
    (lambda *a: tile_step(*a)[:2], ["got tuple of 2 items"]),
])
def test_tile_step_names_a_wrong_state(wrong, phrases):
    assert_names(check_tile_step(wrong), *phrases)


def _merge_min(m1, l1, acc1, m2, l2, acc2, guard=True):
    m = torch.minimum(m1, m2)
    ref = torch.where(m.isinf(), torch.zeros_like(m), m) if guard else m
    f1, f2 = torch.exp(m1 - ref), torch.exp(m2 - ref)
    return m, l1 * f1 + l2 * f2, acc1 * f1[..., None] + acc2 * f2[..., None]


@pytest.mark.parametrize("buggy, phrase", [                     # issue 36: named, one each
    (lambda m1, l1, a1, m2, l2, a2: (torch.maximum(m1, m2), l1 + l2, a1 + a2), "neither the sums nor the accumulators"),
    (_merge_min, "the minimum taken for the reference, m = min(m1, m2): exp"),
    (lambda *a: _merge_min(*a, guard=False), "and exp(-inf - (-inf)) = NaN where a block is empty"),
])
def test_merge_names_more_mistakes(buggy, phrase):
    result = check_merge_partials(buggy)
    assert not result.passed and phrase in result.message and " and the " not in result.message, result.message


def _merge_weighted_by_l(m1, l1, acc1, m2, l2, acc2):     # acc taken for normalized outputs (o, lse merges)
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(m1 - safe) * l1, torch.exp(m2 - safe) * l2
    l = w1 + w2
    return m, l, (w1.unsqueeze(-1) * acc1 + w2.unsqueeze(-1) * acc2) / l.clamp_min(1e-30).unsqueeze(-1)


@pytest.mark.parametrize("buggy, phrase", [                     # issue 36: held-out styles
    (_merge_weighted_by_l, "the accumulators taken for normalized outputs"),
    (lambda m1, l1, a1, m2, l2, a2: (torch.minimum(m1, m2), l1 + l2, a1 + a2), "two mistakes at once: neither the sums"),
])
def test_merge_names_held_out_styles(buggy, phrase):
    assert_names(check_merge_partials(buggy), phrase)


def test_merge_names_a_wrong_m_with_right_sums():                   # issue 36, held-out set 2
    def summed_m(m1, l1, a1, m2, l2, a2):
        m = torch.maximum(m1, m2)
        ref = torch.nan_to_num(m, neginf=0.0)
        f1, f2 = torch.exp(m1 - ref), torch.exp(m2 - ref)
        return m1 + m2, f1 * l1 + f2 * l2, f1[..., None] * a1 + f2[..., None] * a2
    assert_names(check_merge_partials(summed_m), "l and acc are right for the reference m = max(m1, m2)")
