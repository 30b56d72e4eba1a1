"""attnlib.roofline: the bytes a step reads, the limit they set, and the bandwidth windows."""

import pytest
import torch

from attnlib import LlamaDecoder
from attnlib import roofline
from attnlib.caches import cache_bytes
from attnlib.roofline import read_bandwidth, step_bytes, streaming_limit, weight_bytes


def _decoder(tied: bool) -> LlamaDecoder:
    return LlamaDecoder(vocab_size=100, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=32,
                        tie_word_embeddings=tied)


def test_weight_bytes_counts_a_tied_output_layer_once():
    untied, tied = _decoder(False), _decoder(True)
    # per block: qkv (4 + 2·2)·4 x 16, out 16 x 16, gate_up 64 x 16, down 16 x 32, two norms of 16
    block = 8 * 4 * 16 + 16 * 16 + 64 * 16 + 16 * 32 + 2 * 16
    embedding = 100 * 16                                                 # (vocab, D), and lm_head as large
    assert weight_bytes(untied) == 4 * (embedding + 2 * block + 16 + embedding)  # float32: 4 bytes each
    assert weight_bytes(tied) == 4 * (embedding + 2 * block + 16)        # lm_head is the embedding itself
    assert weight_bytes(tied.to(torch.bfloat16)) == 2 * (embedding + 2 * block + 16)   # 2 bytes each


def test_a_step_reads_all_the_weights_but_an_untied_embedding():
    untied, tied = _decoder(False), _decoder(True)
    assert step_bytes(tied) == weight_bytes(tied)                         # the output layer multiplies by it
    assert step_bytes(untied) == weight_bytes(untied) - 4 * 100 * 16      # the (vocab, D) table is looked up


@pytest.mark.parametrize("tied", [True, False])
def test_streaming_limit_is_the_bandwidth_over_the_bytes_a_step_reads(tied):
    model = _decoder(tied)
    assert streaming_limit(model, 3e10) == pytest.approx(3e10 / step_bytes(model))


def test_a_batch_shares_the_weights_and_reads_its_own_caches():
    """B sequences share one read of the weights but each reads its cache: with the caches of the batch as
    large as the weights, the bound is half of B times the batch-1 bound, and it saturates at
    bandwidth / (one sequence's cache) as B grows."""
    model = _decoder(True)
    weights, bandwidth = weight_bytes(model), 3e10
    assert streaming_limit(model, bandwidth, batch=4) == pytest.approx(4 * bandwidth / weights)
    assert streaming_limit(model, bandwidth, batch=4, cache_bytes=weights) == pytest.approx(2 * bandwidth / weights)
    per_sequence = cache_bytes(2, 2, 4, 1000, bytes_per_element=4)       # this model's cache at 1000 tokens
    big = streaming_limit(model, bandwidth, batch=10**6, cache_bytes=10**6 * per_sequence)
    assert big < bandwidth / per_sequence and big == pytest.approx(bandwidth / per_sequence, rel=1e-3)


@pytest.mark.parametrize("kwargs, name", [({"batch": 0}, "batch"), ({"batch": 1.5}, "batch"),
                                          ({"cache_bytes": -1}, "cache_bytes")])
def test_a_bad_batch_or_cache_size_is_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        streaming_limit(_decoder(True), 3e10, **kwargs)


def test_a_window_sums_until_its_seconds_have_passed(monkeypatch):
    """On a clock that moves 10 ms per reading, a 25 ms window takes 3 sums (at 10, 20 and 30 ms): 3 buffers
    over 30 ms; a window of 0 seconds is one sum."""
    ticks = iter(range(1000))
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: next(ticks) / 100)
    nbytes = 4 * 1024
    assert read_bandwidth(nbytes, repeats=1, seconds=0.025) == pytest.approx(3 * nbytes / 0.03)
    assert read_bandwidth(nbytes, repeats=2, seconds=0) == pytest.approx(nbytes / 0.01)


def test_the_best_of_the_windows_is_returned(monkeypatch):
    """Windows of 1, 1 and 2 clock ticks (10 ms each): the fastest, one sum in 10 ms, is the estimate."""
    times = iter([0.0, 0.01, 0.02, 0.03, 0.04, 0.06])
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: next(times))
    assert read_bandwidth(4096, repeats=3) == pytest.approx(4096 / 0.01)


@pytest.mark.parametrize("kwargs, name", [({"repeats": 0}, "repeats"), ({"repeats": 2.5}, "repeats"),
                                          ({"nbytes": 2}, "nbytes"), ({"seconds": -1}, "seconds"),
                                          ({"seconds": float("inf")}, "seconds"), ({"seconds": "1"}, "seconds")])
def test_a_bad_argument_is_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        read_bandwidth(**kwargs)
