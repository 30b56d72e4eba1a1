"""Chapter 12's stored texts would come out the same on another CPU: no step of its greedy answer and of its
sampled answers was a near-tie that float32 rounding (another order of additions in each matrix product)
could tip. The rounding r is measured against the same model in float64; a greedy step is safe if its top
two logits are more than 10 r apart, a draw if it lies more than 5 times 2r/tau from the edges of its token's
interval of cumulative probability (a logit moving by r moves a probability pi by about 2 r pi / tau at
most), and a draw must pick the same token if its top-p cut lies within that distance and another CPU keeps
one token fewer or more, or if its top-k cut does and another CPU keeps the (k+1)-th most likely token
instead of the k-th. The prompt and settings are chapter 12's (sections 12.3 and its samples)."""

import copy

import pytest
import torch

from attnlib import generate, load_smollm2
from attnlib.generation import top_k_filter, top_p_filter

QUESTION = "What is the capital of France, and what is it famous for? Answer in one sentence."
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)   # chapter 12's, with seed 2, 3 rows
SEED, ROWS, NEW, NEW_GREEDY = 2, 3, 48, 80


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """(decoder, its float64 copy, prompt ids (1, T), greedy answer, sampled answers (ROWS, T + n), eos)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        decoder, tokenizer = load_smollm2()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                           return_dict=True, return_tensors="pt")["input_ids"]
    eos = tokenizer.eos_token_id
    answer = generate(decoder, prompt, NEW_GREEDY, eos_token_id=eos)
    samples = generate(decoder, prompt.expand(ROWS, -1), NEW, eos_token_id=eos,
                       generator=torch.Generator().manual_seed(SEED), **SAMPLING)
    return decoder, copy.deepcopy(decoder).double(), prompt, answer, samples, eos


def step_logits(model, ids: torch.Tensor, T: int) -> torch.Tensor:
    """(B, n, vocab): the logits that chose tokens T, T + 1, ... of ids, from one forward pass."""
    with torch.inference_mode():
        return model(ids[:, :-1])[:, T - 1:]


def rounding(chat, ids: torch.Tensor) -> float:
    """The most float32 rounding moves these steps' logits, against the float64 model."""
    decoder, decoder64, prompt, *_ = chat
    T = prompt.shape[1]
    return (step_logits(decoder, ids, T).double() - step_logits(decoder64, ids, T)).abs().max().item()


def test_the_greedy_answer_has_no_near_tie(chat):
    decoder, _, prompt, answer, _, eos = chat
    logits = step_logits(decoder, answer, prompt.shape[1])
    assert torch.equal(logits.argmax(dim=-1), answer[:, prompt.shape[1]:])   # they are the greedy choices
    assert answer[0, -1] == eos
    r = rounding(chat, answer)
    top2 = logits.topk(2, dim=-1).values
    assert r < 1e-3 and (top2[..., 0] - top2[..., 1]).min().item() > 10 * r


def test_every_draw_is_far_from_the_edges_of_its_interval(chat):
    decoder, _, prompt, answer, samples, eos = chat
    T, tau = prompt.shape[1], SAMPLING["temperature"]
    bound = 2 * max(rounding(chat, answer), rounding(chat, samples)) / tau
    g = torch.Generator().manual_seed(SEED)                              # generate drew one u per row and step
    logits = step_logits(decoder, samples, T) / tau                      # (B, n, vocab)
    for t in range(logits.shape[1]):
        u = torch.rand(ROWS, 1, generator=g, dtype=torch.float64)
        kept = top_k_filter(logits[:, t], SAMPLING["top_k"])
        probs = top_p_filter(kept, SAMPLING["top_p"]).softmax(dim=-1).double()   # (B, vocab)
        cdf = probs.cumsum(dim=-1)
        token = samples[:, T + t, None]
        upper = cdf.gather(-1, token)
        lower = upper - probs.gather(-1, token)
        drawing = (samples[:, T:T + t] != eos).all(dim=-1)               # rows still writing (not past their eos)
        margin = torch.minimum(u * cdf[:, -1:] - lower, upper - u * cdf[:, -1:])[drawing, 0]
        assert margin.min() > 5 * bound, f"step {t}: a draw within 5 x 2r/tau of its interval's edge"
        full, order = kept.double().softmax(dim=-1).sort(dim=-1, descending=True)   # after top-k, most likely first
        before = full.cumsum(dim=-1) - full                              # the mass before each token
        for b in drawing.nonzero().flatten().tolist():
            n = int((probs[b] > 0).sum())                                # the nucleus's size
            if (before[b, n - 1:n + 1] - SAMPLING["top_p"]).abs().min() < bound:
                for k in (n - 1, n + 1):                                 # another CPU could keep one token fewer or more
                    alt = torch.zeros_like(full[b]).scatter(0, order[b, :k], full[b, :k]).cumsum(dim=0)
                    pick = torch.searchsorted(alt, u[b] * alt[-1:], right=True)
                    assert k == 0 or int(pick) == int(token[b]), f"step {t}, row {b}: the top-p cut decides the token"
            row = logits[b, t]                                           # (vocab,), unfiltered
            top = row.topk(SAMPLING["top_k"] + 1).indices                # the k + 1 most likely, most likely first
            if (row[top[-2]] - row[top[-1]]).abs() < bound:              # another CPU could rank the (k+1)-th above the k-th
                swapped = torch.cat([top[:-2], top[-1:]])                # the k kept there
                alt_logits = torch.full_like(row, float("-inf")).scatter(0, swapped, row[swapped])
                alt = top_p_filter(alt_logits, SAMPLING["top_p"]).softmax(dim=-1).double().cumsum(dim=0)
                pick = torch.searchsorted(alt, u[b] * alt[-1:], right=True)
                assert int(pick) == int(token[b]), f"step {t}, row {b}: the top-k cut decides the token"
