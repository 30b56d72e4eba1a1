"""Serving SmolLM2-135M-Instruct (float32) on this CPU: speculative decoding with prompt lookup against plain
greedy decoding, and continuous batching against one request at a time and against one static batch.

Speculative: the model is asked to repeat a given passage (an input-grounded task: the output copies the
prompt, which is where prompt lookup's drafts come from). attnlib.speculative_generate with
attnlib.PromptLookup must give generate's tokens exactly (checked first); the ratio is generate's
seconds / speculative_generate's.

Batching: 16 requests of mixed prompt (8-63 tokens) and output (4-32 tokens) lengths, seeded, cut from
this repository's README, all there from the start. attnlib.serve (continuous batching) must give each
request exactly what generate gives it alone (checked first). Three ratios, each the reference's seconds /
serve's:
- 16 places: the 16 generate calls one after another (goal >= 3);
- 16 places: one static batch of all 16 (left-padded to the longest prompt, decoded to the longest output).
  No goal: every request fits at once and starts at once, so the static batch loses only the steps its
  finished rows keep computing, while serve gathers each row's keys and values through its block table;
- 4 places: static batching with 4 places, the requests in order 4 at a time, each batch padded and
  decoded to its longest output before the next starts. Here a finished request's place stays empty
  until its whole batch is done, where serve gives it to the next request at once, but serve gathers keys
  and values through its block table at every layer: the goal (>= 1) is that continuous batching wins.

Each round times both sides of a ratio back to back, in alternating order; a row is the median of the
per-round ratios (the machine is shared: a bare time would say more about the neighbours than about us).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from attnlib.timing import best_time  # noqa: E402
from benchmarks._harness import Row  # noqa: E402

ROUNDS, NEW, DRAFTS, REQUESTS, PLACES = 5, 48, 8, 16, 4
PASSAGE = ("The Transformer replaces recurrence with attention. Each token forms a query, a key and a value; "
           "a token's output is a weighted average of the values, weighted by how well its query matches each key.")


def copy_prompt(tokenizer) -> torch.Tensor:
    """(1, T): a chat prompt asking the model to repeat PASSAGE word for word."""
    chat = [{"role": "user", "content": "Repeat this passage word for word:\n\n" + PASSAGE}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True,
                                         return_tensors="pt")["input_ids"]


def mixed_requests(tokenizer, n: int = REQUESTS, seed: int = 16) -> tuple[list[torch.Tensor], list[int]]:
    """n prompts of 8-63 tokens cut from README.md and n output lengths of 4-32 tokens, seeded."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    g = torch.Generator().manual_seed(seed)
    lengths, outs = torch.randint(8, 64, (n,), generator=g).tolist(), torch.randint(4, 33, (n,), generator=g).tolist()
    starts = torch.randint(0, len(ids) - 64, (n,), generator=g).tolist()
    return [ids[s:s + T] for s, T in zip(starts, lengths)], outs


def static_batch(model, prompts: list[torch.Tensor], outs: list[int]) -> torch.Tensor:
    """One left-padded batch of every prompt, decoded until the longest output: (B, max T + max n)."""
    from attnlib import generate

    T = max(len(p) for p in prompts)
    ids, mask = torch.zeros(len(prompts), T, dtype=torch.long), torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return generate(model, ids, max(outs), attention_mask=mask)


def static_batches(model, prompts: list[torch.Tensor], outs: list[int], places: int) -> list[torch.Tensor]:
    """Static batching with `places` places: the requests in order, `places` at a time, one static_batch each."""
    return [static_batch(model, prompts[i:i + places], outs[i:i + places]) for i in range(0, len(prompts), places)]


def side_by_side(ours, reference) -> list[float]:
    """Per round: reference's seconds / ours', one call each, the order alternating."""
    ratios = []
    for r in range(ROUNDS):
        if r % 2 == 0:
            t_ours, t_ref = best_time(ours, 1), best_time(reference, 1)
        else:
            t_ref, t_ours = best_time(reference, 1), best_time(ours, 1)
        ratios.append(t_ref / t_ours)
    return ratios


