"""Greedy decoding on a tiny random Llama: the KV cache against recomputing, and attnlib against transformers.

256 new tokens from a 32-token prompt (hidden 256, 4 layers, 8 query heads, 2 key/value heads).
The three decoders must produce the same tokens before anything is timed. Both rows are speed
ratios (higher is better): uncached time / cached time, and attnlib's tokens/s / transformers'.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from attnlib.timing import time_ratio  # noqa: E402
from benchmarks._harness import Row  # noqa: E402

PROMPT, NEW = 32, 256


def tiny_llama():
    """A seeded random LlamaForCausalLM built from a config (no download), GQA with H_kv = 2 < H = 8."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def rows() -> list[Row]:
    from attnlib import LlamaDecoder, generate

    hf = tiny_llama()
    ours = LlamaDecoder.from_hf(hf)
    prompt = torch.randint(0, hf.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    ones = torch.ones_like(prompt)

    def cached():
        return generate(ours, prompt, NEW)

    def uncached():
        return generate(ours, prompt, NEW, use_cache=False)

    def theirs():
        return hf.generate(prompt, attention_mask=ones, max_new_tokens=NEW, do_sample=False)

    with torch.inference_mode():  # these runs also warm both sides up
        tokens = cached()
        for name, other in (("generate(use_cache=False)", uncached()), ("transformers' generate", theirs())):
            if not torch.equal(tokens, other):
                raise AssertionError(f"attnlib's cached generate and {name} chose different tokens")
    speedup = 1.0 / time_ratio(cached, uncached, rounds=7, repeats=3, warmup=0)
    per_second = 1.0 / time_ratio(cached, theirs, rounds=7, repeats=1, warmup=0)
    what = f"greedy decode, {NEW} new tokens from {PROMPT}, tiny Llama (D 256, 4 layers, H 8, H_kv 2)"
    return [
        Row(f"{what}: speed-up of the cache (uncached time / cached time)",
            "attnlib generate, KV cache", "attnlib generate(use_cache=False)", speedup, 7.0, True),
        Row(f"{what}: tokens/s (ours / transformers')",
            "attnlib generate, KV cache", "transformers LlamaForCausalLM.generate", per_second, 1.8, True),
    ]


if __name__ == "__main__":
    from benchmarks._harness import print_table

    print_table(rows())
