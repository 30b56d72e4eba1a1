"""DeepSeek Sparse Attention: attnlib's DSA against transformers' DeepseekV32Attention inside its model, with
top-k smaller than the sequence; the selection itself; the cost count against measured FLOPs; bad input."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

from attnlib.mla import MultiHeadLatentAttention
from attnlib import LatentCache, layer_io
from attnlib.sparse_attention import DeepSeekSparseAttention, IndexedLatentCache, LightningIndexer, dsa_flops_per_token

torch.set_num_threads(1)
T = 12  # index_topk = 4 of 12 keys: the indexer decides


def deepseek_v32(dtype, seed=0) -> DeepseekV32ForCausalLM:
    """RECIPES' tiny DeepSeek-V3.2 (dense MLPs), SDPA, every parameter perturbed."""
    config = DeepseekV32Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                               q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                               v_head_dim=16, first_k_dense_replace=2, index_topk=4, index_n_heads=2,
                               index_head_dim=16)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = DeepseekV32ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms start at exactly 1, biases at 0: a forgotten one would go unseen
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("layer", [0, 1])
def test_equals_transformers_inside_its_model(dtype, tol, layer):
    model = deepseek_v32(dtype)
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(3))
    io = layer_io(model, model.model.layers[layer].self_attn, ids)
    x, y = io.x, io.y
    attn = model.model.layers[layer].self_attn
    ours = DeepSeekSparseAttention.from_hf(attn)
    with torch.no_grad():
        out = ours(x)
        dense = ours.mla(x, is_causal=True)
    assert (out - y).abs().max() < tol, (out - y).abs().max()
    assert (dense - y).abs().max() > 100 * tol  # the selection changes the output: attending to all differs
    assert ours.selection(x).sum(-1).max() == 4  # k = 4 keys per query at most


def test_selection_is_the_top_k_of_causal_scores():
    """Query by query: each keeps min(k, t + 1) keys among 0..t, none scoring below one it leaves out."""
    model = deepseek_v32(torch.float64)
    x = torch.randn(2, T, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ours = DeepSeekSparseAttention.from_hf(model.model.layers[0].self_attn)
    with torch.no_grad():
        cos, sin = ours.mla.rotary.cos_sin(torch.arange(T))
        scores = ours.indexer.scores(x, ours.mla.q_norm(ours.mla.q_down(x)), cos, sin)
        chosen = ours.selection(x)[:, 0]
    ties = 0
    for b in range(2):
        for t in range(T):
            picked, seen = chosen[b, t], scores[b, t, :t + 1]
            assert picked[t + 1:].sum() == 0 and picked.sum() == min(4, t + 1)
            if t >= 4:  # ReLU makes exact zeros, so ties happen: no key left out may score above one kept
                assert seen[picked[:t + 1]].min() >= seen[~picked[:t + 1]].max()
                ties += seen[picked[:t + 1]].min() == seen[~picked[:t + 1]].max()
    assert ties > 0  # this data has ties at the boundary: torch.topk breaks them, as in transformers


def boundary_ties(ours, x):
    """(B, T) bool: queries whose k-th and (k+1)-th best visible keys score the same (k = 4)."""
    with torch.no_grad():
        cos, sin = ours.mla.rotary.cos_sin(torch.arange(x.shape[1]))
        scores = ours.indexer.scores(x, ours.mla.q_norm(ours.mla.q_down(x)), cos, sin)
    ranked = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf).sort(-1, descending=True).values
    return ranked[..., 3] == ranked[..., 4]  # -inf == -inf for t < 4 is excluded below


def test_earliest_tie_break_equals_transformers_wherever_no_tie_decides():
    model = deepseek_v32(torch.float64)
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(3))
    io = layer_io(model, model.model.layers[0].self_attn, ids)
    x, y = io.x, io.y
    ours = DeepSeekSparseAttention.from_hf(model.model.layers[0].self_attn, tie_break="earliest")
    with torch.no_grad():
        out = ours(x)
    ties = boundary_ties(ours, x) & (torch.arange(T) >= 4)
    assert ties.any()  # this data has them
    assert (out - y)[~ties].abs().max() < 1e-12
    with pytest.raises(ValueError, match="tie_break must be 'topk'"):
        DeepSeekSparseAttention.from_hf(model.model.layers[0].self_attn, tie_break="latest")


