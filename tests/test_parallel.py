"""attnlib.parallel in 2 and 4 real processes (gloo): each method equals one process, forward and backward.

Starting processes costs seconds, so each launch runs many checks (tests/parallel_workers.py) and the
results are shared by the tests below through module-scoped fixtures.
"""

from __future__ import annotations

import pytest
import torch

import parallel_workers as pw
from attnlib.parallel import WorkerError, causal_pairs, launch, ring_attention, shard, unshard

T = 16  # positions: 2 and 4 ranks, 2 chunks each for zig-zag
TOL = 1e-12  # float64 throughout


@pytest.fixture(scope="module", params=[2, 4])
def world_results(request):
    W = request.param
    seq, tp = zip(*launch(pw.all_checks, W, T, 8))
    return W, seq, tp


@pytest.mark.parametrize("method", ["ring/contiguous", "ring/zigzag", "ulysses/contiguous"])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_sequence_parallel_equals_one_process(world_results, method, mask):
    W, seq, _ = world_results
    for rank, res in enumerate(seq):
        r = res[f"{method}/{mask}"]
        assert r["out"] < TOL, f"rank {rank} of {W}: output off by {r['out']}"
        assert r["grad"] < TOL, f"rank {rank} of {W}: gradients off by {r['grad']}"


def test_bytes_measured_equal_formula(world_results):
    W, seq, tp = world_results
    for res in seq:
        for method, layout in (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous")):
            for mask in ("full", "causal"):
                r = res[f"{method}/{layout}/{mask}"]
                assert (r["fwd_bytes"], r["bwd_bytes"]) == tuple(res["formula"][method]), (method, layout, mask)
    ring, ulysses = seq[0]["formula"]["ring"][0], seq[0]["formula"]["ulysses"][0]
    assert ring == 2 * (W - 1) * pw.B * pw.H * (T // W) * pw.Dh * 8  # 2 blocks a step, W - 1 steps
    assert ulysses == ring if W == 2 else ulysses < ring  # 4(W-1)/W² against 2(W-1)/W of B·T·D·e
    for res in tp:
        for kind in ("mha", "gqa", "mqa"):
            for key in ("bytes", "bwd_bytes"):  # one all-reduce forward (out), one backward (the gradient of x)
                measured, formula = res[kind][key]
                assert measured == formula > 0, (kind, key)


def test_zigzag_balances_causal_work(world_results):
    W, seq, _ = world_results
    contiguous = [res["ring/contiguous/causal"]["scores"] for res in seq]
    zigzag = [res["ring/zigzag/causal"]["scores"] for res in seq]
    total = T * (T + 1) // 2  # the causal lower triangle, per (batch, head)
    assert sum(contiguous) == sum(zigzag) == total
    assert len(set(zigzag)) == 1, zigzag
    assert contiguous == sorted(contiguous) and contiguous[-1] > 2 * contiguous[0], contiguous


def test_bad_input_errors(world_results):
    W, seq, _ = world_results
    errors = seq[0]["errors"]
    assert errors["not_divisible"].startswith("ValueError") and f"{T - 1}" in errors["not_divisible"] \
        and f"{W} ranks" in errors["not_divisible"]
    assert errors["few_heads"].startswith("ValueError") and "H=1" in errors["few_heads"] and str(W) in errors["few_heads"]
    assert errors["zigzag_odd"].startswith("ValueError") and "zigzag" in errors["zigzag_odd"]
    assert errors["wrong_dims"].startswith("ValueError") and "(B, H, T/world, Dh)" in errors["wrong_dims"]
    assert errors["float_only"].startswith("TypeError")


@pytest.mark.parametrize("kind", ["mha", "gqa", "mqa"])
def test_tensor_parallel_heads_equal_the_layer(world_results, kind):
    W, _, tp = world_results
    heads = []
    for rank, res in enumerate(tp):
        r = res[kind]
        assert r["out"] < TOL and r["grad_x"] < TOL, (rank, r)
        assert r["dtensor"] < 1e-12, f"DTensor Colwise/Rowwise reference off by {r['dtensor']}"
        heads.append(r["heads"])
    H = {"mha": 4, "gqa": 8, "mqa": 4}[kind]
    assert heads == [(r * H // W, (r + 1) * H // W) for r in range(W)]  # every head exactly once
    kv = [res[kind]["kv_heads"] for res in tp]
    if kind == "gqa":  # 4 kv heads split among the ranks
        assert kv == [(r * 4 // W, (r + 1) * 4 // W) for r in range(W)]
    if kind == "mqa":  # the one kv head copied to every rank
        assert kv == [(0, 1)] * W


def test_tensor_parallel_errors(world_results):
    W, _, tp = world_results
    for res in tp:
        assert res["different_inputs"].startswith("ValueError") and "differs between ranks" in res["different_inputs"]
        assert res["heads_split"].startswith("ValueError") and f"among {W} ranks" in res["heads_split"]


def test_launch_reports_a_workers_exception():
    with pytest.raises(WorkerError, match=r"(?s)rank 1 of 2 raised.*ZeroDivisionError: rank one cannot go on"):
        launch(pw.fails_on_rank_one, 2, timeout=120)


def test_launch_rejects_what_spawn_cannot_find():
    with pytest.raises(ValueError, match="top level of an importable module"):
        launch(lambda rank, W: rank, 2)
    with pytest.raises(ValueError, match="world_size"):
        launch(pw.fails_on_rank_one, 0)


def test_one_process_is_plain_attention():
    """Without a process group everything is a group of one: ring attention is tiled attention."""
    q, k, v, _ = pw._qkv(8)
    ref = torch.softmax(q @ k.transpose(-1, -2) / pw.Dh ** 0.5, dim=-1) @ v
    assert (ring_attention(q, k, v) - ref).abs().max() < TOL


def test_layouts_round_trip_and_causal_schedule():
    x = torch.arange(2 * 16).reshape(1, 2, 16, 1)
    for layout in ("contiguous", "zigzag"):
        assert torch.equal(unshard([shard(x, r, 4, layout=layout) for r in range(4)], layout=layout), x)
    assert shard(x, 0, 4, layout="zigzag")[0, 0, :, 0].tolist() == [0, 1, 14, 15]
    # 2 ranks, 4 chunks: rank 0 holds chunks 0 and 3, rank 1 holds 1 and 2
    assert causal_pairs(1, 0, 2, "zigzag", True) == [(0, 0, "full"), (1, 0, "full")]  # 1 sees 0, 2 sees 0
    assert causal_pairs(0, 1, 2, "zigzag", True) == [(1, 0, "full"), (1, 1, "full")]  # 3 sees 1 and 2
    assert causal_pairs(0, 0, 2, "zigzag", True) == [(0, 0, "diagonal"), (1, 0, "full"), (1, 1, "diagonal")]
