"""attnlib.speculative_generate: greedy output equal to generate's for every draft and every k (a smaller
model, a noisy copy of the target, a draft that always disagrees, prompt lookup), eos; sampled output
distributed as the target's, checked by a chi-square test against the exact distribution (one that the
two classic wrong rules fail); KVCache.crop; PromptLookup's rule; bad arguments named."""

import copy

import pytest
import torch
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM

from attnlib import KVCache, LlamaDecoder, PromptLookup, generate, speculative_generate
from attnlib.generation import process_logits, sample_probs
from attnlib import speculative
from attnlib.speculative import SpeculativeStats, accept_reject

torch.set_num_threads(1)


def tiny_decoder(vocab: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 seed: int = 0) -> LlamaDecoder:
    """A seeded random LlamaDecoder converted from a tiny transformers LlamaForCausalLM."""
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=128, initializer_range=0.2, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return LlamaDecoder.from_hf(LlamaForCausalLM(config).eval())


class Contrarian(torch.nn.Module):
    """A draft that always disagrees with the target's greedy choice: the target's logits rolled by one
    token, so its argmax is the target's + 1 (mod V)."""

    def __init__(self, target: LlamaDecoder) -> None:
        super().__init__()
        self.target, self.embed = target, target.embed

    def forward(self, input_ids, cache=None):
        return self.target(input_ids, cache).roll(1, dims=-1)


VOCAB = 64


@pytest.fixture(scope="module")
def models():
    target = tiny_decoder(VOCAB)
    noisy = copy.deepcopy(target)                              # agrees often, not always
    with torch.no_grad():
        noisy.lm_head.weight.add_(0.05 * torch.randn(noisy.lm_head.weight.shape, generator=torch.Generator().manual_seed(3)))
    return {"target": target, "small": tiny_decoder(VOCAB, hidden=32, layers=1, heads=2, kv_heads=1, seed=1),
            "noisy": noisy, "contrarian": Contrarian(target), "lookup": PromptLookup(3)}


def prompt(T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(seed))


# --- greedy -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("draft", ["small", "noisy", "contrarian", "lookup"])
def test_greedy_equals_generate_for_every_k(models, draft):
    target, x = models["target"], prompt()
    expected = generate(target, x, 30)
    stats = SpeculativeStats()
    for k in range(1, 6):
        ours = speculative_generate(target, models[draft], x, 30, num_draft_tokens=k, stats=stats)
        assert torch.equal(ours, expected), f"k={k}"
    assert stats.new_tokens == 5 * 30
    if draft == "contrarian":
        assert stats.accepted == 0 and stats.target_calls == 5 * 30        # every draft rejected
    if draft in ("noisy", "lookup"):
        assert 0 < stats.accepted < stats.drafted                          # accepted and rejected drafts both seen
        assert stats.tokens_per_call > 1


def test_greedy_eos_stops_where_generate_stops(models):
    target, x = models["target"], prompt()
    full = generate(target, x, 30)[0, 12:]
    eos = [int(full[14]), int(full[9])]                       # tokens the greedy output reaches
    expected = generate(target, x, 30, eos_token_id=eos)
    assert expected.shape[1] <= 12 + 10 and int(expected[0, -1]) in eos
    for draft in ("noisy", "lookup", "small"):
        for k in (1, 3, 5):
            assert torch.equal(speculative_generate(target, models[draft], x, 30, num_draft_tokens=k,
                                                    eos_token_id=eos), expected)


def test_zero_new_tokens_and_a_one_token_prompt(models):
    target, x = models["target"], prompt()
    assert torch.equal(speculative_generate(target, models["small"], x, 0), x)
    one = prompt(1)
    assert torch.equal(speculative_generate(target, models["lookup"], one, 8), generate(target, one, 8))


# --- sampled: the rejection rule keeps the target's distribution ----------------------------------