def test_cached_equals_uncached():
    """Prefill 7 tokens, then 5 steps of one: the same outputs as all 12 at once, in two layers sharing a cache
    that grows by r + D_R + D_I numbers per token and layer. Ties at the k-th place are broken the same way
    whatever the length (tie_break="earliest"); this data has some."""
    model = deepseek_v32(torch.float64)
    layers = [DeepSeekSparseAttention.from_hf(model.model.layers[i].self_attn, tie_break="earliest") for i in (0, 1)]
    x = torch.randn(2, T, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    cache, sizes = IndexedLatentCache(), []
    with torch.no_grad():
        full = [m(x) for m in layers]
        pieces = [[m(x[:, :7], cache) for m in layers]]
        for t in range(7, T):
            pieces.append([m(x[:, t:t + 1], cache) for m in layers])
            sizes.append(cache.nbytes)
    for i in (0, 1):
        torch.testing.assert_close(torch.cat([p[i] for p in pieces], dim=1), full[i], rtol=0, atol=1e-12)
    assert (boundary_ties(layers[0], x) & (torch.arange(T) >= 4)).any()
    per_token = 2 * 2 * (16 + 8 + 16) * 8  # layers · B · (r + D_R + D_I) · 8 bytes
    assert sizes == [per_token * t for t in range(8, T + 1)] and cache.seq_len == T
    with pytest.raises(TypeError, match="cache must be an attnlib IndexedLatentCache"):
        layers[0](x, LatentCache())
    with pytest.raises(ValueError, match=r"indexer keys of shape \(1, 1, 16\).*start a new IndexedLatentCache"):
        layers[0](x[:1, :1], cache)


def test_flop_count_matches_what_the_operations_do():
    """The count per query token at context T, times T queries, against torch's FLOP counter on the parallel
    form: the indexer's scores (matmuls) and dense attention (SDPA over all T keys)."""
    Hi, Di, H, Dqk, Dv, n = 2, 16, 4, 24, 16, 64
    counted = dsa_flops_per_token(n, num_heads=H, qk_head_dim=Dqk, v_head_dim=Dv, index_n_heads=Hi,
                                  index_head_dim=Di, index_topk=8)
    q, k = torch.randn(1, n, Hi, Di), torch.randn(1, n, Di)
    w = torch.randn(1, n, Hi)
    with FlopCounterMode(display=False) as indexer_flops:
        (w[..., None, :] @ F.relu(q @ k.transpose(-1, -2)[:, None])).squeeze(-2)
    with FlopCounterMode(display=False) as attention_flops:
        F.scaled_dot_product_attention(torch.randn(1, H, n, Dqk), torch.randn(1, H, n, Dqk), torch.randn(1, H, n, Dv))
    assert indexer_flops.get_total_flops() == n * counted["indexer"]
    assert attention_flops.get_total_flops() == n * counted["dense"]
    assert counted["sparse"] == 8 * counted["dense"] // n + counted["indexer"]
    short = dsa_flops_per_token(4, num_heads=H, qk_head_dim=Dqk, v_head_dim=Dv, index_n_heads=Hi,
                                index_head_dim=Di, index_topk=8)
    assert short["sparse"] > short["dense"]  # fewer keys than k: the indexer is pure cost


def test_bad_input():
    model = deepseek_v32(torch.float32)
    attn = model.model.layers[0].self_attn
    ours = DeepSeekSparseAttention.from_hf(attn)
    with pytest.raises(ValueError, match=r"x of shape \(1, 5, 32\) is not \(B, T, D\) with D=64"):
        ours(torch.randn(1, 5, 32))
    with pytest.raises(TypeError, match="must be a transformers DeepseekV32Attention"):
        DeepSeekSparseAttention.from_hf(model.model.layers[0].mlp)
    no_q_latent = MultiHeadLatentAttention(64, 4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                           v_head_dim=16)
    with pytest.raises(ValueError, match="the indexer reads the query latent"):
        DeepSeekSparseAttention(no_q_latent, ours.indexer)
    with pytest.raises(ValueError, match="rope_dim=20 must be in 1..head_dim=16"):
        LightningIndexer(64, 32, 2, 16, 20, 4)
    with pytest.raises(ValueError, match="context_len must be an int >= 1"):
        dsa_flops_per_token(0, num_heads=4, qk_head_dim=24, v_head_dim=16, index_n_heads=2, index_head_dim=16,
                            index_topk=4)
