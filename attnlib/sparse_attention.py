"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): a small "lightning indexer" scores every earlier key for each
query, and multi-head latent attention (attnlib.mla) attends only to the top k of them.

Index score of query t for key s (H_I indexer heads of width D_I, float32 here, FP8 in the paper):

    I_{t,s} = Σ_j w_{t,j} · ReLU(q_{t,j} · k_s / sqrt(D_I)),     w_t = x_t W_w / sqrt(H_I)
    q_{t,j} = RoPE(c^Q_t W_{q,j}),   k_s = RoPE(LayerNorm(x_s W_k))

c^Q_t is the attention's own query latent (RMSNorm(x_t W_DQ)); the keys are one head shared by every indexer
head; RoPE turns the first D_R = qk_rope_head_dim features in the half-split (rotate_half) layout. Query t
keeps the k keys s ≤ t of highest I_{t,s} (all of them while t < k) and MLA runs under that mask. The
indexer still scores every pair: its cost grows with T, but per key it is far cheaper than attention. Decoding
caches, per token and layer, MLA's latent and rotary key and the indexer's key (`IndexedLatentCache`).

Ties: ReLU makes exact zeros, so several keys can tie at the k-th place. transformers breaks them with
torch.topk over rows of length T, which picks by the row's length: query t's keys then depend on how many
tokens follow it, and a cached decoder cannot reproduce its full forward. tie_break="topk" does the same
(equal to transformers bit for bit); tie_break="earliest" keeps the earliest of tied keys, the same for any
length, so that cached decoding equals the full forward. Without a tie at the k-th place both agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlib import masks as _masks
from attnlib._checks import fmt_shape, require_count
from attnlib.caches._base import append_rows
from attnlib.caches.latent import LatentCache
from attnlib.mla import MultiHeadLatentAttention
from attnlib.mla_hf import copy_deepseek
from attnlib.positional import apply_rope

__all__ = ["LightningIndexer", "DeepSeekSparseAttention", "IndexedLatentCache", "dsa_flops_per_token"]


class IndexedLatentCache(LatentCache):
    """A LatentCache that also holds, per layer, the indexer's keys: r + D_R + D_I numbers per token and layer."""

    def __init__(self) -> None:
        super().__init__()
        self._index_keys: list[torch.Tensor] = []  # per layer: (B, capacity, D_I)
        self._index_len: list[int] = []

    @property
    def nbytes(self) -> int:
        """Bytes of the latents, rotary keys and indexer keys held."""
        return super().nbytes + sum(k.shape[0] * n * k.shape[-1] * k.element_size()
                                    for k, n in zip(self._index_keys, self._index_len))

    def update_index_keys(self, layer_idx: int, k: torch.Tensor) -> torch.Tensor:
        """Append the indexer keys k (B, S_new, D_I) of layer `layer_idx`; return all it holds (B, S, D_I)."""
        held = self._index_keys[layer_idx] if layer_idx < len(self._index_keys) else None
        B = held.shape[0] if held is not None else self.batch_size
        if layer_idx > len(self._index_keys) or (B is not None and k.shape[0] != B) or (
                held is not None and (k.shape[-1], k.dtype) != (held.shape[-1], held.dtype)):
            raise ValueError(f"indexer keys of shape {fmt_shape(k.shape)} ({k.dtype}) for layer {layer_idx} do not fit "
                             f"this cache (layers {len(self._index_keys)}, batch {B}): a cache belongs to one "
                             f"batch and one model, filled layer by layer; start a new IndexedLatentCache()")
        if held is None:
            self._index_keys.append(None)
            self._index_len.append(0)
        start = self._index_len[layer_idx]
        self._index_keys[layer_idx] = append_rows(self._index_keys[layer_idx], start, k)
        self._index_len[layer_idx] = start + k.shape[1]
        return self._index_keys[layer_idx].narrow(1, 0, start + k.shape[1])