def speculative_row(model, tokenizer) -> Row:
    from attnlib import PromptLookup, generate, speculative_generate
    from attnlib.speculative import SpeculativeStats

    ids, stats = copy_prompt(tokenizer), SpeculativeStats()
    plain = lambda: generate(model, ids, NEW, eos_token_id=2)  # noqa: E731
    fast = lambda: speculative_generate(model, PromptLookup(3), ids, NEW, num_draft_tokens=DRAFTS,  # noqa: E731
                                        eos_token_id=2)
    speculative_generate(model, PromptLookup(3), ids, NEW, num_draft_tokens=DRAFTS, eos_token_id=2, stats=stats)
    if not torch.equal(plain(), fast()):
        raise AssertionError("speculative_generate with prompt lookup did not give generate's tokens")
    ratios = side_by_side(fast, plain)
    return Row(f"SmolLM2-135M fp32, greedy, repeat a {ids.shape[1]}-token prompt's passage ({stats.new_tokens} new "
               f"tokens): speed-up of prompt lookup, k = {DRAFTS} (acceptance {stats.acceptance_rate:.2f}, "
               f"{stats.tokens_per_call:.1f} tokens per target call; per-round {min(ratios):.2f}-{max(ratios):.2f})",
               "attnlib speculative_generate + PromptLookup(3)", "attnlib generate", statistics.median(ratios), 1.5, True)


def batching_rows(model, tokenizer) -> list[Row]:
    from attnlib import generate, serve

    prompts, outs = mixed_requests(tokenizer)
    alone = lambda: [generate(model, p[None], n)[0] for p, n in zip(prompts, outs)]  # noqa: E731
    served = lambda: serve(model, prompts, outs, max_batch_size=REQUESTS)  # noqa: E731
    served_few = lambda: serve(model, prompts, outs, max_batch_size=PLACES)  # noqa: E731
    static = lambda: static_batch(model, prompts, outs)  # noqa: E731
    static_few = lambda: static_batches(model, prompts, outs, PLACES)  # noqa: E731
    expected = alone()
    for places, run in ((REQUESTS, served), (PLACES, served_few)):
        if not all(torch.equal(a, b) for a, b in zip(expected, run())):
            raise AssertionError(f"serve with {places} places did not give each request generate's tokens alone")
    what = f"SmolLM2-135M fp32, greedy, {REQUESTS} requests ({sum(outs)} new tokens, prompts 8-63, outputs 4-32)"
    one, padded, few = side_by_side(served, alone), side_by_side(served, static), side_by_side(served_few, static_few)
    span = lambda r: f"per-round {min(r):.2f}-{max(r):.2f}"  # noqa: E731
    return [Row(f"{what}: throughput of continuous batching / one at a time ({span(one)})",
                f"attnlib serve, {REQUESTS} places", "16 generate calls, one after another", statistics.median(one),
                3.0, True),
            Row(f"{what}: throughput of continuous batching / one static batch of all {REQUESTS}, padded to its "
                f"longest ({span(padded)}; no goal: all fit and start at once, see the docstring)",
                f"attnlib serve, {REQUESTS} places", "generate on one left-padded batch", statistics.median(padded),
                None, True),
            Row(f"{what}: throughput of continuous batching / static batching, {PLACES} places ({span(few)})",
                f"attnlib serve, {PLACES} places", f"generate on {REQUESTS // PLACES} left-padded batches of {PLACES}, "
                "one after another", statistics.median(few), 1.0, True)]


def rows() -> list[Row]:
    from attnlib import load_smollm2

    model, tokenizer = load_smollm2()
    with torch.inference_mode():
        return [speculative_row(model, tokenizer), *batching_rows(model, tokenizer)]


if __name__ == "__main__":
    from benchmarks._harness import print_table

    torch.set_num_threads(2)
    print_table(rows())
