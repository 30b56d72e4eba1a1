"""attnlib.KVCache: the cache against torch.cat, its byte count, its checks, and the Cache contract it keeps.
(attnlib.generate, which fills it, is tested in test_generation.py.)"""

import pytest
import torch

from attnlib import KVCache, LlamaDecoder
from attnlib.caches import Cache, cache_bytes
from test_decoder import ids, tiny_llama


def kv(B: int = 2, H_kv: int = 3, S: int = 1, Dh: int = 4, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H_kv, S, Dh, generator=g, dtype=dtype), torch.randn(B, H_kv, S, Dh, generator=g, dtype=dtype)


# --- the cache itself -------------------------------------------------------------------------------

def test_update_returns_everything_cached_as_torch_cat_would():
    cache, ks, vs = KVCache(), [], []
    assert (len(cache), cache.seq_len, cache.batch_size, cache.nbytes) == (0, 0, None, 0)
    for step, S_new in enumerate([5, 1, 1, 12, 1, 30, 1]):  # crosses the buffer's growth points
        k, v = kv(S=S_new, seed=step)
        ks.append(k), vs.append(v)
        k_all, v_all = cache.update(0, k, v)
        torch.testing.assert_close(k_all, torch.cat(ks, dim=2), rtol=0, atol=0)
        torch.testing.assert_close(v_all, torch.cat(vs, dim=2), rtol=0, atol=0)
        assert cache.seq_len == sum(t.shape[2] for t in ks) and len(cache) == 1
    assert cache.batch_size == 2


def test_layers_fill_in_order_and_seq_len_is_layer_0s():
    cache = KVCache()
    cache.update(0, *kv(S=4))
    assert (len(cache), cache.seq_len, cache.get_seq_len(1)) == (1, 4, 0)
    cache.update(1, *kv(S=4, seed=1))
    cache.update(0, *kv(S=1, seed=2))
    assert (len(cache), cache.seq_len, cache.get_seq_len(0), cache.get_seq_len(1)) == (2, 5, 5, 4)


def test_nbytes_counts_the_filled_positions_as_cache_bytes_says():
    cache = KVCache()
    for layer in range(3):
        cache.update(layer, *kv(B=2, H_kv=3, S=7, Dh=4, seed=layer))  # buffers hold 16+ positions
    assert cache.nbytes == cache_bytes(3, 3, 4, 7, batch_size=2, bytes_per_element=4)
    k, v = kv(B=2, H_kv=3, S=7, Dh=4)
    assert cache.nbytes == 3 * (k.nelement() * k.element_size() + v.nelement() * v.element_size())
    half = KVCache()
    half.update(0, *kv(S=7, dtype=torch.float16))
    assert half.nbytes == cache_bytes(1, 3, 4, 7, batch_size=2, bytes_per_element=2)


def test_allocated_nbytes_counts_the_buffers_spare_room_included():
    cache = KVCache()
    assert cache.allocated_nbytes == 0
    cache.update(0, *kv(B=2, H_kv=3, S=20, Dh=4))            # grows to 2 · 20 positions
    per_position = 2 * 3 * (4 + 4) * 4                        # B · H_kv · (Dh + Dv) · 4 bytes
    assert cache.nbytes == 20 * per_position and cache.allocated_nbytes == 40 * per_position
    for step in range(20):                                    # fills the spare room: no growth
        cache.update(0, *kv(B=2, H_kv=3, S=1, Dh=4, seed=step))
    assert cache.nbytes == cache.allocated_nbytes == 40 * per_position
    cache.update(0, *kv(B=2, H_kv=3, S=1, Dh=4))              # full: doubles to 2 · 41 positions
    assert cache.allocated_nbytes == 82 * per_position


def test_cache_bytes_of_a_decoder_equals_its_real_cache():
    dec = LlamaDecoder.from_hf(tiny_llama(heads=8, kv_heads=2, layers=4))
    cache = KVCache()
    with torch.no_grad():
        dec(ids(3, 20), cache)
    assert cache.nbytes == cache_bytes(4, 2, 256 // 8, 20, batch_size=3, bytes_per_element=4)


@pytest.mark.parametrize("B, H_kv, Dh, match", [
    (3, 3, 4, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(3, 3, 1, 4\): a cache belongs to one batch"),
    (2, 1, 4, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(2, 1, 1, 4\)"),
    (2, 3, 8, r"holds \(B=2, H_kv=3, Dh=4\), got k of shape \(2, 3, 1, 8\)"),
])
def test_another_batch_size_head_count_or_head_width_is_refused(B, H_kv, Dh, match):
    cache = KVCache()
    cache.update(0, *kv(S=3))
    with pytest.raises(ValueError, match=match):
        cache.update(0, *kv(B, H_kv, 1, Dh))
    assert cache.seq_len == 3  # the refused update changed nothing


@pytest.mark.parametrize("layer_idx", [2, -1, 1.0, True, "0"])
def test_a_layer_index_out_of_order_is_refused(layer_idx):
    cache = KVCache()
    cache.update(0, *kv())
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 1\] \(layers are filled in order\)"):
        cache.update(layer_idx, *kv())
    assert len(cache) == 1


def test_bad_k_and_v_are_refused_by_name():
    cache = KVCache()
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 4\) is not \(B, H_kv, S_new, Dh\)"):
        cache.update(0, torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"k of shape \(2, 3, 1, 4\) and v of shape \(2, 3, 2, 4\) differ"):
        cache.update(0, kv(S=1)[0], kv(S=2)[1])
    with pytest.raises(TypeError, match=r"v must be a floating-point tensor, got torch.int64"):
        cache.update(0, kv()[0], torch.zeros(2, 3, 1, 4, dtype=torch.long))
    cache.update(0, *kv())
    with pytest.raises(TypeError, match=r"the cache of layer 0 holds torch.float32, got k torch.float16"):
        cache.update(0, *kv(dtype=torch.float16))
    assert repr(cache) == "KVCache(layers=1, seq_len=1, B=2, H_kv=3, Dh=4)" and repr(KVCache()) == "KVCache(empty)"


def test_kv_cache_keeps_the_cache_contract():
    assert isinstance(KVCache(), Cache)
    assert not isinstance({}, Cache) and not isinstance([], Cache)
