"""One cached decode step with the Python taken out: what `generate` runs after the prefill.

After the prefill, a step moves one token per sequence through every block. Its arithmetic is small
(B rows against each weight matrix), so on a CPU the Python around the ops (module calls, attribute
lookups, the input checks that every layer repeats) costs about as much as the ops themselves
(`benchmarks/bench_decode.py`). `DecodeStep` does once, when it is built, what LlamaDecoder.forward
redoes at every call: it checks the cache against the model, collects each layer's weights, and
sizes the cache and the rotary table for every step to come. A step then runs the operations of
LlamaBlock and MultiHeadAttention, in the same order, on plain tensors.

A step is memory-bound: each matrix is read once for a few rows (chapter 12). In a model of
PACK_MODEL_MIN parameters or more, each float32 matrix of PACK_MIN elements or more is therefore
multiplied by oneDNN's kernel for a weight prepacked in oneDNN's own blocked layout, which reads it
with every thread; whether that beats torch.mm depends on the CPU (on the hosts this book was run
on, timed warm on one matrix, it read SmolLM2's output layer from about 1.5x slower to about 2x
faster; benchmarks/bench_kernels.py times the layouts and kernels on yours). A call cost ~10 us more than torch.mm's on the machine it was
timed on.
The copy is packed without a batch size (told one row, oneDNN keeps the plain (out, in) layout, which
read SmolLM2's matrices more slowly where it was timed). It is made the first time it is needed, in
generate during the prefill (packed_linears) or when a DecodeStep is built, reused while the weight
is unchanged, and held next to the weight: the packed matrices take as many bytes again
(packed_bytes). Other matrices go through torch.mm exactly as F.linear does, so the logits of a model
with nothing packed are bit-identical to LlamaDecoder.forward's, and those of a larger one equal them
to float32 rounding (tests/test_decode_step.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakTensorKeyDictionary

from attnlib.decoder import LlamaDecoder
from attnlib.llama_block import rms_norm
from attnlib.caches import KVCache, check_cache

__all__ = ["DecodeStep", "packed_linears", "packed_bytes", "PACK_MIN", "PACK_MODEL_MIN"]

PACK_MIN = 2**17        # elements of a matrix (512 KiB of float32): from here packed beat torch.mm from memory
PACK_MODEL_MIN = 2**22  # parameters of the model. Measured on this book's 2-core machine, a step with packing
# against one without: 1.2x slower at 3.3M parameters (bench_decode's model: D 256, 8 heads, 2 key/value heads,
# 4 layers, d_ff 688, vocab 1000), no faster at 4.7M (D 384, 6 and 2 heads, 2 layers, d_ff 1024, vocab 2000),
# 1.5x faster at 6.9M (D 512, 8 and 2 heads, 1 layer, d_ff 1376, vocab 4000). Not the matrices' size: the 4.7M
# model's are all of PACK_MIN elements or more. Why it gains nothing was not measured; chapter 8 names two
# unmeasured candidates: its 15.7 MB read per step (19.3 MB in the 6.9M model) staying in the last-level
# cache between steps, which needs about 16-19 MB of that cache left to this process, and its 9 packed
# calls per step (5 in the 6.9M model), each dearer than torch.mm's
_PACKED = WeakTensorKeyDictionary()  # weight -> (its version when packed, the packed copy)


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
        pack = _large(decoder)
        self.layers = [(b.attn_norm.weight, _product(b.attn.qkv, pack), _product(b.attn.out, pack),
                        b.mlp_norm.weight, _product(b.mlp.gate_up, pack), _product(b.mlp.down, pack),
                        cache._k[i], cache._v[i]) for i, b in enumerate(decoder.blocks)]
        self.lm_head = _product(decoder.lm_head, pack)
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


@contextlib.contextmanager
def packed_linears(decoder: LlamaDecoder) -> Iterator[None]:
    """Within the block, decoder.forward multiplies by the packed copies a DecodeStep uses: each Linear
    layer that one packs runs the packed product as its forward, put back on leaving (generate's prefill;
    for inference only, as the packed copy is not the weight autograd would follow)."""
    linears = [m for m in decoder.modules() if isinstance(m, torch.nn.Linear)] if _large(decoder) else []
    swapped = [m for m in linears if _packed(m.weight) is not None]
    for linear in swapped:
        linear.forward = _product(linear, True)  # the instance's forward, found before nn.Linear.forward
    try:
        yield
    finally:
        for linear in swapped:
            del linear.forward


def packed_bytes(decoder: LlamaDecoder) -> int:
    """Bytes of the packed copies now held for the decoder's current weights (0 before generate or a
    DecodeStep has packed them, or for a model too small to pack): memory on top of weight_bytes."""
    held = [(_PACKED.get(p, (None, None)), p._version) for p in decoder.parameters()]
    return sum(packed.nbytes for (version, packed), now in held if version == now)


def _large(decoder: LlamaDecoder) -> bool:
    """Whether the model has PACK_MODEL_MIN parameters or more, and so gets its large matrices packed."""
    return sum(p.numel() for p in decoder.parameters()) >= PACK_MODEL_MIN


def _product(linear: torch.nn.Linear, pack: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """x (B, in) -> x W^T + b (B, out) for the layer's weight W (out, in): oneDNN's prepacked kernel for a
    large float32 matrix if `pack` (which takes x (..., in) too, as the prefill's (B, T, in)), else what
    F.linear runs on a (B, in) input, addmm(b, x, W.t())."""
    weight, bias = linear.weight, linear.bias
    packed = _packed(weight) if pack else None
    if packed is not None:
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    weight_t = weight.t()
    return (lambda x: torch.mm(x, weight_t)) if bias is None else (lambda x: torch.addmm(bias, x, weight_t))


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    """weight (out, in) reordered for oneDNN's linear kernel (made once per version of the weight), or None
    where that does not apply: a small matrix, another dtype or device, or a PyTorch without oneDNN."""
    if weight.numel() < PACK_MIN or weight.dtype != torch.float32 or weight.device.type != "cpu" \
            or not torch.backends.mkldnn.is_available():
        return None
    version, packed = _PACKED.get(weight, (None, None))
    if version != weight._version:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
        except (RuntimeError, AttributeError):  # an operator this build of PyTorch does not have
            return None
        _PACKED[weight] = (weight._version, packed)
    return packed
