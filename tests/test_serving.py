"""attnlib.serve: continuous batching over the paged cache, each output equal to generating that request
alone (token for token), requests joining as others finish, blocks taken as sequences grow and freed
at once, admission under a block budget, eos, bad input named; PagedKVCache's independent sequences."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from attnlib import LlamaDecoder, PagedKVCache, generate, serve
from attnlib.serving import ServeStats
from test_speculative import tiny_decoder

torch.set_num_threads(1)
VOCAB = 64


@pytest.fixture(scope="module")
def decoder():
    return tiny_decoder(VOCAB)


def requests(n: int = 16, seed: int = 0) -> tuple[list[torch.Tensor], list[int]]:
    """n prompts of 1..30 tokens and output lengths of 1..24, seeded."""
    g = torch.Generator().manual_seed(seed)
    lengths, outs = torch.randint(1, 31, (n,), generator=g).tolist(), torch.randint(1, 25, (n,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (T,), generator=g) for T in lengths], outs


def expected_blocks(stats: ServeStats, prompts, outs, block_size: int) -> list[int]:
    """Blocks the running requests hold after each iteration, if each takes ceil(cached / block_size)
    blocks and a finished one holds none: cached = prompt + decode steps so far."""
    steps, held = [0] * len(prompts), []
    for i, batch in enumerate(stats.batches):
        for r in batch:
            steps[r] += 1
        held.append(sum(-(-(len(prompts[r]) + steps[r]) // block_size) for r in range(len(prompts))
                        if stats.joined[r] <= i and steps[r] + 1 < outs[r]))   # 1 + steps tokens so far
    return held


def test_sixteen_mixed_requests_equal_one_at_a_time_generate(decoder):
    prompts, outs = requests()
    stats = ServeStats()
    served = serve(decoder, prompts, outs, max_batch_size=4, block_size=4, stats=stats)
    for i, (p, n) in enumerate(zip(prompts, outs)):
        assert torch.equal(served[i], generate(decoder, p[None], n)[0]), f"request {i}"
    assert max(stats.batch_sizes) == 4
    assert sum(len(t) for t in stats.token_s) == sum(outs)
    # requests joined while others were running: an iteration whose batch mixes a newcomer with older requests
    refilled = [i for i, batch in enumerate(stats.batches)
                if i > 0 and any(stats.joined[r] == i for r in batch) and any(stats.joined[r] < i for r in batch)]
    assert len(refilled) >= 5
    assert all(stats.joined[r] >= 0 for r in range(16)) and sorted(stats.joined) == stats.joined  # first come, first served
    # blocks are taken as sequences grow and given back the iteration a request finishes
    assert stats.blocks_in_use == expected_blocks(stats, prompts, outs, 4)
    assert stats.blocks_in_use[-1] == 0 and max(stats.blocks_in_use) <= stats.num_blocks
    ttft = stats.time_to_first_token
    assert all(a <= b for a, b in zip(ttft, ttft[1:])) and all(t[0] <= t[-1] for t in stats.token_s)


def test_a_block_budget_holds_requests_back_and_changes_nothing(decoder):
    prompts, outs = requests(8, seed=1)
    needs = [-(-(len(p) + n - 1) // 4) for p, n in zip(prompts, outs)]
    stats = ServeStats()
    served = serve(decoder, prompts, outs, max_batch_size=8, block_size=4, max_blocks=max(needs) + 2, stats=stats)
    assert all(torch.equal(s, generate(decoder, p[None], n)[0]) for s, p, n in zip(served, prompts, outs))
    for batch in stats.batches:                               # the running requests fit the budget at their longest
        assert sum(needs[r] for r in batch) <= max(needs) + 2
    assert max(stats.blocks_in_use) <= max(needs) + 2 and max(stats.batch_sizes) < 8


def test_eos_ends_a_request_early(decoder):
    prompts, outs = requests(8, seed=2)
    outs = [20] * 8
    alone = [generate(decoder, p[None], 20)[0] for p in prompts]
    eos = [int(alone[0][len(prompts[0]) + 3]), int(alone[1][len(prompts[1]) + 7])]
    served = serve(decoder, prompts, outs, max_batch_size=3, block_size=8, eos_token_id=eos)
    ended = 0
    for s, p in zip(served, prompts):
        expected = generate(decoder, p[None], 20, eos_token_id=eos)[0]
        assert torch.equal(s, expected)
        ended += len(expected) < len(p) + 20
    assert ended >= 2


def test_an_int_budget_and_zero_new_tokens(decoder):
    prompts, _ = requests(5, seed=3)
    served = serve(decoder, prompts, 6, max_batch_size=2)
    assert all(torch.equal(s, generate(decoder, p[None], 6)[0]) for s, p in zip(served, prompts))
    assert all(torch.equal(s, p) for s, p in zip(serve(decoder, prompts, [0] * 5), prompts))


def test_a_sliding_window_model():
    config = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, sliding_window=5,
                           initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    decoder = LlamaDecoder.from_hf(MistralForCausalLM(config).eval())
    prompts, outs = requests(6, seed=4)
    served = serve(decoder, prompts, outs, max_batch_size=3, block_size=4)
    assert all(torch.equal(s, generate(decoder, p[None], n)[0]) for s, p, n in zip(served, prompts, outs))


def test_bad_input_is_named(decoder):
    p = torch.arange(5)
    cases = [(([], 4), "prompts"), (([p, p[:0]], 4), r"prompts\[1\]"), (([p, p.float()], 4), r"prompts\[1\]"),
             (([p, p + 60], 4), r"prompts\[1\].*vocab"), (([p, torch.arange(126) % VOCAB], 4), r"prompts\[1\].*max_position_embeddings"),
             (([p, p], [1, 2, 3]), "max_new_tokens"), (([p], -1), "max_new_tokens"), ((p, 4), "prompts")]
    for (prompts, n), match in cases:
        with pytest.raises(ValueError, match=match):
            serve(decoder, prompts, n)
    with pytest.raises(ValueError, match=r"prompts\[1\].*max_blocks=2"):
        serve(decoder, [p, torch.arange(40)], 4, block_size=8, max_blocks=2)
    with pytest.raises(ValueError, match="max_batch_size"):
        serve(decoder, [p], 4, max_batch_size=0)


# --- PagedKVCache's independent sequences ------------------------------------------------------------

def test_a_batch_of_sequences_at_different_lengths_equals_each_alone(decoder):
    cache = PagedKVCache(block_size=4)
    prompts = [torch.arange(n) % VOCAB + n for n in (3, 9, 1)]
    seqs = [cache.add_sequence() for _ in prompts]
    with torch.no_grad():
        for s, p in zip(seqs, prompts):
            decoder(p[None], cache.batch([s]))                # each prefill alone
        batch = cache.batch(seqs)
        assert batch.seq_len == 9 and batch.batch_size == 3
        step = torch.tensor([[7], [8], [9]])
        logits = decoder(step, batch, attention_mask=batch.attention_mask(1))[:, -1]   # (3, V)
        for i, p in enumerate(prompts):
            torch.testing.assert_close(logits[i], decoder(torch.cat((p, step[i]))[None])[0, -1], rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="one forward"):
            decoder(step, batch)
    assert [cache.sequence_length(s) for s in seqs] == [4, 10, 2]
    assert cache.num_blocks == 1 + 3 + 1 and cache.nbytes == batch.nbytes == 16 * 2 * (2 * 2 * 16) * 4


def test_freed_blocks_go_back_to_the_pool():
    cache = PagedKVCache(block_size=2, max_blocks=4)
    k = torch.randn(1, 1, 3, 2)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.batch([a]).update(0, k, k)                          # 3 positions: 2 blocks
    cache.batch([b]).update(0, k, k)
    assert cache.num_blocks == 4
    with pytest.raises(ValueError, match="max_blocks=4"):
        cache.batch([a]).update(0, k, k)
    cache.free_sequence(a)
    assert cache.num_blocks == 2
    c = cache.add_sequence()
    keys, _ = cache.batch([c]).update(0, 2 * k, 2 * k)        # takes a's blocks again
    assert cache.num_blocks == 4 and torch.equal(keys, 2 * k)
    with pytest.raises(ValueError, match="seq="):
        cache.free_sequence(a)
    with pytest.raises(ValueError, match="max_blocks"):
        PagedKVCache(4, max_blocks=0)
    with pytest.raises(ValueError, match="independent sequences"):
        cache.update(0, k, k)
