"""Checkers for chapter 8 (the KV cache): one layer's cache update, left-padded positions, a cached decode loop."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.decoder import LlamaDecoder
from attnlib.exercises._core import CandidateError, as_tensor, checker, expect_close, run
from attnlib.exercises._arguments import altered, module_text, snapshot
from attnlib.exercises.ch07 import _tensor_or_named
from attnlib.generation import generate
from attnlib.caches import KVCache

__all__ = ["check_cache_update", "check_left_pad_positions", "check_cached_decode"]


def _pair(got: object, what: str) -> tuple[object, object]:
    """The reader's (k_all, v_all); anything but a pair is a CandidateError."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CandidateError(f"{what} should return a pair (k_all, v_all), got {type(got).__name__}")
    return got[0], got[1]


@checker("cache update")
def check_cache_update(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> str:
    """fn(past_k, past_v, k, v) with past (B, H_kv, S_past, Dh) and new (B, H_kv, S_new, Dh) returns
    (k_all, v_all), each (B, H_kv, S_past + S_new, Dh): the past, then the new positions."""
    B, H_kv, S_past, S_new, Dh = 2, 3, 5, 5, 4  # B, H_kv, S, Dh all different: no axis can stand in for another
    past_k, past_v, k, v = (torch.randn(B, H_kv, S, Dh) for S in (S_past, S_past, S_new, S_new))
    what = f"update(past_k, past_v, k, v) with past {(B, H_kv, S_past, Dh)} and new {(B, H_kv, S_new, Dh)}"
    got_k, got_v = _pair(run(fn, past_k.clone(), past_v.clone(), k.clone(), v.clone(), what=what), what)
    shape = (B, H_kv, S_past + S_new, Dh)
    pairs = (("k_all", got_k, past_k, k, (past_v, v)), ("v_all", got_v, past_v, v, (past_k, k)))
    for name, got, past, new, other in pairs:
        label = f"{what}: {name}"
        got = _tensor_or_named(got, label, shape, {
            "the new positions only: this step's queries must see every cached position too": new,
            "the past only: the new positions were never appended": past,
            "a concatenation along the head axis (dim=1) instead of the sequence axis (dim=2)":
                torch.cat([past, new], dim=1),
            "a concatenation along the head width Dh (dim=-1) instead of the sequence axis (dim=2)":
                torch.cat([past, new], dim=-1),
        })
        expect_close(got, torch.cat([past, new], dim=2), label, mistakes={
            "the new positions before the cached ones: keep time order, torch.cat([past, new], dim=2)":
                torch.cat([new, past], dim=2),
            "keys and values swapped": torch.cat(other, dim=2),
            f"the new keys and values swapped: {name} must end with the new {name[0]}, not the other one":
                torch.cat([past, other[1]], dim=2),
        }, axes=("batch", "kv head", "position", "feature"))
    for S_past, S_new in ((0, 3), (6, 1)):  # the prefill into an empty cache, then one decode step
        past_k, past_v, k, v = (torch.randn(B, H_kv, S, Dh) for S in (S_past, S_past, S_new, S_new))
        label = f"update with past {(B, H_kv, S_past, Dh)} and new {(B, H_kv, S_new, Dh)}"
        got_k, got_v = _pair(run(fn, past_k, past_v, k.clone(), v.clone(), what=label), label)
        for name, got, want in (("k_all", got_k, torch.cat([past_k, k], 2)), ("v_all", got_v, torch.cat([past_v, v], 2))):
            expect_close(as_tensor(got, f"{label}: {name}", shape=want.shape), want, f"{label}: {name}")
    return "the new keys and values appended after the cached ones along the sequence axis (dim=2)"


@checker("left-padded positions")
def check_left_pad_positions(fn: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """fn(attention_mask) with a (B, T) 0/1 mask (left padding, 1 = real token) returns position ids
    (B, T): each real token's position is the number of real tokens before it. Padded slots may hold anything."""
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1],
                         [1, 1, 1, 1, 1, 1, 1],
                         [0, 0, 0, 0, 0, 1, 1],
                         [0, 1, 1, 1, 1, 1, 1]])  # (B, T) = (4, 7)
    what = "positions(attention_mask) with a left-padded mask of shape (4, 7)"
    got = as_tensor(run(fn, mask.clone(), what=what), what, shape=mask.shape)
    if got.is_floating_point() or got.dtype == torch.bool:
        raise CandidateError(f"{what} returned {got.dtype}: position ids index a table, so they must be "
                             f"integers (torch.long)")
    real = mask.bool()
    count = mask.cumsum(dim=-1)  # real tokens up to and including each slot
    mistakes = {
        "0, 1, ..., T-1 for every row (torch.arange): the padding shifts each real token's position":
            torch.arange(mask.shape[1]).expand_as(mask),
        "positions that start at 1: the cumulative sum counts the token itself, so subtract 1": count,
        "a cumulative sum over the batch axis (dim=0) instead of along each sequence (dim=-1)":
            mask.cumsum(dim=0) - 1,
        "the padding before each slot counted instead of the real tokens ((1 - mask).cumsum(-1), the mask "
        "inverted): a real token's position is the number of real tokens before it, mask.cumsum(-1) - 1":
            (1 - mask).cumsum(dim=-1),
        "the padding counted instead of the real tokens (the mask inverted)": (1 - mask).cumsum(dim=-1) - 1,
    }
    expect_close(got[real], (count - 1)[real], f"{what}, at the real tokens",
                 mistakes={name: m[real] for name, m in mistakes.items()})
    return "each real token's position is the number of real tokens before it, whatever the padding"