class LightningIndexer(nn.Module):
    """Scores I (B, T, S) and the top-k selection; parameter names follow transformers' DeepseekV32Indexer."""

    def __init__(self, d_model: int, q_lora_rank: int, num_heads: int, head_dim: int, rope_dim: int, topk: int,
                 eps: float = 1e-6, *, tie_break: str = "topk") -> None:
        super().__init__()
        if tie_break not in ("topk", "earliest"):
            raise ValueError(f"tie_break must be 'topk' (as transformers) or 'earliest', got {tie_break!r}")
        self.tie_break = tie_break
        for name, n in (("num_heads", num_heads), ("head_dim", head_dim), ("topk", topk)):
            require_count(n, name, 1, "of the indexer")
        if not 0 < rope_dim <= head_dim:
            raise ValueError(f"rope_dim={rope_dim} must be in 1..head_dim={head_dim}: RoPE turns part of each head")
        self.num_heads, self.head_dim, self.rope_dim, self.topk = num_heads, head_dim, rope_dim, topk
        self.wq_b = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=eps)
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on the first rope_dim features of x (..., T, D_I)."""
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat((apply_rope(rot, cos, sin), rest), dim=-1)

    def scores(self, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
               cache: IndexedLatentCache | None = None, layer_idx: int = 0) -> torch.Tensor:
        """x (B, T, D), q_latent (B, T, r_q), cos and sin (T, D_R) -> I (B, T, S), float32; S = T, or with a
        cache the keys it held before plus these T (appended to it)."""
        q = self.wq_b(q_latent).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # (B, H_I, T, D_I)
        q = self._rope(q, cos, sin).transpose(1, 2)                                  # (B, T, H_I, D_I)
        k = self._rope(self.k_norm(self.wk(x)), cos, sin)                            # (B, T, D_I)
        if cache is not None:
            k = cache.update_index_keys(layer_idx, k)                                # (B, S, D_I)
        relu = F.relu(q.float() @ k.float().transpose(-1, -2)[:, None] * self.head_dim ** -0.5)  # (B, T, H_I, S)
        w = self.weights_proj(x).float() * self.num_heads ** -0.5                    # (B, T, H_I)
        return (w[..., None, :] @ relu).squeeze(-2)                                  # (B, T, 1, S) -> (B, T, S)

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """I (B, T, S) -> (B, 1, T, S) bool, True at the topk highest-scoring keys j ≤ i + S - T of each query
        (bottom-right causal, as attnlib.masks.causal_mask)."""
        T, S = scores.shape[-2:]
        causal = _masks.causal_mask(T, S, device=scores.device)                      # (T, S)
        scores, k = scores.masked_fill(~causal, -torch.inf), min(self.topk, S)
        if self.tie_break == "topk":
            top = scores.topk(k, dim=-1).indices                                     # (B, T, k)
        else:  # a stable sort keeps equal scores in key order
            top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]  # (B, T, k)
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top, True)   # (B, T, S)
        return (chosen & causal)[:, None]                                            # (B, 1, T, S)


class DeepSeekSparseAttention(nn.Module):
    """DSA: `mla` (an attnlib MultiHeadLatentAttention, with a query latent) attending to the keys `indexer` picks.

    forward(x, cache=None) (B, T, D) -> (B, T, D), causal, positions starting at the cache's length.
    """

    def __init__(self, mla: MultiHeadLatentAttention, indexer: LightningIndexer) -> None:
        super().__init__()
        if mla.q_lora_rank is None or indexer.wq_b.in_features != mla.q_lora_rank:
            raise ValueError(f"the indexer reads the query latent: it takes {indexer.wq_b.in_features} features but "
                             f"the attention's q_lora_rank is {mla.q_lora_rank}")
        if indexer.rope_dim != mla.rope_dim:
            raise ValueError(f"indexer rope_dim={indexer.rope_dim} differs from the attention's {mla.rope_dim}")
        self.mla, self.indexer = mla, indexer

    def selection(self, x: torch.Tensor, cache: IndexedLatentCache | None = None) -> torch.Tensor:
        """x (B, T, D) -> the keys each query attends to, (B, 1, T, S) bool (True = may attend); with a cache,
        S counts its keys too, and the indexer keys of x are appended to it."""
        if x.dim() != 3 or x.shape[-1] != self.mla.d_model:
            raise ValueError(f"x of shape {fmt_shape(x.shape)} is not (B, T, D) with D={self.mla.d_model}")
        if cache is not None and not isinstance(cache, IndexedLatentCache):
            raise TypeError(f"cache must be an attnlib IndexedLatentCache (latents and indexer keys), got "
                            f"{type(cache).__name__}")
        start = cache.get_seq_len(self.mla.layer_idx) if cache is not None else 0
        cos, sin = self.mla.rotary.cos_sin(torch.arange(start, start + x.shape[1], device=x.device))  # (T, D_R)
        q_latent = self.mla.q_norm(self.mla.q_down(x))                                  # (B, T, r_q)
        scores = self.indexer.scores(x, q_latent, cos, sin, cache=cache, layer_idx=self.mla.layer_idx)
        return self.indexer.select(scores)

    def forward(self, x: torch.Tensor, cache: IndexedLatentCache | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D): MLA under (causal AND selected), its latents appended to the cache."""
        return self.mla(x, self.selection(x, cache), is_causal=True, cache=cache)

    @classmethod
    def from_hf(cls, attn: nn.Module, *, tie_break: str = "topk") -> DeepSeekSparseAttention:
        """A copy of a transformers DeepseekV32Attention (MLA with interleaved RoPE, and its DeepseekV32Indexer);
        tie_break: see the module docstring ("topk": transformers' full forward, "earliest": cache-consistent)."""
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention

        if not isinstance(attn, DeepseekV32Attention):
            raise TypeError(f"attn must be a transformers DeepseekV32Attention, got {type(attn).__name__}")
        mla = copy_deepseek(MultiHeadLatentAttention, attn, rope_interleave=True)  # V3.2 always interleaves
        theirs = attn.indexer
        indexer = LightningIndexer(attn.hidden_size, theirs.q_lora_rank, theirs.n_heads, theirs.head_dim,
                                   theirs.qk_rope_head_dim, theirs.index_topk, eps=theirs.k_norm.eps,
                                   tie_break=tie_break)
        weight = theirs.wk.weight
        indexer.to(device=weight.device, dtype=weight.dtype).load_state_dict(theirs.state_dict())
        return cls(mla, indexer).train(attn.training)


def dsa_flops_per_token(context_len: int, *, num_heads: int, qk_head_dim: int, v_head_dim: int, index_n_heads: int,
                        index_head_dim: int, index_topk: int) -> dict[str, int]:
    """Multiply-adds × 2 that one query spends on its context of `context_len` keys (projections excluded:
    they cost the same per token whatever the context).

    indexer:  2 · T · H_I · (D_I + 1)     (q·k for every key and head, then the weighted sum over heads)
    dense:    2 · T · H · (D_qk + D_v)    (attention over every key: q·k, then the weighted sum of values)
    sparse:   2 · min(k, T) · H · (D_qk + D_v) + indexer
    For MLA's absorbed decoding form pass qk_head_dim = r + D_R and v_head_dim = r.
    """
    T = require_count(context_len, "context_len", 1, "keys before and including the query")
    per_key = 2 * num_heads * (qk_head_dim + v_head_dim)
    indexer = 2 * T * index_n_heads * (index_head_dim + 1)
    return {"indexer": indexer, "dense": T * per_key, "sparse": min(index_topk, T) * per_key + indexer}