def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of integer samples (N,) against probs (C,); cells expected fewer than 5
    times are pooled; a sample in a cell of probability 0 gives 0."""
    counts = torch.bincount(samples, minlength=len(probs)).double()
    probs = probs.double() / probs.sum()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * len(samples)
    small = expected < 5
    obs = torch.cat((counts[~small], counts[small].sum().view(1)))
    exp = torch.cat((expected[~small], expected[small].sum().view(1)))
    keep = exp > 0
    stat = float(((obs - exp) ** 2 / exp)[keep].sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


V, K, N = 8, 3, 40_000


def tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-wise target and draft distributions P, Q (K + 2, V), far apart."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(K + 2, V, generator=g) * 1.5).softmax(-1), (torch.randn(K + 2, V, generator=g) * 1.5).softmax(-1)


def always_accept(p, q, drafts, generator):
    """Wrong: keep every draft, then draw the bonus token from p."""
    return torch.full((len(drafts),), drafts.shape[1]), sample_probs(p[:, -1], generator)


def resample_from_p(p, q, drafts, generator):
    """Wrong: the right acceptance test, but a rejected draft is replaced by a draw from p, not max(0, p - q)."""
    N, k = drafts.shape
    ratio = p[:, :k].gather(-1, drafts[..., None])[..., 0] / q.gather(-1, drafts[..., None])[..., 0]
    accepted = (torch.rand(N, k, generator=generator, dtype=torch.float64) < ratio).long().cumprod(-1).sum(-1)
    return accepted, sample_probs(p[torch.arange(N), accepted], generator)


def first_two_tokens(rule, P: torch.Tensor, Q: torch.Tensor | None, seed: int) -> torch.Tensor:
    """x_1 · V + x_2 for N independent runs of a target whose i-th token is drawn from P[i-1] (whatever
    came before). Round 1 drafts K tokens from Q[0..K-1] (or, Q None, the fixed tokens 0, 1, 2 as a
    point mass) and is checked against P[0..K]; when it emits one token, round 2 (from position 1) gives x_2."""
    g = torch.Generator().manual_seed(seed)

    def round_from(start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if Q is None:
            drafts = torch.arange(start, start + K).repeat(N, 1) % V                    # (N, K)
            q = torch.nn.functional.one_hot(drafts, V).double()
        else:
            q = Q[start:start + K].double().expand(N, K, V)                          # (N, K, V)
            drafts = sample_probs(q.reshape(N * K, V), g).view(N, K)
        accepted, token = rule(P[start:start + K + 1].double().expand(N, K + 1, V), q, drafts, g)
        emitted = torch.cat((drafts, torch.zeros(N, 1, dtype=torch.long)), dim=1)
        emitted[torch.arange(N), accepted] = token                                     # drafts kept, then token
        return emitted, accepted, token

    first, accepted, _ = round_from(0)
    second, _, _ = round_from(1)
    x2 = torch.where(accepted >= 1, first[:, 1], second[:, 0])
    return first[:, 0] * V + x2


@pytest.mark.parametrize("point_mass", [False, True])
def test_accept_reject_gives_the_target_distribution(point_mass):
    P, Q = tables(0)
    joint = (P[0][:, None] * P[1][None, :]).flatten()        # (V²,): the target's tokens are independent here
    samples = first_two_tokens(accept_reject, P, None if point_mass else Q, seed=1)
    assert chi_square_pvalue(samples, joint) > 1e-4
    assert chi_square_pvalue(samples // V, P[0]) > 1e-4


@pytest.mark.parametrize("rule", [always_accept, resample_from_p])
@pytest.mark.parametrize("point_mass", [False, True])
def test_the_statistic_catches_the_wrong_rules(rule, point_mass):
    """The test above can fail: each classic mistake gives a p-value of (nearly) zero."""
    P, Q = tables(0)
    joint = (P[0][:, None] * P[1][None, :]).flatten()
    assert chi_square_pvalue(first_two_tokens(rule, P, None if point_mass else Q, seed=1), joint) < 1e-12


SMALL_V = 8


def exact_two_token_joint(target: LlamaDecoder, x: torch.Tensor, **sampling) -> torch.Tensor:
    """(V²,): P(x_1, x_2 | x) = p(x_1 | x) p(x_2 | x, x_1) after temperature/top_k/top_p, from V + 1 forwards."""
    with torch.no_grad():
        p1 = process_logits(target(x)[0, -1], **sampling).softmax(-1)              # (V,)
        both = torch.cat((x.repeat(SMALL_V, 1), torch.arange(SMALL_V)[:, None]), dim=1)  # (V, T + 1)
        p2 = process_logits(target(both)[:, -1], **sampling).softmax(-1)            # (V, V): row x_1
    return (p1[:, None] * p2).flatten()


@pytest.mark.parametrize("wrong", [False, True])
def test_sampled_speculative_follows_the_target(wrong, monkeypatch):
    """End to end on tiny LlamaDecoders of 8 tokens: 600 runs of 3 tokens with a different random draft,
    top_k and temperature applied (to the draft's q as to the target's p). With the residual replaced
    by p (wrong=True), the same statistic rejects the output."""
    if wrong:
        monkeypatch.setattr(speculative, "accept_reject", resample_from_p)
    sampling = {"top_k": 5, "temperature": 0.8}
    target = tiny_decoder(SMALL_V, hidden=32, seed=4)
    draft = tiny_decoder(SMALL_V, hidden=16, layers=1, heads=2, kv_heads=1, seed=5)
    x = torch.randint(0, SMALL_V, (1, 5), generator=torch.Generator().manual_seed(6))
    g, stats = torch.Generator().manual_seed(7), SpeculativeStats()
    runs = torch.stack([speculative_generate(target, draft, x, 3, num_draft_tokens=2, do_sample=True,
                                             generator=g, stats=stats, **sampling)[0, 5:7] for _ in range(600)])
    assert 0 < stats.accepted < stats.drafted
    pvalue = chi_square_pvalue(runs[:, 0] * SMALL_V + runs[:, 1], exact_two_token_joint(target, x, **sampling))
    assert pvalue < 1e-6 if wrong else pvalue > 1e-4


def test_sampling_is_reproducible_and_top_k_1_is_greedy(models):
    target, x = models["target"], prompt()
    a, b = (speculative_generate(target, models["small"], x, 20, do_sample=True, generator=torch.Generator().manual_seed(0))
            for _ in range(2))
    assert torch.equal(a, b)
    greedy = speculative_generate(target, models["noisy"], x, 20, do_sample=True, top_k=1,
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, generate(target, x, 20))
    as_int32 = speculative_generate(target, models["lookup"], x.int(), 20, do_sample=True, generator=torch.Generator().manual_seed(1))
    as_int64 = speculative_generate(target, models["lookup"], x, 20, do_sample=True, generator=torch.Generator().manual_seed(1))
    assert as_int32.dtype == torch.int32 and torch.equal(as_int32.long(), as_int64)


# --- the pieces -------------------------------------------------------------------------------------

def test_kv_cache_crop_rolls_back():
    target = tiny_decoder(VOCAB)
    x = prompt(10)
    cache = KVCache()
    with torch.no_grad():
        target(x, cache)
        assert cache.seq_len == 10
        cache.crop(6)
        assert cache.seq_len == 6 and len(cache) == 2
        cropped = target(x[:, 6:], cache)
        torch.testing.assert_close(cropped, target(x)[:, 6:], rtol=0, atol=1e-5)
    for bad in (-1, 11, 2.0, True):
        with pytest.raises(ValueError, match="seq_len"):
            cache.crop(bad)


def test_prompt_lookup_rule():
    lookup = PromptLookup(ngram_size=3)
    t = torch.tensor
    # the latest earlier occurrence of the last 3-gram (5, 6, 7) is at 4; it was followed by 9, 1
    assert lookup.propose(t([5, 6, 7, 8, 5, 6, 7, 9, 1, 5, 6, 7]), 4).tolist() == [9, 1, 5, 6]
    assert lookup.propose(t([5, 6, 7, 8, 5, 6, 7, 9, 1, 5, 6, 7]), 2).tolist() == [9, 1]
    assert lookup.propose(t([3, 7, 4, 0, 2, 7]), 3).tolist() == [4, 0, 2]   # no 3- or 2-gram: the 1-gram (7)
    assert lookup.propose(t([1, 2, 3, 4]), 3).tolist() == []                # no match at all
    assert lookup.propose(t([2]), 3).tolist() == []
    assert lookup.propose(t([2, 2, 2]), 3).tolist() == [2]                 # cut at the end of the context
    with pytest.raises(ValueError, match="ngram_size"):
        PromptLookup(0)


def test_bad_arguments_are_named(models):
    target, x = models["target"], prompt()
    other = tiny_decoder(VOCAB + 1, hidden=32, layers=1, heads=2, kv_heads=1)
    with pytest.raises(ValueError, match=f"{VOCAB + 1}.*{VOCAB}"):
        speculative_generate(target, other, x, 5)
    with pytest.raises(ValueError, match="input_ids"):
        speculative_generate(target, models["small"], x.repeat(2, 1), 5)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        speculative_generate(target, models["small"], x, 5, num_draft_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, models["small"], x, -1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        speculative_generate(target, models["lookup"], x, 200)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, models["small"], x, 5, temperature=0.5)
    with pytest.raises(TypeError, match="draft"):
        speculative_generate(target, "lookup", x, 5)


def test_acceptance_rate_counts_only_checked_drafts(models):
    """A draft after a rejected one is never checked: alpha = accepted / checked, as Leviathan et al. define it.
    The target as its own draft: every draft checked and accepted. The contrarian: one checked per round, none kept."""
    target, x = models["target"], prompt()
    same, contrary = SpeculativeStats(), SpeculativeStats()
    speculative_generate(target, target, x, 20, num_draft_tokens=4, stats=same)
    speculative_generate(target, Contrarian(target), x, 20, num_draft_tokens=4, stats=contrary)
    assert same.acceptance_rate == 1.0 and same.checked == same.drafted == same.accepted
    assert contrary.acceptance_rate == 0.0 and contrary.checked == contrary.target_calls - 1 < contrary.drafted
