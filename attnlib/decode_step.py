"""One cached decode step with the Python taken out: what `generate` runs after the prefill.

After the prefill, a step moves one token per sequence through every block. Its arithmetic is small
(B rows against each weight matrix), so on a CPU the Python around the ops (module calls, attribute
lookups, the input checks that every layer repeats) costs about as much as the ops themselves
(`benchmarks/bench_decode.py`). `DecodeStep` does once, when it is built, what LlamaDecoder.forward
redoes at every call: it checks the cache against the model, collects each layer's weights, and
sizes the cache and the rotary table for every step to come. A step then runs the operations of
LlamaBlock and MultiHeadAttention, in the same order, on plain tensors.

A step is memory-bound: each matrix is read once for a few rows (chapter 12). Every product goes through
torch.mm on the weight as LlamaDecoder stores it, column-major (W.t() contiguous), exactly as F.linear
does, so a step's logits are bit-identical to LlamaDecoder.forward's (tests/test_decode_step.py).
oneDNN offers another kernel, on a copy of each weight packed once in its own layout: depending on the
CPU it reads the weights faster or slower than BLAS, and the copy doubles the memory the weights take, so
a step keeps to torch.mm; benchmarks/bench_kernels.py times both on your CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import rms_norm
from attnlib.caches import KVCache, check_cache

__all__ = ["DecodeStep"]


class DecodeStep:
    """step(token) -> logits: LlamaDecoder.forward(token, cache, last_only=True) for one new token.

    Built after the prefill has filled `cache` with the prompt: real (B, total) bool (True = real
    token) or None, and total = the prompt's length + the new tokens (the last step's slot + 1).
    """

    def __init__(self, decoder: LlamaDecoder, cache: KVCache, real: torch.Tensor | None, total: int) -> None:
        B, past = cache.batch_size, cache.seq_len
        check_cache(cache, len(decoder.blocks), B)  # the checks forward runs: this model's cache, one length
        attn = decoder.blocks[0].attn
        self.H, self.H_kv, self.eps = attn.num_heads, attn.num_kv_heads, decoder.norm.eps
        self.gqa = attn.num_heads > attn.num_kv_heads
        self.embed, self.norm = decoder.embed.weight, decoder.norm.weight
        self.cache, self.slot, self.real = cache, past, real
        for i in range(len(cache)):  # room for every step: no buffer grows, the steps write in place
            if cache._k[i].shape[2] < total:
                cache._grow(i, total)
        self.layers = [(b.attn_norm.weight, _product(b.attn.qkv), _product(b.attn.out),
                        b.mlp_norm.weight, _product(b.mlp.gate_up), _product(b.mlp.down),
                        cache._k[i], cache._v[i]) for i, b in enumerate(decoder.blocks)]
        self.lm_head = _product(decoder.lm_head)
        # position of each step's token: its slot, or (left padding) the number of real tokens before it
        positions = torch.arange(total) if real is None else (real.long().cumsum(dim=-1) - 1).clamp(min=0)
        cos, sin = decoder.rotary.cos_sin(positions.to(self.embed.device))  # (total, Dh) or (B, total, Dh)
        cos, sin = cos.to(self.embed.dtype), sin.to(self.embed.dtype)
        # rotate_half(x)·sin = (-x2, x1)·(s1, s2) = roll(x, Dh/2)·(-s1, s2), bit for bit (negation is exact)
        s1, s2 = sin.chunk(2, dim=-1)
        sin = torch.cat((-s1, s2), dim=-1)
        if real is not None:  # (B, total, Dh) -> (B, 1, total, Dh): the same angle for every head
            cos, sin = cos[:, None], sin[:, None]
        self.rope = [(cos[..., t:t + 1, :], sin[..., t:t + 1, :]) for t in range(total)]  # (1, Dh) or (B, 1, 1, Dh)

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """token (B, 1) ids -> logits (B, 1, vocab); its keys and values go to the cache's next slot.

        One token per row, so the step works on (B, D) rows, and (B, H, 1, Dh) is the same memory as
        forward's (B, 1, H, Dh) transposed: no reshape or transpose is needed around the products.
        """
        t, H, H_kv, eps = self.slot, self.H, self.H_kv, self.eps
        B = token.shape[0]
        cos, sin = self.rope[t]
        allowed = None if self.real is None else self.real[:, None, None, :t + 1]  # (B, 1, 1, t + 1)
        x = F.embedding(token.view(B), self.embed)                                  # (B, D)
        for w_an, qkv_proj, out_proj, w_mn, gate_up, down, k_buf, v_buf in self.layers:
            qkv = qkv_proj(rms_norm(x, w_an, eps)).view(B, H + 2 * H_kv, 1, -1)  # (B, H + 2 H_kv, 1, Dh)
            qk, v = qkv.split_with_sizes([H + H_kv, H_kv], dim=1)
            qk = qk * cos + qk.roll(qk.shape[-1] // 2, dims=-1) * sin  # RoPE on q and k at once
            k_buf.narrow(2, t, 1).copy_(qk.narrow(1, H, H_kv))       # the cache's slot t
            v_buf.narrow(2, t, 1).copy_(v)
            y = F.scaled_dot_product_attention(qk.narrow(1, 0, H), k_buf.narrow(2, 0, t + 1), v_buf.narrow(2, 0, t + 1),
                                               attn_mask=allowed, enable_gqa=self.gqa)  # (B, H, 1, Dh)
            x = x + out_proj(y.reshape(B, -1))                       # (B, H, 1, Dh) -> (B, H·Dh)
            gate, up = gate_up(rms_norm(x, w_mn, eps)).chunk(2, dim=-1)
            x = x + down(F.silu(gate) * up)
        self.slot = t + 1
        self.cache._len[:] = [t + 1] * len(self.layers)  # the cache holds the new token in every layer
        return self.lm_head(rms_norm(x, self.norm, eps)).view(B, 1, -1)  # (B, 1, vocab)


def _product(linear: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """x (B, in) -> x W^T + b (B, out) for the layer's weight W (out, in): what F.linear runs on a (B, in)
    input, addmm(b, x, W.t()), with W.t() taken once instead of at every step."""
    weight_t, bias = linear.weight.t(), linear.bias
    return (lambda x: torch.mm(x, weight_t)) if bias is None else (lambda x: torch.addmm(bias, x, weight_t))