class _Recorder:
    """A decoder stand-in that forwards every call and records (tokens fed, cached positions before)."""

    def __init__(self, decoder: LlamaDecoder) -> None:
        self.decoder, self.calls = decoder, []
        self.max_position_embeddings = decoder.max_position_embeddings

    def __call__(self, input_ids: torch.Tensor, cache: KVCache | None = None, **kwargs) -> torch.Tensor:
        before = cache.seq_len if isinstance(cache, KVCache) else None
        logits = self.decoder(input_ids, cache, **kwargs)
        self.calls.append((int(input_ids.shape[-1]), before))
        return logits

    forward = __call__                                  # decoder.forward(ids, cache) is counted too

    def __getattr__(self, name: str):                   # anything else a loop reads: the decoder's
        if name == "decoder":                           # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.decoder, name)


def _tiny_decoder() -> LlamaDecoder:
    torch.manual_seed(0)
    return LlamaDecoder(vocab_size=50, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64,
                        max_position_embeddings=256).eval()


@checker("cached greedy decode")
def check_cached_decode(fn: Callable[[Callable, torch.Tensor, int], torch.Tensor]) -> str:
    """fn(decoder, input_ids, max_new_tokens) with input_ids (1, T) returns (1, T + max_new_tokens): greedy
    tokens, the prompt fed once, then one new token per call into the same KVCache."""
    decoder, T, new = _tiny_decoder(), 6, 8
    prompt = torch.randint(0, 50, (1, T))
    recorder = _Recorder(decoder)
    what = f"decode(decoder, input_ids, max_new_tokens={new}) with input_ids of shape (1, {T})"
    before = snapshot(decoder)  # the recorder passes on what it does not define: `decoder.parameters()` too
    with torch.no_grad():
        got = run(fn, recorder, prompt.clone(), new, what=what)
        if change := altered(before, decoder):
            raise CandidateError(module_text(what, [f"the decoder ({change})"]))
        got = as_tensor(got, what)
        expected = generate(decoder, prompt, new)
        no_prefill_argmax = _first_token_logits(decoder, prompt, new)
    if tuple(got.shape) != (1, T + new):
        raise CandidateError(f"{what} has shape {tuple(got.shape)}, expected {(1, T + new)}: the prompt "
                             f"followed by exactly {new} new tokens")
    if not torch.equal(got[:, :T], prompt):
        raise CandidateError(f"{what} does not start with the prompt: return the prompt, then the new tokens")
    refed = [n for n, before in recorder.calls[1:] if before and n > 1]
    if refed:
        raise CandidateError(f"{what} fed {refed[0]} tokens in one call after the prompt, with a cache that "
                             f"already held them: their keys and values are cached twice and the positions "
                             f"shift; feed only the newest token, input_ids[:, -1:]")
    fed = [n for n, _ in recorder.calls]
    if any(before == 0 for _, before in recorder.calls[1:]):
        right = "right tokens, but " if torch.equal(got, expected) else ""
        raise CandidateError(f"{what}: {right}a new empty KVCache was made after the first call, so the later calls "
                             f"see none of the earlier tokens ({sum(fed)} tokens fed in {len(fed)} calls); make one "
                             f"cache before the loop and pass it to every call")
    if not torch.equal(got, expected):
        if torch.equal(got, no_prefill_argmax):
            raise CandidateError(f"{what} chose the first new token from the logits of the prompt's FIRST "
                                 f"token: the next token comes from the last row, logits[:, -1]")
        raise CandidateError(f"{what} chose other tokens than greedy decoding: take logits[:, -1].argmax(-1) "
                             f"of each call, and feed each token exactly once")
    if any(before is None for _, before in recorder.calls):
        raise CandidateError(f"right tokens, but some calls had no cache: {sum(fed)} tokens fed in "
                             f"{len(fed)} calls instead of {T + new - 1}; pass one KVCache to every call")
    return _count_calls(fed, T, new)


def _count_calls(fed: list[int], T: int, new: int) -> str:
    """The success message for a loop that fed `fed` tokens per call, or the CandidateError naming its waste:
    a greedy loop makes `new` calls, the prefill (T tokens) then one token for each new token but the last."""
    if fed[0] != T:
        raise CandidateError(f"right tokens, but the prompt was fed in pieces (the first call fed {fed[0]} of its "
                             f"{T} tokens): feed the whole prompt in one call, the prefill, then one token per call")
    steps = len(fed) - 1
    if steps > new:
        per_step = f" (about {round(steps / (new - 1))} calls per step)" if steps >= 2 * (new - 1) else ""
        raise CandidateError(f"right tokens, but the decoder was called {len(fed)} times for {new} new tokens"
                             f"{per_step}, feeding {sum(fed)} tokens in all; a greedy loop needs {new} calls: "
                             f"the prefill, then one call per new token but the last. A loop that calls the "
                             f"decoder twice per step (say, once to peek at the logits and once to extend the "
                             f"cache) does every step's work twice")
    note = ("" if steps == new - 1 else
            "; the last call fed the final token, whose logits are never used: the loop can stop before it")
    return (f"the same tokens as attnlib.generate in {len(fed)} decoder calls: the {T} prompt tokens once, then "
            f"one token per call{note}")


def _first_token_logits(decoder: LlamaDecoder, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """The tokens a loop gets when it takes the first row of the prefill's logits instead of the last."""
    cache, out = KVCache(), prompt
    logits = decoder(prompt, cache)[:, :1]
    for _ in range(new):
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        logits = decoder(out[:, -1:], cache)
    return out
